//! `mpirun -n 2 toast-cli run`: distributed runs give the single-process
//! maps, the ranks really split the work, and a failing or vanishing rank
//! ends the job with a message instead of a hang.
//!
//! Built only with the `mpi` feature (`cargo test -p toast-cli --features
//! mpi`); needs `mpirun` (Open MPI or MPICH) on the PATH.
#![cfg(feature = "mpi")]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use toast_testkit::maps::compare_maps;
use toast_testkit::process;

const BIN: &str = env!("CARGO_BIN_EXE_toast-cli");

fn scratch(name: &str) -> PathBuf {
    process::scratch("toast-cli-mpi", name)
}

/// `mpirun -n N toast-cli run ARGS` (as root too; oversubscribing the cores).
fn mpirun(n: usize, args: &[&str], env: &[(&str, &str)]) -> Output {
    let _one = process::one_mpi_job_at_a_time();
    let mut c = process::mpirun(n);
    for (k, v) in env {
        c.args(["-x", k]).env(k, v);
    }
    c.arg(BIN).arg("run").args(args);
    process::run_with_deadline(c, Duration::from_secs(300), "toast-cli run")
}

/// The same binary as one process.
fn single(args: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("run").args(args);
    process::run_with_deadline(c, Duration::from_secs(300), "toast-cli run")
}

use process::text;

fn stats(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("stats.json")).unwrap()).unwrap()
}

/// Each rank's detectors from stats.json: non-empty, disjoint, covering
/// all `n_det`.
fn check_detector_split(st: &serde_json::Value, ranks: usize, n_det: usize) {
    let dist = st["distribution"].as_array().expect("distribution array");
    assert_eq!(dist.len(), ranks, "{st}");
    let mut all = BTreeSet::new();
    for (r, p) in dist.iter().enumerate() {
        assert_eq!(p["rank"], r);
        let dets: Vec<&str> = p["detectors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert!(!dets.is_empty(), "rank {r} holds no detector: {st}");
        assert!(
            (dets.len() as f64) < n_det as f64,
            "rank {r} holds every detector: {st}"
        );
        for d in dets {
            assert!(all.insert(d.to_string()), "detector {d} on two ranks: {st}");
        }
    }
    assert_eq!(all.len(), n_det, "{st}");
}

/// The benchmark's rcond threshold for every case but tiny (tiny's own
/// default, 1e-6, keeps pixels whose 3x3 covariance has a condition number
/// up to 1e6, where reordering the sums, as any decomposition does, moves
/// Q and U by up to ~1e-8 relative: see docs/DISTRIBUTED.md).
const RCOND: [&str; 4] = [
    "--set",
    "mapmaker.map_rcond_threshold=1e-3",
    "--set",
    "mapmaker.solve_rcond_threshold=1e-3",
];

#[test]
fn two_ranks_give_the_single_process_maps_of_tiny() {
    let dir = scratch("tiny");
    let (one, two) = (dir.join("one"), dir.join("two"));
    let mut common = vec![
        "--quiet",
        "--no-plot",
        "--threads",
        "1",
        "--set",
        "mapmaker.write_float64=true",
    ];
    common.extend(RCOND);
    let mut a = common.to_vec();
    a.extend(["--out-dir", one.to_str().unwrap()]);
    let o = single(&a);
    assert!(o.status.success(), "{}", text(&o));
    let mut b = common.to_vec();
    b.extend(["--out-dir", two.to_str().unwrap()]);
    let o = mpirun(2, &b, &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("processes:      2"), "{t}");
    // Exactly one copy of the outputs and of the summary (rank 0's).
    assert_eq!(t.matches("total hits:").count(), 1, "{t}");

    let (s1, s2) = (stats(&one), stats(&two));
    assert_eq!(s2["processes"], 2);
    assert_eq!(s1["totalhits"], 4_320_000);
    assert_eq!(s2["totalhits"], s1["totalhits"]);
    assert_eq!(s2["cg_iterations"], s1["cg_iterations"], "{s1}\n{s2}");
    check_detector_split(&s2, 2, 12);
    // One observation: both ranks hold it (one group of two).
    for p in s2["distribution"].as_array().unwrap() {
        assert_eq!(p["observations"].as_array().unwrap().len(), 1, "{s2}");
    }
    // Hits exactly; maps to a relative 1e-12.
    let hits = compare_maps(
        &two.join("mapmaker_hits.fits"),
        &one.join("mapmaker_hits.fits"),
    );
    assert_eq!(hits, vec![0.0], "hit maps differ");
    for f in ["mapmaker_map.fits", "mapmaker_binmap.fits"] {
        let rel = compare_maps(&two.join(f), &one.join(f));
        assert!(
            rel.iter().all(|&r| r <= 1e-12),
            "{f}: relative differences {rel:?}"
        );
    }
    // Timers of both ranks, combined as TOAST's CSV.
    let csv = std::fs::read_to_string(two.join("timing.csv")).unwrap();
    let line = csv
        .lines()
        .find(|l| l.starts_with("(function) toast-cli run|SimNoise,"))
        .unwrap_or_else(|| panic!("{csv}"));
    assert!(
        line.starts_with("(function) toast-cli run|SimNoise,2,1,1,"),
        "{line}"
    );
    assert!(csv.contains("|sync_map,"), "{csv}");
    assert!(csv.contains("|allreduce_dot,"), "{csv}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn groups_split_the_observations() {
    // Two groups of one process: one observation each, all detectors.
    let dir = scratch("groups");
    let (one, two) = (dir.join("one"), dir.join("two"));
    let mut common = vec![
        "--quiet",
        "--no-plot",
        "--threads",
        "1",
        "--n-obs",
        "2",
        "--set",
        "pixels.nside=128",
        "--set",
        "mapmaker.write_float64=true",
    ];
    common.extend(RCOND);
    let mut a = common.to_vec();
    a.extend(["--out-dir", one.to_str().unwrap()]);
    let o = single(&a);
    assert!(o.status.success(), "{}", text(&o));
    let mut b = common.to_vec();
    b.extend(["--out-dir", two.to_str().unwrap(), "--group-size", "1"]);
    let o = mpirun(2, &b, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s2 = stats(&two);
    assert_eq!(s2["group_size"], 1, "{s2}");
    let dist = s2["distribution"].as_array().unwrap();
    let obs: Vec<&serde_json::Value> = dist.iter().map(|p| &p["observations"]).collect();
    assert_eq!(obs[0].as_array().unwrap().len(), 1, "{s2}");
    assert_eq!(obs[1].as_array().unwrap().len(), 1, "{s2}");
    assert_ne!(obs[0], obs[1], "{s2}");
    for p in dist {
        assert_eq!(p["detectors"].as_array().unwrap().len(), 12, "{s2}");
    }
    assert_eq!(s2["totalhits"], stats(&one)["totalhits"]);
    let hits = compare_maps(
        &two.join("mapmaker_hits.fits"),
        &one.join("mapmaker_hits.fits"),
    );
    assert_eq!(hits, vec![0.0]);
    // Summation order differs (each group sums its observation from zero);
    // with covariances of condition number up to 1e3 kept, that moves Q and
    // U by ~1e-12 relative here (measured 1.09e-12 on Q, 2e-15 on I).
    for f in ["mapmaker_binmap.fits", "mapmaker_map.fits"] {
        let rel = compare_maps(&two.join(f), &one.join(f));
        assert!(rel.iter().all(|&r| r <= 1e-11), "{f}: {rel:?}");
        assert!(rel[0] <= 1e-12, "{f}: {rel:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sky_map_file_is_read_by_rank_0_and_shared() {
    let dir = scratch("skymap");
    // A smooth nside-64 sky (NEST): I, Q, U from the pixel index.
    let npix = 12 * 64 * 64;
    let i: Vec<f64> = (0..npix).map(|p| (p as f64 * 1e-3).sin()).collect();
    let q: Vec<f64> = (0..npix).map(|p| 0.1 * (p as f64 * 7e-4).cos()).collect();
    let u: Vec<f64> = (0..npix).map(|p| 0.1 * (p as f64 * 3e-4).sin()).collect();
    let sky = dir.join("sky.fits");
    toast_ops::io::fits::write_iqu_map(
        &sky,
        toast_ops::io::fits::Ordering::Nested,
        [&i, &q, &u],
        "K",
        toast_ops::io::fits::MapPrecision::F32,
        &[],
    )
    .unwrap();
    let (one, two) = (dir.join("one"), dir.join("two"));
    let mut common = vec![
        "--quiet",
        "--no-plot",
        "--threads",
        "1",
        "--set",
        "pixels.nside=64",
        "--set",
        "mapmaker.write_float64=true",
        "--sky-map",
        sky.to_str().unwrap(),
    ];
    common.extend(RCOND);
    let mut a = common.clone();
    a.extend(["--out-dir", one.to_str().unwrap()]);
    let o = single(&a);
    assert!(o.status.success(), "{}", text(&o));
    let mut b = common.clone();
    b.extend(["--out-dir", two.to_str().unwrap()]);
    let o = mpirun(2, &b, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(stats(&two)["sky_map"], stats(&one)["sky_map"]);
    let hits = compare_maps(
        &two.join("mapmaker_hits.fits"),
        &one.join("mapmaker_hits.fits"),
    );
    assert_eq!(hits, vec![0.0]);
    let rel = compare_maps(
        &two.join("mapmaker_binmap.fits"),
        &one.join("mapmaker_binmap.fits"),
    );
    assert!(rel.iter().all(|&r| r <= 1e-11), "{rel:?}");
    // A file that is not FITS ends the job, naming the file.
    let junk = dir.join("junk.fits");
    std::fs::write(&junk, vec![b'x'; 6000]).unwrap();
    let mut c = common.clone();
    let pos = c.iter().position(|x| *x == sky.to_str().unwrap()).unwrap();
    c[pos] = junk.to_str().unwrap();
    c.extend(["--out-dir", two.to_str().unwrap()]);
    let o = mpirun(2, &c, &[]);
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("junk.fits"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_impossible_distribution_is_refused_on_every_rank() {
    // Two groups for one observation.
    let dir = scratch("refuse");
    let o = mpirun(
        2,
        &[
            "--quiet",
            "--out-dir",
            dir.to_str().unwrap(),
            "--group-size",
            "1",
        ],
        &[],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("2 process groups"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failing_rank_ends_the_job_and_is_named() {
    let dir = scratch("fail");
    let o = mpirun(
        2,
        &[
            "--quiet",
            "--no-plot",
            "--out-dir",
            dir.to_str().unwrap(),
            "--set",
            "pixels.nside=64",
        ],
        &[("TOAST_FAULT_INJECT", "1:SimNoise:error")],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("rank 1 of 2"), "{t}");
    assert!(t.contains("injected failure"), "{t}");
    assert!(!dir.join("stats.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_rank_ends_the_job() {
    let dir = scratch("kill");
    let o = mpirun(
        2,
        &[
            "--quiet",
            "--no-plot",
            "--out-dir",
            dir.to_str().unwrap(),
            "--set",
            "pixels.nside=64",
        ],
        &[("TOAST_FAULT_INJECT", "1:MapMaker:kill")],
    );
    let t = text(&o);
    assert!(!o.status.success(), "{t}");
    assert!(
        t.contains("rank 1: MapMaker: sending this process SIGKILL"),
        "{t}"
    );
    // mpirun names the rank that died.
    assert!(
        t.contains("rank 1") && (t.contains("signal 9") || t.contains("Killed")),
        "{t}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// More ranks on a node than devices: the ranks that drive one device
/// divide its default budget (counted by the devices' UUIDs over the
/// ranks), and ranks with a device each keep all of it. On the emulated
/// CUDA driver, which gives each of its `TOAST_EMU_DEVICES` a UUID.
#[test]
fn ranks_that_share_a_device_divide_its_default_budget() {
    use toast_testkit::emulated::{ld_library_path, library_dir, REQUIRE};
    let dir = match library_dir("cuda") {
        Ok(d) => d,
        Err(why) => {
            return toast_testkit::plugins::skip_unless_required(
                REQUIRE,
                format!("emulated cuda: {why}"),
            )
        }
    };
    let budget = |ranks: usize, devices: &str, env: &[(&str, &str)], args: &[&str]| {
        let _one = process::one_mpi_job_at_a_time();
        let mut c = process::mpirun(ranks);
        c.args(["-x", "TOAST_EMU_DEVICES", "-x", "LD_LIBRARY_PATH"]);
        for v in ["TOAST_NVRTC_LIB", "TOAST_HIPRTC_LIB"] {
            if std::env::var_os(v).is_some() {
                c.args(["-x", v]);
            }
        }
        for v in ["TOAST_CUDA_DEVICE", "TOAST_GPU_MEM_GB"] {
            c.env_remove(v);
        }
        for (k, v) in env {
            c.args(["-x", k]).env(k, v);
        }
        c.arg(BIN)
            .args(["run", "--backend", "cuda", "--dry-run"])
            .args(args)
            .env("TOAST_EMU_DEVICES", devices)
            .env("LD_LIBRARY_PATH", ld_library_path(&dir));
        let o = process::run_with_deadline(c, Duration::from_secs(300), "toast-cli run");
        let log = text(&o);
        assert!(o.status.success(), "{log}");
        log.lines()
            .find(|l| l.starts_with("predicted device memory:"))
            .unwrap_or_else(|| panic!("no device budget in the dry run:\n{log}"))
            .to_string()
    };
    let shared = budget(2, "1", &[], &[]);
    assert!(
        shared.contains("divided among the 2 processes of this node that drive the device"),
        "{shared}"
    );
    let own = budget(2, "2", &[], &[]);
    assert!(
        own.contains("(the default, 90% of the device memory free at start))"),
        "{own}"
    );
    // Rank 0 of three on two devices shares device 0 with rank 2.
    let three = budget(3, "2", &[], &[]);
    assert!(three.contains("divided among the 2 processes"), "{three}");
    // TOAST_GPU_MEM_GB is each GPU's memory, as TOAST defines it: shared
    // too. The option memory= is each process's own.
    let env = budget(2, "1", &[("TOAST_GPU_MEM_GB", "8")], &[]);
    assert!(
        env.contains("(budget 4.000 GiB = 4294967296 bytes (TOAST_GPU_MEM_GB (the memory of each GPU, as TOAST defines it), divided among the 2 processes"),
        "{env}"
    );
    let option = budget(2, "1", &[], &["--backend-options", "cuda:memory=8"]);
    assert!(
        option.contains("(budget 8.000 GiB = 8589934592 bytes (option memory=))"),
        "{option}"
    );
}
