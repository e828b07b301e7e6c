//! Subcommands of toast-cli.

pub mod bench;
