//! The hostile-input suite of the command line (issue #13), written once:
//!
//! * [`every_probe`]: one table, each row a command (arguments, environment,
//!   where standard output goes) with the exit status and the words its
//!   output must hold: absurd option values of every subcommand, corrupt
//!   case (`.npz`) and FITS files, broken plugin files, a full device and a
//!   closed pipe on standard output. Every row also checks that nothing
//!   panicked and that no number is echoed with dozens of digits;
//! * [`outputs_are_replaced_whole_or_not_at_all`]: a run that fails, or is
//!   killed, while writing its outputs leaves the previous run's files;
//! * [`a_full_disk_leaves_the_previous_outputs`]: the same when the disk
//!   fills (a file size limit, `RLIMIT_FSIZE`, makes every write past it
//!   fail as a full disk does).
//!
//! The readers' property tests are `toast-ops/tests/reader_props.rs` (FITS,
//! configuration) and `tests/tests/case_props.rs` (cases); bad plugins built
//! from C are `tests/tests/c_plugin.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use toast_testkit::process::{self, text, StdoutTo};
use toast_testkit::{shipped_cases_dir, SHIPPED_CASES};

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
    // A run stopped by SIGTERM (a batch system's time limit) while writing
    // its outputs removes its own temporaries as it ends by the signal;
    // the killed run's are still there, and the finals are untouched.
    let o = small_run(
        &out,
        &["--set", "pixels.nside=64"],
        &[("TOAST_FAULT_INJECT", "0:output mapmaker_map.fits:term")],
    );
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(o.status.signal(), Some(15), "{}", text(&o));
    }
    let termed = contents(&out);
    assert_eq!(
        termed.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>(),
        "the stopped run's temporaries were left, or a final changed"
    );
    for (name, bytes) in &complete {
        assert!(termed.get(name) == Some(bytes), "{name} changed");
    }
    // The next complete run removes the killed run's temporaries.
    let o = small_run(&out, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(names(&out), ALL);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a probe must end with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// This exit status.
    Code(i32),
    /// Killed by SIGPIPE, or exit status 141, with nothing on stderr: the
    /// quiet end of a write to a closed pipe.
    ClosedPipe,
}

/// One row of the table.
struct Probe {
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    stdout: StdoutTo,
    end: End,
    /// Words the output (stdout, then stderr) must contain.
    words: Vec<String>,
}

fn probe(args: &[&str], end: End, words: &[&str]) -> Probe {
    Probe {
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Vec::new(),
        stdout: StdoutTo::Captured,
        end,
        words: words.iter().map(|w| w.to_string()).collect(),
    }
}

impl Probe {
    fn env(mut self, k: &'static str, v: impl Into<String>) -> Self {
        self.env.push((k, v.into()));
        self
    }

    fn stdout(mut self, to: StdoutTo) -> Self {
        self.stdout = to;
        self
    }

    /// Run it; the failures of this row, if any.
    fn check(&self) -> Option<String> {
        let mut cmd = bin();
        cmd.args(&self.args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let what = format!("{:?}", self.args);
        let o = process::run_to(cmd, &self.stdout, Duration::from_secs(60), &what);
        let t = text(&o);
        let mut bad = Vec::new();
        match self.end {
            End::Code(c) if o.status.code() != Some(c) => {
                bad.push(format!("status {:?}, expected {c}", o.status))
            }
            End::ClosedPipe => {
                use std::os::unix::process::ExitStatusExt;
                if !(o.status.signal() == Some(13) || o.status.code() == Some(141)) {
                    bad.push(format!("status {:?}, expected SIGPIPE or 141", o.status));
                }
                if !o.stderr.is_empty() {
                    bad.push("a closed pipe is a quiet end: stderr is not empty".into());
                }
            }
            End::Code(_) => {}
        }
        for w in &self.words {
            if !t.contains(w.as_str()) {
                bad.push(format!("no {w:?} in the output"));
            }
        }
        if t.contains("panicked") {
            bad.push("a panic".into());
        }
        let longest_number = t
            .split(|c: char| !c.is_ascii_digit())
            .map(str::len)
            .max()
            .unwrap_or(0);
        if longest_number > 24 {
            bad.push(format!("a number of {longest_number} digits"));
        }
        (!bad.is_empty()).then(|| format!("{what}: {}\n{t}", bad.join("; ")))
    }
}

/// The CPU plugin next to the binary.
fn cpu_plugin() -> PathBuf {
    let exe = Path::new(env!("CARGO_BIN_EXE_toast-cli"));
    exe.with_file_name(format!(
        "{}toast_backend_cpu{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ))
}

fn shipped_case(name: &str) -> PathBuf {
    shipped_cases_dir().join(name)
}

fn fits_vector(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../toast-ops/tests/data")
        .join(name)
}

/// `bytes` with the value of FITS card `key` replaced (the 80-column layout
/// kept).
fn fits_card(bytes: &[u8], key: &str, value: &str) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let k = format!("{key:<8}= ");
    let card = out
        .chunks_exact_mut(80)
        .find(|c| c.starts_with(k.as_bytes()))
        .unwrap_or_else(|| panic!("no {key} card"));
    let mut text = format!("{k}{value:>20}").into_bytes();
    text.resize(80, b' ');
    card.copy_from_slice(&text);
    out
}

/// Every hostile probe, each a named error with its exit status (or a
/// quiet end on a closed pipe), none a panic, a hang or a crash.
#[test]
fn every_probe() {
    use End::{ClosedPipe, Code};
    let dir = process::scratch("toast-cli-hostile", "probes");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out = s(&dir.join("out"));

    // Corrupt cases beside a good one: each is a FAIL line, the run goes on.
    let cases = dir.join("cases");
    std::fs::create_dir_all(&cases).unwrap();
    let good = std::fs::read(shipped_case("noise_weight_basic.npz")).unwrap();
    std::fs::write(cases.join("noise_weight_basic.npz"), &good).unwrap();
    std::fs::write(cases.join("noise_weight_not_zip.npz"), b"not a zip").unwrap();
    std::fs::write(cases.join("noise_weight_cut.npz"), &good[..good.len() / 2]).unwrap();
    std::fs::write(cases.join("no_such_kernel.npz"), &good).unwrap();

    // Corrupt sky maps (nside 8, as the run below asks).
    let map = std::fs::read(fits_vector("hp_iqu_nest_D_n8.fits")).unwrap();
    let partial = std::fs::read(fits_vector("hp_iqu_nest_partial_D_n8.fits")).unwrap();
    let fits = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        s(&p)
    };
    let junk = fits("junk.fits", &[b'x'; 5000]);
    let cut_header = fits("cut_header.fits", &map[..1000]);
    let cut_data = fits("cut_data.fits", &map[..6000]);
    let huge_rows = fits("huge_rows.fits", &fits_card(&map, "NAXIS2", "4294967296"));
    let huge_nside = fits(
        "huge_nside.fits",
        &fits_card(&partial, "NSIDE", "536870912"),
    );
    let odd_nside = fits("odd_nside.fits", &fits_card(&map, "NSIDE", "1e300"));
    let nside8 = ["--set", "pixels.nside=8", "--set", "pixels.nside_submap=8"];
    let sky = |path: &str, words: &[&str]| {
        let mut a = vec!["run", "--dry-run", "--sky-map", path];
        a.extend(nside8);
        probe(&a, Code(2), words)
    };

    // Plugin files that are not whole shared libraries, where discovery
    // looks first: skipped with the reason; the real CPU plugin still runs.
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let cpu = std::fs::read(cpu_plugin()).unwrap();
    std::fs::write(
        plugins.join(cpu_plugin().file_name().unwrap()),
        &cpu[..200_000],
    )
    .unwrap();
    std::fs::write(plugins.join("libtoast_backend_junk.so"), b"#!/bin/sh\n").unwrap();
    let plugin_dir = s(&plugins);

    // Options files.
    let big_config = dir.join("big.toml");
    std::fs::write(&big_config, vec![b'#'; (1 << 20) + 1]).unwrap();
    let big_config = s(&big_config);

    // An output name taken by a directory: refused before any work.
    let obstacle = dir.join("obstacle");
    std::fs::create_dir_all(obstacle.join("timing.csv").join("x")).unwrap();
    let obstacle = s(&obstacle);

    // A file where a directory is asked for.
    let a_file = dir.join("a_file");
    std::fs::write(&a_file, b"not a directory").unwrap();
    let under_a_file = s(&a_file.join("out"));
    let a_file = s(&a_file);

    // An output directory that is a link to nowhere.
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let dangling = s(&dangling);

    let full = || StdoutTo::File("/dev/full".into());
    let at_most_threads = "at most";
    let probes = vec![
        // Class 6: absurd but typed values, every subcommand.
        probe(
            &["bench", "kernels", "--n-det", "2000000000"],
            Code(2),
            &["--n-det 2000000000", "needs about", "GiB of memory"],
        ),
        probe(
            &["bench", "kernels", "--n-det", "99999999999"],
            Code(2),
            &["--n-det 99999999999: must be in [1, 2^31)"],
        ),
        probe(
            &["bench", "kernels", "--n-det", "0"],
            Code(2),
            &["--n-det 0"],
        ),
        probe(
            &["bench", "kernels", "--nside", "536870912"],
            Code(2),
            &["--nside 536870912", "needs about"],
        ),
        probe(
            &["bench", "kernels", "--nside", "3"],
            Code(2),
            &["--nside 3: must be a power of two"],
        ),
        probe(
            &[
                "bench",
                "kernels",
                "--precond-n-amp",
                "18446744073709551615",
            ],
            Code(2),
            &["needs about"],
        ),
        probe(
            &["bench", "kernels", "--n-samp", "18446744073709551615"],
            Code(2),
            &["needs about"],
        ),
        probe(
            &["bench", "kernels", "--n-samp", "10"],
            Code(2),
            &["--n-samp 10: must be at least 200"],
        ),
        probe(
            &["bench", "kernels", "--repeats", "18446744073709551615"],
            Code(2),
            &["--repeats 18446744073709551615: at most 1000"],
        ),
        probe(
            &["bench", "kernels", "--threads", "100000"],
            Code(2),
            &["--threads 100000: at most"],
        ),
        probe(
            &["bench", "kernels", "--threads", "0"],
            Code(2),
            &["--threads 0: must be at least 1"],
        ),
        probe(
            &["--backend-options", "cpu:threads=100000", "verify"],
            Code(2),
            &["option threads: 100000 threads; at most"],
        ),
        // One backend's options from several flags are one string: the
        // failing option is quoted, and a key given twice is refused (the
        // plugin kept the last and dropped the other).
        probe(
            &[
                "--backend-options",
                "cpu:threads=1",
                "--backend-options",
                "cpu:threads=100000",
                "verify",
            ],
            Code(2),
            &["`threads` is given twice for backend `cpu`"],
        ),
        probe(
            &[
                "--backend-options",
                "cpu:threads=1",
                "bench",
                "kernels",
                "--tiny",
                "--threads",
                "2",
            ],
            Code(2),
            &["--threads 2 and --backend-options cpu:threads=1 both set the cpu plugin's threads"],
        ),
        probe(
            &["--backend-options", "cpu:threads=1;nosuch=1", "verify"],
            Code(2),
            &["--backend-options \"cpu:threads=1;nosuch=1\"", "unknown option `nosuch`"],
        ),
        probe(
            &["--backend-options", "cpu:threads=many", "verify"],
            Code(2),
            &[
                "backend `cpu` could not be initialised: invalid argument",
                "many",
            ],
        ),
        probe(
            &["run", "--threads", "10000", "--out-dir", &out],
            Code(2),
            &["--threads 10000: ", at_most_threads],
        ),
        probe(
            &["run", "--dry-run", "1099511627776,1"],
            Code(2),
            &["--dry-run 1099511627776,1: P = 1099511627776 processes; at most 16777216"],
        ),
        probe(
            &["run", "--dry-run", "99999999999999999999999,1"],
            Code(2),
            &["expected P,PPN"],
        ),
        probe(
            &["run", "--dry-run", "16777216,16"],
            Code(2),
            &["group size"],
        ),
        probe(
            &["run", "--dry-run", "--n-det", "18446744073709551615"],
            Code(2),
            &["--n-det 18446744073709551615: must be even"],
        ),
        probe(
            &["run", "--dry-run", "--n-obs", "4321"],
            Code(2),
            &["--n-obs 4321"],
        ),
        probe(
            &["run", "--dry-run", "--group-size", "0"],
            Code(2),
            &["--group-size 0"],
        ),
        probe(
            &["run", "--dry-run", "--config", "/dev/zero"],
            Code(2),
            &["--config /dev/zero: cannot read", "a character device"],
        ),
        probe(
            &["run", "--dry-run", "--config", &big_config],
            Code(2),
            &["more than 1048576 bytes"],
        ),
        probe(
            &[
                "kernels",
                "compile",
                "--target",
                "cuda",
                "--arch",
                &"x".repeat(100_000),
            ],
            Code(2),
            &["--arch", "(100000 bytes): expected sm_XY"],
        ),
        probe(
            &["kernels", "compile", "--target", "nosuch"],
            Code(2),
            &["--target nosuch"],
        ),
        // Class 9: huge numbers echoed compactly.
        probe(
            &[
                "run",
                "--dry-run",
                "--set",
                "sim_satellite.obs_minutes=1e300",
            ],
            Code(2),
            &["sim_satellite.obs_minutes 1e300"],
        ),
        probe(
            &["run", "--dry-run", "--set", "pixels.nside=1e300"],
            Code(2),
            &["nside = 1e300", "floating point `1e300`"],
        ),
        probe(
            &["run", "--dry-run", "--set", "baselines.step_time=1e-300"],
            Code(2),
            &["baselines.step_time 1e-300"],
        ),
        probe(
            &["run", "--dry-run", "--set", "mapmaker.convergence=-1e300"],
            Code(2),
            &["convergence = -1e300 must be positive"],
        ),
        probe(
            &["run", "--dry-run", "--set", "baselines.good_fraction=1e300"],
            Code(2),
            &["good_fraction = 1e300"],
        ),
        probe(
            &[
                "run",
                "--dry-run",
                "--set",
                "sim_satellite.gap_minutes=1e300",
            ],
            Code(2),
            &["gap_minutes 1e300"],
        ),
        probe(
            &["run", "--dry-run", "--set", "dispatch.run=1e300"],
            Code(2),
            &["run = 1e300: expected a backend name"],
        ),
        // A named backend that cannot start fails the dry run as it fails
        // the run (it once planned the run on the cpu and said it fits):
        // absent, or refusing its configuration (here a bad budget, or no
        // OpenCL at all; either way it cannot start).
        probe(
            &["run", "--dry-run", "--backend", "nosuchbackend"],
            Code(2),
            &["run=nosuchbackend", "nosuchbackend"],
        ),
        probe(
            &["run", "--dry-run", "--backend", "opencl"],
            Code(2),
            &["run=opencl: backend `opencl` could not be initialised"],
        )
        .env("TOAST_GPU_MEM_GB", "abc"),
        probe(
            &[
                "run",
                "--quiet",
                "--no-plot",
                "--n-det",
                "2",
                "--out-dir",
                &obstacle,
            ],
            Code(2),
            &["timing.csv: a directory, where the run puts its output timing.csv"],
        ),
        // Dates that are not on the calendar (2027-02-30 ran as 03-02), or
        // outside the ephemeris; observations of fewer than 2 samples
        // (each passed the dry run and failed in the simulation, naming no
        // setting).
        probe(
            &["run", "--dry-run", "--set", "sim_satellite.mission_start=2027-02-30"],
            Code(2),
            &["sim_satellite.mission_start: \"2027-02-30\" is not a date (month 2 of 2027 has 28 days)"],
        ),
        probe(
            &["run", "--dry-run", "--set", "sim_satellite.mission_start=1-01-01"],
            Code(2),
            &["sim_satellite.mission_start: \"1-01-01\" is outside the years"],
        ),
        probe(
            &["run", "--dry-run", "--set", "sim_satellite.obs_minutes=1e-4"],
            Code(2),
            &["sim_satellite.obs_minutes 0.0001: an observation holds 1 sample(s)"],
        ),
        probe(
            &["run", "--quiet", "--no-plot", "--n-det", "2", "--out-dir", &dangling],
            Code(2),
            &["dangling: a symbolic link that leads to no directory"],
        ),
        // The dry run refuses them too.
        probe(
            &["run", "--dry-run", "--out-dir", &dangling],
            Code(2),
            &["dangling: a symbolic link that leads to no directory"],
        ),
        probe(
            &["run", "--dry-run", "--out-dir", &obstacle],
            Code(2),
            &["timing.csv: a directory, where the run puts its output timing.csv"],
        ),
        // An output directory that is a file, or cannot be created or
        // written (the dry run said 0 where the run refuses them), and a
        // maps directory under a file.
        probe(
            &["run", "--dry-run", "--out-dir", &a_file],
            Code(2),
            &["a_file: cannot create: it is not a directory"],
        ),
        probe(
            &["run", "--dry-run", "--out-dir", &under_a_file],
            Code(2),
            &["cannot create:", "a_file is not a directory"],
        ),
        probe(
            &["run", "--dry-run", "--out-dir", &format!("{a_file}/")],
            Code(2),
            &["a_file/: cannot create: it is not a directory"],
        ),
        probe(
            &["run", "--dry-run", "--out-dir", "/proc/toast-cli-out"],
            Code(2),
            &["output directory /proc/toast-cli-out: cannot be created or written in /proc"],
        ),
        probe(
            &["run", "--dry-run", "--out-dir", &out, "--set", &format!("mapmaker.output_dir={a_file}")],
            Code(2),
            &["mapmaker.output_dir", "a_file: cannot create: it is not a directory"],
        ),
        probe(
            &["run", "--quiet", "--no-plot", "--n-det", "2", "--out-dir", &a_file],
            Code(2),
            &["a_file: cannot create: it is not a directory"],
        ),
        // A fault point the run does not have could never fire; a bad mode
        // was found only at the phase, after the work before it.
        probe(&["run", "--dry-run"], Code(2), &["TOAST_FAULT_INJECT=\"0:NoSuchPhase\": no phase \"NoSuchPhase\" in this command"])
            .env("TOAST_FAULT_INJECT", "0:NoSuchPhase"),
        probe(&["run", "--dry-run"], Code(2), &["TOAST_FAULT_INJECT=\"0:MapMaker:explode\": unknown mode \"explode\" (error, kill or term)"])
            .env("TOAST_FAULT_INJECT", "0:MapMaker:explode"),
        probe(&["run", "--dry-run"], Code(2), &["TOAST_FAULT_INJECT=\"3:MapMaker\": rank 3 of a job of 1 process(es)"])
            .env("TOAST_FAULT_INJECT", "3:MapMaker"),
        probe(&["run", "--dry-run"], Code(2), &["no phase \"output mapmaker_mapp.fits\" in this command"])
            .env("TOAST_FAULT_INJECT", "0:output mapmaker_mapp.fits"),
        // A --json file that cannot be written is refused before the
        // benchmark (it failed after it, exit status 1), and a device or a
        // directory is not replaced.
        probe(
            &["bench", "kernels", "--tiny", "--json", &s(&dir)],
            Code(2),
            &["--json", "a directory"],
        ),
        // A device is written as it is (/dev/stdout works); one that fails
        // is an output failure, exit status 2.
        probe(
            &["bench", "kernels", "--tiny", "--json", "/dev/full"],
            Code(2),
            &["--json /dev/full: No space left on device"],
        ),
        probe(
            &["bench", "kernels", "--tiny", "--json", &s(&dir.join("none").join("x.json"))],
            Code(2),
            &["x.json: No such file or directory"],
        ),
        // A field name the workflow never makes fails the dry run (it failed
        // the run after the simulation), naming the step's section.
        probe(
            &["run", "--dry-run", "--set", "mapmaker.det_data=qq"],
            Code(2),
            &["mapmaker: reads detdata `qq`, which no earlier step of the workflow provides"],
        ),
        probe(
            &["run", "--dry-run", "--set", "pixels.view=x"],
            Code(2),
            &["pixels: reads intervals `x`"],
        ),
        // The default backend (cpu) that cannot start fails the dry run, as
        // a named one does (it planned with no backend and exited 0).
        probe(
            &["run", "--dry-run"],
            Code(2),
            &["run (unset: the default backend, cpu)", "TOAST_CPU_THREADS"],
        )
        .env("TOAST_CPU_THREADS", "abc"),
        // RAYON_NUM_THREADS sizes the pools not given a count: bounded as
        // --threads is (100000 hung a dry run), and not ignored when it is
        // not a count.
        probe(
            &["run", "--dry-run"],
            Code(2),
            &["RAYON_NUM_THREADS 100000: at most"],
        )
        .env("RAYON_NUM_THREADS", "100000"),
        probe(
            &["verify", "--backend", "cpu"],
            Code(2),
            &["RAYON_NUM_THREADS=\"four\": not a thread count"],
        )
        .env("RAYON_NUM_THREADS", "four"),
        // A RUST_LOG that is no filter: the default level, said so.
        probe(
            &["run", "--dry-run"],
            Code(0),
            &["RUST_LOG=\"garbage===\" is not a log filter", "the log level is warn"],
        )
        .env("RUST_LOG", "garbage==="),
        // A `memory` option without a value: refused by the plugin and the
        // host alike (one parser), not read as no budget.
        probe(
            &[
                "run",
                "--dry-run",
                "--backend",
                "opencl",
                "--backend-options",
                "opencl:memory",
            ],
            Code(2),
            &["opencl:memory\": backend `opencl` could not be initialised"],
        ),
        probe(
            &[
                "run",
                "--dry-run",
                "--set",
                "dispatch.kernel.scan_map=opencl",
            ],
            Code(2),
            &["kernel.scan_map=opencl: backend `opencl` could not be initialised"],
        )
        .env("TOAST_GPU_MEM_GB", "abc"),
        probe(
            &[
                "run",
                "--quiet",
                "--n-det",
                "2",
                "--out-dir",
                &s(&dir.join("beam")),
                "--set",
                "sim_satellite.obs_minutes=10",
                "--set",
                "pixels.nside=32",
                "--set",
                "scan_map.fwhm_arcmin=1e300",
            ],
            Code(2),
            &["beam FWHM 1e300 arcmin must be between 0 and 10800"],
        ),
        // Corrupt reference cases: FAIL lines naming the file, the run goes on.
        probe(
            &["verify", "--cases", &s(&cases)],
            Code(1),
            &[
                "FAIL  no_such_kernel: ",
                "does not start with the name of a known kernel",
                "FAIL  noise_weight_cut: ",
                "not a readable zip archive",
                "FAIL  noise_weight_not_zip: ",
                "PASS  noise_weight_basic",
                "1 passed, 3 failed",
            ],
        ),
        // Corrupt sky maps: named errors before anything runs.
        sky(&junk, &["junk.fits: not a FITS file"]),
        sky(&cut_header, &["cut_header.fits: truncated: primary header"]),
        sky(
            &cut_data,
            &["cut_data.fits: truncated: table data of HDU 1"],
        ),
        sky(&huge_rows, &["huge_rows.fits", "4294967296"]),
        sky(&huge_nside, &["huge_nside.fits", "536870912"]),
        sky(&odd_nside, &["odd_nside.fits", "bad NSIDE"]),
        // Broken plugin files: skipped with the reason, never fatal.
        probe(
            &["backends"],
            Code(0),
            &[
                "Failed to load (2)",
                "libtoast_backend_junk.so",
                "libtoast_backend_cpu",
            ],
        )
        .env("TOAST_BACKEND_PATH", plugin_dir.clone()),
        probe(
            &["verify", "--backend", "cpu"],
            Code(0),
            &[&format!("{SHIPPED_CASES} passed, 0 failed")],
        )
        .env("TOAST_BACKEND_PATH", plugin_dir.clone()),
        probe(
            &["--backend-path", "/dev/zero", "backends"],
            Code(0),
            &["/dev/zero (explicit, unreadable"],
        ),
        // A full device on standard output: a named error, exit 2.
        probe(
            &["run", "--dry-run"],
            Code(2),
            &["toast-cli: cannot write to standard output: "],
        )
        .stdout(full()),
        probe(
            &["backends"],
            Code(2),
            &["cannot write the listing: cannot write to standard output"],
        )
        .stdout(full()),
        probe(
            &["verify"],
            Code(2),
            &["cannot write the report: cannot write to standard output"],
        )
        .stdout(full()),
        probe(&["--help"], Code(2), &["cannot write to standard output"]).stdout(full()),
        probe(
            &["run", "--help"],
            Code(2),
            &["cannot write to standard output"],
        )
        .stdout(full()),
        probe(
            &["--version"],
            Code(2),
            &["cannot write to standard output"],
        )
        .stdout(full()),
        probe(
            &["bench", "kernels", "--tiny"],
            Code(2),
            &["cannot write to standard output"],
        )
        .stdout(full()),
        // A closed pipe on standard output: a quiet end.
        probe(&["run", "--dry-run"], ClosedPipe, &[]).stdout(StdoutTo::ClosedPipe),
        probe(&["backends"], ClosedPipe, &[]).stdout(StdoutTo::ClosedPipe),
        probe(&["verify"], ClosedPipe, &[]).stdout(StdoutTo::ClosedPipe),
        probe(&["--help"], ClosedPipe, &[]).stdout(StdoutTo::ClosedPipe),
    ];
    let failures: Vec<String> = probes.iter().filter_map(Probe::check).collect();
    assert!(
        failures.is_empty(),
        "{} of {} probes failed:\n\n{}",
        failures.len(),
        probes.len(),
        failures.join("\n\n")
    );
    assert!(
        !Path::new(&out).exists(),
        "nothing may be written on bad input"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A disk that fills while the outputs are written (here a file size limit:
/// a write past it fails with `EFBIG`, as one on a full disk fails with
/// `ENOSPC`): the run fails naming the file, and the previous run's outputs
/// are left as they were, with no temporary.
///
/// An MPI build (`--features mpi`, where CI runs these tests again as
/// one-rank MPI jobs) is not tested here: its `MPI_Init` writes session
/// files past the limit and fails first. The default build runs it.
#[test]
fn a_full_disk_leaves_the_previous_outputs() {
    use std::os::unix::process::CommandExt;
    let help = bin().arg("--help").output().expect("toast-cli --help");
    if String::from_utf8_lossy(&help.stdout).contains("mpi-check") {
        println!("SKIPPED: an MPI build cannot start under a file size limit");
        return;
    }
    let dir = process::scratch("toast-cli-hostile", "full");
    let out = dir.join("out");
    let o = small_run(&out, &[], &[]);
    assert!(o.status.success(), "{}", text(&o));
    let before = contents(&out);
    let mut cmd = bin();
    cmd.args([
        "run",
        "--quiet",
        "--n-det",
        "2",
        "--out-dir",
        out.to_str().unwrap(),
        "--set",
        "sim_satellite.obs_minutes=10",
        "--set",
        "pixels.nside=64",
        "--set",
        "baselines.step_time=60",
    ]);
    // SAFETY: between fork and exec the closure calls only `setrlimit` and
    // `signal`, both async-signal-safe, on the child's own process.
    unsafe {
        cmd.pre_exec(|| {
            // 20 kB: the run's log and pipes are not files; its hit map
            // at nside 64 (196 kB) is the first write past the limit.
            let limit = libc::rlimit {
                rlim_cur: 20_000,
                rlim_max: 20_000,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // A write past the limit fails instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = process::run_with_deadline(cmd, Duration::from_secs(120), "run with a file size limit");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("mapmaker_hits.fits") && t.contains("File too large"),
        "{t}"
    );
    assert!(
        contents(&out) == before,
        "the previous run's outputs changed: {:?}",
        names(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
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
        t.contains("2 value(s) are UNSEEN or an integer column's TNULLn (I 2, Q 0, U 0): scanned as unobserved"),
        "{t}"
    );
    // A map of one column (hits, I alone) is refused by the dry run too:
    // the header says it before any work.
    let hits = dir.join("hits.fits");
    toast_ops::io::fits::write_hits_map(&hits, Ordering::Ring, &vec![1i64; npix], &[]).unwrap();
    for dry in [&["--dry-run"][..], &[]] {
        let mut extra = vec!["--sky-map", hits.to_str().unwrap()];
        extra.extend(dry);
        let o = small_run(&dir.join("out"), &extra, &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{dry:?}: {t}");
        assert!(
            t.contains("1 map column(s), need 3 (I, Q, U)"),
            "{dry:?}: {t}"
        );
    }
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

/// A standard error that cannot be written (a log on a full disk) loses
/// the log's lines, not the run: a debug log of a dry run, and a run whose
/// solve warns (no iterations), end as they would with a working one, the
/// plan printed and the outputs whole (each panicked, exit status 101,
/// when `tracing-subscriber` reported the failed write with `eprintln!`).
#[test]
fn a_failing_standard_error_loses_the_log_not_the_run() {
    let dir = process::scratch("toast-cli-hostile", "stderr-full");
    let out = dir.join("out");
    let small = [
        "--n-det",
        "2",
        "--set",
        "sim_satellite.obs_minutes=10",
        "--set",
        "pixels.nside=32",
    ];
    let dry: Vec<&str> = ["-v", "run", "--dry-run"]
        .into_iter()
        .chain(small)
        .collect();
    let warns: Vec<&str> = [
        "run",
        "--quiet",
        "--no-plot",
        "--set",
        "mapmaker.iter_max=0",
    ]
    .into_iter()
    .chain(small)
    .chain(["--out-dir", out.to_str().unwrap()])
    .collect();
    for (args, says) in [(&dry, "case tiny: 2 detectors"), (&warns, "outputs in:")] {
        // `timeout`: a hang is exit status 124, not a stuck test.
        let o = Command::new("timeout")
            .arg("120")
            .arg(env!("CARGO_BIN_EXE_toast-cli"))
            .args(args)
            .stderr(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {stdout}");
        assert!(stdout.contains(says), "{args:?}: {stdout}");
    }
    for product in ["mapmaker_map.fits", "mapmaker_hits.fits", "stats.json"] {
        assert!(out.join(product).is_file(), "{product}");
    }
}
