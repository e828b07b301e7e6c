//! The host side: finding and loading plugins, the backend registry,
//! dispatch, and calling kernels.

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod discovery;
pub mod dispatch;
mod elf;
pub mod error;
pub mod registry;
pub mod stage;

pub use backend::{Backend, DeviceSummary, KernelArgs, Plugin, TransferSnapshot, TransferStats};
pub use discovery::{DiscoveryOptions, Source};
pub use dispatch::{
    DispatchLevel, DispatchPolicy, Dispatcher, KernelLog, KernelUse, Resolved, DEFAULT_BACKEND,
};
pub use error::{AccelError, LoadError, StatusKind};
pub use registry::{LoadFailure, PluginEntry, Registry, Shadowed};
pub use stage::{AbiElement, ArrayArg};
