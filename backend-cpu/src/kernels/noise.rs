//! sim_noise: TOAST's `tod_sim_noise_timestream` per detector, added to the
//! detector's row of `det_data` (moved here from toast-ops'
//! `sim::noise::{sim_noise_timestream, sim_noise_add}`; the same operations,
//! so the noise keeps its bits).
//!
//! Per detector: `N = fft_len` Gaussian deviates
//! (`toast_accel::math::rng::gaussian`, Threefry-2x64-20 at counters
//! `(0, counter0 + j)`), the half-complex spectrum `X_0 = A_0 g_0` (0: TOAST
//! sets `A_0 = 0`), `X_k = A_k (g_k + i g_{N-k})`, `X_{N/2} = A_{N/2} g_{N/2}`,
//! an inverse real FFT ([`realfft`]), the central `n_samp` samples times
//! `1/N`, minus their mean (summed in sample order), added to the row.
//! Detectors run in parallel, one per task; a pool passes the FFT plan and
//! buffers ([`NoiseWorkspace`]) from detector to detector, so at most one
//! per thread is made. The result does not depend on the thread count.

use crate::arrays;
use crate::par::SharedMut;
use rayon::prelude::*;
use realfft::num_complex::Complex;
use realfft::RealFftPlanner;
use std::sync::Arc;
use toast_accel::abi::SimNoiseArgs;
use toast_accel::check::SimNoise;
use toast_accel::math::rng::gaussian;
use toast_accel::plugin_support::PluginError;

const K: &str = "sim_noise";

/// Reusable FFT plan and buffers for streams of one FFT length.
pub struct NoiseWorkspace {
    plan: Arc<dyn realfft::ComplexToReal<f64>>,
    gauss: Vec<f64>,
    spectrum: Vec<Complex<f64>>,
    time: Vec<f64>,
    scratch: Vec<Complex<f64>>,
}

impl std::fmt::Debug for NoiseWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoiseWorkspace")
            .field("fft_len", &self.time.len())
            .finish()
    }
}

impl NoiseWorkspace {
    /// Plan an inverse real FFT of length `fft_len` (> 0).
    pub fn new(fft_len: usize) -> Self {
        let mut planner = RealFftPlanner::<f64>::new();
        let plan = planner.plan_fft_inverse(fft_len);
        let n = plan.len();
        NoiseWorkspace {
            gauss: vec![0.0; n],
            spectrum: plan.make_input_vec(),
            time: plan.make_output_vec(),
            scratch: plan.make_scratch_vec(),
            plan,
        }
    }

    /// FFT length this workspace serves.
    pub fn fft_len(&self) -> usize {
        self.time.len()
    }
}

/// One noise stream into `out` (overwritten, `out.len()` samples, fewer
/// than `ws.fft_len()`): `amplitude` holds `A_k`, `k = 0..=N/2`.
///
/// # Panics
/// If `amplitude` has fewer than `N/2 + 1` values or `out` is not shorter
/// than `N` (the validator refuses both).
pub fn stream(
    amplitude: &[f64],
    key: [u64; 2],
    counter0: u64,
    ws: &mut NoiseWorkspace,
    out: &mut [f64],
) -> Result<(), String> {
    let n = ws.fft_len();
    let n_samples = out.len();
    gaussian(key, [0, counter0], &mut ws.gauss);
    let amp = amplitude;
    let g = &ws.gauss;
    ws.spectrum[0] = Complex::new(g[0] * amp[0], 0.0);
    for k in 1..n / 2 {
        ws.spectrum[k] = Complex::new(g[k] * amp[k], g[n - k] * amp[k]);
    }
    ws.spectrum[n / 2] = Complex::new(g[n / 2] * amp[n / 2], 0.0);
    ws.plan
        .process_with_scratch(&mut ws.spectrum, &mut ws.time, &mut ws.scratch)
        .map_err(|e| format!("inverse FFT failed: {e}"))?;
    let offset = (n - n_samples) / 2;
    let scale = 1.0 / n as f64;
    let src = &ws.time[offset..offset + n_samples];
    for (o, s) in out.iter_mut().zip(src) {
        *o = s * scale;
    }
    let dc = out.iter().sum::<f64>() / n_samples as f64;
    for o in out.iter_mut() {
        *o -= dc;
    }
    Ok(())
}

/// # Safety
/// `a` has passed `check_sim_noise` (giving `v`) and its arrays are host
/// memory of the stated lengths.
pub(crate) unsafe fn run(v: &SimNoise<'_>, a: &SimNoiseArgs) -> Result<(), PluginError> {
    if v.n_det == 0 || v.n_samp == 0 {
        return Ok(());
    }
    // SAFETY: host array of the validated length; the only array argument.
    let det_data = SharedMut::new(unsafe { arrays::output::<f64>(K, "det_data", a.det_data)? });
    let n_samp = v.n_samp;
    let pool: std::sync::Mutex<Vec<(NoiseWorkspace, Vec<f64>)>> = Default::default();
    (0..v.n_det)
        .into_par_iter()
        .with_max_len(1)
        .try_for_each(|d| {
            let taken = pool.lock().map(|mut p| p.pop()).unwrap_or(None);
            let (mut ws, mut buf) =
                taken.unwrap_or_else(|| (NoiseWorkspace::new(v.fft_len), Vec::new()));
            buf.resize(n_samp, 0.0);
            stream(v.amplitude(d), v.key(d), v.counter0, &mut ws, &mut buf)
                .map_err(|e| PluginError::invalid(format!("{K}: detector {d}: {e}")))?;
            let row = v.data_index[d] as usize;
            // SAFETY: the validator made the rows of the detectors distinct,
            // so this task alone writes row `row`, inside the array.
            let sig = unsafe { det_data.slice_mut(row * n_samp, n_samp) };
            for (s, b) in sig.iter_mut().zip(buf.iter()) {
                *s += b;
            }
            if let Ok(mut p) = pool.lock() {
                p.push((ws, buf));
            }
            Ok(())
        })
}
