//! `toast-cli run` under faults and hostile input (issue #13): outputs are
//! replaced whole or not at all, a closed standard output ends the process
//! quietly, and absurd `--threads` and `--dry-run P,PPN` are refused.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;
use toast_testkit::process::{self, text};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_toast-cli"))
}

/// `toast-cli run ARGS` with `env`, within two minutes.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = bin();
    cmd.arg("run").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    process::run_with_deadline(cmd, Duration::from_secs(120), &format!("run {args:?}"))
}

/// A small run into `out` (two detectors, ten minutes, nside 32).
fn small_run(out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "--quiet",
        "--n-det",
        "2",
        "--out-dir",
        out.to_str().unwrap(),
        "--set",
        "sim_satellite.obs_minutes=10",
        "--set",
        "pixels.nside=32",
        "--set",
        "baselines.step_time=60",
    ];
    args.extend(extra);
    run(&args, env)
}

/// Every file of `dir` with its bytes.
fn contents(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

const ALL: [&str; 7] = [
    "config.toml",
    "mapmaker_binmap.fits",
    "mapmaker_hits.fits",
    "mapmaker_map.fits",
    "mapmaker_map.png",
    "stats.json",
    "timing.csv",
];

#[test]
fn outputs_are_replaced_whole_or_not_at_all() {
    let dir = process::scratch("toast-cli-hostile", "outputs");
    let out = dir.join("out");
    // A complete run with the plot and the binned map.
    let o = small_run(&out, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(names(&out), ALL);
    // The next run writes neither: the previous run's are removed, not
    // left beside the new outputs.
    let o = small_run(
        &out,
        &["--no-plot", "--set", "mapmaker.write_binmap=false"],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    let complete = contents(&out);
    let expected: Vec<&str> = ALL
        .into_iter()
        .filter(|n| *n != "mapmaker_map.png" && *n != "mapmaker_binmap.fits")
        .collect();
    assert_eq!(names(&out), expected);
    // A run that fails while writing its outputs (after the hit map is
    // written) leaves the previous run's files as they were, and no
    // temporary.
    let o = small_run(
        &out,
        &["--set", "pixels.nside=64"],
        &[("TOAST_FAULT_INJECT", "0:output mapmaker_binmap.fits")],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("injected failure"), "{t}");
    assert!(
        contents(&out) == complete,
        "the previous run's outputs changed"
    );
    // A run killed while writing its outputs: no file under a final name
    // is truncated or from the killed run; only its temporaries remain.
    let o = small_run(
        &out,
        &["--set", "pixels.nside=64"],
        &[("TOAST_FAULT_INJECT", "0:output mapmaker_map.png:kill")],
    );
    assert!(!o.status.success(), "{}", text(&o));
    let after = contents(&out);
    for (name, bytes) in &complete {
        assert!(after.get(name) == Some(bytes), "{name} changed");
    }
    let temps: Vec<&String> = after.keys().filter(|n| n.contains(".tmp-")).collect();
    assert!(!temps.is_empty(), "{:?}", after.keys());
    assert!(
        temps.iter().all(|n| n.starts_with('.')),
        "{:?}",
        after.keys()
    );
    // The next complete run removes the killed run's temporaries.
    let o = small_run(&out, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(names(&out), ALL);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_closed_stdout_ends_the_run_quietly() {
    // `toast-cli run --dry-run | head -0`: the reader is gone before the
    // first line is written.
    let mut child = bin()
        .args(["run", "--dry-run"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start toast-cli");
    drop(child.stdout.take());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(!err.contains("panicked"), "{status:?}: {err}");
    assert!(err.is_empty(), "{status:?}: {err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(13), "{status:?}: ended by SIGPIPE");
    }
}

#[test]
fn absurd_threads_and_process_counts_are_refused() {
    let dir = process::scratch("toast-cli-hostile", "bounds");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--threads", "10000", "--out-dir", o],
            "--threads 10000: at most",
        ),
        (
            vec!["--dry-run", "1099511627776,1"],
            "--dry-run 1099511627776,1: P = 1099511627776 processes; at most 16777216",
        ),
        (
            vec!["--dry-run", "99999999999999999999999,1"],
            "expected P,PPN",
        ),
    ] {
        let r = run(&args, &[]);
        let t = text(&r);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {t}");
        assert!(t.contains(needle), "{args:?}: expected {needle:?} in {t}");
    }
    // The largest allowed P passes the bound and is judged (quickly) by the
    // distribution: no preset has that many detector sets.
    let r = run(&["--dry-run", "16777216,16"], &[]);
    let t = text(&r);
    assert_eq!(r.status.code(), Some(2), "{t}");
    assert!(
        !t.contains("at most 16777216") && t.contains("group size"),
        "{t}"
    );
    assert!(!out.exists(), "nothing may be written on bad input");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bad backend option is a usage error (2), not an unavailable backend
/// (3): the plugin is there, the option is wrong.
#[test]
fn a_bad_backend_option_is_a_usage_error() {
    let mut c = bin();
    c.args([
        "verify",
        "--backend",
        "cpu",
        "--backend-options",
        "cpu:threads=many",
    ]);
    let o = process::run_with_deadline(c, Duration::from_secs(120), "verify");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("backend `cpu` could not be initialised: invalid argument"),
        "{t}"
    );
    assert!(t.contains("many"), "the message names the value: {t}");
}

/// Class 7: a key, operator or backend that would be accepted and do
/// nothing is refused before any work, naming it and what is accepted.
#[test]
fn what_would_do_nothing_is_refused() {
    let dir = process::scratch("toast-cli-hostile", "ignored");
    let out = dir.join("out");
    let config = dir.join("dispatch.toml");
    std::fs::write(&config, "[dispatch]\noperator.NoSuchOp = \"cpu\"\n").unwrap();
    let o = out.to_str().unwrap();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (
            vec!["--config", config.to_str().unwrap()],
            vec!["[dispatch] operator.NoSuchOp=cpu", "template_matrix"],
        ),
        (
            vec!["--set", "dispatch.operator.MapMaker=cpu"],
            vec!["no operator `MapMaker`", "det_pointing"],
        ),
        (
            vec!["--set", "mapmaker.keep_solver_products=true"],
            vec!["[mapmaker] keep_solver_products = true", "accepts only"],
        ),
        (
            vec!["--set", "mapmaker.write_solver_products=true"],
            vec!["write_solver_products", "not implemented"],
        ),
        (
            vec!["--set", "binner.binned=x"],
            vec!["[binner] binned = \"x\"", "names its maps itself"],
        ),
        (
            vec!["--set", "scan_map.pixel_dist=x"],
            vec!["[scan_map] pixel_dist", "binner.pixel_dist"],
        ),
        (
            vec!["--set", "weights.mode=I"],
            vec!["[weights] mode", "IQU"],
        ),
        (
            vec!["--set", "pixels.enabled=false"],
            vec!["[pixels] enabled = false", "need the pixel numbers"],
        ),
        (
            vec!["--sky-map", "sky.fits", "--set", "scan_map.seed=7"],
            vec!["[scan_map] seed = 7", "synthetic sky", "sky.fits"],
        ),
        (
            vec!["--sky-map", "sky.fits", "--set", "scan_map.enabled=false"],
            vec!["would not be read"],
        ),
        (
            vec!["--set", "mapmaker.no_such_key=1"],
            vec!["[mapmaker] no_such_key"],
        ),
        (
            vec!["--backend-options", "nosuch:threads=2"],
            vec![
                "--backend-options \"nosuch:threads=2\"",
                "no backend `nosuch`",
                "cpu",
            ],
        ),
        (
            vec!["--backend-options", "cpu:nosuch=2"],
            vec!["unknown option `nosuch` (known: threads)"],
        ),
    ];
    for (mut args, needles) in cases {
        args.extend(["--out-dir", o, "--n-det", "2", "--quiet"]);
        let r = run(&args, &[]);
        let t = text(&r);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {t}");
        for n in needles {
            assert!(t.contains(n), "{args:?}: expected {n:?} in {t}");
        }
    }
    assert!(!out.exists(), "nothing may be written on bad input");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Class 7: the map-maker's TOAST traits decide what is written, where,
/// and whether the map-making runs at all.
#[test]
fn the_map_makers_traits_decide_its_outputs() {
    use toast_ops::io::fits::read_healpix_map;
    let dir = process::scratch("toast-cli-hostile", "traits");
    let out = dir.join("out");
    let maps = out.join("maps");
    let o = small_run(
        &out,
        &[
            "--no-plot",
            "--set",
            "mapmaker.write_cov=true",
            "--set",
            "mapmaker.write_invcov=true",
            "--set",
            "mapmaker.write_rcond=true",
            "--set",
            "mapmaker.write_noiseweighted_map=true",
            "--set",
            "mapmaker.write_hits=false",
            "--set",
            "mapmaker.write_map=false",
            "--set",
            "mapmaker.output_dir=maps",
            "--set",
            "binner.full_pointing=false",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", text(&o));
    // Every operator that called a kernel (`operator.kernel[backend]`
    // timers) is one a dispatch override may name.
    let timing = std::fs::read_to_string(out.join("timing.csv")).unwrap();
    let ops: Vec<&str> = timing
        .lines()
        .filter_map(|l| l.split(',').next())
        .filter(|n| n.ends_with(']'))
        .filter_map(|n| n.split_once('.').map(|(op, _)| op))
        .collect();
    assert!(ops.len() >= 8, "{timing}");
    for op in ops {
        assert!(
            toast_ops::workflow::config::DISPATCH_OPERATORS.contains(&op),
            "operator {op} calls kernels but dispatch overrides refuse it"
        );
    }
    assert_eq!(
        names(&maps),
        [
            "mapmaker_binmap.fits",
            "mapmaker_cov.fits",
            "mapmaker_invcov.fits",
            "mapmaker_noiseweighted_map.fits",
            "mapmaker_rcond.fits",
        ]
    );
    assert_eq!(
        names(&out),
        ["config.toml", "maps", "stats.json", "timing.csv"]
    );
    // TOAST's layout: the packed upper triangle, K² (1/K² inverted).
    for (file, unit) in [
        ("mapmaker_cov.fits", "K2"),
        ("mapmaker_invcov.fits", "1 / K2"),
    ] {
        let m = read_healpix_map(&maps.join(file), None).unwrap();
        let cols: Vec<&str> = m.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(cols, ["II", "IQ", "IU", "QQ", "QU", "UU"], "{file}");
        assert!(
            m.fields.iter().all(|f| f.unit.as_deref() == Some(unit)),
            "{file}"
        );
    }
    let cov = read_healpix_map(&maps.join("mapmaker_cov.fits"), None).unwrap();
    let rcond = read_healpix_map(&maps.join("mapmaker_rcond.fits"), None).unwrap();
    assert_eq!(rcond.fields.len(), 1);
    let seen = rcond.fields[0].data.iter().filter(|&&r| r > 0.0).count();
    assert!(seen > 0);
    let ii_seen = cov.fields[0].data.iter().filter(|&&v| v > 0.0).count();
    assert_eq!(ii_seen, seen, "a covariance where the rcond passes");
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("stats.json")).unwrap()).unwrap();
    let listed = stats["outputs"].as_array().unwrap();
    assert_eq!(listed.len(), 8, "{listed:?}");
    assert!(listed
        .iter()
        .any(|p| p.as_str().unwrap().ends_with("maps/mapmaker_cov.fits")));
    assert_eq!(stats["mapmaker_enabled"], true);

    // Disabled: the simulation runs, no map is made or left from before.
    let o = small_run(
        &out,
        &[
            "--set",
            "mapmaker.enabled=false",
            "--set",
            "mapmaker.output_dir=maps",
        ],
        &[],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("map-making:     skipped (mapmaker.enabled = false)"),
        "{t}"
    );
    assert!(names(&maps).is_empty(), "{:?}", names(&maps));
    assert_eq!(
        names(&out),
        ["config.toml", "maps", "stats.json", "timing.csv"]
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["mapmaker_enabled"], false);
    assert!(stats.get("totalhits").is_none(), "{stats}");

    // An absolute output_dir; one that cannot be a directory is refused
    // before any work.
    let abs = dir.join("abs");
    let spec = format!("mapmaker.output_dir={}", abs.display());
    let o = small_run(&out, &["--no-plot", "--set", &spec], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(abs.join("mapmaker_map.fits").exists());
    let blocker = dir.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let spec = format!("mapmaker.output_dir={}", blocker.join("sub").display());
    let o = small_run(&dir.join("other"), &["--set", &spec], &[]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("mapmaker.output_dir"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Class 8: a sky map's NaN, infinite or float32-overflowing value is
/// refused naming the file, the column and the first bad pixel; UNSEEN is
/// scanned as unobserved, counted in the log.
#[test]
fn bad_values_in_a_sky_map_are_named() {
    use toast_ops::io::fits::{write_iqu_map, MapPrecision, Ordering, UNSEEN};
    let dir = process::scratch("toast-cli-hostile", "sky");
    let npix = 12 * 32 * 32;
    let sky = |name: &str, k: usize, pix: usize, v: f64| {
        let mut m = [vec![1e-3f64; npix], vec![1e-4; npix], vec![-1e-4; npix]];
        m[k][pix] = v;
        m[k][pix + 10] = v;
        let p = dir.join(name);
        write_iqu_map(
            &p,
            Ordering::Ring,
            [&m[0], &m[1], &m[2]],
            "K",
            MapPrecision::F64,
            &[],
        )
        .unwrap();
        p
    };
    for (file, k, v, needle) in [
        ("nan.fits", 1, f64::NAN, "column 2 ('Q_POLARISATION', Stokes Q): pixel 17 (RING ordering) is NaN"),
        ("inf.fits", 0, f64::NEG_INFINITY, "column 1 ('TEMPERATURE', Stokes I): pixel 17 (RING ordering) is -inf"),
        ("huge.fits", 2, 1e300, "column 3 ('U_POLARISATION', Stokes U): pixel 17 (RING ordering) is 1e300, beyond single precision"),
    ] {
        let p = sky(file, k, 17, v);
        let o = small_run(&dir.join("out"), &["--sky-map", p.to_str().unwrap()], &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{file}: {t}");
        assert!(t.contains(&format!("sky map {}", p.display())), "{file}: {t}");
        assert!(t.contains(needle), "{file}: expected {needle:?} in {t}");
    }
    let p = sky("unseen.fits", 0, 40, UNSEEN);
    let o = small_run(&dir.join("out"), &["--sky-map", p.to_str().unwrap()], &[]);
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("2 value(s) are UNSEEN (I 2, Q 0, U 0): scanned as unobserved"),
        "{t}"
    );
    // A synthetic sky with a beam wider than the sky is refused.
    let o = small_run(
        &dir.join("out"),
        &["--set", "scan_map.fwhm_arcmin=1e308"],
        &[],
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("180 degrees"), "{t}");
    let _ = std::fs::remove_dir_all(&dir);
}
