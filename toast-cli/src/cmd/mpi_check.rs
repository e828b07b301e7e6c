//! `toast-cli mpi-check` (only with the `mpi` feature): every collective of
//! the world communicator, across the ranks of an `mpirun` job, with values
//! that depend on the rank, each result compared with its closed form.
//!
//! Each rank prints `rank R of P: all N collective checks passed` and exits
//! 0, or names every failed check on stderr and exits 1. Rank 0 first
//! prints the communicator (`toast-cli mpi-check: MPI (Open MPI v4.1.4,
//! ...), 2 ranks`).
//!
//! The command starts with the fault point `mpi-check`
//! (`TOAST_FAULT_INJECT=RANK:mpi-check[:error|kill|term]`), followed by a barrier:
//! when one rank fails there, the others are already waiting in a
//! collective, so the job ends only if the failing rank's `MPI_Abort` (or
//! its death, noticed by `mpirun`) ends them; otherwise it hangs, which is
//! what the tests look for.
//!
//! The checks only use [`Comm`], so the unit tests run them on
//! [`toast_core::SerialComm`] as well.

use crate::parallel;
use toast_core::comm::gather_timer_stats;
use toast_core::{Comm, CommError, ReduceOp, Timers};

/// The phase name of the fault point at the start of the command.
pub const FAULT_PHASE: &str = "mpi-check";

/// `toast-cli mpi-check`: initialise MPI, run the checks, finalise MPI
/// (dropping the communicator) and return the exit status.
#[cfg(feature = "mpi")]
pub fn main(bench_mib: Option<usize>) -> anyhow::Result<u8> {
    let comm = parallel::init()?;
    let code = match bench_mib {
        Some(mib) => bench(&*comm, mib)?,
        None => run(&*comm)?,
    };
    // The last reference: MPI_Finalize runs here, before main returns.
    drop(comm);
    Ok(code)
}

/// Time 5 allreduces (sum) of `mib` MiB of f64 after one warm-up; rank 0
/// prints the mean time and the bandwidth (buffer bytes over time).
#[cfg(feature = "mpi")]
pub fn bench(comm: &dyn Comm, mib: usize) -> anyhow::Result<u8> {
    if mib == 0 {
        return Err(anyhow::anyhow!("--bench-mib 0: must be at least 1"));
    }
    crate::limits::check_memory(
        &format!("--bench-mib {mib}"),
        crate::limits::product(&[mib as u128, 1 << 20]),
    )?;
    let n = mib * (1 << 20) / 8;
    let mut buf: Vec<f64> = (0..n).map(|i| (i % 1000) as f64).collect();
    let err = anyhow::Error::from;
    comm.allreduce_f64(&mut buf, toast_core::ReduceOp::Sum)
        .map_err(err)?;
    comm.barrier().map_err(err)?;
    let reps = 5;
    let t0 = std::time::Instant::now();
    for _ in 0..reps {
        comm.allreduce_f64(&mut buf, toast_core::ReduceOp::Sum)
            .map_err(err)?;
    }
    let dt = t0.elapsed().as_secs_f64() / reps as f64;
    let mut worst = [dt];
    comm.allreduce_f64(&mut worst, toast_core::ReduceOp::Max)
        .map_err(err)?;
    if comm.rank() == 0 {
        crate::outln!(
            "allreduce of {mib} MiB f64 on {} ranks: {:.2} ms ({:.2} GB/s of buffer)",
            comm.size(),
            1e3 * worst[0],
            (n * 8) as f64 / worst[0] / 1e9
        )?;
    }
    Ok(0)
}

/// The checks on `comm`, with the fault point first; the exit status.
pub fn run(comm: &dyn Comm) -> anyhow::Result<u8> {
    let checked = parallel::check_fault_spec(comm, &|p| p == FAULT_PHASE);
    if let Err(e) = checked.and_then(|()| parallel::fault_point(comm, FAULT_PHASE)) {
        parallel::fail(comm, &crate::error_chain(&e), 2);
    }
    if comm.rank() == 0 {
        crate::outln!("toast-cli mpi-check: {}", comm.describe())?;
    }
    let checks = run_checks(comm);
    let (rank, size) = (comm.rank(), comm.size());
    if checks.failed.is_empty() {
        crate::outln!(
            "rank {rank} of {size}: all {} collective checks passed",
            checks.total()
        )?;
        Ok(0)
    } else {
        for f in &checks.failed {
            crate::errln!("rank {rank} of {size}: check failed: {f}");
        }
        crate::outln!(
            "rank {rank} of {size}: {} of {} collective checks failed",
            checks.failed.len(),
            checks.total()
        )?;
        Ok(1)
    }
}

/// Outcome of the checks on one rank.
#[derive(Debug, Default)]
pub struct Checks {
    /// Checks that passed.
    pub passed: usize,
    /// Failed checks: name and what was found.
    pub failed: Vec<String>,
}

impl Checks {
    /// Number of checks made.
    pub fn total(&self) -> usize {
        self.passed + self.failed.len()
    }

    fn check(&mut self, name: &str, ok: bool, found: impl FnOnce() -> String) {
        if ok {
            self.passed += 1;
        } else {
            self.failed.push(format!("{name}: {}", found()));
        }
    }

    /// `result` is `Ok` and the buffer is as expected.
    fn check_ok<T: std::fmt::Debug + PartialEq>(
        &mut self,
        name: &str,
        result: Result<(), CommError>,
        got: &T,
        expected: &T,
    ) {
        match result {
            Ok(()) => self.check(name, got == expected, || {
                format!("got {got:?}, expected {expected:?}")
            }),
            Err(e) => self.check(name, false, || format!("unexpected error: {e}")),
        }
    }

    /// `result` is an error (the same on every rank, so no rank waits).
    fn check_err<T>(&mut self, name: &str, result: Result<T, CommError>) {
        self.check(name, result.is_err(), || {
            "no error where one was expected".into()
        });
    }
}

/// Every collective of `comm`, checked against closed forms. Every rank
/// makes the same checks (a root checks the result, the others that they
/// got none), so `total()` is the same on every rank.
pub fn run_checks(comm: &dyn Comm) -> Checks {
    let mut c = Checks::default();
    let (r, p) = (comm.rank(), comm.size());
    let (rf, pf) = (r as f64, p as f64);
    let (ri, pi) = (r as i64, p as i64);
    // Root ranks to try: the first and the last.
    let mut roots = vec![0, p - 1];
    roots.dedup();

    // Right after the fault point: a rank that failed there leaves the
    // others waiting here.
    match comm.barrier() {
        Ok(()) => c.check("barrier", true, String::new),
        Err(e) => c.check("barrier", false, || e.to_string()),
    }

    // allreduce, f64: sums of halves and integers are exact.
    let sum_r = pf * (pf - 1.0) / 2.0; // 0 + 1 + ... + (p - 1)
    let input_f = || vec![rf + 1.0, 0.5 * rf, -rf, 10.0 - rf];
    let expected_f = [
        (
            ReduceOp::Sum,
            vec![sum_r + pf, 0.5 * sum_r, -sum_r, 10.0 * pf - sum_r],
        ),
        (
            ReduceOp::Min,
            vec![1.0, 0.0, -(pf - 1.0), 10.0 - (pf - 1.0)],
        ),
        (ReduceOp::Max, vec![pf, 0.5 * (pf - 1.0), 0.0, 10.0]),
    ];
    for (op, expected) in &expected_f {
        let mut buf = input_f();
        let res = comm.allreduce_f64(&mut buf, *op);
        c.check_ok(&format!("allreduce_f64 {op:?}"), res, &buf, expected);
    }
    // A long buffer (MpiComm reduces 2^20 values per MPI call): element i
    // is r * i + 0.5.
    let n = (1 << 20) + 3;
    let mut buf: Vec<f64> = (0..n).map(|i| rf * i as f64 + 0.5).collect();
    let expected: Vec<f64> = (0..n).map(|i| sum_r * i as f64 + 0.5 * pf).collect();
    let res = comm.allreduce_f64(&mut buf, ReduceOp::Sum);
    c.check_ok("allreduce_f64 Sum of 2^20 + 3 values", res, &buf, &expected);

    // allreduce, i64: values beyond 32 bits and near the i64 limits.
    let sum_ri = pi * (pi - 1) / 2;
    let big = 1i64 << 40;
    let input_i = || vec![ri, 1, ri * big, -3, -ri - (1 << 35), ri * ri, i64::MAX - ri];
    let expected_i = [
        (
            ReduceOp::Sum,
            vec![
                sum_ri,
                pi,
                sum_ri * big,
                -3 * pi,
                -sum_ri - pi * (1 << 35),
                (pi - 1) * pi * (2 * pi - 1) / 6,
                // Only rank 0 gives i64::MAX exactly; the sum wraps, so
                // leave it out below.
                0,
            ],
        ),
        (
            ReduceOp::Min,
            vec![0, 1, 0, -3, -(pi - 1) - (1 << 35), 0, i64::MAX - (pi - 1)],
        ),
        (
            ReduceOp::Max,
            vec![
                pi - 1,
                1,
                (pi - 1) * big,
                -3,
                -(1 << 35),
                (pi - 1) * (pi - 1),
                i64::MAX,
            ],
        ),
    ];
    for (op, expected) in &expected_i {
        let mut buf = input_i();
        let mut expected = expected.clone();
        if *op == ReduceOp::Sum {
            buf.pop();
            expected.pop();
        }
        let res = comm.allreduce_i64(&mut buf, *op);
        c.check_ok(&format!("allreduce_i64 {op:?}"), res, &buf, &expected);
    }
    let mut empty: Vec<f64> = Vec::new();
    let res = comm.allreduce_f64(&mut empty, ReduceOp::Sum);
    c.check_ok("allreduce_f64 of nothing", res, &empty, &Vec::new());

    // reduce onto the first and the last rank.
    for &root in &roots {
        for (op, expected) in [
            (ReduceOp::Sum, vec![sum_r + pf, 0.5 * sum_r - pf]),
            (ReduceOp::Min, vec![1.0, -1.0]),
            (ReduceOp::Max, vec![pf, 0.5 * (pf - 1.0) - 1.0]),
        ] {
            let mut buf = vec![rf + 1.0, 0.5 * rf - 1.0];
            let res = comm.reduce_f64(root, &mut buf, op);
            let name = format!("reduce_f64 {op:?} onto rank {root}");
            if r == root {
                c.check_ok(&name, res, &buf, &expected);
            } else {
                c.check_ok(&name, res, &(), &());
            }
        }
        for (op, expected) in [
            (
                ReduceOp::Sum,
                vec![(pi - 1) * pi * (2 * pi - 1) / 6, 5 * pi - sum_ri],
            ),
            (ReduceOp::Min, vec![0, 5 - (pi - 1)]),
            (ReduceOp::Max, vec![(pi - 1) * (pi - 1), 5]),
        ] {
            let mut buf = vec![ri * ri, 5 - ri];
            let res = comm.reduce_i64(root, &mut buf, op);
            let name = format!("reduce_i64 {op:?} onto rank {root}");
            if r == root {
                c.check_ok(&name, res, &buf, &expected);
            } else {
                c.check_ok(&name, res, &(), &());
            }
        }
    }

    // A long reduction onto the last rank: element i is r * i.
    let n = (1 << 20) + 5;
    let mut buf: Vec<i64> = (0..n).map(|i| ri * i).collect();
    let res = comm.reduce_i64(p - 1, &mut buf, ReduceOp::Sum);
    let name = format!("reduce_i64 Sum of 2^20 + 5 values onto rank {}", p - 1);
    if r == p - 1 {
        let expected: Vec<i64> = (0..n).map(|i| sum_ri * i).collect();
        c.check_ok(&name, res, &buf, &expected);
    } else {
        c.check_ok(&name, res, &(), &());
    }

    // Errors that every rank finds alike, so none is left waiting.
    c.check_err(
        "reduce onto a rank out of range",
        comm.reduce_f64(p, &mut [1.0], ReduceOp::Sum),
    );
    c.check_err(
        "gather onto a rank out of range",
        comm.gather_bytes(p, b"x"),
    );
    c.check_err(
        "broadcast from a rank out of range",
        comm.broadcast_bytes(p + 3, &mut vec![1]),
    );
    if p > 1 {
        // Rank 0 passes two values, the others one.
        let mut buf = vec![1.0; if r == 0 { 2 } else { 1 }];
        c.check_err(
            "allreduce with lengths differing between ranks",
            comm.allreduce_f64(&mut buf, ReduceOp::Sum),
        );
        let mut buf = vec![1; if r == p - 1 { 3 } else { 1 }];
        c.check_err(
            "reduce with lengths differing between ranks",
            comm.reduce_i64(0, &mut buf, ReduceOp::Max),
        );
    }
    // Still in step after the errors.
    let mut buf = vec![1i64];
    let res = comm.allreduce_i64(&mut buf, ReduceOp::Sum);
    c.check_ok("allreduce after the errors", res, &buf, &vec![pi]);

    // gather of byte strings of different lengths (rank 0's is empty).
    let payload = |q: usize| -> Vec<u8> {
        if q == 0 {
            Vec::new()
        } else {
            format!("rank {q} of {p};").repeat(q).into_bytes()
        }
    };
    let large = |q: usize| -> Vec<u8> {
        (0..100_000 + 1000 * q)
            .map(|i| (i * 31 + q) as u8)
            .collect()
    };
    for &root in &roots {
        for (what, make) in [
            ("short", &payload as &dyn Fn(usize) -> Vec<u8>),
            ("100 kB", &large),
        ] {
            let name = format!("gather_bytes ({what}) onto rank {root}");
            match comm.gather_bytes(root, &make(r)) {
                Ok(got) => {
                    let expected = (r == root).then(|| (0..p).map(make).collect::<Vec<_>>());
                    c.check(&name, got == expected, || {
                        format!(
                            "got lengths {:?}, expected {:?}",
                            got.map(|g| g.iter().map(Vec::len).collect::<Vec<_>>()),
                            expected.map(|g| g.iter().map(Vec::len).collect::<Vec<_>>())
                        )
                    });
                }
                Err(e) => c.check(&name, false, || format!("unexpected error: {e}")),
            }
        }
    }

    // broadcast: the other ranks start with buffers of other lengths.
    let mib: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8).collect();
    for &root in &roots {
        let message = format!("from rank {root} of {p};")
            .repeat(root + 1)
            .into_bytes();
        for (what, content) in [
            ("short", message),
            ("empty", Vec::new()),
            ("1 MiB", mib.clone()),
        ] {
            let mut buf = if r == root {
                content.clone()
            } else {
                vec![0xff; r + 5]
            };
            let res = comm.broadcast_bytes(root, &mut buf);
            let name = format!("broadcast_bytes ({what}) from rank {root}");
            match res {
                Ok(()) => c.check(&name, buf == content, || {
                    format!(
                        "got {} bytes, expected {} (first differing at {:?})",
                        buf.len(),
                        content.len(),
                        buf.iter().zip(&content).position(|(a, b)| a != b)
                    )
                }),
                Err(e) => c.check(&name, false, || format!("unexpected error: {e}")),
            }
        }
    }

    // Timers gathered onto rank 0: "common" on every rank (r + 1 seconds,
    // r + 1 calls), "even ranks" on even ranks, "rank 0 only" on rank 0.
    let mut timers = Timers::new();
    timers.record("common", rf + 1.0, r as u64 + 1);
    if r % 2 == 0 {
        timers.record("even ranks", 0.5, 2);
    }
    if r == 0 {
        timers.record("rank 0 only", 2.0, 1);
    }
    match gather_timer_stats(comm, &timers) {
        Ok(Some(stats)) if r == 0 => {
            let got: Vec<_> = stats
                .iter()
                .map(|s| {
                    (
                        s.name.as_str(),
                        s.processes,
                        s.min_calls,
                        s.max_calls,
                        s.min_time,
                        s.max_time,
                        s.mean_time,
                        s.median_time,
                    )
                })
                .collect();
            let mid = (pf + 1.0) / 2.0; // mean and median of 1..=p
            let expected = vec![
                ("common", p, 1, p as u64, 1.0, pf, mid, mid),
                ("even ranks", p.div_ceil(2), 2, 2, 0.5, 0.5, 0.5, 0.5),
                ("rank 0 only", 1, 1, 1, 2.0, 2.0, 2.0, 2.0),
            ];
            c.check("gather_timer_stats onto rank 0", got == expected, || {
                format!("got {got:?}, expected {expected:?}")
            });
        }
        Ok(None) if r != 0 => c.check("gather_timer_stats onto rank 0", true, String::new),
        Ok(other) => c.check("gather_timer_stats onto rank 0", false, || {
            format!("rank {r} got {other:?}")
        }),
        Err(e) => c.check("gather_timer_stats onto rank 0", false, || {
            format!("unexpected error: {e}")
        }),
    }

    match comm.barrier() {
        Ok(()) => c.check("final barrier", true, String::new),
        Err(e) => c.check("final barrier", false, || e.to_string()),
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use toast_core::SerialComm;

    #[test]
    fn every_check_passes_on_one_process() {
        let c = run_checks(&SerialComm);
        assert!(c.failed.is_empty(), "{:#?}", c.failed);
        assert!(c.total() > 20, "{}", c.total());
        if std::env::var_os("TOAST_FAULT_INJECT").is_none() {
            assert_eq!(run(&SerialComm).unwrap(), 0);
        }
    }

    /// One process whose sums are off by one and whose broadcasts lose a
    /// byte.
    #[derive(Debug)]
    struct Broken;

    impl Comm for Broken {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            1
        }
        fn describe(&self) -> String {
            "broken".into()
        }
        fn barrier(&self) -> Result<(), CommError> {
            Ok(())
        }
        fn allreduce_f64(&self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
            if op == ReduceOp::Sum {
                buf.iter_mut().for_each(|x| *x += 1.0);
            }
            Ok(())
        }
        fn allreduce_i64(&self, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError> {
            SerialComm.allreduce_i64(buf, op)
        }
        fn reduce_f64(&self, root: usize, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
            SerialComm.reduce_f64(root, buf, op)
        }
        fn reduce_i64(&self, root: usize, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError> {
            SerialComm.reduce_i64(root, buf, op)
        }
        fn gather_bytes(
            &self,
            root: usize,
            bytes: &[u8],
        ) -> Result<Option<Vec<Vec<u8>>>, CommError> {
            SerialComm.gather_bytes(root, bytes)
        }
        fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
            SerialComm.broadcast_bytes(root, buf)?;
            buf.pop();
            Ok(())
        }
        fn abort(&self, code: i32) -> ! {
            panic!("abort({code})")
        }
    }

    #[test]
    fn wrong_results_are_named() {
        let c = run_checks(&Broken);
        let names: Vec<&str> = c
            .failed
            .iter()
            .map(|f| f.split(':').next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "allreduce_f64 Sum",
                "allreduce_f64 Sum of 2^20 + 3 values",
                "broadcast_bytes (short) from rank 0",
                "broadcast_bytes (1 MiB) from rank 0",
            ],
            "{:#?}",
            c.failed
        );
        assert_eq!(c.total(), run_checks(&SerialComm).total());
    }
}
