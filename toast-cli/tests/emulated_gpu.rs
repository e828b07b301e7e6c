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
use toast_testkit::process::{
    run_sampling_memory, run_with_deadline, scratch, text, SampledMemory,
};

const SETTINGS: &[&str] = &["--quiet", "--no-plot", "--set", "pixels.nside=128"];

fn toast_cli(args: &[&str], lib_dir: Option<&Path>) -> (bool, String) {
    toast_cli_env(args, lib_dir, &[])
}

fn toast_cli_env(args: &[&str], lib_dir: Option<&Path>, env: &[(&str, &str)]) -> (bool, String) {
    let c = toast_cli_command(args, lib_dir, env);
    let o = run_with_deadline(c, Duration::from_secs(600), &format!("toast-cli {args:?}"));
    (o.status.success(), text(&o))
}

fn toast_cli_command(args: &[&str], lib_dir: Option<&Path>, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toast-cli"));
    c.args(args);
    c.envs(env.iter().copied());
    if let Some(d) = lib_dir {
        c.env("LD_LIBRARY_PATH", ld_library_path(d));
    }
    c
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
    // The data movement's debug log: each device scope's per-buffer table.
    let movement_log = [("RUST_LOG", "toast_ops::exec::movement=debug")];
    let c = toast_cli_command(&args, Some(&dir), &movement_log);
    let (o, host) = run_sampling_memory(c, Duration::from_secs(600), &format!("{backend} run"));
    let log = text(&o);
    assert!(o.status.success(), "{backend} run: {log}");
    one_device_scope_keeps_the_timestreams(backend, &log);
    maps_are_the_cpus(backend, &out, cpu);
    kernels_ran_on(backend, &out);
    host_memory_below_the_cpu_run(backend, host, &out, cpu);
}

/// The host memory of the device run in `out` (its resident memory outside
/// the emulated device's shared mappings, sampled while it ran: `host`) is
/// below the peak of the CPU run in `cpu` (`peak_memory_bytes`, VmHWM),
/// and at most 10% above what the run predicted for its host
/// (`predicted_memory_bytes`: on a device plan the host holds no detector
/// sample, `presets::HostRole::BesideDevice`).
fn host_memory_below_the_cpu_run(backend: &str, host: SampledMemory, out: &Path, cpu: &Path) {
    let stats = |dir: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("stats.json")).unwrap()).unwrap()
    };
    let cpu_peak = stats(cpu)["peak_memory_bytes"].as_f64().unwrap();
    let predicted = stats(out)["predicted_memory_bytes"].as_f64().unwrap();
    let measured = host.outside_shmem as f64;
    println!(
        "{backend}: host memory {measured} bytes (sampled {} times; with the emulated device's {} \
         bytes), predicted {predicted}; the CPU run's peak {cpu_peak}",
        host.samples, host.rss
    );
    if host.samples == 0 {
        return; // not Linux: nothing to read
    }
    assert!(
        measured < cpu_peak,
        "{backend}: the device run's host memory {measured} bytes is not below the CPU run's \
         {cpu_peak}"
    );
    assert!(
        measured <= 1.1 * predicted,
        "{backend}: the device run's host memory {measured} bytes exceeds its prediction \
         {predicted} by more than 10%"
    );
}

/// The hits of the run in `out` equal those in `cpu`, its maps to float32
/// rounding.
fn maps_are_the_cpus(backend: &str, out: &Path, cpu: &Path) {
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
}

/// Every pipeline kernel of the run in `out` ran on `backend`, none on the
/// CPU (`timing.csv`).
fn kernels_ran_on(backend: &str, out: &Path) {
    let csv = std::fs::read_to_string(out.join("timing.csv")).unwrap();
    for k in [
        "pointing_detector",
        "pixels_healpix",
        "stokes_weights_IQU",
        "scan_map",
        "build_noise_weighted",
        "fused_accumulate",
        "fused_project",
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
    // No kernel runs on the CPU: no pass reads pointing on the host (the
    // pixel distribution comes from the device's hit submaps, the solver
    // flags and rcond mask are a kernel), so the host expands none.
    let on_cpu: Vec<&str> = csv
        .lines()
        .filter_map(|l| l.split(',').next())
        .filter(|t| t.contains("[cpu]"))
        .collect();
    assert!(
        on_cpu.is_empty(),
        "{backend}: kernels ran on the CPU: {on_cpu:?}\n{csv}"
    );
    assert!(
        csv.contains(&format!(".solver_flags[{backend}]")),
        "{backend}: no solver_flags timed on {backend} in timing.csv:\n{csv}"
    );
}

/// One device scope from the sky scan to the maps: the timestream the scan
/// and the noise make on the device is the map-maker's input there, the
/// pointing and the solver flags are made there: none crosses the bus in
/// either direction (columns of the scope's table: h2d calls, bytes,
/// seconds, d2h calls, bytes, seconds, resets, allocs). The solver's fused
/// device passes make no work timestream at all.
fn one_device_scope_keeps_the_timestreams(backend: &str, log: &str) {
    let scopes = log.matches("closed a device scope").count();
    assert_eq!(
        scopes, 1,
        "{backend}: {scopes} device scopes, not 1:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.split_whitespace().next() == Some("detdata.mapmaker_temp")),
        "{backend}: the solver made a work timestream on the device:\n{log}"
    );
    for buffer in [
        "detdata.signal",
        "detdata.pixels",
        "detdata.weights",
        "detdata.quats",
        "detdata.mapmaker_solve_flags",
    ] {
        let row: Vec<&str> = log
            .lines()
            .find(|l| l.split_whitespace().next() == Some(buffer))
            .unwrap_or_else(|| panic!("{backend}: no {buffer} in the scope's table:\n{log}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            (row[1], row[4]),
            ("0", "0"),
            "{backend}: {buffer} crossed the bus (h2d, d2h calls): {row:?}"
        );
    }
}

#[test]
fn run_on_emulated_cuda_gives_the_cpu_maps() {
    run_gives_the_cpu_maps("cuda");
}

#[test]
fn run_on_emulated_hip_gives_the_cpu_maps() {
    run_gives_the_cpu_maps("hip");
}

/// Why `backend` is unavailable, from the output of `toast-cli backends`.
fn unavailable(list: &str, backend: &str) -> Option<String> {
    list.split("\n\n")
        .find(|b| b.starts_with(&format!("{backend} ")))?
        .lines()
        .find_map(|l| l.trim().strip_prefix("status:    unavailable: "))
        .map(str::to_string)
}

/// The device line of `backend` in the output of `toast-cli backends`.
fn device_line(list: &str, backend: &str) -> String {
    list.split("\n\n")
        .find(|b| b.starts_with(&format!("{backend} ")))
        .and_then(|b| b.lines().find(|l| l.trim_start().starts_with("[0]")))
        .unwrap_or_else(|| panic!("no device of `{backend}` listed:\n{list}"))
        .to_string()
}

/// `toast-cli backends` with `env` set, on the emulated drivers of `dir`.
fn backends_with(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_toast-cli"));
    c.args(args).arg("backends");
    c.env("LD_LIBRARY_PATH", ld_library_path(dir));
    for v in toast_gpu_vars() {
        c.env_remove(v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run_with_deadline(c, Duration::from_secs(120), "toast-cli backends");
    assert!(o.status.success(), "{}", text(&o));
    text(&o)
}

/// What selects a device, cleared so that the test's own environment (an
/// MPI launcher's variables) does not leak in.
/// (The launchers' variables are those of `toast_gpu::NODE_LOCAL_RANK_VARS`.)
fn toast_gpu_vars() -> [&'static str; 8] {
    [
        "TOAST_CUDA_DEVICE",
        "TOAST_HIP_DEVICE",
        "TOAST_GPU_MEM_GB",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "PALS_LOCAL_RANKID",
        "PMI_LOCAL_RANK",
    ]
}

/// The variable that names a plugin's device (`TOAST_CUDA_DEVICE`, ...).
fn env_var_of(backend: &str) -> String {
    format!("TOAST_{}_DEVICE", backend.to_uppercase())
}

fn ranks_spread_over_the_devices(backend: &str) {
    let dir = match library_dir(backend) {
        Ok(d) => d,
        Err(why) => return skip_unless_required(REQUIRE, format!("emulated {backend}: {why}")),
    };
    let two = ("TOAST_EMU_DEVICES", "2");
    let list = backends_with(&dir, &[two], &[]);
    if let Some(reason) = unavailable(&list, backend) {
        return skip_unless_required(REQUIRE, format!("emulated {backend}: {reason}"));
    }
    let opened = |env: &[(&str, &str)], args: &[&str]| {
        let mut e = vec![two];
        e.extend_from_slice(env);
        device_line(&backends_with(&dir, &e, args), backend)
    };
    // No launcher: the default device. Each device has its own UUID
    // (`toastemu`, the API, the ordinal), which `backends` prints.
    let first = opened(&[], &[]);
    assert!(first.contains(" #0"), "{first}");
    let api = format!("{backend:\0<4}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let uuid = |dev: &str| {
        format!(
            "; UUID 746f6173-7465-6d75-{}-{}{dev}000000",
            &api[..4],
            &api[4..]
        )
    };
    assert!(first.ends_with(&uuid("00")), "{first}");
    assert!(opened(&[(&env_var_of(backend), "1")], &[]).ends_with(&uuid("01")));
    // The node-local rank of each launcher picks device rank % 2.
    for (var, rank, dev) in [
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0", " #0"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1", " #1"),
        ("SLURM_LOCALID", "3", " #1"),
        ("MPI_LOCALRANKID", "2", " #0"),
    ] {
        let line = opened(&[(var, rank)], &[]);
        assert!(line.contains(dev), "{var}={rank}: {line}");
    }
    // The documented overrides win: the environment variable, then the
    // plugin option.
    let env_var = env_var_of(backend);
    let line = opened(&[("OMPI_COMM_WORLD_LOCAL_RANK", "1"), (&env_var, "0")], &[]);
    assert!(line.contains(" #0"), "{env_var}=0 wins: {line}");
    let opt = format!("{backend}:device=1");
    let line = opened(
        &[("OMPI_COMM_WORLD_LOCAL_RANK", "0"), (&env_var, "0")],
        &["--backend-options", &opt],
    );
    assert!(line.contains(" #1"), "option device=1 wins: {line}");

    // Under Open MPI's own mpirun (where installed): two ranks, two devices.
    let open_mpi = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if !open_mpi {
        println!("SKIPPED (that part): no Open MPI mpirun");
        return;
    }
    let mut c = Command::new("mpirun");
    // (As root, as CI runs, Open MPI wants to be told.)
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        "2",
        "-x",
        "TOAST_EMU_DEVICES=2",
        "-x",
        "LD_LIBRARY_PATH",
    ]);
    for v in ["TOAST_NVRTC_LIB", "TOAST_HIPRTC_LIB"] {
        if std::env::var_os(v).is_some() {
            c.args(["-x", v]);
        }
    }
    c.arg(env!("CARGO_BIN_EXE_toast-cli")).arg("backends");
    c.env("LD_LIBRARY_PATH", ld_library_path(&dir));
    for v in toast_gpu_vars() {
        c.env_remove(v);
    }
    let o = run_with_deadline(
        c,
        Duration::from_secs(120),
        "mpirun -n 2 toast-cli backends",
    );
    let log = text(&o);
    assert!(o.status.success(), "{log}");
    let name = format!("emulated {} device", backend.to_uppercase());
    let opened: Vec<&str> = log.lines().filter(|l| l.contains(&name)).collect();
    assert!(
        opened.len() == 2
            && opened.iter().any(|l| l.contains(" #0"))
            && opened.iter().any(|l| l.contains(" #1")),
        "two ranks, devices #0 and #1:\n{log}"
    );
}

#[test]
fn node_local_ranks_spread_over_two_emulated_cuda_devices() {
    ranks_spread_over_the_devices("cuda");
}

#[test]
fn node_local_ranks_spread_over_two_emulated_hip_devices() {
    ranks_spread_over_the_devices("hip");
}

/// The emulated driver's directory when `backend` is usable on it; else
/// the test is skipped with the reason (`None`), or fails where the
/// emulators are required.
fn usable_emulated(backend: &str) -> Option<PathBuf> {
    let dir = match library_dir(backend) {
        Ok(d) => d,
        Err(why) => {
            skip_unless_required(REQUIRE, format!("emulated {backend}: {why}"));
            return None;
        }
    };
    let list = backends_with(&dir, &[], &[]);
    if let Some(reason) = unavailable(&list, backend) {
        skip_unless_required(REQUIRE, format!("emulated {backend}: {reason}"));
        return None;
    }
    Some(dir)
}

#[test]
fn a_run_past_the_device_memory_budget_fails_naming_it() {
    let backend = "cuda";
    let Some(dir) = usable_emulated(backend) else {
        return;
    };
    let out = scratch("toast-cli-emulated", "budget").join("out");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--backend",
            backend,
            "--backend-options",
            "cuda:memory=0.01",
            "--out-dir",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(SETTINGS);
        args.extend_from_slice(extra);
        let c = toast_cli_command(&args, Some(&dir), &[]);
        run_with_deadline(c, Duration::from_secs(600), "toast-cli run (budget)")
    };
    // Refused before any work: the predicted device memory passes it.
    let o = run(&[]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains(
            "exceeds its device memory budget of 0.010 GiB = 10737418 bytes (option memory=)"
        ),
        "{log}"
    );
    assert!(!out.exists(), "refused before it made its output directory");
    // The dry run answers the same: exit 2 after the plan, naming the budget.
    let o = run(&["--dry-run"]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("budget 0.010 GiB = 10737418 bytes (option memory=)); does not fit")
            && log.contains(
                "the run would be refused: it does not fit the device memory budget (exit status 2"
            ),
        "{log}"
    );
    assert!(!out.exists(), "a dry run makes no output directory");
    // Run anyway: the plugin refuses the allocation that would pass it.
    let o = run(&["--ignore-memory-check"]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains(
            "out of the device memory budget of 0.010 GiB = 10737418 bytes (option memory=)"
        ) && log.contains("--backend-options cuda:memory=GiB"),
        "{log}"
    );
    assert!(
        !out.join("mapmaker_map.fits").exists(),
        "no outputs from a failed run"
    );
    // A budget that is not a number is refused when the backend starts.
    let c = toast_cli_command(&["backends"], Some(&dir), &[("TOAST_GPU_MEM_GB", "lots")]);
    let o = run_with_deadline(
        c,
        Duration::from_secs(120),
        "toast-cli backends (bad budget)",
    );
    assert!(
        text(&o).contains("TOAST_GPU_MEM_GB: `lots` is not a device memory budget in GiB"),
        "{}",
        text(&o)
    );
}

/// A device memory budget too small for the recomputed pointing of all
/// detectors at once (tiny with 8 detectors, `binner.full_pointing` and
/// `binner.compact_pointing` off, would need 0.21 GiB; the budget is 0.12
/// GiB): the workflow
/// recomputes the pointing on the device per batch of 3 detectors
/// (`device-recomputed-fused`; the scan's sets of 2 detectors and the
/// map-maker's batches of 3, 3 and 2 remake the transient fields with new
/// sizes), the dry run says why, the device peak stays within the budget,
/// nothing per sample crosses the bus (no kernel call copies unstaged data
/// either), every kernel runs on the device, and the maps are the CPU's.
#[test]
fn a_small_device_budget_runs_in_detector_batches_with_the_cpu_maps() {
    budget_run(
        "batches",
        ("cuda:memory=0.12", 128_849_018),
        &[
            // The device's pixel grid (nside 128: 128² submaps of 12 pixels).
            "because pixels.nside_submap = 1 on a device (not given): 16384 submaps of 12 pixels",
            "map-maker plan: device-recomputed-fused (3 detectors a batch)",
            "because the plan device-recomputed-fused (8 detectors a batch) would need 0.21 GiB \
             of device memory on backend cuda, over its budget of 0.120 GiB = 128849018 bytes \
             (option memory=): the pointing is recomputed on the device, 3 detector(s) a batch",
        ],
        ("device-recomputed", 3, "resident"),
        &[
            "--set",
            "binner.full_pointing=false",
            "--set",
            "binner.compact_pointing=false",
        ],
    );
}

/// Compact pointing on a device (`device-compact-fused`, ABI minor 8: the
/// `pixels_healpix` kernel writes the pixels as i32 on the device, 4 bytes
/// a detector sample kept; the fused passes rebuild the weights from the
/// boresight inside their kernels) in a budget too small for its default
/// batches of 8: the workflow keeps it, in batches of 2 for the passes that
/// read pointing fields, with the same guarantees as the recomputed plan
/// (within the budget, nothing per sample on the bus, every kernel on the
/// device, the CPU's maps). Tiny's default, kept pointing, over the same
/// budget becomes this plan too: compact pointing is the least
/// recomputation that fits.
#[test]
fn compact_pointing_on_a_device_runs_in_its_budget_with_the_cpu_maps() {
    budget_run(
        "compact",
        ("cuda:memory=0.12", 128_849_018),
        &[
            "map-maker plan: device-compact-fused (2 detectors a batch)",
            "because the plan device-compact-fused (8 detectors a batch) would need 0.22 GiB of \
             device memory on backend cuda, over its budget of 0.120 GiB",
            "because binner.compact_pointing = true: pixels kept on the device as i32",
        ],
        ("device-compact", 2, "resident"),
        &[
            "--set",
            "binner.full_pointing=false",
            "--set",
            "binner.compact_pointing=true",
        ],
    );
    let Some(dir) = usable_emulated("cuda") else {
        return;
    };
    let mut kept = vec![
        "run",
        "--backend",
        "cuda",
        "--backend-options",
        "cuda:memory=0.12",
    ];
    kept.extend_from_slice(&["--n-det", "8", "--dry-run"]);
    kept.extend_from_slice(SETTINGS);
    let (ok, log) = toast_cli(&kept, Some(&dir));
    assert!(ok, "dry run: {log}");
    for w in [
        "map-maker plan: device-compact-fused (2 detectors a batch)",
        "because the plan device-kept-fused would need 0.21 GiB of device memory on backend \
         cuda, over its budget of 0.120 GiB = 128849018 bytes (option memory=): the pixels are \
         kept compact on the device (i32), the passes run 2 detector(s) a batch",
    ] {
        assert!(
            log.contains(w),
            "kept pointing's dry run: no `{w}` in\n{log}"
        );
    }
}

/// Whatever the budget, a run either fits it or is refused before any work
/// (exit 2, naming its prediction): never out of device memory part way.
/// Tiny with 4 detectors at nside 128, whose small maps leave the peak to
/// the pointing's expansion (the quaternions beside the pixels and
/// weights) and to the noise's FFT workspace, which the device model once
/// left out: budgets of 0.08 to 0.13 GiB passed the check and then ran out
/// in `ScanMap` or `sim_noise`.
#[test]
fn every_budget_fits_or_is_refused_before_any_work() {
    let backend = "cuda";
    let Some(dir) = usable_emulated(backend) else {
        return;
    };
    for gib in [
        "0.04", "0.06", "0.08", "0.10", "0.11", "0.12", "0.13", "0.15",
    ] {
        let out = scratch("toast-cli-emulated", &format!("budget-{gib}")).join("out");
        let option = format!("{backend}:memory={gib}");
        let mut args = vec!["run", "--backend", backend, "--backend-options", &option];
        args.extend_from_slice(&["--n-det", "4", "--out-dir", out.to_str().unwrap()]);
        args.extend_from_slice(SETTINGS);
        let c = toast_cli_command(&args, Some(&dir), &[]);
        let o = run_with_deadline(c, Duration::from_secs(600), &format!("budget {gib}"));
        let log = text(&o);
        assert!(!log.contains("out of memory"), "budget {gib} GiB: {log}");
        match o.status.code() {
            Some(0) => {
                assert!(
                    out.join("mapmaker_map.fits").exists(),
                    "budget {gib} GiB: {log}"
                );
                // The plugin's allocator stayed within it (its peak in MiB
                // rounded up).
                let stats: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(out.join("stats.json")).unwrap())
                        .unwrap();
                let budget = (gib.parse::<f64>().unwrap() * (1u64 << 30) as f64) as u64;
                let held = stats["device_peak_bytes"].as_u64().unwrap();
                assert!(
                    held > 0 && held <= budget.next_multiple_of(1 << 20),
                    "budget {gib} GiB: the allocator held {held} bytes"
                );
            }
            Some(2) => assert!(
                log.contains("predicted device memory") && !out.exists(),
                "budget {gib} GiB: refused, but not before any work: {log}"
            ),
            other => panic!("budget {gib} GiB: exit {other:?}: {log}"),
        }
    }
}

/// A budget too small for even one detector a batch beside the whole
/// detector data (0.06 GiB; 8 detectors' timestream and flags are 29 MB):
/// the detector data are streamed, one detector a batch, each pass staging
/// its rows (the scan's pairs cut to the batch), the device peak within the
/// budget, and the maps the CPU's.
#[test]
fn a_budget_below_the_detector_data_streams_them_with_the_cpu_maps() {
    budget_run(
        "streamed",
        ("cuda:memory=0.06", 64_424_509),
        &[
            "map-maker plan: device-recomputed-fused (1 detectors a batch, detector data \
             streamed)",
            "and one detector a batch beside the whole detector data would too",
            "because binner.stream_detector_data = true",
        ],
        ("device-recomputed", 1, "streamed"),
        &[],
    );
}

/// An emulated device that says it is integrated (`TOAST_EMU_INTEGRATED=1`:
/// ABI minor 9's memory kind, as an APU's runtime says it): `toast-cli
/// backends` says its memory is the host's; the dry run of tiny with 8
/// detectors counts its predicted device peak with the host's, and at the
/// budget where a discrete device streams the detector data (0.06 GiB, the
/// test above), a budget the user set, it streams them too, the host's
/// prediction holding them (under the default budget it would not:
/// toast-ops' `a_device_in_the_host_memory_streams_only_for_a_budget_the_user_set`).
#[test]
fn an_integrated_device_is_counted_with_the_host_and_streams_for_a_set_budget() {
    let Some(dir) = usable_emulated("cuda") else {
        return;
    };
    let env = [("TOAST_EMU_INTEGRATED", "1")];
    let (ok, log) = toast_cli_env(&["backends"], Some(&dir), &env);
    assert!(
        ok && log.contains("emulated CUDA device") && log.contains("(the host's memory)"),
        "{log}"
    );
    let mut dry = vec!["run", "--backend", "cuda", "--n-det", "8", "--dry-run"];
    dry.extend_from_slice(SETTINGS);
    let (ok, log) = toast_cli_env(&dry, Some(&dir), &env);
    assert!(ok, "dry run: {log}");
    for w in [
        "of backend cuda's device in the host's memory)",
        "on backend cuda in the host's memory (counted in the host's check too)",
    ] {
        assert!(log.contains(w), "dry run: no `{w}` in\n{log}");
    }
    dry.extend_from_slice(&["--backend-options", "cuda:memory=0.06"]);
    let (ok, log) = toast_cli_env(&dry, Some(&dir), &env);
    assert!(ok, "dry run at 0.06 GiB: {log}");
    for w in [
        "map-maker plan: device-recomputed-fused (1 detectors a batch, detector data streamed)",
        "on backend cuda in the host's memory (counted in the host's check too)",
    ] {
        assert!(log.contains(w), "dry run at 0.06 GiB: no `{w}` in\n{log}");
    }
    assert!(!log.contains("would be refused"), "{log}");
}

/// A set budget larger than the whole memory of a device with memory of
/// its own is refused when the plugin starts, naming both figures (a plan
/// within it would fail part way); on a device in the host's memory (which
/// may report only a carve-out) it stands.
#[test]
fn a_budget_above_the_devices_own_memory_is_refused() {
    let Some(dir) = usable_emulated("cuda") else {
        return;
    };
    let dry = |env: &[(&str, &str)], budget: &str| {
        let mut args = vec!["run", "--backend", "cuda", "--n-det", "4", "--n-obs", "1"];
        args.extend_from_slice(&["--backend-options", budget, "--dry-run"]);
        toast_cli_env(&args, Some(&dir), env)
    };
    let (ok, log) = dry(&[], "cuda:memory=100");
    assert!(!ok, "{log}");
    assert!(
        log.contains(
            "cuda backend: device memory budget 100.000 GiB = 107374182400 bytes (option \
             memory=) is more than the device holds, 16.000 GiB"
        ),
        "{log}"
    );
    let (ok, log) = dry(&[], "cuda:memory=15");
    assert!(ok, "{log}");
    let (ok, log) = dry(&[("TOAST_EMU_INTEGRATED", "1")], "cuda:memory=100");
    assert!(ok && log.contains("(budget 100.000 GiB"), "{log}");
}

/// A run of tiny with 8 detectors (and the settings `extra`, on the CPU
/// too) on emulated cuda within `budget` (the option and its bytes): the
/// dry run says `want`, the run takes `plan` (fused) with batches of
/// `batch` detectors and its detector data `data` (`resident`,
/// `streamed`), its device peak is within the budget, no kernel call
/// copies unstaged data, every kernel runs on the device, and the maps are
/// the CPU's.
fn budget_run(
    name: &str,
    budget: (&str, u64),
    want: &[&str],
    (plan, batch, data): (&str, u64, &str),
    extra: &[&str],
) {
    let backend = "cuda";
    let Some(dir) = usable_emulated(backend) else {
        return;
    };
    let (option, budget_bytes) = budget;
    let cpu = scratch("toast-cli-emulated", &format!("{name}-cpu")).join("out");
    let out = scratch("toast-cli-emulated", name).join("out");
    fn with<'a>(first: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = first.to_vec();
        args.extend_from_slice(&["--n-det", "8"]);
        args.extend_from_slice(SETTINGS);
        args.extend_from_slice(extra);
        args
    }
    let (ok, log) = toast_cli(
        &with(
            &[
                "run",
                "--backend",
                "cpu",
                "--out-dir",
                cpu.to_str().unwrap(),
            ],
            extra,
        ),
        None,
    );
    assert!(ok, "cpu run: {log}");
    let device = ["run", "--backend", backend, "--backend-options", option];
    let (ok, log) = toast_cli(
        &with(&[&device[..], &["--dry-run"]].concat(), extra),
        Some(&dir),
    );
    assert!(ok, "dry run: {log}");
    for w in want {
        assert!(log.contains(w), "dry run: no `{w}` in\n{log}");
    }
    let movement_log = [("RUST_LOG", "toast_ops::exec::movement=debug")];
    let run = [&device[..], &["--out-dir", out.to_str().unwrap()]].concat();
    let (ok, log) = toast_cli_env(&with(&run, extra), Some(&dir), &movement_log);
    assert!(ok, "{backend} run within {option}: {log}");
    if data == "resident" {
        one_device_scope_keeps_the_timestreams(backend, &log);
    }
    assert!(
        !log.contains("unstaged"),
        "{backend}: a kernel call copied unstaged data:\n{log}"
    );
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("stats.json")).unwrap()).unwrap();
    assert_eq!(stats["execution_plan"]["name"], plan);
    assert_eq!(stats["execution_plan"]["passes"], "fused");
    assert_eq!(stats["execution_plan"]["batch"], batch);
    // A recomputed plan says where its detector data live; the others
    // keep them on the device and say nothing.
    let recorded = &stats["execution_plan"]["data"];
    if plan == "device-recomputed" {
        assert_eq!(recorded, data);
    } else {
        assert!(recorded.is_null() && data == "resident", "{recorded}");
    }
    let peak = stats["device_peak_staged_bytes"].as_u64().unwrap();
    assert!(
        peak > 0 && peak <= budget_bytes,
        "device peak {peak} bytes, budget {budget_bytes}"
    );
    // The model's prediction, checked against the budget before the run,
    // holds what was staged.
    let predicted = stats["predicted_device_memory_bytes"].as_f64().unwrap();
    assert!(
        peak as f64 <= predicted && predicted <= budget_bytes as f64,
        "device peak {peak} bytes, predicted {predicted}, budget {budget_bytes}"
    );
    // The emulated device is a discrete GPU (ABI minor 9's memory kind):
    // not counted in the host's memory.
    assert!(stats["device_in_host_memory"].is_null(), "{backend}");
    // What the plugin's allocator held at most (the staged buffers, the
    // kernels' scratch and the caches; in MiB rounded up): within the
    // budget too.
    let held = stats["device_peak_bytes"].as_u64().unwrap();
    assert!(
        held >= peak && held <= budget_bytes.next_multiple_of(1 << 20),
        "allocator peak {held} bytes, staged {peak}, budget {budget_bytes}"
    );
    // The timestream on the device at the peak: every detector's, or one
    // batch's rows when streamed (360 000 samples of f64 a detector).
    let signal = stats["device_peak_staged_buffers"]["detdata.signal"]
        .as_u64()
        .unwrap_or(0);
    let most = if data == "streamed" { batch } else { 8 };
    assert!(
        signal <= most * 360_000 * 8,
        "{signal} bytes of timestream at the device peak"
    );
    maps_are_the_cpus(backend, &out, &cpu);
    kernels_ran_on(backend, &out);
}

/// A device's `workspace_bytes` smaller than one detector's noise stream
/// (a stream cannot be split) is refused by the dry run, naming the option
/// and the stream's size: the plugin refused it only at the first
/// `sim_noise` call, after the scan. Without noise, or with the default
/// limit (which always holds one stream), the same run plans.
#[test]
fn a_workspace_too_small_for_one_noise_stream_is_refused_before_any_work() {
    let Some(dir) = usable_emulated("cuda") else {
        return;
    };
    let small = [
        "--backend-options",
        "cuda:workspace_bytes=1000",
        "run",
        "--backend",
        "cuda",
        "--n-det",
        "2",
        "--dry-run",
    ];
    let (ok, log) = toast_cli(&small, Some(&dir));
    assert!(!ok, "{log}");
    assert!(
        log.contains(
            "dispatch backend cuda: sim_noise needs 16777232 bytes of device workspace for one \
             detector's noise stream (360000 samples an observation: an FFT of 1048576 points), \
             more than the 1000 bytes a launch may use (the plugin option workspace_bytes)"
        ),
        "{log}"
    );
    let (ok, log) = toast_cli(
        &[&small[..], &["--set", "sim_noise.enabled=false"]].concat(),
        Some(&dir),
    );
    assert!(ok, "{log}");
    let (ok, log) = toast_cli(&small[2..], Some(&dir));
    assert!(ok, "{log}");
}
