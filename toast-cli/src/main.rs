//! toast-cli: the command line of toast-rs.

mod cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use toast_accel::host::{DiscoveryOptions, Registry};

#[derive(Debug, Parser)]
#[command(
    name = "toast-cli",
    version,
    about = "toast-rs: CMB time-ordered data processing"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the backend plugins found, their status, devices and kernels.
    Backends {
        /// A plugin file or a directory of plugins, searched before
        /// TOAST_BACKEND_PATH, the executable's directory and the system
        /// directories (repeatable).
        #[arg(long = "backend-path", value_name = "PATH")]
        backend_path: Vec<PathBuf>,
    },
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Time every kernel of a backend on TOAST's benchmark workload and
    /// compare with TOAST 3.0.6's compiled kernels.
    Kernels(cmd::bench::KernelsArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Backends { backend_path } => {
            let opts = DiscoveryOptions {
                explicit: backend_path,
                ..DiscoveryOptions::default()
            };
            cmd::backends::run(&Registry::discover(&opts))
        }
        Command::Bench(BenchCommand::Kernels(args)) => match cmd::bench::cmd_kernels(&args) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("toast-cli bench kernels: {e}");
                1
            }
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
