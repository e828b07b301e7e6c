//! toast-cli: the command line of toast-rs.
//!
//! With the `mpi` cargo feature, `run` is distributed under `mpirun`:
//! `parallel.rs` initialises the world communicator (`mpi_comm.rs`, rsmpi)
//! and ends the whole job, naming the rank, when one rank fails; the
//! operators reach the communicator through the execution context (see
//! `toast_core::comm` and docs/DISTRIBUTED.md). Without the feature the
//! world is one process and no MPI library is linked.
//!
//! Subcommands live in `cmd/`, one module each; this file parses arguments,
//! sets up logging and plugin discovery, and maps outcomes to exit codes:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | the command ran and found failures (e.g. a verify case failed, `compare` found maps that differ) |
//! | 2 | bad usage or setup (unknown backend, unreadable input, an absurd option value, a standard output that cannot be written) |
//! | 3 | the requested backend is unavailable on this machine: nothing ran, every case was skipped (`verify`), nothing was timed (`bench`); the device compiler is not installed (`kernels compile`) |
//! | 141 | standard output was closed (`EPIPE`; with SIGPIPE's default action the process ends by the signal first, which a shell also shows as 141) |

mod cmd;
mod console;
mod interrupt;
mod limits;
#[cfg(feature = "mpi")]
mod mpi_comm;
mod output;
mod parallel;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use toast_accel::host::conformance::Comparison;
use toast_accel::host::{AccelError, DiscoveryOptions, Registry};

/// Exit status when the requested backend is unavailable (all skipped).
const EXIT_UNAVAILABLE: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "toast-cli",
    version,
    about = "toast-rs: CMB time-ordered data processing"
)]
struct Cli {
    /// A plugin file or a directory of plugins, searched before
    /// TOAST_BACKEND_PATH, the executable's directory and the system
    /// directories (repeatable).
    #[arg(long = "backend-path", value_name = "PATH", global = true)]
    backend_path: Vec<PathBuf>,
    /// Options passed to a backend's init, as NAME:KEY=VALUE[;KEY=VALUE]
    /// (e.g. `cpu:threads=2`; repeatable: one backend's are joined, each
    /// key at most once).
    #[arg(long = "backend-options", value_name = "NAME:OPTIONS", global = true)]
    backend_options: Vec<String>,
    /// More log output (-v debug, -vv trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the backend plugins found, their status, devices and kernels.
    Backends,
    /// Run TOAST's reference kernel cases on a backend: one line per case,
    /// then `N passed, N failed[, N skipped]`.
    Verify {
        /// The backend to verify (as `toast-cli backends` names it).
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Directory of reference cases (*.npz); default: the cases shipped
        /// in the repository (or $TOAST_CASES_DIR).
        #[arg(long)]
        cases: Option<PathBuf>,
        /// Print the backend's transfer counters at the end (always done
        /// for backends that are not host-addressable).
        #[arg(long)]
        transfers: bool,
        /// Compare bit for bit even on a device backend (default: exact for
        /// host-addressable backends, the documented tolerant mode for
        /// device backends).
        #[arg(long)]
        exact: bool,
    },
    /// Run TOAST's satellite simulation and map-making workflow
    /// (`toast_benchmark_satellite`): tiny on the CPU into ./toast_out by default.
    Run(cmd::run::RunArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Compare two runs' maps (the `*.fits` of two output directories):
    /// hits exactly, every other column within `--max-rel` and `--rms-rel`;
    /// exit 0 when they agree, 1 when they differ.
    Compare(cmd::compare::CompareArgs),
    /// The shared device-kernel source.
    #[command(subcommand)]
    Kernels(KernelsCommand),
    /// Check every collective of the MPI world communicator across the
    /// ranks (run under mpirun): exit 0 when all match their expected
    /// values, 1 naming the failed checks.
    #[cfg(feature = "mpi")]
    MpiCheck {
        /// Instead, time allreduces of this many MiB of f64 (the map
        /// reductions' collective) and print the bandwidth.
        #[arg(long = "bench-mib")]
        bench_mib: Option<usize>,
    },
}

#[derive(Debug, Subcommand)]
enum KernelsCommand {
    /// Compile the device source for a target and architecture (no GPU
    /// needed): exit 1 on a compiler error (the log is printed), 3 when the
    /// compiler is not installed.
    Compile(cmd::kernels::CompileArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Time every kernel of a backend on TOAST's benchmark workload and
    /// compare with TOAST 3.0.6's compiled kernels.
    Kernels(cmd::bench::KernelsArgs),
}

fn default_cases_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TOAST_CASES_DIR") {
        return PathBuf::from(d);
    }
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/toast-kernels/cases"
    ))
}

/// The `--backend-options` of the command line, one per backend: those
/// given for one backend in several options joined with `;` (in order).
/// A key given twice for one backend is refused: the plugin would take the
/// last one and drop the other without a word.
fn backend_options(cli: &Cli) -> anyhow::Result<Vec<(String, String)>> {
    let mut merged: Vec<(String, String)> = Vec::new();
    for spec in &cli.backend_options {
        let (name, options) = spec.split_once(':').ok_or_else(|| {
            anyhow::anyhow!("--backend-options {spec:?}: expected NAME:OPTIONS, e.g. cpu:threads=2")
        })?;
        match merged
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some((_, o)) => {
                o.push(';');
                o.push_str(options);
            }
            None => merged.push((name.to_string(), options.to_string())),
        }
    }
    for (name, options) in &merged {
        let mut keys: Vec<&str> = Vec::new();
        for key in toast_accel::host::discovery::option_keys(options) {
            if keys.contains(&key) {
                anyhow::bail!(
                    "--backend-options {name}:{options}: `{key}` is given twice for backend \
                     `{name}`; give it once"
                );
            }
            keys.push(key);
        }
    }
    Ok(merged)
}

/// Where to look for plugins, and the options each is initialised with
/// (`given`: [`backend_options`]).
fn discovery(cli: &Cli, given: &[(String, String)]) -> DiscoveryOptions {
    let mut opts = DiscoveryOptions {
        explicit: cli.backend_path.clone(),
        ..DiscoveryOptions::default()
    };
    for (name, options) in given {
        opts = opts.with_backend_options(name, options);
    }
    opts
}

/// Refuse `--backend-options` for a backend that was not found, and
/// initialise each backend given options, so that an option its plugin
/// refuses is an error now (exit 2) rather than at its first kernel. A
/// backend found but unavailable on this machine keeps its options unread.
fn check_backend_options(given: &[(String, String)], registry: &Registry) -> anyhow::Result<()> {
    for (name, options) in given {
        let spec = format!("{name}:{options}");
        match registry.get(name) {
            Ok(_) | Err(AccelError::Unavailable { .. }) => {}
            Err(AccelError::NotFound { .. }) => anyhow::bail!(
                "--backend-options {spec:?}: no backend `{name}` was found (backends: {})",
                registry.names().join(", ")
            ),
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!("--backend-options {spec:?}")))
            }
        }
    }
    Ok(())
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "debug",
        _ => "trace",
    };
    // A RUST_LOG that is set but not a filter falls back to the default,
    // said once the log is up (it was dropped without a word).
    let given = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (filter, refused) = match given.as_deref().map(tracing_subscriber::EnvFilter::try_new) {
        Some(Ok(f)) => (f, None),
        Some(Err(e)) => (tracing_subscriber::EnvFilter::new(default), Some(e)),
        None => (tracing_subscriber::EnvFilter::new(default), None),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| console::LogStderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(e) = refused {
        tracing::warn!(
            "RUST_LOG={:?} is not a log filter ({e}): the log level is {default}",
            given.unwrap_or_default()
        );
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    limits::check_rayon_threads()?;
    #[cfg(feature = "mpi")]
    if let Command::MpiCheck { bench_mib } = &cli.command {
        return cmd::mpi_check::main(*bench_mib);
    }
    if let Command::Kernels(KernelsCommand::Compile(args)) = &cli.command {
        return match cmd::kernels::compile(args)? {
            cmd::kernels::Outcome::Compiled(report) => {
                write!(console::Stdout, "{report}")?;
                Ok(0)
            }
            cmd::kernels::Outcome::Failed(e) => {
                errln!("toast-cli kernels compile: {e}");
                Ok(1)
            }
            cmd::kernels::Outcome::Unavailable(e) => {
                errln!("toast-cli kernels compile: compiler unavailable: {e}");
                Ok(EXIT_UNAVAILABLE)
            }
        };
    }
    if let Command::Compare(args) = &cli.command {
        return cmd::compare::run(args).map(code);
    }
    let given_options = backend_options(&cli)?;
    let mut opts = discovery(&cli, &given_options);
    // `--threads` sets a plugin's `threads` too (run: the CPU plugin's;
    // bench: the benchmarked backend's): both given, one would be dropped
    // (run kept the option, bench the flag).
    let threads_flag = match &cli.command {
        Command::Run(args) => args.threads.map(|n| (n, "cpu")),
        Command::Bench(BenchCommand::Kernels(a)) => a.threads.map(|n| (n, a.backend.as_str())),
        _ => None,
    };
    if let Some((n, backend)) = threads_flag {
        if opts.has_option(backend, "threads") {
            anyhow::bail!(
                "--threads {n} and --backend-options {backend}:{} both set the {backend} \
                 plugin's threads: give one",
                opts.options_for(backend)
            );
        }
    }
    if let Command::Run(args) = &cli.command {
        // Without --threads, ranks sharing a node share its cores.
        if let Some(n) = args.threads.or_else(parallel::default_threads_per_rank) {
            cmd::run::set_threads(n, &mut opts)?;
        }
    }
    if let Command::Bench(BenchCommand::Kernels(a)) = &cli.command {
        a.check()?;
        opts = cmd::bench::with_threads(opts, &a.backend, a.threads);
    }
    let registry = Registry::discover(&opts);
    check_backend_options(&given_options, &registry)?;
    match &cli.command {
        Command::Run(args) => {
            let comm = parallel::init()?;
            match cmd::run::run(args, registry, std::sync::Arc::clone(&comm)) {
                Ok(c) => Ok(code(c)),
                // Several ranks: name this one and end them all.
                Err(e) if comm.size() > 1 => parallel::fail(&*comm, &error_chain(&e), 2),
                Err(e) => Err(e),
            }
        }
        Command::Backends => cmd::backends::run(&registry).map(code),
        Command::Verify {
            backend,
            cases,
            transfers,
            exact,
        } => {
            let cases = cases.clone().unwrap_or_else(default_cases_dir);
            match registry.get(backend) {
                Ok(b) => {
                    let opts = cmd::verify::Options {
                        comparison: exact.then_some(Comparison::Exact),
                        transfers: *transfers,
                    };
                    cmd::verify::run_with(&b, &cases, opts).map(code)
                }
                Err(AccelError::Unavailable { backend, reason }) => {
                    errln!("toast-cli: backend `{backend}` is unavailable: {reason}");
                    cmd::verify::run_unavailable(&backend, &reason, &cases)?;
                    Ok(EXIT_UNAVAILABLE)
                }
                Err(e) => Err(e.into()),
            }
        }
        Command::Kernels(_) | Command::Compare(_) => unreachable!("handled before discovery"),
        #[cfg(feature = "mpi")]
        Command::MpiCheck { .. } => unreachable!("handled before discovery"),
        Command::Bench(BenchCommand::Kernels(args)) => {
            let b = match registry.get(&args.backend) {
                Ok(b) => b,
                Err(AccelError::Unavailable { backend, reason }) => {
                    errln!("toast-cli: backend `{backend}` is unavailable: {reason}");
                    return Ok(EXIT_UNAVAILABLE);
                }
                Err(e) => return Err(e.into()),
            };
            let threads = cmd::bench::threads_option(opts.options_for(&args.backend));
            match cmd::bench::cmd_kernels(&b, args, threads) {
                Ok(()) => Ok(0),
                // Output failures are exit status 2, as elsewhere.
                Err(e) if console::stdout_failure(&e).is_some() => Err(e),
                Err(e) if e.downcast_ref::<cmd::bench::JsonWriteError>().is_some() => Err(e),
                Err(e) => {
                    errln!("toast-cli bench kernels: {}", error_chain(&e));
                    Ok(1)
                }
            }
        }
    }
}

/// The whole chain of an error: what was being done, then each cause, as
/// `what: cause: cause`. The library errors name their cause in their own
/// message too (so that a caller printing only the top sees it); a cause
/// whose text the line already holds is not repeated.
pub(crate) fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    bounded(line)
}

/// The most characters of an error line: messages quote what they refuse,
/// and an input of megabytes (a `--set` key of 50000 parts, a TOML line of
/// 800 kB) came back whole.
const MAX_ERROR_CHARS: usize = 4000;

/// `line` within [`MAX_ERROR_CHARS`]: its start and its end (where the
/// cause usually is), the characters between them counted.
fn bounded(line: String) -> String {
    let n = line.chars().count();
    if n <= MAX_ERROR_CHARS {
        return line;
    }
    let (head, tail) = (MAX_ERROR_CHARS * 3 / 4, MAX_ERROR_CHARS / 4);
    let start: String = line.chars().take(head).collect();
    let end: String = line.chars().skip(n - tail).collect();
    format!(
        "{start} [... {} characters left out ...] {end}",
        n - head - tail
    )
}

fn code(c: i32) -> u8 {
    u8::try_from(c).unwrap_or(1)
}

/// Let a write to a closed standard output (`toast-cli run --dry-run | head
/// -1`) end the process quietly, as it ends `cat` or `ls`: the Rust runtime
/// ignores SIGPIPE. With the default action the process ends by SIGPIPE
/// (status 141 in a shell), as Unix filters do; where SIGPIPE is handled
/// anyway (an MPI library may install its own handling when initialised),
/// the `EPIPE` that `console::Stdout` returns ends it quietly with 141.
/// toast-cli writes no other pipe or socket itself.
#[cfg(unix)]
fn default_sigpipe() {
    // SAFETY: `signal` with `SIG_DFL` installs no handler (no code of ours
    // runs in signal context), and it is called first thing in `main`,
    // before any other thread exists that could be changing dispositions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Keep Open MPI's hwloc from loading the OpenCL ICDs into every rank.
/// hwloc's OpenCL component, run inside `MPI_Init`, loads `libOpenCL` and
/// with it every installed ICD; PoCL's brings its own LLVM, and a GPU
/// plugin's run-time compiler that links another LLVM (hiprtc) then aborts
/// the process when it loads ("LLVM ERROR: inconsistency in registered
/// CommandLine options": an MPI build, a HIP run with a cold kernel cache).
/// toast-rs never asks hwloc for OpenCL devices, so the component is turned
/// off, unless the user set `HWLOC_COMPONENTS` themselves.
#[cfg(feature = "mpi")]
fn keep_hwloc_off_opencl() {
    if std::env::var_os("HWLOC_COMPONENTS").is_none() {
        // Called first thing in `main`, before any other thread exists that
        // could read the environment at the same time.
        std::env::set_var("HWLOC_COMPONENTS", "-opencl");
    }
}

fn main() -> ExitCode {
    #[cfg(unix)]
    default_sigpipe();
    // Before any thread: a run stopped by a signal removes its staged
    // outputs' temporaries.
    interrupt::install();
    #[cfg(feature = "mpi")]
    keep_hwloc_off_opencl();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    init_logging(cli.verbose);
    // What is still buffered is written now: a failure is the run's.
    match run(cli).and_then(|c| Ok(console::Stdout.flush().map(|()| c)?)) {
        Ok(c) => ExitCode::from(c),
        Err(e) => failure(&e),
    }
}

/// The exit of a failed command: the error's chain on standard error and
/// status 2; a closed standard output ends it quietly
/// ([`console::EXIT_CLOSED_STDOUT`]).
fn failure(e: &anyhow::Error) -> ExitCode {
    if console::stdout_failure(e).is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) {
        return ExitCode::from(console::EXIT_CLOSED_STDOUT);
    }
    errln!("toast-cli: {}", error_chain(e));
    ExitCode::from(2)
}

/// What clap ends with: help and version on standard output (status 0, or
/// a [`failure`] when it cannot be written), a usage error on standard
/// error (status 2).
fn clap_exit(e: &clap::Error) -> ExitCode {
    let printed = e.print().and_then(|()| console::Stdout.flush());
    if let (false, Err(io)) = (e.use_stderr(), printed) {
        return failure(&console::stdout_error(io).into());
    }
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use anyhow::Context;

    #[derive(Debug, thiserror::Error)]
    #[error("phase: {0}")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn a_cause_is_printed_once() {
        let io = std::io::Error::other("disk full");
        let e = anyhow::Error::from(Outer(io)).context("writing map.fits");
        assert_eq!(error_chain(&e), "writing map.fits: phase: disk full");
        let plain: anyhow::Result<()> = Err(std::io::Error::other("gone")).context("reading");
        assert_eq!(error_chain(&plain.unwrap_err()), "reading: gone");
    }

    /// An error quoting a huge input keeps its start and end, within
    /// MAX_ERROR_CHARS (multi-byte characters cut whole).
    #[test]
    fn a_huge_error_is_bounded() {
        let huge = format!("--set {}: unknown section", "é.".repeat(50_000));
        let e = anyhow::anyhow!(huge.clone());
        let line = error_chain(&e);
        assert!(
            line.chars().count() < super::MAX_ERROR_CHARS + 100,
            "{}",
            line.len()
        );
        assert!(line.starts_with("--set é.é."), "{line}");
        assert!(line.ends_with(".: unknown section"), "{line}");
        let left_out = huge.chars().count() - super::MAX_ERROR_CHARS;
        assert!(
            line.contains(&format!("[... {left_out} characters left out ...]")),
            "{line}"
        );
    }
}
