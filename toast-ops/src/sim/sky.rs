//! The synthetic input sky of the satellite benchmark (`fake_input_sky_nside1024.fits`).
//!
//! TOAST's `benchmarking_utilities.create_input_maps` draws the map with
//! `healpy.synfast(cls, nside, pol=True, new=True, fwhm=3′)` from these
//! spectra, for `ℓ = 0 .. 3·nside − 2` (arrays of length `3 nside − 1`):
//!
//! ```text
//! C_ℓ^TT = 2000 · N(ℓ; 30, 50)      N(ℓ; μ, σ) = exp(−(ℓ−μ)²/2σ²) / (σ√(2π))
//! C_ℓ^EE =    1 · N(ℓ; 500, 100)
//! C_ℓ^BB = C_ℓ^TE = 0
//! ```
//!
//! smoothed with a 3′ FWHM Gaussian beam (`σ_b = FWHM/√(8 ln 2)`), temperature
//! `B_ℓ = exp(−ℓ(ℓ+1)σ_b²/2)`, polarisation `B_ℓ exp(2σ_b²)` (healpy's
//! `smoothalm(pol=True)`), no pixel window, written as float32 NESTED maps in
//! unit `K`. We reproduce the same statistics with our own random numbers:
//!
//! * **Random a_ℓm**: a counter-based Philox4x32-10 generator keyed by the seed;
//!   the counter is `(ℓ, m, field, 0)`, so every coefficient is independent of
//!   `lmax`, thread count and evaluation order. Two 53-bit uniforms → Box–Muller
//!   → one complex normal. As in `healpy.synalm`, `a_ℓ0 = √C_ℓ g` (real) and
//!   `a_ℓm = √(C_ℓ/2)(g₁ + i g₂)` for `m > 0`; a non-zero `C^TE` is honoured with
//!   the usual Cholesky factor (`a^E = (C^TE/√C^TT) g_T + √(C^EE − (C^TE)²/C^TT) g_E`).
//!   The realisation differs from TOAST's (numpy's Mersenne Twister), the
//!   statistics do not.
//! * **Band limit**: the spectra (times beam²) fall below `10⁻¹⁰` of their peak
//!   beyond ℓ ≈ 370 (TT) and ℓ ≈ 1170 (EE) (Gaussian tails). By default
//!   ([`SkyConfig::rel_tol`]) each field is synthesised up to the last ℓ where
//!   `C_ℓ B_ℓ²` exceeds `rel_tol` × its peak, instead of healpy's `3 nside − 2`.
//!   The neglected map variance is below `10⁻¹⁰` relative
//!   ([`SkyTruncation::lost_variance_fraction`]); the pixel-level error is of
//!   order `√10⁻¹⁰ ≈ 10⁻⁵` of the RMS. This cuts the synthesis cost by ~7× at
//!   nside 1024.
//! * **Synthesis**: [`crate::math::sht`] (ring-based Legendre recurrences + FFT, rayon),
//!   each ring stored as float32 at its NEST pixels as soon as it is
//!   synthesised ([`sht::alm2map_iqu_as`]): the sky's only full-sky arrays
//!   are the three float32 maps it returns.
//! * **TOAST's ordering bug**: TOAST 3.0.6 writes the RING-ordered synfast
//!   output labelled `ORDERING = 'NESTED'`, so its benchmark actually scans a
//!   pixel-scrambled sky. [`SkyConfig::toast_ring_as_nest`] reproduces that.
//!
//! The expected map variance is `Σ_ℓ (2ℓ+1)/(4π) C_ℓ B_ℓ²` for I (minus the
//! monopole for the variance about the mean) and half of that sum over EE+BB
//! for each of Q and U ([`expected_variance`]).

use rayon::prelude::*;
use realfft::num_complex::Complex64;

use crate::math::healpix::{HealpixError, Nside};
use crate::math::rng::philox_normal_pair;
use crate::math::sht::{self, Alm, MapOrder, ShtError};

/// Seed TOAST uses (`np.random.seed(123456789)`), our default too.
pub const TOAST_SKY_SEED: u64 = 123_456_789;
/// Beam FWHM of the benchmark sky, arcmin.
pub const TOAST_SKY_FWHM_ARCMIN: f64 = 3.0;

/// Errors of sky generation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SkyError {
    /// Invalid resolution.
    #[error(transparent)]
    Healpix(#[from] HealpixError),
    /// Synthesis failure.
    #[error(transparent)]
    Sht(#[from] ShtError),
    /// Invalid configuration.
    #[error("invalid sky configuration: {0}")]
    Config(String),
    /// A collective across the processes failed.
    #[error("{0}")]
    Comm(String),
    /// A failure of the synthesis itself, not of its configuration (a
    /// panic on its thread, a failure on another process).
    #[error("{0}")]
    Internal(String),
}

// =====================================================================
// Spectra and beam
// =====================================================================

/// Angular power spectra `C_ℓ`, `ℓ = 0..len`.
#[derive(Debug, Clone, PartialEq)]
pub struct Spectra {
    /// Temperature.
    pub tt: Vec<f64>,
    /// E mode.
    pub ee: Vec<f64>,
    /// B mode.
    pub bb: Vec<f64>,
    /// Temperature–E cross spectrum.
    pub te: Vec<f64>,
}

impl Spectra {
    /// Highest multipole given (`len − 1`).
    pub fn lmax(&self) -> usize {
        self.tt.len().saturating_sub(1)
    }
}

/// The spectra of TOAST's `create_input_maps` for `nside`: `ℓ = 0..=3 nside − 2`.
pub fn benchmark_spectra(nside: Nside) -> Result<Spectra, SkyError> {
    let n = 3 * nside.get() as usize - 1;
    let gauss = |l: f64, mu: f64, sig: f64| {
        (1.0 / (sig * (2.0 * std::f64::consts::PI).sqrt()))
            * (-0.5 * (l - mu).powi(2) / sig.powi(2)).exp()
    };
    Ok(Spectra {
        tt: (0..n)
            .map(|l| 2000.0 * gauss(l as f64, 30.0, 50.0))
            .collect(),
        ee: (0..n).map(|l| gauss(l as f64, 500.0, 100.0)).collect(),
        bb: vec![0.0; n],
        te: vec![0.0; n],
    })
}

/// Gaussian beam window functions `(B_ℓ^T, B_ℓ^P)`, `ℓ = 0..=lmax`, as
/// `healpy.gauss_beam(fwhm, lmax, pol=True)[:, 0]` and `[:, 1]`.
pub fn gauss_beam(fwhm_rad: f64, lmax: usize) -> (Vec<f64>, Vec<f64>) {
    let sigma2 = (fwhm_rad / (8.0 * 2f64.ln()).sqrt()).powi(2);
    let bt: Vec<f64> = (0..=lmax)
        .map(|l| (-0.5 * (l * (l + 1)) as f64 * sigma2).exp())
        .collect();
    let pf = (2.0 * sigma2).exp();
    let bp = bt.iter().map(|b| b * pf).collect();
    (bt, bp)
}

/// Expected full-sky variances `(I, Q, U)` of a map drawn from `spectra`
/// smoothed by `beam = (B^T, B^P)`, using `ℓ ≤ lmax_t` for I and `ℓ ≤ lmax_p`
/// for Q/U. The I variance is about the map mean (ℓ = 0 excluded).
pub fn expected_variance(
    spectra: &Spectra,
    beam: (&[f64], &[f64]),
    lmax_t: usize,
    lmax_p: usize,
) -> (f64, f64, f64) {
    let f = |l: usize| (2 * l + 1) as f64 / (4.0 * std::f64::consts::PI);
    let vt: f64 = (1..=lmax_t.min(spectra.lmax()))
        .map(|l| f(l) * spectra.tt[l] * beam.0[l].powi(2))
        .sum();
    let vp: f64 = (2..=lmax_p.min(spectra.lmax()))
        .map(|l| f(l) * (spectra.ee[l] + spectra.bb[l]) * beam.1[l].powi(2))
        .sum();
    (vt, 0.5 * vp, 0.5 * vp)
}

/// Last ℓ where `cl[ℓ] · beam[ℓ]²` exceeds `rel_tol` times its maximum (0 if all zero).
pub fn truncation_lmax(cl: &[f64], beam: &[f64], rel_tol: f64) -> usize {
    let p: Vec<f64> = cl.iter().zip(beam).map(|(c, b)| c * b * b).collect();
    let peak = p.iter().cloned().fold(0.0, f64::max);
    if peak <= 0.0 {
        return 0;
    }
    p.iter().rposition(|&v| v > rel_tol * peak).unwrap_or(0)
}

// =====================================================================
// Random a_lm
// =====================================================================

/// The a_ℓm of one m (T, E, B, for ℓ = m, m+1, …).
type MRow = (usize, Vec<Complex64>, Vec<Complex64>, Vec<Complex64>);

/// Draws `(a^T, a^E, a^B)` from `spectra` (no beam) with the seeded Philox
/// stream; `a^T` up to `lmax_t`, `a^E`, `a^B` up to `lmax_p` (both at most
/// `spectra.lmax()`).
pub fn synalm(
    spectra: &Spectra,
    lmax_t: usize,
    lmax_p: usize,
    seed: u64,
) -> Result<(Alm, Alm, Alm), SkyError> {
    if lmax_t > spectra.lmax() || lmax_p > spectra.lmax() {
        return Err(SkyError::Config(format!(
            "lmax_t {lmax_t} / lmax_p {lmax_p} beyond the spectra's lmax {}",
            spectra.lmax()
        )));
    }
    let key = [seed as u32, (seed >> 32) as u32];
    let lmax = lmax_t.max(lmax_p);
    let mut t = Alm::zeros(lmax_t);
    let mut e = Alm::zeros(lmax_p);
    let mut b = Alm::zeros(lmax_p);
    // Per m, in parallel: the coefficients of one m are contiguous in each Alm.
    let per_m: Vec<MRow> = (0..=lmax)
        .into_par_iter()
        .map(|m| {
            let draw = |l: usize, field: u32| -> Complex64 {
                let (g1, g2) = philox_normal_pair([l as u32, m as u32, field, 0], key);
                if m == 0 {
                    Complex64::new(g1, 0.0)
                } else {
                    Complex64::new(g1, g2) * std::f64::consts::FRAC_1_SQRT_2
                }
            };
            let mut vt = Vec::new();
            let mut ve = Vec::new();
            let mut vb = Vec::new();
            for l in m..=lmax {
                let tt = spectra.tt[l].max(0.0);
                let gt = draw(l, 0);
                if l <= lmax_t {
                    vt.push(gt * tt.sqrt());
                }
                if l <= lmax_p {
                    let ge = draw(l, 1);
                    let gb = draw(l, 2);
                    let (ee, te) = (spectra.ee[l].max(0.0), spectra.te[l]);
                    let ae = if tt > 0.0 {
                        gt * (te / tt.sqrt()) + ge * (ee - te * te / tt).max(0.0).sqrt()
                    } else {
                        ge * ee.sqrt()
                    };
                    ve.push(ae);
                    vb.push(gb * spectra.bb[l].max(0.0).sqrt());
                }
            }
            (m, vt, ve, vb)
        })
        .collect();
    for (m, vt, ve, vb) in per_m {
        for (i, v) in vt.into_iter().enumerate() {
            t.set(m + i, m, v);
        }
        for (i, (ve, vb)) in ve.into_iter().zip(vb).enumerate() {
            e.set(m + i, m, ve);
            b.set(m + i, m, vb);
        }
    }
    Ok((t, e, b))
}

/// Multiplies `a_ℓm` by `window[ℓ]` (like `healpy.almxfl`).
pub fn almxfl(alm: &mut Alm, window: &[f64]) {
    let lmax = alm.lmax();
    let data = alm.as_mut_slice();
    for m in 0..=lmax {
        for l in m..=lmax {
            data[Alm::index(lmax, l, m)] *= window[l];
        }
    }
}

// =====================================================================
// The sky
// =====================================================================

/// Configuration of the synthetic sky.
#[derive(Debug, Clone, PartialEq)]
pub struct SkyConfig {
    /// Output resolution (TOAST: 1024).
    pub nside: Nside,
    /// Random seed (default [`TOAST_SKY_SEED`]).
    pub seed: u64,
    /// Beam FWHM in arcmin (default 3).
    pub fwhm_arcmin: f64,
    /// Explicit band limit for all fields; `None` uses the `rel_tol` truncation.
    pub lmax: Option<usize>,
    /// Relative spectral threshold of the automatic band limit (default 1e-10).
    pub rel_tol: f64,
    /// Reproduce TOAST 3.0.6's ordering bug (default `false`): return the
    /// RING-ordered synthesis unchanged, to be used as if it were NEST.
    ///
    /// `create_input_maps` writes healpy's RING-ordered `synfast` output with
    /// `write_map(..., nest=True)`, so `fake_input_sky_nside1024.fits` says
    /// `ORDERING = 'NESTED'` over RING-ordered data, and the benchmark scans a
    /// pixel-scrambled sky (same one-point statistics, white angular spectrum).
    /// Statistics of TOAST's output maps over a small hit patch (e.g. the
    /// `stats.json` RMS of the tiny case) depend on this.
    pub toast_ring_as_nest: bool,
}

impl Default for SkyConfig {
    fn default() -> Self {
        Self {
            nside: Nside::new(1024).expect("a power of two"),
            seed: TOAST_SKY_SEED,
            fwhm_arcmin: TOAST_SKY_FWHM_ARCMIN,
            lmax: None,
            rel_tol: 1e-10,
            toast_ring_as_nest: false,
        }
    }
}

/// The band limits used and what they neglect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkyTruncation {
    /// Band limit of I.
    pub lmax_t: usize,
    /// Band limit of Q/U.
    pub lmax_p: usize,
    /// healpy's band limit for this nside (`3 nside − 2`, the spectra's length − 1).
    pub lmax_full: usize,
    /// Fraction of the full-band map variance (I, Q/U) not synthesised.
    pub lost_variance_fraction: (f64, f64),
    /// Expected RMS about the mean of (I, Q, U) from the spectra, full band.
    pub expected_rms_full: (f64, f64, f64),
}

/// The synthetic sky: float32 I, Q, U maps in NEST order (unless
/// [`SkyConfig::toast_ring_as_nest`]), unit K.
#[derive(Debug, Clone)]
pub struct SkyMaps {
    /// Resolution.
    pub nside: u64,
    /// Intensity.
    pub i: Vec<f32>,
    /// Stokes Q.
    pub q: Vec<f32>,
    /// Stokes U.
    pub u: Vec<f32>,
    /// Band limits used.
    pub truncation: SkyTruncation,
}

/// The widest beam of the synthetic sky: 180 degrees (a wider one smooths
/// the sky to its monopole, and the beam window underflows to NaN).
pub const MAX_FWHM_ARCMIN: f64 = 10800.0;

/// Refuse settings no synthesis can use (the beam's width, `rel_tol`), in
/// O(1): what a job checks before any work, whatever its nside (the band
/// limits themselves take O(nside) memory, [`sky_truncation`]).
pub fn check_sky_config(cfg: &SkyConfig) -> Result<(), SkyError> {
    // Polarisation starts at ℓ = 2, and a map of nside 1 holds ℓ ≤ 1 only.
    if cfg.nside.get() < 2 {
        return Err(SkyError::Config(format!(
            "nside {} holds multipoles up to {} only, and the synthetic sky's polarisation \
             starts at 2: nside 2 or more, or an input sky map",
            cfg.nside.get(),
            3 * cfg.nside.get() - 2
        )));
    }
    // A beam wider than the sphere (180 degrees) smooths the sky to its mean.
    if !(0.0..=MAX_FWHM_ARCMIN).contains(&cfg.fwhm_arcmin) {
        return Err(SkyError::Config(format!(
            "beam FWHM {} arcmin must be between 0 and {MAX_FWHM_ARCMIN} (180 degrees)",
            toast_core::num::Compact(cfg.fwhm_arcmin)
        )));
    }
    if !(cfg.rel_tol > 0.0 && cfg.rel_tol < 1.0) {
        return Err(SkyError::Config(format!(
            "rel_tol {} must be in (0, 1)",
            cfg.rel_tol
        )));
    }
    Ok(())
}

/// Band limits for `cfg` (see [`SkyTruncation`]).
pub fn sky_truncation(cfg: &SkyConfig) -> Result<SkyTruncation, SkyError> {
    check_sky_config(cfg)?;
    let spectra = benchmark_spectra(cfg.nside)?;
    let lmax_full = spectra.lmax();
    let (bt, bp) = gauss_beam((cfg.fwhm_arcmin / 60.0).to_radians(), lmax_full);
    let (lmax_t, lmax_p) = match cfg.lmax {
        Some(l) if l > lmax_full => {
            return Err(SkyError::Config(format!(
                "lmax {l} above the spectra's lmax {lmax_full} (3 nside - 2)"
            )))
        }
        Some(l) => (l, l),
        None => (
            truncation_lmax(&spectra.tt, &bt, cfg.rel_tol),
            truncation_lmax(&spectra.ee, &bp, cfg.rel_tol).max(2),
        ),
    };
    let full = expected_variance(&spectra, (&bt, &bp), lmax_full, lmax_full);
    let kept = expected_variance(&spectra, (&bt, &bp), lmax_t, lmax_p);
    let lost = |k: f64, f: f64| if f > 0.0 { (f - k) / f } else { 0.0 };
    Ok(SkyTruncation {
        lmax_t,
        lmax_p,
        lmax_full,
        lost_variance_fraction: (lost(kept.0, full.0), lost(kept.1, full.1)),
        expected_rms_full: (full.0.sqrt(), full.1.sqrt(), full.2.sqrt()),
    })
}

/// Generates the benchmark input sky (see the module documentation).
pub fn synthesize_sky(cfg: &SkyConfig) -> Result<SkyMaps, SkyError> {
    synthesize_sky_on(cfg, &toast_core::SerialComm)
}

/// [`synthesize_sky`] shared by the processes of `comm`: each synthesises
/// its part of the rings ([`synthesize_sky_part`]) and an allreduce
/// assembles the whole sky on every process ([`assemble_sky`]), bit for
/// bit the one-process sky (every pixel comes from exactly one process).
pub fn synthesize_sky_on(
    cfg: &SkyConfig,
    comm: &dyn toast_core::Comm,
) -> Result<SkyMaps, SkyError> {
    assemble_sky(
        synthesize_sky_part(cfg, comm.rank(), comm.size(), None)?,
        comm,
    )
}

/// Part `index` of `count` of the sky: the rings [`sht::alm2map_iqu_as`]
/// gives that part, every other pixel zero. It touches no communicator, so
/// it may run on any thread (the workflow's background synthesis,
/// [`crate::sim::SkySynthesis`]); [`assemble_sky`] then sums the parts.
/// Setting `cancel` (if any) stops it within one block of rings
/// ([`sht::alm2map_iqu_as`]).
pub fn synthesize_sky_part(
    cfg: &SkyConfig,
    index: usize,
    count: usize,
    cancel: Option<&std::sync::atomic::AtomicBool>,
) -> Result<SkyMaps, SkyError> {
    let tr = sky_truncation(cfg)?;
    let spectra = benchmark_spectra(cfg.nside)?;
    let (bt, bp) = gauss_beam((cfg.fwhm_arcmin / 60.0).to_radians(), tr.lmax_full);
    let (mut t, mut e, mut b) = synalm(&spectra, tr.lmax_t, tr.lmax_p, cfg.seed)?;
    almxfl(&mut t, &bt);
    almxfl(&mut e, &bp);
    almxfl(&mut b, &bp);
    // The synthesis writes float32 maps straight in the output order: no
    // full-sky float64 or RING-ordered copy is held.
    let order = if cfg.toast_ring_as_nest {
        MapOrder::Ring
    } else {
        MapOrder::Nest
    };
    let [i, q, u] =
        sht::alm2map_iqu_as::<f32>(cfg.nside.get(), &t, &e, &b, order, index, count, cancel)?;
    Ok(SkyMaps {
        nside: cfg.nside.get(),
        i,
        q,
        u,
        truncation: tr,
    })
}

/// The whole sky from each process's part ([`synthesize_sky_part`] with
/// `comm`'s rank and size): a collective of every process of `comm`.
pub fn assemble_sky(mut part: SkyMaps, comm: &dyn toast_core::Comm) -> Result<SkyMaps, SkyError> {
    if comm.size() > 1 {
        for m in [&mut part.i, &mut part.q, &mut part.u] {
            allreduce_part_map(comm, m)
                .map_err(|e| SkyError::Comm(format!("assembling the sky across processes: {e}")))?;
        }
    }
    Ok(part)
}

/// Sums the processes' parts of a map (each pixel non-zero on at most one
/// process: the sum is that value, exactly) through `f64` chunks of
/// [`ALLREDUCE_CHUNK`] pixels, so the transient is one chunk.
fn allreduce_part_map(
    comm: &dyn toast_core::Comm,
    map: &mut [f32],
) -> Result<(), toast_core::CommError> {
    let mut buf = Vec::with_capacity(ALLREDUCE_CHUNK.min(map.len()));
    for chunk in map.chunks_mut(ALLREDUCE_CHUNK) {
        buf.clear();
        buf.extend(chunk.iter().map(|&v| f64::from(v)));
        comm.allreduce_f64(&mut buf, toast_core::ReduceOp::Sum)?;
        for (v, &s) in chunk.iter_mut().zip(&buf) {
            *v = s as f32;
        }
    }
    Ok(())
}

/// Pixels per collective of [`allreduce_part_map`] (8 MiB of `f64`).
const ALLREDUCE_CHUNK: usize = 1 << 20;

/// Mean and RMS about the mean of a map.
pub fn mean_and_rms<T: Copy + Into<f64> + Sync>(map: &[T]) -> (f64, f64) {
    let n = map.len() as f64;
    let mean = map.par_iter().map(|&v| v.into()).sum::<f64>() / n;
    let var = map
        .par_iter()
        .map(|&v| (v.into() - mean).powi(2))
        .sum::<f64>()
        / n;
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::healpix::Healpix;

    #[test]
    fn spectra_match_toast_formula() {
        let s = benchmark_spectra(Nside::new(1024).unwrap()).unwrap();
        assert_eq!(s.tt.len(), 3071);
        assert_eq!(s.lmax(), 3070);
        let peak_tt = 2000.0 / (50.0 * (2.0 * std::f64::consts::PI).sqrt());
        assert!((s.tt[30] - peak_tt).abs() < 1e-12);
        assert!((s.ee[500] - 1.0 / (100.0 * (2.0 * std::f64::consts::PI).sqrt())).abs() < 1e-15);
        assert!(s.bb.iter().chain(&s.te).all(|&v| v == 0.0));
        let (bt, bp) = gauss_beam((3.0f64 / 60.0).to_radians(), 10);
        assert_eq!(bt[0], 1.0);
        assert!(bp[0] > 1.0 && bp[2] < 1.0 + 1e-6);
    }

    /// nside 1 holds no ℓ = 2 for the polarisation: refused by the O(1)
    /// check a job makes before any work (it failed in the synthesis);
    /// nside 2 synthesises.
    #[test]
    fn nside_1_is_refused_up_front() {
        let at = |n: u64| SkyConfig {
            nside: Nside::new(n).unwrap(),
            ..SkyConfig::default()
        };
        let e = check_sky_config(&at(1)).unwrap_err().to_string();
        assert!(e.contains("nside 1 holds multipoles up to 1 only"), "{e}");
        assert!(synthesize_sky(&at(2)).is_ok());
    }

    #[test]
    fn truncation_is_negligible() {
        let tr = sky_truncation(&SkyConfig::default()).unwrap();
        assert!(tr.lmax_t > 300 && tr.lmax_t < 450, "{tr:?}");
        assert!(tr.lmax_p > 1100 && tr.lmax_p < 1250, "{tr:?}");
        assert!(tr.lost_variance_fraction.0 < 1e-9, "{tr:?}");
        assert!(tr.lost_variance_fraction.1 < 1e-9, "{tr:?}");
    }

    #[test]
    fn synalm_is_deterministic_and_lmax_independent() {
        let s = benchmark_spectra(Nside::new(64).unwrap()).unwrap();
        let (t1, e1, _) = synalm(&s, 100, 150, 42).unwrap();
        let (t2, e2, _) = synalm(&s, 120, 150, 42).unwrap();
        for m in 0..=100 {
            for l in m..=100 {
                assert_eq!(t1.get(l, m), t2.get(l, m));
            }
        }
        assert_eq!(e1, e2);
        let (t3, _, _) = synalm(&s, 100, 150, 43).unwrap();
        assert_ne!(t1, t3);
        assert_eq!(t1.get(5, 0).im, 0.0);
        assert!(synalm(&s, 500, 10, 1).is_err());
    }

    #[test]
    fn low_resolution_sky_statistics() {
        // nside 64 with the benchmark spectra: ~35k I modes below ℓ=191,
        // the RMS must match the prediction over the synthesised band.
        let cfg = SkyConfig {
            nside: Nside::new(64).unwrap(),
            ..SkyConfig::default()
        };
        let sky = synthesize_sky(&cfg).unwrap();
        let spectra = benchmark_spectra(Nside::new(64).unwrap()).unwrap();
        let (bt, bp) = gauss_beam((3.0f64 / 60.0).to_radians(), spectra.lmax());
        let tr = sky.truncation;
        let (vt, vq, _) = expected_variance(&spectra, (&bt, &bp), tr.lmax_t, tr.lmax_p);
        let (_, rt) = mean_and_rms(&sky.i);
        let (_, rq) = mean_and_rms(&sky.q);
        let (_, ru) = mean_and_rms(&sky.u);
        assert!(
            (rt / vt.sqrt() - 1.0).abs() < 0.1,
            "I rms {rt} vs {}",
            vt.sqrt()
        );
        assert!(
            (rq / vq.sqrt() - 1.0).abs() < 0.05,
            "Q rms {rq} vs {}",
            vq.sqrt()
        );
        assert!(
            (ru / vq.sqrt() - 1.0).abs() < 0.05,
            "U rms {ru} vs {}",
            vq.sqrt()
        );
        // Same seed → bitwise identical.
        let again = synthesize_sky(&cfg).unwrap();
        assert_eq!(again.i, sky.i);
        assert_eq!(again.u, sky.u);
        // TOAST's quirk: the same values in RING order.
        let quirk = synthesize_sky(&SkyConfig {
            toast_ring_as_nest: true,
            ..cfg
        })
        .unwrap();
        let hp = Healpix::new(64).unwrap();
        for p in 0..hp.npix() {
            assert_eq!(quirk.q[hp.nest2ring(p) as usize], sky.q[p as usize]);
        }
    }
}
