/*
 * toast_backend.h -- the backend plugin ABI of toast-rs.
 *
 * A backend plugin is a shared library that exports one symbol,
 *
 *     const toast_backend_header *toast_backend_entry(void);
 *
 * returning a pointer to a static, versioned header followed by a function
 * table.  The host:
 *   - refuses the plugin if `magic` is not TOAST_BACKEND_MAGIC, or if
 *     `abi_major` differs from its own TOAST_BACKEND_ABI_MAJOR;
 *   - reads min(header->table_size, sizeof(toast_backend_table)) bytes of the
 *     table, so tables only ever grow at the end (minor versions);
 *   - treats a NULL kernel entry as "this backend does not implement that
 *     kernel" and dispatches the call to a fallback backend.
 *
 * Rules for everything that crosses the boundary:
 *   - only C types: fixed-width integers, doubles, pointers with lengths and
 *     the structs below; no exceptions or Rust panics may unwind out of a call;
 *   - every function returns a toast_status; on failure the plugin keeps a
 *     message for the calling thread that `last_error` returns (it names the
 *     offending argument, detector or sample where there is one);
 *   - device buffers are opaque 64-bit handles created by the plugin's
 *     `alloc` and owned by it; a handle from another plugin, or one already
 *     freed, must be refused with TOAST_ERR_INVALID_HANDLE, never crash;
 *   - plugins are never unloaded;
 *   - a context's entry points may be called from any thread, also
 *     concurrently, except `shutdown`, which must not run beside any call
 *     on that context nor be followed by one; a plugin whose work is
 *     queued on a device (the toast-rs GPU plugins) runs one call of a
 *     context at a time, so that each call's status is its own;
 *   - a struct the plugin fills for the host (toast_device_info) is the
 *     host's, as large as the host's ABI minor (toast_host_api.abi_minor;
 *     minor 0 without a host API, or with one shorter than this header's)
 *     makes it: write only those bytes (TOAST_DEVICE_INFO_SIZE), never
 *     sizeof of this header's struct.
 *
 * Arrays.  A kernel sees its large (per-sample) arrays as toast_array: a
 * `ptr` and a length in ELEMENTS.  For a backend whose header sets
 * TOAST_BACKEND_FLAG_HOST_ADDRESSABLE, `ptr` is a host address; otherwise
 * it is a handle returned by `alloc` (the host stages data before the call).
 * A toast_array with len == 0 is "absent" (optional arrays only) and its ptr
 * must not be read.  Small per-detector arrays (index arrays, calibration,
 * focal-plane quaternions) and the intervals are always plain host memory.
 *
 * Shapes.  Row-major (C order).  "[n_rows, n_samp, 4]" means the array has
 * n_rows*n_samp*4 elements; n_rows is len / (n_samp*4) and must be exact.
 * Index arrays name rows of such arrays and must lie in [0, n_rows).
 * Intervals are [first, last) sample ranges (last exclusive), processed in
 * order; 0 <= first <= last <= n_samp.
 *
 * Quaternions are [x, y, z, w] (scalar last), never normalised by a kernel.
 * The exact mathematics of each kernel is that of TOAST 3.0.6, documented in
 * the project's reference-case FORMAT.md, with TOAST's undefined behaviour
 * replaced by errors (see each kernel below).
 */
#ifndef TOAST_BACKEND_H
#define TOAST_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The bytes "TOASTBKD" read as a little-endian 64-bit integer. */
#define TOAST_BACKEND_MAGIC 0x444B425453414F54ULL
#define TOAST_BACKEND_ABI_MAJOR 1u
#define TOAST_BACKEND_ABI_MINOR 10u
#define TOAST_BACKEND_ENTRY_SYMBOL "toast_backend_entry"

/* ---- status codes ------------------------------------------------------ */
typedef int32_t toast_status;
#define TOAST_OK 0
#define TOAST_ERR_INVALID_ARGUMENT 1 /* bad shape, length, index or value */
#define TOAST_ERR_OUT_OF_MEMORY 2    /* allocation failed (names buffer and size) */
#define TOAST_ERR_UNSUPPORTED 3      /* not implemented by this backend */
#define TOAST_ERR_INVALID_HANDLE 4   /* unknown, foreign or freed buffer handle */
#define TOAST_ERR_DEVICE 5           /* driver or device failure */
#define TOAST_ERR_UNAVAILABLE 6      /* hardware or runtime library absent */
#define TOAST_ERR_COMPILE 7          /* device code failed to compile */
#define TOAST_ERR_PANIC 8            /* the plugin caught an internal panic */
#define TOAST_ERR_INTERNAL 9         /* anything else */

/* ---- logging ----------------------------------------------------------- */
#define TOAST_LOG_ERROR 1
#define TOAST_LOG_WARN 2
#define TOAST_LOG_INFO 3
#define TOAST_LOG_DEBUG 4
#define TOAST_LOG_TRACE 5
/* `msg` is UTF-8, `len` bytes, not necessarily NUL-terminated.  The host's
 * callback may be called from any thread, concurrently, with the `log_user`
 * it gave, also from inside a call; it must not call the plugin's entry
 * points (a plugin may hold a lock of the context while it logs). */
typedef void (*toast_log_fn)(void *user, int32_t level, const char *msg, size_t len);

/* What the host hands to `init`.  `size` is sizeof(toast_host_api) as the
 * host knows it; read only fields that fit in it. */
typedef struct toast_host_api {
    uint32_t size;
    uint32_t abi_minor;
    toast_log_fn log; /* may be NULL */
    void *log_user;
    const char *options; /* NUL-terminated "key=value;key=value", may be NULL */
} toast_host_api;

/* ---- common argument types --------------------------------------------- */
typedef struct toast_array {
    uint64_t ptr; /* host address or buffer handle, see above */
    uint64_t len; /* number of elements; 0 = absent */
} toast_array;

typedef struct toast_interval {
    int64_t first; /* first sample */
    int64_t last;  /* one past the last sample (exclusive) */
} toast_interval;

typedef struct toast_intervals {
    const toast_interval *ptr; /* host memory */
    uint64_t len;
} toast_intervals;

#define TOAST_DTYPE_F64 0
#define TOAST_DTYPE_F32 1
#define TOAST_DTYPE_I64 2
#define TOAST_DTYPE_I32 3

typedef struct toast_device_info {
    char name[128];       /* NUL-terminated */
    uint64_t total_memory; /* bytes, 0 if unknown */
    uint64_t free_memory;  /* bytes, 0 if unknown */
    uint32_t compute_units;
    /* ABI minor 7 (before: reserved, 0): the most device memory the
     * backend's allocator has held at once since init (buffers, kernel
     * scratch, caches), in MiB rounded up; 0 if unknown or not tracked. */
    uint32_t peak_held_mib;
    /* ABI minor 9: whose memory the device's allocations take
     * (TOAST_DEVICE_MEMORY_*; the host counts the host's in its memory
     * check). These two fields exist only in a host of minor 9 or later:
     * write them only when toast_host_api.abi_minor >= 9, and never more
     * than TOAST_DEVICE_INFO_SIZE(host abi_minor) bytes of `info` (no
     * memset of sizeof *info into an older host's struct). */
    uint32_t memory_kind;
    uint32_t reserved; /* 0 */
    /* ABI minor 10: the device's identity, the same in every process that
     * drives it and different for every other device (CUDA's and HIP's
     * device UUID, OpenCL's cl_khr_device_uuid); all zero when the plugin
     * cannot tell. The host counts the processes of a node that share a
     * device by it. Exists only in a host of minor 10 or later: write it
     * only when toast_host_api.abi_minor >= 10. */
    uint8_t uuid[16];
} toast_device_info;

#define TOAST_DEVICE_MEMORY_UNKNOWN 0u /* not told: treated as the device's own */
#define TOAST_DEVICE_MEMORY_OWN 1u     /* its own memory (a discrete GPU) */
#define TOAST_DEVICE_MEMORY_HOST 2u    /* the host's (CPU device, integrated GPU, APU) */
/* The bytes of the toast_device_info of a host of ABI minor `m`. */
#define TOAST_DEVICE_INFO_SIZE(m)                                   \
    ((m) >= 10u ? sizeof(toast_device_info)                         \
     : (m) >= 9u ? offsetof(toast_device_info, uuid)                \
                 : offsetof(toast_device_info, memory_kind))

/* ---- kernel arguments ---------------------------------------------------
 * Arrays marked "host" are plain host pointers of the stated length.
 * "(in)" is read, "(out)" written, "(in/out)" both. */

/* quats[quat_index[i], s] = b(s) * focalplane[i]  (Hamilton product), where
 * b(s) = boresight[s], or identity when shared_flags[s] & mask. */
typedef struct toast_pointing_detector_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *quat_index; /* host [n_det] */
    const double *focalplane;  /* host [n_det, 4] */
    toast_intervals intervals;
    toast_array boresight;    /* f64 [n_samp, 4] (in) */
    toast_array shared_flags; /* u8 [n_samp] (in), or absent */
    uint8_t shared_flag_mask;
    uint8_t reserved[7];
    toast_array quats; /* f64 [n_rows, n_samp, 4] (out) */
} toast_pointing_detector_args;

/* HEALPix pixel of each detector direction.  nside must be a power of two
 * (TOAST loops forever otherwise; here it is an error).  Flagged samples get
 * pixel -1 and no hit.  hit_submaps[pix / n_pix_submap] is set to 1.
 * ABI minor 8: with pixels_i32 = 1 the pixels are written as i32 (the
 * map-maker's compact pointing, 4 bytes a sample); 12 nside^2 must then fit
 * an i32 (nside <= 8192), else the call is refused.  The host sets it only
 * for a plugin of minor 8 or later (an older one reads it as reserved). */
typedef struct toast_pixels_healpix_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *quat_index;  /* host [n_det] */
    const int32_t *pixel_index; /* host [n_det] */
    toast_intervals intervals;
    toast_array quats;        /* f64 [n_rows, n_samp, 4] (in) */
    toast_array shared_flags; /* u8 [n_samp] (in), or absent */
    toast_array pixels;       /* i64 (i32 with pixels_i32) [n_rows, n_samp] (out) */
    toast_array hit_submaps;  /* u8 [n_submap] (in/out); n_submap*n_pix_submap >= 12 nside^2 */
    int64_t nside;
    int64_t n_pix_submap;
    uint8_t shared_flag_mask;
    uint8_t nest;       /* 1 NESTED, 0 RING */
    uint8_t pixels_i32; /* ABI minor 8 (before: reserved, 0): 1 = pixels is i32 */
    uint8_t reserved[5];
} toast_pixels_healpix_args;

/* weights[weight_index[i], s] = cal[i] */
typedef struct toast_stokes_weights_i_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *weight_index; /* host [n_det] */
    const double *cal;           /* host [n_det] */
    toast_intervals intervals;
    toast_array weights; /* f64 [n_rows, n_samp] (out) */
} toast_stokes_weights_i_args;

/* I, Q, U weights from the detector quaternions, with optional HWP angle. */
typedef struct toast_stokes_weights_iqu_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *quat_index;   /* host [n_det] */
    const int32_t *weight_index; /* host [n_det] */
    const double *epsilon;       /* host [n_det] */
    const double *gamma;         /* host [n_det] */
    const double *cal;           /* host [n_det] */
    toast_intervals intervals;
    toast_array quats;   /* f64 [n_rows, n_samp, 4] (in) */
    toast_array hwp;     /* f64 [n_samp] (in), or absent (no HWP) */
    toast_array weights; /* f64 [n_rows, n_samp, 3] (out) */
    uint8_t iau;         /* 1: IAU convention (U sign flipped) */
    uint8_t reserved[7];
} toast_stokes_weights_iqu_args;

/* det_data[d, s] (+= | -= | *=) data_scale * sum_k weights[w, s, k] * map[pixel, k].
 * A pixel < 0 is skipped; a pixel >= n_global_submap*n_pix_submap, or one in a
 * submap whose global2local is -1 (or >= n_local_submap), is an error.
 * should_zero zeroes det_data over the intervals first. */
typedef struct toast_scan_map_args {
    uint64_t n_det;
    uint64_t n_samp;
    uint64_t nnz;
    const int32_t *pixel_index;  /* host [n_det] */
    const int32_t *weight_index; /* host [n_det] */
    const int32_t *data_index;   /* host [n_det] */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in) */
    int64_t n_pix_submap;
    int32_t map_dtype;  /* TOAST_DTYPE_* */
    int32_t reserved0;
    toast_array mapdata;  /* map_dtype [n_local_submap, n_pix_submap, nnz] (in) */
    toast_array pixels;   /* i64 [n_rows, n_samp] (in) */
    toast_array weights;  /* f64 [n_rows, n_samp, nnz] (in) */
    toast_array det_data; /* f64 [n_rows, n_samp] (in/out) */
    double data_scale;
    uint8_t should_zero;
    uint8_t should_subtract; /* takes priority over should_scale */
    uint8_t should_scale;
    uint8_t reserved[5];
} toast_scan_map_args;

/* zmap[l, p, k] += det_data[d, s] * det_scale[i] * weights[w, s, k] for
 * unflagged samples with pixel >= 0; accumulation order per zmap element is
 * detector, interval, sample.  Pixel errors as in scan_map. */
typedef struct toast_build_noise_weighted_args {
    uint64_t n_det;
    uint64_t n_samp;
    uint64_t nnz;
    const int32_t *pixel_index;  /* host [n_det] */
    const int32_t *weight_index; /* host [n_det] */
    const int32_t *data_index;   /* host [n_det] */
    const int32_t *flag_index;   /* host [n_det]; read only when det_flags is present */
    const double *det_scale;     /* host [n_det] */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in) */
    int64_t n_pix_submap;
    toast_array pixels;       /* i64 [n_rows, n_samp] (in) */
    toast_array weights;      /* f64 [n_rows, n_samp, nnz] (in) */
    toast_array det_data;     /* f64 [n_rows, n_samp] (in) */
    toast_array det_flags;    /* u8 [n_rows, n_samp] (in), or absent */
    toast_array shared_flags; /* u8 [n_samp] (in), or absent */
    toast_array zmap;         /* f64 [n_local_submap, n_pix_submap, nnz] (in/out) */
    uint8_t det_flag_mask;
    uint8_t shared_flag_mask;
    uint8_t reserved[6];
} toast_build_noise_weighted_args;

/* det_data[data_index[i], s] *= detector_weights[i] */
typedef struct toast_noise_weight_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *data_index;       /* host [n_det] */
    const double *detector_weights;  /* host [n_det] */
    toast_intervals intervals;
    toast_array det_data; /* f64 [n_rows, n_samp] (in/out) */
} toast_noise_weight_args;

/* Offset templates.  TOAST calls these once per detector; here a call may
 * carry several detectors (processed in order).  For detector i, sample s of
 * view (interval) v maps to amplitude
 *     amp_offset[i] + sum_{u<v} n_amp_views[u] + (s - first_v) / step_length.
 * n_view = intervals.len must be >= 1 and equal to the length of n_amp_views;
 * n_amp_views[v] must hold ceil((last_v - first_v) / step_length) and every
 * amplitude index must lie inside `amplitudes`. */
typedef struct toast_offset_layout {
    int64_t step_length;
    const int64_t *n_amp_views; /* host [n_view] */
    const int64_t *amp_offset;  /* host [n_det] */
} toast_offset_layout;

/* det_data[data_index[i], s] += amplitudes[amp] unless amplitude_flags[amp] */
typedef struct toast_template_offset_add_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *data_index; /* host [n_det] */
    toast_offset_layout layout;
    toast_intervals intervals;
    toast_array amplitudes;      /* f64 [n_amp] (in) */
    toast_array amplitude_flags; /* u8 [n_amp] (in) */
    toast_array det_data;        /* f64 [n_rows, n_samp] (in/out) */
} toast_template_offset_add_args;

/* amplitudes[amp] += (flagged ? 0.0 : det_data[data_index[i], s]) unless
 * amplitude_flags[amp]; each amplitude sums its samples in sample order
 * (deterministic, whatever the thread count).  flag_index[i] < 0 means the
 * detector has no flags. */
typedef struct toast_template_offset_project_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *data_index; /* host [n_det] */
    const int32_t *flag_index; /* host [n_det], -1 = no flags */
    toast_offset_layout layout;
    toast_intervals intervals;
    toast_array det_data;        /* f64 [n_rows, n_samp] (in) */
    toast_array flag_data;       /* u8 [n_flag_rows, n_samp] (in), or absent */
    toast_array amplitudes;      /* f64 [n_amp] (in/out) */
    toast_array amplitude_flags; /* u8 [n_amp] (in) */
    uint8_t flag_mask;
    uint8_t reserved[7];
} toast_template_offset_project_args;

/* out[a] = flags[a] == 0 ? in[a] * offset_var[a] : 0.0 */
typedef struct toast_template_offset_precond_args {
    uint64_t n_amp;
    toast_array offset_var;      /* f64 [n_amp] (in) */
    toast_array amplitudes_in;   /* f64 [n_amp] (in) */
    toast_array amplitude_flags; /* u8 [n_amp] (in) */
    toast_array amplitudes_out;  /* f64 [n_amp] (out) */
} toast_template_offset_precond_args;

/* Diagonal pixel-noise covariance (TOAST's cov_accum_diag_hits / _invnpp).
 * Sample i (n_samp = submap.len) goes to the flat local pixel
 * hpx = submap[i] * nsubpix + subpix[i]; a negative submap (not local) or
 * subpix (flagged) skips the sample; submap >= nsub or subpix >= nsubpix is
 * an error.  nsub < 1 does nothing (nothing is read or written), as in TOAST.
 * hits[hpx] += 1; nnz is unused, as in TOAST. */
typedef struct toast_cov_accum_diag_hits_args {
    int64_t nsub;
    int64_t nsubpix;
    int64_t nnz;
    toast_array submap; /* i64 [n_samp] (in) */
    toast_array subpix; /* i64 [n_samp] (in) */
    toast_array hits;   /* i64 [nsub * nsubpix] (in/out) */
} toast_cov_accum_diag_hits_args;

/* invnpp[hpx, jk] += weights[i, k] * (weights[i, j] * scale) for j <= k (the
 * lower triangle row by row, nnz (nnz + 1) / 2 elements per pixel). */
typedef struct toast_cov_accum_diag_invnpp_args {
    int64_t nsub;
    int64_t nsubpix;
    int64_t nnz;
    toast_array submap;  /* i64 [n_samp] (in) */
    toast_array subpix;  /* i64 [n_samp] (in) */
    toast_array weights; /* f64 [n_samp, nnz] (in) */
    double scale;
    toast_array invnpp; /* f64 [nsub * nsubpix, nnz (nnz + 1) / 2] (in/out) */
} toast_cov_accum_diag_invnpp_args;

/* TOAST's filter_polynomial: for each scan v (in order) and each signal i,
 * fit Legendre polynomials of order 0..order to the good samples
 * (flags == 0) of signals[signal_index[i], starts[v] .. stops[v]) and
 * subtract the fit from every sample of the scan.  Scans are clamped as TOAST
 * does (start < 0 -> 0; stop < 0 or > n_samp -> n_samp; stop < start
 * skips); a scan without good samples is left alone; a scan with fewer good
 * samples than order + 1 is fitted with as many templates as good samples.
 * order < 0 does nothing.  signal_index must not repeat a row.  order + 1
 * is at most 1024 templates (every backend refuses more). */
typedef struct toast_filter_polynomial_args {
    uint64_t n_signal;
    uint64_t n_samp;
    uint64_t n_scan;
    int64_t order;
    const int32_t *signal_index; /* host [n_signal] */
    const int64_t *starts;       /* host [n_scan] */
    const int64_t *stops;        /* host [n_scan], exclusive */
    toast_array flags;           /* u8 [n_samp] (in) */
    toast_array signals;         /* f64 [n_rows, n_samp] (in/out) */
} toast_filter_polynomial_args;

/* TOAST's filter_poly2D: for every sample and detector group, the
 * least-squares coefficients of the group's signals in the per-detector
 * templates (masks == 0 weights a detector by 0), solved with rcond 1e-6:
 * coeff[s, g, 0..n_mode].  det_groups[d] < 0: detector d is in no group;
 * otherwise it must be < n_group.  n_mode is at most 1024 (every backend
 * refuses more). */
typedef struct toast_filter_poly2d_args {
    uint64_t n_samp;
    uint64_t n_det;
    uint64_t n_group;
    uint64_t n_mode;
    const int32_t *det_groups; /* host [n_det] */
    const double *templates;   /* host [n_det, n_mode] */
    toast_array signals;       /* f64 [n_samp, n_det] (in) */
    toast_array masks;         /* u8 [n_samp, n_det] (in) */
    toast_array coeff;         /* f64 [n_samp, n_group, n_mode] (out) */
} toast_filter_poly2d_args;

/* TOAST's cov_apply_diag (ABI minor 2): vec <- mat vec at each of the
 * nsub * nsubpix local pixels, mat holding nnz (nnz + 1) / 2 values per
 * pixel (the packed symmetric matrix, row by row: (0,0) (0,1) .. (1,1) ..).
 * nsub < 1 does nothing (nothing is read or written), as in TOAST; otherwise
 * nsubpix must be positive and 1 <= nnz <= 16. */
typedef struct toast_cov_apply_diag_args {
    int64_t nsub;
    int64_t nsubpix;
    int64_t nnz;
    toast_array mat; /* f64 [nsub * nsubpix, nnz (nnz + 1) / 2] (in) */
    toast_array vec; /* f64 [nsub * nsubpix, nnz] (in/out) */
} toast_cov_apply_diag_args;

/* The PCG solver's flagged dot product of two amplitude vectors (ABI minor
 * 3; not a TOAST registry kernel): the n entries are cut into nblock
 * consecutive blocks of chunk = ceil(n / nblock) entries, and partials[k]
 * is the sum, in index order from 0.0, of a[i] * b[i] over the entries i
 * of block k whose flags[i] is 0 (flagged entries are skipped, not added
 * as zero).  The caller adds the partials in order 0..nblock-1: with
 * nblock = 1 that is the plain sequential sum.  nblock must be at least 1
 * (blocks past the end hold 0.0). */
typedef struct toast_amp_dot_args {
    int64_t n;
    int64_t nblock;
    toast_array a;        /* f64 [n] (in) */
    toast_array b;        /* f64 [n] (in) */
    toast_array flags;    /* u8 [n] (in) */
    toast_array partials; /* f64 [nblock] (out) */
} toast_amp_dot_args;

/* The PCG solver's vector update (ABI minor 3; not a TOAST registry
 * kernel): y[i] <- (alpha * x[i]) + (beta * y[i]) for i < n, each product
 * rounded, then the sum (x += alpha d: alpha, 1; r -= alpha q: -alpha, 1;
 * d <- beta d + s: 1, beta).  beta == 0: y[i] <- alpha x[i], y not read
 * (as BLAS; with alpha = 1 an exact copy, signed zeros included). */
typedef struct toast_amp_axpby_args {
    int64_t n;
    double alpha;
    double beta;
    toast_array x; /* f64 [n] (in) */
    toast_array y; /* f64 [n] (in/out) */
} toast_amp_axpby_args;

/* ---- the map-maker's fused kernels (ABI minor 4; not TOAST registry
 * kernels) -----------------------------------------------------------------
 * Compact pointing: a detector's pixel is kept as an i32 (`compact`, TOAST's
 * pixels_healpix pixel, narrowed) and its IQU weights are rebuilt from the
 * boresight (`boresight`, cut to the identity where `pointing_flags &
 * pointing_flag_mask`, as pointing_detector does), the focal-plane quaternion
 * and epsilon/gamma/cal: the weights of stokes_weights_IQU to a few ulp of
 * eta * cal (cos 2a and sin 2a from the rational form of the same (x, y),
 * TOAST's atan2/cos/sin where that form does not apply and with a HWP).
 *
 * compact_expand_pointing: pixels[p, s] = compact[c, s] and weights[w, s, :]
 * the rebuilt weights (nnz 3; nnz 1: cal), for s in the intervals. */
typedef struct toast_compact_expand_pointing_args {
    uint64_t n_det;
    uint64_t n_samp;
    uint64_t nnz;                 /* 1 or 3 */
    const int32_t *compact_index; /* host [n_det] */
    const int32_t *pixel_index;   /* host [n_det] */
    const int32_t *weight_index;  /* host [n_det] */
    const double *focalplane;     /* host [n_det, 4] */
    const double *epsilon;        /* host [n_det] */
    const double *gamma;          /* host [n_det] */
    const double *cal;            /* host [n_det] */
    toast_intervals intervals;
    toast_array compact;        /* i32 [n_rows, n_samp] (in) */
    toast_array boresight;      /* f64 [n_samp, 4] (in) */
    toast_array pointing_flags; /* u8 [n_samp] (in), or absent */
    toast_array hwp;            /* f64 [n_samp] (in), or absent */
    toast_array pixels;         /* i64 [n_rows, out_n_samp] (out) */
    toast_array weights;        /* f64 [n_rows, out_n_samp, nnz] (out) */
    int64_t out_first;          /* the sample of the outputs' column 0 */
    uint64_t out_n_samp;        /* samples per output row */
    uint8_t pointing_flag_mask;
    uint8_t iau;
    uint8_t reserved[6];
} toast_compact_expand_pointing_args;

/* (compact_expand_pointing's outputs hold out_n_samp samples per row from
 * sample out_first: the whole observation with out_first 0 and out_n_samp
 * n_samp, or a window every interval lies in.) */

/* fused_accumulate: zmap[pix, :] += (t[d, s] * det_scale[d]) * w[d, s, :]
 * over the samples of the intervals not cut by det_flags/shared_flags (as
 * build_noise_weighted, IQU), where t is det_data (data_index >= 0) or, with
 * det_data absent, F a: 0 + amplitudes[a] under an unflagged amplitude, 0
 * under a flagged one (template_offset_add_to_signal on a zeroed
 * timestream), and the pixel and weights are the compact ones (compact
 * present) or the kept ones (pixels, weights). finite[d] != 0 promises that
 * every weight of detector d over the intervals is finite: a sample of value
 * +-0 may then be skipped (it adds +-0). Each zmap element is summed in
 * detector, interval, sample order: the unfused sequence's bits. */
typedef struct toast_fused_accumulate_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *pixel_index;  /* host [n_det]: row of compact or pixels */
    const int32_t *weight_index; /* host [n_det]: row of weights (kept form) */
    const double *focalplane;    /* host [n_det, 4] (compact form) */
    const double *epsilon;       /* host [n_det] (compact form) */
    const double *gamma;         /* host [n_det] (compact form) */
    const double *cal;           /* host [n_det] (compact form) */
    const int32_t *data_index;   /* host [n_det] (det_data present) */
    const int32_t *flag_index;   /* host [n_det], -1 = no flags */
    const double *det_scale;     /* host [n_det] */
    const uint8_t *finite;       /* host [n_det] */
    toast_offset_layout layout;  /* F a: amp_offset -1 = no amplitudes (t = 0) */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in) */
    int64_t n_pix_submap;
    toast_array compact;         /* i32 [n_rows, n_samp] (in), or absent */
    toast_array boresight;       /* f64 [n_samp, 4] (in), compact form */
    toast_array pointing_flags;  /* u8 [n_samp] (in), or absent */
    toast_array hwp;             /* f64 [n_samp] (in), or absent */
    toast_array pixels;          /* i64 [n_rows, n_samp] (in), kept form */
    toast_array weights;         /* f64 [n_rows, n_samp, 3] (in), kept form */
    toast_array det_data;        /* f64 [n_rows, n_samp] (in), or absent: F a */
    toast_array det_flags;       /* u8 [n_flag_rows, n_samp] (in), or absent */
    toast_array shared_flags;    /* u8 [n_samp] (in), or absent */
    toast_array amplitudes;      /* f64 [n_amp] (in), F a */
    toast_array amplitude_flags; /* u8 [n_amp] (in), F a */
    toast_array zmap;            /* f64 [n_local_submap, n_pix_submap, 3] (in/out) */
    uint8_t det_flag_mask;
    uint8_t shared_flag_mask;
    uint8_t pointing_flag_mask;
    uint8_t iau;
    uint8_t reserved[4];
} toast_fused_accumulate_args;

/* fused_project: out[a] += sum over the samples s of amplitude a (offset
 * layout, sample order) with det_flags[f, s] & det_flag_mask == 0 of
 * (t[d, s] - sum_k w[d, s, k] * mapdata[pix, k]) * det_scale[d], for every
 * unflagged amplitude; t as fused_accumulate's (the unfused sequence: the
 * timestream, scan_map subtract, noise_weight, template_offset_project_signal).
 * A pixel < 0 scans nothing. */
typedef struct toast_fused_project_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *pixel_index;  /* host [n_det]: row of compact or pixels */
    const int32_t *weight_index; /* host [n_det]: row of weights (kept form) */
    const double *focalplane;    /* host [n_det, 4] (compact form) */
    const double *epsilon;       /* host [n_det] (compact form) */
    const double *gamma;         /* host [n_det] (compact form) */
    const double *cal;           /* host [n_det] (compact form) */
    const int32_t *data_index;   /* host [n_det] (det_data present) */
    const int32_t *flag_index;   /* host [n_det], -1 = no flags */
    const double *det_scale;     /* host [n_det] */
    toast_offset_layout layout;  /* amp_offset -1: the detector projects nothing */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in) */
    int64_t n_pix_submap;
    toast_array compact;         /* i32 [n_rows, n_samp] (in), or absent */
    toast_array boresight;       /* f64 [n_samp, 4] (in), compact form */
    toast_array pointing_flags;  /* u8 [n_samp] (in), or absent */
    toast_array hwp;             /* f64 [n_samp] (in), or absent */
    toast_array pixels;          /* i64 [n_rows, n_samp] (in), kept form */
    toast_array weights;         /* f64 [n_rows, n_samp, 3] (in), kept form */
    toast_array det_data;        /* f64 [n_rows, n_samp] (in), or absent: F a */
    toast_array det_flags;       /* u8 [n_flag_rows, n_samp] (in), or absent */
    toast_array mapdata;         /* f64 [n_local_submap, n_pix_submap, 3] (in) */
    toast_array amplitudes;      /* f64 [n_amp] (in), F a, or absent */
    toast_array amplitude_flags; /* u8 [n_amp] (in) */
    toast_array amplitudes_out;  /* f64 [n_amp] (in/out) */
    uint8_t det_flag_mask;
    uint8_t pointing_flag_mask;
    uint8_t iau;
    uint8_t reserved[5];
} toast_fused_project_args;

/* ---- noise simulation (ABI minor 5; TOAST's tod_sim_noise_timestream) ----
 * sim_noise: det_data[data_index[d], s] += the noise stream of detector d,
 * s < n_samp.  The stream: N = fft_len Gaussian deviates g_j (Threefry-2x64-20
 * with key keys[2d], keys[2d+1] at counter (0, counter0 + j), word 0, as
 * Random123's u01 then sqrt(2) erfinv(2u - 1)); the half-complex spectrum
 * X_0 = 0 (A_0 g_0, A_0 = 0), X_k = A_k (g_k + i g_{N-k}) for 0 < k < N/2,
 * X_{N/2} = A_{N/2} g_{N/2}, A = amplitudes row filter_index[d] (N/2 + 1
 * values); the inverse real FFT divided by N; its n_samp samples from
 * (N - n_samp) / 2, minus their mean.  fft_len is a power of two greater than
 * n_samp (TOAST: the smallest above 2 n_samp). */
typedef struct toast_sim_noise_args {
    uint64_t n_det;
    uint64_t n_samp;   /* samples per row of det_data */
    uint64_t fft_len;  /* N, a power of two > n_samp */
    uint64_t n_filter; /* rows of amplitudes */
    uint64_t counter0; /* low counter word of deviate 0 (first sample * oversample) */
    const int32_t *data_index;   /* [n_det] row of det_data */
    const int32_t *filter_index; /* [n_det] row of amplitudes */
    const uint64_t *keys;        /* [2 n_det] Threefry keys */
    const double *amplitudes;    /* [n_filter][fft_len / 2 + 1] */
    toast_array det_data;        /* f64 [rows][n_samp] (in/out) */
} toast_sim_noise_args;
/* cov_accum_timestream (ABI minor 5; toast-rs's own kernel: TOAST's
 * BuildHitMap and BuildInverseCovariance from the timestream's pointing).
 * For every detector i, interval and sample s, in that order, whose
 * det_flags[flag_index[i], s] & det_flag_mask and shared_flags[s] &
 * shared_flag_mask are 0 and whose pixel p = pixels[pixel_index[i], s] is
 * >= 0, with (l, q) the local submap and sub-pixel of p through global2local:
 *   hits[l, q] += 1                                        (hits present)
 *   invnpp[l, q, jk] += w[k] * (w[j] * det_scale[i]), j <= k row by row,
 *   w = weights[weight_index[i], s, :]                     (invnpp present)
 * (the packed layout and the operations of TOAST's cov_accum_diag_invnpp).
 * At least one of hits and invnpp is present.  Pixel errors as in scan_map. */
typedef struct toast_cov_accum_timestream_args {
    uint64_t n_det;
    uint64_t n_samp;
    uint64_t nnz;                /* weights per sample (read with invnpp) */
    const int32_t *pixel_index;  /* host [n_det] */
    const int32_t *weight_index; /* host [n_det]; read only when invnpp is present */
    const int32_t *flag_index;   /* host [n_det]; read only when det_flags is present */
    const double *det_scale;     /* host [n_det]; read only when invnpp is present */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in) */
    int64_t n_pix_submap;
    toast_array pixels;       /* i64 [n_rows, n_samp] (in) */
    toast_array weights;      /* f64 [n_rows, n_samp, nnz] (in), absent without invnpp */
    toast_array det_flags;    /* u8 [n_flag_rows, n_samp] (in), or absent */
    toast_array shared_flags; /* u8 [n_samp] (in), or absent */
    toast_array hits;         /* i64 [n_local_submap, n_pix_submap] (in/out), or absent */
    toast_array invnpp; /* f64 [n_local_submap, n_pix_submap, nnz (nnz + 1) / 2] (in/out), or absent */
    uint8_t det_flag_mask;
    uint8_t shared_flag_mask;
    uint8_t reserved[6];
} toast_cov_accum_timestream_args;

/* solver_flags (ABI minor 6; toast-rs's own kernel: the destriping solver's
 * sample flags, TOAST's SolveAmplitudes solver flags and ScanMask).  For
 * every detector i and sample s of [0, n_samp), with r = out_index[i]:
 *   s outside every interval: flags[r, s] |= cut_bit
 *   s in an interval (each interval on its own):
 *     v = cut_bit if det_flags[flag_index[i], s] & det_flag_mask (det_flags
 *         present) or shared_flags[s] & shared_flag_mask (present), else 0;
 *     with pixel_mask present, p = pixels[pixel_index[i], s]: p < 0 adds
 *         nothing, p beyond the n_global_submap submaps is a pixel error (as
 *         in scan_map), a submap with global2local -1 adds nothing, else
 *         v |= mask_bit where pixel_mask[local pixel of p] != 0;
 *     flags[r, s] |= v; counts[0] += (flags[r, s] != 0); counts[1] += 1.
 * Integer work: every backend gives the same bytes.  At least one of
 * cut_bit and mask_bit is non-zero; pixels and global2local are present
 * exactly when pixel_mask is. */
typedef struct toast_solver_flags_args {
    uint64_t n_det;
    uint64_t n_samp;
    const int32_t *flag_index;  /* host [n_det]; read only when det_flags is present */
    const int32_t *pixel_index; /* host [n_det]; read only when pixel_mask is present */
    const int32_t *out_index;   /* host [n_det] */
    toast_intervals intervals;
    toast_array global2local; /* i64 [n_global_submap] (in), with pixel_mask */
    int64_t n_pix_submap;
    toast_array det_flags;    /* u8 [n_flag_rows, n_samp] (in), or absent */
    toast_array shared_flags; /* u8 [n_samp] (in), or absent */
    toast_array pixels;       /* i64 [n_rows, n_samp] (in), with pixel_mask */
    toast_array pixel_mask;   /* u8 [n_local_submap, n_pix_submap] (in), or absent */
    toast_array flags;        /* u8 [n_out_rows, n_samp] (in/out) */
    toast_array counts;       /* i64 [2] (in/out) */
    uint8_t det_flag_mask;
    uint8_t shared_flag_mask;
    uint8_t cut_bit;
    uint8_t mask_bit;
    uint8_t reserved[4];
} toast_solver_flags_args;

/* ---- the function table -------------------------------------------------
 * Entries may be NULL: memory entries only for host-addressable backends,
 * kernel entries for kernels the backend does not implement.  `ctx` is the
 * value `init` produced. */
typedef struct toast_backend_table {
    /* lifecycle: init may fail with TOAST_ERR_UNAVAILABLE (no device, no
     * driver); last_error then gives the reason shown to the user. */
    toast_status (*init)(const toast_host_api *host, void **ctx);
    void (*shutdown)(void *ctx);
    /* Thread-local message of the last failed call on this thread, NUL
     * terminated, valid until the next call; never NULL ("" if none). */
    const char *(*last_error)(void);

    /* devices */
    toast_status (*device_count)(void *ctx, uint32_t *count);
    toast_status (*device_info)(void *ctx, uint32_t index, toast_device_info *info);

    /* memory; `name` (NUL-terminated, may be NULL) is used in error messages */
    toast_status (*alloc)(void *ctx, uint64_t bytes, const char *name, uint64_t *handle);
    toast_status (*free)(void *ctx, uint64_t handle);
    toast_status (*copy_to_device)(void *ctx, uint64_t handle, uint64_t offset_bytes,
                                   const void *src, uint64_t bytes);
    toast_status (*copy_to_host)(void *ctx, uint64_t handle, uint64_t offset_bytes, void *dst,
                                 uint64_t bytes);
    toast_status (*reset)(void *ctx, uint64_t handle, uint64_t offset_bytes, uint64_t bytes);
    toast_status (*synchronize)(void *ctx);

    /* kernels */
    toast_status (*pointing_detector)(void *ctx, const toast_pointing_detector_args *a);
    toast_status (*pixels_healpix)(void *ctx, const toast_pixels_healpix_args *a);
    toast_status (*stokes_weights_i)(void *ctx, const toast_stokes_weights_i_args *a);
    toast_status (*stokes_weights_iqu)(void *ctx, const toast_stokes_weights_iqu_args *a);
    toast_status (*scan_map)(void *ctx, const toast_scan_map_args *a);
    toast_status (*build_noise_weighted)(void *ctx, const toast_build_noise_weighted_args *a);
    toast_status (*noise_weight)(void *ctx, const toast_noise_weight_args *a);
    toast_status (*template_offset_add_to_signal)(void *ctx,
                                                  const toast_template_offset_add_args *a);
    toast_status (*template_offset_project_signal)(void *ctx,
                                                   const toast_template_offset_project_args *a);
    toast_status (*template_offset_apply_diag_precond)(
        void *ctx, const toast_template_offset_precond_args *a);
    toast_status (*cov_accum_diag_hits)(void *ctx, const toast_cov_accum_diag_hits_args *a);
    toast_status (*cov_accum_diag_invnpp)(void *ctx, const toast_cov_accum_diag_invnpp_args *a);
    toast_status (*filter_polynomial)(void *ctx, const toast_filter_polynomial_args *a);
    toast_status (*filter_poly2d)(void *ctx, const toast_filter_poly2d_args *a);
    toast_status (*cov_apply_diag)(void *ctx, const toast_cov_apply_diag_args *a);
    toast_status (*amp_dot)(void *ctx, const toast_amp_dot_args *a);
    toast_status (*amp_axpby)(void *ctx, const toast_amp_axpby_args *a);
    toast_status (*compact_expand_pointing)(void *ctx,
                                            const toast_compact_expand_pointing_args *a);
    toast_status (*fused_accumulate)(void *ctx, const toast_fused_accumulate_args *a);
    toast_status (*fused_project)(void *ctx, const toast_fused_project_args *a);
    toast_status (*sim_noise)(void *ctx, const toast_sim_noise_args *a);
    toast_status (*cov_accum_timestream)(void *ctx, const toast_cov_accum_timestream_args *a);
    toast_status (*solver_flags)(void *ctx, const toast_solver_flags_args *a);
} toast_backend_table;

/* Backend capabilities (header.flags). */
#define TOAST_BACKEND_FLAG_HOST_ADDRESSABLE 1u /* kernels take host addresses */

typedef struct toast_backend_header {
    uint64_t magic;     /* TOAST_BACKEND_MAGIC */
    uint32_t abi_major; /* TOAST_BACKEND_ABI_MAJOR */
    uint32_t abi_minor; /* TOAST_BACKEND_ABI_MINOR the plugin was built against */
    uint32_t table_size; /* sizeof(toast_backend_table) as the plugin knows it */
    uint32_t flags;      /* TOAST_BACKEND_FLAG_* */
    const char *name;    /* e.g. "cpu"; NUL-terminated, static */
    const char *version; /* plugin version, NUL-terminated, static */
    const char *description;
    const toast_backend_table *table;
} toast_backend_header;

typedef const toast_backend_header *(*toast_backend_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* TOAST_BACKEND_H */
