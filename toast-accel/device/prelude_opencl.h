/* prelude_opencl.h -- the OpenCL C (1.2 and 3.0) layer under kernels.h.
 *
 * Needs cl_khr_fp64, and cl_khr_int64_base_atomics for the two atomic
 * helpers (build_noise_weighted and the data-dependent error buffer) and
 * atomic_add_i64 (cov_accum_diag_hits).
 * FP contraction is off so that a*b+c is never fused (the CPU reference
 * rounds every operation). */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#pragma OPENCL FP_CONTRACT OFF

#define TOAST_TARGET_OPENCL 1
#define KERNEL __kernel
#define GLOBAL __global
#define RESTRICT restrict
#define DEVICE_FN static inline

typedef long i64;
typedef ulong u64;
typedef int i32;
typedef uchar u8;

#define I64_MIN ((i64)(-9223372036854775807L - 1L))

/* +infinity as a double, from its bits (a division by zero would do, but
 * NVRTC warns of it). */
#define TOAST_INF_F64 as_double(0x7ff0000000000000L)

/* Global index along grid dimension 0 (sample), 1 (interval), 2 (detector). */
#define GID0 ((i64)get_global_id(0))
#define GID1 ((i64)get_global_id(1))
#define GID2 ((i64)get_global_id(2))

/* Block-level cooperation (kernels that run one work-group per fit): the
 * work-item index inside the group and the group size along dimension 0,
 * the group index along each dimension, an array shared by the work-items
 * of a group (__local, declared at the top level of a kernel), the
 * address-space qualifier of a pointer to one (SHARED), and the barrier,
 * fencing both local and global memory (the group's workspace). */
#define LID0 ((i64)get_local_id(0))
#define LSIZE0 ((i64)get_local_size(0))
#define GRP0 ((i64)get_group_id(0))
#define GRP1 ((i64)get_group_id(1))
#define GRP2 ((i64)get_group_id(2))
#define SHARED __local
#define BLOCK_SHARED(type, name, n) __local type name[n]
#define BLOCK_BARRIER() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)

/* *p += v, atomically: a compare-and-swap loop on the 64-bit pattern. */
DEVICE_FN void atomic_add_f64(GLOBAL double *p, double v) {
    volatile GLOBAL ulong *ip = (volatile GLOBAL ulong *)p;
    ulong old = *ip;
    ulong assumed;
    do {
        assumed = old;
        old = atom_cmpxchg(ip, assumed, as_ulong(as_double(assumed) + v));
    } while (old != assumed);
}

/* *p += v on a signed 64-bit integer (cl_khr_int64_base_atomics). */
DEVICE_FN void atomic_add_i64(GLOBAL i64 *p, i64 v) { atom_add((volatile GLOBAL long *)p, v); }

/* *p = min(*p, v), atomically (unsigned). */
DEVICE_FN void atomic_min_u64(GLOBAL u64 *p, u64 v) {
    volatile GLOBAL ulong *ip = (volatile GLOBAL ulong *)p;
    ulong old = *ip;
    while (v < old) {
        ulong seen = atom_cmpxchg(ip, old, v);
        if (seen == old) {
            break;
        }
        old = seen;
    }
}
