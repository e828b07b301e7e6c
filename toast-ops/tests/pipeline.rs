//! Pipelines and the kernel call layer: staging onto a non-host-addressable
//! device once per pipeline, the pipeline-level backend, unstaged calls,
//! requirements, error messages, and configuration parsing.

use toast_core::observation::defaults;
use toast_core::{check_requirements, Data, ExecContext, Operator, Requirements};
use toast_ops::exec::movement;
use toast_ops::ops::{ScanMap, ScanMapConfig};
use toast_ops::{DetectorSets, MapMakerConfig, Pipeline};
use toast_testkit::plugins::{context, registry};
use toast_testkit::scan::{make_data, make_sky, pointing_ops, scan_sky_op, Scan};

const NSIDE: i64 = 16;

fn scan_pipeline(sets: DetectorSets) -> Pipeline {
    let (a, b, c) = pointing_ops(NSIDE, 4);
    let scan = scan_sky_op();
    Pipeline::new(
        "scan_sky",
        vec![Box::new(a), Box::new(b), Box::new(c), Box::new(scan)],
    )
    .with_detector_sets(sets)
}

fn data(n_obs: usize) -> Data {
    let scan = Scan {
        n_obs,
        n_samples: 3000,
        ..Scan::default()
    };
    let mut d = make_data(&scan);
    make_sky(&mut d, NSIDE, 4);
    d
}

fn signal_bits(d: &Data) -> Vec<u64> {
    d.obs
        .iter()
        .flat_map(|ob| {
            ob.detdata
                .get(defaults::DET_DATA)
                .unwrap()
                .data::<f64>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn run(policy: &str, sets: DetectorSets) -> (Data, ExecContext) {
    let reg = registry(2);
    let mut ctx = context(&reg, policy);
    let mut d = data(2);
    let mut p = scan_pipeline(sets);
    check_requirements(&d, &p.requires()).unwrap();
    p.apply(&mut d, &mut ctx).unwrap();
    check_requirements(&d, &p.provides()).unwrap();
    (d, ctx)
}

#[test]
fn pipeline_requirements_are_toast_s() {
    let p = scan_pipeline(DetectorSets::All);
    let r = p.requires();
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    assert_eq!(sorted(&r.global), ["sky", "sky_dist"]);
    assert_eq!(r.detdata, ["signal"]);
    assert_eq!(sorted(&r.shared), ["boresight_radec", "flags"]);
    // Quaternions are an intermediate; the signal (and the pixels and
    // weights, which no later step consumes) are left for later operators.
    let prov = p.provides();
    assert!(prov.detdata.contains(&"signal".to_string()));
    assert!(!prov.detdata.contains(&"quats".to_string()));
    let missing = Data::new();
    check_requirements(&missing, &Requirements::new()).unwrap();
}

#[test]
fn device_pipeline_uploads_each_input_once_per_pipeline() {
    let (cpu, _) = run("", DetectorSets::All);
    for sets in [DetectorSets::All, DetectorSets::Single] {
        let (dev, ctx) = run("run=fakedev", sets.clone());
        assert_eq!(signal_bits(&cpu), signal_bits(&dev), "{sets:?}");
        let unstaged = movement::ledger(&ctx)
            .map(|l| l.unstaged.clone())
            .unwrap_or_default();
        assert_eq!(unstaged.total_calls(), 0, "{sets:?}: {unstaged:?}");
        let rep = movement::ledger(&ctx).unwrap();
        assert_eq!(rep.scopes.len(), 1);
        eprintln!("{sets:?}\n{}", rep.scopes[0]);
        // Two observations: one upload each of the per-observation inputs,
        // one download of the output, nothing for the intermediates. The
        // flags and the timestream start all zero: their first "upload" is
        // a device memset, not a copy.
        assert_eq!(rep.copies("shared.boresight_radec"), (2, 0), "{sets:?}");
        assert_eq!(rep.copies("shared.flags"), (0, 0), "{sets:?}");
        assert_eq!(rep.copies("detdata.signal"), (0, 2), "{sets:?}");
        for f in ["shared.flags", "detdata.signal"] {
            assert_eq!(rep.scopes[0].per_buffer[f].resets, 2, "{sets:?}: {f}");
        }
        assert_eq!(rep.copies("global.sky"), (1, 0), "{sets:?}");
        assert_eq!(rep.copies("global.sky_dist"), (1, 0), "{sets:?}");
        for f in ["detdata.quats", "detdata.pixels", "detdata.weights"] {
            assert_eq!(rep.copies(f), (0, 0), "{sets:?}: {f}");
        }
        let (h2d, d2h, allocs, frees) = rep.totals();
        assert_eq!((h2d, d2h), (4, 2));
        assert_eq!(allocs, frees);
        let stats = ctx
            .ext::<toast_accel::host::Dispatcher>()
            .unwrap()
            .registry()
            .get("fakedev")
            .unwrap()
            .stats()
            .snapshot();
        assert_eq!(
            (stats.h2d_calls, stats.d2h_calls),
            (h2d, d2h),
            "the device saw only these"
        );
        assert_eq!(stats.allocs, stats.frees);
        let n_calls = ctx
            .timers
            .get("scan_map.scan_map[fakedev]")
            .expect("timer named by the resolved backend")
            .calls();
        let expected = match sets {
            DetectorSets::All => 2,
            _ => 2 * 6,
        };
        assert_eq!(
            n_calls, expected,
            "one call per observation and detector set"
        );
    }
}

#[test]
fn pipeline_backend_setting_feeds_the_dispatch_chain() {
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut d = data(1);
    let mut p = scan_pipeline(DetectorSets::All).with_backend(Some("fakedev"));
    p.apply(&mut d, &mut ctx).unwrap();
    assert!(ctx
        .timers
        .get("det_pointing.pointing_detector[fakedev]")
        .is_some());
    assert!(ctx.timers.get("scan_map.scan_map[fakedev]").is_some());
    assert!(
        movement::ledger(&ctx).is_some_and(|l| !l.scopes.is_empty()),
        "staged"
    );
    // The context's dispatcher is restored.
    assert_eq!(
        ctx.ext::<toast_accel::host::Dispatcher>()
            .unwrap()
            .policy()
            .pipeline,
        None
    );
    // An operator override beats the pipeline setting.
    let mut ctx = context(&reg, "operator.scan_map=cpu");
    let mut d2 = data(1);
    let mut p = scan_pipeline(DetectorSets::All).with_backend(Some("fakedev"));
    p.apply(&mut d2, &mut ctx).unwrap();
    assert!(ctx.timers.get("scan_map.scan_map[cpu]").is_some());
    assert_eq!(signal_bits(&d), signal_bits(&d2));
}

#[test]
fn operators_outside_a_pipeline_make_counted_unstaged_copies() {
    let reg = registry(1);
    let (mut cpu_data, mut dev_data) = (data(1), data(1));
    let mut cpu = context(&reg, "");
    let mut dev = context(&reg, "run=fakedev");
    for (d, ctx) in [(&mut cpu_data, &mut cpu), (&mut dev_data, &mut dev)] {
        let (mut a, mut b, _) = pointing_ops(NSIDE, 4);
        a.apply(d, ctx).unwrap();
        b.apply(d, ctx).unwrap();
    }
    let q = |d: &Data, f: &str| -> Vec<u8> { d.obs[0].detdata.get(f).unwrap().as_bytes().to_vec() };
    assert_eq!(q(&cpu_data, "quats"), q(&dev_data, "quats"));
    assert_eq!(q(&cpu_data, "pixels"), q(&dev_data, "pixels"));
    let u = &movement::ledger(&dev).unwrap().unstaged;
    let c = |n: &str| u.per_buffer.get(n).cloned().unwrap_or_default();
    assert_eq!(
        (
            c("shared.boresight_radec").uploads,
            c("shared.boresight_radec").downloads
        ),
        (1, 0)
    );
    // Quaternions: written by one kernel (up and down), read by the next (up).
    assert_eq!(
        (c("detdata.quats").uploads, c("detdata.quats").downloads),
        (2, 1)
    );
    assert_eq!(
        (c("detdata.pixels").uploads, c("detdata.pixels").downloads),
        (1, 1)
    );
    assert!(
        movement::ledger(&cpu).is_none_or(|l| l.unstaged.total_calls() == 0),
        "host addresses: no copies"
    );
}

#[test]
fn errors_name_the_operator_kernel_backend_and_observation() {
    let reg = registry(1);
    let mut ctx = context(&reg, "");
    let mut d = data(1);
    // A map whose distribution holds one submap: scanning hits the others.
    let dist = std::sync::Arc::new(
        toast_ops::PixelDistribution::healpix(nside(NSIDE), nside(4), true, &{
            let mut h = vec![0u8; 16];
            h[0] = 1;
            h
        })
        .unwrap(),
    );
    d.meta.set_object("small_dist", dist.clone());
    d.meta
        .set_object("small", toast_ops::PixelData::<f64>::new(dist, 3));
    let (a, b, c) = pointing_ops(NSIDE, 4);
    let scan = ScanMap::new(
        "scan_small",
        ScanMapConfig {
            map_key: "small".into(),
            pixel_dist: "small_dist".into(),
            ..ScanMapConfig::default()
        },
    )
    .unwrap();
    let mut p = Pipeline::new(
        "p",
        vec![Box::new(a), Box::new(b), Box::new(c), Box::new(scan)],
    );
    let e = p.apply(&mut d, &mut ctx).unwrap_err().to_string();
    eprintln!("{e}");
    assert!(
        e.starts_with(
            "operator 'scan_small': kernel `scan_map` on backend `cpu` for observation 'obs_000': "
        ),
        "{e}"
    );

    // No dispatcher installed.
    let mut bare = ExecContext::new();
    let (mut a, _, _) = pointing_ops(NSIDE, 4);
    let e = a.apply(&mut data(1), &mut bare).unwrap_err().to_string();
    assert!(e.contains("Dispatcher"), "{e}");

    // A shape mismatch is found before any kernel runs.
    let mut d = data(1);
    d.obs[0]
        .detdata
        .create("quats", toast_core::DType::F64, &[3], None)
        .unwrap();
    let (mut a, _, _) = pointing_ops(NSIDE, 4);
    let e = a.apply(&mut d, &mut ctx).unwrap_err().to_string();
    assert!(e.contains("'quats'") && e.contains("obs_000"), "{e}");
}

#[test]
fn configuration_uses_toast_names_and_rejects_unknown_ones() {
    let c: MapMakerConfig = serde_json::from_str(
        r#"{"iter_max": 50, "convergence": 1e-10, "solve_rcond_threshold": 1e-3,
            "map_rcond_threshold": 1e-6, "write_hits": false}"#,
    )
    .unwrap();
    assert_eq!(c.iter_max, 50);
    assert_eq!(c.iter_min, 3, "defaults fill the rest");
    assert_eq!(c.convergence, 1e-10);
    assert!(!c.write_hits);
    let e = serde_json::from_str::<MapMakerConfig>(r#"{"iter_maxx": 5}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("iter_maxx"), "{e}");

    let b: toast_ops::templates::OffsetConfig =
        serde_json::from_str(r#"{"step_time": 60.0, "good_fraction": 0.8}"#).unwrap();
    assert_eq!(b.step_time, 60.0);
    assert!(!b.use_noise_prior);
    let w: toast_ops::ops::StokesWeightsConfig =
        serde_json::from_str(r#"{"mode": "IQU", "IAU": true}"#).unwrap();
    assert_eq!(w.mode, toast_ops::ops::StokesMode::IQU);
    assert!(w.iau);
    assert!(
        serde_json::from_str::<toast_ops::ops::StokesWeightsConfig>(r#"{"mode": "QU"}"#).is_err()
    );
    let bin: toast_ops::ops::BinnerConfig =
        serde_json::from_str(r#"{"pixel_dist": "pix_dist", "full_pointing": true}"#).unwrap();
    assert!(bin.full_pointing);
    assert_eq!(bin.shared_flag_mask, 15);
    let px: toast_ops::ops::PixelsHealpixConfig =
        serde_json::from_str(r#"{"nside": 1024, "nside_submap": 16, "nest": true}"#).unwrap();
    assert_eq!(px.nside.get(), 1024);

    // A whole job configuration: the map-maker's sections are picked out,
    // other sections ignored, each section strict about its keys.
    let setup: toast_ops::MapMakerSetup = serde_json::from_str(
        r#"{"sim_satellite": {"hwp_rpm": null},
            "mapmaker": {"iter_max": 20, "solve_rcond_threshold": 1e-6},
            "baselines": {"step_time": 600.0},
            "binner": {"pixel_dist": "pix_dist"},
            "pixels": {"nside": 64},
            "weights": {"mode": "IQU"},
            "pixels_final": {"enabled": false}}"#,
    )
    .unwrap();
    assert_eq!(setup.name, "mapmaker");
    assert_eq!(setup.mapmaker.iter_max, 20);
    assert_eq!(setup.baselines.step_time, 600.0);
    assert_eq!(setup.pixels.nside.get(), 64);
    assert!(setup.binner_final.is_none());
    assert!(!setup.pixels_final.as_ref().unwrap().enabled);
    let e = serde_json::from_str::<toast_ops::MapMakerSetup>(r#"{"binner": {"nsid": 4}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nsid"), "{e}");
}

#[test]
fn standalone_covariance_and_binning_reproduce_the_sky() {
    use toast_ops::ops::{
        BinMap, BinnerConfig, CovarianceAndHits, CovarianceAndHitsConfig, PointingOps,
    };
    let mut results = Vec::new();
    for policy in ["", "run=fakedev"] {
        let reg = registry(2);
        let mut ctx = context(&reg, policy);
        let mut d = data(2);
        toast_testkit::scan::scan_sky(&mut d, &mut context(&reg, ""), NSIDE, 4);
        let (a, b, c) = pointing_ops(NSIDE, 4);
        let pointing = PointingOps::new(a, b, c);
        let mut cov = CovarianceAndHits::new(
            "cov_and_hits",
            CovarianceAndHitsConfig {
                pixel_dist: "pix_dist".into(),
                rcond_threshold: 1e-3,
                ..CovarianceAndHitsConfig::default()
            },
            pointing.clone(),
        )
        .unwrap();
        check_requirements(&d, &cov.requires()).unwrap();
        cov.apply(&mut d, &mut ctx).unwrap();
        check_requirements(&d, &cov.provides()).unwrap();
        let mut bin = BinMap::new(
            "binner",
            BinnerConfig {
                pixel_dist: "pix_dist".into(),
                ..BinnerConfig::default()
            },
            pointing,
        )
        .unwrap();
        check_requirements(&d, &bin.requires()).unwrap();
        bin.apply(&mut d, &mut ctx).unwrap();
        check_requirements(&d, &bin.provides()).unwrap();
        let m = d
            .meta
            .object::<toast_ops::PixelData<f64>>("binned")
            .unwrap();
        let rcond = d.meta.object::<toast_ops::PixelData<f64>>("rcond").unwrap();
        let sky = d.meta.object::<toast_ops::PixelData<f64>>("sky").unwrap();
        let mut n_good = 0;
        for i in 0..m.n_local_pix() {
            if rcond.data()[i] >= 1e-3 {
                n_good += 1;
                let s = sky.pixel(m.distribution().global_pixel(i)).unwrap();
                for (k, (x, y)) in m.data()[3 * i..3 * i + 3].iter().zip(s).enumerate() {
                    let e = (x - y).abs();
                    assert!(
                        e < 1e-10,
                        "{policy:?}: pixel {i} component {k}: error {e:e}"
                    );
                }
            }
        }
        assert!(n_good > 100, "{policy:?}: only {n_good} good pixels");
        let hits: i64 = d
            .meta
            .object::<toast_ops::PixelData<i64>>("hits")
            .unwrap()
            .data()
            .iter()
            .sum();
        assert_eq!(hits, 2 * 3000 * 6, "no flags: every sample is a hit");
        results.push(m.data().iter().map(|x| x.to_bits()).collect::<Vec<_>>());
    }
    assert_eq!(results[0], results[1], "CPU and device give the same bits");
}

fn nside(n: i64) -> toast_ops::math::healpix::Nside {
    toast_ops::math::healpix::Nside::try_from(n).unwrap()
}

/// A streamed device scope ([`movement::stream_detector_data`]): each
/// device step's detdata buffers hold the rows of its pass's detectors.
/// A pass with none of the data's detectors holds no row (not the whole
/// field), one detector a pass holds one row a observation, and the
/// timestream is the CPU's bit for bit; turning streaming off in the same
/// scope gives the next pass over all detectors whole fields again.
#[test]
fn a_streamed_scope_holds_one_pass_of_rows_with_the_cpu_timestream() {
    let reg = registry(2);
    let dets = data(2).all_local_detectors(0);
    let mut sets = vec![vec!["no-such-detector".to_string()]];
    sets.extend(dets.iter().map(|d| vec![d.clone()]));
    let passes = |then_whole: bool| -> Vec<DetectorSets> {
        let mut v = vec![DetectorSets::Sets(sets.clone())];
        if then_whole {
            v.push(DetectorSets::All);
        }
        v
    };
    let run = |policy: &str, then_whole: bool| {
        let mut ctx = context(&reg, policy);
        let mut d = data(2);
        let backend = ctx
            .ext::<toast_accel::host::Dispatcher>()
            .ok()
            .and_then(|disp| toast_ops::exec::pipeline::pipeline_backend(disp, None));
        let scope = movement::open_scope(&mut ctx, backend.as_ref());
        for (i, sets) in passes(then_whole).into_iter().enumerate() {
            movement::stream_detector_data(&mut ctx, i == 0);
            scan_pipeline(sets).apply(&mut d, &mut ctx).unwrap();
        }
        let keep = Requirements::new().detdata(defaults::DET_DATA);
        movement::close_scope(&mut d, &mut ctx, scope, &keep).unwrap();
        (d, ctx)
    };
    for then_whole in [false, true] {
        let (cpu, _) = run("", then_whole);
        let (dev, ctx) = run("run=fakedev", then_whole);
        assert_eq!(
            signal_bits(&cpu),
            signal_bits(&dev),
            "then whole: {then_whole}"
        );
        let ledger = movement::ledger(&ctx).unwrap();
        assert_eq!(ledger.unstaged.total_calls(), 0, "{:?}", ledger.unstaged);
        let (_, _, allocs, frees) = ledger.totals();
        assert_eq!(allocs, frees);
        let signal = ledger.peak_staged_buffers()["detdata.signal"];
        let row = 3000 * 8;
        let whole = 2 * dets.len() as u64 * row;
        if then_whole {
            assert_eq!(signal, whole, "whole fields after streaming");
        } else {
            assert_eq!(signal, 2 * row, "one row a observation at the peak");
        }
    }
}
