//! toast-accel: the backend plugin ABI, plugin discovery and loading, and
//! kernel dispatch.
//!
//! Without the `host` feature this crate is only the ABI part that plugins
//! need: [`abi`] (the `#[repr(C)]` mirror of `include/toast_backend.h`),
//! [`check`] (argument validation every Rust backend runs at kernel entry)
//! and [`plugin`] (last-error and panic guard helpers).

pub mod abi;
pub mod check;
pub mod plugin;

#[cfg(feature = "host")]
pub mod host;
