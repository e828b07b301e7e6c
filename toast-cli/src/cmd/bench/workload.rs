//! The bench's inputs: the workload of TOAST's own CPU timings, synthesised
//! from a seed.
//!
//! `n_det` detectors on a ~2° grid, `n_samp` samples of a satellite-like
//! scan at 200 Hz (1 rpm spin, 85° opening angle, 55° precession angle with
//! a 20 min period), 10 intervals covering 95 % of the samples, ~1 % shared
//! flags and ~1 % detector flags (bursts), HEALPix NEST with 3072 submaps
//! (nside_submap 16), offset templates with step 200, a polynomial filter
//! of order [`POLY_ORDER`] and a 2-D one of `(POLY2D_ORDER + 1)^2` modes over
//! [`POLY2D_GROUPS`] detector groups ([`poly2d_templates`]). The inputs that depend
//! on a kernel's output (the local submaps are the hit ones) are made from
//! it by the runner with the functions here. Every buffer the size of a
//! timestream or a map (4 MiB and more: the maps, the pointing, the
//! detector data, the flags, the amplitude vectors, here and in the runner)
//! comes from [`toast_core::mem::zeroed_large`], advised as huge pages as
//! numpy advises every such array of TOAST's (`time_toast_kernels.py`), so
//! that both sides stream and gather through the same page size.
//!
//! Random inputs come from the project's generator, Threefry-2x64-20
//! (`toast_ops::math::rng`, the one TOAST's noise simulation uses): every input
//! array is its own stream ([`Stream`]), and element j of stream s is a
//! pure function of (seed, s, j), so the workload is the same every run
//! whatever the order in which its arrays are made.

use toast_accel::abi::{SampleRange, SampleRanges};
use toast_core::mem::zeroed_large;
use toast_ops::math::qarray::{self, Quat, YAXIS, ZAXIS};
use toast_ops::math::rng::{gaussian, uniform_01, uniform_u64};

use super::reference::{JSON_KEYS, PRECOND_LARGE, STREAM_KEY};

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Number of detectors (TOAST's workload: 50).
    pub n_det: usize,
    /// Samples per detector (200,000); at least 200 (10 intervals of >= 19).
    pub n_samp: usize,
    /// HEALPix nside, a power of two (2048).
    pub nside: i64,
    /// Timed calls per kernel; the best is reported (5).
    pub repeats: usize,
    /// Threads the backend was initialised with (`threads=N`), `None` for the
    /// backend's default. Only recorded and used to pick TOAST's column.
    pub threads: Option<usize>,
    /// n_amp of the second apply_diag_precond measurement (10,000,000).
    pub precond_n_amp: usize,
    /// The rows to time and report (keys of the JSON output, or the large
    /// apply_diag_precond row); empty: every row. The other kernels still
    /// run, once and untimed, for the inputs of the later ones.
    pub rows: Vec<String>,
}

impl Default for BenchOptions {
    /// TOAST's benchmark workload.
    fn default() -> Self {
        BenchOptions {
            n_det: 50,
            n_samp: 200_000,
            nside: 2048,
            repeats: 5,
            threads: None,
            precond_n_amp: 10_000_000,
            rows: Vec::new(),
        }
    }
}

impl BenchOptions {
    /// A workload small enough for a test in a debug build.
    pub fn tiny() -> Self {
        BenchOptions {
            n_det: 2,
            n_samp: 2000,
            nside: 64,
            repeats: 1,
            threads: None,
            precond_n_amp: 1000,
            rows: Vec::new(),
        }
    }

    /// Whether row `key` is timed and reported ([`BenchOptions::rows`]).
    pub fn times(&self, key: &str) -> bool {
        self.rows.is_empty() || self.rows.iter().any(|r| r == key)
    }

    /// The host memory the bench allocates at its peak, in bytes (`None`:
    /// more than a `u128` counts): the workload's inputs, then the largest
    /// of its stages (the pointing with the quaternions, the map kernels and
    /// the covariance kernels with every submap local, the large
    /// preconditioner vector, the bandwidth reference's two vectors).
    pub fn host_bytes(&self) -> Option<u128> {
        use crate::limits::product;
        let samples = self.n_samp as u128;
        let det_samples = product(&[self.n_det as u128, samples])?;
        let nside = u128::try_from(self.nside).ok()?;
        let pixels = product(&[12, nside, nside])?;
        // boresight (4 f64), hwp (f64), shared flags; det_flags (u8).
        let inputs = product(&[samples, 41])?.checked_add(det_samples)?;
        // quats (4 f64), pixels (i64), weights (3 f64).
        let pointing = product(&[det_samples, 64])?;
        // pixels, weights, det_data; maps in f64 and f32, zmap (3 each).
        let maps = product(&[det_samples, 40])?.checked_add(product(&[pixels, 36])?)?;
        // pixels, weights, det_data; submap, subpix and weights of the
        // in-interval samples (5 x 8 B); hits (i64) and invnpp (6 f64).
        let cov = product(&[det_samples, 80])?.checked_add(product(&[pixels, 56])?)?;
        // offset_var, amplitudes in and out (f64), flags (u8).
        let precond = product(&[self.precond_n_amp as u128, 25])?;
        // The bandwidth reference: x and y (f64) of STREAM_FACTOR x as many.
        let stream = product(&[
            self.precond_n_amp as u128,
            super::reference::STREAM_FACTOR as u128,
            16,
        ])?;
        inputs.checked_add(pointing.max(maps).max(cov).max(precond).max(stream))
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.n_det == 0 || self.n_det > i32::MAX as usize {
            return Err(anyhow::anyhow!(
                "--n-det {}: must be in [1, 2^31)",
                self.n_det
            ));
        }
        if self.n_samp < 200 {
            return Err(anyhow::anyhow!(
                "--n-samp {}: must be at least 200 (10 intervals of 95% of n_samp/10)",
                self.n_samp
            ));
        }
        if self.nside < 1 || self.nside > (1 << 29) || self.nside & (self.nside - 1) != 0 {
            return Err(anyhow::anyhow!(
                "--nside {}: must be a power of two in [1, 2^29]",
                self.nside
            ));
        }
        if self.repeats == 0 {
            return Err(anyhow::anyhow!("--repeats 0: must be at least 1"));
        }
        if self.precond_n_amp == 0 {
            return Err(anyhow::anyhow!("--precond-n-amp 0: must be at least 1"));
        }
        if let Some(bad) = self.rows.iter().find(|r| !is_row(r)) {
            return Err(anyhow::anyhow!(
                "--rows: unknown row `{bad}` (known: {}, {PRECOND_LARGE}, {STREAM_KEY})",
                JSON_KEYS.join(", ")
            ));
        }
        Ok(())
    }
}

/// Whether `key` names a row of the bench.
fn is_row(key: &str) -> bool {
    key == PRECOND_LARGE || key == STREAM_KEY || JSON_KEYS.contains(&key)
}

const SAMPLE_RATE: f64 = 200.0; // Hz
const SPIN_PERIOD: f64 = 60.0; // s (1 rpm)
const OPENING_ANGLE_DEG: f64 = 85.0;
const PRECESSION_ANGLE_DEG: f64 = 55.0;
const PRECESSION_PERIOD: f64 = 1200.0; // s
const HWP_RATE: f64 = 2.0; // Hz
const DET_SPACING_DEG: f64 = 2.0;
const N_INTERVALS: usize = 10;
/// Samples per offset amplitude.
pub const STEP_LENGTH: i64 = 200;
/// Fraction of flagged samples (and amplitudes).
const FLAG_FRACTION: f64 = 0.01;
/// filter_polynomial's order (PolyFilter's are typically 1 to 5).
pub const POLY_ORDER: i64 = 3;
/// filter_poly2D's order: PolyFilter2D fits `(order + 1)^2` modes, 64 here,
/// as TOAST's own `test_polyfilter2D`.
pub const POLY2D_ORDER: usize = 7;
/// filter_poly2D's detector groups (detector d is in group d mod 2).
pub const POLY2D_GROUPS: usize = 2;
/// filter_poly2D's samples (the first in-interval ones): a 64-mode solve per
/// sample and group costs far more per sample than the other kernels.
pub const POLY2D_SAMPLES: usize = 1000;
/// The bench's seed: fixed, so the workload is the same every run.
pub const SEED: u64 = 0x7041_5354_6265_6e63;

// ---------------------------------------------------------------------------
// Random streams

/// The random input arrays, one stream each (the high word of the
/// generator's counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stream {
    SharedFlags,
    DetFlags,
    Epsilon,
    Cal,
    DetScale,
    NoiseWeights,
    Map,
    Amplitudes,
    AmplitudeFlags,
    PrecondVar,
    PrecondAmplitudes,
    PrecondFlags,
}

/// Deviates of Threefry-2x64-20 under key `(seed, 0)`: element j of
/// stream s uses the counter `(s, j)`, as TOAST's streams do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Deviates {
    key: [u64; 2],
}

impl Deviates {
    fn new(seed: u64) -> Deviates {
        Deviates { key: [seed, 0] }
    }

    fn counter(s: Stream) -> [u64; 2] {
        [s as u64, 0]
    }

    /// `n` deviates uniform in (lo, hi).
    fn uniform(&self, s: Stream, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        let mut u = zeroed_large(n);
        self.uniform_into(s, &mut u, lo, hi);
        u
    }

    /// Fill `u` with deviates uniform in (lo, hi).
    fn uniform_into(&self, s: Stream, u: &mut [f64], lo: f64, hi: f64) {
        uniform_01(self.key, Self::counter(s), u);
        for x in u {
            *x = lo + (hi - lo) * *x;
        }
    }

    /// `n` standard normal deviates.
    fn normal(&self, s: Stream, n: usize) -> Vec<f64> {
        let mut g = zeroed_large(n);
        gaussian(self.key, Self::counter(s), &mut g);
        g
    }

    /// `n` integers uniform in [0, bound) (bound > 0).
    fn below(&self, s: Stream, n: usize, bound: u64) -> Vec<u64> {
        let mut w = zeroed_large(n);
        uniform_u64(self.key, Self::counter(s), &mut w);
        for w in &mut w {
            *w = ((*w as u128 * bound as u128) >> 64) as u64;
        }
        w
    }

    /// `n` flags, each set (1) with probability [`FLAG_FRACTION`].
    fn flags(&self, s: Stream, n: usize) -> Vec<u8> {
        let u = self.uniform(s, n, 0.0, 1.0);
        let mut flags = zeroed_large(n);
        for (f, u) in flags.iter_mut().zip(u) {
            *f = u8::from(u < FLAG_FRACTION);
        }
        flags
    }

    /// `n_rows` rows of `n` flags, each with about [`FLAG_FRACTION`] of its
    /// samples set (1) in bursts of `len` samples.
    fn bursts(&self, s: Stream, n_rows: usize, n: usize, len: usize) -> Vec<u8> {
        let len = len.clamp(1, n);
        let per_row = ((FLAG_FRACTION * n as f64 / len as f64).round() as usize).max(1);
        let starts = self.below(s, n_rows * per_row, (n - len + 1) as u64);
        let mut flags = zeroed_large(n_rows * n);
        for (row, starts) in flags.chunks_mut(n).zip(starts.chunks(per_row)) {
            for &start in starts {
                row[start as usize..start as usize + len].fill(1);
            }
        }
        flags
    }
}

// ---------------------------------------------------------------------------
// The workload

/// The product `qs[0] qs[1] ... qs[n-1]` (the last rotation applies first).
fn compose(qs: &[Quat]) -> Quat {
    qs[1..].iter().fold(qs[0], |acc, q| qarray::mult(&acc, q))
}

/// Rotation by `angle` about the Y axis.
fn rot_y(angle: f64) -> Quat {
    qarray::from_axisangle(&YAXIS, angle)
}

/// Rotation by `angle` about the Z axis.
fn rot_z(angle: f64) -> Quat {
    qarray::from_axisangle(&ZAXIS, angle)
}

/// The generated inputs of the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub n_det: usize,
    pub n_samp: usize,
    pub nside: i64,
    pub n_submap: usize,
    pub n_pix_submap: i64,
    pub intervals: Vec<SampleRange>,
    /// Samples inside the intervals.
    pub n_in: usize,
    /// 0..n_det: every index array (one row per detector).
    pub rows: Vec<i32>,
    pub focalplane: Vec<f64>,
    pub boresight: Vec<f64>,
    pub shared_flags: Vec<u8>,
    pub det_flags: Vec<u8>,
    pub hwp: Vec<f64>,
    pub epsilon: Vec<f64>,
    pub gamma: Vec<f64>,
    pub cal: Vec<f64>,
    pub det_scale: Vec<f64>,
    pub noise_weights: Vec<f64>,
    /// Where the inputs made later (maps, amplitudes) come from.
    dev: Deviates,
}

impl Workload {
    /// The workload `o` describes, with the random inputs of `seed`.
    pub fn new(o: &BenchOptions, seed: u64) -> Workload {
        let dev = Deviates::new(seed);
        let (n_det, n_samp) = (o.n_det, o.n_samp);
        // 10 intervals, each 95% of a tenth of the samples, centred in it.
        let block = n_samp / N_INTERVALS;
        let gap = block / 20;
        let intervals: Vec<SampleRange> = (0..N_INTERVALS)
            .map(|k| {
                let first = (k * block + gap / 2) as i64;
                SampleRange {
                    first,
                    last: first + (block - gap) as i64,
                }
            })
            .collect();
        let n_in = intervals.iter().map(|i| (i.last - i.first) as usize).sum();

        // Boresight: spin axis precessing about the anti-sun direction (x).
        let to_ecliptic = rot_y(std::f64::consts::FRAC_PI_2);
        let prec_tilt = rot_y(PRECESSION_ANGLE_DEG.to_radians());
        let opening = rot_y(OPENING_ANGLE_DEG.to_radians());
        let mut boresight = zeroed_large(n_samp * 4);
        for (s, out) in boresight.chunks_exact_mut(4).enumerate() {
            let t = s as f64 / SAMPLE_RATE;
            let prec = rot_z(std::f64::consts::TAU * t / PRECESSION_PERIOD);
            let spin = rot_z(std::f64::consts::TAU * t / SPIN_PERIOD);
            let q = compose(&[to_ecliptic, prec, prec_tilt, spin, opening]);
            out.copy_from_slice(&qarray::normalize(&q));
        }

        // Detectors on a rectangular grid with ~2 deg spacing, 4 polarisation
        // angles: Rz(phi) Ry(theta) Rz(-phi) moves the line of sight to
        // (theta, phi) without twisting it, then Rz(psi) turns the detector.
        let mut focalplane = Vec::with_capacity(n_det * 4);
        let mut gamma = Vec::with_capacity(n_det);
        for d in 0..n_det {
            let (x, y) = grid_position(n_det, d);
            let theta = (DET_SPACING_DEG * x.hypot(y)).to_radians();
            let phi = y.atan2(x);
            let psi = (d % 4) as f64 * std::f64::consts::FRAC_PI_4;
            let q = compose(&[rot_z(phi), rot_y(theta), rot_z(-phi), rot_z(psi)]);
            focalplane.extend_from_slice(&qarray::normalize(&q));
            gamma.push(psi);
        }

        // ~1% flags in bursts: shared flags 100 samples, detector flags 20.
        let shared_flags = dev.bursts(Stream::SharedFlags, 1, n_samp, 100.min(block / 10));
        let det_flags = dev.bursts(Stream::DetFlags, n_det, n_samp, 20.min(block / 10));

        let hwp = (0..n_samp)
            .map(|s| {
                (std::f64::consts::TAU * HWP_RATE * s as f64 / SAMPLE_RATE) % std::f64::consts::TAU
            })
            .collect();

        let nside_submap = o.nside.min(16);
        let n_submap = (12 * nside_submap * nside_submap) as usize;
        let n_pix_submap = (o.nside / nside_submap) * (o.nside / nside_submap);
        Workload {
            n_det,
            n_samp,
            nside: o.nside,
            n_submap,
            n_pix_submap,
            intervals,
            n_in,
            rows: (0..n_det as i32).collect(),
            focalplane,
            boresight,
            shared_flags,
            det_flags,
            hwp,
            epsilon: dev.uniform(Stream::Epsilon, n_det, 0.0, 0.01),
            gamma,
            cal: dev.uniform(Stream::Cal, n_det, 0.95, 1.05),
            det_scale: dev.uniform(Stream::DetScale, n_det, 0.5, 1.5),
            // Close to 1 so that repeated in-place calls never overflow or go subnormal.
            noise_weights: dev.uniform(Stream::NoiseWeights, n_det, 0.999, 1.001),
            dev,
        }
    }

    /// The intervals, as the kernels take them.
    pub fn iv(&self) -> SampleRanges {
        SampleRanges {
            ptr: self.intervals.as_ptr(),
            len: self.intervals.len() as u64,
        }
    }

    /// Detector × in-interval samples: the per-sample normalisation.
    pub fn units(&self) -> u64 {
        (self.n_det * self.n_in) as u64
    }

    /// A map of `n_local` submaps with `nnz` values per pixel, uniform in
    /// (-1, 1).
    pub fn map(&self, n_local: usize, nnz: usize) -> Vec<f64> {
        let mut map = zeroed_large(n_local * self.n_pix_submap as usize * nnz);
        self.dev.uniform_into(Stream::Map, &mut map, -1.0, 1.0);
        map
    }

    /// The offset template of the workload: step [`STEP_LENGTH`], amplitudes
    /// of every detector one after the other.
    pub fn offsets(&self) -> Offsets {
        let n_amp_views: Vec<i64> = self
            .intervals
            .iter()
            .map(|i| (i.last - i.first + STEP_LENGTH - 1) / STEP_LENGTH)
            .collect();
        let per_det: i64 = n_amp_views.iter().sum();
        let amp_offset = (0..self.n_det as i64).map(|d| d * per_det).collect();
        let n_amp = self.n_det * per_det as usize;
        let offset_var = self
            .det_scale
            .iter()
            .flat_map(|&s| {
                let v = 1.0 / (s * (STEP_LENGTH as f64));
                std::iter::repeat_n(v, per_det as usize)
            })
            .collect();
        Offsets {
            n_amp_views,
            amp_offset,
            n_amp,
            amplitudes: self.dev.normal(Stream::Amplitudes, n_amp),
            amplitude_flags: self.dev.flags(Stream::AmplitudeFlags, n_amp),
            offset_var,
        }
    }

    /// The inputs of the large apply_diag_precond measurement, of `n`
    /// amplitudes.
    pub fn precond(&self, n: usize) -> Precond {
        Precond {
            offset_var: self.dev.uniform(Stream::PrecondVar, n, 1e-3, 1e-2),
            amplitudes: self.dev.uniform(Stream::PrecondAmplitudes, n, -1.0, 1.0),
            amplitude_flags: self.dev.flags(Stream::PrecondFlags, n),
        }
    }
}

/// The grid of `n_det` detectors: (columns, rows), about twice as many
/// columns as rows.
fn grid(n_det: usize) -> (usize, usize) {
    let ncol = ((2.0 * n_det as f64).sqrt().ceil() as usize).max(1);
    (ncol, n_det.div_ceil(ncol))
}

/// Detector `d`'s position on the grid, in grid steps from its centre.
fn grid_position(n_det: usize, d: usize) -> (f64, f64) {
    let (ncol, nrow) = grid(n_det);
    (
        (d % ncol) as f64 - 0.5 * (ncol - 1) as f64,
        (d / ncol) as f64 - 0.5 * (nrow - 1) as f64,
    )
}

/// filter_poly2D's inputs: `[n_det, n_mode]` templates `x^i y^j` (i, j in
/// 0..=[`POLY2D_ORDER`], PolyFilter2D's order) of the detector positions
/// scaled to the grid's size, and each detector's group.
pub fn poly2d_templates(n_det: usize) -> (Vec<f64>, Vec<i32>) {
    let (ncol, nrow) = grid(n_det);
    let n = POLY2D_ORDER as i32 + 1;
    let mut templates = Vec::with_capacity(n_det * (n * n) as usize);
    for d in 0..n_det {
        let (x, y) = grid_position(n_det, d);
        let (x, y) = (x / ncol as f64, y / nrow as f64);
        for i in 0..n {
            for j in 0..n {
                templates.push(x.powi(i) * y.powi(j));
            }
        }
    }
    let groups = (0..n_det).map(|d| (d % POLY2D_GROUPS) as i32).collect();
    (templates, groups)
}

/// The local submaps of a run whose hit submaps are `hits`: the hit ones,
/// numbered in global order. Returns `global2local` (-1 for a submap not
/// hit) and the number of local submaps.
pub fn local_submaps(hits: &[u8]) -> (Vec<i64>, usize) {
    let mut global2local = vec![-1i64; hits.len()];
    let mut n_local = 0usize;
    for (g, &h) in hits.iter().enumerate() {
        if h != 0 {
            global2local[g] = n_local as i64;
            n_local += 1;
        }
    }
    (global2local, n_local)
}

/// The offset template's layout and inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Offsets {
    /// Amplitudes per interval (the same for every detector).
    pub n_amp_views: Vec<i64>,
    /// Index of each detector's first amplitude.
    pub amp_offset: Vec<i64>,
    pub n_amp: usize,
    /// Standard normal.
    pub amplitudes: Vec<f64>,
    /// ~1 % set.
    pub amplitude_flags: Vec<u8>,
    /// The diagonal preconditioner, `1 / (det_scale × step)` for every
    /// amplitude of a detector.
    pub offset_var: Vec<f64>,
}

/// The inputs of `template_offset_apply_diag_precond` on a long vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Precond {
    pub offset_var: Vec<f64>,
    pub amplitudes: Vec<f64>,
    pub amplitude_flags: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deviates_are_deterministic_in_range_and_per_stream() {
        let d = Deviates::new(42);
        assert_eq!(
            d.uniform(Stream::Map, 1000, -1.0, 1.0),
            Deviates::new(42).uniform(Stream::Map, 1000, -1.0, 1.0)
        );
        // A stream's values do not depend on how many are drawn.
        assert_eq!(
            d.uniform(Stream::Map, 10, -1.0, 1.0),
            d.uniform(Stream::Map, 1000, -1.0, 1.0)[..10]
        );
        assert!(d
            .uniform(Stream::Cal, 10_000, 0.95, 1.05)
            .iter()
            .all(|x| (0.95..1.05).contains(x)));
        assert!(d
            .below(Stream::DetFlags, 10_000, 17)
            .iter()
            .all(|&k| k < 17));
        assert!(d
            .normal(Stream::Amplitudes, 10_000)
            .iter()
            .all(|x| x.is_finite()));
        let f = d.flags(Stream::AmplitudeFlags, 100_000);
        let frac = f.iter().filter(|&&x| x != 0).count() as f64 / f.len() as f64;
        assert!((0.008..0.012).contains(&frac), "{frac}");
        assert_ne!(
            d.uniform(Stream::Cal, 4, 0.0, 1.0),
            d.uniform(Stream::DetScale, 4, 0.0, 1.0)
        );
        assert_ne!(
            d.uniform(Stream::Cal, 4, 0.0, 1.0),
            Deviates::new(43).uniform(Stream::Cal, 4, 0.0, 1.0)
        );
    }

    #[test]
    fn workload_is_a_function_of_the_seed() {
        let o = BenchOptions::tiny();
        let a = Workload::new(&o, SEED);
        assert_eq!(a, Workload::new(&o, SEED));
        assert_eq!(a.offsets(), Workload::new(&o, SEED).offsets());
        assert_eq!(a.map(3, 3), Workload::new(&o, SEED).map(3, 3));
        let b = Workload::new(&o, SEED + 1);
        assert_ne!(a.det_flags, b.det_flags);
        assert_ne!(a.cal, b.cal);
        // The pointing does not depend on the seed.
        assert_eq!((&a.boresight, &a.focalplane), (&b.boresight, &b.focalplane));
    }

    #[test]
    fn workload_matches_the_timings_description() {
        let o = BenchOptions::default();
        let w = Workload::new(&o, SEED);
        assert_eq!(w.intervals.len(), 10);
        assert_eq!(w.n_in, 190_000);
        assert_eq!((w.n_submap, w.n_pix_submap), (3072, 16384));
        let shared = w.shared_flags.iter().filter(|&&f| f != 0).count() as f64;
        assert!((0.005..0.015).contains(&(shared / o.n_samp as f64)));
        let det = w.det_flags.iter().filter(|&&f| f != 0).count() as f64;
        assert!((0.005..0.015).contains(&(det / w.det_flags.len() as f64)));
        for q in w.boresight.chunks(4).chain(w.focalplane.chunks(4)) {
            let n: f64 = q.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-12);
        }
        let off = w.offsets();
        assert_eq!(off.n_amp, 50 * 10 * 95);
        assert_eq!(off.offset_var.len(), off.n_amp);
        assert_eq!(*off.amp_offset.last().unwrap(), 49 * 950);
        assert!(BenchOptions {
            nside: 3,
            ..o.clone()
        }
        .validate()
        .is_err());
        assert!(BenchOptions {
            rows: vec!["noise_weight".into(), PRECOND_LARGE.into()],
            ..o.clone()
        }
        .validate()
        .is_ok());
        let e = BenchOptions {
            rows: vec!["noise_weight".into(), "noise_wieght".into()],
            ..o.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown row `noise_wieght`"), "{e}");
        assert!(BenchOptions { n_samp: 100, ..o }.validate().is_err());
    }

    #[test]
    fn local_submaps_number_the_hit_ones_in_order() {
        assert_eq!(local_submaps(&[0, 1, 0, 1, 1]), (vec![-1, 0, -1, 1, 2], 3));
        assert_eq!(local_submaps(&[0, 0]), (vec![-1, -1], 0));
    }
}
