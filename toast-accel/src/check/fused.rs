//! Validation of the map-maker's fused kernels (ABI minor 4):
//! `compact_expand_pointing`, `fused_accumulate`, `fused_project`.
//!
//! Their pointing comes in one of two forms ([`FusedPointing`]): *compact*
//! (`compact` i32 pixels, the weights rebuilt from `boresight` and the
//! detector's focal-plane quaternion, `epsilon`, `gamma`, `cal`) or *kept*
//! (`pixels` i64 and `weights` f64 `[.., 3]`). The compact form is chosen
//! when `compact` or `boresight` is present, and the kept arrays must then
//! be absent (and the other way round), so a call never mixes them. The
//! value of a sample is the timestream `det_data` when present, else `F a`
//! of the offset amplitudes (`layout`, `amplitudes`, `amplitude_flags`);
//! `layout.amp_offset[d] = -1` marks a detector without amplitudes.

use super::{
    exact_len, host, intervals, local_submaps, mul, optional_len, rows, sample_rows, ArgError,
};
use crate::abi::{self, Array, SampleRange};

/// The validated pointing of a fused kernel.
#[derive(Debug, Clone, Copy)]
pub struct FusedPointing<'a> {
    /// Compact form: rebuilt weights (else kept pixels and weights).
    pub compact: bool,
    /// The row of `compact` (compact form) or of `pixels` (kept form).
    pub pixel_index: &'a [i32],
    /// The row of `weights` (kept form; empty in the compact form).
    pub weight_index: &'a [i32],
    /// Compact form: `[n_det, 4]`, `[n_det]` x 3 (empty in the kept form).
    pub focalplane: &'a [f64],
    pub epsilon: &'a [f64],
    pub gamma: &'a [f64],
    pub cal: &'a [f64],
    /// Whether `pointing_flags` cut the boresight.
    pub use_pointing_flags: bool,
    /// Whether a HWP angle is given.
    pub use_hwp: bool,
}

/// The pointing arguments of a fused kernel, as the structs hold them.
struct PointingArgs {
    n_det: u64,
    n_samp: u64,
    pixel_index: *const i32,
    weight_index: *const i32,
    focalplane: *const f64,
    epsilon: *const f64,
    gamma: *const f64,
    cal: *const f64,
    compact: Array,
    boresight: Array,
    pointing_flags: Array,
    hwp: Array,
    pixels: Array,
    weights: Array,
    /// The kernel takes the compact form only.
    compact_only: bool,
}

/// The [`PointingArgs`] of a `fused_accumulate` or `fused_project` struct
/// (the same field names in both).
macro_rules! pass_pointing {
    ($a:expr) => {
        PointingArgs {
            n_det: $a.n_det,
            n_samp: $a.n_samp,
            pixel_index: $a.pixel_index,
            weight_index: $a.weight_index,
            focalplane: $a.focalplane,
            epsilon: $a.epsilon,
            gamma: $a.gamma,
            cal: $a.cal,
            compact: $a.compact,
            boresight: $a.boresight,
            pointing_flags: $a.pointing_flags,
            hwp: $a.hwp,
            pixels: $a.pixels,
            weights: $a.weights,
            compact_only: false,
        }
    };
}

/// Check the pointing of a fused kernel (see the module documentation).
///
/// # Safety
/// The host pointers of `p` are valid for the lengths the header gives.
unsafe fn fused_pointing<'a>(
    k: &'static str,
    p: &PointingArgs,
) -> Result<FusedPointing<'a>, ArgError> {
    // SAFETY: host [n_det] by the caller's contract; `host` refuses null.
    let pixel_index = unsafe { host(k, "pixel_index", p.pixel_index, p.n_det)? };
    let compact = p.compact_only || p.compact.len != 0 || p.boresight.len != 0;
    if compact {
        for (arg, a) in [("pixels", p.pixels), ("weights", p.weights)] {
            if a.len != 0 {
                return Err(ArgError::new(
                    k,
                    arg,
                    "kept pointing given with compact pointing (compact, boresight): give one form",
                ));
            }
        }
        sample_rows(
            k,
            "compact",
            p.compact.len,
            p.n_samp,
            1,
            "[n_rows, n_samp]",
            "pixel_index",
            pixel_index,
        )?;
        exact_len(
            k,
            "boresight",
            p.boresight.len,
            mul(k, "boresight", p.n_samp, 4)?,
            "[n_samp, 4]",
        )?;
        let n4 = mul(k, "focalplane", p.n_det, 4)?;
        // SAFETY: host arrays of the header's lengths by the caller's
        // contract (read in the compact form only, this branch).
        let (focalplane, epsilon, gamma, cal) = unsafe {
            (
                host(k, "focalplane", p.focalplane, n4)?,
                host(k, "epsilon", p.epsilon, p.n_det)?,
                host(k, "gamma", p.gamma, p.n_det)?,
                host(k, "cal", p.cal, p.n_det)?,
            )
        };
        let use_pointing_flags = optional_len(
            k,
            "pointing_flags",
            p.pointing_flags.len,
            p.n_samp,
            "n_samp",
        )?;
        let use_hwp = optional_len(k, "hwp", p.hwp.len, p.n_samp, "n_samp")?;
        Ok(FusedPointing {
            compact,
            pixel_index,
            weight_index: &[],
            focalplane,
            epsilon,
            gamma,
            cal,
            use_pointing_flags,
            use_hwp,
        })
    } else {
        for (arg, a) in [("pointing_flags", p.pointing_flags), ("hwp", p.hwp)] {
            if a.len != 0 {
                return Err(ArgError::new(
                    k,
                    arg,
                    "given with kept pointing (pixels, weights): it belongs to the compact form",
                ));
            }
        }
        // SAFETY: host [n_det] by the caller's contract (kept form).
        let weight_index = unsafe { host(k, "weight_index", p.weight_index, p.n_det)? };
        sample_rows(
            k,
            "pixels",
            p.pixels.len,
            p.n_samp,
            1,
            "[n_rows, n_samp]",
            "pixel_index",
            pixel_index,
        )?;
        sample_rows(
            k,
            "weights",
            p.weights.len,
            p.n_samp,
            3,
            "[n_rows, n_samp, 3]",
            "weight_index",
            weight_index,
        )?;
        Ok(FusedPointing {
            compact,
            pixel_index,
            weight_index,
            focalplane: &[],
            epsilon: &[],
            gamma: &[],
            cal: &[],
            use_pointing_flags: false,
            use_hwp: false,
        })
    }
}

/// The validated source of a sample's value: the timestream or `F a`.
#[derive(Debug, Clone)]
pub struct FusedValues<'a> {
    /// The row of `det_data` per detector (empty: `F a`).
    pub data_index: &'a [i32],
    /// `F a`: the first amplitude of each detector's block (`-1`: none),
    /// empty with `det_data`.
    pub amp_offset: &'a [i64],
    /// The first amplitude of each view inside a detector's block.
    pub view_offset: Vec<i64>,
    /// Amplitudes per view (empty with `det_data` in `fused_accumulate`).
    pub n_amp_views: &'a [i64],
    /// Amplitudes of one detector's block (the sum of `n_amp_views`).
    pub block_len: i64,
    /// Samples per amplitude.
    pub step_length: i64,
}

/// Check the timestream (`det_data` with `data_index`) or, with `det_data`
/// absent and `need_layout` false, nothing else; with `need_layout`, the
/// offset layout against `intervals` and the amplitudes.
///
/// # Safety
/// The host pointers are valid for the lengths the header gives.
#[allow(clippy::too_many_arguments)]
unsafe fn fused_values<'a>(
    k: &'static str,
    n_det: u64,
    n_samp: u64,
    data_index: *const i32,
    det_data: Array,
    layout: &abi::OffsetLayout,
    ivs: &[SampleRange],
    need_layout: bool,
    n_amp: u64,
) -> Result<FusedValues<'a>, ArgError> {
    let data_index = if det_data.len != 0 {
        // SAFETY: host [n_det] by the caller's contract (det_data present).
        let di = unsafe { host(k, "data_index", data_index, n_det)? };
        sample_rows(
            k,
            "det_data",
            det_data.len,
            n_samp,
            1,
            "[n_rows, n_samp]",
            "data_index",
            di,
        )?;
        di
    } else {
        &[]
    };
    if !need_layout {
        return Ok(FusedValues {
            data_index,
            amp_offset: &[],
            view_offset: Vec::new(),
            n_amp_views: &[],
            block_len: 0,
            step_length: 1,
        });
    }
    if layout.step_length < 1 {
        return Err(ArgError::new(
            k,
            "layout.step_length",
            format!("step_length = {} must be >= 1", layout.step_length),
        ));
    }
    // SAFETY: host [n_view] and [n_det] by the caller's contract.
    let (n_amp_views, amp_offset) = unsafe {
        (
            host(
                k,
                "layout.n_amp_views",
                layout.n_amp_views,
                ivs.len() as u64,
            )?,
            host(k, "layout.amp_offset", layout.amp_offset, n_det)?,
        )
    };
    let mut view_offset = Vec::with_capacity(ivs.len());
    let mut total: i64 = 0;
    for (v, (iv, &n)) in ivs.iter().zip(n_amp_views).enumerate() {
        let len = iv.last - iv.first;
        let need = len / layout.step_length + i64::from(len % layout.step_length != 0);
        if n < need {
            return Err(ArgError::new(
                k,
                "layout.n_amp_views",
                format!(
                    "n_amp_views[{v}] = {n}, but view {v} = [{}, {}) needs ceil({len} / step_length {}) = {need} amplitudes",
                    iv.first, iv.last, layout.step_length
                ),
            ));
        }
        view_offset.push(total);
        total = total.checked_add(n).ok_or_else(|| {
            ArgError::new(
                k,
                "layout.n_amp_views",
                "the sum of n_amp_views overflows 64 bits",
            )
        })?;
    }
    for (i, &off) in amp_offset.iter().enumerate() {
        let end = off.checked_add(total);
        if off < -1 || (off >= 0 && end.is_none_or(|e| e as u64 > n_amp)) {
            return Err(ArgError::new(
                k,
                "layout.amp_offset",
                format!(
                    "amp_offset[{i}] = {off}: neither -1 (no amplitudes) nor a block [{off}, {off} + {total}) inside amplitudes [0, n_amp = {n_amp})"
                ),
            ));
        }
    }
    Ok(FusedValues {
        data_index,
        amp_offset,
        view_offset,
        n_amp_views,
        block_len: total,
        step_length: layout.step_length,
    })
}

/// Check `flag_index` (-1: no flags, else a row of `det_flags`, which must
/// then be present) and return it (empty when `det_flags` is absent and
/// every entry is -1 ... or the pointer is null with `det_flags` absent).
///
/// # Safety
/// `flag_index` is valid for `n_det` elements when `det_flags` is present.
unsafe fn flag_rows<'a>(
    k: &'static str,
    n_det: u64,
    n_samp: u64,
    flag_index: *const i32,
    det_flags: Array,
) -> Result<&'a [i32], ArgError> {
    if det_flags.len == 0 {
        return Ok(&[]);
    }
    // SAFETY: host [n_det] by the caller's contract (det_flags present).
    let fi = unsafe { host(k, "flag_index", flag_index, n_det)? };
    let n_rows = if n_samp == 0 {
        0
    } else {
        rows(
            k,
            "det_flags",
            det_flags.len,
            n_samp,
            "[n_flag_rows, n_samp]",
        )?
    };
    for (i, &f) in fi.iter().enumerate() {
        if f < -1 || (f >= 0 && f as u64 >= n_rows) {
            return Err(ArgError::new(
                k,
                "flag_index",
                format!("flag_index[{i}] = {f} is neither -1 (no flags) nor a row of det_flags, which has {n_rows} rows"),
            ));
        }
    }
    Ok(fi)
}

/// Validated `compact_expand_pointing` arguments.
#[derive(Debug, Clone, Copy)]
pub struct CompactExpandPointing<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub nnz: usize,
    pub compact_index: &'a [i32],
    pub pixel_index: &'a [i32],
    pub weight_index: &'a [i32],
    pub focalplane: &'a [f64],
    pub epsilon: &'a [f64],
    pub gamma: &'a [f64],
    pub cal: &'a [f64],
    pub intervals: &'a [SampleRange],
    /// The outputs' window: column 0 is sample `out_first`, rows of
    /// `out_n_samp` samples.
    pub out_first: usize,
    pub out_n_samp: usize,
    pub use_pointing_flags: bool,
    pub use_hwp: bool,
}

/// Check the arguments of `compact_expand_pointing`: `nnz` 1 or 3, whole
/// rows (the outputs' of `out_n_samp` samples, a window of the observation
/// that holds every interval), `boresight` `[n_samp, 4]`, optional
/// `pointing_flags` and `hwp`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_compact_expand_pointing<'a>(
    a: &abi::CompactExpandPointingArgs,
) -> Result<CompactExpandPointing<'a>, ArgError> {
    const K: &str = "compact_expand_pointing";
    if a.nnz != 1 && a.nnz != 3 {
        return Err(ArgError::new(
            K,
            "nnz",
            format!("nnz = {}, must be 1 (I) or 3 (IQU)", a.nnz),
        ));
    }
    // SAFETY: host intervals by the caller's contract.
    let ivs = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let p = PointingArgs {
        n_det: a.n_det,
        n_samp: a.n_samp,
        pixel_index: a.compact_index,
        weight_index: std::ptr::null(),
        focalplane: a.focalplane,
        epsilon: a.epsilon,
        gamma: a.gamma,
        cal: a.cal,
        compact: a.compact,
        boresight: a.boresight,
        pointing_flags: a.pointing_flags,
        hwp: a.hwp,
        pixels: Array::ABSENT,
        weights: Array::ABSENT,
        compact_only: true,
    };
    // SAFETY: forwarded contract.
    let fp = unsafe { fused_pointing(K, &p)? };
    // SAFETY: host [n_det] by the caller's contract.
    let (pixel_index, weight_index) = unsafe {
        (
            host(K, "pixel_index", a.pixel_index, a.n_det)?,
            host(K, "weight_index", a.weight_index, a.n_det)?,
        )
    };
    let out_end = u64::try_from(a.out_first)
        .ok()
        .and_then(|f| f.checked_add(a.out_n_samp))
        .filter(|&e| e <= a.n_samp);
    let Some(out_end) = out_end else {
        return Err(ArgError::new(
            K,
            "out_first",
            format!(
                "the output window [{}, {} + out_n_samp {}) is not inside [0, n_samp = {})",
                a.out_first, a.out_first, a.out_n_samp, a.n_samp
            ),
        ));
    };
    if let Some((v, iv)) = ivs
        .iter()
        .enumerate()
        .find(|(_, iv)| iv.first < iv.last && (iv.first < a.out_first || iv.last as u64 > out_end))
    {
        return Err(ArgError::new(
            K,
            "intervals",
            format!(
                "interval {v} = [{}, {}) is not inside the output window [{}, {out_end})",
                iv.first, iv.last, a.out_first
            ),
        ));
    }
    sample_rows(
        K,
        "pixels",
        a.pixels.len,
        a.out_n_samp,
        1,
        "[n_rows, out_n_samp]",
        "pixel_index",
        pixel_index,
    )?;
    sample_rows(
        K,
        "weights",
        a.weights.len,
        a.out_n_samp,
        a.nnz,
        "[n_rows, out_n_samp, nnz]",
        "weight_index",
        weight_index,
    )?;
    Ok(CompactExpandPointing {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        nnz: a.nnz as usize,
        compact_index: fp.pixel_index,
        pixel_index,
        weight_index,
        focalplane: fp.focalplane,
        epsilon: fp.epsilon,
        gamma: fp.gamma,
        cal: fp.cal,
        intervals: ivs,
        out_first: a.out_first as usize,
        out_n_samp: a.out_n_samp as usize,
        use_pointing_flags: fp.use_pointing_flags,
        use_hwp: fp.use_hwp,
    })
}

/// Validated arguments of `fused_accumulate` and `fused_project`.
#[derive(Debug, Clone)]
pub struct Fused<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    pub pointing: FusedPointing<'a>,
    pub values: FusedValues<'a>,
    /// Per detector, -1: no flags (empty when `det_flags` is absent).
    pub flag_index: &'a [i32],
    pub det_scale: &'a [f64],
    /// `fused_accumulate`: per detector, whether its weights are promised
    /// finite (empty for `fused_project`).
    pub finite: &'a [u8],
    pub intervals: &'a [SampleRange],
    pub n_pix_submap: i64,
    pub n_local_submap: usize,
    pub use_shared_flags: bool,
    pub n_amp: usize,
}

/// Check the arguments of `fused_accumulate` (see the module
/// documentation): the pointing in one form, the timestream or the offset
/// layout, the flags, a `zmap` of whole IQU submaps.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_fused_accumulate<'a>(
    a: &abi::FusedAccumulateArgs,
) -> Result<Fused<'a>, ArgError> {
    const K: &str = "fused_accumulate";
    // SAFETY: host intervals by the caller's contract.
    let ivs = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let p = pass_pointing!(a);
    // SAFETY: forwarded contract.
    let pointing = unsafe { fused_pointing(K, &p)? };
    let fa = a.det_data.len == 0;
    let n_amp = a.amplitudes.len;
    if fa {
        exact_len(
            K,
            "amplitude_flags",
            a.amplitude_flags.len,
            n_amp,
            "n_amp, the length of amplitudes",
        )?;
    }
    // SAFETY: forwarded contract.
    let values = unsafe {
        fused_values(
            K,
            a.n_det,
            a.n_samp,
            a.data_index,
            a.det_data,
            &a.layout,
            ivs,
            fa,
            n_amp,
        )?
    };
    // SAFETY: forwarded contract.
    let flag_index = unsafe { flag_rows(K, a.n_det, a.n_samp, a.flag_index, a.det_flags)? };
    // SAFETY: host [n_det] by the caller's contract.
    let (det_scale, finite) = unsafe {
        (
            host(K, "det_scale", a.det_scale, a.n_det)?,
            host(K, "finite", a.finite, a.n_det)?,
        )
    };
    let use_shared_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    let n_local_submap = local_submaps(K, "zmap", a.zmap.len, a.n_pix_submap, 3)?;
    Ok(Fused {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        pointing,
        values,
        flag_index,
        det_scale,
        finite,
        intervals: ivs,
        n_pix_submap: a.n_pix_submap,
        n_local_submap: n_local_submap as usize,
        use_shared_flags,
        n_amp: n_amp as usize,
    })
}

/// Check the arguments of `fused_project`: as `fused_accumulate`'s, with
/// the offset layout always (it names the output amplitudes),
/// `amplitudes_out` and `amplitude_flags` of `n_amp`, `amplitudes` of
/// `n_amp` when `det_data` is absent, and a `mapdata` of whole IQU submaps.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_fused_project<'a>(a: &abi::FusedProjectArgs) -> Result<Fused<'a>, ArgError> {
    const K: &str = "fused_project";
    // SAFETY: host intervals by the caller's contract.
    let ivs = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let p = pass_pointing!(a);
    // SAFETY: forwarded contract.
    let pointing = unsafe { fused_pointing(K, &p)? };
    let n_amp = a.amplitudes_out.len;
    exact_len(
        K,
        "amplitude_flags",
        a.amplitude_flags.len,
        n_amp,
        "n_amp, the length of amplitudes_out",
    )?;
    if a.det_data.len == 0 {
        exact_len(
            K,
            "amplitudes",
            a.amplitudes.len,
            n_amp,
            "n_amp, the length of amplitudes_out (F a without det_data)",
        )?;
    }
    // SAFETY: forwarded contract.
    let values = unsafe {
        fused_values(
            K,
            a.n_det,
            a.n_samp,
            a.data_index,
            a.det_data,
            &a.layout,
            ivs,
            true,
            n_amp,
        )?
    };
    // SAFETY: forwarded contract.
    let flag_index = unsafe { flag_rows(K, a.n_det, a.n_samp, a.flag_index, a.det_flags)? };
    // SAFETY: host [n_det] by the caller's contract.
    let det_scale = unsafe { host(K, "det_scale", a.det_scale, a.n_det)? };
    let n_local_submap = local_submaps(K, "mapdata", a.mapdata.len, a.n_pix_submap, 3)?;
    Ok(Fused {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        pointing,
        values,
        flag_index,
        det_scale,
        finite: &[],
        intervals: ivs,
        n_pix_submap: a.n_pix_submap,
        n_local_submap: n_local_submap as usize,
        use_shared_flags: false,
        n_amp: n_amp as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{OffsetLayout, SampleRanges};

    fn arr<T>(v: &[T]) -> Array {
        Array {
            ptr: v.as_ptr() as u64,
            len: v.len() as u64,
        }
    }

    struct Fixture {
        ivs: Vec<SampleRange>,
        idx: Vec<i32>,
        fp: Vec<f64>,
        one: Vec<f64>,
        compact: Vec<i32>,
        bore: Vec<f64>,
        pixels: Vec<i64>,
        weights: Vec<f64>,
        data: Vec<f64>,
        g2l: Vec<i64>,
        zmap: Vec<f64>,
        finite: Vec<u8>,
        n_amp_views: Vec<i64>,
        amp_offset: Vec<i64>,
        amps: Vec<f64>,
        amp_flags: Vec<u8>,
    }

    fn fixture() -> Fixture {
        Fixture {
            ivs: vec![SampleRange { first: 0, last: 4 }],
            idx: vec![0],
            fp: vec![0.0, 0.0, 0.0, 1.0],
            one: vec![1.0],
            compact: vec![0; 4],
            bore: vec![0.0; 16],
            pixels: vec![0; 4],
            weights: vec![0.0; 12],
            data: vec![0.0; 4],
            g2l: vec![0],
            zmap: vec![0.0; 12],
            finite: vec![1],
            n_amp_views: vec![2],
            amp_offset: vec![0],
            amps: vec![0.0; 2],
            amp_flags: vec![0; 2],
        }
    }

    fn accumulate(f: &Fixture) -> abi::FusedAccumulateArgs {
        abi::FusedAccumulateArgs {
            n_det: 1,
            n_samp: 4,
            pixel_index: f.idx.as_ptr(),
            weight_index: f.idx.as_ptr(),
            focalplane: f.fp.as_ptr(),
            epsilon: f.one.as_ptr(),
            gamma: f.one.as_ptr(),
            cal: f.one.as_ptr(),
            data_index: f.idx.as_ptr(),
            flag_index: f.idx.as_ptr(),
            det_scale: f.one.as_ptr(),
            finite: f.finite.as_ptr(),
            layout: OffsetLayout {
                step_length: 2,
                n_amp_views: f.n_amp_views.as_ptr(),
                amp_offset: f.amp_offset.as_ptr(),
            },
            intervals: SampleRanges {
                ptr: f.ivs.as_ptr(),
                len: 1,
            },
            global2local: arr(&f.g2l),
            n_pix_submap: 4,
            compact: arr(&f.compact),
            boresight: arr(&f.bore),
            pointing_flags: Array::ABSENT,
            hwp: Array::ABSENT,
            pixels: Array::ABSENT,
            weights: Array::ABSENT,
            det_data: Array::ABSENT,
            det_flags: Array::ABSENT,
            shared_flags: Array::ABSENT,
            amplitudes: arr(&f.amps),
            amplitude_flags: arr(&f.amp_flags),
            zmap: arr(&f.zmap),
            det_flag_mask: 0,
            shared_flag_mask: 0,
            pointing_flag_mask: 0,
            iau: 0,
            reserved: [0; 4],
        }
    }

    fn check(a: &abi::FusedAccumulateArgs) -> Result<Fused<'_>, ArgError> {
        // SAFETY: every pointer of the fixture is valid for its length.
        unsafe { check_fused_accumulate(a) }
    }

    #[test]
    fn one_pointing_form_at_a_time() {
        let f = fixture();
        let a = accumulate(&f);
        assert!(check(&a).unwrap().pointing.compact);
        let mut kept = a;
        kept.compact = Array::ABSENT;
        kept.boresight = Array::ABSENT;
        kept.pixels = arr(&f.pixels);
        kept.weights = arr(&f.weights);
        assert!(!check(&kept).unwrap().pointing.compact);
        let mut both = a;
        both.pixels = arr(&f.pixels);
        let e = check(&both).unwrap_err();
        assert_eq!(e.arg, "pixels", "{e}");
        let mut short = a;
        short.boresight.len = 15;
        assert_eq!(check(&short).unwrap_err().arg, "boresight");
    }

    #[test]
    fn layout_allows_detectors_without_amplitudes_and_checks_blocks() {
        let mut f = fixture();
        f.amp_offset = vec![-1];
        assert!(check(&accumulate(&f)).is_ok());
        f.amp_offset = vec![1];
        let e = check(&accumulate(&f)).unwrap_err();
        assert_eq!(e.arg, "layout.amp_offset", "{e}");
        f.amp_offset = vec![0];
        f.n_amp_views = vec![1];
        assert_eq!(
            check(&accumulate(&f)).unwrap_err().arg,
            "layout.n_amp_views"
        );
    }

    #[test]
    fn maps_and_flags_are_sized() {
        let mut f = fixture();
        f.zmap = vec![0.0; 11];
        assert_eq!(check(&accumulate(&f)).unwrap_err().arg, "zmap");
        let f = fixture();
        let flags = [0u8; 4];
        let bad = [1i32];
        let mut a = accumulate(&f);
        a.det_flags = arr(&flags);
        assert!(check(&a).is_ok());
        a.flag_index = bad.as_ptr();
        assert_eq!(check(&a).unwrap_err().arg, "flag_index");
    }

    #[test]
    fn project_needs_amplitudes_for_f_a() {
        let f = fixture();
        let out = vec![0.0; 2];
        let a = accumulate(&f);
        let mut p = abi::FusedProjectArgs {
            n_det: a.n_det,
            n_samp: a.n_samp,
            pixel_index: a.pixel_index,
            weight_index: a.weight_index,
            focalplane: a.focalplane,
            epsilon: a.epsilon,
            gamma: a.gamma,
            cal: a.cal,
            data_index: a.data_index,
            flag_index: a.flag_index,
            det_scale: a.det_scale,
            layout: a.layout,
            intervals: a.intervals,
            global2local: a.global2local,
            n_pix_submap: 4,
            compact: a.compact,
            boresight: a.boresight,
            pointing_flags: Array::ABSENT,
            hwp: Array::ABSENT,
            pixels: Array::ABSENT,
            weights: Array::ABSENT,
            det_data: Array::ABSENT,
            det_flags: Array::ABSENT,
            mapdata: a.zmap,
            amplitudes: a.amplitudes,
            amplitude_flags: a.amplitude_flags,
            amplitudes_out: arr(&out),
            det_flag_mask: 0,
            pointing_flag_mask: 0,
            iau: 0,
            reserved: [0; 5],
        };
        // SAFETY: every pointer of the fixture is valid for its length.
        assert!(unsafe { check_fused_project(&p) }.is_ok());
        p.amplitudes = Array::ABSENT;
        // SAFETY: as above, with one array absent.
        let e = unsafe { check_fused_project(&p) }.unwrap_err();
        assert_eq!(e.arg, "amplitudes", "{e}");
        p.det_data = arr(&f.data);
        // SAFETY: as above.
        assert!(unsafe { check_fused_project(&p) }.is_ok());
    }
}
