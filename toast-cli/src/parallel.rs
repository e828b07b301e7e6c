//! Processes of a run: the world communicator, failure handling and fault
//! injection.
//!
//! Without the `mpi` cargo feature the world is one process
//! ([`toast_core::SerialComm`]), and a process a launcher started as one of
//! several (`mpirun -n 2`, `srun -n 2`: `launched_world_size`) is refused:
//! each would run the whole job alone and write the same outputs. Runs
//! launched together on purpose, each its own job (a task farm: `srun -n
//! 8 sh -c 'toast-cli run --out-dir out_$SLURM_PROCID ...'`), say so with
//! `TOAST_INDEPENDENT_RUNS=1`. With the
//! feature, [`init`] initialises MPI (see `mpi_comm.rs`)
//! and returns the MPI world; a binary built with the feature and started
//! without `mpirun` is a one-rank MPI job (MPI's singleton mode).
//!
//! A rank that fails must end the whole job rather than leave the others
//! waiting in a collective: [`fail`] prints `rank R of P: <cause>` on
//! stderr and calls `MPI_Abort`, which makes `mpirun` kill every rank. A
//! rank killed outright is noticed by `mpirun` itself, which then ends the
//! job and names the rank.
//!
//! `TOAST_FAULT_INJECT=RANK:PHASE[:MODE]` makes rank `RANK` fail at the
//! start of phase `PHASE` (`SimSatellite`, `ScanHealpixMap`, `SimNoise`,
//! `MapMaker`, `write outputs`, or `output NAME` just after the temporary
//! file of output `NAME` is written, e.g. `output mapmaker_map.fits`): mode `error` (default) returns an error through the
//! normal path, mode `kill` sends the process SIGKILL, mode `term` SIGTERM
//! (its handler runs first: `crate::interrupt`). The tests use it to
//! check that a failing or vanishing rank ends the job with a message.

use std::sync::Arc;
use toast_accel::launcher::node_local_size;
use toast_core::Comm;

/// The world communicator of this process.
pub fn init() -> anyhow::Result<Arc<dyn Comm>> {
    #[cfg(feature = "mpi")]
    {
        crate::mpi_comm::MpiComm::init().map(|c| Arc::new(c) as Arc<dyn Comm>)
    }
    #[cfg(not(feature = "mpi"))]
    {
        let independent = independent_runs_declared();
        if let Some((n, var)) = launched_world_size().filter(|&(n, _)| n > 1 && !independent) {
            anyhow::bail!(
                "this process is one of {n} a launcher started ({var}={n}), but this toast-cli \
                 was built without MPI: each process would run the whole job alone and write \
                 the same outputs; build it with MPI (cargo build --release -p toast-cli \
                 --features mpi) or run one process (or, for independent runs with an \
                 --out-dir each, set {INDEPENDENT_RUNS_ENV}=1)"
            );
        }
        Ok(Arc::new(toast_core::SerialComm))
    }
}

/// The environment variable that declares the processes a launcher
/// started to be independent runs, each its own job (`1`): a build without
/// MPI then runs each as one process instead of refusing. (An MPI build
/// runs them as one job.)
#[cfg(not(feature = "mpi"))]
const INDEPENDENT_RUNS_ENV: &str = "TOAST_INDEPENDENT_RUNS";

/// Whether [`INDEPENDENT_RUNS_ENV`] declares this process one of several
/// independent runs (its value is `1`; any other value does not).
#[cfg(not(feature = "mpi"))]
fn independent_runs_declared() -> bool {
    std::env::var(INDEPENDENT_RUNS_ENV).is_ok_and(|v| v.trim() == "1")
}

/// The number of processes a launcher started this one among, and the
/// variable that says it: Open MPI's `OMPI_COMM_WORLD_SIZE`, Hydra's and
/// PMI's `PMI_SIZE`, Slurm's `SLURM_STEP_NUM_TASKS` (set by `srun` for its
/// step, not by an allocation alone).
#[cfg(not(feature = "mpi"))]
fn launched_world_size() -> Option<(usize, &'static str)> {
    launcher_count(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"])
}

/// The first of the launcher's variables `vars` that holds a count, with
/// its name.
#[cfg(not(feature = "mpi"))]
fn launcher_count(vars: &[&'static str]) -> Option<(usize, &'static str)> {
    vars.iter()
        .find_map(|&k| Some((std::env::var(k).ok()?.trim().parse::<usize>().ok()?, k)))
}

/// The independent runs (`TOAST_INDEPENDENT_RUNS=1`, a task farm) that
/// share this node with this one, itself included: the launcher's
/// node-local count ([`node_local_size`], the variables the GPU plugins
/// read too), at most the runs it started. Each
/// run is a job of one process, but the node's memory holds all of them,
/// so the memory check counts them all. `None` for a process that is not
/// one of several declared independent runs, or where the launcher does
/// not say how many share the node (each run then checks its memory
/// alone).
pub fn independent_runs_on_node() -> Option<usize> {
    #[cfg(feature = "mpi")]
    {
        None
    }
    #[cfg(not(feature = "mpi"))]
    {
        let (launched, _) =
            launched_world_size().filter(|&(n, _)| n > 1 && independent_runs_declared())?;
        node_local_size().map(|n| n.min(launched))
    }
}

/// Threads per process when `--threads` is not given and several
/// processes share the node: the cores divided among them (at least 1),
/// so that `mpirun -n 4` on a 16-core node runs 4 × 4 threads rather than
/// 4 × 16. `None` (all cores) for a single process per node.
pub fn default_threads_per_rank() -> Option<usize> {
    let local = node_local_size().filter(|&n| n > 1)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some((cores / local).max(1))
}

/// End the job after a failure on this rank: print the cause, naming the
/// rank when there are several, then abort every process (MPI) or exit.
pub fn fail(comm: &dyn Comm, message: &str, code: i32) -> ! {
    if comm.size() > 1 {
        let (rank, size) = (comm.rank(), comm.size());
        crate::console::stderr(&format!(
            "toast-cli: rank {rank} of {size}: {message}\n\
             toast-cli: rank {rank} is aborting the whole job (MPI_Abort, exit status {code})\n"
        ));
        comm.abort(code)
    }
    crate::errln!("toast-cli: {message}");
    std::process::exit(code)
}

/// What `TOAST_FAULT_INJECT=RANK:PHASE[:MODE]` asks for.
struct FaultSpec {
    /// The variable's value, for messages.
    text: String,
    rank: usize,
    phase: String,
    mode: FaultMode,
}

/// How an injected fault ends the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FaultMode {
    /// An error returned through the normal path.
    Error,
    /// SIGKILL: the process ends at once, nothing of ours runs.
    Kill,
    /// SIGTERM, as a batch system's time limit sends it: the process's
    /// handler runs (`crate::interrupt`), then it ends by the signal.
    Term,
}

/// `TOAST_FAULT_INJECT`, parsed: `None` when unset; an error naming the
/// problem for a malformed value, or a phase that `known` does not accept
/// (a fault that could never fire would leave a test passing for nothing).
fn fault_spec(known: &dyn Fn(&str) -> bool) -> anyhow::Result<Option<FaultSpec>> {
    let Ok(spec) = std::env::var("TOAST_FAULT_INJECT") else {
        return Ok(None);
    };
    let bad = |why: String| anyhow::anyhow!("TOAST_FAULT_INJECT={spec:?}: {why}");
    let mut parts = spec.split(':');
    let (Some(rank), Some(phase)) = (parts.next(), parts.next()) else {
        return Err(bad("expected RANK:PHASE[:error|kill|term]".into()));
    };
    let mode = match parts.next() {
        None | Some("error") => FaultMode::Error,
        Some("kill") => FaultMode::Kill,
        Some("term") => FaultMode::Term,
        Some(other) => return Err(bad(format!("unknown mode {other:?} (error, kill or term)"))),
    };
    if let Some(extra) = parts.next() {
        return Err(bad(format!(
            "{extra:?} after the mode: expected RANK:PHASE[:error|kill|term]"
        )));
    }
    let rank = rank
        .parse()
        .map_err(|_| bad(format!("rank {rank:?} is not a number")))?;
    if !known(phase) {
        return Err(bad(format!("no phase {phase:?} in this command")));
    }
    Ok(Some(FaultSpec {
        text: spec.clone(),
        rank,
        phase: phase.to_string(),
        mode,
    }))
}

/// Check `TOAST_FAULT_INJECT` before any work (the dry run too): its form,
/// that `known` accepts its phase, and that its rank is one of `comm`'s.
pub fn check_fault_spec(comm: &dyn Comm, known: &dyn Fn(&str) -> bool) -> anyhow::Result<()> {
    match fault_spec(known)? {
        Some(f) if f.rank >= comm.size() => Err(anyhow::anyhow!(
            "TOAST_FAULT_INJECT={:?}: rank {} of a job of {} process(es)",
            f.text,
            f.rank,
            comm.size()
        )),
        _ => Ok(()),
    }
}

/// The fault injected at `phase` on this rank by `TOAST_FAULT_INJECT`, if
/// any: `Err` for mode `error`; modes `kill` and `term` do not return.
pub fn fault_point(comm: &dyn Comm, phase: &str) -> anyhow::Result<()> {
    let Some(f) = fault_spec(&|_| true)? else {
        return Ok(());
    };
    if f.rank != comm.rank() || f.phase != phase {
        return Ok(());
    }
    let spec = &f.text;
    let name = match f.mode {
        FaultMode::Error => {
            return Err(anyhow::anyhow!(
                "{phase}: injected failure (TOAST_FAULT_INJECT={spec})"
            ))
        }
        FaultMode::Kill => "KILL",
        FaultMode::Term => "TERM",
    };
    crate::console::stderr(&format!(
        "toast-cli: rank {}: {phase}: sending this process SIG{name} (TOAST_FAULT_INJECT={spec})\n",
        comm.rank()
    ));
    #[cfg(unix)]
    {
        let signal = match f.mode {
            FaultMode::Term => libc::SIGTERM,
            _ => libc::SIGKILL,
        };
        // SAFETY: `kill` of this process with a valid signal number; what
        // runs then is the signal's action (SIGTERM: `crate::interrupt`'s
        // handler, then the default action).
        unsafe { libc::kill(libc::getpid(), signal) };
        // The process ends by the signal (SIGTERM's handler may run on
        // another thread first); should it not, end it all the same.
        std::thread::sleep(std::time::Duration::from_secs(10));
    }
    std::process::abort()
}
