//! A synthetic satellite-like scan, a random sky, and the pointing and
//! scanning operators set up for them.
//!
//! The scan: a boresight on great circles about a spin axis that precesses,
//! so pixels are crossed in many directions; detector pairs A/B at 90°,
//! pairs at 0°, 45°, 22.5°, ... with small pointing offsets; different NETs
//! per detector. Everything is a pure function of the parameters, so two
//! calls give bit-identical data.

use std::sync::Arc;
use toast_core::observation::defaults;
use toast_core::{DType, Data, Detector, ExecContext, Focalplane, Observation, Telescope};
use toast_ops::exec::pipeline::{run_operators, OpRef, RunOptions};
use toast_ops::math::healpix::Nside;
use toast_ops::math::qarray::{self, Quat};
use toast_ops::ops::{
    PixelsHealpix, PixelsHealpixConfig, PointingDetector, PointingDetectorConfig, ScanMap,
    ScanMapConfig, StokesMode, StokesWeights, StokesWeightsConfig, WhiteNoiseWeights,
};
use toast_ops::{PixelData, PixelDistribution};

/// The synthetic scan.
#[derive(Debug, Clone)]
pub struct Scan {
    /// Observations.
    pub n_obs: usize,
    /// Samples per observation.
    pub n_samples: usize,
    /// Sample rate (Hz).
    pub rate: f64,
    /// Detector pairs.
    pub n_pairs: usize,
    /// Spin period (s).
    pub spin_period: f64,
    /// Precession period (s).
    pub prec_period: f64,
    /// Opening angle of the spin axis from the precession axis (degrees).
    pub prec_angle: f64,
    /// Angle of the boresight from the spin axis (degrees; 90: great circles).
    pub spin_angle: f64,
    /// Offset of detector pair `p` from the boresight: `p · det_spacing` (degrees).
    pub det_spacing: f64,
}

impl Default for Scan {
    fn default() -> Self {
        Scan {
            n_obs: 2,
            n_samples: 12_000,
            rate: 10.0,
            n_pairs: 3,
            spin_period: 60.0,
            prec_period: 1300.0,
            prec_angle: 50.0,
            spin_angle: 90.0,
            det_spacing: 0.7,
        }
    }
}

/// Detector pairs: A at angle ψ, B at ψ + 90°, pair `i` at ψ = i·45°/… with
/// a small offset from the boresight; NET 1 + 0.2 i (K√s).
pub fn focalplane(scan: &Scan) -> Arc<Focalplane> {
    let angles = [0.0f64, 45.0, 22.5, 67.5, 11.25, 56.25];
    let mut dets = Vec::new();
    for p in 0..scan.n_pairs {
        let psi = angles[p % angles.len()].to_radians();
        let tilt = qarray::mult(
            &qarray::from_axisangle(&qarray::ZAXIS, p as f64 * 1.1),
            &qarray::from_axisangle(&qarray::XAXIS, (scan.det_spacing * p as f64).to_radians()),
        );
        for (k, suffix) in ["A", "B"].iter().enumerate() {
            let mut d = Detector::new(format!("D{p}{suffix}"));
            let pol = qarray::from_axisangle(
                &qarray::ZAXIS,
                psi + k as f64 * std::f64::consts::FRAC_PI_2,
            );
            d.quat = qarray::mult(&tilt, &pol);
            d.net = 1.0 + 0.2 * (2 * p + k) as f64;
            d.pixel = format!("P{p}");
            dets.push(d);
        }
    }
    Arc::new(Focalplane::new(dets, scan.rate).unwrap())
}

/// The boresight at time `t`: on a circle (`spin_angle` from the spin axis;
/// a great circle at 90°) about a spin axis that precesses about the z axis.
pub fn boresight(scan: &Scan, t: f64) -> Quat {
    use std::f64::consts::TAU;
    let prec = qarray::from_axisangle(&qarray::ZAXIS, TAU * t / scan.prec_period);
    let open = qarray::from_axisangle(&qarray::YAXIS, scan.prec_angle.to_radians());
    let spin = qarray::from_axisangle(&qarray::ZAXIS, TAU * t / scan.spin_period);
    let perp = qarray::from_axisangle(&qarray::YAXIS, scan.spin_angle.to_radians());
    qarray::mult(&prec, &qarray::mult(&open, &qarray::mult(&spin, &perp)))
}

/// Observations with `times`, `boresight_radec`, shared `flags`, detdata
/// `signal` and `flags` (zeros), and a white-noise model from the NETs.
pub fn make_data(scan: &Scan) -> Data {
    let fp = focalplane(scan);
    let mut data = Data::new();
    for o in 0..scan.n_obs {
        let tel = Telescope::new("sat", Arc::clone(&fp));
        let mut ob = Observation::new(format!("obs_{o:03}"), tel, scan.n_samples).unwrap();
        let t0 = o as f64 * (scan.n_samples as f64 / scan.rate + 100.0);
        let times: Vec<f64> = (0..scan.n_samples)
            .map(|i| t0 + i as f64 / scan.rate)
            .collect();
        let bore: Vec<f64> = times.iter().flat_map(|&t| boresight(scan, t)).collect();
        ob.shared.set(defaults::TIMES, &[], &times).unwrap();
        ob.shared
            .set(defaults::BORESIGHT_RADEC, &[4], &bore)
            .unwrap();
        ob.shared
            .set::<u8>(defaults::SHARED_FLAGS, &[], &vec![0; scan.n_samples])
            .unwrap();
        ob.detdata
            .create(defaults::DET_DATA, DType::F64, &[], None)
            .unwrap();
        ob.detdata
            .create(defaults::DET_FLAGS, DType::U8, &[], None)
            .unwrap();
        let w = WhiteNoiseWeights::from_net(&ob).unwrap();
        ob.meta.set_object(defaults::NOISE_MODEL, w);
        data.push(ob).unwrap();
    }
    data
}

/// A deterministic pseudo-random value in [-1, 1) for (`seed`, `i`).
pub fn hash01(seed: u64, i: u64) -> f64 {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// A full-sky IQU map at `nside` (all submaps local): I = 10 + h, Q and U =
/// 0.5 h, with pseudo-random h; stored as `sky` on `sky_dist`.
pub fn make_sky(data: &mut Data, nside: i64, nside_submap: i64) {
    let n_submap = (nside / nside_submap).pow(2);
    let dist = Arc::new(
        PixelDistribution::healpix(
            checked(nside),
            checked(nside_submap),
            true,
            &vec![1u8; n_submap as usize],
        )
        .unwrap(),
    );
    let mut m = PixelData::<f64>::new(Arc::clone(&dist), 3);
    for (p, v) in m.data_mut().chunks_exact_mut(3).enumerate() {
        let pix = dist.global_pixel(p) as u64;
        v[0] = 10.0 + hash01(1, pix);
        v[1] = 0.5 * hash01(2, pix);
        v[2] = 0.5 * hash01(3, pix);
    }
    data.meta.set_object("sky_dist", dist);
    data.meta.set_object("sky", m);
}

/// A test's resolution, which must be valid.
fn checked(nside: i64) -> Nside {
    Nside::try_from(nside).unwrap_or_else(|e| panic!("test resolution: {e}"))
}

/// Pointing operators at `nside` (IQU weights).
pub fn pointing_ops(
    nside: i64,
    nside_submap: i64,
) -> (PointingDetector, PixelsHealpix, StokesWeights) {
    let dp = PointingDetectorConfig::default();
    let pix = PixelsHealpix::new(
        "pixels",
        PixelsHealpixConfig {
            nside: checked(nside),
            nside_submap: checked(nside_submap),
            ..PixelsHealpixConfig::default()
        },
        dp.clone(),
    )
    .unwrap();
    let w = StokesWeights::new(
        "weights",
        StokesWeightsConfig {
            mode: StokesMode::IQU,
            ..StokesWeightsConfig::default()
        },
        dp.clone(),
    );
    (PointingDetector::new("det_pointing", dp), pix, w)
}

/// The `ScanMap` operator (`scan_map`) that adds the map [`make_sky`] made
/// (`sky` on `sky_dist`) to `signal`.
pub fn scan_sky_op() -> ScanMap {
    ScanMap::new(
        "scan_map",
        ScanMapConfig {
            map_key: "sky".into(),
            pixel_dist: "sky_dist".into(),
            ..ScanMapConfig::default()
        },
    )
    .unwrap()
}

/// Scan the `sky` map into `signal` (adds).
pub fn scan_sky(data: &mut Data, ctx: &mut ExecContext, nside: i64, nside_submap: i64) {
    let (mut a, mut b, mut c) = pointing_ops(nside, nside_submap);
    let mut scan = scan_sky_op();
    let mut ops: Vec<OpRef<'_>> = vec![&mut a, &mut b, &mut c, &mut scan];
    run_operators("scan_sky", &mut ops, data, ctx, &RunOptions::default()).unwrap();
    for ob in &mut data.obs {
        for f in ["quats", "pixels", "weights"] {
            ob.detdata.remove(f).unwrap();
        }
    }
}

/// Add offset `amp(det, obs, k)` to samples `[k L, (k+1) L)` of every
/// detector; returns nothing (the offsets are a pure function of the indices).
pub fn add_offsets(data: &mut Data, step: usize, scale: f64) {
    for (o, ob) in data.obs.iter_mut().enumerate() {
        let dets = ob.local_detectors().to_vec();
        let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
        for (d, name) in dets.iter().enumerate() {
            let row = sig.row_of_mut::<f64>(name).unwrap();
            for (k, chunk) in row.chunks_mut(step).enumerate() {
                let a = scale * hash01(100 + o as u64, (d * 100_000 + k) as u64);
                for x in chunk {
                    *x += a;
                }
            }
        }
    }
}
