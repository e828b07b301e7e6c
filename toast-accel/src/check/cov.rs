//! Validation of `cov_accum_timestream` (ABI minor 5): the hit map and the
//! packed inverse covariance accumulated from the timestream's pointing
//! (TOAST's `BuildHitMap` and `BuildInverseCovariance`).
//!
//! Either output may be absent, not both. The Stokes weights, their row
//! index and the detector weights are read only with `invnpp`, and must be
//! absent without it (a hits-only call takes no weights); when both maps
//! are present they hold the same number of local submaps.

use super::{det_flag_rows, host, intervals, local_submaps, optional_len, sample_rows, ArgError};
use crate::abi::{self, SampleRange};

/// The largest `nnz` of a call with `invnpp` (as `cov_accum_diag_invnpp`).
const MAX_NNZ: u64 = 1 << 16;

/// Validated `cov_accum_timestream` arguments.
#[derive(Debug, Clone, Copy)]
pub struct CovAccumTimestream<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    /// Weights per sample (1 in a hits-only call, which reads none).
    pub nnz: usize,
    /// `nnz (nnz + 1) / 2`: elements per pixel of `invnpp`.
    pub block: usize,
    pub pixel_index: &'a [i32],
    /// Empty without `invnpp`.
    pub weight_index: &'a [i32],
    /// Empty without `det_flags`.
    pub flag_index: &'a [i32],
    /// Empty without `invnpp`.
    pub det_scale: &'a [f64],
    pub intervals: &'a [SampleRange],
    pub n_pix_submap: i64,
    pub n_global_submap: usize,
    pub n_local_submap: usize,
    pub use_hits: bool,
    pub use_invnpp: bool,
    pub use_det_flags: bool,
    pub use_shared_flags: bool,
}

/// Check the arguments of `cov_accum_timestream` (not the entries of
/// `global2local`: see [`super::global2local`]).
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_cov_accum_timestream<'a>(
    a: &abi::CovAccumTimestreamArgs,
) -> Result<CovAccumTimestream<'a>, ArgError> {
    const K: &str = "cov_accum_timestream";
    let use_hits = a.hits.len != 0;
    let use_invnpp = a.invnpp.len != 0;
    if !use_hits && !use_invnpp {
        return Err(ArgError::new(
            K,
            "hits",
            "hits and invnpp are both absent: the call would accumulate nothing",
        ));
    }
    if !(1..=MAX_NNZ).contains(&a.nnz) {
        return Err(ArgError::new(
            K,
            "nnz",
            format!("nnz = {}, must be in [1, {MAX_NNZ}]", a.nnz),
        ));
    }
    let block = a.nnz * (a.nnz + 1) / 2;
    // SAFETY: host arrays of n_det elements by the caller's contract.
    let pixel_index = unsafe { host(K, "pixel_index", a.pixel_index, a.n_det)? };
    // SAFETY: the caller guarantees `a.intervals.ptr` points to
    // `a.intervals.len` host intervals; `intervals` refuses a null pointer.
    let intervals = unsafe { intervals(K, &a.intervals, a.n_samp)? };
    let n_hits = if use_hits {
        Some(local_submaps(K, "hits", a.hits.len, a.n_pix_submap, 1)?)
    } else {
        None
    };
    let n_invnpp = if use_invnpp {
        Some(local_submaps(
            K,
            "invnpp",
            a.invnpp.len,
            a.n_pix_submap,
            block,
        )?)
    } else {
        None
    };
    let n_local_submap = match (n_hits, n_invnpp) {
        (Some(h), Some(i)) if h != i => {
            return Err(ArgError::new(
                K,
                "invnpp",
                format!("holds {i} local submaps, hits {h}: the maps must match"),
            ))
        }
        (Some(n), _) | (None, Some(n)) => n,
        (None, None) => unreachable!("one output is present (checked above)"),
    };
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
    let (weight_index, det_scale) = if use_invnpp {
        // SAFETY: the caller guarantees `a.weight_index` and `a.det_scale`
        // point to n_det host values when invnpp is present (header: read
        // only then), and this branch runs only then.
        let (wi, ds) = unsafe {
            (
                host(K, "weight_index", a.weight_index, a.n_det)?,
                host(K, "det_scale", a.det_scale, a.n_det)?,
            )
        };
        sample_rows(
            K,
            "weights",
            a.weights.len,
            a.n_samp,
            a.nnz,
            "[n_rows, n_samp, nnz]",
            "weight_index",
            wi,
        )?;
        (wi, ds)
    } else {
        if a.weights.len != 0 {
            return Err(ArgError::new(
                K,
                "weights",
                format!(
                    "length {}, but a call without invnpp reads no weights (pass it absent)",
                    a.weights.len
                ),
            ));
        }
        (&[][..], &[][..])
    };
    let use_shared_flags = optional_len(K, "shared_flags", a.shared_flags.len, a.n_samp, "n_samp")?;
    let use_det_flags = a.det_flags.len != 0;
    // SAFETY: the caller guarantees `a.flag_index` points to n_det host
    // i32s when det_flags is present (header: read only then).
    let flag_index = unsafe { det_flag_rows(K, a.det_flags.len, a.flag_index, a.n_det, a.n_samp)? };
    Ok(CovAccumTimestream {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        nnz: a.nnz as usize,
        block: block as usize,
        pixel_index,
        weight_index,
        flag_index,
        det_scale,
        intervals,
        n_pix_submap: a.n_pix_submap,
        n_global_submap: a.global2local.len as usize,
        n_local_submap: n_local_submap as usize,
        use_hits,
        use_invnpp,
        use_det_flags,
        use_shared_flags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{Array, SampleRanges};

    const IDX: [i32; 2] = [0, 1];
    const SCALE: [f64; 2] = [1.0, 2.0];
    const IV: [SampleRange; 1] = [SampleRange { first: 0, last: 5 }];

    /// Two detectors of 5 samples, nnz 3, two submaps of 4 pixels, both maps.
    fn args() -> abi::CovAccumTimestreamArgs {
        let arr = |ptr: u64, len: u64| Array { ptr, len };
        abi::CovAccumTimestreamArgs {
            n_det: 2,
            n_samp: 5,
            nnz: 3,
            pixel_index: IDX.as_ptr(),
            weight_index: IDX.as_ptr(),
            flag_index: IDX.as_ptr(),
            det_scale: SCALE.as_ptr(),
            intervals: SampleRanges {
                ptr: IV.as_ptr(),
                len: 1,
            },
            global2local: arr(1, 3),
            n_pix_submap: 4,
            pixels: arr(2, 10),
            weights: arr(3, 30),
            det_flags: arr(4, 10),
            shared_flags: arr(5, 5),
            hits: arr(6, 8),
            invnpp: arr(7, 48),
            det_flag_mask: 1,
            shared_flag_mask: 1,
            reserved: [0; 6],
        }
    }

    fn err(a: abi::CovAccumTimestreamArgs) -> String {
        // SAFETY: the host arrays of `args` are the statics above.
        unsafe { check_cov_accum_timestream(&a) }
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn valid_calls_give_their_view() {
        // SAFETY: the host arrays of `args` are the statics above.
        let v = unsafe { check_cov_accum_timestream(&args()) }.unwrap();
        assert_eq!((v.n_local_submap, v.block, v.nnz), (2, 6, 3));
        assert!(v.use_hits && v.use_invnpp && v.use_det_flags && v.use_shared_flags);
        let mut a = args();
        a.invnpp = Array::ABSENT;
        a.weights = Array::ABSENT;
        a.weight_index = std::ptr::null();
        a.det_scale = std::ptr::null();
        a.det_flags = Array::ABSENT;
        a.flag_index = std::ptr::null();
        // SAFETY: as above; the null pointers are not read without their arrays.
        let v = unsafe { check_cov_accum_timestream(&a) }.unwrap();
        assert!(v.use_hits && !v.use_invnpp && !v.use_det_flags);
        assert!(v.weight_index.is_empty() && v.det_scale.is_empty());
        let mut a = args();
        a.hits = Array::ABSENT;
        // SAFETY: as above.
        assert!(unsafe { check_cov_accum_timestream(&a) }.is_ok());
    }

    #[test]
    fn each_rule_names_its_argument() {
        let mut a = args();
        a.hits = Array::ABSENT;
        a.invnpp = Array::ABSENT;
        assert!(err(a).contains("both absent"), "{}", err(a));
        let mut a = args();
        a.nnz = 0;
        assert!(err(a).contains("`nnz`"));
        let mut a = args();
        a.hits.len = 9;
        assert!(err(a).contains("`hits`"));
        let mut a = args();
        a.invnpp.len = 24;
        assert!(err(a).contains("must match"), "{}", err(a));
        let mut a = args();
        a.pixels.len = 5;
        assert!(err(a).contains("`pixel_index`"), "{}", err(a));
        let mut a = args();
        a.weights.len = 20;
        assert!(err(a).contains("`weights`"), "{}", err(a));
        let mut a = args();
        a.invnpp = Array::ABSENT;
        assert!(err(a).contains("reads no weights"), "{}", err(a));
        let mut a = args();
        a.shared_flags.len = 4;
        assert!(err(a).contains("`shared_flags`"));
        let mut a = args();
        a.det_flags.len = 5;
        assert!(err(a).contains("`flag_index`"), "{}", err(a));
        let mut a = args();
        a.det_scale = std::ptr::null();
        assert!(err(a).contains("`det_scale`"), "{}", err(a));
        let mut a = args();
        a.n_pix_submap = 0;
        assert!(err(a).contains("n_pix_submap"));
    }
}
