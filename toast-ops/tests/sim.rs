//! The simulation operators on the data model: SimSatellite's fields match
//! the standalone satellite simulation, SimNoise (the `sim_noise` kernel)
//! does not depend on how the detectors are split nor on the backend.

use std::sync::Arc;
use toast_core::observation::defaults;
use toast_core::{Data, ExecContext, Operator};
use toast_ops::astro::focalplane::benchmark_focalplane;
use toast_ops::astro::scan_strategy::{
    create_satellite_schedule, simulate_observation, unix_us_from_civil, ScanStrategy,
};
use toast_ops::sim::{
    core_focalplane, DefaultNoiseModel, SimNoise, SimNoiseConfig, SimSatellite, SimSatelliteConfig,
};
use toast_testkit::plugins::{context, registry};

fn simulate(n_det: usize, minutes: f64) -> (Data, SimSatellite) {
    let fp = Arc::new(core_focalplane(&benchmark_focalplane(n_det).unwrap()).unwrap());
    let cfg = SimSatelliteConfig {
        obs_minutes: minutes,
        ..SimSatelliteConfig::default()
    };
    let mut sim = SimSatellite::new("sim_satellite", cfg, fp, 0, 2).unwrap();
    let mut data = Data::new();
    let mut ctx = ExecContext::new();
    sim.apply(&mut data, &mut ctx).unwrap();
    DefaultNoiseModel::new("default_model", Default::default())
        .apply(&mut data, &mut ctx)
        .unwrap();
    (data, sim)
}

#[test]
fn sim_satellite_fields_match_the_satellite_module() {
    let (data, sim) = simulate(4, 2.0);
    assert_eq!(data.obs.len(), 2);
    assert_eq!(
        sim.detector_sets(),
        vec![
            vec!["D0A-150".to_string(), "D0B-150".to_string()],
            vec!["D1A-150".to_string(), "D1B-150".to_string()]
        ]
    );
    let schedule = create_satellite_schedule(
        "",
        unix_us_from_civil(2027, 1, 1, 0, 0, 0),
        120.0,
        0.0,
        2,
        3000.0,
        600.0,
    )
    .unwrap();
    for (k, ob) in data.obs.iter().enumerate() {
        assert_eq!(ob.n_samples(), 12_000);
        let want = simulate_observation(&schedule, k, 100.0, &ScanStrategy::benchmark()).unwrap();
        assert_eq!(ob.times().unwrap(), &want.times[..]);
        let b = ob.shared.data::<f64>(defaults::BORESIGHT_RADEC).unwrap();
        let flat: Vec<f64> = want.boresight.iter().flatten().copied().collect();
        assert_eq!(b, &flat[..]);
        assert_eq!(ob.uid(), want.sampling.obs_uid as u64);
        assert_eq!(ob.name(), want.sampling.obs_name);
        assert!(ob.detdata.contains(defaults::DET_DATA));
        assert!(ob.detdata.contains(defaults::DET_FLAGS));
        assert_eq!(ob.local_detectors().len(), 4);
    }
}

/// All detectors at once on the CPU plugin, one at a time (in reverse) on
/// `fakedev` (a device that is not host-addressable: the timestream goes
/// through device buffers): the same bits.
#[test]
fn sim_noise_is_independent_of_the_detector_split() {
    let reg = registry(2);
    let (mut all, _) = simulate(4, 1.0);
    let mut ctx = context(&reg, "");
    SimNoise::new("sim_noise", SimNoiseConfig::default())
        .apply(&mut all, &mut ctx)
        .unwrap();
    let (mut one_by_one, _) = simulate(4, 1.0);
    let dets = one_by_one.obs[0].local_detectors().to_vec();
    let mut ctx = context(&reg, "run=fakedev");
    for d in dets.iter().rev() {
        ctx.detectors = Some(vec![d.clone()]);
        SimNoise::new("sim_noise", SimNoiseConfig::default())
            .apply(&mut one_by_one, &mut ctx)
            .unwrap();
    }
    assert!(
        ctx.timers
            .names()
            .any(|t| t.contains("sim_noise.sim_noise[fakedev]")),
        "{:?}",
        ctx.timers.names().collect::<Vec<_>>()
    );
    for (a, b) in all.obs.iter().zip(&one_by_one.obs) {
        let fa = a.detdata.get(defaults::DET_DATA).unwrap();
        let fb = b.detdata.get(defaults::DET_DATA).unwrap();
        for d in &dets {
            let x = fa.row_of::<f64>(d).unwrap();
            assert_eq!(x, fb.row_of::<f64>(d).unwrap(), "{d}");
            // White-noise level: NET² · rate = 2.5e-7 K²; 1/f adds a little.
            let var = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            assert!((2.0e-7..1.0e-6).contains(&var), "{d}: variance {var}");
        }
    }
    // Different observations get different noise.
    let r0 = all.obs[0].detdata.get(defaults::DET_DATA).unwrap();
    let r1 = all.obs[1].detdata.get(defaults::DET_DATA).unwrap();
    assert_ne!(r0.row::<f64>(0).unwrap(), r1.row::<f64>(0).unwrap());
}

/// `toast_core::uid::name_uid` against values TOAST 3.0.6 computed.
#[test]
fn name_uid_matches_toast() {
    use toast_core::uid::{name_uid, name_uid64};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/satsim/qarray_vectors.txt"
    );
    let text = std::fs::read_to_string(path).expect("read test vectors");
    let mut n = 0;
    for line in text.lines().filter(|l| l.starts_with("name_uid ")) {
        let (inp, out) = line["name_uid ".len()..]
            .split_once(" | ")
            .expect("separator");
        let name = inp.trim().trim_matches('\'');
        let want: u32 = out.trim().parse().expect("uid");
        assert_eq!(name_uid(name), want, "name_uid({name:?})");
        n += 1;
    }
    assert!(n >= 5);
    assert!(name_uid64("satellite") & 0x7FFF_FFFF == u64::from(name_uid("satellite")));
}

/// `ScanHealpixMap` on a device (the fake device) gives the CPU's
/// timestream bit for bit, with or without transient pointing and with or
/// without handing the pointing over, in one device scope where no
/// pointing crosses the bus: the host builds the pixel distribution from
/// its own pixels (issue #10).
#[test]
fn scan_on_a_device_moves_no_pointing() {
    use toast_ops::exec::movement;
    use toast_ops::exec::pipeline::{DetectorSets, RunOptions};
    use toast_ops::math::healpix::Nside;
    use toast_ops::ops::{
        PixelsHealpix, PixelsHealpixConfig, PointingDetector, PointingDetectorConfig, PointingOps,
        StokesMode, StokesWeights, StokesWeightsConfig,
    };
    use toast_ops::sim::sky::SkyConfig;
    use toast_ops::sim::{InputSky, ScanHealpixMap, ScanHealpixMapConfig};
    use toast_testkit::plugins::{context, registry};
    let nside = Nside::new(32).unwrap();
    let sky = InputSky::synthetic(&SkyConfig {
        nside,
        fwhm_arcmin: 600.0,
        ..SkyConfig::default()
    })
    .unwrap();
    let reg = registry(2);
    let run = |policy: &str, transient: bool, keep: bool| {
        let (mut data, _) = simulate(4, 2.0);
        let dets = data.all_local_detectors(0);
        let det = PointingDetectorConfig::default();
        let pix = PixelsHealpixConfig {
            nside,
            nside_submap: Nside::new(8).unwrap(),
            ..PixelsHealpixConfig::default()
        };
        let pointing = PointingOps::new(
            PointingDetector::new("det_pointing", det.clone()),
            PixelsHealpix::new("pixels", pix, det.clone()).unwrap(),
            StokesWeights::new(
                "weights",
                StokesWeightsConfig {
                    mode: StokesMode::IQU,
                    ..StokesWeightsConfig::default()
                },
                det,
            ),
        );
        let mut op = ScanHealpixMap::new(
            "scan_map",
            ScanHealpixMapConfig::default(),
            pointing,
            sky.clone(),
        )
        .unwrap();
        op.options = RunOptions {
            detector_sets: DetectorSets::Sets(dets.chunks(2).map(|c| c.to_vec()).collect()),
            ..RunOptions::default()
        };
        op.transient_pointing = transient;
        op.keep_pointing = keep;
        let mut ctx = context(&reg, policy);
        op.apply(&mut data, &mut ctx).unwrap();
        (data, ctx)
    };
    let bytes = |d: &Data, f: &str| -> Vec<Vec<u8>> {
        d.obs
            .iter()
            .map(|ob| ob.detdata.get(f).unwrap().as_bytes().to_vec())
            .collect()
    };
    let (cpu, _) = run("", false, true);
    for (transient, keep) in [(false, false), (false, true), (true, false)] {
        let (dev, ctx) = run("run=fakedev", transient, keep);
        let what = format!("transient {transient}, keep {keep}");
        assert_eq!(
            bytes(&cpu, defaults::DET_DATA),
            bytes(&dev, defaults::DET_DATA),
            "{what}"
        );
        let rep = movement::ledger(&ctx).unwrap();
        assert_eq!(rep.scopes.len(), 1, "{what}: one scope");
        for f in ["detdata.pixels", "detdata.weights", "detdata.quats"] {
            assert_eq!(rep.copies(f), (0, 0), "{what}: {f}");
        }
        // The timestream starts at zero (a device memset) and comes back.
        let n_obs = dev.obs.len() as u64;
        assert_eq!(rep.copies("detdata.signal"), (0, n_obs), "{what}");
        for ob in &dev.obs {
            assert!(!ob.detdata.contains("quats"), "{what}");
            for f in ["pixels", "weights"] {
                assert_eq!(ob.detdata.contains(f), keep, "{what}: {f}");
            }
        }
        if keep {
            for f in ["pixels", "weights"] {
                assert_eq!(bytes(&cpu, f), bytes(&dev, f), "{what}: {f}");
            }
        }
    }
}
