//! The MPI communicator across real ranks: `toast-cli mpi-check` under
//! `mpirun` (only built with the `mpi` feature, which needs Open MPI or
//! MPICH; `.ci/run` installs Open MPI).
//!
//! Every run has a deadline: a job still running after it is a hang (a
//! rank left waiting in a collective), killed and reported as a failure.
//! The runs set what `mpirun` needs as root on a small machine:
//! `OMPI_ALLOW_RUN_AS_ROOT=1`, `OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1` and
//! `--oversubscribe` (more ranks than cores).

#![cfg(feature = "mpi")]

use std::process::{Command, ExitStatus};
use std::time::Duration;
use toast_testkit::process;

const BIN: &str = env!("CARGO_BIN_EXE_toast-cli");

/// Longer than any run takes (about a second each), short enough to tell a
/// hang from slowness on a loaded two-core machine.
const DEADLINE: Duration = Duration::from_secs(60);

struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn text(&self) -> String {
        format!(
            "exit status: {}\n--- stdout:\n{}--- stderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Run `cmd` to completion (one MPI job at a time), or fail the test when
/// it outlives [`DEADLINE`].
fn run_with_deadline(mut cmd: Command, what: &str) -> Outcome {
    let _one = process::one_mpi_job_at_a_time();
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1");
    let o = process::run_with_deadline(cmd, DEADLINE, what);
    Outcome {
        status: o.status,
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// `mpirun --oversubscribe -n N toast-cli mpi-check`, with `fault` as
/// `TOAST_FAULT_INJECT` (or none).
fn mpi_check(n: usize, fault: Option<&str>) -> Outcome {
    let mut cmd = process::mpirun(n);
    cmd.args([BIN, "mpi-check"]);
    cmd.env_remove("TOAST_FAULT_INJECT");
    if let Some(f) = fault {
        cmd.env("TOAST_FAULT_INJECT", f);
    }
    let what = format!("mpirun -n {n} toast-cli mpi-check (TOAST_FAULT_INJECT={fault:?})");
    run_with_deadline(cmd, &what)
}

/// Every rank's `rank R of N: all K collective checks passed`, with the
/// same K on every rank; K.
fn assert_all_passed(o: &Outcome, n: usize) -> usize {
    let t = o.text();
    assert!(o.status.success(), "{t}");
    let counts: Vec<usize> = (0..n)
        .map(|r| {
            let prefix = format!("rank {r} of {n}: all ");
            let line = o
                .stdout
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no line from rank {r}:\n{t}"));
            let k = line[prefix.len()..]
                .strip_suffix(" collective checks passed")
                .and_then(|k| k.parse().ok())
                .unwrap_or_else(|| panic!("unexpected line {line:?}:\n{t}"));
            k
        })
        .collect();
    assert!(counts.iter().all(|&k| k == counts[0]), "{counts:?}\n{t}");
    assert!(counts[0] > 20, "{t}");
    assert!(!o.stderr.contains("check failed"), "{t}");
    counts[0]
}

#[test]
fn every_collective_agrees_on_two_ranks() {
    let o = mpi_check(2, None);
    assert_all_passed(&o, 2);
    // Rank 0 names the library and the size.
    assert!(
        o.stdout.contains("toast-cli mpi-check: MPI (") && o.stdout.contains("), 2 ranks"),
        "{}",
        o.text()
    );
}

#[test]
fn every_collective_agrees_on_three_ranks() {
    // Three ranks: reductions and gathers onto a root that is neither the
    // first rank nor the only other one.
    let o = mpi_check(3, None);
    assert_all_passed(&o, 3);
    assert!(o.stdout.contains("), 3 ranks"), "{}", o.text());
}

#[test]
fn without_mpirun_the_process_is_a_one_rank_job() {
    let mut cmd = Command::new(BIN);
    cmd.arg("mpi-check").env_remove("TOAST_FAULT_INJECT");
    let o = run_with_deadline(cmd, "toast-cli mpi-check (singleton)");
    assert_all_passed(&o, 1);
    assert!(o.stdout.contains("), 1 rank\n"), "{}", o.text());
}

#[test]
fn a_rank_that_fails_aborts_the_job() {
    // Rank 1 fails at the fault point while rank 0 waits in a barrier: the
    // job ends only through rank 1's MPI_Abort.
    let o = mpi_check(2, Some("1:mpi-check:error"));
    let t = o.text();
    assert!(!o.status.success(), "{t}");
    assert_eq!(o.status.code(), Some(2), "MPI_Abort's error code: {t}");
    assert!(o.stderr.contains("rank 1 of 2"), "{t}");
    assert!(o.stderr.contains("injected failure"), "{t}");
    // Open MPI's own notice ("MPI_ABORT was invoked on rank 1 in
    // communicator MPI_COMM_WORLD with errorcode 2") is not checked: 4.1.4
    // loses it in about one run in seven, printing `ORTE_ERROR_LOG: Data
    // unpack would read past end of buffer in file
    // ../../../orte/util/show_help.c` (or `Out of resource`) instead; the
    // rank's own lines and the exit status are always there.
    assert!(!o.stdout.contains("checks passed"), "{t}");

    // The same with three ranks and the last one failing.
    let o = mpi_check(3, Some("2:mpi-check"));
    let t = o.text();
    assert!(!o.status.success(), "{t}");
    assert!(o.stderr.contains("rank 2 of 3"), "{t}");
    assert!(o.stderr.contains("injected failure"), "{t}");
}

#[test]
fn a_rank_that_dies_ends_the_job_and_is_named() {
    // Rank 1 is killed (SIGKILL) while rank 0 waits in a barrier: mpirun
    // notices, ends the job and names the rank.
    let o = mpi_check(2, Some("1:mpi-check:kill"));
    let t = o.text();
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("process rank 1") && t.contains("exited on signal 9"),
        "{t}"
    );
    assert!(!o.stdout.contains("checks passed"), "{t}");
}
