/*
 * toast_test_plugin.c -- a third-party toast-rs backend plugin in plain C99,
 * written from toast-accel/include/toast_backend.h alone.
 *
 * It proves that the ABI can be implemented without Rust: it exports the
 * entry symbol, answers init/last_error/device_count/device_info, manages
 * memory with malloc behind a small table of opaque handles, and implements
 * two kernels (noise_weight and stokes_weights_I); every other kernel entry
 * is NULL, so the host dispatches those elsewhere.
 *
 * The test suite (tests/tests/c_plugin.rs) compiles variants of this file:
 *   TOAST_TEST_NAME="x"         backend name (default "ctest")
 *   TOAST_TEST_NO_NOISE_WEIGHT  leave the noise_weight entry NULL
 *   TOAST_TEST_UNAVAILABLE      init fails with TOAST_ERR_UNAVAILABLE
 *   TOAST_TEST_DEVICE_MEMORY    not host-addressable: kernel arrays are
 *                               handles from alloc, not host addresses
 *   TOAST_TEST_BAD_MAGIC        header with a wrong magic number
 *   TOAST_TEST_BAD_MAJOR        header claiming ABI major 2
 *   TOAST_TEST_NO_ENTRY         export the entry under another name
 * and hostile ones, which the host must bound or refuse:
 *   TOAST_TEST_DEVICE_COUNT=n   device_count answers n
 *   TOAST_TEST_FULL_DEVICE_NAME device_info fills all of `name`, no NUL
 *   TOAST_TEST_UNTERMINATED_NAME  the header name has no NUL in 8 KiB
 *   TOAST_TEST_UNTERMINATED_ERROR last_error returns 8 KiB with no NUL
 *   TOAST_TEST_LONG_NAME        a 100-character backend name
 *   TOAST_TEST_TABLE_SIZE=n     the header claims a table of n bytes
 *   TOAST_TEST_ABI_MINOR_3      built against ABI minor 3: the header says minor 3
 *                               and its table ends before the fused kernels of
 *                               minor 4 (compact_expand_pointing, ...)
 *
 * Needs a C99 compiler with the GCC/Clang `__thread` and `__sync` builtins
 * (thread-local last error, a spin lock around the handle table).
 */
#include "toast_backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TOAST_TEST_NAME
#define TOAST_TEST_NAME "ctest"
#endif

#if defined(_WIN32)
#define TT_EXPORT __declspec(dllexport)
#else
#define TT_EXPORT __attribute__((visibility("default")))
#endif

typedef unsigned long long ull;

/* ---- last error (per thread) ------------------------------------------- */

static __thread char last_error_buf[512];

static toast_status fail(toast_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error_buf, sizeof last_error_buf, fmt, ap);
    va_end(ap);
    return status;
}

static toast_status ok(void) {
    last_error_buf[0] = '\0';
    return TOAST_OK;
}

#ifdef TOAST_TEST_UNTERMINATED_ERROR
/* 8 KiB of 'e' and no NUL: the host must stop reading at its limit. */
static char unterminated_error[8192];
static const char *tt_last_error(void) {
    memset(unterminated_error, 'e', sizeof unterminated_error);
    return unterminated_error;
}
#else
static const char *tt_last_error(void) { return last_error_buf; }
#endif

/* ---- context and logging ----------------------------------------------- */

typedef struct tt_ctx {
    toast_log_fn log;
    void *log_user;
    uint32_t host_minor; /* the host's ABI minor: device_info writes its struct only */
} tt_ctx;

static void tt_log(const tt_ctx *c, int32_t level, const char *fmt, ...) {
    char buf[256];
    va_list ap;
    int n;
    if (c == NULL || c->log == NULL) {
        return;
    }
    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) {
        return;
    }
    if ((size_t)n >= sizeof buf) {
        n = (int)sizeof buf - 1;
    }
    c->log(c->log_user, level, buf, (size_t)n);
}

static toast_status tt_init(const toast_host_api *host, void **ctx) {
    tt_ctx *c;
    uint32_t abi_minor = 0;
    const char *options = "";
    if (ctx == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "init: null ctx out pointer");
    }
    *ctx = NULL;
    c = (tt_ctx *)calloc(1, sizeof *c);
    if (c == NULL) {
        return fail(TOAST_ERR_OUT_OF_MEMORY, "init: cannot allocate the context");
    }
    /* Read only the fields that fit in the host's struct. */
    if (host != NULL && host->size >= sizeof(toast_host_api)) {
        c->log = host->log;
        c->log_user = host->log_user;
        abi_minor = host->abi_minor;
        c->host_minor = abi_minor;
        options = host->options != NULL ? host->options : "";
    }
#ifdef TOAST_TEST_UNAVAILABLE
    tt_log(c, TOAST_LOG_DEBUG, "%s: host ABI minor %u, options \"%s\": no test device",
           TOAST_TEST_NAME, (unsigned)abi_minor, options);
    free(c);
    return fail(TOAST_ERR_UNAVAILABLE,
                "%s: no test device (this build defines TOAST_TEST_UNAVAILABLE)", TOAST_TEST_NAME);
#else
    tt_log(c, TOAST_LOG_INFO, "%s initialised (host ABI minor %u, options \"%s\")",
           TOAST_TEST_NAME, (unsigned)abi_minor, options);
    *ctx = c;
    return ok();
#endif
}

static void tt_shutdown(void *ctx) { free(ctx); }

/* ---- devices ------------------------------------------------------------ */

static toast_status tt_device_count(void *ctx, uint32_t *count) {
    (void)ctx;
    if (count == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "device_count: null count pointer");
    }
#ifdef TOAST_TEST_DEVICE_COUNT
    *count = (uint32_t)(TOAST_TEST_DEVICE_COUNT);
#else
    *count = 1;
#endif
    return ok();
}

/* Bytes of the live buffers (below), and the most they reached since the
 * library was loaded (one count for all its contexts, as its handle table
 * is), under the table's lock: device_info's peak_held_mib. */
static uint64_t live_bytes, peak_bytes;
static void lock_table(void);
static void unlock_table(void);

static toast_status tt_device_info(void *ctx, uint32_t index, toast_device_info *info) {
    const tt_ctx *c = (const tt_ctx *)ctx;
    if (c == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "device_info: null context");
    }
    if (info == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "device_info: null info pointer");
    }
    if (index != 0) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "device_info: index %u, but there is 1 device",
                    (unsigned)index);
    }
    /* The host's struct, as large as its minor says (ABI minor 9 grew it);
     * the minor-3 build knows only its own, smaller struct. */
#ifdef TOAST_TEST_ABI_MINOR_3
    memset(info, 0, offsetof(toast_device_info, memory_kind));
#else
    memset(info, 0, TOAST_DEVICE_INFO_SIZE(c->host_minor));
    if (c->host_minor >= 9u) {
        info->memory_kind = TOAST_DEVICE_MEMORY_HOST; /* malloc'd buffers */
    }
#endif
#ifdef TOAST_TEST_FULL_DEVICE_NAME
    memset(info->name, 'd', sizeof info->name);
#else
    snprintf(info->name, sizeof info->name, "%s test device (host memory)", TOAST_TEST_NAME);
#endif
    info->total_memory = 1ULL << 30; /* nominal */
    info->free_memory = 1ULL << 30;
    info->compute_units = 1;
    /* Written by the minor-3 build too, where the field was `reserved`:
     * the host reads it only from a plugin of minor 7 or later. */
    lock_table();
    info->peak_held_mib = (uint32_t)((peak_bytes + (1u << 20) - 1u) >> 20);
    unlock_table();
    return ok();
}

/* ---- memory: malloc behind a table of handles ---------------------------
 * handle = TAG << 48 | generation << 32 | slot.  A foreign handle (wrong
 * tag), a slot out of range, an unused slot or a stale generation (a freed
 * handle) is refused with TOAST_ERR_INVALID_HANDLE. */

#define TT_SLOTS 1024u
#define TT_TAG 0x7E57ULL

typedef struct tt_slot {
    unsigned char *ptr;
    uint64_t bytes;
    uint32_t gen;
    int used;
} tt_slot;

static tt_slot slots[TT_SLOTS];
static volatile int table_lock;

static void lock_table(void) {
    while (__sync_lock_test_and_set(&table_lock, 1)) {
    }
}

static void unlock_table(void) { __sync_lock_release(&table_lock); }

static uint64_t make_handle(uint32_t slot, uint32_t gen) {
    return (TT_TAG << 48) | ((uint64_t)(gen & 0xFFFFu) << 32) | (uint64_t)slot;
}

/* Under the lock: the slot of a live handle, or NULL. */
static tt_slot *find_slot(uint64_t handle) {
    uint32_t slot = (uint32_t)(handle & 0xFFFFFFFFu);
    uint32_t gen = (uint32_t)((handle >> 32) & 0xFFFFu);
    if ((handle >> 48) != TT_TAG || slot >= TT_SLOTS || !slots[slot].used ||
        (slots[slot].gen & 0xFFFFu) != gen) {
        return NULL;
    }
    return &slots[slot];
}

/* The memory of a live handle and its size; 0 if the handle is not live. */
static int lookup(uint64_t handle, unsigned char **ptr, uint64_t *bytes) {
    tt_slot *s;
    int found = 0;
    lock_table();
    s = find_slot(handle);
    if (s != NULL) {
        *ptr = s->ptr;
        *bytes = s->bytes;
        found = 1;
    }
    unlock_table();
    return found;
}

static toast_status tt_alloc(void *ctx, uint64_t bytes, const char *name, uint64_t *handle) {
    unsigned char *p;
    uint32_t i;
    (void)ctx;
    if (name == NULL) {
        name = "(unnamed)";
    }
    if (handle == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "alloc `%s`: null handle pointer", name);
    }
    if (bytes > (uint64_t)(size_t)-1) {
        return fail(TOAST_ERR_OUT_OF_MEMORY, "alloc `%s`: %llu bytes do not fit in memory", name,
                    (ull)bytes);
    }
    p = (unsigned char *)malloc(bytes > 0 ? (size_t)bytes : 1u);
    if (p == NULL) {
        return fail(TOAST_ERR_OUT_OF_MEMORY, "alloc `%s`: malloc of %llu bytes failed", name,
                    (ull)bytes);
    }
    lock_table();
    for (i = 0; i < TT_SLOTS; i++) {
        if (!slots[i].used) {
            slots[i].used = 1;
            slots[i].ptr = p;
            slots[i].bytes = bytes;
            slots[i].gen++;
            live_bytes += bytes;
            if (live_bytes > peak_bytes) {
                peak_bytes = live_bytes;
            }
            *handle = make_handle(i, slots[i].gen);
            unlock_table();
            return ok();
        }
    }
    unlock_table();
    free(p);
    return fail(TOAST_ERR_OUT_OF_MEMORY, "alloc `%s`: all %u handles are in use", name,
                (unsigned)TT_SLOTS);
}

static toast_status tt_free(void *ctx, uint64_t handle) {
    tt_slot *s;
    unsigned char *p;
    (void)ctx;
    lock_table();
    s = find_slot(handle);
    if (s == NULL) {
        unlock_table();
        return fail(TOAST_ERR_INVALID_HANDLE, "free: 0x%016llx is not a live buffer of %s",
                    (ull)handle, TOAST_TEST_NAME);
    }
    p = s->ptr;
    live_bytes -= s->bytes;
    s->used = 0;
    s->ptr = NULL;
    s->bytes = 0;
    unlock_table();
    free(p);
    return ok();
}

/* The memory [offset, offset+bytes) of a live handle. */
static toast_status range(const char *op, uint64_t handle, uint64_t offset, uint64_t bytes,
                          unsigned char **out) {
    unsigned char *p;
    uint64_t size;
    if (!lookup(handle, &p, &size)) {
        return fail(TOAST_ERR_INVALID_HANDLE, "%s: 0x%016llx is not a live buffer of %s", op,
                    (ull)handle, TOAST_TEST_NAME);
    }
    if (offset > size || bytes > size - offset) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: bytes [%llu, %llu + %llu) lie outside the buffer of %llu bytes", op,
                    (ull)offset, (ull)offset, (ull)bytes, (ull)size);
    }
    *out = p + offset;
    return TOAST_OK;
}

static toast_status tt_copy_to_device(void *ctx, uint64_t handle, uint64_t offset_bytes,
                                      const void *src, uint64_t bytes) {
    unsigned char *dst;
    toast_status s;
    (void)ctx;
    if (src == NULL && bytes > 0) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "copy_to_device: null source");
    }
    s = range("copy_to_device", handle, offset_bytes, bytes, &dst);
    if (s != TOAST_OK) {
        return s;
    }
    if (bytes > 0) {
        memcpy(dst, src, (size_t)bytes);
    }
    return ok();
}

static toast_status tt_copy_to_host(void *ctx, uint64_t handle, uint64_t offset_bytes, void *dst,
                                    uint64_t bytes) {
    unsigned char *src;
    toast_status s;
    (void)ctx;
    if (dst == NULL && bytes > 0) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "copy_to_host: null destination");
    }
    s = range("copy_to_host", handle, offset_bytes, bytes, &src);
    if (s != TOAST_OK) {
        return s;
    }
    if (bytes > 0) {
        memcpy(dst, src, (size_t)bytes);
    }
    return ok();
}

static toast_status tt_reset(void *ctx, uint64_t handle, uint64_t offset_bytes, uint64_t bytes) {
    unsigned char *p;
    toast_status s;
    (void)ctx;
    s = range("reset", handle, offset_bytes, bytes, &p);
    if (s != TOAST_OK) {
        return s;
    }
    if (bytes > 0) {
        memset(p, 0, (size_t)bytes);
    }
    return ok();
}

static toast_status tt_synchronize(void *ctx) {
    (void)ctx;
    return ok();
}

/* ---- kernel helpers ----------------------------------------------------- */

/* The memory of a kernel array of `len` elements of `elem` bytes. */
static toast_status array_ptr(const char *kernel, const char *arg, toast_array a, uint64_t elem,
                              void **out) {
#ifdef TOAST_TEST_DEVICE_MEMORY
    unsigned char *p;
    uint64_t size;
    if (!lookup(a.ptr, &p, &size)) {
        return fail(TOAST_ERR_INVALID_HANDLE,
                    "%s: argument `%s`: 0x%016llx is not a live buffer of %s", kernel, arg,
                    (ull)a.ptr, TOAST_TEST_NAME);
    }
    if (a.len > size / elem) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: argument `%s`: %llu elements do not fit in its buffer of %llu bytes",
                    kernel, arg, (ull)a.len, (ull)size);
    }
    *out = p;
#else
    (void)elem;
    if (a.ptr == 0) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "%s: argument `%s`: null pointer with length %llu",
                    kernel, arg, (ull)a.len);
    }
    *out = (void *)(uintptr_t)a.ptr;
#endif
    return TOAST_OK;
}

/* Rows of an [n_rows, n_samp] array of `len` elements. */
static toast_status rows_of(const char *kernel, const char *arg, uint64_t len, uint64_t n_samp,
                            uint64_t *n_rows) {
    if (n_samp == 0) {
        if (len != 0) {
            return fail(TOAST_ERR_INVALID_ARGUMENT,
                        "%s: argument `%s`: length %llu with n_samp = 0", kernel, arg, (ull)len);
        }
        *n_rows = 0;
        return TOAST_OK;
    }
    if (len % n_samp != 0) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: argument `%s`: length %llu is not a whole number of rows of n_samp = %llu",
                    kernel, arg, (ull)len, (ull)n_samp);
    }
    *n_rows = len / n_samp;
    return TOAST_OK;
}

static toast_status check_intervals(const char *kernel, toast_intervals iv, uint64_t n_samp) {
    uint64_t i;
    if (iv.len > 0 && iv.ptr == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: argument `intervals`: null pointer with length %llu", kernel, (ull)iv.len);
    }
    for (i = 0; i < iv.len; i++) {
        int64_t first = iv.ptr[i].first, last = iv.ptr[i].last;
        if (first < 0 || last < first || (uint64_t)last > n_samp) {
            return fail(TOAST_ERR_INVALID_ARGUMENT,
                        "%s: argument `intervals`: interval %llu is [%lld, %lld), not a range "
                        "inside [0, n_samp = %llu)",
                        kernel, (ull)i, (long long)first, (long long)last, (ull)n_samp);
        }
    }
    return TOAST_OK;
}

static toast_status check_index(const char *kernel, const char *arg, const int32_t *index,
                                uint64_t n_det, uint64_t n_rows) {
    uint64_t i;
    for (i = 0; i < n_det; i++) {
        if (index[i] < 0 || (uint64_t)index[i] >= n_rows) {
            return fail(TOAST_ERR_INVALID_ARGUMENT,
                        "%s: argument `%s`: %s[%llu] = %d is not a row of an array with %llu rows",
                        kernel, arg, arg, (ull)i, (int)index[i], (ull)n_rows);
        }
    }
    return TOAST_OK;
}

#define TT_TRY(expr)                                                                             \
    do {                                                                                         \
        toast_status tt_s_ = (expr);                                                             \
        if (tt_s_ != TOAST_OK) {                                                                 \
            return tt_s_;                                                                        \
        }                                                                                        \
    } while (0)

/* ---- kernels ------------------------------------------------------------ */

#ifndef TOAST_TEST_NO_NOISE_WEIGHT
/* det_data[data_index[i], s] *= detector_weights[i] over the intervals. */
static toast_status tt_noise_weight(void *ctx, const toast_noise_weight_args *a) {
    static const char K[] = "noise_weight";
    uint64_t n_rows = 0, i, v;
    void *mem = NULL;
    double *det;
    (void)ctx;
    if (a == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "%s: null argument struct", K);
    }
    if (a->n_det > 0 && (a->data_index == NULL || a->detector_weights == NULL)) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: argument `data_index` or `detector_weights`: null with n_det = %llu", K,
                    (ull)a->n_det);
    }
    TT_TRY(rows_of(K, "det_data", a->det_data.len, a->n_samp, &n_rows));
    TT_TRY(check_intervals(K, a->intervals, a->n_samp));
    TT_TRY(check_index(K, "data_index", a->data_index, a->n_det, n_rows));
    if (a->n_det == 0 || a->det_data.len == 0) {
        return ok();
    }
    TT_TRY(array_ptr(K, "det_data", a->det_data, sizeof(double), &mem));
    det = (double *)mem;
    for (i = 0; i < a->n_det; i++) {
        double w = a->detector_weights[i];
        double *row = det + (uint64_t)a->data_index[i] * a->n_samp;
        for (v = 0; v < a->intervals.len; v++) {
            int64_t s;
            for (s = a->intervals.ptr[v].first; s < a->intervals.ptr[v].last; s++) {
                row[s] *= w;
            }
        }
    }
    return ok();
}
#endif

/* weights[weight_index[i], s] = cal[i] over the intervals. */
static toast_status tt_stokes_weights_i(void *ctx, const toast_stokes_weights_i_args *a) {
    static const char K[] = "stokes_weights_I";
    uint64_t n_rows = 0, i, v;
    void *mem = NULL;
    double *weights;
    (void)ctx;
    if (a == NULL) {
        return fail(TOAST_ERR_INVALID_ARGUMENT, "%s: null argument struct", K);
    }
    if (a->n_det > 0 && (a->weight_index == NULL || a->cal == NULL)) {
        return fail(TOAST_ERR_INVALID_ARGUMENT,
                    "%s: argument `weight_index` or `cal`: null with n_det = %llu", K,
                    (ull)a->n_det);
    }
    TT_TRY(rows_of(K, "weights", a->weights.len, a->n_samp, &n_rows));
    TT_TRY(check_intervals(K, a->intervals, a->n_samp));
    TT_TRY(check_index(K, "weight_index", a->weight_index, a->n_det, n_rows));
    if (a->n_det == 0 || a->weights.len == 0) {
        return ok();
    }
    TT_TRY(array_ptr(K, "weights", a->weights, sizeof(double), &mem));
    weights = (double *)mem;
    for (i = 0; i < a->n_det; i++) {
        double *row = weights + (uint64_t)a->weight_index[i] * a->n_samp;
        for (v = 0; v < a->intervals.len; v++) {
            int64_t s;
            for (s = a->intervals.ptr[v].first; s < a->intervals.ptr[v].last; s++) {
                row[s] = a->cal[i];
            }
        }
    }
    return ok();
}

/* ---- the table and the header ------------------------------------------- */

static const toast_backend_table tt_table = {
    .init = tt_init,
    .shutdown = tt_shutdown,
    .last_error = tt_last_error,
    .device_count = tt_device_count,
    .device_info = tt_device_info,
    .alloc = tt_alloc,
    .free = tt_free,
    .copy_to_device = tt_copy_to_device,
    .copy_to_host = tt_copy_to_host,
    .reset = tt_reset,
    .synchronize = tt_synchronize,
    .stokes_weights_i = tt_stokes_weights_i,
#ifndef TOAST_TEST_NO_NOISE_WEIGHT
    .noise_weight = tt_noise_weight,
#endif
    /* every other kernel entry is NULL: not supported */
};

#ifdef TOAST_TEST_BAD_MAGIC
#define TT_MAGIC 0x0123456789ABCDEFULL
#else
#define TT_MAGIC TOAST_BACKEND_MAGIC
#endif

#ifdef TOAST_TEST_BAD_MAJOR
#define TT_MAJOR 2u
#else
#define TT_MAJOR TOAST_BACKEND_ABI_MAJOR
#endif

#ifdef TOAST_TEST_DEVICE_MEMORY
#define TT_FLAGS 0u
#else
#define TT_FLAGS TOAST_BACKEND_FLAG_HOST_ADDRESSABLE
#endif

#if defined(TOAST_TEST_TABLE_SIZE)
#define TT_TABLE_SIZE ((uint32_t)(TOAST_TEST_TABLE_SIZE))
#elif defined(TOAST_TEST_ABI_MINOR_3)
#define TT_TABLE_SIZE ((uint32_t)offsetof(toast_backend_table, compact_expand_pointing))
#else
#define TT_TABLE_SIZE ((uint32_t)sizeof(toast_backend_table))
#endif

#if defined(TOAST_TEST_UNTERMINATED_NAME)
/* Filled with 'n' by the entry function: 8 KiB and no NUL. */
static char tt_name[8192];
#define TT_NAME tt_name
#elif defined(TOAST_TEST_LONG_NAME)
#define TT_NAME                                                                                  \
    "a123456789b123456789c123456789d123456789e123456789f123456789g123456789h123456789"         \
    "i123456789j123456789"
#else
#define TT_NAME TOAST_TEST_NAME
#endif

static const toast_backend_header tt_header = {
    .magic = TT_MAGIC,
    .abi_major = TT_MAJOR,
#ifdef TOAST_TEST_ABI_MINOR_3
    .abi_minor = 3u,
#else
    .abi_minor = TOAST_BACKEND_ABI_MINOR,
#endif
    .table_size = TT_TABLE_SIZE,
    .flags = TT_FLAGS,
    .name = TT_NAME,
    .version = "1.2.3",
    .description = "plain C test plugin (noise_weight, stokes_weights_I)",
    .table = &tt_table,
};

#ifdef TOAST_TEST_NO_ENTRY
#define TT_ENTRY toast_backend_entry_misspelt
#else
#define TT_ENTRY toast_backend_entry
#endif

TT_EXPORT const toast_backend_header *TT_ENTRY(void);

TT_EXPORT const toast_backend_header *TT_ENTRY(void) {
#ifdef TOAST_TEST_UNTERMINATED_NAME
    memset(tt_name, 'n', sizeof tt_name);
#endif
    return &tt_header;
}
