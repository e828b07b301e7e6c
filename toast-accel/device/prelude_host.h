/* prelude_host.h -- the host layer under kernels.h, for the emulated CUDA
 * and HIP drivers (toast-gpu-emu), which run the device kernels on the CPU.
 *
 * Compile as C11 with `-ffp-contract=off` (and no -ffast-math) so that a*b+c
 * is never fused and the arithmetic rounds as the CPU reference does; the
 * math functions are the host's libm (glibc), as the CPU backend's are.
 *
 * The grid indices are thread-local: the emulator's launch loop stores the
 * global index of the thread being executed in toast_host_gid[0..2] before
 * calling the kernel.  The atomics are real (GCC/Clang __atomic builtins),
 * so the kernels stay correct if the loop is ever run on several threads.
 *
 * TOAST_HOST_KERNEL is what KERNEL expands to; the emulator's build script
 * redefines it to a marker when it preprocesses this file to find the
 * kernels' signatures. */
#define TOAST_TARGET_HOST 1
#ifndef TOAST_HOST_KERNEL
#define TOAST_HOST_KERNEL static
#endif
#define KERNEL TOAST_HOST_KERNEL
#define GLOBAL
#define RESTRICT restrict
#define DEVICE_FN static inline

#include <math.h>
#include <stdint.h>

typedef int64_t i64;
typedef uint64_t u64;
typedef int32_t i32;
typedef uint8_t u8;

#define I64_MIN ((i64)(-9223372036854775807LL - 1LL))

/* +infinity as a double, from its bits (a division by zero would do, but
 * NVRTC warns of it). */
#define TOAST_INF_F64 ((double)INFINITY)

/* Global index of the thread being run, along grid dimension 0 (sample),
 * 1 (interval), 2 (detector): block index * block size + thread index,
 * set by the emulator's launch loop. */
extern _Thread_local i64 toast_host_gid[3];
#define GID0 (toast_host_gid[0])
#define GID1 (toast_host_gid[1])
#define GID2 (toast_host_gid[2])

/* Block-level cooperation.  toast_host_block holds the thread index inside
 * its block along dimension 0, the block size along dimension 0 and the
 * block index along dimensions 0, 1, 2, set by the launch loop with the
 * grid indices.  A kernel that calls BLOCK_BARRIER (directly or through a
 * function; the emulator's build script follows the calls) runs each thread
 * of a block on its own fiber (toast-gpu-emu's kernels::fibers): the barrier
 * suspends the thread until every thread of the block has reached it.  All
 * the fibers of a block run on one host thread, so an array shared by the
 * block is a static thread-local array (one per host thread, which runs one
 * block at a time).  The empty asm statements with a memory clobber keep
 * the compiler from carrying a shared value across the barrier in a
 * register; the thread's indices are saved and restored around it, since
 * the other threads of the block overwrite them while it waits. */
extern _Thread_local i64 toast_host_block[5];
#define LID0 (toast_host_block[0])
#define LSIZE0 (toast_host_block[1])
#define GRP0 (toast_host_block[2])
#define GRP1 (toast_host_block[3])
#define GRP2 (toast_host_block[4])
#define SHARED
#define BLOCK_SHARED(type, name, n) static _Thread_local type name[n]

/* Suspends the calling thread's fiber until its block's other threads have
 * reached a barrier too: set by toast-gpu-emu (Rust) before the first
 * launch of such a kernel. */
extern void (*toast_emu_barrier)(void);

DEVICE_FN void toast_host_barrier(void) {
    i64 gid[3];
    i64 blk[5];
    __builtin_memcpy(gid, toast_host_gid, sizeof gid);
    __builtin_memcpy(blk, toast_host_block, sizeof blk);
    __asm__ __volatile__("" ::: "memory");
    toast_emu_barrier();
    __asm__ __volatile__("" ::: "memory");
    __builtin_memcpy(toast_host_gid, gid, sizeof gid);
    __builtin_memcpy(toast_host_block, blk, sizeof blk);
}
#define BLOCK_BARRIER() toast_host_barrier()

/* *p += v, atomically: a compare-and-swap loop on the 64-bit pattern. */
DEVICE_FN void atomic_add_f64(double *p, double v) {
    u64 *ip = (u64 *)p;
    u64 old = __atomic_load_n(ip, __ATOMIC_RELAXED);
    for (;;) {
        double cur;
        __builtin_memcpy(&cur, &old, sizeof cur);
        double sum = cur + v;
        u64 next;
        __builtin_memcpy(&next, &sum, sizeof next);
        if (__atomic_compare_exchange_n(ip, &old, next, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return;
        }
    }
}

/* *p += v on a signed 64-bit integer (cov_accum_diag_hits). */
DEVICE_FN void atomic_add_i64(i64 *p, i64 v) { __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

/* *p = min(*p, v), atomically (unsigned). */
DEVICE_FN void atomic_min_u64(u64 *p, u64 v) {
    u64 old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v < old) {
        if (__atomic_compare_exchange_n(p, &old, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            return;
        }
    }
}
