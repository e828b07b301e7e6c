//! `toast-cli run --backend cuda|hip` on the emulated drivers of
//! `toast-gpu-emu` (no GPU): the whole workflow through the real plugins,
//! staging and all, must give the CPU's maps (hits identical, maps equal to
//! float32 rounding) with every kernel timed on the GPU backend.
//!
//! The tiny case with a coarser map (nside 128) keeps each run to seconds.
//! Without the emulator library or the run-time compiler the tests print
//! `SKIPPED: emulated <backend>: <reason>`, unless
//! `TOAST_REQUIRE_EMULATED_GPU` is set (CI), where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use toast_testkit::emulated::{ld_library_path, library_dir, REQUIRE};
use toast_testkit::maps::compare_maps;
use toast_testkit::plugins::skip_unless_required;
use toast_testkit::process::{run_with_deadline, scratch, text};

const SETTINGS: &[&str] = &["--quiet", "--no-plot", "--set", "pixels.nside=128"];

fn toast_cli(args: &[&str], lib_dir: Option<&Path>) -> (bool, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toast-cli"));
    c.args(args);
    if let Some(d) = lib_dir {
        c.env("LD_LIBRARY_PATH", ld_library_path(d));
    }
    let o = run_with_deadline(c, Duration::from_secs(600), &format!("toast-cli {args:?}"));
    (o.status.success(), text(&o))
}

/// The reference: the same run on the CPU, once per test binary.
fn cpu_run() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = scratch("toast-cli-emulated", "cpu").join("out");
        let mut args = vec![
            "run",
            "--backend",
            "cpu",
            "--out-dir",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(SETTINGS);
        let (ok, log) = toast_cli(&args, None);
        assert!(ok, "cpu run: {log}");
        out
    })
}

fn run_gives_the_cpu_maps(backend: &str) {
    let dir = match library_dir(backend) {
        Ok(d) => d,
        Err(why) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {why}")),
    };
    // The backend must be usable on the emulator (else the run would fall
    // back to the CPU): `backends` says why not.
    let (ok, list) = toast_cli(&["backends"], Some(&dir));
    assert!(ok, "{list}");
    let block = list
        .split("\n\n")
        .find(|b| b.starts_with(&format!("{backend} ")))
        .unwrap_or_else(|| panic!("`{backend}` is not listed:\n{list}"));
    if let Some(reason) = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("status:    unavailable: "))
    {
        return skip_unless_required(REQUIRE, format!("emulated {backend}: {reason}"));
    }
    assert!(
        block.contains("emulated"),
        "not the emulated device:\n{block}"
    );

    let cpu = cpu_run();
    let out = scratch("toast-cli-emulated", backend).join("out");
    let mut args = vec![
        "run",
        "--backend",
        backend,
        "--out-dir",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(SETTINGS);
    let (ok, log) = toast_cli(&args, Some(&dir));
    assert!(ok, "{backend} run: {log}");

    let hits = compare_maps(
        &out.join("mapmaker_hits.fits"),
        &cpu.join("mapmaker_hits.fits"),
    );
    assert!(
        hits.iter().all(|&d| d == 0.0),
        "{backend}: the hit maps differ from the CPU's"
    );
    for f in ["mapmaker_map.fits", "mapmaker_binmap.fits"] {
        let rel = compare_maps(&out.join(f), &cpu.join(f));
        println!("{backend} vs cpu, {f}: max |diff| / max |cpu| per field {rel:?}");
        assert!(
            rel.iter().all(|&r| r <= f64::from(f32::EPSILON)),
            "{backend}: {f} differs from the CPU's beyond float32 rounding: {rel:?}"
        );
    }
    let csv = std::fs::read_to_string(out.join("timing.csv")).unwrap();
    for k in [
        "pointing_detector",
        "pixels_healpix",
        "stokes_weights_IQU",
        "scan_map",
        "build_noise_weighted",
        "noise_weight",
        "template_offset_add_to_signal",
        "template_offset_project_signal",
        "template_offset_apply_diag_precond",
        "cov_apply_diag",
        "sim_noise",
    ] {
        assert!(
            csv.contains(&format!(".{k}[{backend}]")),
            "{backend}: no {k} timed on {backend} in timing.csv:\n{csv}"
        );
    }
    // The host expands its own pointing for its passes (pixel
    // distribution, solver flags, covariance) rather than copying the
    // device's back: only the pointing kernels run on the CPU too.
    let host_pointing = [
        "det_pointing.pointing_detector[cpu]",
        "pixels.pixels_healpix[cpu]",
        "weights.stokes_weights_IQU[cpu]",
    ];
    let fell_back: Vec<&str> = csv
        .lines()
        .filter_map(|l| l.split(',').next())
        .filter(|t| t.contains("[cpu]") && !host_pointing.contains(t))
        .collect();
    assert!(
        fell_back.is_empty(),
        "{backend}: kernels fell back to the CPU: {fell_back:?}\n{csv}"
    );
}

#[test]
fn run_on_emulated_cuda_gives_the_cpu_maps() {
    run_gives_the_cpu_maps("cuda");
}

#[test]
fn run_on_emulated_hip_gives_the_cpu_maps() {
    run_gives_the_cpu_maps("hip");
}
