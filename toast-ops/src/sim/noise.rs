//! Analytic 1/f detector noise and its simulation (TOAST's `AnalyticNoise`,
//! `DefaultNoiseModel` and `SimNoise`).
//!
//! # Noise model
//!
//! The PSD of each detector is
//!
//! ```text
//! P(f) = NET² (f^α + f_knee^α) / (f^α + f_min^α)        [K² s = K²/Hz]
//! ```
//!
//! (`P = NET²` when `f_knee = 0`), tabulated, as TOAST's `AnalyticNoise`
//! does, on the logarithmic grid `f_j = 1e-9 Hz · 1.4^j` below the Nyquist
//! frequency plus the Nyquist frequency itself. TOAST's PSD normalisation is
//! "two-sided": white noise of PSD `NET²` has variance `σ² = NET² · f_s`, and
//! the periodogram estimator of `P` is `|X_k|² / (N f_s)` with
//! `X_k = Σ_n x_n e^{−2πikn/N}`. The detector noise weight is
//! `1 / (NET² f_s)` (`AnalyticNoise._detector_weight`), i.e. the inverse
//! white-noise variance per sample.
//!
//! # Simulation (`tod_sim_noise_timestream`, the compiled kernel SimNoise uses)
//!
//! For `n` samples with oversampling 2, the FFT length `N` is the smallest
//! power of two strictly greater than `2n`. The Fourier amplitude
//! `A_k = sqrt(P(f'_k) · f_s (N/2))` is interpolated linearly in
//! `log10(f + δ)`–`log10(A + s)` from the tabulated PSD at
//! `f'_k = k δ`, `δ = f_s/(N − 1)`, with the shift `s = 0.01 min(P > 0)`
//! (TOAST's choices, reproduced exactly), and `A_0 = 0`. With `N` standard
//! Gaussian deviates `g_j`, the half-complex spectrum is
//! `X_0 = 0`, `X_k = A_k (g_k + i g_{N−k})` for `0 < k < N/2`,
//! `X_{N/2} = A_{N/2} g_{N/2}`; the inverse real FFT divided by `N` gives a
//! periodic stream of which the central `n` samples (from `(N − n)/2`) are
//! kept, minus their mean. This makes `E|X_k|²/(N f_s) = P(f_k)` and the
//! white-noise variance `NET² f_s`.
//!
//! # Random numbers
//!
//! Deviates come from a counter-based generator, **Threefry-2x64-20**
//! (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2,
//! 3", SC'11; the Random123 library), implemented here from the paper and
//! checked against its published known-answer vectors. A stream is
//! identified by the 128-bit key and the high counter word; sample `j` of a
//! stream uses the counter `(0, c0 + j)` and only the first output word, as
//! TOAST does. Because every deviate is a pure function of (key, counter),
//! the noise of a detector is independent of how detectors and observations
//! are split across threads or processes.
//!
//! The key layout is TOAST's ([`NoiseKey`]):
//! `key = (realization·2³² + telescope·2¹⁶ + component,
//!         session·2³² + detector)` and `c0 = first_sample · oversample`,
//! where the telescope, session and detector numbers are TOAST's `name_UID`s
//! ([`toast_core::uid`]). The uniform deviate is Random123's `u01`:
//! `u = w · 2⁻⁶⁴ + 2⁻⁶⁵`, and the Gaussian is `√2 erfinv(2u − 1)` with
//! M. Giles' double-precision erfinv ("Approximating the erfinv function",
//! GPU Computing Gems Jade Edition, 2011). With the same key this reproduces
//! TOAST's noise to ~2e-15 of its rms (FFT round-off); TOAST's copy of Giles'
//! polynomial duplicates two coefficient pairs in its `w ≥ 16` branch, so
//! for the rare deviates beyond ≈5.4σ (about one per 17 detector-hours)
//! TOAST's value is off by ~1e-7 relative and ours is the accurate one.
//!
//! # Where it runs
//!
//! This module is the host's part, O(N) per noise model: the key layout
//! ([`NoiseKey`]) and the Fourier amplitudes ([`NoiseFilter`]). The
//! per-sample part (`N` deviates and one inverse real FFT of length `N` per
//! detector, the central samples, the mean) is the `sim_noise` kernel of
//! the kernel table, which `SimNoise` calls on the run's backend
//! (`crate::exec::kernels::sim_noise`): on the CPU plugin
//! (`backend-cpu/src/kernels/noise.rs`, `realfft`, bit for bit what this
//! module computed before), on a device in the shared device source
//! (`toast-accel/device/kernels.h`: Threefry and erfinv per deviate, a
//! radix-2 Stockham FFT batched over detectors), so on a device run the
//! noise never crosses the bus.
//!
//! `SimNoise` passes the sample rate measured from the timestamps
//! ([`crate::astro::scan_strategy::rate_from_times`]: 100.0000954 Hz for the benchmark's
//! timestamps); use the same value to reproduce TOAST exactly.

pub use crate::noise_model::{analytic_freqs, AnalyticNoiseParams, NoiseError};

/// Identifies one noise stream, with TOAST's `SimNoise` key layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NoiseKey {
    /// Monte Carlo realization index.
    pub realization: u64,
    /// Telescope UID (`name_UID(telescope name)`).
    pub telescope: u64,
    /// Component (0 for detector noise).
    pub component: u64,
    /// Observation key: TOAST uses the session UID.
    pub session: u64,
    /// Detector UID (`name_UID(detector name)`, the noise-model index).
    pub detector: u64,
}

impl NoiseKey {
    /// The 128-bit Threefry key `(realization·2³² + telescope·2¹⁶ +
    /// component, session·2³² + detector)` (wrapping, as TOAST's uint64).
    pub fn rng_key(&self) -> [u64; 2] {
        [
            self.realization
                .wrapping_mul(1 << 32)
                .wrapping_add(self.telescope.wrapping_mul(1 << 16))
                .wrapping_add(self.component),
            self.session
                .wrapping_mul(1 << 32)
                .wrapping_add(self.detector),
        ]
    }
}

// ---------------------------------------------------------------------------
// Simulation
// ---------------------------------------------------------------------------

/// Fourier-domain filter for simulating `n_samples` of noise with a given
/// tabulated PSD: the FFT length and the interpolated amplitudes. It depends
/// only on the PSD, rate and length, so detectors sharing a noise model
/// share one filter.
#[derive(Debug, Clone)]
pub struct NoiseFilter {
    n_samples: usize,
    oversample: usize,
    fft_len: usize,
    amplitude: Vec<f64>,
}

impl NoiseFilter {
    /// Interpolate the tabulated PSD (`freq` increasing, in Hz, ending at
    /// Nyquist; `psd` in K² s) onto the FFT grid, exactly as TOAST's
    /// `tod_sim_noise_psd_interp`.
    pub fn new(
        rate: f64,
        n_samples: usize,
        oversample: usize,
        freq: &[f64],
        psd: &[f64],
    ) -> Result<Self, NoiseError> {
        if !(rate > 0.0 && rate.is_finite()) {
            return Err(NoiseError::InvalidParameter {
                name: "rate",
                value: rate,
                reason: "must be positive and finite",
            });
        }
        if n_samples == 0 || oversample == 0 {
            return Err(NoiseError::InvalidParameter {
                name: if n_samples == 0 {
                    "n_samples"
                } else {
                    "oversample"
                },
                value: 0.0,
                reason: "must be positive",
            });
        }
        if freq.len() != psd.len() {
            return Err(NoiseError::LengthMismatch {
                what: "psd values vs frequencies",
                expected: freq.len(),
                got: psd.len(),
            });
        }
        if freq.len() < 2 {
            return Err(NoiseError::BadPsd(format!(
                "need at least 2 frequencies, got {}",
                freq.len()
            )));
        }
        let mut fft_len = 2usize;
        while fft_len <= oversample * n_samples {
            fft_len *= 2;
        }
        let npsd = fft_len / 2 + 1;
        let norm = rate * (npsd - 1) as f64;
        let increment = rate / (fft_len - 1) as f64;
        if freq[0] > increment {
            return Err(NoiseError::BadPsd(format!(
                "lowest frequency {} Hz does not allow interpolation to {increment} Hz",
                freq[0]
            )));
        }
        let nyquist = 0.5 * rate;
        let last = freq[freq.len() - 1];
        if ((last - nyquist) / nyquist).abs() > 0.01 {
            return Err(NoiseError::BadPsd(format!(
                "last frequency {last} Hz does not match the Nyquist frequency {nyquist} Hz"
            )));
        }
        if let Some(bad) = psd.iter().find(|p| !(**p >= 0.0 && p.is_finite())) {
            return Err(NoiseError::BadPsd(format!(
                "PSD values must be finite and >= 0, found {bad}"
            )));
        }
        if let Some(w) = freq
            .windows(2)
            .find(|w| w[1].partial_cmp(&w[0]) != Some(std::cmp::Ordering::Greater))
        {
            return Err(NoiseError::BadPsd(format!(
                "frequencies must increase, found {} then {}",
                w[0], w[1]
            )));
        }
        let logfreq: Vec<f64> = freq.iter().map(|f| (f + increment).log10()).collect();
        let stepinv: Vec<f64> = logfreq.windows(2).map(|w| 1.0 / (w[1] - w[0])).collect();
        let psdmin = psd
            .iter()
            .copied()
            .filter(|&p| p != 0.0)
            .fold(1e30, f64::min);
        let psdshift = 0.01 * psdmin;
        let logpsd: Vec<f64> = psd
            .iter()
            .map(|p| ((p * norm).sqrt() + psdshift).log10())
            .collect();
        let nb = freq.len();
        let mut amplitude = vec![0.0; npsd];
        let mut ibin = 0usize;
        for (i, a) in amplitude.iter_mut().enumerate() {
            let lf = (increment * i as f64 + increment).log10();
            while ibin < nb - 2 && logfreq[ibin + 1] < lf {
                ibin += 1;
            }
            let r = (lf - logfreq[ibin]) * stepinv[ibin];
            *a = 10f64.powf(logpsd[ibin] + r * (logpsd[ibin + 1] - logpsd[ibin])) - psdshift;
        }
        amplitude[0] = 0.0;
        Ok(Self {
            n_samples,
            oversample,
            fft_len,
            amplitude,
        })
    }

    /// Filter for an analytic model over `n_samples` with TOAST's
    /// oversampling of 2.
    pub fn analytic(params: &AnalyticNoiseParams, n_samples: usize) -> Result<Self, NoiseError> {
        let (f, p) = params.tabulate()?;
        Self::new(params.rate, n_samples, 2, &f, &p)
    }

    /// Number of samples produced.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }

    /// FFT length (a power of two greater than `oversample · n_samples`).
    pub fn fft_len(&self) -> usize {
        self.fft_len
    }

    /// The low counter word of deviate 0 of a stream starting at sample
    /// `first_sample` (TOAST's `first_sample * oversample`).
    pub fn counter0(&self, first_sample: u64) -> u64 {
        first_sample.wrapping_mul(self.oversample as u64)
    }

    /// Interpolated Fourier amplitudes `A_k`, `k = 0..=N/2`.
    pub fn amplitude(&self) -> &[f64] {
        &self.amplitude
    }

    /// Expected sample variance `E[(1/n) Σ (x_m − x̄)²]` of the output:
    /// [`Self::expected_variance`] minus the expected square of the segment
    /// mean, `Σ_k c_k A_k² D_k / N²` with the Fejér factor
    /// `D_k = (sin(πkn/N) / (n sin(πk/N)))²` (`c_k` = 4, or 1 at Nyquist).
    /// This is the variance one should measure on a simulated segment; it is
    /// below the full-band variance because fluctuations longer than the
    /// segment are removed with the mean.
    pub fn expected_sample_variance(&self) -> f64 {
        let n_fft = self.fft_len as f64;
        let n = self.n_samples as f64;
        let half = self.fft_len / 2;
        let mut mean_sq = 0.0;
        for (k, a) in self.amplitude.iter().enumerate().skip(1) {
            let x = std::f64::consts::PI * k as f64 / n_fft;
            let d = ((x * n).sin() / (n * x.sin())).powi(2);
            let c = if k == half { 1.0 } else { 4.0 };
            mean_sq += c * a * a * d;
        }
        self.expected_variance() - mean_sq / (n_fft * n_fft)
    }

    /// Expected variance of the simulated samples before the mean is
    /// removed: `(4 Σ_{0<k<N/2} A_k² + A_{N/2}²) / N²`.
    pub fn expected_variance(&self) -> f64 {
        let n = self.fft_len;
        let inner: f64 = self.amplitude[1..n / 2].iter().map(|a| a * a).sum();
        let nyq = self.amplitude[n / 2];
        (4.0 * inner + nyq * nyq) / (n as f64 * n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::rng::{gaussian, uniform_01, uniform_u64};
    use realfft::RealFftPlanner;
    use toast_backend_cpu::noise::{stream, NoiseWorkspace};

    /// One stream of the CPU plugin's `sim_noise` math.
    fn sim_noise_timestream(
        filter: &NoiseFilter,
        key: &NoiseKey,
        first_sample: u64,
        ws: &mut NoiseWorkspace,
        out: &mut [f64],
    ) {
        let c0 = filter.counter0(first_sample);
        stream(filter.amplitude(), key.rng_key(), c0, ws, out).unwrap();
    }

    /// `rows[d] += noise(keys[d])` through the CPU plugin's `sim_noise`
    /// kernel with `threads` threads (all rows of one length, one filter).
    fn sim_noise_add(
        threads: usize,
        filter: &NoiseFilter,
        keys: &[NoiseKey],
        rows: &mut [Vec<f64>],
    ) {
        let reg = toast_testkit::plugins::registry_with_cpu(threads);
        let b = reg.get("cpu").unwrap();
        let n = filter.n_samples();
        let mut flat: Vec<f64> = rows.iter().flatten().copied().collect();
        let data_index: Vec<i32> = (0..keys.len() as i32).collect();
        let filter_index = vec![0i32; keys.len()];
        let words: Vec<u64> = keys.iter().flat_map(NoiseKey::rng_key).collect();
        let args = toast_accel::abi::SimNoiseArgs {
            n_det: keys.len() as u64,
            n_samp: n as u64,
            fft_len: filter.fft_len() as u64,
            n_filter: 1,
            counter0: filter.counter0(0),
            data_index: data_index.as_ptr(),
            filter_index: filter_index.as_ptr(),
            keys: words.as_ptr(),
            amplitudes: filter.amplitude().as_ptr(),
            det_data: toast_accel::abi::Array {
                ptr: flat.as_mut_ptr() as u64,
                len: flat.len() as u64,
            },
        };
        // SAFETY: the CPU plugin is host-addressable; every pointer is a
        // live vector of the length the struct gives.
        unsafe { b.launch(&args) }.unwrap();
        for (r, f) in rows.iter_mut().zip(flat.chunks(n)) {
            r.copy_from_slice(f);
        }
    }

    struct Vectors {
        lines: Vec<(String, Vec<String>, Vec<String>)>,
    }

    fn vectors() -> Vectors {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/satsim/noise_vectors.txt"
        );
        let text = std::fs::read_to_string(path).expect("read noise vectors");
        let lines = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (head, tail) = l.split_once(" | ").expect("separator");
                let mut h = head.split_whitespace().map(String::from);
                let kind = h.next().expect("kind");
                (
                    kind,
                    h.collect(),
                    tail.split_whitespace().map(String::from).collect(),
                )
            })
            .collect();
        Vectors { lines }
    }

    fn f(s: &str) -> f64 {
        s.parse().expect("float")
    }

    fn u(s: &str) -> u64 {
        s.parse().expect("integer")
    }

    #[test]
    fn matches_toast_rng() {
        let v = vectors();
        let mut n = 0;
        for (kind, head, vals) in &v.lines {
            if !["u64", "u01", "gauss"].contains(&kind.as_str()) {
                continue;
            }
            let key = [u(&head[0]), u(&head[1])];
            let ctr = [u(&head[2]), u(&head[3])];
            match kind.as_str() {
                "u64" => {
                    let mut out = vec![0u64; vals.len()];
                    uniform_u64(key, ctr, &mut out);
                    let want: Vec<u64> = vals.iter().map(|x| u(x)).collect();
                    assert_eq!(out, want);
                }
                "u01" => {
                    let mut out = vec![0.0; vals.len()];
                    uniform_01(key, ctr, &mut out);
                    let want: Vec<f64> = vals.iter().map(|x| f(x)).collect();
                    assert_eq!(out, want, "uniform_01 must match bit for bit");
                }
                _ => {
                    let mut out = vec![0.0; vals.len()];
                    gaussian(key, ctr, &mut out);
                    for (g, w) in out.iter().zip(vals) {
                        let w = f(w);
                        assert!((g - w).abs() <= 2e-15 * w.abs().max(1.0), "{g} vs {w}");
                    }
                }
            }
            n += 1;
        }
        assert_eq!(n, 9);
    }

    fn benchmark_model(v: &Vectors) -> (Vec<f64>, Vec<f64>) {
        let (_, head, vals) = v.lines.iter().find(|l| l.0 == "psd").expect("psd record");
        let params = AnalyticNoiseParams {
            rate: f(&head[0]),
            net: f(&head[1]),
            fknee: f(&head[2]),
            fmin: f(&head[3]),
            alpha: f(&head[4]),
        };
        assert_eq!(params, AnalyticNoiseParams::benchmark());
        let fp = crate::astro::focalplane::benchmark_focalplane(12).unwrap();
        assert_eq!(
            AnalyticNoiseParams::from_detector(&fp.detectors[5], fp.sample_rate),
            params
        );
        let weight = f(&head[5]);
        assert!((params.detector_weight() - weight).abs() <= 1e-15 * weight);
        let sep = vals.iter().position(|x| x == ";").expect("; separator");
        let freqs: Vec<f64> = vals[..sep].iter().map(|x| f(x)).collect();
        let psd: Vec<f64> = vals[sep + 1..].iter().map(|x| f(x)).collect();
        let (my_f, my_p) = params.tabulate().unwrap();
        assert_eq!(my_f.len(), freqs.len());
        for (a, b) in my_f.iter().zip(&freqs) {
            assert!((a - b).abs() <= 1e-15 * b, "grid {a} vs {b}");
        }
        for (a, b) in my_p.iter().zip(&psd) {
            assert!((a - b).abs() <= 1e-14 * b, "psd {a} vs {b}");
        }
        (freqs, psd)
    }

    /// Noise streams of TOAST's compiled `tod_sim_noise_timestream` with
    /// the same keys: identical up to FFT round-off.
    #[test]
    fn matches_toast_timestreams() {
        let v = vectors();
        let (freqs, psd) = benchmark_model(&v);
        let mut n = 0;
        let mut worst: f64 = 0.0;
        for (kind, head, vals) in &v.lines {
            if kind != "sim" {
                continue;
            }
            let key = NoiseKey {
                realization: u(&head[0]),
                telescope: u(&head[1]),
                component: u(&head[2]),
                session: u(&head[3]),
                detector: u(&head[4]),
            };
            let rate = f(&head[5]);
            let first = u(&head[6]);
            let ns = u(&head[7]) as usize;
            let stride = u(&head[8]) as usize;
            let filter = NoiseFilter::new(rate, ns, 2, &freqs, &psd).unwrap();
            let mut ws = NoiseWorkspace::new(filter.fft_len());
            let mut out = vec![0.0; ns];
            sim_noise_timestream(&filter, &key, first, &mut ws, &mut out);
            let want: Vec<f64> = vals.iter().map(|x| f(x)).collect();
            let rms = (want.iter().map(|x| x * x).sum::<f64>() / want.len() as f64).sqrt();
            for (i, w) in want.iter().enumerate() {
                let err = (out[i * stride] - w).abs() / rms;
                worst = worst.max(err);
            }
            n += 1;
        }
        eprintln!("noise vs TOAST timestreams: max |diff| / rms = {worst:e}");
        assert_eq!(n, 3);
        assert!(worst < 1e-9, "noise differs from TOAST by {worst} rms");
    }

    #[test]
    fn determinism_and_threads() {
        let params = AnalyticNoiseParams::benchmark();
        let n = 3000;
        let filter = NoiseFilter::analytic(&params, n).unwrap();
        let keys: Vec<NoiseKey> = (0..6)
            .map(|d| NoiseKey {
                realization: 0,
                telescope: 7,
                component: 0,
                session: 11,
                detector: 100 + d,
            })
            .collect();
        let run = |threads: usize| {
            let mut bufs = vec![vec![0.0; n]; keys.len()];
            sim_noise_add(threads, &filter, &keys, &mut bufs);
            bufs
        };
        let one = run(1);
        let two = run(2);
        assert_eq!(one, two, "noise must not depend on the thread count");
        // Same key, same stream; different detector, different stream.
        let mut ws = NoiseWorkspace::new(filter.fft_len());
        let mut again = vec![0.0; n];
        sim_noise_timestream(&filter, &keys[3], 0, &mut ws, &mut again);
        assert_eq!(again, one[3]);
        assert_ne!(one[0], one[1]);
        // Accumulation: adding twice doubles.
        let mut acc = vec![one[2].clone()];
        sim_noise_add(1, &filter, &keys[2..3], &mut acc);
        for (a, b) in acc[0].iter().zip(&one[2]) {
            assert!((a - 2.0 * b).abs() <= 1e-15 * b.abs().max(1e-30));
        }
        // Errors name the offending value.
        let err = NoiseFilter::new(100.0, 10_000, 2, &[1.0, 50.0], &[1.0, 1.0]).unwrap_err();
        assert!(err.to_string().contains("lowest frequency 1"), "{err}");
        let bad = AnalyticNoiseParams {
            fknee: 1e-6,
            ..AnalyticNoiseParams::benchmark()
        };
        assert!(bad.tabulate().unwrap_err().to_string().contains("fknee"));
    }

    /// Statistics of one detector-hour (360 000 samples at 100 Hz) for 8
    /// detectors with the benchmark model: variance and band-averaged
    /// periodograms against the model, and against TOAST's statistics for
    /// the same keys.
    #[test]
    fn detector_hour_statistics() {
        let v = vectors();
        let params = AnalyticNoiseParams::benchmark();
        let n = 360_000;
        let filter = NoiseFilter::analytic(&params, n).unwrap();
        let stats: Vec<(&Vec<String>, &Vec<String>)> = v
            .lines
            .iter()
            .filter(|l| l.0 == "stat")
            .map(|l| (&l.1, &l.2))
            .take(8)
            .collect();
        assert_eq!(stats.len(), 8);
        let keys: Vec<NoiseKey> = stats
            .iter()
            .map(|(h, _)| NoiseKey {
                realization: 0,
                telescope: u64::from(toast_core::uid::name_uid("satellite")),
                component: 0,
                session: 1_949_512_818,
                detector: u(&h[1]),
            })
            .collect();
        for ((h, _), k) in stats.iter().zip(&keys) {
            assert_eq!(u64::from(toast_core::uid::name_uid(&h[0])), k.detector);
        }
        let mut bufs = vec![vec![0.0; n]; keys.len()];
        sim_noise_add(2, &filter, &keys, &mut bufs);
        let bands = [(0.001, 0.03), (0.05, 0.5), (10.0, 50.0)];
        let rate = params.rate;
        let white_var = params.net * params.net * rate;
        let mut planner = RealFftPlanner::<f64>::new();
        let fwd = planner.plan_fft_forward(n);
        let mut sum_var = 0.0;
        let mut sum_band = [0.0; 3];
        let mut nbins = [0usize; 3];
        let mut model_band = [0.0; 3];
        let mut max_toast_diff: f64 = 0.0;
        for (x, (_, toast)) in bufs.iter().zip(&stats) {
            let mean = x.iter().sum::<f64>() / n as f64;
            let var = x.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n as f64 / white_var;
            let mut inp = x.clone();
            let mut spec = fwd.make_output_vec();
            fwd.process(&mut inp, &mut spec).unwrap();
            let mut mine = vec![var];
            for (b, &(lo, hi)) in bands.iter().enumerate() {
                let (mut p, mut m, mut c) = (0.0, 0.0, 0usize);
                for (k, s) in spec.iter().enumerate() {
                    let fk = k as f64 * rate / n as f64;
                    if fk >= lo && fk < hi {
                        p += s.norm_sqr() / (n as f64 * rate);
                        m += params.psd_at(fk);
                        c += 1;
                    }
                }
                mine.push(p / m);
                sum_band[b] += p / m;
                nbins[b] = c;
                model_band[b] = m / c as f64;
            }
            sum_var += var;
            for (a, t) in mine.iter().zip(toast.iter()) {
                max_toast_diff = max_toast_diff.max((a - f(t)).abs());
            }
        }
        let nd = keys.len() as f64;
        let var_ratio = sum_var / nd;
        let expected_var = filter.expected_sample_variance() / white_var;
        eprintln!(
            "noise statistics ({} detector-hours): variance / (NET^2 rate) = {var_ratio:.5} \
             (model {expected_var:.5}, full band {:.5}); max |stat - TOAST stat| = {max_toast_diff:.2e}",
            keys.len(),
            filter.expected_variance() / white_var
        );
        // Variance: the white part dominates; its relative error is
        // sqrt(2/n) per detector, the 1/f part adds ~0.1% of scatter.
        let sigma_var = (2.0 / n as f64 / nd).sqrt() * expected_var;
        assert!(
            (var_ratio - expected_var).abs() < 4.0 * sigma_var + 1e-3,
            "variance ratio {var_ratio} vs {expected_var}"
        );
        assert!((var_ratio - 1.0).abs() < 0.05);
        for b in 0..3 {
            let ratio = sum_band[b] / nd;
            // Each periodogram bin is exponentially distributed: relative
            // error 1/sqrt(bins) of the band average.
            let sigma = 1.0 / ((nbins[b] as f64) * nd).sqrt();
            eprintln!(
                "  band {:?} Hz: <periodogram>/<model> = {ratio:.4} +- {sigma:.4} \
                 (model PSD {:.3e} K^2 s)",
                bands[b], model_band[b]
            );
            assert!(
                (ratio - 1.0).abs() < 4.0 * sigma,
                "band {:?}: {ratio}",
                bands[b]
            );
            if sigma < 0.0125 {
                assert!((ratio - 1.0).abs() < 0.05);
            }
        }
        assert!(
            max_toast_diff < 1e-6,
            "stats differ from TOAST's: {max_toast_diff}"
        );
    }
}
