//! Block barriers on the host: each thread of a block on its own fiber.
//!
//! A kernel that reaches `BLOCK_BARRIER` (the build script follows the
//! calls of the preprocessed source: `Kernel::barrier`) cannot run its
//! threads one after another to completion, as the other kernels do: thread
//! 0 would wait at the barrier for threads that have not started. Here each
//! thread of the block runs on its own stack as a coroutine
//! ([`corosensei`]: stackful coroutines with a few-nanosecond switch, the
//! stacks reused from a pool), and the barrier suspends the calling thread.
//! The block runs in rounds: every live thread is resumed in thread order
//! until it reaches a barrier or returns; a round ends when each has done
//! so. Then the block's writes before the barrier (global or block-shared)
//! are all done before any thread goes past it, as on a device.
//!
//! Why fibers and not an OS thread per device thread or a rewrite of the
//! kernels into barrier-free phases: the kernels stay the text NVRTC,
//! hiprtc and OpenCL compile (no second form to keep in step), the threads
//! of a block stay on one host thread (so a block-shared array is a
//! thread-local one, `prelude_host.h`, and a run is deterministic), and a
//! switch costs nanoseconds rather than a futex wake-up. `corosensei` is
//! maintained (Wasmer's runtime uses it), small (no dependency but `libc`,
//! `cfg-if` and `scopeguard` on Linux), has guard-paged stacks, and lets a
//! coroutine suspend from any depth of its stack, C frames included (the
//! barrier is called from the C kernels; nothing unwinds through them).
//!
//! Divergence: every live thread of a block must reach the same barrier
//! count. A round in which some threads wait at a barrier while others have
//! returned is a kernel bug (OpenCL: undefined; CUDA: a hang or undefined);
//! the block is still run to completion (the waiting threads are released)
//! and the launch fails with a message naming the block.

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::{Mutex, Once};

use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult, Yielder};

/// A generated single-thread launcher: parameters, grid, block, linear
/// block index, thread index in the block (x fastest).
pub(crate) type Thread = unsafe extern "C" fn(*const *mut c_void, *const u32, *const u32, u64, u32);

/// Stack of one fiber: the kernels' frames are small (no large private
/// arrays), the host libm's needs are a few KiB.
const STACK_BYTES: usize = 256 << 10;
/// Stacks kept for reuse between launches.
const POOL_MAX: usize = 4096;

static STACKS: Mutex<Vec<DefaultStack>> = Mutex::new(Vec::new());

thread_local! {
    /// The yielder of the fiber running on this host thread.
    static CURRENT: Cell<*const Yielder<(), ()>> = const { Cell::new(std::ptr::null()) };
}

extern "C" {
    /// What `BLOCK_BARRIER` calls in the host build of the kernels
    /// (`prelude_host.h`): set once, to [`barrier`].
    static mut toast_emu_barrier: Option<unsafe extern "C" fn()>;
}

/// The barrier: suspend the running fiber; its block's scheduler resumes
/// it in the next round.
unsafe extern "C" fn barrier() {
    let y = CURRENT.with(Cell::get);
    if y.is_null() {
        // A kernel the build script did not see reach a barrier, run
        // without fibers: a bug of this crate, and there is no way to wait.
        eprintln!("toast-gpu-emu: BLOCK_BARRIER outside a fiber (a kernel not marked as one)");
        std::process::abort();
    }
    // SAFETY: `y` is the yielder of the fiber running now (set when it
    // started and after each resumption); it lives on that fiber's stack.
    unsafe { (*y).suspend(()) };
    CURRENT.with(|c| c.set(y));
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: written once, before any fiber kernel runs (every caller
        // passes through here first); the C side only reads it.
        unsafe { toast_emu_barrier = Some(barrier) };
    });
}

/// The launch parameters, moved into the fibers (all on this host thread).
#[derive(Clone, Copy)]
struct Raw(*const *mut c_void);

/// Run block `b` of a launch of `grid` x `block` with each thread on a
/// fiber; an error naming the block if its threads did not all reach the
/// same barriers.
///
/// # Safety
/// As for the launch: `params` holds the kernel's parameters, and `thread`
/// is the generated single-thread launcher of a kernel.
pub(crate) unsafe fn run_block(
    name: &str,
    thread: Thread,
    params: *const *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    b: u64,
) -> Result<(), String> {
    install();
    let n = block[0] * block[1] * block[2];
    let mut stacks: Vec<DefaultStack> = {
        let mut pool = STACKS.lock().unwrap_or_else(|e| e.into_inner());
        let keep = pool.len().saturating_sub(n as usize);
        pool.split_off(keep)
    };
    while stacks.len() < n as usize {
        stacks.push(
            DefaultStack::new(STACK_BYTES)
                .map_err(|e| format!("{name}: a fiber stack of {STACK_BYTES} bytes: {e}"))?,
        );
    }
    let p = Raw(params);
    let mut fibers: Vec<Coroutine<(), (), (), DefaultStack>> = stacks
        .into_iter()
        .zip(0..n)
        .map(|(stack, t)| {
            Coroutine::with_stack(stack, move |y: &Yielder<(), ()>, ()| {
                let p = p;
                CURRENT.with(|c| c.set(y as *const Yielder<(), ()>));
                // SAFETY: the caller's contract: the kernel's parameters
                // and its generated launcher; `grid` and `block` are
                // three-element arrays alive for the call.
                unsafe { thread(p.0, grid.as_ptr(), block.as_ptr(), b, t) }
            })
        })
        .collect();
    let mut diverged = None;
    let mut round = 0u64;
    loop {
        let mut waiting = 0u32;
        for f in fibers.iter_mut().filter(|f| !f.done()) {
            if let CoroutineResult::Yield(()) = f.resume(()) {
                waiting += 1;
            }
        }
        CURRENT.with(|c| c.set(std::ptr::null()));
        if waiting == 0 {
            break;
        }
        if waiting != n && diverged.is_none() {
            diverged = Some(format!(
                "{name}: block {b} of grid {grid:?}: at barrier {round}, {waiting} of its {n} \
                 threads waited while the others had returned (every thread of a block must \
                 reach the same barriers)"
            ));
        }
        round += 1;
    }
    let mut pool = STACKS.lock().unwrap_or_else(|e| e.into_inner());
    for f in fibers {
        if pool.len() < POOL_MAX {
            pool.push(f.into_stack());
        }
    }
    diverged.map_or(Ok(()), Err)
}
