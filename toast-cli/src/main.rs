//! toast-cli: the command line of toast-rs.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "toast-cli", version, about = "Command line of toast-rs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Time every kernel of a backend on TOAST's benchmark workload.
    Kernels(cmd::bench::KernelsArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Bench(BenchCommand::Kernels(args)) => cmd::bench::cmd_kernels(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toast-cli: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
