//! [`MpiComm`]: the [`Comm`] of a run under `mpirun`, over MPI's world
//! communicator (rsmpi on the system MPI; only with the `mpi` feature).
//!
//! # Life cycle
//!
//! [`MpiComm::init`] calls `MPI_Init_thread` once per process and the
//! returned value owns rsmpi's `Universe`: dropping the [`MpiComm`] (the
//! last `Arc` of it) calls `MPI_Finalize`. `main` keeps the communicator in
//! a local of the subcommand's arm, so it is dropped, and MPI finalised, as
//! the arm ends, before `main` returns. A process that ends without
//! finalising (a leaked communicator, `std::process::exit` while it is
//! alive) makes `mpirun` report that the rank "exited improperly" and end
//! the job with a failure, so do not leak it. MPI cannot be initialised
//! again after `MPI_Finalize`: a second [`MpiComm::init`] fails.
//!
//! # Threads
//!
//! MPI is initialised with `MPI_THREAD_FUNNELED`: the process may have
//! other threads (rayon's pools), but only the thread that called
//! [`MpiComm::init`] (the main thread) makes MPI calls. [`Comm`] must be
//! `Send + Sync` because the communicator sits in the `ExecContext` that
//! operators share across threads, so instead of trusting every caller,
//! each collective checks the calling thread and returns a [`CommError`]
//! when it is not the initialising one. `MpiComm` holds no MPI handle of
//! its own (rsmpi's world communicator is a constant, fetched per call), so
//! it is `Send + Sync` without any `unsafe impl`; what keeps the MPI calls
//! on one thread is that check. [`Comm::abort`] off the main thread does not
//! call MPI either: it aborts the process (SIGABRT), which `mpirun` notices
//! and answers by ending the job.
//!
//! # Errors
//!
//! With MPI's default error handler (`MPI_ERRORS_ARE_FATAL`) a failing MPI
//! call aborts the job with the library's message, so the only
//! [`CommError`]s are the checks made here: root rank out of range, wrong
//! thread, byte strings beyond MPI's `int` counts, and reduction buffers whose
//! lengths differ between ranks (found with one extra small allreduce per
//! reduction, so that every rank returns the same error instead of some
//! hanging or reading past a buffer).

use mpi::collective::SystemOperation;
use mpi::datatype::PartitionMut;
use mpi::environment::{Threading, Universe};
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};
use mpi::Count;
use std::fmt;
use std::thread::ThreadId;
use toast_core::comm::check_root;
use toast_core::{Comm, CommError, ReduceOp};

/// Elements reduced per MPI call. MPI needs separate send and receive
/// buffers (rsmpi offers no `MPI_IN_PLACE`), so a reduction copies its
/// buffer; in pieces, the copy is at most 8 MiB however large the map
/// being reduced, and every count fits MPI's `int`.
const CHUNK: usize = 1 << 20;

/// MPI's world communicator as a [`Comm`] (see the module documentation
/// for its life cycle and threading rules).
pub struct MpiComm {
    /// Finalises MPI when dropped.
    universe: Universe,
    /// The thread that initialised MPI: the only one that may call it.
    thread: ThreadId,
    rank: usize,
    size: usize,
    /// First line of `MPI_Get_library_version`.
    library: String,
    /// The thread level the library granted.
    threading: Threading,
}

// The communicator is shared through `Arc<dyn Comm>` by operators that run
// on rayon threads; this fails to compile if rsmpi's `Universe` ever stops
// being `Send + Sync` (the trait needs both).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<MpiComm>();
};

impl fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("library", &self.library)
            .field("threading", &self.threading)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

impl MpiComm {
    /// Initialise MPI (`MPI_Init_thread`, asking for
    /// `MPI_THREAD_FUNNELED`) and take the world communicator. Started
    /// without `mpirun`, the process is a one-rank job (singleton mode).
    /// Fails when MPI was already initialised (or finalised) in this
    /// process.
    pub fn init() -> anyhow::Result<MpiComm> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Funneled)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "MPI is already initialised in this process (MpiComm::init is called once)"
                )
            })?;
        if threading == Threading::Single {
            // Strictly, MPI_THREAD_SINGLE allows no other threads at all
            // (rayon's pools exist, though they never call MPI). Libraries
            // in practice treat it as FUNNELED; say so and go on.
            tracing::warn!(
                "the MPI library grants only MPI_THREAD_SINGLE (FUNNELED was asked \
                 for); MPI is called from the main thread only"
            );
        }
        let world = universe.world();
        let rank = usize::try_from(world.rank()).map_err(|e| anyhow::anyhow!("MPI rank: {e}"))?;
        let size = usize::try_from(world.size()).map_err(|e| anyhow::anyhow!("MPI size: {e}"))?;
        let library = mpi::environment::library_version()
            .map(|v| first_line(&v))
            .unwrap_or_else(|_| "unknown MPI library".into());
        Ok(MpiComm {
            universe,
            thread: std::thread::current().id(),
            rank,
            size,
            library,
            threading,
        })
    }

    /// The world communicator, after checking that this is the thread
    /// allowed to call MPI.
    fn world(&self, op: &'static str) -> Result<SimpleCommunicator, CommError> {
        if std::thread::current().id() != self.thread {
            return Err(CommError::new(
                op,
                format!(
                    "called from thread {:?}, but MPI runs with MPI_THREAD_FUNNELED: only \
                     the thread that initialised it ({:?}) may make MPI calls",
                    std::thread::current().id(),
                    self.thread
                ),
            ));
        }
        Ok(self.universe.world())
    }

    /// Check that every rank passes a buffer of the same length to a
    /// reduction; every rank gets the same answer.
    fn agree_len(
        &self,
        world: &SimpleCommunicator,
        op: &'static str,
        len: usize,
    ) -> Result<(), CommError> {
        // i64 holds any buffer length.
        let mine = i64::try_from(len).unwrap_or(i64::MAX);
        let send = [mine, -mine];
        let mut recv = [0i64; 2];
        world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::max());
        let (max, min) = (recv[0], -recv[1]);
        if max != min {
            return Err(CommError::new(
                op,
                format!(
                    "buffer lengths differ between ranks (from {min} to {max}; this \
                     rank: {len})"
                ),
            ));
        }
        Ok(())
    }

    fn allreduce<T>(&self, buf: &mut [T], op: ReduceOp) -> Result<(), CommError>
    where
        T: mpi::datatype::Equivalence + Copy,
    {
        let world = self.world("allreduce")?;
        self.agree_len(&world, "allreduce", buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let mut send = Vec::with_capacity(buf.len().min(CHUNK));
        for piece in buf.chunks_mut(CHUNK) {
            send.clear();
            send.extend_from_slice(piece);
            world.all_reduce_into(&send[..], piece, system_op(op));
        }
        Ok(())
    }

    fn reduce<T>(&self, root: usize, buf: &mut [T], op: ReduceOp) -> Result<(), CommError>
    where
        T: mpi::datatype::Equivalence + Copy,
    {
        check_root("reduce", root, self.size)?;
        let world = self.world("reduce")?;
        self.agree_len(&world, "reduce", buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let root_process = world.process_at_rank(rank_of(root));
        if root != self.rank {
            for piece in buf.chunks(CHUNK) {
                root_process.reduce_into(piece, system_op(op));
            }
            return Ok(());
        }
        let mut send = Vec::with_capacity(buf.len().min(CHUNK));
        for piece in buf.chunks_mut(CHUNK) {
            send.clear();
            send.extend_from_slice(piece);
            root_process.reduce_into_root(&send[..], piece, system_op(op));
        }
        Ok(())
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn describe(&self) -> String {
        let ranks = if self.size == 1 { "rank" } else { "ranks" };
        format!("MPI ({}), {} {ranks}", self.library, self.size)
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.world("barrier")?.barrier();
        Ok(())
    }

    fn allreduce_f64(&self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.allreduce(buf, op)
    }

    fn allreduce_i64(&self, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError> {
        self.allreduce(buf, op)
    }

    fn reduce_f64(&self, root: usize, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.reduce(root, buf, op)
    }

    fn reduce_i64(&self, root: usize, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError> {
        self.reduce(root, buf, op)
    }

    fn gather_bytes(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>, CommError> {
        const OP: &str = "gather";
        check_root(OP, root, self.size)?;
        let world = self.world(OP)?;
        let root_process = world.process_at_rank(rank_of(root));
        // Lengths first (MPI_Gather of one int), then the bytes
        // (MPI_Gatherv). A length too large for an int is reported to
        // every rank through the gathered counts (as -1), so all ranks
        // fail together rather than some waiting in the Gatherv.
        let count: Count = Count::try_from(bytes.len()).unwrap_or(-1);
        let spare = [0u8; 1];
        let bytes = not_in_place(bytes, &spare);
        if root != self.rank {
            root_process.gather_into(&count);
            // The root broadcasts whether the counts were all valid, so
            // that every rank takes the same path.
            let mut ok = 0u8;
            root_process.broadcast_into(&mut ok);
            if ok == 0 {
                return Err(CommError::new(
                    OP,
                    "byte strings too long for MPI (over 2^31 - 1 bytes in all)",
                ));
            }
            root_process.gather_varcount_into(bytes);
            return Ok(None);
        }
        let mut counts: Vec<Count> = vec![0; self.size];
        root_process.gather_into_root(&count, &mut counts[..]);
        let mut displs: Vec<Count> = Vec::with_capacity(self.size);
        let mut total: Count = 0;
        let mut ok = 1u8;
        for &c in &counts {
            displs.push(total);
            match (c >= 0).then(|| total.checked_add(c)).flatten() {
                Some(t) => total = t,
                None => {
                    ok = 0;
                    break;
                }
            }
        }
        root_process.broadcast_into(&mut ok);
        if ok == 0 {
            return Err(CommError::new(
                OP,
                format!(
                    "byte strings too long for MPI (over 2^31 - 1 bytes in all; counts {counts:?})"
                ),
            ));
        }
        // At least one byte, so that the receive buffer is a real
        // allocation even when every string is empty (see `not_in_place`).
        let mut all = vec![0u8; (total as usize).max(1)];
        {
            let mut partition = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            root_process.gather_varcount_into_root(bytes, &mut partition);
        }
        let out = counts
            .iter()
            .zip(&displs)
            .map(|(&c, &d)| all[d as usize..(d + c) as usize].to_vec())
            .collect();
        Ok(Some(out))
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        const OP: &str = "broadcast";
        check_root(OP, root, self.size)?;
        let world = self.world(OP)?;
        let root_process = world.process_at_rank(rank_of(root));
        // Length first (u64, so that any length reaches every rank and all
        // fail together when it is too long), then the bytes.
        let mut len: u64 = if root == self.rank {
            buf.len() as u64
        } else {
            0
        };
        root_process.broadcast_into(&mut len);
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| Count::try_from(n).is_ok())
            .ok_or_else(|| {
                CommError::new(OP, format!("{len} bytes is too long for one MPI broadcast"))
            })?;
        if root != self.rank {
            buf.clear();
            buf.resize(len, 0);
        }
        if len > 0 {
            root_process.broadcast_into(&mut buf[..]);
        }
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        match self.world("abort") {
            // MPI_Abort on the world: mpirun ends every rank and prints
            // which one aborted, with `code`.
            Ok(world) => world.abort(code),
            Err(e) => {
                crate::errln!("toast-cli: rank {}: {e}; aborting this process", self.rank);
                std::process::abort()
            }
        }
    }
}

/// `bytes`, or when it is empty, an empty slice of `spare`.
///
/// An empty `&[u8]` may point at the dangling address 1 (the alignment of
/// `u8`), which is Open MPI's `MPI_IN_PLACE`: passed as a send or receive
/// buffer it would ask for an in-place operation (`MPI_Gatherv` fails with
/// `MPI_ERR_ARG` on the root). An empty slice of a real array points at
/// that array. Wider types dangle at their alignment (8 for `f64` and
/// `i64`), which is neither `MPI_IN_PLACE` nor `MPI_BOTTOM`, and empty
/// reductions and broadcasts make no MPI call anyway.
fn not_in_place<'a>(bytes: &'a [u8], spare: &'a [u8; 1]) -> &'a [u8] {
    if bytes.is_empty() {
        &spare[..0]
    } else {
        bytes
    }
}

/// The MPI operation of a [`ReduceOp`].
fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum => SystemOperation::sum(),
        ReduceOp::Min => SystemOperation::min(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

/// A rank checked by [`check_root`] (so below the world size, an `int`).
fn rank_of(root: usize) -> mpi::Rank {
    mpi::Rank::try_from(root).expect("a checked root rank fits an MPI int")
}

/// The first line of `s`, trimmed (MPICH's version string has several).
fn first_line(s: &str) -> String {
    s.trim_matches(|c: char| c == '\0' || c.is_whitespace())
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}
