//! toast-cli: the command line of toast-rs.

mod cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use toast_accel::host::Plugin;

#[derive(Debug, Parser)]
#[command(name = "toast-cli", version, about = "toast-rs command line")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run TOAST's reference kernel cases on a backend plugin.
    Verify {
        /// Path of the backend plugin's shared library.
        #[arg(long)]
        backend_path: PathBuf,
        /// Directory of the reference cases (*.npz).
        #[arg(long)]
        cases: PathBuf,
        /// Backend options, e.g. "threads=2".
        #[arg(long, default_value = "")]
        options: String,
    },
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Verify {
            backend_path,
            cases,
            options,
        } => Plugin::load(&backend_path)
            .map_err(|e| e.to_string())
            .and_then(|p| Arc::new(p).init(&options).map_err(|e| e.to_string()))
            .and_then(|backend| cmd::verify::run(&backend, &cases)),
    };
    match code {
        Ok(c) => std::process::exit(c),
        Err(e) => {
            eprintln!("toast-cli: {e}");
            std::process::exit(2);
        }
    }
}
