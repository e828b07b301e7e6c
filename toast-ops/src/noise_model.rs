//! TOAST's analytic detector noise model (`AnalyticNoise`): its
//! parameters, its PSD on TOAST's frequency grid and the detector noise
//! weight.
//!
//! A layer of its own, below the operators and the simulation: the noise
//! weighting ([`crate::ops`]) reads the weights, and the noise simulation
//! ([`crate::sim::noise`], where the PSD and its normalisation are
//! described) draws timestreams from the PSD.

/// Errors from the noise model and simulation.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum NoiseError {
    /// An invalid scalar parameter.
    #[error("invalid noise parameter {name} = {}: {reason}", toast_core::num::Compact(*.value))]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// Offending value.
        value: f64,
        /// Why.
        reason: &'static str,
    },
    /// Tabulated PSD unusable for the requested simulation.
    #[error("PSD table: {0}")]
    BadPsd(String),
    /// Length mismatch between related arrays.
    #[error("{what}: expected length {expected}, got {got}")]
    LengthMismatch {
        /// Which array.
        what: &'static str,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
}

/// Parameters of a detector's analytic noise model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AnalyticNoiseParams {
    /// Sample rate (Hz).
    pub rate: f64,
    /// Noise-equivalent temperature (K √s).
    pub net: f64,
    /// Knee frequency (Hz); 0 for white noise.
    pub fknee: f64,
    /// Low-frequency roll-off (Hz).
    pub fmin: f64,
    /// Slope exponent α (positive).
    pub alpha: f64,
}

impl AnalyticNoiseParams {
    /// The benchmark's detectors: NET 50 µK√s, f_knee 0.05 Hz, f_min 1e-5 Hz,
    /// α = 1, 100 Hz.
    pub fn benchmark() -> Self {
        Self {
            rate: 100.0,
            net: 50.0e-6,
            fknee: 0.05,
            fmin: 1.0e-5,
            alpha: 1.0,
        }
    }

    /// The model of a focal-plane detector (`DefaultNoiseModel`), at the
    /// sample rate `rate` (the focal plane's nominal rate in TOAST).
    pub fn from_detector(det: &crate::astro::focalplane::Detector, rate: f64) -> Self {
        Self {
            rate,
            net: det.psd_net,
            fknee: det.psd_fknee,
            fmin: det.psd_fmin,
            alpha: det.psd_alpha,
        }
    }

    fn validate(&self) -> Result<(), NoiseError> {
        let bad = |name, value, reason| {
            Err(NoiseError::InvalidParameter {
                name,
                value,
                reason,
            })
        };
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return bad("rate", self.rate, "must be positive and finite");
        }
        if !(self.net >= 0.0 && self.net.is_finite()) {
            return bad("net", self.net, "must be non-negative and finite");
        }
        if !(self.alpha >= 0.0 && self.alpha.is_finite()) {
            return bad(
                "alpha",
                self.alpha,
                "alpha must be positive in this formalism",
            );
        }
        if !(self.fmin >= 0.0 && self.fknee >= 0.0) {
            return bad("fknee", self.fknee, "frequencies must be non-negative");
        }
        if self.fknee > 0.0 && self.fknee < self.fmin {
            return bad(
                "fknee",
                self.fknee,
                "if the knee frequency is non-zero it must be >= fmin",
            );
        }
        Ok(())
    }

    /// The PSD at frequency `f` (K² s).
    pub fn psd_at(&self, f: f64) -> f64 {
        let net2 = self.net * self.net;
        if self.fknee > 0.0 {
            let t = f.powf(self.alpha);
            net2 * (t + self.fknee.powf(self.alpha)) / (t + self.fmin.powf(self.alpha))
        } else {
            net2
        }
    }

    /// TOAST's `AnalyticNoise` frequency grid and PSD values.
    pub fn tabulate(&self) -> Result<(Vec<f64>, Vec<f64>), NoiseError> {
        self.validate()?;
        let freqs = analytic_freqs(self.rate);
        let psd = freqs.iter().map(|&f| self.psd_at(f)).collect();
        Ok((freqs, psd))
    }

    /// Noise weight `1 / (NET² rate)` (1/K²), as `AnalyticNoise`; 0 for a
    /// zero NET.
    pub fn detector_weight(&self) -> f64 {
        if self.net == 0.0 {
            0.0
        } else {
            1.0 / (self.net * self.net) / self.rate
        }
    }
}

/// TOAST's `AnalyticNoise` frequency grid: `1e-9 · 1.4^j` Hz below Nyquist,
/// then Nyquist.
pub fn analytic_freqs(rate: f64) -> Vec<f64> {
    let nyquist = rate / 2.0;
    let mut v = Vec::new();
    let mut cur = 1.0e-9;
    while cur < nyquist {
        v.push(cur);
        cur *= 1.4;
    }
    v.push(nyquist);
    v
}
