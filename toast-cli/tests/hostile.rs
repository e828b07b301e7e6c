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
    contents(dir).into_keys().collect()
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
