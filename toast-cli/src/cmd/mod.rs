//! The subcommands of `toast-cli`, one module each.

pub mod backends;
pub mod bench;
pub mod kernels;
pub mod run;
pub mod verify;
