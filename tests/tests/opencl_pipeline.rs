//! A pipeline of kernels on the OpenCL backend moves each input to the
//! device once: the pointing → pixels → weights → scan_map pipeline of
//! toast-ops runs with `run=opencl`, and the staging report and the
//! backend's own transfer counters (toast_accel's `TransferStats`) must show
//! one upload per observation of each input, one download of the output,
//! and nothing for the intermediates (quaternions, pixels, weights).
//!
//! Skipped (printing `SKIPPED: reason`) when OpenCL is unavailable and
//! `TOAST_REQUIRE_OPENCL` is unset; CI sets it (see conformance_opencl.rs).

use std::sync::Arc;
use toast_accel::host::{Registry, Source};
use toast_core::observation::defaults;
use toast_core::{check_requirements, Data, Operator};
use toast_ops::exec::movement;
use toast_ops::{DetectorSets, Pipeline};
use toast_testkit::plugins::{context, load, registry_with_cpu, skip_unless_required};
use toast_testkit::scan::{make_data, make_sky, pointing_ops, scan_sky_op, Scan};

const NSIDE: i64 = 16;

/// The CPU plugin, linked in, and the OpenCL plugin, loaded from its shared
/// library (both plugins export `toast_backend_entry`, so only one can be
/// linked in).
fn registry() -> Arc<Registry> {
    let mut r = registry_with_cpu(2);
    assert!(r.register(load("opencl"), Source::Explicit, ""));
    Arc::new(r)
}

fn scan_pipeline() -> Pipeline {
    let (a, b, c) = pointing_ops(NSIDE, 4);
    let scan = scan_sky_op();
    Pipeline::new(
        "scan_sky",
        vec![Box::new(a), Box::new(b), Box::new(c), Box::new(scan)],
    )
    .with_detector_sets(DetectorSets::All)
}

fn data() -> Data {
    let scan = Scan {
        n_obs: 2,
        n_samples: 3000,
        ..Scan::default()
    };
    let mut d = make_data(&scan);
    make_sky(&mut d, NSIDE, 4);
    d
}

fn signal(d: &Data) -> Vec<f64> {
    d.obs
        .iter()
        .flat_map(|ob| {
            ob.detdata
                .get(defaults::DET_DATA)
                .unwrap()
                .data::<f64>()
                .unwrap()
                .to_vec()
        })
        .collect()
}

#[test]
fn opencl_pipeline_uploads_each_input_once() {
    let reg = registry();
    if let Err(e) = reg.get("opencl") {
        skip_unless_required("TOAST_REQUIRE_OPENCL", e);
        return;
    }
    let run = |policy: &str| {
        let mut ctx = context(&reg, policy);
        let mut d = data();
        let mut p = scan_pipeline();
        check_requirements(&d, &p.requires()).unwrap();
        p.apply(&mut d, &mut ctx).unwrap();
        (d, ctx)
    };
    let (cpu, _) = run("");
    let (dev, ctx) = run("run=opencl");
    // Same signal as the CPU, to the device's trigonometry (stokes weights).
    let (a, b) = (signal(&cpu), signal(&dev));
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= 1e-12 * scale, "sample {i}: {x} vs {y}");
    }
    let unstaged = movement::ledger(&ctx)
        .map(|l| l.unstaged.clone())
        .unwrap_or_default();
    assert_eq!(unstaged.total_calls(), 0, "{unstaged:?}");
    let rep = movement::ledger(&ctx).unwrap();
    assert_eq!(rep.scopes.len(), 1);
    eprintln!("{}", rep.scopes[0]);
    // Two observations: one upload each of the per-observation inputs, one
    // download of the output, nothing for the intermediates. The flags and
    // the timestream start all zero: their first "upload" is a device
    // memset, not a copy.
    assert_eq!(rep.copies("shared.boresight_radec"), (2, 0));
    assert_eq!(rep.copies("shared.flags"), (0, 0));
    assert_eq!(rep.copies("detdata.signal"), (0, 2));
    for f in ["shared.flags", "detdata.signal"] {
        assert_eq!(rep.scopes[0].per_buffer[f].resets, 2, "{f}");
    }
    assert_eq!(rep.copies("global.sky"), (1, 0));
    assert_eq!(rep.copies("global.sky_dist"), (1, 0));
    for f in ["detdata.quats", "detdata.pixels", "detdata.weights"] {
        assert_eq!(rep.copies(f), (0, 0), "{f}");
    }
    let (h2d, d2h, allocs, frees) = rep.totals();
    assert_eq!((h2d, d2h), (4, 2));
    assert_eq!(allocs, frees);
    // The backend's own counters saw exactly these transfers.
    let stats = ctx
        .ext::<toast_accel::host::Dispatcher>()
        .unwrap()
        .registry()
        .get("opencl")
        .unwrap()
        .stats()
        .snapshot();
    assert_eq!((stats.h2d_calls, stats.d2h_calls), (h2d, d2h), "{stats:?}");
    assert_eq!(stats.allocs, stats.frees, "{stats:?}");
}
