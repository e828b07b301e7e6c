//! The simulation operators on the data model: SimSatellite's fields match
//! the standalone satellite simulation, SimNoise does not depend on how the
//! detectors are split.

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

#[test]
fn sim_noise_is_independent_of_the_detector_split() {
    let (mut all, _) = simulate(4, 1.0);
    let mut ctx = ExecContext::new();
    SimNoise::new("sim_noise", SimNoiseConfig::default())
        .apply(&mut all, &mut ctx)
        .unwrap();
    let (mut one_by_one, _) = simulate(4, 1.0);
    let dets = one_by_one.obs[0].local_detectors().to_vec();
    for d in dets.iter().rev() {
        ctx.detectors = Some(vec![d.clone()]);
        SimNoise::new("sim_noise", SimNoiseConfig::default())
            .apply(&mut one_by_one, &mut ctx)
            .unwrap();
    }
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
