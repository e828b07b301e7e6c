//! `toast-cli run`: TOAST's satellite simulation and map-making workflow
//! (`toast_benchmark_satellite`), end to end, as a thin front-end over
//! [`toast_ops::workflow`].
//!
//! What stays here is what a command line adds: the arguments, the
//! configuration file and `--set` overrides, the `--dry-run` display, the
//! progress spinners, the output directory's layout and the summary.
//! Everything that can be checked is checked before the long work starts
//! (case, configuration, sky map header and nside, output directory); such
//! errors exit with status 2 and a message naming the file, key or value.
//!
//! Outputs (TOAST's names and formats: NEST, float32 unless
//! `mapmaker.write_float64`, cut pixels 0): the maps the `mapmaker`
//! section asks for, in `mapmaker.output_dir` (relative to the output
//! directory, or absolute; default `.`, the output directory itself):
//! `mapmaker_hits.fits` (`write_hits`), `mapmaker_map.fits` (`write_map`),
//! `mapmaker_binmap.fits` (`write_binmap`), `mapmaker_cov.fits`
//! (`write_cov`: the white-noise covariance, columns II, IQ, IU, QQ, QU,
//! UU, K²), `mapmaker_invcov.fits` (`write_invcov`, 1/K²),
//! `mapmaker_rcond.fits` (`write_rcond`), `mapmaker_noiseweighted_map.fits`
//! (`write_noiseweighted_map`, 1/K) and the plot `mapmaker_map.png` (unless
//! `--no-plot`); none with `mapmaker.enabled = false`. In the output
//! directory: `timing.csv`, `config.toml` and `stats.json`, which lists
//! every file of the run (`outputs`). They are written to temporaries and
//! renamed into place at the end, `stats.json` (the mark of a complete run)
//! last (`crate::output`).

use super::backends::human_bytes;
use crate::output::{Staging, Writer};
use crate::parallel;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use toast_accel::host::Registry;
use toast_core::Comm;
use toast_ops::dist::JobDistribution;
use toast_ops::io::fits::{self, Ordering};
use toast_ops::sim::SimSatellite;
use toast_ops::workflow::config::{self, SatelliteConfig};
use toast_ops::workflow::presets::{self, gib, Sizing};
use toast_ops::workflow::{
    FrontEndError, MapProducts, Phases, ProductSink, SatelliteJob, SizeOverrides, PHASES,
};

/// The outermost timer frame of a run (`timing.csv`).
const TIMER_ROOT: &str = "toast-cli run";

/// Arguments of `toast-cli run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Workflow size: tiny, xsmall, small, medium, large, xlarge, heroic, or
    /// auto (the largest whose predicted memory fits 80% of the memory
    /// available, the smallest pick of the job's processes).
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
    /// Print the distribution, sample count and predicted memory, and exit:
    /// 2 where the run would be refused (this node's memory, a device
    /// budget; `--ignore-memory-check` runs it anyway), else 0. With
    /// `P,PPN`: the plan for P processes with PPN per node (as `mpirun -n P`
    /// would run it), computed without MPI, refused only by a device budget.
    #[arg(long = "dry-run", value_name = "P,PPN", num_args = 0..=1, default_missing_value = "")]
    pub dry_run: Option<String>,
    /// Processes per group (TOAST's `--group_size`): observations are
    /// distributed to groups, detectors to the processes of a group.
    /// Default: TOAST's rule (whole nodes, no more groups than
    /// observations, about 200 detectors per process at most).
    #[arg(long = "group-size")]
    pub group_size: Option<usize>,
    /// Run even when the predicted peak memory of the processes on a node
    /// exceeds its available memory (MemAvailable), or, on a device
    /// backend, the predicted device memory of a process exceeds the
    /// backend's device memory budget (`--backend-options NAME:memory=GiB`);
    /// without it such a run is refused before it starts (exit status 2).
    #[arg(long = "ignore-memory-check")]
    pub ignore_memory_check: bool,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
    /// Skip the PNG plot.
    #[arg(long = "no-plot")]
    pub no_plot: bool,
}

/// The largest `P` of `--dry-run P,PPN` (2^24 processes): the plan lists
/// every process, so an absurd `P` would loop for hours.
const MAX_DRY_RUN_PROCS: usize = 1 << 24;

/// `--threads N` (or the default of a process sharing a node): the global
/// rayon pool and the CPU plugin's `threads` option, unless
/// `--backend-options cpu:threads=` gave one (beside an explicit
/// `--threads` the CLI refuses it); other CPU options are kept.
pub fn set_threads(n: usize, opts: &mut toast_accel::host::DiscoveryOptions) -> Result<()> {
    crate::limits::check_threads("--threads", n)?;
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global()
        .with_context(|| format!("--threads {n}"))?;
    if !opts.has_option("cpu", "threads") {
        *opts = crate::cmd::bench::with_threads(std::mem::take(opts), "cpu", Some(n));
    }
    Ok(())
}

/// The largest `--config` file read (a configuration is a few KiB; this
/// stops `--config /dev/zero` from reading forever).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Read a `--config` TOML file.
fn read_config_file(path: &Path) -> Result<toml::Table> {
    use std::io::Read;
    let cannot = || format!("--config {}: cannot read", path.display());
    let mut bytes = Vec::new();
    toast_core::input::open_regular(path)
        .with_context(cannot)?
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(cannot)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        bail!(
            "--config {}: more than {MAX_CONFIG_BYTES} bytes; not a configuration file",
            path.display()
        );
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("--config {}: not UTF-8 text: {e}", path.display()))?;
    text.parse::<toml::Table>()
        .with_context(|| format!("--config {}", path.display()))
}

/// The configuration: the case's defaults < `--config` < `--set` <
/// `--backend`, `--sky-map`.
fn configuration(args: &RunArgs) -> Result<SatelliteConfig> {
    // A flag overrides a configuration file, but two options of the same
    // command line naming one setting leave no way to tell which was meant.
    let set_on_line = |key: &str| {
        args.set
            .iter()
            .find(|s| s.split_once('=').is_some_and(|(k, _)| k.trim() == key))
    };
    for (flag, given, key) in [
        ("--sky-map", args.sky_map.is_some(), "scan_map.file"),
        ("--backend", args.backend.is_some(), "dispatch.run"),
    ] {
        if let Some(s) = set_on_line(key).filter(|_| given) {
            bail!("{flag} and --set {s} both set {key}: give one");
        }
    }
    let mut table = config::workflow_defaults(&args.case);
    if let Some(p) = &args.config {
        config::merge(&mut table, &read_config_file(p)?);
    }
    for s in &args.set {
        config::apply_set(&mut table, s)?;
    }
    if let Some(p) = &args.sky_map {
        let file = toml::Value::String(p.display().to_string());
        let sec = table
            .entry("scan_map")
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        if let toml::Value::Table(t) = sec {
            t.insert("file".into(), file);
        }
    }
    let mut cfg = config::build(table)?;
    if let Some(b) = &args.backend {
        cfg.dispatch.set_run(b).context("--backend")?;
    }
    Ok(cfg)
}

/// The maps directory: `mapmaker.output_dir` relative to the output
/// directory `out_dir` (`.` components dropped), or as given when absolute.
fn maps_dir(out_dir: &Path, output_dir: &str) -> PathBuf {
    let p = Path::new(output_dir);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        let rel: PathBuf = p
            .components()
            .filter(|c| *c != std::path::Component::CurDir)
            .collect();
        out_dir.join(rel)
    }
}

/// Refuse an output directory that is a link to nowhere (dangling, or a
/// loop), said so where `create_dir_all` reports only "File exists". Reads
/// only: the dry run checks it too.
fn check_out_link(dir: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
        if let Err(e) = std::fs::metadata(dir) {
            bail!(
                "output directory {}: a symbolic link that leads to no directory ({e})",
                dir.display()
            );
        }
    }
    Ok(())
}

/// The nearest of `dir` and its ancestors that exists, which must be a
/// directory (refused, naming it, where it is a file or anything else: a
/// directory cannot be made there). Only a path that does not exist, or
/// lies under a file, is passed over: any other failure to look at one (a
/// directory that cannot be searched) is refused, naming it.
fn nearest_existing_dir(dir: &Path) -> Result<PathBuf> {
    // `a_file/` as `a_file` (components drop a trailing slash), so that it
    // is named as the file it is.
    let norm = dir.components().as_path();
    for a in norm.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::symlink_metadata(a) {
            // Missing, or under a file (named as its ancestors are looked at).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                continue
            }
            Err(e) => bail!(
                "output directory {}: cannot create: {}: {e}",
                dir.display(),
                a.display()
            ),
            Ok(_) if a.is_dir() => return Ok(a.to_path_buf()),
            Ok(_) => {
                let what = if a == norm {
                    "it is not a directory".to_string()
                } else {
                    format!("{} is not a directory", a.display())
                };
                bail!("output directory {}: cannot create: {what}", dir.display());
            }
        }
    }
    Ok(PathBuf::from("."))
}

/// Create and remove a file in directory `dir`: whether files can be made
/// there. The file is new (`create_new`: never a file or a link that was
/// there, which a plain write would follow and truncate), named by this
/// process, and removed only if this process made it. Its name is as long
/// as the longest the run writes there ([`crate::output::longest_temporary`]),
/// so a path the system finds too long is refused here, before the work.
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let pid = std::process::id();
    let longest = crate::output::longest_temporary().len();
    let mut last = None;
    for n in 0..8 {
        let name = format!(".toast-cli-probe-{pid}-{n}");
        let probe = dir.join(format!("{name:x<longest$}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
        {
            Ok(_) => {
                let _ = std::fs::remove_file(&probe);
                return Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no probe name was free")))
}

/// The dry run's check of an output directory: what [`check_out_dir`]
/// would refuse, without creating the directory. Its nearest existing
/// ancestor (or itself) must be a directory in which a file can be created
/// ([`probe_writable`]: a mode bit does not tell on a read-only file
/// system, /proc or /sys, or for root).
fn probe_out_dir(dir: &Path) -> Result<()> {
    check_out_link(dir)?;
    let existing = nearest_existing_dir(dir)?;
    probe_writable(&existing).with_context(|| {
        format!(
            "output directory {}: cannot be created or written in {}",
            dir.display(),
            existing.display()
        )
    })
}

/// The paths of the files the run writes in `dir` against the system's
/// limit, checked for both output directories before either is made (a
/// probe in an ancestor does not spell them).
fn check_path_length(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let bytes = dir
            .join(crate::output::longest_temporary())
            .as_os_str()
            .len();
        if bytes >= libc::PATH_MAX as usize {
            bail!(
                "output directory {}: the paths of its files reach {bytes} bytes, over the \
                 system's limit of {} (PATH_MAX)",
                dir.display(),
                libc::PATH_MAX - 1
            );
        }
    }
    Ok(())
}

/// Check that the output directory can be created and written.
fn check_out_dir(dir: &Path) -> Result<()> {
    check_out_link(dir)?;
    nearest_existing_dir(dir)?;
    std::fs::create_dir_all(dir)
        .with_context(|| format!("output directory {}: cannot create", dir.display()))?;
    probe_writable(dir).with_context(|| format!("output directory {}: not writable", dir.display()))
}

/// The phases as spinners (hidden when quiet or not on a terminal), with
/// `TOAST_FAULT_INJECT`'s fault points at each phase's start.
struct Spinners {
    visible: bool,
    bars: indicatif::MultiProgress,
    current: Option<ProgressBar>,
    comm: Arc<dyn Comm>,
}

impl Spinners {
    fn new(quiet: bool, comm: Arc<dyn Comm>) -> Self {
        let visible = !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let bars = indicatif::MultiProgress::with_draw_target(if visible {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        Spinners {
            visible,
            bars,
            current: None,
            comm,
        }
    }
}

impl Phases for Spinners {
    fn start(&mut self, index: usize, name: &str) -> Result<(), FrontEndError> {
        parallel::fault_point(&*self.comm, name)?;
        let pb = self.bars.add(ProgressBar::new_spinner());
        pb.set_style(
            ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} {elapsed_precise}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        pb.set_length(PHASES.len() as u64);
        pb.set_position(index as u64);
        pb.set_message(name.to_string());
        if self.visible {
            pb.enable_steady_tick(Duration::from_millis(120));
        }
        self.current = Some(pb);
        Ok(())
    }

    fn finish(&mut self, index: usize, name: &str, seconds: f64) {
        if let Some(pb) = self.current.take() {
            pb.set_position(index as u64 + 1);
            pb.finish_with_message(format!("{name}: {seconds:.2} s"));
        }
        tracing::info!(
            "{name}: {seconds:.3} s, peak memory so far {}",
            gib(presets::peak_rss().unwrap_or(0.0))
        );
    }
}

/// The output directory's maps: TOAST's file names, NEST, K, and the
/// Mollweide plot of the destriped map, staged (see [`crate::output`]).
struct OutputDir<'a> {
    staging: &'a mut Staging,
    plot: bool,
}

impl ProductSink for OutputDir<'_> {
    fn store(&mut self, job: &SatelliteJob, products: &MapProducts) -> Result<(), FrontEndError> {
        let mm = &job.config.mapmaker;
        // Every map is written from its submaps, without a full-sky copy,
        // and the files are written at the same time (`Staging::write_all`).
        let precision = if mm.write_float64 {
            fits::MapPrecision::F64
        } else {
            fits::MapPrecision::F32
        };
        // TOAST writes the rcond and inverse covariance maps without the
        // map-maker's extra cards (only its CREATED and VERSION).
        let short: Vec<fits::HeaderCard> = products
            .header
            .iter()
            .filter(|c| c.key == "CREATED" || c.key == "VERSION")
            .cloned()
            .collect();
        let mut writers: Vec<(&'static str, Writer<'_>)> = Vec::new();
        if mm.write_hits {
            let hits = fits::ColumnSource::SubmapsI64(products.hits.column(0));
            let header = &products.header;
            writers.push((
                "mapmaker_hits.fits",
                Box::new(move |p| {
                    fits::write_hits_column(p, Ordering::Nested, hits, header)
                        .map_err(|e| e.to_string())
                }),
            ));
        }
        let written = [
            ("mapmaker_rcond.fits", products.rcond.as_ref(), None, &short),
            (
                "mapmaker_invcov.fits",
                products.invcov.as_ref(),
                Some("1 / K2"),
                &short,
            ),
            (
                "mapmaker_binmap.fits",
                products.binmap.as_ref(),
                Some("K"),
                &products.header,
            ),
            (
                "mapmaker_noiseweighted_map.fits",
                products.noiseweighted.as_ref(),
                Some("1 / K"),
                &products.header,
            ),
            (
                "mapmaker_map.fits",
                Some(&products.map).filter(|_| mm.write_map),
                Some("K"),
                &products.header,
            ),
            (
                "mapmaker_cov.fits",
                products.cov.as_ref(),
                Some("K2"),
                &products.header,
            ),
        ];
        for (file, m, unit, header) in written {
            let Some(m) = m else { continue };
            let cols: Vec<fits::ColumnSource<'_>> = (0..m.n_value())
                .map(|k| fits::ColumnSource::SubmapsF64(m.column(k)))
                .collect();
            writers.push((
                file,
                Box::new(move |p| {
                    fits::write_float_columns(p, Ordering::Nested, &cols, unit, precision, header)
                        .map_err(|e| e.to_string())
                }),
            ));
        }
        if self.plot {
            let nside = job.nside();
            writers.push((
                "mapmaker_map.png",
                Box::new(move |p| {
                    // Read by submaps in place: no full-sky copies.
                    let m = &products.map;
                    toast_ops::io::plot::plot_iqu_mollweide_of(
                        p,
                        nside,
                        [&m.column(0), &m.column(1), &m.column(2)],
                        Some(&products.hits.column(0)),
                        1200,
                    )
                    .map_err(|e| e.to_string())
                }),
            ));
        }
        self.staging.write_all(writers)?;
        Ok(())
    }
}

/// The workflow; returns the process exit status.
pub fn run(args: &RunArgs, registry: Registry, comm: Arc<dyn Comm>) -> Result<i32> {
    let root = comm.rank() == 0;
    // A fault point the run has (a phase, or `output NAME`), checked before
    // any work, by the dry run too.
    parallel::check_fault_spec(&*comm, &|p| {
        PHASES.contains(&p)
            || p.strip_prefix("output ")
                .is_some_and(|n| crate::output::OUTPUTS.contains(&n))
    })?;
    let overrides = SizeOverrides {
        n_det: args.n_det,
        n_obs: args.n_obs,
    };
    // Independent runs a launcher started on one node (a task farm) share
    // its memory: the checks count them as processes of the node (not in a
    // dry run for other nodes, `--dry-run P,PPN`, which names its own).
    let farm = match args.dry_run.as_deref() {
        None | Some("") => parallel::independent_runs_on_node(),
        Some(_) => None,
    };
    let config = configuration(args)?;
    // `--case auto`: one preset for every process (a collective), within
    // each one's share of its node where a task farm's runs share it.
    let case = SatelliteJob::agreed_case(&args.case, &config, &*comm, farm.unwrap_or(1))?;
    let mut job = SatelliteJob::new(&case, config, overrides)?;
    // A named backend that cannot start fails the dry run as it fails the
    // run, before any plan is printed.
    job.check_backends(&registry)?;
    let s = job.sizing;
    let mut sim = job.simulation()?;
    // Every field a step reads is made by an earlier step (a field name
    // set to one the workflow never makes fails here, not mid-run).
    job.check_wiring(&sim)?;
    // A device's workspace option holds one detector's noise stream.
    job.check_device_workspace(&sim, &registry)?;
    let (n_procs, ppn) = match args.dry_run.as_deref() {
        Some(spec) if !spec.is_empty() => parse_procs(spec)?,
        _ => (comm.size(), procs_per_node(comm.size())),
    };
    let plan = job.plan(&mut sim, n_procs, ppn, args.group_size)?;
    job.processes_on_node = farm.unwrap_or(ppn);
    // The memory a process may take: agreed by the processes (a
    // collective), or unknown for a plan of other nodes, whose device
    // budget is then the plain default. Read once the pipeline backend has
    // started (asking its device starts it), as its start takes host
    // memory (a CUDA context).
    let shared = job.device_in_host_memory(&registry);
    // The processes of a node that drive one device divide its default
    // budget (more ranks per node than GPUs): counted by the devices'
    // UUIDs over the processes (a collective), or 1 for a plan of other
    // nodes.
    match args.dry_run.as_deref() {
        None | Some("") => {
            job.share_memory_bound(&*comm)?;
            job.share_device(&*comm, &registry)?;
        }
        Some(_) => {
            job.set_memory_bound(None);
        }
    }
    // A device plan gets the device's pixel grid (unless the user set
    // one), and one that does not fit its device memory budget becomes one
    // that does (pixels kept compact, else pointing recomputed, per
    // detector batch), before any work.
    let grid = job.fit_device_pixels(&registry);
    let fitted = job.fit_device_budget(&plan, &sim, &registry)?;
    for why in grid.iter().chain(&fitted) {
        if root && args.dry_run.is_none() {
            tracing::info!("map-maker plan: {why}");
        }
    }
    let execution = job.execution_plan(&registry);
    // The largest process's prediction: the whole job's for one process
    // (the figure the per-group lines and the memory check use).
    let predicted = job.predicted_process_memory(&plan, &sim, &execution);
    // A device plan: its predicted device peak against its backend's budget.
    let device = match job.predicted_device_memory(&plan, &sim, &execution) {
        Some(p) => job
            .device_budget(&plan, &sim, &registry)?
            .map(|(name, b)| (p, name, b)),
        None => None,
    };
    // The run's memory checks, made on every process (the host's takes the
    // smallest memory bound of them): this node's memory, and the device
    // budget on a device plan. A run is refused by a failing one; the dry
    // run reports them.
    let memory_checks = || {
        let host = job.check_memory_on(&*comm, &plan, &sim, &execution, &registry);
        let device = device
            .as_ref()
            .map(|(p, name, budget)| job.check_device_memory(*p, name, *budget, &execution));
        (host, device)
    };
    if args.dry_run.is_none() && !args.ignore_memory_check {
        let (host, device) = memory_checks();
        host?;
        device.transpose()?;
    }
    // Only a job that passed every check creates its output directories;
    // a dry run makes the same checks without creating them (the run would
    // fail them).
    let maps_dir = maps_dir(&args.out_dir, &job.config.mapmaker.output_dir);
    if root {
        let check = |dir: &Path| match args.dry_run {
            None => check_out_dir(dir),
            Some(_) => probe_out_dir(dir),
        };
        // Both directories' path lengths before either is made.
        check_path_length(&args.out_dir)?;
        if job.config.mapmaker.enabled {
            check_path_length(&maps_dir).context("mapmaker.output_dir")?;
        }
        check(&args.out_dir)?;
        if job.config.mapmaker.enabled {
            check(&maps_dir).context("mapmaker.output_dir")?;
        }
        crate::output::check_output_names(&args.out_dir, &maps_dir)?;
    }
    // A device in the host's memory adds its peak to the host's.
    let in_host_memory = match (&device, &shared) {
        (Some((p, name, _)), Some(_)) => {
            format!(
                ", and {} of backend {name}'s device in the host's memory",
                gib(*p)
            )
        }
        _ => String::new(),
    };
    if root {
        crate::outln!(
            "case {}: {} detectors ({} pixels) x {} observation(s) of {}{} samples = {} samples; \
             {} process(es) in {} group(s) of {}, {} thread(s) each; map-maker plan {}; \
             predicted peak memory {} ({}{})",
            job.case,
            s.n_det,
            s.n_det / 2,
            s.n_obs,
            // The simulation's sampling may make some one sample shorter.
            if s.samples_per_det == s.n_obs * s.samples_per_obs {
                ""
            } else {
                "up to "
            },
            s.samples_per_obs,
            s.samples(),
            n_procs,
            plan.n_groups(),
            plan.group_size,
            rayon::current_num_threads(),
            execution,
            gib(predicted),
            if n_procs > 1 {
                "the largest process"
            } else {
                "one process"
            },
            in_host_memory
        )?;
    }
    if args.dry_run.is_some() {
        // Whether the same command without `--dry-run` would be refused
        // (exit 2): by this node's memory (unless the plan is for other
        // nodes, `--dry-run P,PPN`) or by a device budget.
        let this_node = args.dry_run.as_deref() == Some("");
        let (host_fit, device_fit) = memory_checks();
        let mut refused = [
            i64::from(this_node && host_fit.is_err()),
            i64::from(matches!(device_fit, Some(Err(_)))),
        ];
        comm.allreduce_i64(&mut refused, toast_core::ReduceOp::Max)
            .map_err(|e| anyhow::anyhow!("dry run: gathering the memory checks: {e}"))?;
        if root {
            print_plan(&plan, &sim, s, job.nside(), ppn, job.host_role(&execution))?;
            if let Some(n) = farm {
                crate::outln!(
                    "independent runs on this node: {n} (TOAST_INDEPENDENT_RUNS=1; the \
                     launcher's node-local count): the memory check counts them all"
                )?;
            }
            crate::outln!("map-maker plan: {execution}")?;
            for why in grid.iter().chain(&fitted) {
                crate::outln!("  because {why}")?;
            }
            for why in &execution.why {
                crate::outln!("  because {why}")?;
            }
            if let Some(a) = job.memory_bound().filter(|_| this_node) {
                crate::outln!(
                    "available memory: {} a process (bounded by {}); {}",
                    gib(a.bytes),
                    a.source,
                    match &host_fit {
                        Ok(()) => "the processes of a node fit".to_string(),
                        Err(e) => format!("does not fit: {e}"),
                    }
                )?;
            }
            if let (Some((p, name, budget)), Some(fit)) = (&device, &device_fit) {
                let shared = match shared {
                    Some(_) => " in the host's memory (counted in the host's check too)",
                    None => "",
                };
                crate::outln!(
                    "predicted device memory: {} per process on backend {name}{shared} (budget \
                     {budget}); {}",
                    gib(*p),
                    match fit {
                        Ok(()) => "fits".to_string(),
                        Err(e) => format!("does not fit: {e}"),
                    }
                )?;
            }
            crate::outln!("expected total hits: {}", s.samples())?;
        }
        let what: Vec<&str> = [
            (refused[0] > 0, "this node's memory"),
            (refused[1] > 0, "the device memory budget"),
        ]
        .iter()
        .filter(|(r, _)| *r)
        .map(|(_, w)| *w)
        .collect();
        if !what.is_empty() && !args.ignore_memory_check {
            if root {
                crate::outln!(
                    "the run would be refused: it does not fit {} (exit status 2; \
                     --ignore-memory-check runs it anyway)",
                    what.join(" nor ")
                )?;
            }
            return Ok(2);
        }
        return Ok(0);
    }
    let mut spinners = Spinners::new(args.quiet, Arc::clone(&comm));
    // The files the run read, which its commit never removes.
    let inputs = [args.config.clone(), job.sky_file.clone()]
        .into_iter()
        .flatten()
        .collect();
    let mut staging = Staging::new(&args.out_dir, &maps_dir, inputs, Arc::clone(&comm));
    let mut out = OutputDir {
        staging: &mut staging,
        plot: !args.no_plot,
    };
    let outcome = job.run(
        sim,
        registry,
        Arc::clone(&comm),
        TIMER_ROOT,
        &mut spinners,
        &mut out,
    )?;
    // Rank 0 writes every output.
    let Some(outcome) = outcome else {
        return Ok(0);
    };
    let dir = &args.out_dir;
    let mut csv = Vec::new();
    toast_core::timing::write_csv(&outcome.timers, &mut csv)
        .with_context(|| dir.join("timing.csv").display().to_string())?;
    staging.write_bytes("timing.csv", &csv)?;
    staging.write_bytes("config.toml", config::to_toml(&job.config)?.as_bytes())?;
    let stats = &outcome.stats;
    let mut value = serde_json::to_value(stats)?;
    // Every file of this run (stats.json included), as the run names them.
    if let serde_json::Value::Object(m) = &mut value {
        m.insert("outputs".into(), staging.listing().into());
    }
    let text = serde_json::to_string_pretty(&value)?;
    staging.write_bytes("stats.json", (text + "\n").as_bytes())?;
    staging.commit()?;
    print_summary(&job, stats, dir)?;
    Ok(0)
}

/// The closing summary of a run.
fn print_summary(job: &SatelliteJob, st: &toast_ops::workflow::RunStats, dir: &Path) -> Result<()> {
    let s = job.sizing;
    let wall = st.wall_time_s;
    crate::outln!("samples:        {}", s.samples())?;
    if let Some(m) = &st.maps {
        crate::outln!("total hits:     {} (expected {})", m.totalhits, s.samples())?;
    } else {
        crate::outln!("map-making:     skipped (mapmaker.enabled = false): no maps")?;
    }
    crate::outln!("wall time:      {wall:.2} s")?;
    if st.processes > 1 {
        crate::outln!(
            "processes:      {} ({}), {} thread(s) each",
            st.processes,
            st.mpi,
            st.threads
        )?;
        let c = &st.communication;
        crate::outln!(
            "communication:  {:.3} s map reductions, {:.3} s CG dot products; {:.3} ms per CG \
             iteration (slowest rank)",
            c.sync_map_s,
            c.dot_allreduce_s,
            1e3 * c.per_cg_iteration_s
        )?;
    }
    crate::outln!("samples/s:      {:.4e}", s.samples() as f64 / wall)?;
    // A device in the host's memory: its predicted peak is the host's too.
    let with_device = match (&st.device_in_host_memory, st.predicted_device_memory_bytes) {
        (Some(name), Some(d)) => format!(" and {} of backend {name}'s device in it", gib(d)),
        _ => String::new(),
    };
    crate::outln!(
        "peak memory:    {} (predicted {}{with_device}; {:.1} bytes per detector sample){}",
        gib(st.peak_memory_bytes),
        gib(st.predicted_memory_bytes),
        st.bytes_per_det_sample_at_peak,
        if st.processes > 1 {
            format!(
                "; largest process; {} over all processes",
                gib(st.peak_memory_bytes_all_processes)
            )
        } else {
            String::new()
        }
    )?;
    if let Some(m) = &st.maps {
        if m.n_amplitudes == 0 && m.cg_iterations == 0 {
            crate::outln!("CG iterations:  0 (no offset amplitudes to solve for: binned maps)")?;
        } else {
            crate::outln!(
                "CG iterations:  {} ({}; {} amplitudes, {} flagged)",
                m.cg_iterations,
                if m.converged {
                    "converged"
                } else {
                    "not converged"
                },
                m.n_amplitudes,
                m.n_flagged_amplitudes
            )?;
        }
        crate::outln!(
            "map RMS (K):    I {:.6e}  Q {:.6e}  U {:.6e}",
            m.rms_I,
            m.rms_Q,
            m.rms_U
        )?;
    }
    let kernels = if st.kernels.is_empty() {
        "none recorded".to_string()
    } else {
        st.kernels
            .iter()
            .map(|(k, b)| {
                let names: Vec<&str> = b.keys().map(String::as_str).collect();
                format!("{k}={}", names.join("/"))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    crate::outln!("kernels:        {kernels}")?;
    for (n, t) in &st.transfers {
        crate::outln!(
            "transfers:      {n}: {} allocs ({}), host->device {} calls / {}, \
             device->host {} calls / {}",
            t.allocs,
            gib(t.alloc_bytes as f64),
            t.host_to_device_calls,
            gib(t.host_to_device_bytes as f64),
            t.device_to_host_calls,
            gib(t.device_to_host_bytes as f64)
        )?;
    }
    let ph = &st.transfer_phases;
    if ph.total.total_bytes() > 0 {
        let both = |b: &toast_ops::exec::movement::bus::BusBytes| {
            format!(
                "{} up / {} down",
                human_bytes(b.host_to_device_bytes),
                human_bytes(b.device_to_host_bytes)
            )
        };
        crate::outln!(
            "bus per phase:  setup {}; CG {} iterations {} (at most {} per iteration); \
             outputs {}; total {}",
            both(&ph.setup),
            ph.cg_per_iteration.len(),
            both(&ph.cg_total),
            both(&ph.cg_max_per_iteration),
            both(&ph.outputs),
            human_bytes(ph.total.total_bytes())
        )?;
    }
    if let Some(held) = st.device_peak_bytes {
        crate::outln!(
            "device memory:  {} at most, held by the backend's allocator (buffers, kernel \
             scratch, caches; largest over the processes)",
            human_bytes(held)
        )?;
    }
    if st.device_peak_staged_bytes > 0 {
        crate::outln!(
            "device peak:    {} staged at once (one device scope, largest over the processes){}",
            human_bytes(st.device_peak_staged_bytes),
            match st.predicted_device_memory_bytes {
                Some(p) => format!("; predicted {}", human_bytes(p as u64)),
                None => String::new(),
            }
        )?;
        // Process 0's peak by buffer, the largest first.
        let mut at_peak: Vec<_> = st.device_peak_staged_buffers.iter().collect();
        at_peak.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let parts: Vec<String> = at_peak
            .iter()
            .take(8)
            .map(|(name, &bytes)| format!("{name} {}", human_bytes(bytes)))
            .collect();
        if !parts.is_empty() {
            let more = at_peak.len().saturating_sub(parts.len());
            let rest = if more > 0 {
                format!(", {more} more")
            } else {
                String::new()
            };
            crate::outln!("  made of:      {}{rest} (process 0)", parts.join(", "))?;
        }
    }
    crate::outln!("outputs in:     {}", dir.display())?;
    Ok(())
}

/// `P,PPN` of `--dry-run`.
fn parse_procs(spec: &str) -> Result<(usize, usize)> {
    let bad = || {
        anyhow::anyhow!(
            "--dry-run {spec:?}: expected P,PPN (processes, processes per node), e.g. 64,16"
        )
    };
    let (p, n) = spec.split_once(',').ok_or_else(bad)?;
    let p: usize = p.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if p == 0 || n == 0 || !p.is_multiple_of(n) {
        bail!("--dry-run {spec}: P and PPN must be positive and PPN must divide P");
    }
    if p > MAX_DRY_RUN_PROCS {
        bail!("--dry-run {spec}: P = {p} processes; at most {MAX_DRY_RUN_PROCS}");
    }
    Ok((p, n))
}

/// Processes per node of this MPI job (the launcher's local size), or all
/// of them.
fn procs_per_node(size: usize) -> usize {
    toast_accel::launcher::node_local_size()
        .filter(|&n| size.is_multiple_of(n))
        .unwrap_or(size)
}

/// The distribution of a (possibly hypothetical) job and the predicted
/// memory of each process, whose host holds what `role` says.
fn print_plan(
    plan: &JobDistribution,
    sim: &SimSatellite,
    s: Sizing,
    nside: u64,
    ppn: usize,
    role: presets::HostRole,
) -> Result<()> {
    let samples = sim.obs_samples().unwrap_or_default();
    let sets = sim.detector_sets();
    let rank_dets: Vec<u64> = plan
        .rank_detsets
        .iter()
        .map(|r| sets[r.clone()].iter().map(|v| v.len() as u64).sum())
        .collect();
    crate::outln!(
        "distribution: {} process(es), {} per node ({} node(s)); {} group(s) of {} \
         process(es); detectors split by focal-plane pixel ({} sets)",
        plan.n_procs,
        ppn,
        plan.n_procs / ppn,
        plan.n_groups(),
        plan.group_size,
        sets.len()
    )?;
    let dets_line: Vec<String> = plan
        .rank_detsets
        .iter()
        .zip(&rank_dets)
        .enumerate()
        .map(|(r, (range, n))| format!("rank {r}: sets {}..{} ({n} det)", range.start, range.end))
        .collect();
    let shown = 8usize;
    if dets_line.len() <= shown {
        crate::outln!("  within each group: {}", dets_line.join("; "))?;
    } else {
        crate::outln!(
            "  within each group: {}; ...; {}",
            dets_line[..shown / 2].join("; "),
            dets_line[dets_line.len() - shown / 2..].join("; ")
        )?;
    }
    let mut worst = 0.0f64;
    let mut total = 0.0f64;
    for (g, obs) in plan.group_obs.iter().enumerate() {
        let time: u64 = samples.get(obs.clone()).map_or(0, |v| v.iter().sum());
        let n_obs = obs.len() as u64;
        let mems: Vec<f64> = rank_dets
            .iter()
            .map(|&nd| {
                presets::predicted_process_memory(
                    (nd * time) as f64,
                    time as f64,
                    n_obs,
                    nside,
                    role,
                )
            })
            .collect();
        let gmax = mems.iter().copied().fold(0.0, f64::max);
        worst = worst.max(gmax);
        total += mems.iter().sum::<f64>();
        if g < shown / 2 || g + shown / 2 >= plan.group_obs.len() {
            crate::outln!(
                "  group {g}: observations {}..{} ({n_obs}, {time} samples each detector); \
                 {} detector samples; up to {} per process",
                obs.start,
                obs.end,
                time * rank_dets.iter().sum::<u64>(),
                gib(gmax)
            )?;
        } else if g == shown / 2 {
            crate::outln!("  ...")?;
        }
    }
    crate::outln!(
        "predicted memory: up to {} per process, {} per node ({} processes), {} in all \
         ({} detector samples in all)",
        gib(worst),
        gib(worst * ppn as f64),
        ppn,
        gib(total),
        s.samples()
    )?;
    Ok(())
}
