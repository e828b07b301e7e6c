//! The host side: loading plugins, initialising backends, calling kernels.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod error;
pub mod plugin;
pub mod stage;

pub use error::{AccelError, LoadError, StatusKind};
pub use plugin::{Backend, DeviceSummary, KernelArgs, Plugin, TransferSnapshot, TransferStats};
pub use stage::{ArrayArg, Element};
