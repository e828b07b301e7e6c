/* test_kernels.h -- kernels of toast-gpu-emu's own unit tests (not in any
 * module image): block-shared memory and barriers, written with the
 * portable macros of the preludes as kernels.h writes them.  The build
 * script compiles them after prelude_host.h and generates their launchers
 * into a table only the tests use. */

#define TOAST_TEST_BLOCK_MAX 256

/* out[i] = in of the thread mirrored in its block (block-shared array);
 * the barrier between the writes and the reads only when use_barrier != 0
 * (without it a thread reads a slot its mirror has not written yet). */
KERNEL void toast_test_block_reverse(i64 n, GLOBAL const double *RESTRICT in,
                                     GLOBAL double *RESTRICT out, i64 use_barrier) {
    BLOCK_SHARED(double, buf, TOAST_TEST_BLOCK_MAX);
    const i64 t = LID0;
    const i64 i = GRP0 * LSIZE0 + t;
    buf[t] = i < n ? in[i] : -1.0;
    if (use_barrier != 0) {
        BLOCK_BARRIER();
    }
    if (i < n) {
        out[i] = buf[LSIZE0 - 1 - t];
    }
}

/* The sum of a block's part of x into sums[block], by a tree over the
 * threads' values in block-shared memory (any block size up to the max);
 * the tree's levels are separated by barriers in a helper function, so the
 * build script must follow the call to see the barrier. */
DEVICE_FN void toast_test_tree(SHARED double *buf) {
    i64 h = 1;
    while (h < LSIZE0) {
        h *= 2;
    }
    for (h /= 2; h > 0; h /= 2) {
        const i64 t = LID0;
        if (t < h && t + h < LSIZE0) {
            buf[t] += buf[t + h];
        }
        BLOCK_BARRIER();
    }
}

KERNEL void toast_test_block_sum(i64 n, GLOBAL const double *RESTRICT x,
                                 GLOBAL double *RESTRICT sums) {
    BLOCK_SHARED(double, buf, TOAST_TEST_BLOCK_MAX);
    const i64 i = GRP0 * LSIZE0 + LID0;
    buf[LID0] = i < n ? x[i] : 0.0;
    BLOCK_BARRIER();
    toast_test_tree(buf);
    if (LID0 == 0) {
        sums[GRP0] = buf[0];
    }
}

/* A kernel bug: thread 0 of each block returns before the barrier the
 * others wait at. */
KERNEL void toast_test_block_diverge(GLOBAL double *RESTRICT out) {
    if (LID0 == 0) {
        return;
    }
    BLOCK_BARRIER();
    out[GRP0 * LSIZE0 + LID0] = 1.0;
}
