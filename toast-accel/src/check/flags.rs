//! Validation of `solver_flags` (ABI minor 6): the destriping solver's
//! sample flags (TOAST's `SolveAmplitudes` solver flags and `ScanMask`),
//! OR-ed into a u8 field, with the view's cut and total samples counted.
//!
//! The detector and shared flags are each optional; the pixel mask comes
//! with its pixels and `global2local`, or none of them. The output rows are
//! distinct (two detectors OR-ing into one row would race). The samples
//! outside every interval are given to the backends as ranges
//! ([`SolverFlags::gaps`]), so no backend tests membership per sample.

use super::{det_flag_rows, host, intervals, local_submaps, optional_len, sample_rows, ArgError};
use crate::abi::{self, SampleRange};

/// Validated `solver_flags` arguments.
#[derive(Debug, Clone)]
pub struct SolverFlags<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    /// Empty without `det_flags`.
    pub flag_index: &'a [i32],
    /// Empty without `pixel_mask`.
    pub pixel_index: &'a [i32],
    pub out_index: &'a [i32],
    pub intervals: &'a [SampleRange],
    /// The samples of `[0, n_samp)` outside every interval, as sorted,
    /// disjoint ranges.
    pub gaps: Vec<SampleRange>,
    pub n_pix_submap: i64,
    pub n_global_submap: usize,
    pub n_local_submap: usize,
    pub use_det_flags: bool,
    pub use_shared_flags: bool,
    pub use_mask: bool,
}

/// The ranges of `[0, n_samp)` that no interval covers, sorted (intervals
/// lie in `[0, n_samp]`, checked by [`super::intervals`]).
pub fn view_gaps(intervals: &[SampleRange], n_samp: i64) -> Vec<SampleRange> {
    let mut iv: Vec<(i64, i64)> = intervals
        .iter()
        .filter(|i| i.last > i.first)
        .map(|i| (i.first, i.last))
        .collect();
    iv.sort_unstable();
    let mut gaps = Vec::new();
    let mut at = 0i64;
    for (first, last) in iv {
        if first > at {
            gaps.push(SampleRange {
                first: at,
                last: first,
            });
        }
        at = at.max(last);
    }
    if at < n_samp {
        gaps.push(SampleRange {
            first: at,
            last: n_samp,
        });
    }
    gaps
}

/// Check the arguments of `solver_flags` (not the entries of
/// `global2local`: see [`super::global2local`]).
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_solver_flags<'a>(
    a: &abi::SolverFlagsArgs,
) -> Result<SolverFlags<'a>, ArgError> {
    const K: &str = "solver_flags";
    if a.cut_bit == 0 && a.mask_bit == 0 {
        return Err(ArgError::new(
            K,
            "cut_bit",
            "cut_bit and mask_bit are both 0: the call would flag nothing",
        ));
    }
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let out_index = unsafe { host(K, "out_index", a.out_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to
    // `a.intervals.len` host intervals; `intervals` refuses a null pointer
    // where there are some.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    sample_rows(
        K,
        "flags",
        a.flags.len,
        a.n_samp,
        1,
        "[n_out_rows, n_samp]",
        "out_index",
        out_index,
    )?;
    let mut rows: Vec<i32> = out_index.to_vec();
    rows.sort_unstable();
    if let Some(w) = rows.windows(2).find(|w| w[0] == w[1]) {
        return Err(ArgError::new(
            K,
            "out_index",
            format!(
                "row {} of flags is given for two detectors (each detector needs a row of its own)",
                w[0]
            ),
        ));
    }
    if a.counts.len != 2 {
        return Err(ArgError::new(
            K,
            "counts",
            format!("length {}, expected 2 (cut, total)", a.counts.len),
        ));
    }
    let use_shared_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    let use_det_flags = a.det_flags.len != 0;
    // SAFETY: the caller guarantees `a.flag_index` points to n_det host
    // i32s when det_flags is present (header: read only then).
    let flag_index = unsafe { det_flag_rows(K, a.det_flags.len, a.flag_index, a.n_det, a.n_samp)? };
    let use_mask = a.pixel_mask.len != 0;
    let (pixel_index, n_local_submap) = if use_mask {
        let n_local = local_submaps(K, "pixel_mask", a.pixel_mask.len, a.n_pix_submap, 1)?;
        if a.global2local.len == 0 {
            return Err(ArgError::new(
                K,
                "global2local",
                "absent, but the pixel mask needs it",
            ));
        }
        // SAFETY: the caller guarantees `a.pixel_index` points to n_det
        // host i32s when pixel_mask is present (header: read only then).
        let pi = unsafe { host(K, "pixel_index", a.pixel_index, a.n_det)? };
        sample_rows(
            K,
            "pixels",
            a.pixels.len,
            a.n_samp,
            1,
            "[n_rows, n_samp]",
            "pixel_index",
            pi,
        )?;
        (pi, n_local as usize)
    } else {
        for (arg, len) in [
            ("pixels", a.pixels.len),
            ("global2local", a.global2local.len),
        ] {
            if len != 0 {
                return Err(ArgError::new(
                    K,
                    arg,
                    format!(
                        "length {len}, but a call without pixel_mask reads none (pass it absent)"
                    ),
                ));
            }
        }
        (&[][..], 0)
    };
    Ok(SolverFlags {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        flag_index,
        pixel_index,
        out_index,
        intervals,
        gaps: view_gaps(intervals, a.n_samp as i64),
        n_pix_submap: a.n_pix_submap,
        n_global_submap: a.global2local.len as usize,
        n_local_submap,
        use_det_flags,
        use_shared_flags,
        use_mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Array, SampleRanges};

    const IDX: [i32; 2] = [0, 1];
    const IV: [SampleRange; 2] = [
        SampleRange { first: 1, last: 3 },
        SampleRange { first: 2, last: 4 },
    ];

    /// Two detectors of 6 samples, every input, two submaps of 4 pixels.
    fn args() -> abi::SolverFlagsArgs {
        let arr = |ptr: u64, len: u64| Array { ptr, len };
        abi::SolverFlagsArgs {
            n_det: 2,
            n_samp: 6,
            flag_index: IDX.as_ptr(),
            pixel_index: IDX.as_ptr(),
            out_index: IDX.as_ptr(),
            intervals: SampleRanges {
                ptr: IV.as_ptr(),
                len: 2,
            },
            global2local: arr(1, 3),
            n_pix_submap: 4,
            det_flags: arr(2, 12),
            shared_flags: arr(3, 6),
            pixels: arr(4, 12),
            pixel_mask: arr(5, 8),
            flags: arr(6, 12),
            counts: arr(7, 2),
            det_flag_mask: 1,
            shared_flag_mask: 1,
            cut_bit: 1,
            mask_bit: 4,
            reserved: [0; 4],
        }
    }

    fn err(a: &abi::SolverFlagsArgs) -> String {
        // SAFETY: the host pointers are the constants above, of the stated lengths.
        unsafe { check_solver_flags(a) }.unwrap_err().to_string()
    }

    #[test]
    fn valid_arguments_and_their_gaps() {
        // SAFETY: as in `err`.
        let v = unsafe { check_solver_flags(&args()) }.unwrap();
        assert!(v.use_det_flags && v.use_shared_flags && v.use_mask);
        assert_eq!(v.n_local_submap, 2);
        let g: Vec<(i64, i64)> = v.gaps.iter().map(|r| (r.first, r.last)).collect();
        assert_eq!(g, [(0, 1), (4, 6)]);
        let none = view_gaps(&[], 3);
        assert_eq!((none.len(), none[0].first, none[0].last), (1, 0, 3));
        assert!(view_gaps(&[SampleRange { first: 0, last: 3 }], 3).is_empty());
    }

    #[test]
    fn each_rule_is_enforced() {
        let mut a = args();
        a.cut_bit = 0;
        a.mask_bit = 0;
        assert!(err(&a).contains("flag nothing"), "{}", err(&a));
        let mut a = args();
        a.counts.len = 3;
        assert!(err(&a).contains("counts"), "{}", err(&a));
        const SAME: [i32; 2] = [1, 1];
        let mut a = args();
        a.out_index = SAME.as_ptr();
        assert!(err(&a).contains("two detectors"), "{}", err(&a));
        let mut a = args();
        a.global2local.len = 0;
        assert!(err(&a).contains("needs it"), "{}", err(&a));
        let mut a = args();
        a.pixel_mask.len = 0;
        assert!(err(&a).contains("without pixel_mask"), "{}", err(&a));
        let mut a = args();
        a.pixel_mask.len = 7;
        assert!(err(&a).contains("pixel_mask"), "{}", err(&a));
        let mut a = args();
        a.flags.len = 11;
        assert!(err(&a).contains("flags"), "{}", err(&a));
        let mut a = args();
        a.shared_flags.len = 5;
        assert!(err(&a).contains("shared_flags"), "{}", err(&a));
    }
}
