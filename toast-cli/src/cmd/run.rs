//! `toast-cli run`: TOAST's satellite simulation and map-making workflow
//! (`toast_benchmark_satellite`), end to end.
//!
//! Phases, each an operator of `toast-ops` timed under its TOAST name:
//! `SimSatellite` → `DefaultNoiseModel` → `ScanHealpixMap` → `SimNoise` →
//! `MapMaker` (destriping, offset template) → outputs.
//!
//! Everything that can be checked is checked before the long work starts
//! (case, configuration, sky map header and nside, output directory); such
//! errors exit with status 2 and a message naming the file, key or value.
//!
//! Outputs in the output directory (TOAST's names): `mapmaker_hits.fits`,
//! `mapmaker_binmap.fits`, `mapmaker_map.fits` (NEST, float32, K, cut
//! pixels 0), `timing.csv`, `stats.json`, `config.toml`, `mapmaker_map.png`.

use crate::config::{self, RunConfig};
use crate::parallel;
use crate::presets::{self, Sizing};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use toast_accel::host::{DispatchPolicy, Dispatcher, Registry};
use toast_core::{comm_of, Comm, CommHandle, Data, ExecContext, Operator, ReduceOp};
use toast_ops::accel::pipeline::{DetectorSets, RunOptions};
use toast_ops::astro::focalplane::benchmark_focalplane;
use toast_ops::dist::{default_group_size, JobDistribution};
use toast_ops::io::fits::{self, Ordering};
use toast_ops::ops::{PixelsHealpix, PointingDetector, PointingOps, StokesWeights};
use toast_ops::pixels::gather_map;
use toast_ops::sim::sky::SkyConfig;
use toast_ops::sim::{
    core_focalplane, DefaultNoiseModel, InputSky, ScanHealpixMap, SimNoise, SimSatellite,
};
use toast_ops::{MapMaker, MapMakerSetup, PixelData};

/// Arguments of `toast-cli run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Workflow size: tiny, xsmall, small, medium, large, xlarge, heroic, or
    /// auto (the largest whose predicted memory fits 80% of MemAvailable).
    #[arg(long, default_value = "tiny")]
    pub case: String,
    /// Output directory.
    #[arg(long = "out-dir", default_value = "toast_out")]
    pub out_dir: PathBuf,
    /// TOML configuration file (a section per operator).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override one parameter: section.key=value (repeatable), e.g.
    /// `--set baselines.step_time=60`, `--set mapmaker.iter_max=50`.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub set: Vec<String>,
    /// Input sky: a HEALPix FITS map (I, Q, U; NEST or RING) of nside
    /// `pixels.nside`; default: the built-in synthetic sky.
    #[arg(long = "sky-map")]
    pub sky_map: Option<PathBuf>,
    /// Run-level backend (dispatch `run=NAME`).
    #[arg(long)]
    pub backend: Option<String>,
    /// Threads (rayon and the CPU plugin); default: all cores, divided
    /// among the processes of an MPI job that share a node.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Override the case's number of detectors (even, ≤ 2054).
    #[arg(long = "n-det")]
    pub n_det: Option<u64>,
    /// Override the case's number of observations.
    #[arg(long = "n-obs")]
    pub n_obs: Option<u64>,
    /// Print the distribution, sample count and predicted memory, and exit.
    /// With `P,PPN`: the plan for P processes with PPN per node (as
    /// `mpirun -n P` would run it), computed without MPI.
    #[arg(long = "dry-run", value_name = "P,PPN", num_args = 0..=1, default_missing_value = "")]
    pub dry_run: Option<String>,
    /// Processes per group (TOAST's `--group_size`): observations are
    /// distributed to groups, detectors to the processes of a group.
    /// Default: TOAST's rule (whole nodes, no more groups than
    /// observations, about 200 detectors per process at most).
    #[arg(long = "group-size")]
    pub group_size: Option<usize>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Skip the PNG plot.
    #[arg(long = "no-plot")]
    pub no_plot: bool,
}

/// `--threads N`: the global rayon pool and the CPU plugin's `threads`
/// option (unless `--backend-options cpu:...` gave one).
pub fn set_threads(n: usize, opts: &mut toast_accel::host::DiscoveryOptions) -> Result<(), String> {
    if n == 0 {
        return Err("--threads 0: must be at least 1".into());
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .map_err(|e| format!("--threads {n}: {e}"))?;
    if opts.options_for("cpu").is_empty() {
        *opts = std::mem::take(opts).with_backend_options("cpu", &format!("threads={n}"));
    }
    Ok(())
}

/// A checked, ready-to-run job.
struct Job {
    case: String,
    sizing: Sizing,
    cfg: RunConfig,
    sky_file: Option<PathBuf>,
    out_dir: PathBuf,
}

/// Read only the header of a HEALPix FITS file and return its NSIDE (cheap:
/// the header blocks of the first extension).
fn sky_header_nside(path: &Path) -> Result<u64, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .map_err(|e| format!("sky map {}: cannot open: {e}", path.display()))?;
    let mut buf = vec![0u8; 2880 * 40];
    let mut n = 0;
    loop {
        let k = f
            .read(&mut buf[n..])
            .map_err(|e| format!("sky map {}: cannot read: {e}", path.display()))?;
        if k == 0 || n + k == buf.len() {
            n += k;
            break;
        }
        n += k;
    }
    if n < 2880 || !buf.starts_with(b"SIMPLE  =") {
        return Err(format!("sky map {}: not a FITS file", path.display()));
    }
    for card in buf[..n - n % 80].chunks_exact(80) {
        if card.starts_with(b"NSIDE   =") {
            let text = String::from_utf8_lossy(&card[10..]);
            let v = text.split('/').next().unwrap_or("").trim();
            return v
                .parse::<u64>()
                .map_err(|_| format!("sky map {}: bad NSIDE card {v:?}", path.display()));
        }
    }
    Err(format!(
        "sky map {}: no NSIDE keyword (not a HEALPix map)",
        path.display()
    ))
}

/// Check everything before any long work (exit 2 on failure).
fn prepare(args: &RunArgs, root: bool) -> Result<Job, String> {
    let known = presets::PRESETS.iter().any(|(n, _)| *n == args.case) || args.case == "auto";
    if !known {
        return Err(format!(
            "unknown case `{}` (known: {})",
            args.case,
            presets::names()
        ));
    }
    let mut table = config::workflow_defaults(&args.case);
    if let Some(p) = &args.config {
        let file = config::read_file(p)?;
        config::merge(&mut table, &file);
    }
    for s in &args.set {
        config::apply_set(&mut table, s)?;
    }
    if let Some(b) = &args.backend {
        config::apply_set(&mut table, &format!("dispatch.run={b}"))?;
    }
    if let Some(p) = &args.sky_map {
        let s = p.display().to_string();
        let sec = table
            .entry("scan_map")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(t) = sec {
            t.insert("file".into(), toml::Value::String(s));
        }
    }
    let cfg = config::build(table)?;
    let nside = cfg.pixels.nside as u64;
    let (case, mut sizing) = if args.case == "auto" {
        let avail =
            presets::mem_available().ok_or("auto: cannot read MemAvailable from /proc/meminfo")?;
        let (n, s) = presets::auto(avail, nside);
        (n.to_string(), s)
    } else {
        (
            args.case.clone(),
            presets::preset(&args.case).expect("checked"),
        )
    };
    if let Some(n) = args.n_det {
        if n == 0 || n % 2 != 0 || n > presets::MAX_DETECTORS {
            return Err(format!(
                "--n-det {n}: must be even, between 2 and {}",
                presets::MAX_DETECTORS
            ));
        }
        sizing.n_det = n;
    }
    if let Some(n) = args.n_obs {
        if n == 0 || n > presets::MAX_OBSERVATIONS {
            return Err(format!(
                "--n-obs {n}: must be between 1 and {}",
                presets::MAX_OBSERVATIONS
            ));
        }
        sizing.n_obs = n;
    }
    // SimSatellite's sampling: 1 + floor(rate (T - 2 µs)) samples per scan.
    let span = cfg.sim_satellite.obs_minutes * 60.0 - 2e-6;
    sizing.samples_per_obs = 1 + (span * 100.0).floor() as u64;
    let sky_file = (!cfg.scan_map.file.is_empty()).then(|| PathBuf::from(&cfg.scan_map.file));
    if let Some(p) = &sky_file {
        if cfg.scan_map.enabled {
            let got = sky_header_nside(p)?;
            if got != nside {
                return Err(format!(
                    "sky map {}: NSIDE = {got}, but pixels.nside = {nside} (the map must match \
                     the pixelization)",
                    p.display()
                ));
            }
        }
    }
    if args.dry_run.is_none() && root {
        std::fs::create_dir_all(&args.out_dir).map_err(|e| {
            format!(
                "output directory {}: cannot create: {e}",
                args.out_dir.display()
            )
        })?;
        let probe = args.out_dir.join(".toast-cli-write-test");
        std::fs::write(&probe, b"ok").map_err(|e| {
            format!(
                "output directory {}: not writable: {e}",
                args.out_dir.display()
            )
        })?;
        let _ = std::fs::remove_file(&probe);
    }
    Ok(Job {
        case,
        sizing,
        cfg,
        sky_file,
        out_dir: args.out_dir.clone(),
    })
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

/// A spinner for one phase (hidden when quiet or not on a terminal).
struct Phases {
    visible: bool,
    bars: indicatif::MultiProgress,
}

impl Phases {
    fn new(quiet: bool) -> Self {
        let visible = !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bars = indicatif::MultiProgress::with_draw_target(if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        Phases { visible, bars }
    }

    fn start(&self, i: usize, n: usize, name: &str) -> ProgressBar {
        let pb = self.bars.add(ProgressBar::new_spinner());
        pb.set_style(
            ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed_precise}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_length(n as u64);
        pb.set_position(i as u64);
        pb.set_message(name.to_string());
        if self.visible {
            pb.enable_steady_tick(Duration::from_millis(120));
        }
        pb
    }
}

/// Run a phase under the timer frame `name`, with a spinner.
fn phase<R>(
    ui: &Phases,
    i: usize,
    name: &str,
    ctx: &mut ExecContext,
    f: impl FnOnce(&mut ExecContext) -> Result<R, String>,
) -> Result<R, String> {
    const N: usize = 6;
    parallel::fault_point(&*comm_of(ctx), name)?;
    let pb = ui.start(i, N, name);
    let t0 = Instant::now();
    ctx.timers.enter(name).map_err(|e| e.to_string())?;
    let r = f(ctx);
    let _ = ctx.timers.exit(name);
    pb.set_position(i as u64 + 1);
    pb.finish_with_message(format!("{name}: {:.2} s", t0.elapsed().as_secs_f64()));
    tracing::info!(
        "{name}: {:.3} s, peak memory so far {}",
        t0.elapsed().as_secs_f64(),
        gib(presets::peak_rss().unwrap_or(0.0))
    );
    r
}

fn op_err(e: toast_core::OpError) -> String {
    e.to_string()
}

/// The workflow; returns the process exit status.
pub fn run(args: &RunArgs, registry: Registry, comm: Arc<dyn Comm>) -> Result<i32, String> {
    let root = comm.rank() == 0;
    let job = prepare(args, root)?;
    let nside = job.cfg.pixels.nside as u64;
    let s = job.sizing;
    let cfg = &job.cfg;
    // The focal plane and the simulation operator fix the distribution.
    let fp = benchmark_focalplane(s.n_det as usize).map_err(|e| format!("focalplane: {e}"))?;
    let fp = Arc::new(core_focalplane(&fp).map_err(op_err)?);
    let mut sim = SimSatellite::new(
        "sim_satellite",
        cfg.sim_satellite.clone(),
        Arc::clone(&fp),
        0,
        s.n_obs as usize,
    )
    .map_err(op_err)?;
    let (n_procs, ppn) = match args.dry_run.as_deref() {
        Some(spec) if !spec.is_empty() => parse_procs(spec)?,
        _ => (comm.size(), procs_per_node(comm.size())),
    };
    sim.group_size = match args.group_size {
        Some(0) => return Err("--group-size 0: must be at least 1".into()),
        Some(g) => g,
        None => default_group_size(n_procs, ppn, s.n_obs as usize, s.n_det),
    };
    let plan = sim.plan(n_procs).map_err(op_err)?;
    let predicted = presets::predicted_memory(s, nside);
    if root {
        println!(
            "case {}: {} detectors ({} pixels) x {} observation(s) of {} samples = {} samples; \
             {} process(es) in {} group(s) of {}, {} thread(s) each; predicted peak memory {} \
             (one process)",
            job.case,
            s.n_det,
            s.n_det / 2,
            s.n_obs,
            s.samples_per_obs,
            s.samples(),
            n_procs,
            plan.n_groups(),
            plan.group_size,
            rayon::current_num_threads(),
            gib(predicted)
        );
    }
    if args.dry_run.is_some() {
        if root {
            print_plan(&plan, &sim, s, nside, ppn);
            if let Some(a) = presets::mem_available() {
                println!("available memory (MemAvailable): {}", gib(a));
            }
            println!("expected total hits: {}", s.samples());
        }
        return Ok(0);
    }
    let t_start = Instant::now();
    let mut policy = DispatchPolicy::new();
    for d in &cfg.dispatch {
        policy.apply(d).map_err(|e| format!("dispatch {d}: {e}"))?;
    }
    // A backend asked for by name must be there and usable: fail before any
    // work rather than silently running elsewhere. (Dispatch still falls
    // back, per kernel, when a named backend lacks that one kernel.)
    for d in &cfg.dispatch {
        let name = d.split_once('=').map_or(d.as_str(), |(_, v)| v.trim());
        registry
            .get(name)
            .map_err(|e| format!("dispatch {d}: {e}"))?;
    }
    let registry = Arc::new(registry);
    let mut ctx = ExecContext::new();
    ctx.insert(Dispatcher::new(Arc::clone(&registry), policy));
    ctx.insert(CommHandle(Arc::clone(&comm)));
    let ui = Phases::new(args.quiet);
    let top = "toast-cli run";
    ctx.timers.enter(top).map_err(|e| e.to_string())?;

    let detsets = sim.detector_sets();
    let mut data = Data::new();
    phase(&ui, 0, "SimSatellite", &mut ctx, |ctx| {
        sim.apply(&mut data, ctx).map_err(op_err)
    })?;
    let mut model = DefaultNoiseModel::new("default_model", cfg.default_model.clone());
    phase(&ui, 1, "DefaultNoiseModel", &mut ctx, |ctx| {
        model.apply(&mut data, ctx).map_err(op_err)
    })?;
    let pointing = || -> Result<PointingOps, String> {
        Ok(PointingOps::new(
            PointingDetector::new("det_pointing", cfg.det_pointing.clone()),
            PixelsHealpix::new("pixels", cfg.pixels.clone(), cfg.det_pointing.clone())
                .map_err(op_err)?,
            StokesWeights::new("weights", cfg.weights.clone(), cfg.det_pointing.clone()),
        ))
    };
    let mut scan_cfg = cfg.scan_map.clone();
    scan_cfg.pixel_dist = cfg.binner.pixel_dist.clone();
    phase(&ui, 2, "ScanHealpixMap", &mut ctx, |ctx| {
        if !scan_cfg.enabled {
            return Ok(());
        }
        let sky = match &job.sky_file {
            Some(p) => InputSky::from_file_on(p, &*comm_of(ctx)).map_err(op_err)?,
            None => InputSky::synthetic_on(
                &SkyConfig {
                    nside,
                    seed: scan_cfg.seed,
                    fwhm_arcmin: scan_cfg.fwhm_arcmin,
                    toast_ring_as_nest: scan_cfg.toast_ring_as_nest,
                    ..SkyConfig::default()
                },
                &*comm_of(ctx),
            )
            .map_err(op_err)?,
        };
        let mut op =
            ScanHealpixMap::new("scan_map", scan_cfg.clone(), pointing()?, sky).map_err(op_err)?;
        op.options = RunOptions {
            detector_sets: DetectorSets::Sets(detsets.clone()),
            ..RunOptions::default()
        };
        op.apply(&mut data, ctx).map_err(op_err)
    })?;
    let mut noise = SimNoise::new("sim_noise", cfg.sim_noise.clone());
    phase(&ui, 3, "SimNoise", &mut ctx, |ctx| {
        noise.apply(&mut data, ctx).map_err(op_err)
    })?;
    let setup = MapMakerSetup {
        name: "mapmaker".into(),
        mapmaker: cfg.mapmaker.clone(),
        baselines: cfg.baselines.clone(),
        binner: cfg.binner.clone(),
        binner_final: None,
        det_pointing: cfg.det_pointing.clone(),
        pixels: cfg.pixels.clone(),
        weights: cfg.weights.clone(),
        pixels_final: None,
    };
    let mut mm = MapMaker::new(setup).map_err(op_err)?;
    let res = phase(&ui, 4, "MapMaker", &mut ctx, |ctx| {
        mm.run(&mut data, ctx).map_err(op_err)
    })?;
    let (t_first, t_last) = time_span(&*comm, &data)?;
    // What each rank really holds (from its data, not from the plan).
    let processes = gather_processes(&*comm, &data, &cfg.binner.pixel_dist)?;
    let stats = phase(&ui, 5, "write outputs", &mut ctx, |ctx| {
        let comm = comm_of(ctx);
        match gather_products(&*comm, &data, &res)? {
            Some(products) => write_outputs(
                &job,
                &products,
                s.n_det as i64,
                (t_first, t_last),
                args.no_plot,
            )
            .map(Some),
            None => Ok(None),
        }
    })?;
    let _ = ctx.timers.exit(top);
    ctx.timers.stop_all();
    let wall = t_start.elapsed().as_secs_f64();
    let communication = communication_times(&*comm, &ctx, res.iterations)?;
    let timer_stats = toast_core::comm::gather_timer_stats(&*comm, &ctx.timers)
        .map_err(|e| format!("gathering timers: {e}"))?;
    let mut peaks = [presets::peak_rss().unwrap_or(0.0); 2];
    let mut walls = [wall];
    comm.allreduce_f64(&mut peaks[..1], ReduceOp::Max)
        .and_then(|_| comm.allreduce_f64(&mut peaks[1..], ReduceOp::Sum))
        .and_then(|_| comm.allreduce_f64(&mut walls, ReduceOp::Max))
        .map_err(|e| format!("gathering statistics: {e}"))?;
    let wall = walls[0];
    let (Some(stats), Some(timer_stats), true) = (stats, timer_stats, root) else {
        // Rank 0 writes every output.
        return Ok(0);
    };
    let csv = job.out_dir.join("timing.csv");
    let write_csv = || -> std::io::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&csv)?);
        toast_core::timing::write_csv(&timer_stats, &mut f)?;
        std::io::Write::flush(&mut f)
    };
    write_csv().map_err(|e| format!("{}: {e}", csv.display()))?;
    std::fs::write(job.out_dir.join("config.toml"), config::to_toml(cfg)?)
        .map_err(|e| format!("{}: {e}", job.out_dir.join("config.toml").display()))?;
    let peak = peaks[0];
    let mut stats = stats;
    stats["processes"] = json!(comm.size());
    stats["group_size"] = json!(plan.group_size);
    stats["mpi"] = json!(comm.describe());
    stats["distribution"] = processes;
    stats["peak_memory_bytes_all_processes"] = json!(peaks[1]);
    stats["communication"] = communication.clone();
    stats["wall_time_s"] = json!(wall);
    stats["peak_memory_bytes"] = json!(peak);
    stats["predicted_memory_bytes"] = json!(predicted);
    stats["cg_iterations"] = json!(res.iterations);
    stats["converged"] = json!(res.converged);
    stats["n_det"] = json!(s.n_det);
    stats["n_obs"] = json!(s.n_obs);
    stats["samples"] = json!(s.samples());
    stats["local_submaps"] = json!(local_submaps(&data, &cfg.binner.pixel_dist));
    if let Ok(d) = data
        .meta
        .object::<Arc<toast_ops::PixelDistribution>>(&cfg.binner.pixel_dist)
    {
        stats["job_hit_submaps"] = json!(d.global_submaps().len());
        stats["shared_submaps"] = json!(d.shared_submaps().len());
    }
    stats["threads"] = json!(rayon::current_num_threads());
    let used = kernel_backends(&ctx);
    let transfers = transfer_summary(&registry, &used);
    stats["transfers"] = transfers
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                json!({
                    "allocs": t.allocs, "alloc_bytes": t.alloc_bytes, "frees": t.frees,
                    "host_to_device_calls": t.h2d_calls, "host_to_device_bytes": t.h2d_bytes,
                    "device_to_host_calls": t.d2h_calls, "device_to_host_bytes": t.d2h_bytes,
                    "resets": t.resets,
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    let text = serde_json::to_string_pretty(&stats).map_err(|e| e.to_string())?;
    std::fs::write(job.out_dir.join("stats.json"), text + "\n")
        .map_err(|e| format!("{}: {e}", job.out_dir.join("stats.json").display()))?;

    // Summary.
    let backends = kernel_backends_line(&used);
    println!("samples:        {}", s.samples());
    println!(
        "total hits:     {} (expected {})",
        stats["totalhits"],
        s.samples()
    );
    println!("wall time:      {wall:.2} s");
    if comm.size() > 1 {
        println!(
            "processes:      {} ({}), {} thread(s) each",
            comm.size(),
            comm.describe(),
            rayon::current_num_threads()
        );
        println!(
            "communication:  {:.3} s map reductions, {:.3} s CG dot products; {:.3} ms per CG \
             iteration (slowest rank)",
            communication["sync_map_s"].as_f64().unwrap_or(0.0),
            communication["dot_allreduce_s"].as_f64().unwrap_or(0.0),
            1e3 * communication["per_cg_iteration_s"].as_f64().unwrap_or(0.0)
        );
    }
    println!("samples/s:      {:.4e}", s.samples() as f64 / wall);
    println!(
        "peak memory:    {} (predicted {}){}",
        gib(peak),
        gib(predicted),
        if comm.size() > 1 {
            format!("; largest process; {} over all processes", gib(peaks[1]))
        } else {
            String::new()
        }
    );
    println!(
        "CG iterations:  {} ({}; {} amplitudes, {} flagged)",
        res.iterations,
        if res.converged {
            "converged"
        } else {
            "not converged"
        },
        res.n_amplitudes,
        res.n_flagged_amplitudes
    );
    println!(
        "map RMS (K):    I {:.6e}  Q {:.6e}  U {:.6e}",
        stats["rms_I"].as_f64().unwrap_or(0.0),
        stats["rms_Q"].as_f64().unwrap_or(0.0),
        stats["rms_U"].as_f64().unwrap_or(0.0)
    );
    println!("kernels:        {backends}");
    for (n, t) in &transfers {
        println!(
            "transfers:      {n}: {} allocs ({}), host->device {} calls / {}, \
             device->host {} calls / {}",
            t.allocs,
            gib(t.alloc_bytes as f64),
            t.h2d_calls,
            gib(t.h2d_bytes as f64),
            t.d2h_calls,
            gib(t.d2h_bytes as f64)
        );
    }
    println!("outputs in:     {}", job.out_dir.display());
    Ok(0)
}

/// `P,PPN` of `--dry-run`.
fn parse_procs(spec: &str) -> Result<(usize, usize), String> {
    let bad = || {
        format!("--dry-run {spec:?}: expected P,PPN (processes, processes per node), e.g. 64,16")
    };
    let (p, n) = spec.split_once(',').ok_or_else(bad)?;
    let p: usize = p.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if p == 0 || n == 0 || p % n != 0 {
        return Err(format!(
            "--dry-run {spec}: P and PPN must be positive and PPN must divide P"
        ));
    }
    Ok((p, n))
}

/// Processes per node of this MPI job (the launcher's local size), or all
/// of them.
fn procs_per_node(size: usize) -> usize {
    parallel::local_size()
        .filter(|&n| size % n == 0)
        .unwrap_or(size)
}

/// The distribution of a (possibly hypothetical) job and the predicted
/// memory of each process.
fn print_plan(plan: &JobDistribution, sim: &SimSatellite, s: Sizing, nside: u64, ppn: usize) {
    let samples = sim.obs_samples().unwrap_or_default();
    let sets = sim.detector_sets();
    let rank_dets: Vec<u64> = plan
        .rank_detsets
        .iter()
        .map(|r| sets[r.clone()].iter().map(|v| v.len() as u64).sum())
        .collect();
    println!(
        "distribution: {} process(es), {} per node ({} node(s)); {} group(s) of {} \
         process(es); detectors split by focal-plane pixel ({} sets)",
        plan.n_procs,
        ppn,
        plan.n_procs / ppn,
        plan.n_groups(),
        plan.group_size,
        sets.len()
    );
    let dets_line: Vec<String> = plan
        .rank_detsets
        .iter()
        .zip(&rank_dets)
        .enumerate()
        .map(|(r, (range, n))| format!("rank {r}: sets {}..{} ({n} det)", range.start, range.end))
        .collect();
    let shown = 8usize;
    if dets_line.len() <= shown {
        println!("  within each group: {}", dets_line.join("; "));
    } else {
        println!(
            "  within each group: {}; ...; {}",
            dets_line[..shown / 2].join("; "),
            dets_line[dets_line.len() - shown / 2..].join("; ")
        );
    }
    let mut worst = 0.0f64;
    let mut total = 0.0f64;
    for (g, obs) in plan.group_obs.iter().enumerate() {
        let time: u64 = samples.get(obs.clone()).map_or(0, |v| v.iter().sum());
        let n_obs = obs.len() as u64;
        let mems: Vec<f64> = rank_dets
            .iter()
            .map(|&nd| {
                presets::predicted_process_memory((nd * time) as f64, time as f64, n_obs, nside)
            })
            .collect();
        let gmax = mems.iter().copied().fold(0.0, f64::max);
        worst = worst.max(gmax);
        total += mems.iter().sum::<f64>();
        if g < shown / 2 || g + shown / 2 >= plan.group_obs.len() {
            println!(
                "  group {g}: observations {}..{} ({n_obs}, {time} samples each detector); \
                 {} detector samples; up to {} per process",
                obs.start,
                obs.end,
                time * rank_dets.iter().sum::<u64>(),
                gib(gmax)
            );
        } else if g == shown / 2 {
            println!("  ...");
        }
    }
    println!(
        "predicted memory: up to {} per process, {} per node ({} processes), {} in all \
         ({} detector samples in all)",
        gib(worst),
        gib(worst * ppn as f64),
        ppn,
        gib(total),
        s.samples()
    );
}

fn local_submaps(data: &Data, key: &str) -> usize {
    data.meta
        .object::<Arc<toast_ops::PixelDistribution>>(key)
        .map(|d| d.n_local_submap())
        .unwrap_or(0)
}

/// `kernel=backend[/backend...]` for each kernel that ran, from the kernel
/// timer names (`operator.kernel[backend]`, the resolved backend).
fn kernel_backends(ctx: &ExecContext) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut map: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for name in ctx.timers.names() {
        if name.starts_with("(function)") {
            continue;
        }
        let Some((head, rest)) = name.split_once('[') else {
            continue;
        };
        let backend = rest.trim_end_matches(']').to_string();
        let kernel = head.rsplit('.').next().unwrap_or(head).to_string();
        let e = map.entry(kernel).or_default();
        if !e.contains(&backend) {
            e.push(backend);
        }
    }
    map
}

/// The `kernel=backend` summary line of [`kernel_backends`].
fn kernel_backends_line(map: &std::collections::BTreeMap<String, Vec<String>>) -> String {
    if map.is_empty() {
        return "none recorded".into();
    }
    map.iter()
        .map(|(k, b)| format!("{k}={}", b.join("/")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Memory traffic of every backend that ran a kernel: allocations, bytes
/// and calls in each direction (all zero for host-addressable backends,
/// whose kernels read host memory in place).
fn transfer_summary(
    registry: &Registry,
    used: &std::collections::BTreeMap<String, Vec<String>>,
) -> Vec<(String, toast_accel::host::TransferSnapshot)> {
    let names: std::collections::BTreeSet<&String> = used.values().flatten().collect();
    names
        .into_iter()
        .filter_map(|n| {
            registry
                .get(n)
                .ok()
                .map(|b| (n.clone(), b.stats().snapshot()))
        })
        .collect()
}

fn time_span(comm: &dyn Comm, data: &Data) -> Result<(f64, f64), String> {
    let mut lo = f64::INFINITY;
    let mut hi = f64::NEG_INFINITY;
    for ob in &data.obs {
        if let Ok(t) = ob.times() {
            if let (Some(a), Some(b)) = (t.first(), t.last()) {
                lo = lo.min(*a);
                hi = hi.max(*b);
            }
        }
    }
    let (mut l, mut h) = ([lo], [hi]);
    comm.allreduce_f64(&mut l, ReduceOp::Min)
        .and_then(|_| comm.allreduce_f64(&mut h, ReduceOp::Max))
        .map_err(|e| format!("time span: {e}"))?;
    Ok((l[0], h[0]))
}

/// Each rank's observations and detectors, as rank 0 receives them (JSON
/// array, one object per rank; `null` on other ranks).
fn gather_processes(
    comm: &dyn Comm,
    data: &Data,
    pixel_dist: &str,
) -> Result<serde_json::Value, String> {
    let obs: Vec<&str> = data.obs.iter().map(|o| o.name()).collect();
    let mut dets: Vec<&str> = Vec::new();
    let mut det_samples = 0u64;
    for o in &data.obs {
        for d in o.local_detectors() {
            if !dets.contains(&d.as_str()) {
                dets.push(d);
            }
        }
        det_samples += (o.local_detectors().len() * o.n_samples()) as u64;
    }
    let mine = json!({
        "rank": comm.rank(),
        "observations": obs,
        "detectors": dets,
        "detector_samples": det_samples,
        "local_submaps": local_submaps(data, pixel_dist),
        "peak_memory_bytes": presets::peak_rss().unwrap_or(0.0),
    });
    let bytes = serde_json::to_vec(&mine).map_err(|e| e.to_string())?;
    let all = comm
        .gather_bytes(0, &bytes)
        .map_err(|e| format!("gathering the distribution: {e}"))?;
    let Some(all) = all else {
        return Ok(serde_json::Value::Null);
    };
    all.iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| format!("distribution record: {e}")))
        .collect::<Result<Vec<serde_json::Value>, _>>()
        .map(serde_json::Value::Array)
}

/// Communication time: the map reductions (`sync_map`) and the CG dot
/// products (`allreduce_dot`), in total and per CG iteration (the
/// reductions inside the solver's left-hand side plus the dot products,
/// over the iterations), the largest over the ranks. Waiting for a slower
/// rank counts as communication, as in any MPI profile.
fn communication_times(
    comm: &dyn Comm,
    ctx: &ExecContext,
    iterations: usize,
) -> Result<serde_json::Value, String> {
    let mut t = [0.0f64; 3];
    for name in ctx.timers.names() {
        let Some(timer) = ctx.timers.get(name) else {
            continue;
        };
        let sec = timer.seconds();
        if name.ends_with(&format!("|{}", toast_ops::pixels::SYNC_TIMER)) {
            t[0] += sec;
            if name.contains("SolverLHS") {
                t[2] += sec;
            }
        } else if name.ends_with(&format!("|{}", toast_ops::mapmaker::DOT_TIMER)) {
            t[1] += sec;
            t[2] += sec;
        }
    }
    comm.allreduce_f64(&mut t, ReduceOp::Max)
        .map_err(|e| format!("communication times: {e}"))?;
    Ok(json!({
        "sync_map_s": t[0],
        "dot_allreduce_s": t[1],
        "cg_s": t[2],
        "per_cg_iteration_s": if iterations > 0 { t[2] / iterations as f64 } else { 0.0 },
    }))
}

/// The map-maker's products, whole, on rank 0.
struct Products {
    hits: PixelData<i64>,
    /// (file name, map, whether it is the destriped map).
    maps: Vec<(&'static str, PixelData<f64>, bool)>,
}

/// Gather the hit map and the binned and destriped maps onto rank 0
/// (`None` on other ranks). Every rank calls it.
fn gather_products(
    comm: &dyn Comm,
    data: &Data,
    res: &toast_ops::MapMakerResult,
) -> Result<Option<Products>, String> {
    let gerr = |k: &str, e: toast_core::OpError| format!("gathering map {k}: {e}");
    let hits = data
        .meta
        .object::<PixelData<i64>>(&res.hits)
        .map_err(|e| format!("map-maker product {}: {e}", res.hits))?;
    let hits = gather_map(comm, hits, 0).map_err(|e| gerr(&res.hits, e))?;
    let mut keys: Vec<(&'static str, &str, bool)> = Vec::new();
    if let Some(b) = &res.binmap {
        keys.push(("mapmaker_binmap.fits", b.as_str(), false));
    }
    keys.push(("mapmaker_map.fits", res.map.as_str(), true));
    let mut maps = Vec::new();
    for (file, key, is_map) in keys {
        let m = data
            .meta
            .object::<PixelData<f64>>(key)
            .map_err(|e| format!("map-maker product {key}: {e}"))?;
        if let Some(full) = gather_map(comm, m, 0).map_err(|e| gerr(key, e))? {
            maps.push((file, full, is_map));
        }
    }
    Ok(hits.map(|hits| Products { hits, maps }))
}

/// Full-sky NEST values of component `k` of a map (zeros elsewhere).
fn full_sky_component(m: &PixelData<f64>, k: usize) -> Vec<f64> {
    let dist = m.distribution();
    let nps = dist.n_pix_submap() as usize;
    let nv = m.n_value();
    let mut out = vec![0.0; (dist.n_submap() as usize) * nps];
    for (ls, &gs) in dist.local_submaps().iter().enumerate() {
        let src = &m.data()[ls * nps * nv..(ls + 1) * nps * nv];
        let dst = &mut out[gs as usize * nps..(gs as usize + 1) * nps];
        for (d, v) in dst.iter_mut().zip(src.chunks_exact(nv)) {
            *d = v[k];
        }
    }
    out
}

fn write_outputs(
    job: &Job,
    products: &Products,
    n_det: i64,
    span: (f64, f64),
    no_plot: bool,
) -> Result<serde_json::Value, String> {
    let dir = &job.out_dir;
    let ferr = |p: &Path, e: fits::FitsError| format!("{}: {e}", p.display());
    let hits = &products.hits;
    let header = fits::toast_extra_header(span.0, span.1, n_det, n_det, "3.0.6");
    let hits_full = hits.to_full_sky();
    let total_hits: i64 = hits_full.iter().sum();
    let p = dir.join("mapmaker_hits.fits");
    fits::write_hits_map(&p, Ordering::Nested, &hits_full, &header).map_err(|e| ferr(&p, e))?;
    let precision = if job.cfg.mapmaker.write_float64 {
        fits::MapPrecision::F64
    } else {
        fits::MapPrecision::F32
    };
    let mut stats = json!({ "case": job.case, "totalhits": total_hits });
    for (file, m, is_map) in &products.maps {
        let comps: Vec<Vec<f64>> = (0..3).map(|k| full_sky_component(m, k)).collect();
        let p = dir.join(file);
        fits::write_iqu_map(
            &p,
            Ordering::Nested,
            [&comps[0], &comps[1], &comps[2]],
            "K",
            precision,
            &header,
        )
        .map_err(|e| ferr(&p, e))?;
        if *is_map {
            // TOAST's MPI-style statistics: all pixels, zeros included, ddof 1.
            let st = m.stats();
            for (k, c) in ["I", "Q", "U"].iter().enumerate() {
                stats[format!("mean_{c}")] = json!(st.mean[k]);
                stats[format!("rms_{c}")] = json!(st.rms[k]);
            }
            if !no_plot {
                let hit: Vec<bool> = hits_full.iter().map(|&h| h > 0).collect();
                let p = dir.join("mapmaker_map.png");
                toast_ops::io::plot::plot_iqu_mollweide(
                    &p,
                    job.cfg.pixels.nside as u64,
                    [&comps[0], &comps[1], &comps[2]],
                    Some(&hit),
                    1200,
                )
                .map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
    }
    if let Some(src) = &job.sky_file {
        stats["sky_map"] = json!(src.display().to_string());
    }
    Ok(stats)
}
