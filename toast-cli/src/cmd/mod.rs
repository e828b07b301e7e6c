//! The subcommands of `toast-cli`, one module each.

pub mod backends;
pub mod bench;
pub mod run;
pub mod verify;
