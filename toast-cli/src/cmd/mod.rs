//! Subcommands.

pub mod verify;
