//! Argument validation shared by every backend written in Rust.
//!
//! A kernel entry point calls the matching `check_*` function before it
//! touches any memory. Checks here need only the argument struct and the
//! small host-side arrays (index arrays, intervals, the offset-template
//! layout); data-dependent checks on large arrays (a pixel beyond the map, a
//! hit submap whose `global2local` is -1) happen inside the kernels, which
//! report the detector and sample. [`global2local`] checks the entries of
//! that (kernel) array and is called by a backend on a host-visible copy.
//!
//! The rules, per kernel (TOAST's undefined behaviour becomes an error):
//!
//! * every array has exactly the length its shape implies: per-sample arrays
//!   are whole rows (`[n_rows, n_samp, k]`), required arrays of fixed size
//!   (`boresight`, `amplitude_flags`, the four preconditioner arrays) match
//!   exactly, and optional arrays (`shared_flags`, `hwp`, `det_flags`,
//!   `flag_data`) are absent (length 0) or exactly sized; TOAST's "length 1
//!   disables it" is not accepted (the conformance runner maps it to absent);
//! * index arrays name rows that exist; intervals lie in `[0, n_samp]` with
//!   `first <= last`; host arrays are non-null when non-empty;
//! * `nside` is a power of two in `[1, 2^29]`, `n_pix_submap > 0`, and
//!   `hit_submaps` covers the `12 nside^2` pixels; `nnz >= 1`, the map dtype
//!   is known and maps hold whole submaps;
//! * offset templates: `step_length >= 1`, at least one view,
//!   `n_amp_views[v] >= ceil(len_v / step_length)`, and each detector's block
//!   `[amp_offset[i], amp_offset[i] + sum(n_amp_views))` inside `amplitudes`,
//!   so no sample can map to an amplitude outside it; `flag_index` is -1 or
//!   a row of `flag_data`, which must then be present.
//!
//! Every error names the argument and the offending value.

use crate::abi::{self, SampleRange, SampleRanges};

mod cov;
mod flags;
mod fused;
mod noise;
pub use cov::{check_cov_accum_timestream, CovAccumTimestream};
pub use flags::{check_solver_flags, view_gaps, SolverFlags};
pub use fused::{
    check_compact_expand_pointing, check_fused_accumulate, check_fused_project,
    CompactExpandPointing, Fused, FusedPointing, FusedValues,
};
pub use noise::{check_sim_noise, SimNoise, MAX_NOISE_FFT_LEN};

/// A rejected kernel argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kernel}: argument `{arg}`: {problem}")]
pub struct ArgError {
    /// Kernel name, as [`crate::abi::Kernel::name`].
    pub kernel: &'static str,
    /// Argument name, as in the C header.
    pub arg: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl ArgError {
    pub fn new(kernel: &'static str, arg: &'static str, problem: impl Into<String>) -> Self {
        ArgError {
            kernel,
            arg,
            problem: problem.into(),
        }
    }
}

/// View the intervals of an argument struct as a slice, checking each one
/// lies in `[0, n_samp]` with `first <= last`.
///
/// # Safety
/// `iv.ptr` must point to `iv.len` readable intervals (or `iv.len == 0`).
pub unsafe fn intervals<'a>(
    kernel: &'static str,
    iv: &SampleRanges,
    n_samp: u64,
) -> Result<&'a [SampleRange], ArgError> {
    if iv.len == 0 {
        return Ok(&[]);
    }
    if iv.ptr.is_null() {
        return Err(ArgError::new(
            kernel,
            "intervals",
            format!("null pointer with length {}", iv.len),
        ));
    }
    // SAFETY: non-null and, by the caller's contract, valid for iv.len items.
    let s = unsafe { std::slice::from_raw_parts(iv.ptr, iv.len as usize) };
    for (i, it) in s.iter().enumerate() {
        if it.first < 0 || it.last < it.first || it.last as u64 > n_samp {
            return Err(ArgError::new(
                kernel,
                "intervals",
                format!(
                    "interval {i} is [{}, {}), which is not a range inside [0, n_samp = {n_samp})",
                    it.first, it.last
                ),
            ));
        }
    }
    Ok(s)
}

/// View a host array of `n` elements, refusing a null pointer when `n > 0`.
///
/// # Safety
/// `ptr` must point to `n` readable elements of `T` (or `n == 0`).
pub unsafe fn host_slice<'a, T>(
    kernel: &'static str,
    arg: &'static str,
    ptr: *const T,
    n: u64,
) -> Result<&'a [T], ArgError> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("null pointer, expected {n} elements"),
        ));
    }
    // SAFETY: non-null and valid for n elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) })
}

/// Check that every entry of an index array lies in `[0, n_rows)`.
pub fn index_rows(
    kernel: &'static str,
    arg: &'static str,
    index: &[i32],
    n_rows: u64,
    rows_of: &str,
) -> Result<(), ArgError> {
    for (i, &r) in index.iter().enumerate() {
        if r < 0 || r as u64 >= n_rows {
            return Err(ArgError::new(
                kernel,
                arg,
                format!("{arg}[{i}] = {r} is not a row of {rows_of}, which has {n_rows} rows"),
            ));
        }
    }
    Ok(())
}

/// The number of rows of an array of `len` elements made of rows of
/// `row_len` elements, requiring an exact multiple.
pub fn rows(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    row_len: u64,
    shape: &str,
) -> Result<u64, ArgError> {
    if row_len == 0 {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("row length of shape {shape} is zero"),
        ));
    }
    if !len.is_multiple_of(row_len) {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("length {len} is not a whole number of rows of shape {shape} ({row_len} elements each)"),
        ));
    }
    Ok(len / row_len)
}

/// An optional array must be absent (length 0) or have exactly `expected`
/// elements. Returns whether it is present.
pub fn optional_len(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    expected: u64,
    what: &str,
) -> Result<bool, ArgError> {
    match len {
        0 => Ok(false),
        l if l == expected => Ok(true),
        l => Err(ArgError::new(
            kernel,
            arg,
            format!("length {l}, expected {expected} ({what}) or 0 (absent)"),
        )),
    }
}

/// A required array must have exactly `expected` elements.
pub fn exact_len(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    expected: u64,
    what: &str,
) -> Result<(), ArgError> {
    if len != expected {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("length {len}, expected {expected} ({what})"),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Generic helpers used by the per-kernel checks below.
// ---------------------------------------------------------------------------

/// `a * b`, or an error naming `arg` when it overflows.
fn mul(kernel: &'static str, arg: &'static str, a: u64, b: u64) -> Result<u64, ArgError> {
    a.checked_mul(b)
        .ok_or_else(|| ArgError::new(kernel, arg, format!("size {a} x {b} overflows 64 bits")))
}

/// The number of rows of a per-sample array of `len` elements whose rows
/// hold `n_samp * per_samp` elements, checking that every index in `index`
/// names one of those rows.
///
/// With `n_samp == 0` no sample can be touched: the array must be empty and
/// the index values are not checked (there is nothing to index).
#[allow(clippy::too_many_arguments)]
fn sample_rows(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    n_samp: u64,
    per_samp: u64,
    shape: &str,
    index_arg: &'static str,
    index: &[i32],
) -> Result<u64, ArgError> {
    let row_len = mul(kernel, arg, n_samp, per_samp)?;
    if row_len == 0 {
        if len != 0 {
            return Err(ArgError::new(
                kernel,
                arg,
                format!("length {len}, but its shape {shape} has no elements (n_samp = {n_samp})"),
            ));
        }
        return Ok(0);
    }
    let n_rows = rows(kernel, arg, len, row_len, shape)?;
    index_rows(kernel, index_arg, index, n_rows, arg)?;
    Ok(n_rows)
}

/// The row of `det_flags` (of `len` elements, rows of `n_samp`) of each of
/// the `n_det` detectors, from `flag_index`; none when `det_flags` is
/// absent (`len` 0: the index is not read).
///
/// # Safety
/// With `len > 0`, `flag_index` must point to `n_det` host i32s.
unsafe fn det_flag_rows<'a>(
    kernel: &'static str,
    len: u64,
    flag_index: *const i32,
    n_det: u64,
    n_samp: u64,
) -> Result<&'a [i32], ArgError> {
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: forwarded contract (det_flags present).
    let fi = unsafe { host(kernel, "flag_index", flag_index, n_det)? };
    sample_rows(
        kernel,
        "det_flags",
        len,
        n_samp,
        1,
        "[n_flag_rows, n_samp]",
        "flag_index",
        fi,
    )?;
    Ok(fi)
}

/// A host array of `n` elements that must be present (non-null) when `n > 0`.
///
/// # Safety
/// As [`host_slice`].
unsafe fn host<'a, T>(
    kernel: &'static str,
    arg: &'static str,
    ptr: *const T,
    n: u64,
) -> Result<&'a [T], ArgError> {
    // SAFETY: forwarded contract.
    unsafe { host_slice(kernel, arg, ptr, n) }
}

/// Check a `TOAST_DTYPE_*` code.
pub fn map_dtype(kernel: &'static str, arg: &'static str, dtype: i32) -> Result<(), ArgError> {
    match dtype {
        abi::DTYPE_F64 | abi::DTYPE_F32 | abi::DTYPE_I64 | abi::DTYPE_I32 => Ok(()),
        d => Err(ArgError::new(
            kernel,
            arg,
            format!("unknown map dtype {d} (expected 0 f64, 1 f32, 2 i64 or 3 i32)"),
        )),
    }
}

/// Check the size of a map of `n_pix_submap` pixels per submap and `nnz`
/// values per pixel, returning the number of local submaps.
fn local_submaps(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    n_pix_submap: i64,
    nnz: u64,
) -> Result<u64, ArgError> {
    if n_pix_submap <= 0 {
        return Err(ArgError::new(
            kernel,
            "n_pix_submap",
            format!("n_pix_submap = {n_pix_submap} must be > 0"),
        ));
    }
    let per_submap = mul(kernel, arg, n_pix_submap as u64, nnz)?;
    if !len.is_multiple_of(per_submap) {
        return Err(ArgError::new(
            kernel,
            arg,
            format!(
                "length {len} is not n_local_submap x n_pix_submap ({n_pix_submap}) x nnz ({nnz}) for any n_local_submap"
            ),
        ));
    }
    Ok(len / per_submap)
}

/// Check the entries of `global2local` lie in `[-1, n_local_submap)`.
///
/// `global2local` is a kernel array (possibly device memory), so this is not
/// part of `check_scan_map` / `check_build_noise_weighted`: a backend calls it
/// on a host-visible copy before its kernel reads the map.
pub fn global2local(
    kernel: &'static str,
    g2l: &[i64],
    n_local_submap: u64,
) -> Result<(), ArgError> {
    for (g, &l) in g2l.iter().enumerate() {
        if l < -1 || (l >= 0 && l as u64 >= n_local_submap) {
            return Err(ArgError::new(
                kernel,
                "global2local",
                format!(
                    "global2local[{g}] = {l} is neither -1 nor a local submap in [0, n_local_submap = {n_local_submap})"
                ),
            ));
        }
    }
    Ok(())
}

/// Check `nnz >= 1`.
fn nnz(kernel: &'static str, nnz: u64) -> Result<(), ArgError> {
    if nnz == 0 {
        return Err(ArgError::new(kernel, "nnz", "nnz = 0, must be >= 1"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Per-kernel checks. Each returns the host-side views and derived sizes the
// kernel needs; none reads a kernel array (`abi::Array`), which may live on a
// device.
// ---------------------------------------------------------------------------

/// Validated `pointing_detector` arguments.
#[derive(Debug, Clone, Copy)]
pub struct PointingDetector<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    /// Rows of `quats`.
    pub n_rows: usize,
    pub quat_index: &'a [i32],
    /// `[n_det, 4]`.
    pub focalplane: &'a [f64],
    pub intervals: &'a [SampleRange],
    pub use_flags: bool,
}

/// Check the arguments of `pointing_detector`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_pointing_detector<'a>(
    a: &abi::PointingDetectorArgs,
) -> Result<PointingDetector<'a>, ArgError> {
    const K: &str = "pointing_detector";
    // SAFETY: host arrays of n_det (and n_det*4) elements by the caller's contract.
    let quat_index = unsafe { host(K, "quat_index", a.quat_index, a.n_det)? };
    let fp_len = mul(K, "focalplane", a.n_det, 4)?;
    // SAFETY: the caller guarantees `a.focalplane` points to n_det * 4 (= fp_len) host
    // doubles (header: `host [n_det, 4]`); `host` refuses a null pointer.
    let focalplane = unsafe { host(K, "focalplane", a.focalplane, fp_len)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    exact_len(
        K,
        "boresight",
        a.boresight.len,
        mul(K, "boresight", a.n_samp, 4)?,
        "n_samp x 4",
    )?;
    let use_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    let n_rows = sample_rows(
        K,
        "quats",
        a.quats.len,
        a.n_samp,
        4,
        "[n_rows, n_samp, 4]",
        "quat_index",
        quat_index,
    )?;
    Ok(PointingDetector {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        n_rows: n_rows as usize,
        quat_index,
        focalplane,
        intervals,
        use_flags,
    })
}

/// Largest accepted HEALPix `nside` (2^29: pixel numbers stay below 2^63).
pub const MAX_NSIDE: i64 = 1 << 29;

/// Validated `pixels_healpix` arguments.
#[derive(Debug, Clone, Copy)]
pub struct PixelsHealpix<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub quat_index: &'a [i32],
    pub pixel_index: &'a [i32],
    pub intervals: &'a [SampleRange],
    pub use_flags: bool,
    /// log2(nside).
    pub factor: u32,
    /// 12 nside^2.
    pub npix: i64,
    /// Length of `hit_submaps`.
    pub n_submap: usize,
    /// The pixels are i32 (ABI minor 8, the compact pointing), else i64.
    pub pixels_i32: bool,
}

/// Check the arguments of `pixels_healpix`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_pixels_healpix<'a>(
    a: &abi::PixelsHealpixArgs,
) -> Result<PixelsHealpix<'a>, ArgError> {
    const K: &str = "pixels_healpix";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let quat_index = unsafe { host(K, "quat_index", a.quat_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.pixel_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let pixel_index = unsafe { host(K, "pixel_index", a.pixel_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    if a.nside < 1 || a.nside > MAX_NSIDE || (a.nside & (a.nside - 1)) != 0 {
        return Err(ArgError::new(
            K,
            "nside",
            format!("nside = {} is not a power of two in [1, 2^29]", a.nside),
        ));
    }
    let factor = a.nside.trailing_zeros();
    let npix = 12 * a.nside * a.nside;
    if a.n_pix_submap <= 0 {
        return Err(ArgError::new(
            K,
            "n_pix_submap",
            format!("n_pix_submap = {} must be > 0", a.n_pix_submap),
        ));
    }
    let covered = (a.hit_submaps.len as u128) * (a.n_pix_submap as u128);
    if covered < npix as u128 {
        return Err(ArgError::new(
            K,
            "hit_submaps",
            format!(
                "length {} x n_pix_submap {} = {covered} pixels does not cover the 12 nside^2 = {npix} pixels of nside {}",
                a.hit_submaps.len, a.n_pix_submap, a.nside
            ),
        ));
    }
    let pixels_i32 = match a.pixels_i32 {
        0 => false,
        1 if npix <= i64::from(i32::MAX) => true,
        1 => {
            return Err(ArgError::new(
                K,
                "pixels_i32",
                format!(
                    "i32 pixels cannot hold the 12 nside^2 = {npix} pixels of nside {}",
                    a.nside
                ),
            ))
        }
        v => {
            return Err(ArgError::new(
                K,
                "pixels_i32",
                format!("pixels_i32 = {v} is neither 0 (i64 pixels) nor 1 (i32 pixels)"),
            ))
        }
    };
    let use_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    sample_rows(
        K,
        "quats",
        a.quats.len,
        a.n_samp,
        4,
        "[n_rows, n_samp, 4]",
        "quat_index",
        quat_index,
    )?;
    sample_rows(
        K,
        "pixels",
        a.pixels.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "pixel_index",
        pixel_index,
    )?;
    Ok(PixelsHealpix {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        quat_index,
        pixel_index,
        intervals,
        use_flags,
        factor,
        npix,
        n_submap: a.hit_submaps.len as usize,
        pixels_i32,
    })
}

/// Validated `stokes_weights_I` arguments.
#[derive(Debug, Clone, Copy)]
pub struct StokesWeightsI<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub weight_index: &'a [i32],
    pub cal: &'a [f64],
    pub intervals: &'a [SampleRange],
}

/// Check the arguments of `stokes_weights_I`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_stokes_weights_i<'a>(
    a: &abi::StokesWeightsIArgs,
) -> Result<StokesWeightsI<'a>, ArgError> {
    const K: &str = "stokes_weights_I";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let weight_index = unsafe { host(K, "weight_index", a.weight_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.cal` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let cal = unsafe { host(K, "cal", a.cal, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    sample_rows(
        K,
        "weights",
        a.weights.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "weight_index",
        weight_index,
    )?;
    Ok(StokesWeightsI {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        weight_index,
        cal,
        intervals,
    })
}

/// Validated `stokes_weights_IQU` arguments.
#[derive(Debug, Clone, Copy)]
pub struct StokesWeightsIqu<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub quat_index: &'a [i32],
    pub weight_index: &'a [i32],
    pub epsilon: &'a [f64],
    pub gamma: &'a [f64],
    pub cal: &'a [f64],
    pub intervals: &'a [SampleRange],
    pub use_hwp: bool,
}

/// Check the arguments of `stokes_weights_IQU`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_stokes_weights_iqu<'a>(
    a: &abi::StokesWeightsIquArgs,
) -> Result<StokesWeightsIqu<'a>, ArgError> {
    const K: &str = "stokes_weights_IQU";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let quat_index = unsafe { host(K, "quat_index", a.quat_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.weight_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let weight_index = unsafe { host(K, "weight_index", a.weight_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.epsilon` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let epsilon = unsafe { host(K, "epsilon", a.epsilon, a.n_det)? };
    // SAFETY: the caller guarantees `a.gamma` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let gamma = unsafe { host(K, "gamma", a.gamma, a.n_det)? };
    // SAFETY: the caller guarantees `a.cal` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let cal = unsafe { host(K, "cal", a.cal, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let use_hwp = optional_len(K, "hwp", a.hwp.len, a.n_samp, "n_samp")?;
    sample_rows(
        K,
        "quats",
        a.quats.len,
        a.n_samp,
        4,
        "[n_rows, n_samp, 4]",
        "quat_index",
        quat_index,
    )?;
    sample_rows(
        K,
        "weights",
        a.weights.len,
        a.n_samp,
        3,
        "[n_rows, n_samp, 3]",
        "weight_index",
        weight_index,
    )?;
    Ok(StokesWeightsIqu {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        quat_index,
        weight_index,
        epsilon,
        gamma,
        cal,
        intervals,
        use_hwp,
    })
}

/// Validated `scan_map` arguments.
#[derive(Debug, Clone, Copy)]
pub struct ScanMap<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub nnz: usize,
    pub pixel_index: &'a [i32],
    pub weight_index: &'a [i32],
    pub data_index: &'a [i32],
    pub intervals: &'a [SampleRange],
    pub n_pix_submap: i64,
    pub n_global_submap: usize,
    pub n_local_submap: usize,
}

/// Check the arguments of `scan_map` (not the entries of `global2local`:
/// see [`global2local`]).
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_scan_map<'a>(a: &abi::ScanMapArgs) -> Result<ScanMap<'a>, ArgError> {
    const K: &str = "scan_map";
    nnz(K, a.nnz)?;
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let pixel_index = unsafe { host(K, "pixel_index", a.pixel_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.weight_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let weight_index = unsafe { host(K, "weight_index", a.weight_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.data_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    map_dtype(K, "map_dtype", a.map_dtype)?;
    let n_local_submap = local_submaps(K, "mapdata", a.mapdata.len, a.n_pix_submap, a.nnz)?;
    sample_rows(
        K,
        "pixels",
        a.pixels.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "pixel_index",
        pixel_index,
    )?;
    sample_rows(
        K,
        "weights",
        a.weights.len,
        a.n_samp,
        a.nnz,
        "[n_rows, n_samp, nnz]",
        "weight_index",
        weight_index,
    )?;
    sample_rows(
        K,
        "det_data",
        a.det_data.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "data_index",
        data_index,
    )?;
    Ok(ScanMap {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        nnz: a.nnz as usize,
        pixel_index,
        weight_index,
        data_index,
        intervals,
        n_pix_submap: a.n_pix_submap,
        n_global_submap: a.global2local.len as usize,
        n_local_submap: n_local_submap as usize,
    })
}

/// Validated `build_noise_weighted` arguments.
#[derive(Debug, Clone, Copy)]
pub struct BuildNoiseWeighted<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub nnz: usize,
    pub pixel_index: &'a [i32],
    pub weight_index: &'a [i32],
    pub data_index: &'a [i32],
    /// Empty when `det_flags` is absent.
    pub flag_index: &'a [i32],
    pub det_scale: &'a [f64],
    pub intervals: &'a [SampleRange],
    pub n_pix_submap: i64,
    pub n_global_submap: usize,
    pub n_local_submap: usize,
    pub use_det_flags: bool,
    pub use_shared_flags: bool,
}

/// Check the arguments of `build_noise_weighted` (not the entries of
/// `global2local`: see [`global2local`]).
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_build_noise_weighted<'a>(
    a: &abi::BuildNoiseWeightedArgs,
) -> Result<BuildNoiseWeighted<'a>, ArgError> {
    const K: &str = "build_noise_weighted";
    nnz(K, a.nnz)?;
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let pixel_index = unsafe { host(K, "pixel_index", a.pixel_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.weight_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let weight_index = unsafe { host(K, "weight_index", a.weight_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.data_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.det_scale` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let det_scale = unsafe { host(K, "det_scale", a.det_scale, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let n_local_submap = local_submaps(K, "zmap", a.zmap.len, a.n_pix_submap, a.nnz)?;
    sample_rows(
        K,
        "pixels",
        a.pixels.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "pixel_index",
        pixel_index,
    )?;
    sample_rows(
        K,
        "weights",
        a.weights.len,
        a.n_samp,
        a.nnz,
        "[n_rows, n_samp, nnz]",
        "weight_index",
        weight_index,
    )?;
    sample_rows(
        K,
        "det_data",
        a.det_data.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "data_index",
        data_index,
    )?;
    let use_shared_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    let use_det_flags = a.det_flags.len != 0;
    // SAFETY: the caller guarantees `a.flag_index` points to n_det host
    // i32s when det_flags is present (header: read only then).
    let flag_index = unsafe { det_flag_rows(K, a.det_flags.len, a.flag_index, a.n_det, a.n_samp)? };
    Ok(BuildNoiseWeighted {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        nnz: a.nnz as usize,
        pixel_index,
        weight_index,
        data_index,
        flag_index,
        det_scale,
        intervals,
        n_pix_submap: a.n_pix_submap,
        n_global_submap: a.global2local.len as usize,
        n_local_submap: n_local_submap as usize,
        use_det_flags,
        use_shared_flags,
    })
}

/// Validated `noise_weight` arguments.
#[derive(Debug, Clone, Copy)]
pub struct NoiseWeight<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub data_index: &'a [i32],
    pub detector_weights: &'a [f64],
    pub intervals: &'a [SampleRange],
}

/// Check the arguments of `noise_weight`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_noise_weight<'a>(
    a: &abi::NoiseWeightArgs,
) -> Result<NoiseWeight<'a>, ArgError> {
    const K: &str = "noise_weight";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.detector_weights` points to n_det host f64s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let detector_weights = unsafe { host(K, "detector_weights", a.detector_weights, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    sample_rows(
        K,
        "det_data",
        a.det_data.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "data_index",
        data_index,
    )?;
    Ok(NoiseWeight {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        data_index,
        detector_weights,
        intervals,
    })
}

/// The validated amplitude layout of an offset-template call.
#[derive(Debug, Clone)]
pub struct OffsetLayout<'a> {
    pub step_length: i64,
    /// `[n_det]`, each >= 0.
    pub amp_offset: &'a [i64],
    /// `[n_view]`: first amplitude of each view inside a detector's block.
    pub view_offset: Vec<i64>,
    /// `[n_view]`.
    pub n_amp_views: &'a [i64],
    /// Amplitudes of one detector's block (sum of `n_amp_views`).
    pub block_len: i64,
}

/// Check an offset-template layout against `intervals` and `n_amp`.
///
/// # Safety
/// `l.n_amp_views` must point to `intervals.len()` elements and
/// `l.amp_offset` to `n_det` elements.
unsafe fn offset_layout<'a>(
    kernel: &'static str,
    l: &abi::OffsetLayout,
    intervals: &[SampleRange],
    n_det: u64,
    n_amp: u64,
) -> Result<OffsetLayout<'a>, ArgError> {
    if l.step_length < 1 {
        return Err(ArgError::new(
            kernel,
            "layout.step_length",
            format!("step_length = {} must be >= 1", l.step_length),
        ));
    }
    if intervals.is_empty() {
        return Err(ArgError::new(
            kernel,
            "intervals",
            "template-offset call with no views (n_view = 0; TOAST's behaviour is undefined)",
        ));
    }
    // SAFETY: n_view elements by the caller's contract.
    let n_amp_views = unsafe {
        host(
            kernel,
            "layout.n_amp_views",
            l.n_amp_views,
            intervals.len() as u64,
        )?
    };
    // SAFETY: n_det elements by the caller's contract.
    let amp_offset = unsafe { host(kernel, "layout.amp_offset", l.amp_offset, n_det)? };
    let mut view_offset = Vec::with_capacity(intervals.len());
    let mut total: i64 = 0;
    for (v, (iv, &n)) in intervals.iter().zip(n_amp_views).enumerate() {
        let len = iv.last - iv.first;
        let need = len / l.step_length + i64::from(len % l.step_length != 0);
        if n < need || n < 0 {
            return Err(ArgError::new(
                kernel,
                "layout.n_amp_views",
                format!(
                    "n_amp_views[{v}] = {n}, but view {v} = [{}, {}) needs ceil({len} / step_length {}) = {need} amplitudes",
                    iv.first, iv.last, l.step_length
                ),
            ));
        }
        view_offset.push(total);
        total = total.checked_add(n).ok_or_else(|| {
            ArgError::new(
                kernel,
                "layout.n_amp_views",
                "the sum of n_amp_views overflows 64 bits",
            )
        })?;
    }
    for (i, &off) in amp_offset.iter().enumerate() {
        let end = off.checked_add(total);
        if off < 0 || end.is_none_or(|e| e as u64 > n_amp) {
            return Err(ArgError::new(
                kernel,
                "layout.amp_offset",
                format!(
                    "amp_offset[{i}] = {off}: the detector's block [{off}, {off} + {total}) is not inside amplitudes [0, n_amp = {n_amp})"
                ),
            ));
        }
    }
    Ok(OffsetLayout {
        step_length: l.step_length,
        amp_offset,
        view_offset,
        n_amp_views,
        block_len: total,
    })
}

/// Validated `template_offset_add_to_signal` arguments.
#[derive(Debug, Clone)]
pub struct TemplateOffsetAdd<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub n_amp: usize,
    pub data_index: &'a [i32],
    pub intervals: &'a [SampleRange],
    pub layout: OffsetLayout<'a>,
}

/// Check the arguments of `template_offset_add_to_signal`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_template_offset_add<'a>(
    a: &abi::TemplateOffsetAddArgs,
) -> Result<TemplateOffsetAdd<'a>, ArgError> {
    const K: &str = "template_offset_add_to_signal";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let n_amp = a.amplitudes.len;
    exact_len(
        K,
        "amplitude_flags",
        a.amplitude_flags.len,
        n_amp,
        "n_amp, the length of amplitudes",
    )?;
    // SAFETY: the caller guarantees `a.layout.n_amp_views` has n_view = `intervals.len()`
    // elements and `a.layout.amp_offset` n_det (header: `host [n_view]`, `host [n_det]`),
    // as `offset_layout` requires; `intervals` is the slice just checked.
    let layout = unsafe { offset_layout(K, &a.layout, intervals, a.n_det, n_amp)? };
    sample_rows(
        K,
        "det_data",
        a.det_data.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "data_index",
        data_index,
    )?;
    Ok(TemplateOffsetAdd {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        n_amp: n_amp as usize,
        data_index,
        intervals,
        layout,
    })
}

/// Validated `template_offset_project_signal` arguments.
#[derive(Debug, Clone)]
pub struct TemplateOffsetProject<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub n_amp: usize,
    pub data_index: &'a [i32],
    /// `-1` for a detector without flags.
    pub flag_index: &'a [i32],
    pub intervals: &'a [SampleRange],
    pub layout: OffsetLayout<'a>,
}

/// Check the arguments of `template_offset_project_signal`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_template_offset_project<'a>(
    a: &abi::TemplateOffsetProjectArgs,
) -> Result<TemplateOffsetProject<'a>, ArgError> {
    const K: &str = "template_offset_project_signal";
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.flag_index` points to n_det host i32s
    // (header: `host [n_det]`); `host` refuses a null pointer.
    let flag_index = unsafe { host(K, "flag_index", a.flag_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to `a.intervals.len`
    // host intervals, as `intervals` requires; it refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let n_amp = a.amplitudes.len;
    exact_len(
        K,
        "amplitude_flags",
        a.amplitude_flags.len,
        n_amp,
        "n_amp, the length of amplitudes",
    )?;
    // SAFETY: the caller guarantees `a.layout.n_amp_views` has n_view = `intervals.len()`
    // elements and `a.layout.amp_offset` n_det (header: `host [n_view]`, `host [n_det]`),
    // as `offset_layout` requires; `intervals` is the slice just checked.
    let layout = unsafe { offset_layout(K, &a.layout, intervals, a.n_det, n_amp)? };
    sample_rows(
        K,
        "det_data",
        a.det_data.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "data_index",
        data_index,
    )?;
    // flag_index: -1 (no flags) or a row of flag_data, which must then be present.
    let n_flag_rows = if a.flag_data.len == 0 {
        0
    } else {
        let row_len = a.n_samp;
        if row_len == 0 {
            return Err(ArgError::new(
                K,
                "flag_data",
                format!("length {}, but n_samp = 0", a.flag_data.len),
            ));
        }
        rows(
            K,
            "flag_data",
            a.flag_data.len,
            row_len,
            "[n_flag_rows, n_samp]",
        )?
    };
    for (i, &f) in flag_index.iter().enumerate() {
        if f < -1 {
            return Err(ArgError::new(
                K,
                "flag_index",
                format!("flag_index[{i}] = {f} is neither -1 (no flags) nor a row of flag_data"),
            ));
        }
        if f >= 0 && a.flag_data.len == 0 {
            return Err(ArgError::new(
                K,
                "flag_index",
                format!("flag_index[{i}] = {f} names a row of flag_data, but flag_data is absent"),
            ));
        }
        if f >= 0 && f as u64 >= n_flag_rows {
            return Err(ArgError::new(
                K,
                "flag_index",
                format!(
                    "flag_index[{i}] = {f} is not a row of flag_data, which has {n_flag_rows} rows"
                ),
            ));
        }
    }
    Ok(TemplateOffsetProject {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        n_amp: n_amp as usize,
        data_index,
        flag_index,
        intervals,
        layout,
    })
}

/// Check the arguments of `template_offset_apply_diag_precond`; returns n_amp.
///
/// # Safety
/// None beyond the other checks' (it reads no pointer); `unsafe` for
/// uniformity with them.
pub unsafe fn check_template_offset_precond(
    a: &abi::TemplateOffsetPrecondArgs,
) -> Result<usize, ArgError> {
    const K: &str = "template_offset_apply_diag_precond";
    exact_len(K, "offset_var", a.offset_var.len, a.n_amp, "n_amp")?;
    exact_len(K, "amplitudes_in", a.amplitudes_in.len, a.n_amp, "n_amp")?;
    exact_len(
        K,
        "amplitude_flags",
        a.amplitude_flags.len,
        a.n_amp,
        "n_amp",
    )?;
    exact_len(K, "amplitudes_out", a.amplitudes_out.len, a.n_amp, "n_amp")?;
    Ok(a.n_amp as usize)
}

/// Validated `cov_accum_diag_hits` / `cov_accum_diag_invnpp` arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CovAccum {
    /// Samples (the length of `submap` and `subpix`).
    pub n_samp: usize,
    /// Local submaps; `< 1`: the call does nothing (as TOAST).
    pub nsub: i64,
    pub nsubpix: i64,
    /// Elements per sample of `weights` (1 for hits, which ignores nnz).
    pub nnz: usize,
    /// Elements per pixel of the output (1, or `nnz (nnz + 1) / 2`).
    pub block: usize,
    /// Whether the call reads or writes anything (`nsub >= 1`).
    pub active: bool,
}

/// The checks both covariance kernels share: the sample arrays, and, for an
/// active call, `nsubpix` and the output's length `nsub * nsubpix * block`.
fn cov_common(
    kernel: &'static str,
    nsub: i64,
    nsubpix: i64,
    submap: u64,
    subpix: u64,
    (out_name, out_len): (&'static str, u64),
    block: u64,
) -> Result<(), ArgError> {
    exact_len(kernel, "subpix", subpix, submap, "n_samp, as submap")?;
    if nsub < 1 {
        return Ok(());
    }
    if nsubpix < 1 {
        return Err(ArgError::new(
            kernel,
            "nsubpix",
            format!("nsubpix = {nsubpix}, must be positive"),
        ));
    }
    let npix = mul(kernel, out_name, nsub as u64, nsubpix as u64)?;
    let want = mul(kernel, out_name, npix, block)?;
    exact_len(
        kernel,
        out_name,
        out_len,
        want,
        "nsub * nsubpix * per-pixel block",
    )
}

/// Check the arguments of `cov_accum_diag_hits`.
///
/// # Safety
/// None (it reads no pointer); `unsafe` for uniformity with the others.
pub unsafe fn check_cov_accum_diag_hits(
    a: &abi::CovAccumDiagHitsArgs,
) -> Result<CovAccum, ArgError> {
    const K: &str = "cov_accum_diag_hits";
    cov_common(
        K,
        a.nsub,
        a.nsubpix,
        a.submap.len,
        a.subpix.len,
        ("hits", a.hits.len),
        1,
    )?;
    Ok(CovAccum {
        n_samp: a.submap.len as usize,
        nsub: a.nsub,
        nsubpix: a.nsubpix,
        nnz: 1,
        block: 1,
        active: a.nsub >= 1,
    })
}

/// Check the arguments of `cov_accum_diag_invnpp`.
///
/// # Safety
/// None (it reads no pointer); `unsafe` for uniformity with the others.
pub unsafe fn check_cov_accum_diag_invnpp(
    a: &abi::CovAccumDiagInvnppArgs,
) -> Result<CovAccum, ArgError> {
    const K: &str = "cov_accum_diag_invnpp";
    let active = a.nsub >= 1;
    if active && !(1..=(1 << 16)).contains(&a.nnz) {
        return Err(ArgError::new(
            K,
            "nnz",
            format!("nnz = {}, must be in [1, 65536]", a.nnz),
        ));
    }
    let nnz = a.nnz.max(1) as u64;
    let block = nnz * (nnz + 1) / 2;
    cov_common(
        K,
        a.nsub,
        a.nsubpix,
        a.submap.len,
        a.subpix.len,
        ("invnpp", a.invnpp.len),
        block,
    )?;
    if active {
        let want = mul(K, "weights", a.submap.len, nnz)?;
        exact_len(K, "weights", a.weights.len, want, "[n_samp, nnz]")?;
    }
    Ok(CovAccum {
        n_samp: a.submap.len as usize,
        nsub: a.nsub,
        nsubpix: a.nsubpix,
        nnz: nnz as usize,
        block: block as usize,
        active,
    })
}

/// The most templates one fit of the polynomial filters may have
/// (`filter_polynomial`'s order + 1, `filter_poly2D`'s `n_mode`): it bounds
/// the memory of a call (a fit of `n` templates works on two `n x n`
/// matrices; the devices hold them in a workspace, `toast-gpu`), far above
/// TOAST's uses (its tests fit 64 modes).
pub const MAX_POLY_TEMPLATES: u64 = 1024;

/// Validated `filter_polynomial` arguments.
#[derive(Debug, Clone, Copy)]
pub struct FilterPolynomial<'a> {
    pub n_signal: usize,
    pub n_samp: usize,
    pub order: i64,
    pub signal_index: &'a [i32],
    pub starts: &'a [i64],
    pub stops: &'a [i64],
}

/// Check the arguments of `filter_polynomial`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_filter_polynomial<'a>(
    a: &abi::FilterPolynomialArgs,
) -> Result<FilterPolynomial<'a>, ArgError> {
    const K: &str = "filter_polynomial";
    // SAFETY: host arrays of n_signal / n_scan elements by the caller's contract.
    let signal_index = unsafe { host(K, "signal_index", a.signal_index, a.n_signal)? };
    // SAFETY: the caller guarantees `a.starts` points to n_scan host i64s
    // (header: `host [n_scan]`); `host` refuses a null pointer.
    let starts = unsafe { host(K, "starts", a.starts, a.n_scan)? };
    // SAFETY: the caller guarantees `a.stops` points to n_scan host i64s
    // (header: `host [n_scan]`); `host` refuses a null pointer.
    let stops = unsafe { host(K, "stops", a.stops, a.n_scan)? };
    exact_len(K, "flags", a.flags.len, a.n_samp, "n_samp")?;
    sample_rows(
        K,
        "signals",
        a.signals.len,
        a.n_samp,
        1,
        "[n_rows, n_samp]",
        "signal_index",
        signal_index,
    )?;
    if a.order >= MAX_POLY_TEMPLATES as i64 {
        return Err(ArgError::new(
            K,
            "order",
            format!(
                "order {} needs more than the {MAX_POLY_TEMPLATES} templates a fit may have",
                a.order
            ),
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(signal_index.len());
    if let Some((i, r)) = signal_index
        .iter()
        .enumerate()
        .find(|(_, r)| !seen.insert(**r))
    {
        return Err(ArgError::new(
            K,
            "signal_index",
            format!("signal_index[{i}] = {r} repeats a row (each signal is filtered once)"),
        ));
    }
    Ok(FilterPolynomial {
        n_signal: a.n_signal as usize,
        n_samp: a.n_samp as usize,
        order: a.order,
        signal_index,
        starts,
        stops,
    })
}

/// Validated `filter_poly2D` arguments.
#[derive(Debug, Clone, Copy)]
pub struct FilterPoly2d<'a> {
    pub n_samp: usize,
    pub n_det: usize,
    pub n_group: usize,
    pub n_mode: usize,
    pub det_groups: &'a [i32],
    pub templates: &'a [f64],
}

/// Check the arguments of `filter_poly2D`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_filter_poly2d<'a>(
    a: &abi::FilterPoly2dArgs,
) -> Result<FilterPoly2d<'a>, ArgError> {
    const K: &str = "filter_poly2D";
    // SAFETY: host array of n_det elements by the caller's contract.
    let det_groups = unsafe { host(K, "det_groups", a.det_groups, a.n_det)? };
    if a.n_mode > MAX_POLY_TEMPLATES {
        return Err(ArgError::new(
            K,
            "n_mode",
            format!(
                "{} modes is more than the {MAX_POLY_TEMPLATES} templates a fit may have",
                a.n_mode
            ),
        ));
    }
    let n_templates = mul(K, "templates", a.n_det, a.n_mode)?;
    // SAFETY: host array of n_det * n_mode elements by the caller's contract.
    let templates = unsafe { host(K, "templates", a.templates, n_templates)? };
    if let Some((i, g)) = det_groups
        .iter()
        .enumerate()
        .find(|(_, &g)| g >= 0 && g as u64 >= a.n_group)
    {
        return Err(ArgError::new(
            K,
            "det_groups",
            format!(
                "det_groups[{i}] = {g} is not a group (n_group = {})",
                a.n_group
            ),
        ));
    }
    let n = mul(K, "signals", a.n_samp, a.n_det)?;
    exact_len(K, "signals", a.signals.len, n, "[n_samp, n_det]")?;
    exact_len(K, "masks", a.masks.len, n, "[n_samp, n_det]")?;
    let c = mul(K, "coeff", a.n_samp, a.n_group)?;
    let c = mul(K, "coeff", c, a.n_mode)?;
    exact_len(K, "coeff", a.coeff.len, c, "[n_samp, n_group, n_mode]")?;
    Ok(FilterPoly2d {
        n_samp: a.n_samp as usize,
        n_det: a.n_det as usize,
        n_group: a.n_group as usize,
        n_mode: a.n_mode as usize,
        det_groups,
        templates,
    })
}

/// The most map components `cov_apply_diag` takes (the devices keep one
/// pixel's product in a fixed array of this size).
pub const COV_APPLY_MAX_NNZ: i64 = crate::math::COV_MAX_NNZ as i64;

/// Validated `cov_apply_diag` arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CovApply {
    /// Local pixels (`nsub * nsubpix`; 0 when inactive).
    pub n_pix: usize,
    /// Map components.
    pub nnz: usize,
    /// Elements per pixel of `mat` (`nnz (nnz + 1) / 2`).
    pub block: usize,
    /// Whether the call reads or writes anything (`nsub >= 1`, as TOAST).
    pub active: bool,
}

/// Check the arguments of `cov_apply_diag`: for an active call
/// (`nsub >= 1`), `nsubpix >= 1`, `1 <= nnz <= 16`, `mat` of
/// `nsub * nsubpix * nnz (nnz + 1) / 2` and `vec` of `nsub * nsubpix * nnz`
/// elements.
///
/// # Safety
/// None (it reads no pointer); `unsafe` for uniformity with the others.
pub unsafe fn check_cov_apply_diag(a: &abi::CovApplyDiagArgs) -> Result<CovApply, ArgError> {
    const K: &str = "cov_apply_diag";
    if a.nsub < 1 {
        return Ok(CovApply {
            n_pix: 0,
            nnz: 0,
            block: 0,
            active: false,
        });
    }
    if a.nsubpix < 1 {
        return Err(ArgError::new(
            K,
            "nsubpix",
            format!("nsubpix = {}, must be positive", a.nsubpix),
        ));
    }
    if !(1..=COV_APPLY_MAX_NNZ).contains(&a.nnz) {
        return Err(ArgError::new(
            K,
            "nnz",
            format!("nnz = {}, must be in [1, {COV_APPLY_MAX_NNZ}]", a.nnz),
        ));
    }
    let nnz = a.nnz as u64;
    let block = nnz * (nnz + 1) / 2;
    let npix = mul(K, "vec", a.nsub as u64, a.nsubpix as u64)?;
    let want = mul(K, "mat", npix, block)?;
    exact_len(
        K,
        "mat",
        a.mat.len,
        want,
        "nsub * nsubpix * nnz (nnz + 1) / 2",
    )?;
    let want = mul(K, "vec", npix, nnz)?;
    exact_len(K, "vec", a.vec.len, want, "nsub * nsubpix * nnz")?;
    Ok(CovApply {
        n_pix: npix as usize,
        nnz: nnz as usize,
        block: block as usize,
        active: true,
    })
}

/// The most partial sums `amp_dot` writes (the host downloads them every
/// PCG dot product, so a few KiB at most).
pub const AMP_DOT_MAX_BLOCKS: i64 = 4096;

/// Validated `amp_dot` arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AmpDot {
    /// Entries.
    pub n: usize,
    /// Partial sums (blocks).
    pub nblock: usize,
    /// Entries per block (`ceil(n / nblock)`; 0 when `n == 0`).
    pub chunk: usize,
}

/// Check the arguments of `amp_dot`: `n >= 0`, `1 <= nblock <=`
/// [`AMP_DOT_MAX_BLOCKS`], `a`, `b` and `flags` of `n` elements, `partials`
/// of `nblock`.
///
/// # Safety
/// None (it reads no pointer); `unsafe` for uniformity with the others.
pub unsafe fn check_amp_dot(a: &abi::AmpDotArgs) -> Result<AmpDot, ArgError> {
    const K: &str = "amp_dot";
    if a.n < 0 {
        return Err(ArgError::new(
            K,
            "n",
            format!("n = {}, must not be negative", a.n),
        ));
    }
    if !(1..=AMP_DOT_MAX_BLOCKS).contains(&a.nblock) {
        return Err(ArgError::new(
            K,
            "nblock",
            format!(
                "nblock = {}, must be in [1, {AMP_DOT_MAX_BLOCKS}]",
                a.nblock
            ),
        ));
    }
    let n = a.n as u64;
    exact_len(K, "a", a.a.len, n, "n")?;
    exact_len(K, "b", a.b.len, n, "n")?;
    exact_len(K, "flags", a.flags.len, n, "n")?;
    exact_len(K, "partials", a.partials.len, a.nblock as u64, "nblock")?;
    let nblock = a.nblock as usize;
    Ok(AmpDot {
        n: n as usize,
        nblock,
        chunk: (n as usize).div_ceil(nblock),
    })
}

/// Check the arguments of `amp_axpby`: `n >= 0`, `x` and `y` of `n`
/// elements; returns `n`.
///
/// # Safety
/// None (it reads no pointer); `unsafe` for uniformity with the others.
pub unsafe fn check_amp_axpby(a: &abi::AmpAxpbyArgs) -> Result<usize, ArgError> {
    const K: &str = "amp_axpby";
    if a.n < 0 {
        return Err(ArgError::new(
            K,
            "n",
            format!("n = {}, must not be negative", a.n),
        ));
    }
    exact_len(K, "x", a.x.len, a.n as u64, "n")?;
    exact_len(K, "y", a.y.len, a.n as u64, "n")?;
    Ok(a.n as usize)
}

#[cfg(test)]
mod tests {
    //! One test per validation rule; each asserts the error names the argument.
    use super::*;
    use crate::abi::Array;

    fn arr<T>(v: &[T]) -> Array {
        Array {
            ptr: v.as_ptr() as u64,
            len: v.len() as u64,
        }
    }

    fn ivs(v: &[SampleRange]) -> SampleRanges {
        SampleRanges {
            ptr: v.as_ptr(),
            len: v.len() as u64,
        }
    }

    fn iv(first: i64, last: i64) -> SampleRange {
        SampleRange { first, last }
    }

    /// Assert `r` is an error about argument `arg` whose message contains `needle`.
    fn expect_err<T: std::fmt::Debug>(r: Result<T, ArgError>, arg: &str, needle: &str) {
        let e = r.expect_err("the check should fail");
        assert_eq!(e.arg, arg, "wrong argument in: {e}");
        let s = e.to_string();
        assert!(
            s.contains(&format!("`{arg}`")),
            "message does not name `{arg}`: {s}"
        );
        assert!(s.contains(needle), "message lacks {needle:?}: {s}");
    }

    const S: usize = 10;

    /// A valid pointing_detector call: 2 detectors, 3 quats rows.
    struct Pd {
        qi: Vec<i32>,
        fp: Vec<f64>,
        iv: Vec<SampleRange>,
        bore: Vec<f64>,
        flags: Vec<u8>,
        quats: Vec<f64>,
    }
    impl Pd {
        fn new() -> Self {
            Pd {
                qi: vec![0, 2],
                fp: vec![0.0; 8],
                iv: vec![iv(0, 4), iv(6, 10)],
                bore: vec![0.0; S * 4],
                flags: vec![0; S],
                quats: vec![0.0; 3 * S * 4],
            }
        }
        fn args(&self) -> abi::PointingDetectorArgs {
            abi::PointingDetectorArgs {
                n_det: self.qi.len() as u64,
                n_samp: S as u64,
                quat_index: self.qi.as_ptr(),
                focalplane: self.fp.as_ptr(),
                intervals: ivs(&self.iv),
                boresight: arr(&self.bore),
                shared_flags: arr(&self.flags),
                shared_flag_mask: 1,
                reserved: [0; 7],
                quats: arr(&self.quats),
            }
        }
        fn check(&self) -> Result<PointingDetector<'_>, ArgError> {
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_pointing_detector(&self.args()) }
        }
    }

    #[test]
    fn valid_pointing_detector_passes() {
        let p = Pd::new();
        let v = p.check().unwrap();
        assert_eq!((v.n_det, v.n_samp, v.n_rows, v.use_flags), (2, S, 3, true));
    }

    #[test]
    fn interval_beyond_n_samp() {
        let mut p = Pd::new();
        p.iv[1] = iv(6, 11);
        expect_err(p.check(), "intervals", "[6, 11)");
    }

    #[test]
    fn interval_first_after_last() {
        let mut p = Pd::new();
        p.iv[0] = iv(5, 3);
        expect_err(p.check(), "intervals", "[5, 3)");
    }

    #[test]
    fn interval_negative_first() {
        let mut p = Pd::new();
        p.iv[0] = iv(-1, 3);
        expect_err(p.check(), "intervals", "[-1, 3)");
    }

    #[test]
    fn index_beyond_rows() {
        let mut p = Pd::new();
        p.qi[1] = 3;
        expect_err(p.check(), "quat_index", "quat_index[1] = 3");
    }

    #[test]
    fn negative_index() {
        let mut p = Pd::new();
        p.qi[0] = -1;
        expect_err(p.check(), "quat_index", "quat_index[0] = -1");
    }

    #[test]
    fn array_not_whole_rows() {
        let mut p = Pd::new();
        p.quats.pop();
        expect_err(p.check(), "quats", "not a whole number of rows");
    }

    #[test]
    fn required_array_wrong_length() {
        let mut p = Pd::new();
        p.bore.truncate(4 * (S - 1));
        expect_err(p.check(), "boresight", "expected 40");
    }

    #[test]
    fn optional_array_of_length_one_is_refused() {
        // TOAST's "length 1 disables the flags" is not part of the ABI.
        let mut p = Pd::new();
        p.flags = vec![0];
        expect_err(p.check(), "shared_flags", "length 1");
    }

    #[test]
    fn absent_optional_array_is_accepted() {
        let mut p = Pd::new();
        p.flags.clear();
        assert!(!p.check().unwrap().use_flags);
    }

    #[test]
    fn null_host_array() {
        let p = Pd::new();
        let mut a = p.args();
        a.focalplane = std::ptr::null();
        // SAFETY: the other pointers are valid; the null one is what is checked.
        expect_err(
            unsafe { check_pointing_detector(&a) },
            "focalplane",
            "null pointer",
        );
    }

    #[test]
    fn n_samp_zero_with_data() {
        let p = Pd::new();
        let mut a = p.args();
        a.n_samp = 0;
        a.intervals = ivs(&[]);
        a.boresight = Array::ABSENT;
        a.shared_flags = Array::ABSENT;
        // SAFETY: quat_index and focalplane still point into `p`'s live vectors of n_det = 2
        // and n_det * 4 = 8 elements, the intervals are empty, and the check reads no
        // kernel array.
        expect_err(
            unsafe { check_pointing_detector(&a) },
            "quats",
            "no elements",
        );
    }

    #[test]
    fn size_overflow() {
        let p = Pd::new();
        let mut a = p.args();
        a.n_samp = u64::MAX / 2;
        a.intervals = ivs(&[]);
        // SAFETY: quat_index and focalplane still point into `p`'s live vectors of n_det = 2
        // and n_det * 4 = 8 elements, the intervals are empty, and the check reads no
        // kernel array.
        expect_err(
            unsafe { check_pointing_detector(&a) },
            "boresight",
            "overflows",
        );
    }

    /// A valid pixels_healpix call, nside 4 (192 pixels), 12 submaps of 16.
    struct Ph {
        qi: Vec<i32>,
        pi: Vec<i32>,
        iv: Vec<SampleRange>,
        quats: Vec<f64>,
        pixels: Vec<i64>,
        hits: Vec<u8>,
        nside: i64,
        nps: i64,
        i32_out: u8,
    }
    impl Ph {
        fn new() -> Self {
            Ph {
                qi: vec![0],
                pi: vec![0],
                iv: vec![iv(0, S as i64)],
                quats: vec![0.0; S * 4],
                pixels: vec![0; S],
                hits: vec![0; 12],
                nside: 4,
                nps: 16,
                i32_out: 0,
            }
        }
        fn check(&self) -> Result<PixelsHealpix<'_>, ArgError> {
            let a = abi::PixelsHealpixArgs {
                n_det: 1,
                n_samp: S as u64,
                quat_index: self.qi.as_ptr(),
                pixel_index: self.pi.as_ptr(),
                intervals: ivs(&self.iv),
                quats: arr(&self.quats),
                shared_flags: Array::ABSENT,
                pixels: arr(&self.pixels),
                hit_submaps: arr(&self.hits),
                nside: self.nside,
                n_pix_submap: self.nps,
                shared_flag_mask: 0,
                nest: 1,
                pixels_i32: self.i32_out,
                reserved: [0; 5],
            };
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_pixels_healpix(&a) }
        }
    }

    #[test]
    fn valid_pixels_healpix_passes() {
        let f = Ph::new();
        let v = f.check().unwrap();
        assert_eq!((v.factor, v.npix, v.n_submap), (2, 192, 12));
    }

    #[test]
    fn i32_pixels_need_a_pixelization_that_fits() {
        let mut p = Ph::new();
        p.i32_out = 1;
        assert!(p.check().unwrap().pixels_i32);
        // nside 16384: 3.2e9 pixels, beyond i32 (the hit submaps cover them).
        p.nside = 1 << 14;
        p.nps = 12 << 20;
        p.hits = vec![0; 256];
        expect_err(
            p.check(),
            "pixels_i32",
            "cannot hold the 12 nside^2 = 3221225472",
        );
        p.nside = 1 << 13;
        assert!(p.check().unwrap().pixels_i32);
        p.i32_out = 2;
        expect_err(p.check(), "pixels_i32", "pixels_i32 = 2");
    }

    #[test]
    fn nside_not_power_of_two() {
        let mut p = Ph::new();
        p.nside = 6;
        expect_err(p.check(), "nside", "nside = 6");
        p.nside = 0;
        expect_err(p.check(), "nside", "nside = 0");
    }

    #[test]
    fn nside_too_large() {
        let mut p = Ph::new();
        p.nside = 1 << 30;
        expect_err(p.check(), "nside", "2^29");
    }

    #[test]
    fn n_pix_submap_not_positive() {
        let mut p = Ph::new();
        p.nps = 0;
        expect_err(p.check(), "n_pix_submap", "n_pix_submap = 0");
    }

    #[test]
    fn hit_submaps_too_short_for_the_sphere() {
        let mut p = Ph::new();
        p.hits.pop();
        expect_err(p.check(), "hit_submaps", "192");
    }

    /// A valid scan_map call: nnz 3, 4 global submaps, 2 local, 8 pixels each.
    struct Sm {
        idx: Vec<i32>,
        iv: Vec<SampleRange>,
        g2l: Vec<i64>,
        map: Vec<f64>,
        pixels: Vec<i64>,
        weights: Vec<f64>,
        data: Vec<f64>,
        nnz: u64,
        dtype: i32,
        nps: i64,
    }
    impl Sm {
        fn new() -> Self {
            Sm {
                idx: vec![0, 1],
                iv: vec![iv(0, S as i64)],
                g2l: vec![-1, 0, -1, 1],
                map: vec![0.0; 2 * 8 * 3],
                pixels: vec![8; 2 * S],
                weights: vec![0.0; 2 * S * 3],
                data: vec![0.0; 2 * S],
                nnz: 3,
                dtype: abi::DTYPE_F64,
                nps: 8,
            }
        }
        fn args(&self) -> abi::ScanMapArgs {
            abi::ScanMapArgs {
                n_det: 2,
                n_samp: S as u64,
                nnz: self.nnz,
                pixel_index: self.idx.as_ptr(),
                weight_index: self.idx.as_ptr(),
                data_index: self.idx.as_ptr(),
                intervals: ivs(&self.iv),
                global2local: arr(&self.g2l),
                n_pix_submap: self.nps,
                map_dtype: self.dtype,
                reserved0: 0,
                mapdata: arr(&self.map),
                pixels: arr(&self.pixels),
                weights: arr(&self.weights),
                det_data: arr(&self.data),
                data_scale: 1.0,
                should_zero: 0,
                should_subtract: 0,
                should_scale: 0,
                reserved: [0; 5],
            }
        }
        fn check(&self) -> Result<ScanMap<'_>, ArgError> {
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_scan_map(&self.args()) }
        }
    }

    #[test]
    fn valid_scan_map_passes() {
        let f = Sm::new();
        let v = f.check().unwrap();
        assert_eq!((v.n_local_submap, v.n_global_submap, v.nnz), (2, 4, 3));
    }

    #[test]
    fn unknown_map_dtype() {
        let mut s = Sm::new();
        s.dtype = 7;
        expect_err(s.check(), "map_dtype", "7");
    }

    #[test]
    fn nnz_zero() {
        let mut s = Sm::new();
        s.nnz = 0;
        expect_err(s.check(), "nnz", "nnz = 0");
    }

    #[test]
    fn mapdata_not_whole_submaps() {
        let mut s = Sm::new();
        s.map.pop();
        expect_err(s.check(), "mapdata", "n_local_submap");
    }

    #[test]
    fn weights_rows_must_hold_nnz_per_sample() {
        let mut s = Sm::new();
        s.weights.truncate(2 * S * 3 - 1);
        expect_err(s.check(), "weights", "[n_rows, n_samp, nnz]");
    }

    #[test]
    fn scan_map_index_beyond_det_data_rows() {
        let mut s = Sm::new();
        s.data.truncate(S);
        expect_err(s.check(), "data_index", "data_index[1] = 1");
    }

    #[test]
    fn global2local_entry_out_of_range() {
        expect_err(
            global2local("scan_map", &[-1, 0, 2], 2),
            "global2local",
            "global2local[2] = 2",
        );
        expect_err(
            global2local("scan_map", &[-2], 2),
            "global2local",
            "global2local[0] = -2",
        );
        assert!(global2local("scan_map", &[-1, 1, 0], 2).is_ok());
    }

    /// A valid build_noise_weighted call with det flags.
    struct Bn {
        sm: Sm,
        fi: Vec<i32>,
        scale: Vec<f64>,
        det_flags: Vec<u8>,
        zmap: Vec<f64>,
    }
    impl Bn {
        fn new() -> Self {
            Bn {
                sm: Sm::new(),
                fi: vec![0, 1],
                scale: vec![1.0, 1.0],
                det_flags: vec![0; 2 * S],
                zmap: vec![0.0; 2 * 8 * 3],
            }
        }
        fn check(&self) -> Result<BuildNoiseWeighted<'_>, ArgError> {
            let s = &self.sm;
            let a = abi::BuildNoiseWeightedArgs {
                n_det: 2,
                n_samp: S as u64,
                nnz: s.nnz,
                pixel_index: s.idx.as_ptr(),
                weight_index: s.idx.as_ptr(),
                data_index: s.idx.as_ptr(),
                flag_index: self.fi.as_ptr(),
                det_scale: self.scale.as_ptr(),
                intervals: ivs(&s.iv),
                global2local: arr(&s.g2l),
                n_pix_submap: s.nps,
                pixels: arr(&s.pixels),
                weights: arr(&s.weights),
                det_data: arr(&s.data),
                det_flags: arr(&self.det_flags),
                shared_flags: Array::ABSENT,
                zmap: arr(&self.zmap),
                det_flag_mask: 1,
                shared_flag_mask: 0,
                reserved: [0; 6],
            };
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_build_noise_weighted(&a) }
        }
    }

    #[test]
    fn valid_build_noise_weighted_passes() {
        let f = Bn::new();
        let v = f.check().unwrap();
        assert!(v.use_det_flags && !v.use_shared_flags);
        assert_eq!(v.n_local_submap, 2);
    }

    #[test]
    fn zmap_not_whole_submaps() {
        let mut b = Bn::new();
        b.zmap.push(0.0);
        expect_err(b.check(), "zmap", "n_local_submap");
    }

    #[test]
    fn det_flags_not_whole_rows() {
        let mut b = Bn::new();
        b.det_flags = vec![0; 1];
        expect_err(b.check(), "det_flags", "not a whole number of rows");
    }

    #[test]
    fn flag_index_beyond_det_flags_rows() {
        let mut b = Bn::new();
        b.fi[1] = 2;
        expect_err(b.check(), "flag_index", "flag_index[1] = 2");
    }

    #[test]
    fn flag_index_not_read_without_det_flags() {
        let mut b = Bn::new();
        b.fi = vec![-1, -1];
        b.det_flags.clear();
        assert!(!b.check().unwrap().use_det_flags);
    }

    #[test]
    fn hwp_wrong_length() {
        let qi = [0i32];
        let d = [0.0f64];
        let quats = vec![0.0; S * 4];
        let w = vec![0.0; S * 3];
        let hwp = vec![0.0; 1];
        let a = abi::StokesWeightsIquArgs {
            n_det: 1,
            n_samp: S as u64,
            quat_index: qi.as_ptr(),
            weight_index: qi.as_ptr(),
            epsilon: d.as_ptr(),
            gamma: d.as_ptr(),
            cal: d.as_ptr(),
            intervals: ivs(&[]),
            quats: arr(&quats),
            hwp: arr(&hwp),
            weights: arr(&w),
            iau: 0,
            reserved: [0; 7],
        };
        // SAFETY: all pointers come from live arrays of the declared lengths.
        expect_err(unsafe { check_stokes_weights_iqu(&a) }, "hwp", "length 1");
    }

    /// A valid template-offset call: 2 detectors, views of 10 and 3 samples,
    /// step 4 (3 + 1 amplitudes per detector), 10 amplitudes.
    struct To {
        di: Vec<i32>,
        fi: Vec<i32>,
        iv: Vec<SampleRange>,
        nav: Vec<i64>,
        off: Vec<i64>,
        step: i64,
        amps: Vec<f64>,
        aflags: Vec<u8>,
        data: Vec<f64>,
        flag_data: Vec<u8>,
    }
    impl To {
        fn new() -> Self {
            To {
                di: vec![0, 1],
                fi: vec![0, -1],
                iv: vec![iv(0, 10), iv(12, 15)],
                nav: vec![3, 1],
                off: vec![0, 5],
                step: 4,
                amps: vec![0.0; 10],
                aflags: vec![0; 10],
                data: vec![0.0; 2 * 16],
                flag_data: vec![0; 16],
            }
        }
        fn layout(&self) -> abi::OffsetLayout {
            abi::OffsetLayout {
                step_length: self.step,
                n_amp_views: self.nav.as_ptr(),
                amp_offset: self.off.as_ptr(),
            }
        }
        fn add(&self) -> Result<TemplateOffsetAdd<'_>, ArgError> {
            let a = abi::TemplateOffsetAddArgs {
                n_det: 2,
                n_samp: 16,
                data_index: self.di.as_ptr(),
                layout: self.layout(),
                intervals: ivs(&self.iv),
                amplitudes: arr(&self.amps),
                amplitude_flags: arr(&self.aflags),
                det_data: arr(&self.data),
            };
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_template_offset_add(&a) }
        }
        fn project(&self) -> Result<TemplateOffsetProject<'_>, ArgError> {
            let a = abi::TemplateOffsetProjectArgs {
                n_det: 2,
                n_samp: 16,
                data_index: self.di.as_ptr(),
                flag_index: self.fi.as_ptr(),
                layout: self.layout(),
                intervals: ivs(&self.iv),
                det_data: arr(&self.data),
                flag_data: arr(&self.flag_data),
                amplitudes: arr(&self.amps),
                amplitude_flags: arr(&self.aflags),
                flag_mask: 1,
                reserved: [0; 7],
            };
            // SAFETY: all pointers come from live vectors of the declared lengths.
            unsafe { check_template_offset_project(&a) }
        }
    }

    #[test]
    fn valid_template_offset_passes() {
        let t = To::new();
        let v = t.add().unwrap();
        assert_eq!(v.layout.view_offset, vec![0, 3]);
        assert_eq!(v.layout.block_len, 4);
        t.project().unwrap();
    }

    #[test]
    fn step_length_below_one() {
        let mut t = To::new();
        t.step = 0;
        expect_err(t.add(), "layout.step_length", "step_length = 0");
    }

    #[test]
    fn template_offset_with_no_views() {
        let mut t = To::new();
        t.iv.clear();
        expect_err(t.add(), "intervals", "no views");
    }

    #[test]
    fn n_amp_views_too_small_for_the_view() {
        let mut t = To::new();
        t.nav[0] = 2;
        expect_err(t.add(), "layout.n_amp_views", "n_amp_views[0] = 2");
    }

    #[test]
    fn negative_n_amp_views() {
        let mut t = To::new();
        t.iv[1] = iv(12, 12);
        t.nav[1] = -1;
        expect_err(t.add(), "layout.n_amp_views", "n_amp_views[1] = -1");
    }

    #[test]
    fn amplitude_block_beyond_amplitudes() {
        // The last amplitude of detector 1 would be index 10 of 10.
        let mut t = To::new();
        t.off[1] = 7;
        expect_err(t.add(), "layout.amp_offset", "amp_offset[1] = 7");
    }

    #[test]
    fn negative_amp_offset() {
        let mut t = To::new();
        t.off[0] = -1;
        expect_err(t.project(), "layout.amp_offset", "amp_offset[0] = -1");
    }

    #[test]
    fn amplitude_flags_length_differs() {
        let mut t = To::new();
        t.aflags.pop();
        expect_err(t.add(), "amplitude_flags", "length 9");
    }

    #[test]
    fn flag_index_below_minus_one() {
        let mut t = To::new();
        t.fi[1] = -2;
        expect_err(t.project(), "flag_index", "flag_index[1] = -2");
    }

    #[test]
    fn flag_index_without_flag_data() {
        let mut t = To::new();
        t.flag_data.clear();
        expect_err(t.project(), "flag_index", "flag_data is absent");
    }

    #[test]
    fn flag_index_beyond_flag_rows() {
        let mut t = To::new();
        t.fi[1] = 1;
        expect_err(t.project(), "flag_index", "flag_index[1] = 1");
    }

    #[test]
    fn precond_lengths_must_all_be_n_amp() {
        let v = vec![0.0f64; 5];
        let f = vec![0u8; 5];
        let mut o = vec![0.0f64; 4];
        let mut a = abi::TemplateOffsetPrecondArgs {
            n_amp: 5,
            offset_var: arr(&v),
            amplitudes_in: arr(&v),
            amplitude_flags: arr(&f),
            amplitudes_out: arr(&o),
        };
        // SAFETY: reads no pointer.
        expect_err(
            unsafe { check_template_offset_precond(&a) },
            "amplitudes_out",
            "length 4",
        );
        o.push(0.0);
        a.amplitudes_out = arr(&o);
        a.offset_var.len = 6;
        // SAFETY: `check_template_offset_precond` reads no pointer, only lengths (the
        // arrays point into the live `v`, `f` and `o` anyway).
        expect_err(
            unsafe { check_template_offset_precond(&a) },
            "offset_var",
            "length 6",
        );
    }

    fn hits_args(nsub: i64, nsubpix: i64, n: u64, m: u64, h: u64) -> abi::CovAccumDiagHitsArgs {
        let a = |len| Array { ptr: 8, len };
        abi::CovAccumDiagHitsArgs {
            nsub,
            nsubpix,
            nnz: 3,
            submap: a(n),
            subpix: a(m),
            hits: a(h),
        }
    }

    #[test]
    fn cov_sample_arrays_must_match() {
        // SAFETY: reads no pointer.
        expect_err(
            unsafe { check_cov_accum_diag_hits(&hits_args(2, 4, 10, 9, 8)) },
            "subpix",
            "length 9",
        );
    }

    #[test]
    fn cov_output_must_hold_the_local_map() {
        // SAFETY: reads no pointer.
        expect_err(
            unsafe { check_cov_accum_diag_hits(&hits_args(2, 4, 10, 10, 7)) },
            "hits",
            "length 7",
        );
        // SAFETY: `check_cov_accum_diag_hits` reads no pointer, only sizes and lengths;
        // the fake `ptr: 8` arrays are never dereferenced.
        expect_err(
            unsafe { check_cov_accum_diag_hits(&hits_args(2, 0, 10, 10, 0)) },
            "nsubpix",
            "must be positive",
        );
        // nsub < 1: nothing is read or written, the map is not checked.
        // SAFETY: `check_cov_accum_diag_hits` reads no pointer, only sizes and lengths;
        // the fake `ptr: 8` arrays are never dereferenced.
        let v = unsafe { check_cov_accum_diag_hits(&hits_args(0, 4, 10, 10, 3)) }.unwrap();
        assert!(!v.active);
    }

    #[test]
    fn invnpp_nnz_and_weights() {
        let a = |len| Array { ptr: 8, len };
        let mut x = abi::CovAccumDiagInvnppArgs {
            nsub: 2,
            nsubpix: 4,
            nnz: 0,
            submap: a(10),
            subpix: a(10),
            weights: a(30),
            scale: 1.0,
            invnpp: a(48),
        };
        // SAFETY: reads no pointer.
        expect_err(unsafe { check_cov_accum_diag_invnpp(&x) }, "nnz", "nnz = 0");
        x.nnz = 3;
        // SAFETY: `check_cov_accum_diag_invnpp` reads no pointer, only sizes and
        // lengths; the fake `ptr: 8` arrays are never dereferenced.
        let v = unsafe { check_cov_accum_diag_invnpp(&x) }.unwrap();
        assert_eq!((v.block, v.nnz, v.n_samp), (6, 3, 10));
        x.weights.len = 29;
        // SAFETY: `check_cov_accum_diag_invnpp` reads no pointer, only sizes and
        // lengths; the fake `ptr: 8` arrays are never dereferenced.
        expect_err(
            unsafe { check_cov_accum_diag_invnpp(&x) },
            "weights",
            "length 29",
        );
        x.weights.len = 30;
        x.invnpp.len = 40;
        // SAFETY: `check_cov_accum_diag_invnpp` reads no pointer, only sizes and
        // lengths; the fake `ptr: 8` arrays are never dereferenced.
        expect_err(
            unsafe { check_cov_accum_diag_invnpp(&x) },
            "invnpp",
            "length 40",
        );
    }

    #[test]
    fn filter_polynomial_rows_flags_and_repeats() {
        let (idx, st, sp) = ([0i32, 1], [0i64], [10i64]);
        let mut a = abi::FilterPolynomialArgs {
            n_signal: 2,
            n_samp: 10,
            n_scan: 1,
            order: 1,
            signal_index: idx.as_ptr(),
            starts: st.as_ptr(),
            stops: sp.as_ptr(),
            flags: Array { ptr: 8, len: 10 },
            signals: Array { ptr: 8, len: 20 },
        };
        // SAFETY: host arrays of the declared lengths.
        assert!(unsafe { check_filter_polynomial(&a) }.is_ok());
        a.flags.len = 9;
        // SAFETY: signal_index (`idx`, n_signal = 2), starts and stops (`st`, `sp`, n_scan = 1)
        // are live arrays of the declared lengths; the check reads no kernel array.
        expect_err(unsafe { check_filter_polynomial(&a) }, "flags", "length 9");
        a.flags.len = 10;
        a.signals.len = 10;
        // SAFETY: signal_index (`idx`, n_signal = 2), starts and stops (`st`, `sp`, n_scan = 1)
        // are live arrays of the declared lengths; the check reads no kernel array.
        expect_err(
            unsafe { check_filter_polynomial(&a) },
            "signal_index",
            "signal_index[1] = 1",
        );
        let rep = [1i32, 1];
        a.signals.len = 20;
        a.signal_index = rep.as_ptr();
        // SAFETY: signal_index now points at `rep` (n_signal = 2 elements), starts and
        // stops at `st`, `sp` (n_scan = 1), all live; no kernel array is read.
        expect_err(
            unsafe { check_filter_polynomial(&a) },
            "signal_index",
            "repeats",
        );
        a.signal_index = idx.as_ptr();
        a.order = MAX_POLY_TEMPLATES as i64 - 1;
        // SAFETY: signal_index (`idx`, n_signal = 2), starts and stops (`st`, `sp`, n_scan = 1)
        // are live arrays of the declared lengths; the check reads no kernel array.
        assert!(unsafe { check_filter_polynomial(&a) }.is_ok());
        a.order = MAX_POLY_TEMPLATES as i64;
        // SAFETY: signal_index (`idx`, n_signal = 2), starts and stops (`st`, `sp`, n_scan = 1)
        // are live arrays of the declared lengths; the check reads no kernel array.
        expect_err(
            unsafe { check_filter_polynomial(&a) },
            "order",
            "order 1024 needs more than the 1024 templates",
        );
        a.order = 1;
        a.n_scan = 2;
        a.starts = std::ptr::null();
        // SAFETY: signal_index (`idx`) has n_signal = 2 elements; the null `starts` is refused
        // by `host` before any read, so `stops` (1 element, short for n_scan = 2) is never read.
        expect_err(unsafe { check_filter_polynomial(&a) }, "starts", "null");
    }

    #[test]
    fn filter_poly2d_groups_and_shapes() {
        let (g, t) = ([0i32, -1, 1], [0.0f64; 6]);
        let mut a = abi::FilterPoly2dArgs {
            n_samp: 4,
            n_det: 3,
            n_group: 2,
            n_mode: 2,
            det_groups: g.as_ptr(),
            templates: t.as_ptr(),
            signals: Array { ptr: 8, len: 12 },
            masks: Array { ptr: 8, len: 12 },
            coeff: Array { ptr: 8, len: 16 },
        };
        // SAFETY: host arrays of the declared lengths.
        assert!(unsafe { check_filter_poly2d(&a) }.is_ok());
        a.coeff.len = 15;
        // SAFETY: det_groups (`g`) has n_det = 3 elements and templates (`t`) n_det * n_mode
        // = 6, both live; the check reads no kernel array.
        expect_err(unsafe { check_filter_poly2d(&a) }, "coeff", "length 15");
        a.coeff.len = 16;
        a.masks.len = 11;
        // SAFETY: det_groups (`g`) has n_det = 3 elements and templates (`t`) n_det * n_mode
        // = 6, both live; the check reads no kernel array.
        expect_err(unsafe { check_filter_poly2d(&a) }, "masks", "length 11");
        a.masks.len = 12;
        a.n_group = 1;
        a.coeff.len = 8;
        // SAFETY: det_groups (`g`) has n_det = 3 elements and templates (`t`) n_det * n_mode
        // = 6, both live; the check reads no kernel array.
        expect_err(
            unsafe { check_filter_poly2d(&a) },
            "det_groups",
            "det_groups[2] = 1",
        );
        // Refused before the templates (n_det * n_mode of them) are read.
        a.n_mode = MAX_POLY_TEMPLATES + 1;
        // SAFETY: det_groups (`g`, n_det = 3) is read; n_mode > MAX_POLY_TEMPLATES is
        // refused before `templates` (6 elements, short for 3 * 1025) would be read.
        expect_err(
            unsafe { check_filter_poly2d(&a) },
            "n_mode",
            "1025 modes is more than the 1024 templates",
        );
    }

    fn apply_args(nsub: i64, nsubpix: i64, nnz: i64, m: u64, v: u64) -> abi::CovApplyDiagArgs {
        let a = |len| Array { ptr: 8, len };
        abi::CovApplyDiagArgs {
            nsub,
            nsubpix,
            nnz,
            mat: a(m),
            vec: a(v),
        }
    }

    #[test]
    fn cov_apply_lengths_nnz_and_nsubpix() {
        let check = |nsub, nsubpix, nnz, m, v| {
            // SAFETY: the validator reads no pointer.
            unsafe { check_cov_apply_diag(&apply_args(nsub, nsubpix, nnz, m, v)) }
        };
        let v = check(2, 4, 3, 48, 24).unwrap();
        assert_eq!((v.n_pix, v.nnz, v.block, v.active), (8, 3, 6, true));
        expect_err(check(2, 4, 3, 47, 24), "mat", "length 47");
        expect_err(check(2, 4, 3, 48, 25), "vec", "length 25");
        expect_err(check(2, 4, 0, 0, 0), "nnz", "nnz = 0");
        expect_err(check(2, 4, 17, 0, 0), "nnz", "nnz = 17");
        expect_err(check(2, 0, 3, 0, 0), "nsubpix", "must be positive");
        // nsub < 1: nothing is read or written, nothing else is checked.
        let v = check(0, 0, 99, 5, 7).unwrap();
        assert!(!v.active);
    }

    fn dot_check(a: &abi::AmpDotArgs) -> Result<AmpDot, ArgError> {
        // SAFETY: the validator reads no pointer.
        unsafe { check_amp_dot(a) }
    }

    fn axpby_check(a: &abi::AmpAxpbyArgs) -> Result<usize, ArgError> {
        // SAFETY: the validator reads no pointer.
        unsafe { check_amp_axpby(a) }
    }

    fn dot_args(n: i64, nblock: i64, lens: [u64; 4]) -> abi::AmpDotArgs {
        let a = |len| Array { ptr: 8, len };
        abi::AmpDotArgs {
            n,
            nblock,
            a: a(lens[0]),
            b: a(lens[1]),
            flags: a(lens[2]),
            partials: a(lens[3]),
        }
    }

    #[test]
    fn amp_dot_lengths_and_blocks() {
        let v = dot_check(&dot_args(10, 3, [10, 10, 10, 3])).unwrap();
        assert_eq!((v.n, v.nblock, v.chunk), (10, 3, 4));
        let v = dot_check(&dot_args(0, 2, [0, 0, 0, 2])).unwrap();
        assert_eq!((v.n, v.nblock, v.chunk), (0, 2, 0));
        expect_err(dot_check(&dot_args(-1, 1, [0, 0, 0, 1])), "n", "n = -1");
        expect_err(
            dot_check(&dot_args(4, 0, [4, 4, 4, 0])),
            "nblock",
            "nblock = 0",
        );
        expect_err(
            dot_check(&dot_args(4, AMP_DOT_MAX_BLOCKS + 1, [4, 4, 4, 0])),
            "nblock",
            "must be in",
        );
        for (i, arg) in ["a", "b", "flags", "partials"].into_iter().enumerate() {
            let mut lens = [4, 4, 4, 2];
            lens[i] += 1;
            expect_err(dot_check(&dot_args(4, 2, lens)), arg, "length");
        }
    }

    #[test]
    fn amp_axpby_lengths() {
        let args = |n: i64, nx: u64, ny: u64| abi::AmpAxpbyArgs {
            n,
            alpha: 1.0,
            beta: 2.0,
            x: Array { ptr: 8, len: nx },
            y: Array { ptr: 16, len: ny },
        };
        assert_eq!(axpby_check(&args(5, 5, 5)).unwrap(), 5);
        expect_err(axpby_check(&args(-2, 0, 0)), "n", "n = -2");
        expect_err(axpby_check(&args(5, 4, 5)), "x", "length 4");
        expect_err(axpby_check(&args(5, 5, 6)), "y", "length 6");
    }
}
