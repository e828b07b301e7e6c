//! The process communicator: what distributed runs need from MPI, as an
//! object-safe trait, so that nothing below the command line links MPI.
//!
//! [`SerialComm`] is the one-process implementation every build has;
//! `toast-cli`'s `mpi_comm` module (behind its `mpi` cargo feature)
//! implements [`Comm`] over a real MPI world communicator. Operators find
//! the communicator in the [`crate::ExecContext`] as a [`CommHandle`]
//! extension and use [`comm_of`], which falls back to [`SerialComm`], so a
//! single-process run and a one-rank MPI run take the same code path.
//!
//! Only collectives are offered (no point to point): every process calls
//! each one in the same order with buffers of the same length, as MPI
//! requires. A length that differs between ranks is the caller's bug; the
//! MPI implementation checks what it cheaply can and reports a
//! [`CommError`] naming the operation.
//!
//! [`ProcessLayout`] is TOAST's `toast.Comm` split of the world into groups
//! of `group_size` consecutive ranks; a group shares observations, its
//! processes split their detectors.

use std::fmt::Debug;
use std::sync::Arc;
use thiserror::Error;

/// A failed collective.
#[derive(Debug, Error)]
#[error("{op}: {message}")]
pub struct CommError {
    /// The operation (`allreduce`, `gather`, ...).
    pub op: &'static str,
    /// What went wrong.
    pub message: String,
}

impl CommError {
    /// An error of operation `op`.
    pub fn new(op: &'static str, message: impl Into<String>) -> Self {
        CommError {
            op,
            message: message.into(),
        }
    }
}

/// Reduction operator of [`Comm::allreduce_f64`] and friends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise minimum.
    Min,
    /// Elementwise maximum.
    Max,
}

impl ReduceOp {
    /// Combine two values (what a one-process reduction and the tests use).
    pub fn apply_f64(self, a: f64, b: f64) -> f64 {
        match self {
            ReduceOp::Sum => a + b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }

    /// Combine two integers.
    pub fn apply_i64(self, a: i64, b: i64) -> i64 {
        match self {
            ReduceOp::Sum => a + b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
        }
    }
}

/// A communicator over a fixed set of processes (MPI's world, or one
/// process).
pub trait Comm: Send + Sync + Debug {
    /// This process's rank, `0..size()`.
    fn rank(&self) -> usize;
    /// Number of processes.
    fn size(&self) -> usize;
    /// A short description (`"serial"`, `"MPI (Open MPI v4.1.4), 2 ranks"`).
    fn describe(&self) -> String;
    /// Wait for every process.
    fn barrier(&self) -> Result<(), CommError>;
    /// Elementwise reduction of `buf` across all processes; every process
    /// gets the result in `buf`.
    fn allreduce_f64(&self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError>;
    /// [`Comm::allreduce_f64`] for integers.
    fn allreduce_i64(&self, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError>;
    /// Elementwise reduction of `buf` onto `root` only (other ranks' `buf`
    /// is left unspecified).
    fn reduce_f64(&self, root: usize, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError>;
    /// [`Comm::reduce_f64`] for integers.
    fn reduce_i64(&self, root: usize, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError>;
    /// Gather one byte string per process onto `root`: `Some(per rank)` on
    /// the root, `None` elsewhere. Lengths may differ.
    fn gather_bytes(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CommError>;
    /// Broadcast `root`'s bytes to every process (`buf` is replaced).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError>;
    /// End every process of the job with `code` (MPI_Abort). Never returns.
    fn abort(&self, code: i32) -> !;
}

/// The one-process communicator: reductions are the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct SerialComm;

impl Comm for SerialComm {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn describe(&self) -> String {
        "serial (1 process)".into()
    }
    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
    fn allreduce_f64(&self, _buf: &mut [f64], _op: ReduceOp) -> Result<(), CommError> {
        Ok(())
    }
    fn allreduce_i64(&self, _buf: &mut [i64], _op: ReduceOp) -> Result<(), CommError> {
        Ok(())
    }
    fn reduce_f64(&self, root: usize, _buf: &mut [f64], _op: ReduceOp) -> Result<(), CommError> {
        check_root("reduce", root, 1)
    }
    fn reduce_i64(&self, root: usize, _buf: &mut [i64], _op: ReduceOp) -> Result<(), CommError> {
        check_root("reduce", root, 1)
    }
    fn gather_bytes(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CommError> {
        check_root("gather", root, 1)?;
        Ok(Some(vec![bytes.to_vec()]))
    }
    fn broadcast_bytes(&self, root: usize, _buf: &mut Vec<u8>) -> Result<(), CommError> {
        check_root("broadcast", root, 1)
    }
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
}

/// An error unless `root < size`.
pub fn check_root(op: &'static str, root: usize, size: usize) -> Result<(), CommError> {
    if root < size {
        Ok(())
    } else {
        Err(CommError::new(
            op,
            format!("root rank {root} out of range (communicator of {size})"),
        ))
    }
}

/// The communicator of a run, as an [`crate::ExecContext`] extension.
#[derive(Debug, Clone)]
pub struct CommHandle(pub Arc<dyn Comm>);

/// The run's communicator: the context's [`CommHandle`], or [`SerialComm`].
pub fn comm_of(ctx: &crate::ExecContext) -> Arc<dyn Comm> {
    match ctx.ext::<CommHandle>() {
        Ok(h) => Arc::clone(&h.0),
        Err(_) => Arc::new(SerialComm),
    }
}

/// Gather every process's timers onto rank 0 and combine them as TOAST's
/// `gather_timers` does (per timer: processes, min / max calls, min / max /
/// mean / median seconds). `Some` on rank 0, `None` elsewhere.
pub fn gather_timer_stats(
    comm: &dyn Comm,
    timers: &crate::Timers,
) -> Result<Option<Vec<crate::TimerStats>>, CommError> {
    let Some(all) = comm.gather_bytes(0, &timers.encode())? else {
        return Ok(None);
    };
    let decoded = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            crate::Timers::decode(b)
                .map_err(|e| CommError::new("gather timers", format!("rank {r}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let refs: Vec<&crate::Timers> = decoded.iter().collect();
    Ok(Some(crate::timing::compute_stats(&refs)))
}

/// TOAST's process groups: `size` ranks in groups of `group_size`
/// consecutive ranks. Observations are distributed to groups, detectors to
/// the processes of a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLayout {
    /// World rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Processes per group.
    pub group_size: usize,
}

impl ProcessLayout {
    /// A layout; `group_size` must divide `size`.
    pub fn new(rank: usize, size: usize, group_size: usize) -> Result<Self, String> {
        if size == 0 || rank >= size {
            return Err(format!("rank {rank} out of range for {size} processes"));
        }
        if group_size == 0 || !size.is_multiple_of(group_size) {
            return Err(format!(
                "group size {group_size} does not divide the {size} processes"
            ));
        }
        Ok(ProcessLayout {
            rank,
            size,
            group_size,
        })
    }

    /// One process.
    pub fn serial() -> Self {
        ProcessLayout {
            rank: 0,
            size: 1,
            group_size: 1,
        }
    }

    /// Number of groups.
    pub fn n_groups(&self) -> usize {
        self.size / self.group_size
    }

    /// This process's group.
    pub fn group(&self) -> usize {
        self.rank / self.group_size
    }

    /// This process's rank within its group.
    pub fn group_rank(&self) -> usize {
        self.rank % self.group_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_collectives_are_identities() {
        let c = SerialComm;
        let mut v = vec![1.0, 2.0];
        c.allreduce_f64(&mut v, ReduceOp::Sum).unwrap();
        assert_eq!(v, [1.0, 2.0]);
        let g = c.gather_bytes(0, b"abc").unwrap().unwrap();
        assert_eq!(g, vec![b"abc".to_vec()]);
        assert!(c.gather_bytes(1, b"x").is_err());
        assert!(c.reduce_i64(3, &mut [1], ReduceOp::Max).is_err());
    }

    #[test]
    fn layout_groups() {
        let l = ProcessLayout::new(5, 8, 4).unwrap();
        assert_eq!((l.n_groups(), l.group(), l.group_rank()), (2, 1, 1));
        assert!(ProcessLayout::new(0, 6, 4).is_err());
        assert!(ProcessLayout::new(6, 6, 3).is_err());
        assert_eq!(ReduceOp::Min.apply_f64(1.0, -2.0), -2.0);
        assert_eq!(ReduceOp::Max.apply_i64(1, -2), 1);
    }

    #[test]
    fn timers_round_trip_through_gather() {
        let mut t = crate::Timers::new();
        t.record("a|b", 1.5, 3);
        t.record("c", 0.25, 1);
        let stats = gather_timer_stats(&SerialComm, &t).unwrap().unwrap();
        assert_eq!(stats.len(), 2);
        assert_eq!((stats[0].name.as_str(), stats[0].max_calls), ("a|b", 3));
        assert_eq!(stats[1].median_time, 0.25);
        assert!(crate::Timers::decode(&t.encode()[..10]).is_err());
    }
}
