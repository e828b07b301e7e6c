//! The destriping map-maker on synthetic scans, through the CPU plugin and
//! a non-host-addressable test device.

use std::sync::Arc;
use toast_accel::budget::BudgetSource;
use toast_accel::host::Registry;
use toast_core::observation::defaults;
use toast_core::{check_requirements, Data, ExecContext, Operator};
use toast_ops::exec::global_data::HostArray;
use toast_ops::exec::kernels::AMP_DOT_DEVICE_BLOCKS;
use toast_ops::exec::movement;
use toast_ops::exec::movement::bus::CgTransfers;
use toast_ops::mapmaker::Plan;
use toast_ops::math::healpix::Nside;
use toast_ops::ops::{
    PixelsHealpix, PixelsHealpixConfig, PointingDetector, StokesMode, StokesWeightsConfig,
};
use toast_ops::templates::OffsetConfig;
use toast_ops::{MapMaker, MapMakerResult, MapMakerSetup, PixelData};
use toast_testkit::plugins::{
    context, registry, registry_with_fake_device, registry_with_fakedev_minor_7, FakeDevice,
};
use toast_testkit::scan::{add_offsets, hash01, make_data, make_sky, scan_sky, Scan};

const NSIDE: i64 = 16;
const NSIDE_SUBMAP: i64 = 4;
const RCOND: f64 = 1e-3;

fn setup(step_time: f64, templates: bool) -> MapMakerSetup {
    let mut s = MapMakerSetup {
        pixels: PixelsHealpixConfig {
            nside: Nside::try_from(NSIDE).unwrap(),
            nside_submap: Nside::try_from(NSIDE_SUBMAP).unwrap(),
            ..PixelsHealpixConfig::default()
        },
        weights: StokesWeightsConfig {
            mode: StokesMode::IQU,
            ..StokesWeightsConfig::default()
        },
        baselines: OffsetConfig {
            enabled: templates,
            step_time,
            ..OffsetConfig::default()
        },
        ..MapMakerSetup::default()
    };
    s.binner.pixel_dist = "pix_dist".into();
    s.mapmaker.solve_rcond_threshold = RCOND;
    s.mapmaker.map_rcond_threshold = RCOND;
    s
}

/// Data with the sky scanned in (and nothing else).
fn sky_data(scan: &Scan, ctx: &mut ExecContext) -> Data {
    let mut data = make_data(scan);
    make_sky(&mut data, NSIDE, NSIDE_SUBMAP);
    scan_sky(&mut data, ctx, NSIDE, NSIDE_SUBMAP);
    data
}

fn map<'a>(data: &'a Data, key: &str) -> &'a PixelData<f64> {
    data.meta.object::<PixelData<f64>>(key).unwrap()
}

/// (pixel, map value, sky value) of each good pixel (rcond ≥ threshold).
fn good_pixels(data: &Data, res: &MapMakerResult, key: &str) -> Vec<(i64, [f64; 3], [f64; 3])> {
    let m = map(data, key);
    let rcond = map(data, &res.rcond);
    let sky = map(data, "sky");
    let dist = m.distribution().clone();
    let mut out = Vec::new();
    for i in 0..m.n_local_pix() {
        if rcond.data()[i] >= RCOND {
            let pix = dist.global_pixel(i);
            let v = &m.data()[3 * i..3 * i + 3];
            let s = sky.pixel(pix).unwrap();
            out.push((pix, [v[0], v[1], v[2]], [s[0], s[1], s[2]]));
        }
    }
    out
}

#[test]
fn binned_map_of_a_noiseless_sky_is_the_sky() {
    let scan = Scan::default();
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = sky_data(&scan, &mut ctx);
    let mut mm = MapMaker::new(setup(25.0, false)).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    assert_eq!(res.iterations, 0, "no template, no solve");
    let good = good_pixels(&data, &res, &res.map);
    assert!(good.len() > 800, "only {} good pixels", good.len());
    let mut worst = 0.0f64;
    for (pix, m, s) in &good {
        for k in 0..3 {
            let e = (m[k] - s[k]).abs();
            worst = worst.max(e);
            assert!(
                e < 1e-10,
                "pixel {pix} component {k}: map {} sky {}",
                m[k],
                s[k]
            );
        }
    }
    // Without templates the destriped map is the binned map.
    assert_eq!(
        map(&data, &res.map).data(),
        map(&data, res.binmap.as_ref().unwrap()).data()
    );
    // Cut pixels are zero in the map.
    let m = map(&data, &res.map);
    let rcond = map(&data, &res.rcond);
    for (i, r) in rcond.data().iter().enumerate() {
        if *r < RCOND {
            assert_eq!(&m.data()[3 * i..3 * i + 3], &[0.0; 3]);
        }
    }
    eprintln!(
        "binned map: {} good pixels, worst error {worst:e}",
        good.len()
    );
}

/// The injected offset of detector `d` (index in the focalplane) in
/// observation `o`, step `k` (as `toast_testkit::scan::add_offsets` makes it).
fn injected(o: usize, d: usize, k: usize, scale: f64) -> f64 {
    scale * hash01(100 + o as u64, (d * 100_000 + k) as u64)
}

#[test]
fn destriper_removes_many_offsets_per_observation() {
    let scan = Scan::default();
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = sky_data(&scan, &mut ctx);
    // 25 s steps at 10 Hz: 250 samples, 48 baselines per detector and observation.
    let step = 250;
    let scale = 3.0;
    add_offsets(&mut data, step, scale);
    let mut s = setup(25.0, true);
    s.mapmaker.convergence = 1e-24;
    s.mapmaker.keep_solver_products = true;
    let mut mm = MapMaker::new(s).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    eprintln!(
        "destriper: {} amplitudes ({} flagged), {} iterations, converged {}, residuals {:?}",
        res.n_amplitudes, res.n_flagged_amplitudes, res.iterations, res.converged, res.residuals
    );
    let n_det = 2 * scan.n_pairs;
    assert_eq!(
        res.n_amplitudes,
        scan.n_obs * n_det * scan.n_samples.div_ceil(step)
    );
    assert_eq!(
        res.n_flagged_amplitudes, 0,
        "the test scan should flag nothing"
    );
    assert!(res.converged, "{res:?}");
    assert!(res.iterations >= 3);

    // The raw binned map is far from the sky; the destriped map is the sky up
    // to a monopole (the offsets' common constant, which nothing fixes).
    let raw = good_pixels(&data, &res, res.binmap.as_ref().unwrap());
    let worst_raw = raw
        .iter()
        .map(|(_, m, s)| (m[1] - s[1]).abs().max((m[2] - s[2]).abs()))
        .fold(0.0, f64::max);
    assert!(
        worst_raw > 0.1,
        "the offsets should show in the raw map ({worst_raw})"
    );
    let good = good_pixels(&data, &res, &res.map);
    assert!(good.len() > 800);
    let mono = good.iter().map(|(_, m, s)| m[0] - s[0]).sum::<f64>() / good.len() as f64;
    let mut worst = [0.0f64; 3];
    for (pix, m, s) in &good {
        let e = [m[0] - s[0] - mono, m[1] - s[1], m[2] - s[2]];
        for k in 0..3 {
            worst[k] = worst[k].max(e[k].abs());
            assert!(
                e[k].abs() < 1e-8,
                "pixel {pix} component {k}: error {:e}",
                e[k]
            );
        }
    }
    eprintln!("destriped map: monopole {mono:e}, worst errors I/Q/U {worst:?}");

    // The amplitudes are the injected offsets plus one common constant.
    let amps = &data
        .meta
        .object::<HostArray<f64>>(res.amplitudes.as_ref().unwrap())
        .unwrap()
        .values;
    let n_steps = scan.n_samples.div_ceil(step);
    // Detector-major: detector d, observation o, step k.
    let mut diffs = Vec::new();
    for d in 0..n_det {
        for o in 0..scan.n_obs {
            for k in 0..n_steps {
                let a = amps[(d * scan.n_obs + o) * n_steps + k];
                diffs.push(a - injected(o, d, k, scale));
            }
        }
    }
    let c = diffs[0];
    for (i, x) in diffs.iter().enumerate() {
        assert!((x - c).abs() < 1e-8, "amplitude {i}: {x} vs common {c}");
    }
    assert!(
        (mono + c).abs() < 1e-8,
        "the map monopole is minus the common offset"
    );

    // The cleaned timestream was not kept (save_cleaned is off), and the
    // solver products were.
    for ob in &data.obs {
        assert!(!ob.detdata.contains("mapmaker_cleaned"));
        assert!(!ob.detdata.contains("mapmaker_temp"));
        assert!(ob.detdata.contains("mapmaker_solve_flags"));
        assert!(!ob.detdata.contains("pixels"), "pointing is not kept");
    }
}

/// TOAST bins the raw timestream (`{name}_binmap`) before subtracting the
/// amplitudes, also when the timestream is cleaned in place: the binned map
/// of a destriping run is the map of a run without templates, bit for bit,
/// and differs from the destriped map.
#[test]
fn binned_map_is_of_the_raw_timestream_when_cleaning_in_place() {
    let scan = Scan::default();
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let step = 250;
    let raw_data = |ctx: &mut ExecContext| {
        let mut data = sky_data(&scan, ctx);
        add_offsets(&mut data, step, 3.0);
        data
    };
    let mut destriped = raw_data(&mut ctx);
    let mut s = setup(25.0, true);
    s.mapmaker.save_cleaned = true;
    s.mapmaker.overwrite_cleaned = true;
    let res = MapMaker::new(s)
        .unwrap()
        .run(&mut destriped, &mut ctx)
        .unwrap();
    assert!(res.iterations >= 3);
    let mut binned = raw_data(&mut ctx);
    let res_bin = MapMaker::new(setup(25.0, false))
        .unwrap()
        .run(&mut binned, &mut ctx)
        .unwrap();
    let binmap = map(&destriped, res.binmap.as_ref().unwrap());
    assert_eq!(binmap.data(), map(&binned, &res_bin.map).data());
    let worst = binmap
        .data()
        .iter()
        .zip(map(&destriped, &res.map).data())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    assert!(worst > 0.1, "binned and destriped maps differ by {worst}");
}

#[test]
fn hits_count_the_unflagged_samples() {
    let scan = Scan {
        n_obs: 1,
        ..Scan::default()
    };
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = sky_data(&scan, &mut ctx);
    // Detector flags: bit 1 (cut), bit 8 (not in the mask). Shared flags:
    // bit 1 (invalid: no pixel either), bit 32 (not in the mask).
    for ob in &mut data.obs {
        let n = ob.n_samples();
        let shared: Vec<u8> = (0..n)
            .map(|s| match (hash01(7, s as u64) * 50.0) as i64 {
                0 => defaults::SHARED_MASK_INVALID,
                1 => 32,
                _ => 0,
            })
            .collect();
        ob.shared.set(defaults::SHARED_FLAGS, &[], &shared).unwrap();
        let dets = ob.local_detectors().to_vec();
        let f = ob.detdata.get_mut(defaults::DET_FLAGS).unwrap();
        for (d, name) in dets.iter().enumerate() {
            for (s, x) in f.row_of_mut::<u8>(name).unwrap().iter_mut().enumerate() {
                *x = match (hash01(8 + d as u64, s as u64) * 30.0) as i64 {
                    0 => defaults::DET_MASK_INVALID,
                    1 => 8,
                    _ => 0,
                };
            }
        }
    }
    let mut s = setup(100.0, true);
    s.binner.full_pointing = true;
    let mut mm = MapMaker::new(s).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    let hits = data.meta.object::<PixelData<i64>>(&res.hits).unwrap();
    let dist = hits.distribution().clone();
    let mut expected = vec![0i64; hits.n_local_pix()];
    let mut total = 0i64;
    for ob in &data.obs {
        let shared = ob.shared.data::<u8>(defaults::SHARED_FLAGS).unwrap();
        let pixels = ob
            .detdata
            .get("pixels")
            .expect("full_pointing keeps the pixels");
        let flags = ob.detdata.get(defaults::DET_FLAGS).unwrap();
        for d in ob.local_detectors() {
            let p = pixels.row_of::<i64>(d).unwrap();
            let f = flags.row_of::<u8>(d).unwrap();
            for s in 0..ob.n_samples() {
                if shared[s] & defaults::SHARED_MASK_NONSCIENCE == 0
                    && f[s] & defaults::DET_MASK_NONSCIENCE == 0
                {
                    assert!(p[s] >= 0);
                    expected[dist.local_index(p[s]).unwrap()] += 1;
                    total += 1;
                } else if shared[s] & defaults::SHARED_MASK_INVALID != 0 {
                    assert_eq!(p[s], -1, "invalid samples have no pixel");
                }
            }
        }
    }
    assert_eq!(hits.data(), expected.as_slice());
    assert_eq!(hits.data().iter().sum::<i64>(), total);
    assert!(
        total < (scan.n_samples * 2 * scan.n_pairs) as i64,
        "some samples are cut"
    );
    // The solver saw at least the same cuts.
    assert!(res.solver_cut_samples >= (scan.n_samples * 2 * scan.n_pairs) as u64 - total as u64);
}

fn run_with_threads(threads: usize) -> (Data, MapMakerResult) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let scan = Scan::default();
        let reg = registry(threads);
        let mut ctx = context(&reg, "");
        let mut data = sky_data(&scan, &mut ctx);
        add_offsets(&mut data, 400, 2.0);
        // Some noise, so the solve does not converge trivially.
        for ob in &mut data.obs {
            let name = ob.name().to_string();
            let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
            for (i, x) in sig.data_mut::<f64>().unwrap().iter_mut().enumerate() {
                *x += 0.01 * hash01(name.len() as u64 + 99, i as u64);
            }
        }
        let mut s = setup(40.0, true);
        s.mapmaker.keep_solver_products = true;
        s.mapmaker.write_noiseweighted_map = true;
        let mut mm = MapMaker::new(s).unwrap();
        let res = mm.run(&mut data, &mut ctx).unwrap();
        (data, res)
    })
}

#[test]
fn one_and_two_threads_give_identical_bits() {
    let (d1, r1) = run_with_threads(1);
    let (d2, r2) = run_with_threads(2);
    assert_eq!(r1, r2, "iterations and residuals");
    assert!(r1.iterations > 3);
    for key in [
        r1.map.clone(),
        r1.binmap.clone().unwrap(),
        r1.cov.clone(),
        r1.rcond.clone(),
        r1.noiseweighted_map.clone().unwrap(),
    ] {
        let (a, b) = (map(&d1, &key), map(&d2, &key));
        assert!(
            a.data()
                .iter()
                .zip(b.data())
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{key} differs"
        );
    }
    assert_eq!(hits(&d1, &r1), hits(&d2, &r1));
    assert_eq!(amplitude_bits(&d1, &r1), amplitude_bits(&d2, &r1));
}

/// The hits of a run.
fn hits(d: &Data, res: &MapMakerResult) -> Vec<i64> {
    d.meta
        .object::<PixelData<i64>>(&res.hits)
        .unwrap()
        .data()
        .to_vec()
}

/// The bits of a run's kept amplitudes.
fn amplitude_bits(d: &Data, res: &MapMakerResult) -> Vec<u64> {
    d.meta
        .object::<HostArray<f64>>(res.amplitudes.as_ref().unwrap())
        .unwrap()
        .values
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

#[test]
fn requirements_hold_before_and_after() {
    let scan = Scan {
        n_obs: 1,
        n_samples: 4000,
        ..Scan::default()
    };
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = sky_data(&scan, &mut ctx);
    let mut s = setup(30.0, true);
    s.mapmaker.write_invcov = true;
    s.mapmaker.save_cleaned = true;
    s.binner.full_pointing = true;
    let mut mm = MapMaker::new(s).unwrap();
    check_requirements(&data, &mm.requires()).unwrap();
    mm.exec(&mut data, &mut ctx).unwrap();
    check_requirements(&data, &mm.provides()).unwrap();
    let res = mm.result().unwrap().clone();
    assert_eq!(res.cleaned.as_deref(), Some("mapmaker_cleaned"));
    assert!(
        res.amplitudes.is_none(),
        "solver products are not kept by default"
    );
    for key in [
        "mapmaker_solve_hits",
        "mapmaker_solve_cov",
        "mapmaker_solve_rhs",
    ] {
        assert!(!data.meta.contains(key), "{key} should be gone");
    }

    // A missing input is reported by name.
    let mut data2 = make_data(&scan);
    data2.obs[0]
        .shared
        .remove(defaults::BORESIGHT_RADEC)
        .unwrap();
    let mut mm2 = MapMaker::new(setup(30.0, true)).unwrap();
    let e = mm2.run(&mut data2, &mut ctx).unwrap_err().to_string();
    assert_eq!(e, "observation 'obs_000' lacks shared 'boresight_radec'");

    // A bad configuration is refused.
    let mut bad = setup(30.0, true);
    bad.baselines.use_noise_prior = true;
    assert!(MapMaker::new(bad).is_err());
}

fn run_on(policy: &str) -> (Data, MapMakerResult, ExecContext) {
    run_on_with(policy, false)
}

fn run_on_with(policy: &str, full_pointing: bool) -> (Data, MapMakerResult, ExecContext) {
    run_on_step(policy, full_pointing, 30.0)
}

fn run_on_step(
    policy: &str,
    full_pointing: bool,
    step_time: f64,
) -> (Data, MapMakerResult, ExecContext) {
    run_on_batch(policy, full_pointing, step_time, 8, &Scan::default())
}

fn run_on_batch(
    policy: &str,
    full_pointing: bool,
    step_time: f64,
    pointing_batch: usize,
    scan: &Scan,
) -> (Data, MapMakerResult, ExecContext) {
    run_on_setup(policy, step_time, scan, |s| {
        s.binner.full_pointing = full_pointing;
        s.binner.pointing_batch = pointing_batch;
    })
}

/// A run on `scan` with `setup(step_time, true)` changed by `f`.
fn run_on_setup(
    policy: &str,
    step_time: f64,
    scan: &Scan,
    f: impl FnOnce(&mut MapMakerSetup),
) -> (Data, MapMakerResult, ExecContext) {
    let (data, res, ctx, _) = run_on_setup_planned(policy, step_time, scan, f);
    (data, res, ctx)
}

/// [`run_on_setup`], with the plan the run took.
fn run_on_setup_planned(
    policy: &str,
    step_time: f64,
    scan: &Scan,
    f: impl FnOnce(&mut MapMakerSetup),
) -> (Data, MapMakerResult, ExecContext, Plan) {
    run_on_registry_planned(&registry(2), policy, step_time, scan, f)
}

/// [`run_on_setup_planned`] with the backends of `reg`.
fn run_on_registry_planned(
    reg: &Arc<Registry>,
    policy: &str,
    step_time: f64,
    scan: &Scan,
    f: impl FnOnce(&mut MapMakerSetup),
) -> (Data, MapMakerResult, ExecContext, Plan) {
    let mut ctx = context(reg, policy);
    let mut data = {
        let mut cpu = context(reg, "");
        sky_data(scan, &mut cpu)
    };
    add_offsets(&mut data, 300, 1.5);
    let mut s = setup(step_time, true);
    s.mapmaker.keep_solver_products = true;
    s.mapmaker.save_cleaned = true;
    s.mapmaker.overwrite_cleaned = true;
    f(&mut s);
    let mut mm = MapMaker::new(s).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    (data, res, ctx, mm.plan().clone())
}

/// Compact pointing on a device (`device-compact`; the fake device runs
/// the CPU plugin's kernels behind device handles, so the sums are the
/// host's): `pixels_healpix` writes the compact pixels as i32 on the device
/// (ABI minor 8), the fused steps rebuild the weights from the boresight,
/// and, with the fused kernels sent to the host (`device-compact-unfused`),
/// `compact_expand_pointing` rebuilds each batch's fields on the device.
/// Both give the host's compact run's hits, and its maps to rounding; the
/// run leaves no pointing field behind.
#[test]
fn compact_pointing_on_a_device_gives_the_host_maps() {
    let run = |policy: &str| {
        let (data, res, _, plan) = run_on_setup_planned(policy, 30.0, &Scan::default(), |s| {
            s.binner.full_pointing = false;
            s.binner.compact_pointing = true;
            s.binner.pointing_batch = 3;
        });
        (data, res, plan)
    };
    let (host, host_res, plan) = run("");
    assert_eq!(plan.to_string(), "host-compact-fused (3 detectors a batch)");
    for (policy, want) in [
        ("run=fakedev", "device-compact-fused (3 detectors a batch)"),
        (
            "run=fakedev,kernel.fused_project=cpu",
            "device-compact-unfused (3 detectors a batch)",
        ),
    ] {
        let (dev, res, plan) = run(policy);
        assert_eq!(plan.to_string(), want, "{policy}");
        let (h0, h1) = (
            host.meta.object::<PixelData<i64>>(&host_res.hits).unwrap(),
            dev.meta.object::<PixelData<i64>>(&res.hits).unwrap(),
        );
        assert_eq!(h0.data(), h1.data(), "{policy}: hits");
        assert_maps_close(&host, &dev, &host_res);
        for ob in &dev.obs {
            for f in [
                defaults::QUATS,
                defaults::PIXELS,
                defaults::WEIGHTS,
                "mapmaker_compact_pixels",
            ] {
                assert!(!ob.detdata.contains(f), "{policy}: {f} left");
            }
        }
    }
}

/// A plugin built before ABI minor 8 (`fakedev7`: the fake device under a
/// header of minor 7, whose `pixels_healpix` reads `pixels_i32` as reserved
/// and would write i64s) is never asked for i32 pixels: compact pointing
/// does not apply on it, the plan keeps the full pointing on the device
/// and says why, and the maps are the host's compact run's. Asked directly,
/// its `pixels_healpix` call for an i32 field is refused before it is
/// made, naming the backend, its minor and minor 8, and writes nothing.
#[test]
fn a_plugin_before_minor_8_keeps_full_pointing_and_is_never_asked_for_i32_pixels() {
    let reg = registry_with_fakedev_minor_7(2);
    let compact = |s: &mut MapMakerSetup| {
        s.binner.full_pointing = false;
        s.binner.compact_pointing = true;
        s.binner.pointing_batch = 3;
    };
    let (host, host_res, _, plan) =
        run_on_registry_planned(&reg, "", 30.0, &Scan::default(), compact);
    assert_eq!(plan.to_string(), "host-compact-fused (3 detectors a batch)");
    let (dev, res, _, plan) =
        run_on_registry_planned(&reg, "run=fakedev7", 30.0, &Scan::default(), compact);
    assert_eq!(plan.to_string(), "device-kept-fused");
    assert!(
        plan.why.iter().any(|w| w.contains(
            "binner.compact_pointing does not apply (the pixels_healpix kernel runs on a plugin \
             that does not write i32 pixels (before ABI minor 8))"
        )),
        "{:?}",
        plan.why
    );
    let (h0, h1) = (
        host.meta.object::<PixelData<i64>>(&host_res.hits).unwrap(),
        dev.meta.object::<PixelData<i64>>(&res.hits).unwrap(),
    );
    assert_eq!(h0.data(), h1.data(), "hits");
    assert_maps_close(&host, &dev, &host_res);

    // The operator asked for i32 pixels on it directly.
    let mut data = {
        let mut cpu = context(&reg, "");
        sky_data(&Scan::default(), &mut cpu)
    };
    let mut ctx = context(&reg, "run=fakedev7");
    let s = setup(30.0, false);
    let mut det = PointingDetector::new("det_pointing", s.det_pointing.clone());
    det.exec(&mut data, &mut ctx).unwrap();
    let mut pixels =
        PixelsHealpix::new("pixels", s.pixels.clone(), s.det_pointing.clone()).unwrap();
    pixels.compact = true;
    let err = pixels.exec(&mut data, &mut ctx).unwrap_err().to_string();
    assert!(
        err.contains(
            "backend fakedev7 (ABI minor 7) cannot write i32 pixels into `pixels` (the compact \
             pointing needs a plugin of ABI minor 8 or later)"
        ),
        "{err}"
    );
    // Nothing was written: the observations after the refused one have no
    // pixel field, and the field the operator made for the refused call
    // (i32, zeroed) holds no pixel.
    let made: Vec<bool> = data
        .obs
        .iter()
        .map(|ob| ob.detdata.contains(&s.pixels.pixels))
        .collect();
    assert!(made[0], "the refused call's field");
    assert!(made[1..].iter().all(|&m| !m), "{made:?}");
    for ob in data.obs.iter().take(1) {
        let f = ob.detdata.get(&s.pixels.pixels).unwrap();
        assert_eq!(f.dtype(), toast_core::DType::I32);
        for d in ob.local_detectors() {
            let row = f.row_of::<i32>(d).unwrap();
            assert!(
                row.iter().all(|&p| p == 0),
                "{d}: written by a refused call"
            );
        }
    }
}

/// Over its device memory budget, tiny's kept pointing becomes compact
/// where compact pointing applies (`fakedev`, ABI minor 8) and recomputed
/// where it does not (`fakedev7`: the plugin cannot write i32 pixels): the
/// budget fitter's one decision (`SatelliteJob::fit_device_budget`), with
/// the largest batch that fits (8 detectors at nside 128 in 0.12 GiB).
#[test]
fn over_its_budget_kept_pointing_becomes_compact_where_compact_applies() {
    for (device, name, want, how) in [
        (
            FakeDevice::Current,
            "fakedev",
            "device-compact-fused (2 detectors a batch)",
            "the pixels are kept compact on the device (i32), the passes run 2 detector(s) a \
             batch",
        ),
        (
            FakeDevice::AbiMinor7,
            "fakedev7",
            "device-recomputed-fused (3 detectors a batch)",
            "the pointing is recomputed on the device, 3 detector(s) a batch",
        ),
    ] {
        let reg = registry_with_fake_device(1, device, ";memory=0.12");
        let (mut job, sim, plan) = tiny_8_detectors_nside_128_on(name, &reg);
        let why = job.fit_device_budget(&plan, &sim, &reg).unwrap();
        let why = why.unwrap_or_else(|| panic!("{name}: the plan was not fitted"));
        assert!(
            why.starts_with(
                "the plan device-kept-fused would need 0.21 GiB of device memory on \
                 backend"
            ) && why.ends_with(how),
            "{name}: {why}"
        );
        let fitted = job.execution_plan(&reg);
        assert_eq!(fitted.to_string(), want, "{name}");
        let predicted = job.predicted_device_memory(&plan, &sim, &fitted).unwrap();
        assert!(
            predicted <= 0.12 * (1u64 << 30) as f64,
            "{name}: {predicted}"
        );
    }
}

/// The job of tiny with 8 detectors at nside 128 (one process), run on the
/// backend `name` of `reg`, with the device's pixel grid: its plan, kept
/// pointing on a device, is the budget fitter's to change.
fn tiny_8_detectors_nside_128_on(
    name: &str,
    reg: &Registry,
) -> (
    toast_ops::workflow::SatelliteJob,
    toast_ops::sim::SimSatellite,
    toast_ops::dist::JobDistribution,
) {
    use toast_ops::workflow::{config, SatelliteJob, SizeOverrides};
    let mut table = config::workflow_defaults("tiny");
    config::apply_set(&mut table, "pixels.nside=128").unwrap();
    let mut cfg = config::build(table).unwrap();
    cfg.dispatch.set_run(name).unwrap();
    let overrides = SizeOverrides {
        n_det: Some(8),
        n_obs: None,
    };
    let mut job = SatelliteJob::new("tiny", cfg, overrides).unwrap();
    // The budgets are the test's: not a TOAST_GPU_MEM_GB of the shell.
    job.gpu_mem_gb = None;
    let mut sim = job.simulation().unwrap();
    let plan = job.plan(&mut sim, 1, 1, None).unwrap();
    assert_eq!(job.execution_plan(reg).to_string(), "device-kept-fused");
    job.fit_device_pixels(reg);
    (job, sim, plan)
}

/// A device whose allocations take the host's memory (`fakedev`, whose
/// `device_info` says so from ABI minor 9) shares its process's share of
/// the node's memory with its host: without a configured budget it gets
/// 90% of what the host's prediction leaves of it (here 0.15 GiB, so
/// tiny's kept plan at 0.21 GiB becomes compact), and the memory check
/// counts its peak. The same
/// device under a header of minor 7 (`fakedev7`, which cannot say) keeps
/// the default budget, 90% of the free memory, and is not counted.
#[test]
fn a_device_in_the_host_memory_shares_the_node_memory_with_the_host() {
    use toast_ops::workflow::presets::MemoryBound;
    let gib = (1u64 << 30) as f64;
    for (device, name, shared) in [
        (FakeDevice::Current, "fakedev", true),
        (FakeDevice::AbiMinor7, "fakedev7", false),
    ] {
        let reg = registry_with_fake_device(1, device, "");
        let (mut job, sim, plan) = tiny_8_detectors_nside_128_on(name, &reg);
        let kept = job.execution_plan(&reg);
        let host = job.predicted_process_memory(&plan, &sim, &kept);
        // Two processes on the node; this one's share of the memory.
        job.processes_on_node = 2;
        assert!(job.set_memory_bound(Some(MemoryBound {
            bytes: host + 0.15 / 0.9 * gib,
            source: "the test's share".into(),
            per_process: true,
        })));
        assert_eq!(job.device_in_host_memory(&reg).is_some(), shared, "{name}");
        let (_, budget) = job.device_budget(&plan, &sim, &reg).unwrap().unwrap();
        let why = job.fit_device_budget(&plan, &sim, &reg).unwrap();
        let fitted = job.execution_plan(&reg);
        let device = job.predicted_device_memory(&plan, &sim, &fitted).unwrap();
        let (own, counted) = job.predicted_host_memory(&plan, &sim, &fitted, &reg);
        if shared {
            assert!(
                (budget.bytes as f64 - 0.15 * gib).abs() < 1e-6 * gib,
                "{budget}"
            );
            assert_eq!(budget.source, BudgetSource::HostShare, "{budget}");
            let why = why.unwrap_or_else(|| panic!("{name}: the plan was not fitted"));
            assert!(why.contains(&budget.source.to_string()), "{why}");
            assert_eq!(
                fitted.to_string(),
                "device-compact-fused (3 detectors a batch)"
            );
            assert_eq!((own, counted), (host, Some((name.to_string(), device))));
        } else {
            assert_eq!(budget.source, BudgetSource::DeviceDefault, "{budget}");
            assert_eq!((why, fitted.to_string()), (None, kept.to_string()));
            assert_eq!((own, counted), (host, None));
        }
        // The check: the two processes' host and device peaks fit the bound.
        job.check_memory_on(&toast_core::SerialComm, &plan, &sim, &fitted, &reg)
            .unwrap();
        // And a share that holds the host's peak but not the device's too
        // is refused where the device's memory is the host's.
        let tight = MemoryBound {
            bytes: host + 0.5 * device,
            source: "a tight share".into(),
            per_process: true,
        };
        let (host_part, dev) = job.predicted_host_memory(&plan, &sim, &fitted, &reg);
        let dev = dev.as_ref().map(|(n, b)| (n.as_str(), *b));
        let checked = job.check_memory(&tight, host_part, dev);
        assert_eq!(checked.is_err(), shared, "{name}: {checked:?}");
    }
}

/// A detector cut by the binner's `det_mask` in every observation. With
/// the unfused device passes (the fused kernels sent to the host, so the
/// plan is `device-recomputed-unfused`) the solver's work copy of the
/// timestream (`CopyDetData`, one copy before the batches, all detectors
/// at once with `pointing_batch = 0` or batches of 8) cannot be one
/// whole-field copy on the device (a detector is cut): it is made by the
/// host as a host step of the device scope, and goes up once. With the
/// fused device passes no copy exists. The maps must be the CPU's, bit for
/// bit, in all four runs.
#[test]
fn a_cut_detector_sends_the_work_copy_to_the_host_with_the_same_maps() {
    for batch in [0, 8] {
        for fused in [true, false] {
            cut_detector_run(batch, fused);
        }
    }
}

fn cut_detector_run(batch: usize, fused: bool) {
    let run = |policy: &str| {
        let reg = registry(2);
        let mut ctx = context(&reg, policy);
        let mut data = {
            let mut cpu = context(&reg, "");
            sky_data(&Scan::default(), &mut cpu)
        };
        add_offsets(&mut data, 300, 1.5);
        for ob in &mut data.obs {
            let first = ob.local_detectors()[0].clone();
            ob.set_det_flags(&first, defaults::DET_MASK_NONSCIENCE)
                .unwrap();
        }
        let mut s = setup(30.0, true);
        s.mapmaker.keep_solver_products = true;
        s.binner.pointing_batch = batch;
        let mut mm = MapMaker::new(s).unwrap();
        let res = mm.run(&mut data, &mut ctx).unwrap();
        (data, res, ctx, mm.plan().clone())
    };
    let (cpu_data, cpu_res, _, _) = run("");
    let policy = if fused {
        "run=fakedev"
    } else {
        "run=fakedev,kernel.fused_project=cpu"
    };
    let (dev_data, dev_res, ctx, plan) = run(policy);
    assert_eq!(cpu_res, dev_res);
    assert!(!plan.host() && plan.device_fused() == fused, "{plan}");
    assert_same_maps(&cpu_data, &dev_data, &cpu_res);
    // The host copy's input came back and its output went up, as a host
    // step: nothing unstaged.
    let unstaged = movement::ledger(&ctx)
        .map(|l| l.unstaged.clone())
        .unwrap_or_default();
    assert_eq!(unstaged.total_calls(), 0, "{unstaged:?}");
    // Unfused, the host made the work copy: it went up once per
    // observation (not once per batch). Fused, there is none.
    let rep = movement::ledger(&ctx).unwrap();
    let temp = format!("detdata.{}_temp", setup(30.0, true).name);
    let up = rep.copies(&temp).0;
    let want = if fused { 0 } else { dev_data.obs.len() as u64 };
    assert_eq!(
        up,
        want,
        "batch {batch}, fused {fused}, {temp}: {:?}",
        rep.copies(&temp)
    );
}

#[test]
fn pointing_recomputed_per_batch_gives_the_kept_pointing_maps() {
    // Host runs without `full_pointing` recompute the pointing in every
    // pass, one batch of detectors at a time (the fields hold only the
    // batch), and leave no pointing field. With one observation the sums
    // run in the same order, so the maps and the cleaned timestream are
    // bit-identical to those of the kept pointing; with several, a pass
    // visits every observation for its batch (TOAST's detector sets do
    // the same), so the maps agree to rounding.
    let one = Scan {
        n_obs: 1,
        n_samples: 24_000,
        ..Scan::default()
    };
    let two = Scan::default();
    for (scan, exact) in [(&one, true), (&two, false)] {
        let (kept, res, _) = run_on_batch("", true, 30.0, 8, scan);
        for batch in [0, 3, 1] {
            let (data, _, _) = run_on_batch("", false, 30.0, batch, scan);
            if exact || batch == 0 {
                assert_same_maps(&kept, &data, &res);
            } else {
                assert_maps_close(&kept, &data, &res);
            }
            for ob in &data.obs {
                for f in [defaults::QUATS, defaults::PIXELS, defaults::WEIGHTS] {
                    assert!(!ob.detdata.contains(f), "batch {batch}: {f} left");
                }
            }
        }
    }
}

fn assert_same_maps(a: &Data, b: &Data, res: &MapMakerResult) {
    for key in [&res.map, res.binmap.as_ref().unwrap(), &res.cov] {
        let (x, y) = (map(a, key), map(b, key));
        assert!(
            x.data()
                .iter()
                .zip(y.data())
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "{key} differs"
        );
    }
    for (oa, ob) in a.obs.iter().zip(&b.obs) {
        let sa = oa
            .detdata
            .get(defaults::DET_DATA)
            .unwrap()
            .data::<f64>()
            .unwrap();
        let sb = ob
            .detdata
            .get(defaults::DET_DATA)
            .unwrap()
            .data::<f64>()
            .unwrap();
        assert!(
            sa.iter().zip(sb).all(|(p, q)| p.to_bits() == q.to_bits()),
            "cleaned signal differs"
        );
    }
}

/// A step far longer than any interval gives each interval one baseline
/// (TOAST's `ceil(len / step_length)`), on the host and on a device, with
/// no sample arithmetic overflowing in the kernels (issue #13).
#[test]
fn steps_longer_than_the_intervals_give_one_baseline_each() {
    let (long_data, long_res, _) = run_on_step("", false, 1e9);
    let (huge_data, huge_res, _) = run_on_step("", false, 1e15);
    assert_eq!(long_res, huge_res);
    assert_same_maps(&long_data, &huge_data, &long_res);
    let (dev_data, dev_res, _) = run_on_step("run=fakedev", false, 1e15);
    assert_eq!(long_res, dev_res);
    assert_same_maps(&long_data, &dev_data, &long_res);
}

#[test]
fn device_backend_gives_the_same_maps_with_data_staged_once() {
    let (cpu_data, cpu_res, _) = run_on("");
    let (dev_data, dev_res, ctx) = run_on("run=fakedev");
    assert_eq!(cpu_res, dev_res);
    assert_same_maps(&cpu_data, &dev_data, &cpu_res);

    // Every kernel argument was staged: no temporary copies.
    let unstaged = movement::ledger(&ctx)
        .map(|l| l.unstaged.clone())
        .unwrap_or_default();
    assert_eq!(unstaged.total_calls(), 0, "{unstaged:?}");
    let reports = movement::ledger(&ctx).expect("a device scope ran");
    assert_eq!(reports.scopes.len(), 1, "one scope for the whole map-maker");
    eprintln!("{}", reports.scopes[0]);
    let n_obs = dev_data.obs.len() as u64;
    // The timestream goes up once and, cleaned in place, comes back once.
    assert_eq!(reports.copies("detdata.signal"), (n_obs, n_obs));
    // The boresight goes up once; pointing and the solver flags are made
    // on the device and never cross the bus (the pixel distribution comes
    // from the device's hit submaps, the solver flags, the rcond mask and
    // the template's good samples are kernels on the device copies).
    assert_eq!(reports.copies("shared.boresight_radec"), (n_obs, 0));
    for f in [
        "detdata.mapmaker_solve_flags",
        "detdata.quats",
        "detdata.pixels",
        "detdata.weights",
    ] {
        assert_eq!(reports.copies(f), (0, 0), "{f} crossed the bus");
    }
    // The solver's sides are the fused kernels on the device: no work
    // timestream exists, so none crosses the bus.
    assert_eq!(reports.copies("detdata.mapmaker_temp"), (0, 0));
    assert!(!dev_data
        .obs
        .iter()
        .any(|ob| ob.detdata.contains("mapmaker_temp")));
    // The solve is device-resident: the solver's binned map never crosses
    // (its covariance goes up once), nor does any amplitude vector during
    // the CG iterations: per iteration nothing goes up and only the dot
    // products' partial sums come down (two or three dot products of at
    // most AMP_DOT_DEVICE_BLOCKS f64s: a bound that does not grow with the
    // number of amplitudes).
    assert_eq!(reports.copies("global.mapmaker_solve_bin"), (0, 0));
    // The solver's covariance is accumulated on the device
    // (`cov_accum_timestream`), comes back once to be inverted on the host
    // and goes up once inverted; its hits come back once.
    assert_eq!(reports.copies("global.mapmaker_solve_cov"), (1, 1));
    assert_eq!(reports.copies("global.mapmaker_solve_hits"), (0, 1));
    for v in ["lhs_in", "lhs_out", "solve_residual", "solve_precond"] {
        assert_eq!(
            reports.copies(&format!("global.mapmaker_{v}")).0,
            0,
            "{v} went up"
        );
    }
    assert_eq!(reports.copies("global.mapmaker_solve_x"), (0, 1));
    let cg = ctx
        .extensions
        .get::<CgTransfers>()
        .expect("the solver's accounting");
    assert_eq!(cg.per_iteration.len(), dev_res.iterations);
    let blocks = dev_res
        .n_amplitudes
        .div_ceil(4096)
        .clamp(1, AMP_DOT_DEVICE_BLOCKS) as u64;
    for (i, it) in cg.per_iteration.iter().enumerate() {
        assert_eq!(it.host_to_device_bytes, 0, "CG iteration {i}: {it:?}");
        let d2h = it.device_to_host_bytes;
        assert!(
            d2h == 2 * 8 * blocks || d2h == 3 * 8 * blocks,
            "CG iteration {i}: {it:?}, not two or three dot products of {blocks} partial sums"
        );
        assert!(d2h <= 3 * 8 * AMP_DOT_DEVICE_BLOCKS as u64);
    }
    let (h2d, d2h, allocs, frees) = reports.totals();
    assert_eq!(allocs, frees, "every device buffer freed");
    // What the device saw is exactly what the scope accounted for.
    let reg_stats = ctx
        .ext::<toast_accel::host::Dispatcher>()
        .unwrap()
        .registry()
        .get("fakedev")
        .unwrap()
        .stats()
        .snapshot();
    assert_eq!((reg_stats.h2d_calls, reg_stats.d2h_calls), (h2d, d2h));
    assert_eq!(reg_stats.allocs, reg_stats.frees);
    // And the kernels ran there.
    let timers: Vec<&str> = ctx.timers.names().collect();
    for k in ["fused_accumulate[fakedev]", "fused_project[fakedev]"] {
        assert!(timers.iter().any(|t| t.contains(k)), "{k}: {timers:?}");
    }
    assert!(!timers.iter().any(|t| t.contains("[cpu]")), "{timers:?}");
}

/// The detector data streamed through the device
/// (`binner.stream_detector_data`, the pointing recomputed in batches of
/// 2 of the 6 detectors): each pass stages its batch's rows of the
/// timestream and flags (the rows the device wrote go back to the host
/// before the next batch's come up), the device never holds more than a
/// batch of them per observation, no kernel call copies unstaged data, and
/// the maps, the solver's products and the cleaned timestream are those
/// of the same plan with the detector data resident, bit for bit.
///
/// The same holds for the unfused passes (the fused kernels sent to the
/// host: the work copy of the timestream is made per batch on the device)
/// with the cleaned timestream in its own field (a copy per batch).
#[test]
fn streamed_detector_data_give_the_resident_maps_holding_one_batch() {
    streamed_run("run=fakedev", true);
    streamed_run("run=fakedev,kernel.fused_project=cpu", false);
}

fn streamed_run(policy: &str, in_place: bool) {
    let scan = Scan::default();
    let run = |stream: bool| {
        run_on_setup(policy, 30.0, &scan, |s| {
            s.binner.full_pointing = false;
            s.binner.pointing_batch = 2;
            s.binner.stream_detector_data = stream;
            s.mapmaker.overwrite_cleaned = in_place;
        })
    };
    let (resident, resident_res, resident_ctx) = run(false);
    let (streamed, streamed_res, ctx) = run(true);
    assert_eq!(resident_res, streamed_res);
    assert_same_maps(&resident, &streamed, &resident_res);
    let cleaned = resident_res.cleaned.clone().unwrap_or_default();
    assert_eq!(cleaned.is_empty(), in_place, "{cleaned}");
    for (a, b) in resident.obs.iter().zip(&streamed.obs) {
        if in_place {
            break;
        }
        let f = |ob: &toast_core::Observation| {
            let v = ob.detdata.get(&cleaned).unwrap().data::<f64>().unwrap();
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        assert!(f(a) == f(b), "{cleaned} differs");
    }
    let ledger = movement::ledger(&ctx).expect("a device scope ran");
    assert_eq!(ledger.unstaged.total_calls(), 0, "{:?}", ledger.unstaged);
    let (_, _, allocs, frees) = ledger.totals();
    assert_eq!(allocs, frees, "every device buffer freed");
    let row = scan.n_samples as u64;
    let (n_obs, n_det) = (scan.n_obs as u64, 2 * scan.n_pairs as u64);
    let at_peak = |ctx: &ExecContext, name: &str| {
        let peak = movement::ledger(ctx).unwrap().peak_staged_buffers();
        peak.get(name).copied().unwrap_or(0)
    };
    // f64 timestream, u8 detector and solver flags.
    for (name, bytes) in [
        ("detdata.signal", 8),
        ("detdata.flags", 1),
        ("detdata.mapmaker_solve_flags", 1),
    ] {
        let whole = n_obs * n_det * row * bytes;
        let held = at_peak(&ctx, name);
        assert!(
            held <= n_obs * 2 * row * bytes && held < whole,
            "{name}: {held} bytes on the device at the peak, a batch is {}",
            n_obs * 2 * row * bytes
        );
    }
    let peak = |c: &ExecContext| movement::ledger(c).unwrap().peak_staged_bytes();
    assert!(peak(&ctx) < peak(&resident_ctx));
    // The timestream crosses per batch: up for every pass that reads it,
    // down where the device wrote it (the cleaned timestream).
    let (up, down) = ledger.copies("detdata.signal");
    let (up0, down0) = movement::ledger(&resident_ctx)
        .unwrap()
        .copies("detdata.signal");
    assert!(up > up0, "{up} vs {up0}");
    // Cleaned in place batch by batch: each batch's rows come down once.
    if in_place {
        let batches = n_obs * n_det.div_ceil(2);
        assert_eq!((down0, down), (n_obs, batches));
    }
}

#[test]
fn device_backend_with_cached_pointing() {
    let (cpu_data, cpu_res, _) = run_on_with("", true);
    let (dev_data, dev_res, ctx) = run_on_with("run=fakedev", true);
    assert_eq!(cpu_res, dev_res);
    assert_same_maps(&cpu_data, &dev_data, &cpu_res);
    let unstaged = movement::ledger(&ctx)
        .map(|l| l.unstaged.clone())
        .unwrap_or_default();
    assert_eq!(unstaged.total_calls(), 0, "{unstaged:?}");
    let rep = movement::ledger(&ctx).unwrap();
    // Computed once on the device and once on the host (for the host
    // passes: hits, covariance, rcond mask) and kept: never copied.
    assert_eq!(rep.copies("detdata.pixels"), (0, 0));
    assert_eq!(rep.copies("detdata.weights"), (0, 0));
    assert_eq!(rep.copies("detdata.quats"), (0, 0));
    for (a, b) in cpu_data.obs.iter().zip(&dev_data.obs) {
        assert!(!a.detdata.contains("quats") && !b.detdata.contains("quats"));
        assert_eq!(
            a.detdata.get("pixels").unwrap().as_bytes(),
            b.detdata.get("pixels").unwrap().as_bytes()
        );
        assert_eq!(
            a.detdata.get("weights").unwrap().as_bytes(),
            b.detdata.get("weights").unwrap().as_bytes()
        );
    }
    // Same maps as recomputing the pointing in every pass.
    let (rec_data, rec_res, _) = run_on_with("", false);
    assert_eq!(rec_res, cpu_res);
    assert_same_maps(&rec_data, &cpu_data, &cpu_res);
}

#[test]
fn kernel_override_to_the_host_keeps_staged_data_consistent() {
    let (cpu_data, cpu_res, _) = run_on("");
    // The fused kernels on the host: the device plan's passes are the
    // unfused kernels, two of which run on the host.
    let (dev_data, dev_res, ctx) =
        run_on("run=fakedev,kernel.fused_project=cpu,kernel.scan_map=cpu,kernel.noise_weight=cpu");
    assert_eq!(cpu_res, dev_res);
    assert_same_maps(&cpu_data, &dev_data, &cpu_res);
    let unstaged = movement::ledger(&ctx)
        .map(|l| l.unstaged.clone())
        .unwrap_or_default();
    assert!(
        unstaged.total_calls() > 0,
        "host kernels must sync the staged data"
    );
    let timers: Vec<&str> = ctx.timers.names().collect();
    assert!(
        timers.iter().any(|t| t.contains("scan_map[cpu]")),
        "{timers:?}"
    );
    assert!(
        timers
            .iter()
            .any(|t| t.contains("build_noise_weighted[fakedev]")),
        "{timers:?}"
    );
}

#[test]
fn map_statistics_follow_toast() {
    let scan = Scan {
        n_obs: 1,
        ..Scan::default()
    };
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = sky_data(&scan, &mut ctx);
    let mut mm = MapMaker::new(setup(25.0, false)).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    let m = map(&data, &res.map);
    let full = m.to_full_sky();
    let n = full.len() / 3;
    assert_eq!(n as i64, 12 * NSIDE * NSIDE);
    let st = m.stats();
    for c in 0..3 {
        let xs: Vec<f64> = full.iter().skip(c).step_by(3).copied().collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        assert!((st.mean[c] - mean).abs() <= 1e-12 * mean.abs().max(1.0));
        assert!((st.rms[c] - var.sqrt()).abs() <= 1e-12 * var.sqrt());
    }
    let hits = data.meta.object::<PixelData<i64>>(&res.hits).unwrap();
    assert_eq!(
        hits.stats().sum[0] as usize,
        scan.n_samples * 2 * scan.n_pairs,
        "no flags: every sample hits"
    );
    let _ = Arc::clone(m.distribution());
}

/// A run the size of TOAST's `tiny` satellite case (12 detectors, 360 000
/// samples at 100 Hz, nside 1024 with nside_submap 16, one baseline per
/// detector), for timing by hand:
/// `cargo test --release -p toast-ops --test mapmaker -- --ignored --nocapture tiny`.
/// It prints timings and checks nothing about them.
#[test]
#[ignore = "manual timing run"]
fn tiny_sized_run_for_timing() {
    let scan = Scan {
        n_obs: 1,
        n_samples: 360_000,
        rate: 100.0,
        n_pairs: 6,
        spin_period: 600.0,
        prec_period: 3000.0,
        prec_angle: 65.0,
        spin_angle: 30.0,
        det_spacing: 0.0,
    };
    let nside = 1024;
    for full_pointing in [false, true] {
        let reg = registry(2);
        let mut ctx = context(&reg, "");
        let mut data = make_data(&scan);
        make_sky(&mut data, nside, 16);
        scan_sky(&mut data, &mut ctx, nside, 16);
        data.meta.remove("sky");
        add_offsets(&mut data, 36_000, 1.0);
        for ob in &mut data.obs {
            let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
            for (i, x) in sig.data_mut::<f64>().unwrap().iter_mut().enumerate() {
                *x += 0.1 * hash01(5, i as u64);
            }
        }
        let mut s = MapMakerSetup {
            pixels: PixelsHealpixConfig {
                nside: Nside::try_from(nside).unwrap(),
                nside_submap: Nside::new(16).unwrap(),
                ..PixelsHealpixConfig::default()
            },
            weights: StokesWeightsConfig {
                mode: StokesMode::IQU,
                ..StokesWeightsConfig::default()
            },
            ..MapMakerSetup::default()
        };
        s.binner.pixel_dist = "pix_dist".into();
        s.binner.full_pointing = full_pointing;
        s.mapmaker.solve_rcond_threshold = 1e-6;
        s.mapmaker.map_rcond_threshold = 1e-6;
        let mut mm = MapMaker::new(s).unwrap();
        let t0 = std::time::Instant::now();
        let res = mm.run(&mut data, &mut ctx).unwrap();
        let dt = t0.elapsed().as_secs_f64();
        let st = map(&data, &res.map).stats();
        eprintln!(
            "full_pointing={full_pointing}: {dt:.2} s, {} iterations, {} amplitudes ({} flagged), \
             cut {}/{}, initial residual {:e}, residuals {:?}, rms {:?}",
            res.iterations,
            res.n_amplitudes,
            res.n_flagged_amplitudes,
            res.solver_cut_samples,
            res.solver_total_samples,
            res.initial_residual,
            res.residuals,
            st.rms
        );
        let mut timers: Vec<(String, f64, u64)> = ctx
            .timers
            .names()
            .map(|n| {
                let t = ctx.timers.get(n).unwrap();
                (n.to_string(), t.seconds(), t.calls())
            })
            .collect();
        timers.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (n, s, c) in timers.iter().take(25) {
            eprintln!("  {s:9.3} s {c:6}  {n}");
        }
    }
}

/// The bus traffic of a device map-maker's setup (everything before the
/// first CG iteration) is bounded per detector sample, and no pointing
/// crosses it (issue #10): the device expands its pointing from the
/// boresight, the host has its own (expanded on the host, or handed over
/// as the satellite workflow hands over the sky scan's), and a caller that
/// reads no timestream afterwards gets none copied back. Copying the pixels
/// and weights back for the host passes, as the map-maker once did, costs
/// 32 bytes a detector sample and breaks the bound.
#[test]
fn device_setup_moves_no_pointing_and_a_bounded_number_of_bytes() {
    use toast_ops::exec::pipeline::{run_operators, RunOptions};
    use toast_ops::ops::{PixelsHealpix, PointingDetector, PointingOps, StokesWeights};
    let scan = Scan::default();
    let settings = |keep: bool| {
        let mut s = setup(30.0, true);
        s.mapmaker.save_cleaned = true;
        s.mapmaker.overwrite_cleaned = true;
        s.mapmaker.keep_solver_products = keep;
        s.binner.full_pointing = true;
        s
    };
    let reg = registry(2);
    let fresh = || {
        let mut cpu = context(&reg, "");
        let mut d = sky_data(&scan, &mut cpu);
        add_offsets(&mut d, 300, 1.5);
        d
    };
    // The CPU's maps, keeping the solver's products (so the final
    // covariance pass runs on its own) ...
    let (mut cpu_data, mut cpu_ctx) = (fresh(), context(&reg, ""));
    let cpu_res = MapMaker::new(settings(true))
        .unwrap()
        .run(&mut cpu_data, &mut cpu_ctx)
        .unwrap();
    for handed_over in [false, true] {
        let s = settings(false);
        let mut data = fresh();
        if handed_over {
            // The host's pointing, as the sky scan leaves it.
            let mut ops = PointingOps::new(
                PointingDetector::new("det_pointing", s.det_pointing.clone()),
                PixelsHealpix::new("pixels", s.pixels.clone(), s.det_pointing.clone()).unwrap(),
                StokesWeights::new("weights", s.weights.clone(), s.det_pointing.clone()),
            );
            let mut cpu = context(&reg, "");
            run_operators(
                "pointing",
                &mut ops.operators(),
                &mut data,
                &mut cpu,
                &RunOptions::default(),
            )
            .unwrap();
            for ob in &mut data.obs {
                ob.detdata.remove("quats").unwrap();
            }
        }
        let reg = registry(2);
        let mut ctx = context(&reg, "run=fakedev");
        let mut mm = MapMaker::new(s).unwrap();
        mm.reuse_pointing(handed_over);
        mm.discard_timestream(true);
        let res = mm.run(&mut data, &mut ctx).unwrap();
        // ... are the device's, with the final covariance the solver's.
        assert_eq!(res.iterations, cpu_res.iterations);
        assert_eq!(
            data.meta
                .object::<PixelData<i64>>(&res.hits)
                .unwrap()
                .data(),
            cpu_data
                .meta
                .object::<PixelData<i64>>(&cpu_res.hits)
                .unwrap()
                .data()
        );
        for (a, b) in [
            (&cpu_res.map, &res.map),
            (
                cpu_res.binmap.as_ref().unwrap(),
                res.binmap.as_ref().unwrap(),
            ),
            (&cpu_res.cov, &res.cov),
            (&cpu_res.rcond, &res.rcond),
        ] {
            let bits = |d: &Data, k: &str| -> Vec<u64> {
                map(d, k).data().iter().map(|v| v.to_bits()).collect()
            };
            assert_eq!(bits(&cpu_data, a), bits(&data, b), "{b} differs");
        }
        let rep = movement::ledger(&ctx).unwrap();
        eprintln!("handed over: {handed_over}\n{}", rep.scopes[0]);
        for f in ["detdata.pixels", "detdata.weights", "detdata.quats"] {
            assert_eq!(rep.copies(f), (0, 0), "{f}, handed over: {handed_over}");
        }
        // The timestream goes up once and is not copied back: the host's
        // stale (uncleaned) copy is removed instead.
        let n_obs = data.obs.len() as u64;
        assert_eq!(rep.copies("detdata.signal"), (n_obs, 0));
        assert!(data.obs.iter().all(|ob| !ob.detdata.contains("signal")));
        // Nor are the weights: made on the device only for a caller that
        // discards the detector data, no stale host field is left.
        assert!(data.obs.iter().all(|ob| !ob.detdata.contains("weights")));
        // Setup: the timestream and the solver's work timestream (8 bytes
        // a detector sample each), the solver flags (1), the boresight and
        // shared flags (33 bytes a sample), the solver's covariance (6
        // f64s a local pixel, accumulated on the device: down once to be
        // inverted, up once inverted), its hits (1 i64 down) and the small
        // pixel-domain items.
        let cg = ctx.extensions.get::<CgTransfers>().unwrap();
        let setup_bytes = cg.before.total_bytes();
        let n_det = (scan.n_pairs * 2) as u64;
        let det_samples = n_obs * n_det * scan.n_samples as u64;
        let n_pix = map(&data, &res.cov).n_local_pix() as u64;
        let bound = 17 * det_samples + 33 * det_samples / n_det + 16 * 8 * n_pix + 4096;
        eprintln!(
            "setup: {setup_bytes} bytes, {:.1} a detector sample (bound {bound})",
            setup_bytes as f64 / det_samples as f64
        );
        assert!(
            setup_bytes <= bound,
            "setup moved {setup_bytes} bytes > {bound} ({det_samples} detector samples, \
             {n_pix} local pixels)"
        );
    }
}

#[test]
fn compact_pointing_matches_the_kernels() {
    // `binner.compact_pointing`: exact pixels (so exact hits), weights
    // within a few ulp of the `stokes_weights_IQU` kernel's, maps that
    // agree with the kept pointing's to rounding, no pointing field left.
    let scan = Scan {
        n_obs: 1,
        n_samples: 24_000,
        ..Scan::default()
    };
    let (kept, res, mut ctx) = run_on_batch("", true, 30.0, 8, &scan);
    for batch in [3, 0] {
        let (data, r, _) = run_on_setup("", 30.0, &scan, |s| {
            s.binner.full_pointing = false;
            s.binner.compact_pointing = true;
            s.binner.pointing_batch = batch;
        });
        let (h0, h1) = (
            kept.meta.object::<PixelData<i64>>(&res.hits).unwrap(),
            data.meta.object::<PixelData<i64>>(&r.hits).unwrap(),
        );
        assert_eq!(h0.data(), h1.data(), "batch {batch}: hits");
        assert_maps_close(&kept, &data, &res);
        for ob in &data.obs {
            for f in [defaults::QUATS, defaults::PIXELS, defaults::WEIGHTS] {
                assert!(!ob.detdata.contains(f), "batch {batch}: {f} left");
            }
            assert!(!ob.detdata.contains("mapmaker_compact_pixels"));
        }
    }

    // The weights themselves, against the kernel's kept weights.
    let s = setup(30.0, true);
    let mut data = kept;
    // The kept pixels narrowed, as `pixels_healpix` writes them in compact
    // form (the conformance runner checks that on every backend).
    for ob in &mut data.obs {
        let dets: Vec<String> = ob.local_detectors().to_vec();
        ob.detdata
            .create("compact", toast_core::DType::I32, &[], None)
            .unwrap();
        let [pix, out] = ob
            .detdata
            .get_disjoint_mut([defaults::PIXELS, "compact"])
            .unwrap();
        for d in &dets {
            let p = pix.row_of::<i64>(d).unwrap();
            let o = out.row_of_mut::<i32>(d).unwrap();
            for (o, &p) in o.iter_mut().zip(p) {
                *o = i32::try_from(p).unwrap();
            }
        }
    }
    let mut pixels = s.pixels.clone();
    pixels.pixels = "pixels2".into();
    let mut weights = s.weights.clone();
    weights.weights = "weights2".into();
    let mut expand = toast_ops::ops::ExpandCompactPointing {
        name: "expand".into(),
        compact: "compact".into(),
        det_pointing: s.det_pointing.clone(),
        pixels,
        weights,
    };
    expand.exec(&mut data, &mut ctx).unwrap();
    let mut worst = 0.0f64;
    for ob in &data.obs {
        let f = |n: &str| ob.detdata.get(n).unwrap();
        for d in ob.local_detectors() {
            let (p0, p1) = (
                f(defaults::PIXELS).row_of::<i64>(d).unwrap(),
                f("pixels2").row_of::<i64>(d).unwrap(),
            );
            assert_eq!(p0, p1, "{d}: pixels");
            let (w0, w1) = (
                f(defaults::WEIGHTS).row_of::<f64>(d).unwrap(),
                f("weights2").row_of::<f64>(d).unwrap(),
            );
            for (a, b) in w0.iter().zip(w1) {
                worst = worst.max((a - b).abs());
            }
        }
    }
    assert!(
        worst <= 8.0 * f64::EPSILON,
        "weights differ by {worst:e} from the kernel's"
    );
}

/// The map, binned map and covariance of `data` agree with `kept`'s to
/// 1e-9 of each map's largest value.
fn assert_maps_close(kept: &Data, data: &Data, res: &MapMakerResult) {
    for key in [&res.map, res.binmap.as_ref().unwrap(), &res.cov] {
        let (x, y) = (map(kept, key), map(data, key));
        let scale = x.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        for (p, q) in x.data().iter().zip(y.data()) {
            assert!((p - q).abs() <= 1e-9 * scale, "{key}: {p} vs {q}");
        }
    }
}

/// A run with compact pointing (`binner.compact_pointing`) or, with
/// `kept`, the pointing kept (`binner.full_pointing`), batches of `batch`,
/// with the fused passes on or off, in a pool of `threads`.
fn run_fused(
    threads: usize,
    scan: &Scan,
    (batch, kept): (usize, bool),
    fused: bool,
) -> (Data, MapMakerResult) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let reg = registry(threads);
        let mut ctx = context(&reg, "");
        let mut data = sky_data(scan, &mut ctx);
        add_offsets(&mut data, 300, 1.5);
        for ob in &mut data.obs {
            let name = ob.name().to_string();
            let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
            for (i, x) in sig.data_mut::<f64>().unwrap().iter_mut().enumerate() {
                *x += 0.01 * hash01(name.len() as u64 + 7, i as u64);
            }
        }
        let mut s = setup(30.0, true);
        s.mapmaker.keep_solver_products = true;
        s.mapmaker.save_cleaned = true;
        s.mapmaker.overwrite_cleaned = true;
        s.binner.full_pointing = kept;
        s.binner.compact_pointing = !kept;
        s.binner.pointing_batch = batch;
        let mut mm = MapMaker::new(s).unwrap();
        mm.fused_passes(fused);
        let res = mm.run(&mut data, &mut ctx).unwrap();
        let ran_fused = ctx.timers.names().any(|t| t.contains("fused_projection"));
        assert_eq!(ran_fused, fused, "fused passes ran: {ran_fused}");
        (data, res)
    })
}

#[test]
fn fused_passes_are_the_unfused_ones_bit_for_bit() {
    // The fused passes (the solver's right- and left-hand sides, the final
    // maps), with compact pointing (the weights rebuilt block by block in
    // cache) and with the pointing kept (read in place): every value and
    // every sum's order is the unfused passes', so the solution, the maps
    // and the cleaned timestream are bit-identical, with one or several
    // observations, any batch size and one or two threads.
    let one = Scan {
        n_obs: 1,
        n_samples: 24_000,
        ..Scan::default()
    };
    let two = Scan::default();
    for kept in [false, true] {
        for scan in [&one, &two] {
            for batch in [8, 3] {
                let form = (batch, kept);
                let (unfused, res, ..) = run_fused(2, scan, form, false);
                assert!(res.iterations > 3, "{} iterations", res.iterations);
                for threads in [1, 2] {
                    let (fused, r) = run_fused(threads, scan, form, true);
                    let at = format!("kept {kept}, batch {batch}, {threads} threads");
                    assert_eq!(r, res, "{at}: the solve");
                    assert_same_maps(&unfused, &fused, &res);
                    let (a, h) = (amplitude_bits, hits);
                    assert_eq!(a(&unfused, &res), a(&fused, &res), "{at}: amplitudes");
                    assert_eq!(h(&unfused, &res), h(&fused, &res), "{at}: hits");
                }
            }
        }
    }
}

/// A device in the host's memory (`fakedev`) streams its detector data
/// only to hold a budget the user set: under the default its share gives
/// (0.02 GiB, under the 29 MB of 8 detectors' timestream and flags),
/// streaming would only move them to the same memory, so the plan stays
/// resident, says why, and is refused by the check; with `memory=0.06`
/// (where a discrete device streams, `toast-cli`'s emulated tests) they
/// are streamed, one detector a batch, within the budget.
#[test]
fn a_device_in_the_host_memory_streams_only_for_a_budget_the_user_set() {
    use toast_ops::workflow::presets::MemoryBound;
    let gib = (1u64 << 30) as f64;
    for (options, source, want) in [
        (
            "",
            BudgetSource::HostShare,
            "device-recomputed-fused (1 detectors a batch)",
        ),
        (
            ";memory=0.06",
            BudgetSource::Option,
            "device-recomputed-fused (1 detectors a batch, detector data streamed)",
        ),
    ] {
        let reg = registry_with_fake_device(1, FakeDevice::Current, options);
        let (mut job, sim, plan) = tiny_8_detectors_nside_128_on("fakedev", &reg);
        let kept = job.execution_plan(&reg);
        let host = job.predicted_process_memory(&plan, &sim, &kept);
        assert!(job.set_memory_bound(Some(MemoryBound {
            bytes: host + 0.02 / 0.9 * gib,
            source: "the test's share".into(),
            per_process: true,
        })));
        let (_, budget) = job.device_budget(&plan, &sim, &reg).unwrap().unwrap();
        assert_eq!(budget.source, source, "{options}: {budget}");
        let why = job.fit_device_budget(&plan, &sim, &reg).unwrap().unwrap();
        let fitted = job.execution_plan(&reg);
        assert_eq!(fitted.to_string(), want, "{options}: {why}");
        let device = job.predicted_device_memory(&plan, &sim, &fitted).unwrap();
        let fits = job.check_device_memory(device, "fakedev", budget, &fitted);
        if source.is_configured() {
            assert!(why.ends_with("streamed, 1 detector(s) a batch"), "{why}");
            fits.unwrap();
        } else {
            assert!(
                why.ends_with(
                    "(the detector data are not streamed: the device's memory is the \
                     host's, and the budget is its default)"
                ),
                "{why}"
            );
            assert!(fits.is_err(), "{why}");
        }
    }
}
