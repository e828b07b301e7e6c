//! The subcommands of `toast-cli`, one module each.

pub mod backends;
pub mod bench;
pub mod compare;
pub mod kernels;
#[cfg(any(feature = "mpi", test))]
pub mod mpi_check;
pub mod run;
pub mod verify;
