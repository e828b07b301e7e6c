/* prelude_hip.h -- the HIP (hiprtc) layer under kernels.h.
 *
 * Compile with `-ffp-contract=off` so that a*b+c is never fused (the CPU
 * reference rounds every operation); atomicAdd(double*) is native. */
#define TOAST_TARGET_HIP 1
#define KERNEL extern "C" __global__
#define GLOBAL
#define RESTRICT __restrict__
#define DEVICE_FN static __device__ __forceinline__

typedef long long i64;
typedef unsigned long long u64;
typedef int i32;
typedef unsigned char u8;

#define I64_MIN ((i64)(-9223372036854775807LL - 1LL))

/* +infinity as a double, from its bits (a division by zero would do, but
 * NVRTC warns of it). */
#define TOAST_INF_F64 __longlong_as_double(0x7ff0000000000000LL)

/* Global index along grid dimension 0 (sample), 1 (interval), 2 (detector). */
#define GID0 ((i64)blockIdx.x * (i64)blockDim.x + (i64)threadIdx.x)
#define GID1 ((i64)blockIdx.y * (i64)blockDim.y + (i64)threadIdx.y)
#define GID2 ((i64)blockIdx.z * (i64)blockDim.z + (i64)threadIdx.z)

/* Block-level cooperation (kernels that run one block per fit): the thread
 * index inside the block and the block size along dimension 0, the block
 * index along each dimension, an array shared by the threads of a block
 * (declared at the top level of a kernel), the address-space qualifier of a
 * pointer to one (SHARED), and the barrier that also makes the block's
 * global-memory writes visible to the block. */
#define LID0 ((i64)threadIdx.x)
#define LSIZE0 ((i64)blockDim.x)
#define GRP0 ((i64)blockIdx.x)
#define GRP1 ((i64)blockIdx.y)
#define GRP2 ((i64)blockIdx.z)
#define SHARED
#define BLOCK_SHARED(type, name, n) __shared__ type name[n]
#define BLOCK_BARRIER() __syncthreads()

DEVICE_FN void atomic_add_f64(double *p, double v) { atomicAdd(p, v); }

DEVICE_FN void atomic_min_u64(u64 *p, u64 v) { atomicMin(p, v); }

/* *p += v on a signed 64-bit integer (two's complement: the unsigned add). */
DEVICE_FN void atomic_add_i64(i64 *p, i64 v) { atomicAdd((u64 *)p, (u64)v); }
