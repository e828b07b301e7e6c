//! `toast-cli run` end to end: hits, outputs, determinism, bad input.
//!
//! The runs use reduced settings (lower nside, fewer or shorter
//! observations) so each test takes seconds; the workflow is the same.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use toast_testkit::process;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toast-cli"))
}

fn scratch(name: &str) -> PathBuf {
    process::scratch("toast-cli-run", name)
}

fn run(args: &[&str]) -> Output {
    let out = bin().arg("run").args(args).output().expect("run toast-cli");
    out
}

use process::text;

/// A map file's bytes without the `CREATED` header card (the only field
/// that differs between identical runs).
fn map_bytes(p: &Path) -> Vec<u8> {
    let b = std::fs::read(p).unwrap();
    let mut out = Vec::with_capacity(b.len());
    for card in b.chunks(80) {
        if !card.starts_with(b"CREATED ") {
            out.extend_from_slice(card);
        }
    }
    out
}

#[test]
fn dry_run_sizes_every_preset() {
    for (case, n_det, n_obs) in [
        ("tiny", 12u64, 1u64),
        ("xsmall", 138, 1),
        ("small", 1388, 1),
        ("medium", 2054, 6),
        ("large", 2054, 67),
        ("xlarge", 2054, 676),
        ("heroic", 2054, 4320),
    ] {
        let o = run(&["--case", case, "--dry-run"]);
        let t = text(&o);
        // Exit 2 where the run would be refused on this machine, after the
        // whole plan.
        match o.status.code() {
            Some(0) => assert!(!t.contains("does not fit"), "{case}: {t}"),
            Some(2) if case != "tiny" => assert!(
                t.contains("does not fit")
                    && t.contains("the run would be refused: it does not fit this node's memory"),
                "{case}: {t}"
            ),
            other => panic!("{case}: exit {other:?}: {t}"),
        }
        let hits = n_det * n_obs * 360_000;
        assert!(
            t.contains(&format!("{n_det} detectors"))
                && t.contains(&format!("x {n_obs} observation"))
                && t.contains(&format!("expected total hits: {hits}")),
            "{case}: {t}"
        );
        assert!(t.contains("predicted peak memory"), "{t}");
        // The map-maker's execution plan, with its reasons: tiny keeps
        // the pointing, the larger cases keep it compact.
        let plan = if case == "tiny" {
            "map-maker plan: host-kept-fused"
        } else {
            "map-maker plan: host-compact-fused (8 detectors a batch)"
        };
        assert!(t.contains(plan), "{case}: {t}");
        assert!(t.contains("  because binner."), "{case}: {t}");
    }
    let o = run(&["--case", "auto", "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn tiny_hits_outputs_and_stats() {
    // tiny's detectors and observation; a coarser map keeps the test short.
    let dir = scratch("tiny");
    let out = dir.join("out");
    let o = run(&[
        "--quiet",
        "--no-plot",
        "--out-dir",
        out.to_str().unwrap(),
        "--set",
        "pixels.nside=128",
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["totalhits"], 12 * 360_000, "{stats}");
    assert_eq!(stats["samples"], 12 * 360_000);
    for k in ["rms_I", "rms_Q", "rms_U", "mean_I", "mean_Q", "mean_U"] {
        assert!(stats[k].as_f64().unwrap().is_finite(), "{k}: {stats}");
    }
    assert!(stats["cg_iterations"].as_u64().unwrap() >= 1);
    // The plan the map-maker took, as the dry run names it.
    let plan = &stats["execution_plan"];
    assert_eq!(plan["name"], "host-kept", "{stats}");
    assert_eq!(plan["passes"], "fused", "{stats}");
    assert!(!plan["why"].as_array().unwrap().is_empty(), "{stats}");
    // The hit map read back sums to the hits.
    let hits =
        toast_ops::io::fits::read_healpix_map(&out.join("mapmaker_hits.fits"), None).unwrap();
    assert_eq!(hits.nside, 128);
    let total: f64 = hits.fields[0].data.iter().sum();
    assert_eq!(total, (12 * 360_000) as f64);
    for f in ["mapmaker_map.fits", "mapmaker_binmap.fits"] {
        let m = toast_ops::io::fits::read_healpix_map(&out.join(f), None).unwrap();
        assert_eq!(m.file_ordering, toast_ops::io::fits::Ordering::Nested);
        let names: Vec<&str> = m.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["TEMPERATURE", "Q_POLARISATION", "U_POLARISATION"]);
        assert_eq!(m.fields[0].unit.as_deref(), Some("K"));
        // Unhit pixels are 0.
        for (p, h) in hits.fields[0].data.iter().enumerate() {
            if *h == 0.0 {
                assert_eq!(m.fields[0].data[p], 0.0);
            }
        }
    }
    let csv = std::fs::read_to_string(out.join("timing.csv")).unwrap();
    assert!(csv.starts_with(
        "Timer,Processes,Minimum Calls,Maximum Calls,Minimum Time,Maximum Time,Mean Time,Median Time"
    ));
    assert!(
        csv.contains("(function) toast-cli run|MapMaker|mapmaker"),
        "{csv}"
    );
    assert!(csv.contains("scan_map[cpu]"), "{csv}");
    let cfg = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        cfg.contains("[mapmaker]") && cfg.contains("nside = 128"),
        "{cfg}"
    );
    assert!(
        t.contains("total hits:     4320000 (expected 4320000)"),
        "{t}"
    );
    assert!(t.contains("scan_map=cpu"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_maps_twice_and_with_one_or_two_threads() {
    // Two detectors, 20-minute observations, 60 s baselines (many per
    // observation), nside 64.
    let dir = scratch("determinism");
    let go = |name: &str, threads: &str| {
        let out = dir.join(name);
        let o = run(&[
            "--quiet",
            "--no-plot",
            "--threads",
            threads,
            "--n-det",
            "2",
            "--n-obs",
            "2",
            "--out-dir",
            out.to_str().unwrap(),
            "--set",
            "sim_satellite.obs_minutes=20",
            "--set",
            "pixels.nside=32",
            "--set",
            "baselines.step_time=60",
            "--set",
            "mapmaker.solve_rcond_threshold=1e-3",
            "--set",
            "mapmaker.map_rcond_threshold=1e-3",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        out
    };
    let a = go("a", "2");
    let b = go("b", "2");
    let c = go("c", "1");
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["totalhits"], 2 * 2 * 120_000);
    for f in [
        "mapmaker_map.fits",
        "mapmaker_binmap.fits",
        "mapmaker_hits.fits",
    ] {
        let x = map_bytes(&a.join(f));
        assert!(x == map_bytes(&b.join(f)), "{f}: two runs differ");
        assert!(x == map_bytes(&c.join(f)), "{f}: 1 and 2 threads differ");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_maps_for_any_pointing_batch() {
    // The map-maker's pointing expansion per batch of 1 or 3 detectors, or
    // all at once, kept or recomputed in every pass (only one batch's
    // pointing alive), and under other field names (kept pointing read by
    // the names its operators were given, not the defaults):
    // bit-identical maps.
    let dir = scratch("pointing_batch");
    let go_with = |batch: &str, full: bool, renamed: bool| {
        let out = dir.join(format!("b{batch}-{full}-{renamed}"));
        let (batch, full) = (
            format!("binner.pointing_batch={batch}"),
            format!("binner.full_pointing={full}"),
        );
        let mut args = vec![
            "--quiet",
            "--no-plot",
            "--n-det",
            "4",
            "--out-dir",
            out.to_str().unwrap(),
            "--set",
            "sim_satellite.obs_minutes=10",
            "--set",
            "pixels.nside=32",
            "--set",
            "baselines.step_time=60",
            "--set",
            "mapmaker.solve_rcond_threshold=1e-3",
            "--set",
            "mapmaker.map_rcond_threshold=1e-3",
            "--set",
            &batch,
            "--set",
            &full,
        ];
        if renamed {
            args.extend([
                "--set",
                "pixels.pixels=px",
                "--set",
                "weights.weights=wt",
                "--set",
                "det_pointing.quats=qt",
            ]);
        }
        let o = run(&args);
        assert!(o.status.success(), "{}", text(&o));
        out
    };
    let go = |batch: &str, full: bool| go_with(batch, full, false);
    let all = go("0", true);
    let renamed = [true, false].map(|full| (full, go_with("0", full, true)));
    let others = [
        ("1", true),
        ("3", true),
        ("0", false),
        ("1", false),
        ("3", false),
    ]
    .map(|(b, full)| (b, full, go(b, full)));
    for f in [
        "mapmaker_map.fits",
        "mapmaker_binmap.fits",
        "mapmaker_hits.fits",
    ] {
        let x = map_bytes(&all.join(f));
        for (b, full, out) in &others {
            assert!(
                x == map_bytes(&out.join(f)),
                "{f}: batch {b}, full_pointing {full} differs"
            );
        }
        for (full, out) in &renamed {
            assert!(
                x == map_bytes(&out.join(f)),
                "{f}: renamed fields, full_pointing {full} differs"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn assert_fails(args: &[&str], needle: &str) {
    let o = run(args);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
    assert!(t.contains(needle), "{args:?}: expected {needle:?} in {t}");
}

#[test]
fn bad_input_is_reported_before_work() {
    let dir = scratch("bad");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    assert_fails(&["--case", "huge", "--out-dir", o], "unknown case `huge`");
    // A directory whose files' paths are too long for the system: refused
    // before it is made (the run did all its work, then failed to write).
    #[cfg(target_os = "linux")]
    {
        // 4076 bytes: the directory's own path is within the limit, its
        // files' (`.mapmaker_noiseweighted_map.fits.tmp-PID`) are not.
        let mut deep = out.clone();
        while deep.as_os_str().len() + 201 < 4076 {
            deep.push("d".repeat(200));
        }
        deep.push("d".repeat(4076 - deep.as_os_str().len() - 1));
        assert_eq!(deep.as_os_str().len(), 4076);
        for dry in [&["--dry-run"][..], &[]] {
            let mut args = vec!["--out-dir", deep.to_str().unwrap()];
            args.extend(dry);
            assert_fails(&args, "(PATH_MAX)");
        }
        assert!(!out.exists(), "a refused run creates no output directory");
    }
    assert_fails(
        &["--set", "baselines.step_tim=60", "--out-dir", o],
        "[baselines] step_tim",
    );
    assert_fails(
        &["--set", "mapmaker.iter_max=many", "--out-dir", o],
        "[mapmaker] iter_max",
    );
    assert_fails(
        &["--set", "nosuch.key=1", "--out-dir", o],
        "unknown section `nosuch`",
    );
    assert_fails(&["--set", "iter_max", "--out-dir", o], "section.key=value");
    // Two options of one command line for one setting.
    assert_fails(
        &[
            "--sky-map",
            "a.fits",
            "--set",
            "scan_map.file=b.fits",
            "--out-dir",
            o,
        ],
        "--sky-map and --set scan_map.file=b.fits both set scan_map.file: give one",
    );
    assert_fails(
        &[
            "--backend",
            "cpu",
            "--set",
            "dispatch.run=opencl",
            "--out-dir",
            o,
        ],
        "--backend and --set dispatch.run=opencl both set dispatch.run: give one",
    );
    // rcond is at most 1: a larger threshold would cut every pixel.
    for key in ["map_rcond_threshold", "solve_rcond_threshold"] {
        assert_fails(
            &["--set", &format!("mapmaker.{key}=2"), "--out-dir", o],
            &format!("{key} = 2 must be between 0 and 1"),
        );
    }
    let missing = dir.join("missing.fits");
    assert_fails(
        &["--sky-map", missing.to_str().unwrap(), "--out-dir", o],
        "missing.fits: cannot open",
    );
    let junk = dir.join("junk.fits");
    std::fs::write(&junk, vec![b'x'; 5000]).unwrap();
    assert_fails(
        &["--sky-map", junk.to_str().unwrap(), "--out-dir", o],
        "not a FITS file",
    );
    // A valid map of the wrong nside.
    let small = dir.join("nside8.fits");
    let z = vec![0.0f64; 12 * 64];
    toast_ops::io::fits::write_iqu_map(
        &small,
        toast_ops::io::fits::Ordering::Nested,
        [&z, &z, &z],
        "K",
        toast_ops::io::fits::MapPrecision::F32,
        &[],
    )
    .unwrap();
    assert_fails(
        &["--sky-map", small.to_str().unwrap(), "--out-dir", o],
        "NSIDE = 8, but pixels.nside = 1024",
    );
    // An output directory below a regular file cannot be created.
    let file = dir.join("afile");
    std::fs::write(&file, b"x").unwrap();
    let bad_out = file.join("out");
    assert_fails(
        &["--out-dir", bad_out.to_str().unwrap()],
        "output directory",
    );
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[mapmaker]\nnot_a_key = 1\n").unwrap();
    assert_fails(
        &["--config", cfg.to_str().unwrap(), "--out-dir", o],
        "[mapmaker] not_a_key",
    );
    assert!(!out.exists(), "nothing may be written on bad input");
    let _ = std::fs::remove_dir_all(&dir);
}

/// With no offset template there is nothing to solve: the summary says the
/// maps are binned, and stats.json does not call it a failed solve.
#[test]
fn a_run_without_templates_reports_binned_maps() {
    let dir = scratch("binned");
    let out = dir.join("out");
    let r = run(&[
        "--n-det",
        "2",
        "--no-plot",
        "--set",
        "pixels.nside=32",
        "--set",
        "sim_satellite.obs_minutes=10",
        "--set",
        "baselines.enabled=false",
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    let t = text(&r);
    assert_eq!(r.status.code(), Some(0), "{t}");
    assert!(
        t.contains("CG iterations:  0 (no offset amplitudes to solve for: binned maps)"),
        "{t}"
    );
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["converged"], true, "{stats}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sizes derived from the options (baseline step, sample counts) and the
/// predicted memory are checked before any work (issue #13).
#[test]
fn derived_sizes_and_memory_are_checked_before_work() {
    let dir = scratch("sizes");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let small = ["--n-det", "2", "--set", "pixels.nside=32", "--out-dir", o];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        small.iter().copied().chain(extra.iter().copied()).collect()
    };
    assert_fails(
        &with(&["--set", "baselines.step_time=1e16"]),
        "baselines.step_time 1e16",
    );
    assert_fails(
        &with(&["--set", "sim_satellite.obs_minutes=1e12"]),
        "sim_satellite.obs_minutes 1000000000000",
    );
    // The sizes are the simulation's own sampling: an observation of
    // 1.00021 samples' length holds 1 sample from this start date (refused
    // before work, not in SimSatellite), and with gaps, or lengths between
    // samples, the counts differ from rate x length (the expected hits
    // said 120000 where the run hit 120002).
    assert_fails(
        &with(&["--set", "sim_satellite.obs_minutes=0.00016670166666666667"]),
        "an observation holds 1 sample(s)",
    );
    for lengths in [
        [
            "sim_satellite.obs_minutes=10",
            "sim_satellite.gap_minutes=1",
        ],
        [
            "sim_satellite.obs_minutes=1",
            "sim_satellite.gap_minutes=0.0001",
        ],
        [
            "sim_satellite.obs_minutes=0.0005000416666666666",
            "sim_satellite.gap_minutes=0",
        ],
        [
            "sim_satellite.obs_minutes=0.008333358333333334",
            "sim_satellite.gap_minutes=0",
        ],
    ] {
        let mut args = with(&[
            "--no-plot",
            "--n-obs",
            "3",
            "--set",
            "baselines.step_time=60",
        ]);
        for l in &lengths {
            args.extend(["--set", l]);
        }
        let r = run(&args);
        let t = text(&r);
        assert_eq!(r.status.code(), Some(0), "{lengths:?}: {t}");
        let hits = t
            .lines()
            .find_map(|l| l.strip_prefix("total hits:"))
            .unwrap_or_else(|| panic!("{lengths:?}: no total hits: {t}"));
        let (got, want) = hits.trim().split_once(" (expected ").unwrap();
        assert_eq!(format!("{got})"), want, "{lengths:?}: {t}");
    }
    let _ = std::fs::remove_dir_all(&out);
    // nside 2^29: a prediction beyond any machine.
    let huge = [
        "--n-det",
        "2",
        "--set",
        "pixels.nside=536870912",
        "--out-dir",
        o,
    ];
    assert_fails(&huge, "--ignore-memory-check");
    assert_fails(&huge, "exceeds the available memory");
    assert!(!out.exists(), "a refused run creates no output directory");
    let mut dry: Vec<&str> = huge.to_vec();
    dry.push("--dry-run");
    let d = run(&dry);
    let t = text(&d);
    // The dry run answers as the run would: refused (exit 2), and why.
    if t.contains("available memory: ") {
        assert_eq!(d.status.code(), Some(2), "{t}");
        assert!(
            t.contains("does not fit")
                && t.contains("the run would be refused: it does not fit this node's memory"),
            "{t}"
        );
    }
    dry.push("--ignore-memory-check");
    let d = run(&dry);
    let t = text(&d);
    assert_eq!(d.status.code(), Some(0), "{t}");
    if t.contains("available memory: ") {
        assert!(t.contains("does not fit"), "{t}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn backend_cpu_works_and_config_file_is_read() {
    let dir = scratch("cpu");
    let out = dir.join("out");
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        "[pixels]\nnside = 64\n\n[sim_satellite]\nobs_minutes = 10\n\n[dispatch]\nkernel.scan_map = \"cpu\"\n",
    )
    .unwrap();
    let o = run(&[
        "--quiet",
        "--no-plot",
        "--backend",
        "cpu",
        "--n-det",
        "2",
        "--config",
        cfg.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
    ]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("total hits:     120000 (expected"), "{t}");
    let used = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(used.contains("run = \"cpu\""), "{used}");
    assert!(used.contains("scan_map = \"cpu\""), "{used}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The run the OpenCL tests compare with the CPU's: tiny with 4 detectors
/// at nside 128, 10-minute baselines.
const SMALL_OPENCL_RUN: [&str; 8] = [
    "--quiet",
    "--no-plot",
    "--n-det",
    "4",
    "--set",
    "pixels.nside=128",
    "--set",
    "baselines.step_time=600",
];

/// `--backend opencl` and `--backend cpu` give the same maps: identical hits
/// and I/Q/U equal to float32 rounding (OpenCL's build_noise_weighted sums
/// with atomics, so the last bits of the double-precision accumulations may
/// differ before the float32 output). Without an OpenCL device the test
/// prints `SKIPPED: <reason>` and returns, unless `TOAST_REQUIRE_OPENCL` is
/// set (as CI sets it), where absence is a failure.
#[test]
fn opencl_and_cpu_give_the_same_maps() {
    let dir = scratch("backends");
    let mut outs = Vec::new();
    for backend in ["cpu", "opencl"] {
        let out = dir.join(backend);
        let mut args: Vec<&str> = SMALL_OPENCL_RUN.to_vec();
        let o_s = out.to_str().unwrap().to_string();
        args.extend(["--backend", backend, "--out-dir"]);
        args.push(&o_s);
        let Some(t) = run_unless_opencl_is_absent(&args, backend) else {
            return;
        };
        assert!(
            t.contains(&format!("scan_map={backend}")),
            "{backend} did not run the kernels: {t}"
        );
        outs.push(out);
    }
    // The device backend's traffic is reported; the staged pipeline keeps
    // the timestream on the device, so it crosses the bus a bounded number
    // of times, not once per CG iteration per kernel.
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(outs[1].join("stats.json")).unwrap())
            .unwrap();
    let h2d = stats["transfers"]["opencl"]["host_to_device_calls"]
        .as_u64()
        .unwrap_or(0);
    assert!(h2d > 0, "no opencl transfers in stats.json: {stats}");
    // A device run keeps the pointing on the device (the workflow keeps it
    // for tiny).
    assert_eq!(stats["execution_plan"]["name"], "device-kept", "{stats}");
    // The solve is device-resident: per CG iteration nothing goes up and
    // only the dot products' partial sums come down (at most three dot
    // products of 256 f64s, whatever the number of amplitudes), never an
    // amplitude vector, a map or a timestream; the phases add up to the
    // total.
    let ph = &stats["transfer_phases"];
    let iters = ph["cg_per_iteration"].as_array().unwrap();
    assert_eq!(
        iters.len() as u64,
        stats["cg_iterations"].as_u64().unwrap(),
        "{ph}"
    );
    for (i, it) in iters.iter().enumerate() {
        let up = it["host_to_device_bytes"].as_u64().unwrap();
        let down = it["device_to_host_bytes"].as_u64().unwrap();
        assert_eq!(up, 0, "CG iteration {i}: {it}");
        assert!(
            down > 0 && down <= 3 * 8 * 256 && down % 8 == 0,
            "CG iteration {i}: {down} bytes down, not scalar partial sums"
        );
    }
    for dir in ["host_to_device_bytes", "device_to_host_bytes"] {
        let part = |k: &str| ph[k][dir].as_u64().unwrap();
        assert_eq!(
            part("setup") + part("cg_total") + part("outputs"),
            part("total"),
            "{dir}: {ph}"
        );
        assert!(part("setup") > 0, "{dir}: {ph}");
    }
    // Setup (issue #10): no pointing crosses the bus. What does, per
    // detector sample of this run (4 detectors, NSIDE 128): the timestream
    // down after the scan and up for the map-maker, the solver's work
    // timestream (8 bytes each), the solver flags (1), the boresight (32
    // bytes a sample: 8 a detector sample), and the pixel domain (input
    // map and solver covariance, about 10): 42-48 bytes. Pixels and weights
    // copied between host and device, as they once were, add about 100.
    let det_samples = stats["samples"].as_u64().unwrap();
    let setup = ph["setup"]["host_to_device_bytes"].as_u64().unwrap()
        + ph["setup"]["device_to_host_bytes"].as_u64().unwrap();
    assert!(
        setup <= 56 * det_samples,
        "setup moved {setup} bytes, {:.1} a detector sample (at most 56): {ph}",
        setup as f64 / det_samples as f64
    );
    let cpu_stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(outs[0].join("stats.json")).unwrap())
            .unwrap();
    assert_eq!(
        cpu_stats["transfer_phases"]["total"]["host_to_device_bytes"], 0,
        "the CPU copies nothing"
    );
    assert_maps_agree(&outs[0], &outs[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `args` on `backend` and return its output, which must be a
/// success; `None` (printing `SKIPPED: <reason>`) where the backend is
/// opencl and OpenCL is unavailable, unless `TOAST_REQUIRE_OPENCL` is set
/// (as CI sets it), where absence is a failure.
fn run_unless_opencl_is_absent(args: &[&str], backend: &str) -> Option<String> {
    let o = run(args);
    let t = text(&o);
    if backend == "opencl" && !o.status.success() && t.contains("unavailable") {
        let required = std::env::var_os("TOAST_REQUIRE_OPENCL").is_some_and(|v| !v.is_empty());
        assert!(!required, "TOAST_REQUIRE_OPENCL is set: {t}");
        eprintln!("SKIPPED: {t}");
        return None;
    }
    assert!(o.status.success(), "{backend}: {t}");
    Some(t)
}

/// The maps of the CPU run in `cpu` and of the OpenCL run in `ocl` agree:
/// identical hits, and I/Q/U to rounding over the sky (RMS of the
/// difference) and in every pixel to well under what any wrong arithmetic
/// would give.
fn assert_maps_agree(cpu: &Path, ocl: &Path) {
    let read = |dir: &Path, f: &str| {
        toast_ops::io::fits::read_healpix_map(&dir.join(f), None).unwrap_or_else(|e| panic!("{e}"))
    };
    let (h_cpu, h_ocl) = (
        read(cpu, "mapmaker_hits.fits"),
        read(ocl, "mapmaker_hits.fits"),
    );
    assert_eq!(h_cpu.fields[0].data, h_ocl.fields[0].data, "hits differ");
    let (m_cpu, m_ocl) = (
        read(cpu, "mapmaker_map.fits"),
        read(ocl, "mapmaker_map.fits"),
    );
    // OpenCL accumulates the noise-weighted map with atomics, so its
    // summation order, and the last bits of each sum, change from run to
    // run with the scheduling. Those differences are amplified in the few
    // pixels whose covariance is near the rcond cut (seen: 2e-5 of the map's
    // maximum in one Q pixel, once, on a loaded machine). So the maps must
    // agree to rounding over the sky (RMS of the difference) and every
    // pixel to well under what any wrong arithmetic would give.
    for (a, b) in m_cpu.fields.iter().zip(&m_ocl.fields) {
        let max = a.data.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let n = a.data.len() as f64;
        let rms = (a.data.iter().map(|v| v * v).sum::<f64>() / n).sqrt();
        let rms_diff = (a
            .data
            .iter()
            .zip(&b.data)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            / n)
            .sqrt();
        let worst = a
            .data
            .iter()
            .zip(&b.data)
            .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
        eprintln!(
            "{}: RMS |cpu - opencl| = {:.2e} of the map's RMS, worst pixel {:.2e} of its maximum",
            a.name,
            rms_diff / rms,
            worst / max
        );
        assert!(
            rms_diff <= 1e-5 * rms,
            "{}: RMS |cpu - opencl| = {rms_diff:e} > 1e-5 x the map's RMS {rms:e}",
            a.name
        );
        assert!(
            worst <= 1e-3 * max,
            "{}: max |cpu - opencl| = {worst:e} > 1e-3 x the map's maximum {max:e}",
            a.name
        );
    }
}

/// `--backend opencl` within a device budget under the detector data
/// (0.05 GiB; 4 detectors' timestream and flags are 14 MB, the pixel
/// domain and boresight most of the rest): the detector data are streamed,
/// one detector a batch, although PoCL's memory is the host's (a budget the
/// user set is held; issue #24's acceptance runs xsmall so at 256 MiB); the
/// device peaks are within the budget and the maps are the CPU's.
#[test]
fn opencl_within_a_small_budget_streams_with_the_cpu_maps() {
    let dir = scratch("opencl-budget");
    let mut outs = Vec::new();
    for (backend, options) in [("cpu", ""), ("opencl", "opencl:memory=0.05")] {
        let out = dir.join(backend);
        let o_s = out.to_str().unwrap().to_string();
        let mut args = SMALL_OPENCL_RUN.to_vec();
        args.extend(["--backend", backend, "--out-dir", &o_s]);
        if !options.is_empty() {
            args.extend(["--backend-options", options]);
        }
        let Some(_) = run_unless_opencl_is_absent(&args, backend) else {
            return;
        };
        outs.push(out);
    }
    let stats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(outs[1].join("stats.json")).unwrap())
            .unwrap();
    let plan = &stats["execution_plan"];
    assert_eq!(
        (&plan["name"], &plan["data"], &plan["batch"]),
        (
            &serde_json::json!("device-recomputed"),
            &serde_json::json!("streamed"),
            &serde_json::json!(1)
        ),
        "{stats}"
    );
    // PoCL's memory is the host's (the rule this test is for); a discrete
    // GPU's OpenCL streams the same way.
    let in_host = &stats["device_in_host_memory"];
    assert!(in_host.is_null() || in_host == "opencl", "{stats}");
    let budget = (0.05 * (1u64 << 30) as f64) as u64;
    let staged = stats["device_peak_staged_bytes"].as_u64().unwrap();
    let held = stats["device_peak_bytes"].as_u64().unwrap();
    assert!(
        staged > 0 && staged <= held && held <= budget.next_multiple_of(1 << 20),
        "staged {staged}, held {held}, budget {budget}"
    );
    assert_maps_agree(&outs[0], &outs[1]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_backend_asked_for_by_name_must_exist() {
    let dir = scratch("nobackend");
    let out = dir.join("out");
    assert_fails(
        &[
            "--quiet",
            "--backend",
            "nosuchbackend",
            "--out-dir",
            out.to_str().unwrap(),
        ],
        "nosuchbackend",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// RMS of `ours − toast` relative to the RMS of `toast`.
fn rel_rms_diff(ours: &[f64], toast: &[f64]) -> f64 {
    let d2: f64 = ours.iter().zip(toast).map(|(a, b)| (a - b).powi(2)).sum();
    let t2: f64 = toast.iter().map(|b| b * b).sum();
    (d2 / t2).sqrt()
}

/// TOAST 3.0.6's own benchmark (`toast_benchmark_satellite --case tiny`, run
/// at nside 32 on its input sky degraded to nside 32, by
/// scripts/toast_reference_maps.py) against `toast-cli run` with the same
/// sky and settings: the same hits in every pixel, the same cut, and the
/// destriped I, Q, U maps equal to within 1e-6 of TOAST's RMS (float32
/// files; the boresight and the noise are bit-identical to TOAST's).
#[test]
fn tiny_maps_match_toast() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let dir = scratch("vs-toast");
    let out = dir.join("out");
    let sky = data.join("toast_tiny_sky_nside32.fits");
    let o = run(&[
        "--quiet",
        "--no-plot",
        "--sky-map",
        sky.to_str().unwrap(),
        "--out-dir",
        out.to_str().unwrap(),
        "--set",
        "pixels.nside=32",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let reference =
        std::fs::read_to_string(data.join("toast_tiny_maps_nside32.txt")).expect("TOAST maps");
    let hits =
        toast_ops::io::fits::read_healpix_map(&out.join("mapmaker_hits.fits"), None).unwrap();
    let map = toast_ops::io::fits::read_healpix_map(&out.join("mapmaker_map.fits"), None).unwrap();
    assert_eq!(hits.nside, 32);
    let mut toast_hits = vec![0.0; hits.fields[0].data.len()];
    let (mut ours_kept, mut toast_kept) = (vec![Vec::new(); 3], vec![Vec::new(); 3]);
    let (mut n_kept_ours, mut n_kept_toast, mut n_kept_both) = (0, 0, 0);
    for line in reference.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let p: usize = f[0].parse().unwrap();
        toast_hits[p] = f[1].parse::<f64>().unwrap();
        let t: Vec<f64> = f[2..5].iter().map(|x| x.parse().unwrap()).collect();
        let r: Vec<f64> = (0..3).map(|k| map.fields[k].data[p]).collect();
        let kept_t = t.iter().any(|&x| x != 0.0);
        let kept_r = r.iter().any(|&x| x != 0.0);
        n_kept_toast += usize::from(kept_t);
        n_kept_ours += usize::from(kept_r);
        if kept_t && kept_r {
            n_kept_both += 1;
            for k in 0..3 {
                toast_kept[k].push(t[k]);
                ours_kept[k].push(r[k]);
            }
        }
    }
    let differing = hits.fields[0]
        .data
        .iter()
        .zip(&toast_hits)
        .filter(|(a, b)| a != b)
        .count();
    let rel: Vec<f64> = (0..3)
        .map(|k| rel_rms_diff(&ours_kept[k], &toast_kept[k]))
        .collect();
    eprintln!(
        "tiny (nside 32) vs TOAST: {} hits, {differing} pixels with different hits; kept \
         pixels {n_kept_ours} (TOAST {n_kept_toast}); relative RMS difference I {:.3e} \
         Q {:.3e} U {:.3e}",
        toast_hits.iter().sum::<f64>(),
        rel[0],
        rel[1],
        rel[2]
    );
    assert_eq!(toast_hits.iter().sum::<f64>(), (12 * 360_000) as f64);
    assert_eq!(differing, 0, "hit maps differ");
    assert!(n_kept_both > 100);
    assert_eq!((n_kept_ours, n_kept_toast), (n_kept_both, n_kept_both));
    for (k, c) in ["I", "Q", "U"].iter().enumerate() {
        assert!(rel[k] <= 1e-6, "{c}: relative RMS difference {}", rel[k]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A build without MPI started as one of several processes (`mpirun -n 2`,
/// `srun -n 2`: the launcher's world size in the environment) refuses to
/// run, naming the variable and the `mpi` feature, before any output: each
/// process would otherwise run the whole job and write the same files.
/// Declared independent (`TOAST_INDEPENDENT_RUNS=1`), each runs alone, and
/// the memory check counts the runs that share the node.
#[cfg(not(feature = "mpi"))]
#[test]
fn a_serial_build_started_as_several_processes_refuses() {
    let vars = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"];
    // Only `var` says it (the suite itself may run under a launcher).
    let launched = |var: &str, value: &str| {
        let mut c = bin();
        for v in vars {
            c.env_remove(v);
        }
        c.env(var, value);
        c
    };
    for var in vars {
        let out = scratch(&format!("launched-{var}")).join("out");
        let mut c = launched(var, "2");
        c.args(["run", "--quiet", "--out-dir", out.to_str().unwrap()]);
        let o = process::run_with_deadline(c, std::time::Duration::from_secs(60), var);
        let log = text(&o);
        assert_eq!(o.status.code(), Some(2), "{var}: {log}");
        assert!(
            log.contains(&format!("one of 2 a launcher started ({var}=2)"))
                && log.contains("--features mpi"),
            "{var}: {log}"
        );
        assert!(!out.exists(), "{var}: no output directory");
        // One process (a launcher's world of 1) runs as before.
        let mut c = launched(var, "1");
        c.args(["run", "--dry-run"]);
        let o = process::run_with_deadline(c, std::time::Duration::from_secs(60), var);
        assert!(o.status.success(), "{var}=1: {}", text(&o));
        // Independent runs, declared so (a task farm), run each alone; any
        // other value of the variable does not declare it.
        for (value, runs) in [("1", true), ("yes", false)] {
            let mut c = launched(var, "2");
            c.env("TOAST_INDEPENDENT_RUNS", value);
            c.args(["run", "--dry-run"]);
            let o = process::run_with_deadline(c, std::time::Duration::from_secs(60), var);
            let code = if runs { 0 } else { 2 };
            assert_eq!(o.status.code(), Some(code), "{var}, {value}: {}", text(&o));
        }
    }
    // Independent runs share their node's memory: the memory check counts
    // the runs the launcher put on this node (100 000 runs of tiny do not
    // fit any node), and the dry run says so (exit 2).
    let mut c = launched("OMPI_COMM_WORLD_SIZE", "100000");
    c.env("TOAST_INDEPENDENT_RUNS", "1");
    c.env("OMPI_COMM_WORLD_LOCAL_SIZE", "100000");
    c.args(["run", "--dry-run"]);
    let o = process::run_with_deadline(c, std::time::Duration::from_secs(60), "farm");
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("independent runs on this node: 100000")
            && log.contains("exceeds the available memory of a process")
            && log.contains("(100000 process(es) on this node)")
            && log.contains("shared by 100000 processes"),
        "{log}"
    );
    // A dry run for other nodes (`--dry-run P,PPN`) names its own count.
    c = launched("OMPI_COMM_WORLD_SIZE", "100000");
    c.env("TOAST_INDEPENDENT_RUNS", "1");
    c.env("OMPI_COMM_WORLD_LOCAL_SIZE", "100000");
    c.args(["run", "--dry-run", "6,2"]);
    let o = process::run_with_deadline(c, std::time::Duration::from_secs(60), "farm P,PPN");
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    assert!(
        !log.contains("100000") && log.contains("2 per node"),
        "{log}"
    );
}
