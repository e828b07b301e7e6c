//! Validation of `sim_noise` (ABI minor 5): TOAST's
//! `tod_sim_noise_timestream` for a set of detectors, added to their rows
//! of `det_data`.
//!
//! The rules: `fft_len` is a power of two above `n_samp` (the kept samples
//! are the central `n_samp` of the FFT output) and at most
//! [`MAX_NOISE_FFT_LEN`]; each detector names its own row of `det_data`
//! (two detectors adding to one row would race on every backend) and a row
//! of `amplitudes` (`n_filter` rows of `fft_len / 2 + 1` finite values
//! `>= 0`); `keys` holds two words per detector.

use super::{host, index_rows, mul, sample_rows, ArgError};
use crate::abi;

/// The largest FFT length `sim_noise` takes: 2^40 samples (TOAST's
/// oversampled length of an observation of 2^39 samples, 174 years at
/// 100 Hz).
pub const MAX_NOISE_FFT_LEN: u64 = 1 << 40;

/// The validated arguments of `sim_noise`.
#[derive(Debug, Clone, Copy)]
pub struct SimNoise<'a> {
    pub n_det: usize,
    pub n_samp: usize,
    /// `N`, a power of two `> n_samp`.
    pub fft_len: usize,
    /// Low counter word of deviate 0.
    pub counter0: u64,
    /// `[n_det]`, distinct rows of `det_data`.
    pub data_index: &'a [i32],
    /// `[n_det]`, rows of `amplitudes`.
    pub filter_index: &'a [i32],
    /// `[2 n_det]`.
    pub keys: &'a [u64],
    /// `[n_filter][fft_len / 2 + 1]`.
    pub amplitudes: &'a [f64],
}

impl<'a> SimNoise<'a> {
    /// Values per row of `amplitudes`: `fft_len / 2 + 1`.
    pub fn n_amp(&self) -> usize {
        self.fft_len / 2 + 1
    }

    /// The amplitudes of detector `d`.
    pub fn amplitude(&self, d: usize) -> &'a [f64] {
        let n = self.n_amp();
        let f = self.filter_index[d] as usize;
        &self.amplitudes[f * n..(f + 1) * n]
    }

    /// The Threefry key of detector `d`.
    pub fn key(&self, d: usize) -> [u64; 2] {
        [self.keys[2 * d], self.keys[2 * d + 1]]
    }
}

/// Check the arguments of `sim_noise`.
///
/// # Safety
/// The host pointers of `a` must be valid for the lengths the header gives.
pub unsafe fn check_sim_noise<'a>(a: &abi::SimNoiseArgs) -> Result<SimNoise<'a>, ArgError> {
    const K: &str = "sim_noise";
    if !a.fft_len.is_power_of_two() || a.fft_len < 2 || a.fft_len > MAX_NOISE_FFT_LEN {
        return Err(ArgError::new(
            K,
            "fft_len",
            format!(
                "{} is not a power of two in [2, 2^40] (TOAST's FFT length: the smallest power \
                 of two above oversample x n_samp)",
                a.fft_len
            ),
        ));
    }
    if a.fft_len <= a.n_samp {
        return Err(ArgError::new(
            K,
            "fft_len",
            format!(
                "{} does not exceed n_samp = {}: the kept samples are the central n_samp of \
                 the FFT",
                a.fft_len, a.n_samp
            ),
        ));
    }
    if a.n_det > 0 && a.n_filter == 0 {
        return Err(ArgError::new(
            K,
            "n_filter",
            format!("0 amplitude rows for {} detectors", a.n_det),
        ));
    }
    // SAFETY: host arrays of the header's lengths by the caller's contract;
    // `host` refuses a null pointer for a non-zero length.
    let data_index = unsafe { host(K, "data_index", a.data_index, a.n_det)? };
    // SAFETY: as above.
    let filter_index = unsafe { host(K, "filter_index", a.filter_index, a.n_det)? };
    let n_keys = mul(K, "keys", a.n_det, 2)?;
    // SAFETY: as above.
    let keys = unsafe { host(K, "keys", a.keys, n_keys)? };
    let n_amp = mul(K, "amplitudes", a.n_filter, a.fft_len / 2 + 1)?;
    // SAFETY: as above.
    let amplitudes = unsafe { host(K, "amplitudes", a.amplitudes, n_amp)? };
    index_rows(K, "filter_index", filter_index, a.n_filter, "amplitudes")?;
    if let Some(i) = amplitudes
        .iter()
        .position(|x| !(x.is_finite() && *x >= 0.0))
    {
        return Err(ArgError::new(
            K,
            "amplitudes",
            format!(
                "amplitudes[{}][{}] = {} is not a finite value >= 0",
                i as u64 / (a.fft_len / 2 + 1),
                i as u64 % (a.fft_len / 2 + 1),
                amplitudes[i]
            ),
        ));
    }
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
    let mut sorted: Vec<(i32, usize)> = data_index.iter().copied().zip(0..).collect();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ArgError::new(
            K,
            "data_index",
            format!(
                "detectors {} and {} both add to row {} of det_data (each detector needs its \
                 own row)",
                w[0].1, w[1].1, w[0].0
            ),
        ));
    }
    Ok(SimNoise {
        n_det: a.n_det as usize,
        n_samp: a.n_samp as usize,
        fft_len: a.fft_len as usize,
        counter0: a.counter0,
        data_index,
        filter_index,
        keys,
        amplitudes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Array;

    struct Owned {
        data_index: Vec<i32>,
        filter_index: Vec<i32>,
        keys: Vec<u64>,
        amplitudes: Vec<f64>,
    }

    fn owned() -> Owned {
        Owned {
            data_index: vec![1, 0],
            filter_index: vec![0, 0],
            keys: vec![1, 2, 3, 4],
            amplitudes: vec![0.0, 1.0, 2.0, 3.0, 4.0],
        }
    }

    fn args(o: &Owned) -> abi::SimNoiseArgs {
        abi::SimNoiseArgs {
            n_det: 2,
            n_samp: 3,
            fft_len: 8,
            n_filter: 1,
            counter0: 0,
            data_index: o.data_index.as_ptr(),
            filter_index: o.filter_index.as_ptr(),
            keys: o.keys.as_ptr(),
            amplitudes: o.amplitudes.as_ptr(),
            det_data: Array { ptr: 1, len: 6 },
        }
    }

    fn err(a: &abi::SimNoiseArgs) -> ArgError {
        // SAFETY: the pointers come from live vectors of `owned()` of the
        // lengths the struct gives (or are refused before being read).
        unsafe { check_sim_noise(a) }.unwrap_err()
    }

    #[test]
    fn valid_arguments_give_the_view() {
        let o = owned();
        // SAFETY: pointers of live vectors with the struct's lengths.
        let v = unsafe { check_sim_noise(&args(&o)) }.unwrap();
        assert_eq!((v.n_det, v.n_samp, v.fft_len, v.n_amp()), (2, 3, 8, 5));
        assert_eq!(v.key(1), [3, 4]);
        assert_eq!(v.amplitude(1), &[0.0, 1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn each_rule_names_its_argument() {
        let o = owned();
        let a = args(&o);
        let e = err(&abi::SimNoiseArgs { fft_len: 12, ..a });
        assert_eq!(e.arg, "fft_len");
        assert!(e.problem.contains("12 is not a power of two"), "{e}");
        let e = err(&abi::SimNoiseArgs { fft_len: 2, ..a });
        assert!(e.problem.contains("does not exceed n_samp = 3"), "{e}");
        let e = err(&abi::SimNoiseArgs { n_filter: 0, ..a });
        assert_eq!(e.arg, "n_filter");
        let e = err(&abi::SimNoiseArgs {
            keys: std::ptr::null(),
            ..a
        });
        assert_eq!(e.arg, "keys");
        let e = err(&abi::SimNoiseArgs {
            det_data: Array { ptr: 1, len: 5 },
            ..a
        });
        assert_eq!(e.arg, "det_data");
        let mut bad = owned();
        bad.filter_index[1] = 1;
        let e = err(&args(&bad));
        assert_eq!(e.arg, "filter_index");
        let mut bad = owned();
        bad.amplitudes[3] = f64::NAN;
        let e = err(&args(&bad));
        assert!(e.problem.contains("amplitudes[0][3] = NaN"), "{e}");
        let mut bad = owned();
        bad.amplitudes[2] = -1.0;
        assert_eq!(err(&args(&bad)).arg, "amplitudes");
        let mut bad = owned();
        bad.data_index[0] = 0;
        let e = err(&args(&bad));
        assert!(
            e.problem.contains("detectors 0 and 1 both add to row 0"),
            "{e}"
        );
        bad.data_index[0] = 2;
        assert_eq!(err(&args(&bad)).arg, "data_index");
    }
}
