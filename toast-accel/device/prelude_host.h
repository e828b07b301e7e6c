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

/* Global index of the thread being run, along grid dimension 0 (sample),
 * 1 (interval), 2 (detector): block index * block size + thread index,
 * set by the emulator's launch loop. */
extern _Thread_local i64 toast_host_gid[3];
#define GID0 (toast_host_gid[0])
#define GID1 (toast_host_gid[1])
#define GID2 (toast_host_gid[2])

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
