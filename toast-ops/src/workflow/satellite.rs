//! The satellite job: TOAST's `toast_benchmark_satellite` from a checked
//! configuration to gathered map products and run statistics.
//!
//! A [`SatelliteJob`] is built and checked before any long work
//! ([`SatelliteJob::new`]: case, sizes, configuration, the sky map's
//! header); [`SatelliteJob::simulation`] and [`SatelliteJob::plan`] give
//! the distribution without running anything (what `--dry-run` prints);
//! [`SatelliteJob::check_memory_on`] refuses a plan whose largest
//! process's predicted memory (its device's too, where that is in the
//! host's memory) does not fit its share of the node's memory
//! ([`SatelliteJob::share_memory_bound`]);
//! [`SatelliteJob::run`] runs the phases, each timed under its TOAST name,
//! and returns a [`SatelliteRun`]:
//!
//! `SimSatellite` → `DefaultNoiseModel` → `ScanHealpixMap` → `SimNoise` →
//! `MapMaker` → `write outputs`.
//!
//! On a device run the synthetic sky is synthesised on a background thread
//! from the run's start ([`crate::sim::SkySynthesis`]) and waited for by the
//! scan after its pointing (`ScanHealpixMap.sky` in `timing.csv`: the wait
//! and the assembly; the synthesis's own seconds are `sky synthesis
//! (background)`, beside the phases). A host run synthesises it in its
//! scan. Its settings are checked by [`SatelliteJob::new`].
//!
//! The front-end supplies two things: a [`Phases`] observer (progress
//! display, fault injection for tests) and a [`ProductSink`], to which
//! rank 0 hands the gathered maps inside the `write outputs` phase, so the
//! file layout is the front-end's while the time it takes is in the run's
//! timers.

use super::config::{ConfigError, SatelliteConfig};
use super::presets::{self, gib, Sizing};
use crate::astro::focalplane::benchmark_focalplane;
use crate::dist::{default_group_size, JobDistribution};
use crate::exec::movement::bus::{BusBytes, CgTransfers};
use crate::exec::movement::{close_scope, open_scope};
use crate::exec::pipeline::{pipeline_backend, pipeline_backend_in, DetectorSets, RunOptions};
use crate::io::fits;
use crate::mapmaker::{ExecutionPlan, KernelFacts, Plan, PlanFacts};
use crate::math::healpix::Nside;
use crate::ops::{PixelsHealpix, PointingDetector, PointingOps, StokesWeights};
use crate::pixels::{gather_map, PixelData, PixelDistribution, SYNC_TIMER};
use crate::sim::sky::{check_sky_config, SkyConfig};
use crate::sim::{
    core_focalplane, DefaultNoiseModel, InputSky, ScanHealpixMap, ScannedSky, SimNoise,
    SimSatellite, SkySource, SkySynthesis,
};
use crate::{MapMaker, MapMakerConfig, MapMakerResult, MapMakerSetup};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use toast_accel::abi::Kernel;
use toast_accel::budget::{noise_stream_doubles, Budget, BudgetSource, WorkspaceLimit};
use toast_accel::host::{
    DeviceSummary, DispatchPolicy, Dispatcher, KernelLog, Registry, TransferSnapshot,
    DEFAULT_BACKEND,
};
use toast_core::num::compact;
use toast_core::{
    comm_of, Comm, CommHandle, Data, ExecContext, OpError, Operator, ReduceOp, Requirements,
};

/// The benchmark focal plane's sample rate (Hz).
const SAMPLE_RATE: f64 = 100.0;

/// The most detector samples (and samples of any one count derived from
/// the sizes: baseline step, mission length in µs) a job may have: 2^53,
/// below which every sample index is exact as `f64` and far from `i64`'s
/// overflow in the kernels' index arithmetic.
pub const MAX_SAMPLES: u64 = 1 << 53;

/// The sizes the configuration derives, checked before any work: each
/// observation's samples (the simulation's own sampling,
/// `SimSatelliteConfig::schedule`: at least 2), total detector samples, the
/// mission's length in µs and the baseline step (`rint(step_time · rate)`
/// samples), each at most [`MAX_SAMPLES`]; errors name the option and
/// value. Sets `sizing`'s sample counts.
fn check_sizes(config: &SatelliteConfig, sizing: &mut Sizing) -> Result<(), WorkflowError> {
    let limit = MAX_SAMPLES as f64;
    let sat = &config.sim_satellite;
    // Bounds first, from the lengths alone (an observation holds about
    // rate x its length samples): the schedule is laid out in i64 µs and
    // the sampling in usize samples, which these keep far from overflow.
    let per_obs = (sat.obs_minutes * 60.0 * SAMPLE_RATE).floor() + 1.0;
    let total = sizing.n_det as f64 * sizing.n_obs as f64 * per_obs;
    if total > limit {
        return Err(WorkflowError::BadSize {
            option: "sim_satellite.obs_minutes",
            value: compact(sat.obs_minutes),
            reason: format!(
                "{} detector(s) x {} observation(s) x {per_obs:.3e} samples ({SAMPLE_RATE} Hz) \
                 exceed {MAX_SAMPLES} detector samples",
                sizing.n_det, sizing.n_obs
            ),
        });
    }
    let mission_us = (sat.obs_minutes + sat.gap_minutes) * 60e6 * sizing.n_obs as f64;
    if mission_us > limit {
        let (option, value) = if sat.gap_minutes > sat.obs_minutes {
            ("sim_satellite.gap_minutes", sat.gap_minutes)
        } else {
            ("sim_satellite.obs_minutes", sat.obs_minutes)
        };
        return Err(WorkflowError::BadSize {
            option,
            value: compact(value),
            reason: format!(
                "{} observation(s) of obs_minutes + gap_minutes = {} min last {mission_us:.3e} \
                 µs, more than {MAX_SAMPLES} µs (285 years)",
                sizing.n_obs,
                compact(sat.obs_minutes + sat.gap_minutes)
            ),
        });
    }
    let too_short = |samples: u64| WorkflowError::BadSize {
        option: "sim_satellite.obs_minutes",
        value: compact(sat.obs_minutes),
        reason: format!(
            "an observation holds {samples} sample(s) at {SAMPLE_RATE} Hz; it needs at least 2 \
             (obs_minutes of about {} or more)",
            compact((1.0 / SAMPLE_RATE + 2e-6) / 60.0)
        ),
    };
    // Shorter than a sample: the schedule's scans would stop before their
    // first sample.
    if per_obs < 2.0 {
        return Err(too_short(per_obs.max(0.0) as u64));
    }
    // The counts themselves: what the simulation will lay out.
    let (_, layout) = sat
        .schedule(sizing.n_obs as usize, SAMPLE_RATE)
        .map_err(super::config::ConfigError::from)?;
    let counts = layout.iter().map(|l| l.n_samples as u64);
    let shortest = counts.clone().min().unwrap_or(0);
    if shortest < 2 {
        return Err(too_short(shortest));
    }
    sizing.samples_per_obs = counts.clone().max().unwrap_or(0);
    sizing.samples_per_det = counts.sum();
    if sizing.samples() > MAX_SAMPLES {
        return Err(WorkflowError::BadSize {
            option: "sim_satellite.obs_minutes",
            value: compact(sat.obs_minutes),
            reason: format!(
                "{} detector(s) x {} samples of {} observation(s) ({SAMPLE_RATE} Hz) exceed \
                 {MAX_SAMPLES} detector samples",
                sizing.n_det, sizing.samples_per_det, sizing.n_obs
            ),
        });
    }
    // The last observation ends within the Earth's ephemeris (ERFA epv00,
    // to 2100-01-01 12:00 TT; the start's year is checked with the
    // configuration).
    let end_year = crate::sim::EPHEMERIS_YEARS.end() + 1;
    let ephemeris_end_us = crate::astro::scan_strategy::unix_us_from_civil(end_year, 1, 1, 0, 0, 0);
    if let Ok(start_us) = sat.mission_start_us() {
        // The last observation's end: the mission less its trailing gap.
        let last_end_us = mission_us - sat.gap_minutes * 60e6;
        if start_us as f64 + last_end_us > ephemeris_end_us as f64 {
            return Err(WorkflowError::BadSize {
                option: "sim_satellite.mission_start",
                value: sat.mission_start.clone(),
                reason: format!(
                    "its {} observation(s) of obs_minutes + gap_minutes = {} min end after \
                     {end_year}-01-01, where the Earth's ephemeris (ERFA epv00) ends",
                    sizing.n_obs,
                    compact(sat.obs_minutes + sat.gap_minutes)
                ),
            });
        }
    }
    // A rotation faster than two samples aliases: the scan is noise (and a
    // subnormal period's rate overflowed to infinity, NaN pointing).
    let nyquist_minutes = 2.0 / SAMPLE_RATE / 60.0;
    for (option, period) in [
        ("sim_satellite.spin_period", sat.spin_period),
        ("sim_satellite.prec_period", sat.prec_period),
    ] {
        if period < nyquist_minutes {
            return Err(WorkflowError::BadSize {
                option,
                value: compact(period),
                reason: format!(
                    "a rotation in less than two samples at {SAMPLE_RATE} Hz: the period must be \
                     at least {} min",
                    compact(nyquist_minutes)
                ),
            });
        }
    }
    let step_time = config.baselines.step_time;
    let step = (step_time * SAMPLE_RATE).round_ties_even();
    if !(step >= 1.0 && step <= limit) {
        return Err(WorkflowError::BadSize {
            option: "baselines.step_time",
            value: compact(step_time),
            reason: format!(
                "a step of {step:.3e} samples at {SAMPLE_RATE} Hz; must be between 1 and \
                 {MAX_SAMPLES} samples (a step longer than an observation gives it one \
                 baseline)"
            ),
        });
    }
    Ok(())
}

/// Why the workflow stopped: what was being done, and the cause.
#[derive(Debug, thiserror::Error)]
pub enum WorkflowError {
    /// A case name that is not a preset (nor `auto`).
    #[error("unknown case `{case}` (known: {known})", known = presets::names())]
    UnknownCase { case: String },
    /// A size or process count out of range (`option` names the setting).
    #[error("{option} {value}: {reason}")]
    BadSize {
        option: &'static str,
        value: String,
        reason: String,
    },
    /// The configuration.
    #[error(transparent)]
    Config(#[from] super::config::ConfigError),
    /// The input sky map file.
    #[error("sky map {}: {reason}", path.display())]
    SkyMap { path: PathBuf, reason: String },
    /// A step of the workflow reads an item that no earlier step provides
    /// (a field name set to one the workflow does not make).
    #[error(
        "{step}: reads {category} `{name}`, which no earlier step of the workflow provides \
         ({category} before it: {before})"
    )]
    Wiring {
        /// The configuration section of the step.
        step: String,
        /// The kind of item.
        category: toast_core::Category,
        /// Its name.
        name: String,
        /// The items of that kind provided before the step, comma-separated.
        before: String,
    },
    /// A dispatch setting that names no usable backend.
    #[error("dispatch {setting}: {reason}")]
    Dispatch { setting: String, reason: String },
    /// The map-maker's solve diverged (a non-finite residual): `input`
    /// names what was scanned into the timestream it solved.
    #[error(
        "MapMaker: the solve diverged on {input}: {source}; values that large overflow the \
         solve: check that input"
    )]
    Diverged {
        /// The sky that was scanned, and its largest absolute value.
        input: String,
        #[source]
        source: Box<OpError>,
    },
    /// A phase (operator) failed.
    #[error("{phase}: {source}")]
    Phase {
        phase: String,
        #[source]
        source: Box<OpError>,
    },
    /// The front-end stopped a phase (its observer or product sink).
    #[error("{0}")]
    FrontEnd(#[source] FrontEndError),
    /// A collective across the processes, or gathering a result, failed.
    #[error("{what}: {reason}")]
    Gather { what: String, reason: String },
    /// The predicted peak memory of a process exceeds its share of the
    /// memory available on its node ([`SatelliteJob::check_memory`]).
    #[error(
        "predicted peak memory {} of a process{} exceeds the available memory of a process, \
         {} ({processes} process(es) on this node), bounded by {bound}; reduce the case, \
         --n-det, --n-obs or pixels.nside, or pass --ignore-memory-check to run anyway",
        gib(*predicted), device_share(device), gib(*available)
    )]
    Memory {
        /// Predicted bytes of the largest process, its device's included
        /// where that is in the host's memory.
        predicted: f64,
        /// Of them, the backend and the device peak of a device in the
        /// host's memory.
        device: Option<(String, f64)>,
        /// Processes on the node.
        processes: usize,
        /// Available bytes for a process (its share).
        available: f64,
        /// What bounds them (`sysinfo::MemoryBound::source`).
        bound: String,
    },
    /// The predicted device peak of a process exceeds the device memory
    /// budget of the pipeline backend
    /// ([`SatelliteJob::check_device_memory`]).
    #[error(
        "predicted device memory {} of the map-maker's plan {plan} on backend {backend} exceeds \
         its device memory budget of {budget}; reduce the case, --n-det, --n-obs or \
         pixels.nside, run more processes, raise the budget (--backend-options \
         {backend}:memory=GiB, or TOAST_GPU_MEM_GB; on a device in the host's memory, a budget \
         set so also lets the detector data be streamed), or run on the cpu backend",
        gib(*predicted)
    )]
    DeviceMemory {
        /// Predicted device bytes of the largest process.
        predicted: f64,
        /// The pipeline backend.
        backend: String,
        /// The map-maker's plan.
        plan: String,
        /// The budget, with where it came from.
        budget: toast_accel::budget::Budget,
    },
}

/// The words of [`WorkflowError::Memory`] for a device in the host's memory.
fn device_share(device: &Option<(String, f64)>) -> String {
    match device {
        Some((name, bytes)) => format!(
            " (with {} for backend {name}'s device, whose memory is the host's)",
            gib(*bytes)
        ),
        None => String::new(),
    }
}

impl WorkflowError {
    fn phase(phase: &str) -> impl Fn(OpError) -> WorkflowError + '_ {
        move |source| WorkflowError::Phase {
            phase: phase.to_string(),
            source: Box::new(source),
        }
    }
    fn gather(what: impl Into<String>, reason: impl std::fmt::Display) -> WorkflowError {
        WorkflowError::Gather {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

/// What names a process's device among the processes of a job: its node
/// and its UUID (ABI minor 10, the same whatever visible-device list gives
/// the device its ordinal); empty (counted alone) for a device whose plugin
/// cannot tell its UUID (an older plugin, an OpenCL driver without
/// `cl_khr_device_uuid`): identical GPUs of a node cannot be told apart
/// then, and counting them as one would quarter the budget of four ranks
/// on four GPUs.
pub fn device_key(node: &str, device: &DeviceSummary) -> Vec<u8> {
    let Some(uuid) = device.identity else {
        return Vec::new();
    };
    let mut key = format!("{node}\0").into_bytes();
    key.extend_from_slice(&uuid);
    key
}

/// For each process's [`device_key`] (empty: no device), the processes
/// with the same key, itself included (1 for no device). Linear in the
/// processes (a job may have tens of thousands).
pub fn processes_per_device(keys: &[Vec<u8>]) -> Vec<usize> {
    let mut count: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
    for k in keys.iter().filter(|k| !k.is_empty()) {
        *count.entry(k).or_default() += 1;
    }
    keys.iter()
        .map(|k| count.get(k.as_slice()).copied().unwrap_or(1))
        .collect()
}

/// This node's name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`; empty
/// where neither tells, which counts every process of the job as one
/// node's: more sharing, never less).
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Size overrides of a case (TOAST's benchmark has none; ours are for
/// tests and scaling studies).
#[derive(Debug, Clone, Copy, Default)]
pub struct SizeOverrides {
    /// Detectors (even, at most [`presets::MAX_DETECTORS`]).
    pub n_det: Option<u64>,
    /// Observations (at most [`presets::MAX_OBSERVATIONS`]).
    pub n_obs: Option<u64>,
}

/// A checked, ready-to-run job.
#[derive(Debug, Clone)]
pub struct SatelliteJob {
    /// The case name (`auto` resolved to the preset it picked).
    pub case: String,
    /// Detectors, observations and samples.
    pub sizing: Sizing,
    /// The configuration.
    pub config: SatelliteConfig,
    /// The input sky map, when one is configured (`scan_map.file`).
    pub sky_file: Option<PathBuf>,
    /// The processes (or a task farm's independent runs) that share this
    /// node's memory, 1 unless the front-end sets it before
    /// [`SatelliteJob::fit_device_budget`]: the host memory check counts
    /// them all, and a device in the host's memory gets this process's
    /// share of what they leave ([`SatelliteJob::device_budget`]).
    pub processes_on_node: usize,
    /// The most processes of a node that drive one device, the same on
    /// every process: 1 unless [`SatelliteJob::share_device`] counted them
    /// (by node and device UUID). The default device budget and
    /// `TOAST_GPU_MEM_GB` (each GPU's memory, as TOAST defines it) are
    /// divided among them ([`SatelliteJob::device_budget`]), so that more
    /// ranks per node than GPUs do not together plan past a device's
    /// memory.
    pub processes_on_device: usize,
    /// This node's memory bound, read once ([`SatelliteJob::memory_bound`]).
    memory_bound: std::sync::OnceLock<Option<presets::MemoryBound>>,
    /// TOAST's `TOAST_GPU_MEM_GB` as it was when the job was made (unset or
    /// blank: `None`): the device memory budget where the backend's
    /// `memory=` option sets none ([`SatelliteJob::device_budget`]). Read
    /// once, so that planning does not read the environment; a test may
    /// set it. The plugins read the variable itself: a value set here that
    /// differs plans by a budget their pools do not hold (give the budget
    /// as the backend's `memory=` option to set both).
    pub gpu_mem_gb: Option<String>,
}

/// An error of the front-end's [`Phases`] or [`ProductSink`], whatever its
/// type.
pub type FrontEndError = Box<dyn std::error::Error + Send + Sync>;

/// The phases of [`SatelliteJob::run`], in order.
pub const PHASES: [&str; 6] = [
    "SimSatellite",
    "DefaultNoiseModel",
    "ScanHealpixMap",
    "SimNoise",
    "MapMaker",
    "write outputs",
];

/// What a front-end hears of the phases.
pub trait Phases {
    /// Phase `index` of [`PHASES`] starts; an error stops the run there.
    fn start(&mut self, index: usize, name: &str) -> Result<(), FrontEndError>;
    /// Phase `index` ended after `seconds`.
    fn finish(&mut self, index: usize, name: &str, seconds: f64);
}

/// A [`Phases`] that shows nothing.
#[derive(Debug, Default)]
pub struct Silent;

impl Phases for Silent {
    fn start(&mut self, _: usize, _: &str) -> Result<(), FrontEndError> {
        Ok(())
    }
    fn finish(&mut self, _: usize, _: &str, _: f64) {}
}

/// The map-maker's products, whole (every submap), on rank 0. The hits
/// and the destriped map are always there (the run's statistics read
/// them); the others when the configuration asks for them
/// (`mapmaker.write_binmap`, `write_cov`, `write_invcov`, `write_rcond`,
/// `write_noiseweighted_map`). Whether the hits and the map are written is
/// the sink's to read (`write_hits`, `write_map`).
#[derive(Debug)]
pub struct MapProducts {
    /// Hits per pixel.
    pub hits: PixelData<i64>,
    /// The binned map of the raw timestream.
    pub binmap: Option<PixelData<f64>>,
    /// The destriped map.
    pub map: PixelData<f64>,
    /// The white-noise covariance: per pixel the upper triangle of the
    /// `nnz × nnz` matrix, row by row (II, IQ, IU, QQ, QU, UU).
    pub cov: Option<PixelData<f64>>,
    /// The inverse covariance, packed as `cov`.
    pub invcov: Option<PixelData<f64>>,
    /// The reciprocal condition number of each pixel's covariance.
    pub rcond: Option<PixelData<f64>>,
    /// The noise-weighted destriped map.
    pub noiseweighted: Option<PixelData<f64>>,
    /// TOAST's extra FITS header cards (time span, detector counts).
    pub header: Vec<fits::HeaderCard>,
}

/// Where rank 0 puts the gathered products (the front-end's file layout).
pub trait ProductSink {
    /// Store the products; an error fails the run.
    fn store(&mut self, job: &SatelliteJob, products: &MapProducts) -> Result<(), FrontEndError>;
}

/// Communication time of a distributed run (the largest over the ranks).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Communication {
    /// Map reductions across processes (`sync_map`).
    pub sync_map_s: f64,
    /// CG dot-product allreduces.
    pub dot_allreduce_s: f64,
    /// Both, inside the CG iterations.
    pub cg_s: f64,
    /// `cg_s` per CG iteration.
    pub per_cg_iteration_s: f64,
}

/// Memory traffic of one backend (see `toast_accel::host::TransferSnapshot`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Transfers {
    pub allocs: u64,
    pub alloc_bytes: u64,
    pub frees: u64,
    pub host_to_device_calls: u64,
    pub host_to_device_bytes: u64,
    pub device_to_host_calls: u64,
    pub device_to_host_bytes: u64,
    pub resets: u64,
}

impl From<TransferSnapshot> for Transfers {
    fn from(t: TransferSnapshot) -> Self {
        Transfers {
            allocs: t.allocs,
            alloc_bytes: t.alloc_bytes,
            frees: t.frees,
            host_to_device_calls: t.h2d_calls,
            host_to_device_bytes: t.h2d_bytes,
            device_to_host_calls: t.d2h_calls,
            device_to_host_bytes: t.d2h_bytes,
            resets: t.resets,
        }
    }
}

/// What crossed the bus in each phase of the run, on this process (rank 0
/// in `stats.json`), summed over the loaded backends ([`BusBytes`]): the
/// `setup` before the first CG iteration (simulation, pointing, hits and
/// covariances, the right-hand side), each CG iteration, and the `outputs`
/// after the last one (the final binning and the maps). All zero on a
/// host-addressable backend (the CPU), which copies nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TransferPhases {
    /// Before the first CG iteration.
    pub setup: BusBytes,
    /// All CG iterations together.
    pub cg_total: BusBytes,
    /// The CG iteration that moved the most bytes (both ways together).
    pub cg_max_per_iteration: BusBytes,
    /// Each CG iteration, in order.
    pub cg_per_iteration: Vec<BusBytes>,
    /// After the last CG iteration.
    pub outputs: BusBytes,
    /// The whole run (`setup + cg_total + outputs`).
    pub total: BusBytes,
}

impl TransferPhases {
    /// The phases of a run whose counters were `start` when it began and
    /// `end` when it ended, with the solver's accounting (`None`: no solve,
    /// everything is setup and outputs are nothing).
    pub fn new(start: BusBytes, end: BusBytes, cg: Option<&CgTransfers>) -> Self {
        let total = end.since(start);
        let Some(cg) = cg else {
            return TransferPhases {
                setup: total,
                total,
                ..TransferPhases::default()
            };
        };
        let cg_max_per_iteration = cg
            .per_iteration
            .iter()
            .copied()
            .max_by_key(BusBytes::total_bytes)
            .unwrap_or_default();
        TransferPhases {
            setup: cg.before.since(start),
            cg_total: cg.after.since(cg.before),
            cg_max_per_iteration,
            cg_per_iteration: cg.per_iteration.clone(),
            outputs: end.since(cg.after),
            total,
        }
    }
}

/// What one process held, from its own data (not from the plan).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct ProcessRecord {
    pub rank: usize,
    pub observations: Vec<String>,
    pub detectors: Vec<String>,
    pub detector_samples: u64,
    pub local_submaps: usize,
    pub peak_memory_bytes: f64,
}

/// TOAST's map statistics of the destriped map (all pixels, zeros
/// included, ddof 1) and how the solve ended.
#[derive(Debug, Clone, Serialize)]
#[allow(non_snake_case)] // TOAST's statistic names
pub struct MapSummary {
    pub totalhits: i64,
    pub mean_I: f64,
    pub mean_Q: f64,
    pub mean_U: f64,
    pub rms_I: f64,
    pub rms_Q: f64,
    pub rms_U: f64,
    pub cg_iterations: usize,
    pub converged: bool,
    pub n_amplitudes: usize,
    pub n_flagged_amplitudes: usize,
}

/// The run's statistics (`stats.json`): the map statistics ([`MapSummary`],
/// absent when `mapmaker.enabled = false`) and what the run cost.
#[derive(Debug, Clone, Serialize)]
pub struct RunStats {
    pub case: String,
    /// Whether the map-maker ran (`mapmaker.enabled`).
    pub mapmaker_enabled: bool,
    /// The map-maker's execution plan, with the reasons (absent when it
    /// did not run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_plan: Option<Plan>,
    #[serde(flatten)]
    pub maps: Option<MapSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sky_map: Option<String>,
    pub processes: usize,
    pub group_size: usize,
    pub mpi: String,
    pub distribution: Vec<ProcessRecord>,
    pub peak_memory_bytes_all_processes: f64,
    pub communication: Communication,
    pub wall_time_s: f64,
    pub peak_memory_bytes: f64,
    /// Peak resident memory per detector sample: the peaks of all
    /// processes summed, over the job's detector samples.
    pub bytes_per_det_sample_at_peak: f64,
    /// The predicted peak of the largest process (as `peak_memory_bytes`
    /// is measured): the whole job's for one process.
    pub predicted_memory_bytes: f64,
    pub n_det: u64,
    pub n_obs: u64,
    pub samples: u64,
    pub local_submaps: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_hit_submaps: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_submaps: Option<usize>,
    pub threads: usize,
    /// Per backend that ran a kernel.
    pub transfers: BTreeMap<String, Transfers>,
    /// What crossed the bus per phase (setup, CG iterations, outputs).
    pub transfer_phases: TransferPhases,
    /// The most device memory the staged buffers of one device scope held
    /// at once, in bytes, the largest over the processes (0 on a
    /// host-addressable backend). The plugins' small argument copies and
    /// scratch are not in it; they are within the plugin's device memory
    /// budget (`--backend-options NAME:memory=GiB`).
    pub device_peak_staged_bytes: u64,
    /// The device memory the backend's allocator held at once at most
    /// (every buffer, the kernels' scratch and the small-argument cache;
    /// the plugin's measurement, in bytes rounded up to a MiB), the
    /// largest over the processes; within the device memory budget (to the
    /// MiB it is rounded up to). Absent on a host-addressable backend, or
    /// with a plugin that does not tell (built before ABI minor 7).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_bytes: Option<u64>,
    /// The device peak the run predicted for its largest process
    /// ([`SatelliteJob::predicted_device_memory`], against which its
    /// budget was checked): to set beside `device_peak_staged_bytes`.
    /// Absent on a host plan.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_device_memory_bytes: Option<f64>,
    /// The backend whose device allocates from the host's memory
    /// ([`SatelliteJob::device_in_host_memory`]): the host's peak then
    /// holds the device's too, beside `predicted_memory_bytes`. Absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_in_host_memory: Option<String>,
    /// What made up process 0's device peak: its live staged buffers'
    /// bytes per name (`detdata.signal`, `global.mapmaker_solve_cov`, ...,
    /// summed over the observations) at that moment; empty on a
    /// host-addressable backend.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub device_peak_staged_buffers: BTreeMap<String, u64>,
    /// Which backend ran each kernel: calls and seconds.
    #[serde(skip)]
    pub kernels: KernelLog,
}

/// The pointing mode of `config` for the memory estimate.
fn pointing_of(config: &SatelliteConfig) -> presets::Pointing {
    presets::Pointing {
        full: config.binner.full_pointing,
        compact: config.binner.compact_pointing,
        batch: config.binner.pointing_batch as u64,
    }
}

/// The outcome of [`SatelliteJob::run`] on rank 0 (other ranks get `None`).
#[derive(Debug)]
pub struct SatelliteRun {
    /// The statistics.
    pub stats: RunStats,
    /// The timers of all processes, combined as TOAST's `gather_timers`.
    pub timers: Vec<toast_core::TimerStats>,
}

/// `--case auto` where a process cannot read its memory.
fn auto_unreadable() -> WorkflowError {
    WorkflowError::BadSize {
        option: "--case",
        value: "auto".into(),
        reason: "cannot read MemAvailable from /proc/meminfo".into(),
    }
}

impl SatelliteJob {
    /// The preset `--case auto` resolves to for a job of `config` in which
    /// every process of `comm` takes part, the same on each: each takes
    /// the largest preset whose predicted memory fits 80% of its own
    /// memory bound (its share of the node's where `runs_on_node`
    /// independent runs share it, [`presets::process_share`]), and all
    /// take the smallest of their picks (a collective). Read apart, as
    /// [`SatelliteJob::new`] reads it for one process, processes on nodes
    /// with different free memory would run different cases of one job.
    /// The ranks of one MPI job on a node hold that job's data between
    /// them, so each compares the job's prediction with its node's whole
    /// bound (their copies of the maps are left to the memory check that
    /// follows); a task farm's runs each hold a whole job, so each takes
    /// its share. Any other `case` is returned as it is, with no
    /// collective.
    pub fn agreed_case(
        case: &str,
        config: &SatelliteConfig,
        comm: &dyn Comm,
        runs_on_node: usize,
    ) -> Result<String, WorkflowError> {
        if case != "auto" {
            return Ok(case.to_string());
        }
        let own = presets::process_share(&presets::memory_bounds(), runs_on_node).map(|b| {
            let (name, _) = presets::auto(b.bytes, config.pixels.nside.get(), pointing_of(config));
            presets::PRESETS
                .iter()
                .position(|(n, _)| *n == name)
                .unwrap_or(0) as i64
        });
        let mut pick = [own.unwrap_or(-1)];
        comm.allreduce_i64(&mut pick, ReduceOp::Min)
            .map_err(|e| WorkflowError::gather("--case auto", e))?;
        usize::try_from(pick[0])
            .ok()
            .and_then(|i| presets::PRESETS.get(i))
            .map(|(name, _)| name.to_string())
            .ok_or_else(auto_unreadable)
    }

    /// Check a job: the case (`auto`: the largest preset whose predicted
    /// memory fits 80% of `MemAvailable`), the overrides, and the sky map's
    /// header against `pixels.nside`.
    pub fn new(
        case: &str,
        config: SatelliteConfig,
        overrides: SizeOverrides,
    ) -> Result<Self, WorkflowError> {
        let nside = config.pixels.nside.get();
        let (case, mut sizing) = if case == "auto" {
            let avail = presets::memory_bound().ok_or_else(auto_unreadable)?.bytes;
            let (n, s) = presets::auto(avail, nside, pointing_of(&config));
            (n.to_string(), s)
        } else {
            let s = presets::preset(case).ok_or_else(|| WorkflowError::UnknownCase {
                case: case.to_string(),
            })?;
            (case.to_string(), s)
        };
        if let Some(n) = overrides.n_det {
            if n == 0 || n % 2 != 0 || n > presets::MAX_DETECTORS {
                return Err(WorkflowError::BadSize {
                    option: "--n-det",
                    value: n.to_string(),
                    reason: format!("must be even, between 2 and {}", presets::MAX_DETECTORS),
                });
            }
            sizing.n_det = n;
        }
        if let Some(n) = overrides.n_obs {
            if n == 0 || n > presets::MAX_OBSERVATIONS {
                return Err(WorkflowError::BadSize {
                    option: "--n-obs",
                    value: n.to_string(),
                    reason: format!("must be between 1 and {}", presets::MAX_OBSERVATIONS),
                });
            }
            sizing.n_obs = n;
        }
        check_sizes(&config, &mut sizing)?;
        let sky_file =
            (!config.scan_map.file.is_empty()).then(|| PathBuf::from(&config.scan_map.file));
        if let Some(p) = &sky_file {
            if config.scan_map.enabled {
                let got = sky_header_nside(p)?;
                if got != nside {
                    return Err(WorkflowError::SkyMap {
                        path: p.clone(),
                        reason: format!(
                            "NSIDE = {got}, but pixels.nside = {nside} (the map must match the \
                             pixelization)"
                        ),
                    });
                }
            }
        } else if config.scan_map.enabled {
            // The synthetic sky's settings, before any work: its synthesis
            // may start with the run, and would fail only at the scan.
            check_sky_config(&sky_config(&config)).map_err(|e| ConfigError::Section {
                section: "scan_map".into(),
                reason: e.to_string(),
            })?;
        }
        Ok(SatelliteJob {
            case,
            sizing,
            config,
            sky_file,
            processes_on_node: 1,
            processes_on_device: 1,
            memory_bound: std::sync::OnceLock::new(),
            gpu_mem_gb: std::env::var("TOAST_GPU_MEM_GB")
                .ok()
                .filter(|v| !v.trim().is_empty()),
        })
    }

    /// The map resolution.
    pub fn nside(&self) -> u64 {
        self.config.pixels.nside.get()
    }

    /// Predicted peak memory of one process running the whole job on
    /// `execution`.
    pub fn predicted_memory(&self, execution: &Plan) -> f64 {
        presets::predicted_memory(self.sizing, self.nside(), self.host_role(execution))
    }

    /// How the map-maker holds the pointing, for the memory estimate.
    pub fn pointing(&self) -> presets::Pointing {
        pointing_of(&self.config)
    }

    /// What the host holds on `execution`, for the memory estimate: the
    /// map-maker's data and pointing on a host plan; on a device plan the
    /// time samples, the sky and the products on the device's grid, and
    /// the detector data only where they are streamed or come back.
    pub fn host_role(&self, execution: &Plan) -> presets::HostRole {
        if execution.host() {
            presets::HostRole::MapMaker(self.pointing())
        } else {
            // Without one device scope from the scan to the maps (the
            // map-maker or the scan off) the timestream comes back.
            let cfg = &self.config;
            presets::HostRole::BesideDevice {
                grid: self.device_grid(),
                detector_data: execution.streams_detector_data()
                    || !cfg.mapmaker.enabled
                    || !cfg.scan_map.enabled,
            }
        }
    }

    /// The pixel grid of a device run, for its memory models.
    fn device_grid(&self) -> presets::DeviceGrid {
        presets::DeviceGrid {
            nside: self.nside(),
            nside_submap: self.config.pixels.nside_submap.get(),
            nnz: self.config.weights.mode.nnz() as u64,
        }
    }

    /// The map-maker's execution plan for a run with the backends of
    /// `registry` (the one [`SatelliteJob::run`] takes: the same decision,
    /// [`Plan::choose`], from the same facts).
    pub fn execution_plan(&self, registry: &Registry) -> Plan {
        plan_of(&self.config, registry, &self.config.dispatch)
    }

    /// Predicted peak memory of the largest process of `plan` (`sim` as
    /// [`SatelliteJob::plan`] left it) on `execution`;
    /// [`SatelliteJob::predicted_memory`] for one process.
    pub fn predicted_process_memory(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        execution: &Plan,
    ) -> f64 {
        let role = self.host_role(execution);
        let samples = sim.obs_samples().unwrap_or_default();
        let sets = sim.detector_sets();
        let mut worst = 0.0f64;
        for obs in &plan.group_obs {
            let time: u64 = samples.get(obs.clone()).map_or(0, |v| v.iter().sum());
            for r in &plan.rank_detsets {
                let n_det: u64 = sets[r.clone()].iter().map(|v| v.len() as u64).sum();
                let m = presets::predicted_process_memory(
                    (n_det * time) as f64,
                    time as f64,
                    obs.len() as u64,
                    self.nside(),
                    role,
                );
                worst = worst.max(m);
            }
        }
        worst
    }

    /// The device memory model of each process of `plan` (`sim` as
    /// [`SatelliteJob::plan`] left it) on the device plan `execution`
    /// (whose unfused passes make a work timestream), with its number of
    /// detectors: one per group's observations and rank's detector sets.
    fn device_memory_models(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        execution: &Plan,
    ) -> Vec<(presets::DeviceMemory, u64)> {
        let samples = sim.obs_samples().unwrap_or_default();
        let sets = sim.detector_sets();
        let grid = self.device_grid();
        let mut models = Vec::new();
        for obs in &plan.group_obs {
            let time: u64 = samples.get(obs.clone()).map_or(0, |v| v.iter().sum());
            for r in &plan.rank_detsets {
                let n_det: u64 = sets[r.clone()].iter().map(|v| v.len() as u64).sum();
                let model = presets::DeviceMemory::of(
                    (n_det * time) as f64,
                    time as f64,
                    obs.len() as u64,
                    grid,
                    !execution.device_fused(),
                );
                models.push((model, n_det));
            }
        }
        models
    }

    /// Predicted peak of the staged device buffers of the largest process of
    /// `plan` on a device execution plan (`None` on a host plan; see
    /// `presets`, "Device memory estimate").
    pub fn predicted_device_memory(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        execution: &Plan,
    ) -> Option<f64> {
        if execution.host() {
            return None;
        }
        // Recomputed pointing all at once holds every detector's batch
        // fields (the quaternions too, refilled in every pass).
        let streamed = execution.streams_detector_data();
        // A batch of 0 is every detector at once (never streamed).
        let pointing = |n_det: u64| {
            let batch = match execution.batch {
                0 => n_det,
                b => (b as u64).min(n_det),
            };
            match &execution.plan {
                ExecutionPlan::DeviceRecomputed { .. } if streamed => {
                    presets::DevicePointing::Streamed(batch)
                }
                ExecutionPlan::DeviceRecomputed { .. } => presets::DevicePointing::Batched(batch),
                ExecutionPlan::DeviceCompact { .. } => presets::DevicePointing::Compact(batch),
                _ => presets::DevicePointing::Kept,
            }
        };
        let peaks = self.device_memory_models(plan, sim, execution).into_iter();
        Some(peaks.fold(0.0, |worst, (m, n_det)| worst.max(m.peak(pointing(n_det)))))
    }

    /// On a device plan, the pixel grid of a job that does not set
    /// `pixels.nside_submap`: [`presets::device_nside_submap`] (2 for nside
    /// 1024) instead of TOAST's 16. A device allocates every pixel of every
    /// local submap, and the maps of the solve live there whole: submaps of
    /// 48 pixels follow the scan's footprint where TOAST's 3072 cover whole
    /// patches around it (tiny: 0.95 M local pixels instead of 2.80 M;
    /// xsmall: 2.60 M instead of 3.88 M), with the same values (each
    /// pixel's sums do not depend on the submap it is in; the outputs are
    /// full-sky maps). The host keeps TOAST's grid: its pages that hold no
    /// hit pixel are never touched. Call it after [`SatelliteJob::plan`]
    /// and before [`SatelliteJob::fit_device_budget`], whose model counts
    /// the grid. Returns why, or `None` when nothing changed.
    pub fn fit_device_pixels(&mut self, registry: &Registry) -> Option<String> {
        if self.execution_plan(registry).host() || self.config.given("pixels", "nside_submap") {
            return None;
        }
        let nside = self.nside();
        let was = self.config.pixels.nside_submap.get();
        let fine = presets::device_nside_submap(nside);
        if fine >= was {
            return None;
        }
        self.config.pixels.nside_submap = Nside::new(fine).ok()?;
        let n_submap = (nside / fine) * (nside / fine);
        Some(format!(
            "pixels.nside_submap = {fine} on a device (not given): {n_submap} submaps of {} \
             pixels follow the scan's footprint, and the device holds only the submaps it hits \
             (the host's TOAST grid is {was}; the maps do not depend on it)",
            12 * fine * fine
        ))
    }

    /// Where the map-maker's plan on a device does not fit the device
    /// memory budget of its backend, the plan that does, with the least
    /// recomputation: a compact plan, or a kept one where compact pointing
    /// applies, keeps its pixels compact (`binner.compact_pointing` on)
    /// with the most detectors a batch that fit (`binner.pointing_batch`
    /// set), where one does; else the pointing
    /// recomputed on the device per batch of the most detectors that fit
    /// (`binner.full_pointing` and `binner.compact_pointing` off,
    /// `binner.pointing_batch` set; the sky scan follows the map-maker's
    /// batches), and, where not even one detector a batch fits beside the
    /// whole detector data, with the detector data streamed
    /// (`binner.stream_detector_data`: the device holds one batch's rows).
    /// On a device in the host's memory they are streamed only to hold a
    /// budget the user set (`memory=`, `TOAST_GPU_MEM_GB`: an integrated
    /// GPU's own limit, a test of the device plans on PoCL): streamed, they
    /// take the same memory on the host, so under the default budget,
    /// which the host's share already bounds, streaming would save nothing.
    /// This is the one place where the budget chooses the plan; call it
    /// after [`SatelliteJob::plan`] and before
    /// [`SatelliteJob::execution_plan`]. Returns why, or `None` when
    /// nothing changed (a host plan, no budget known, or the plan fits). A
    /// budget too small for even one streamed detector a batch leaves
    /// batches of one, which [`SatelliteJob::check_device_memory`] then
    /// refuses, naming the budget.
    pub fn fit_device_budget(
        &mut self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        registry: &Registry,
    ) -> Result<Option<String>, WorkflowError> {
        let execution = self.execution_plan(registry);
        let Some(predicted) = self.predicted_device_memory(plan, sim, &execution) else {
            return Ok(None);
        };
        let Some((name, budget)) = self.device_budget(plan, sim, registry)? else {
            return Ok(None);
        };
        let bytes = budget.bytes as f64;
        if predicted <= bytes {
            return Ok(None);
        }
        // The least recomputation that fits: compact pointing keeps 4 B a
        // detector sample and rebuilds the weights inside the fused passes,
        // where recomputed pointing runs the pointing kernels in every pass.
        // A compact plan, or a kept one where compact pointing applies,
        // keeps (or becomes) compact with the largest batch that fits.
        if let Some(batch) = self.fit_compact(plan, sim, registry, &execution, bytes) {
            let binner = &mut self.config.binner;
            binner.full_pointing = false;
            binner.compact_pointing = true;
            binner.pointing_batch = batch as usize;
            return Ok(Some(format!(
                "the plan {execution} would need {} of device memory on backend {name}, over \
                 its budget of {budget}: the pixels are kept compact on the device (i32), the \
                 passes run {batch} detector(s) a batch",
                gib(predicted)
            )));
        }
        let models = self.device_memory_models(plan, sim, &execution);
        let most = models.iter().map(|&(_, n)| n).max().unwrap_or(1);
        let largest = |budget: f64, streamed: bool| {
            let batches = models.iter().map(|(m, _)| match streamed {
                false => m.largest_batch(budget),
                true => m.largest_streamed_batch(budget),
            });
            batches.min().unwrap_or(0)
        };
        // The detector data streamed where not even one detector a batch
        // fits beside them, unless the device's memory is the host's and
        // the budget a default: streamed, they would take the same memory
        // on the host, and the default is bounded by the host's share.
        let fits = |streamed| batch_within(bytes, |b| largest(b, streamed));
        let may_stream =
            budget.source.is_configured() || self.device_in_host_memory(registry).is_none();
        let (fits, streamed) = match fits(false) {
            0 if may_stream => (fits(true), true),
            n => (n, false),
        };
        let batch = fits.clamp(1, most.max(1));
        let binner = &mut self.config.binner;
        binner.full_pointing = false;
        binner.compact_pointing = false;
        binner.pointing_batch = batch as usize;
        binner.stream_detector_data = streamed;
        let need = gib(predicted);
        Ok(Some(match (fits, streamed) {
            (0, _) if !may_stream => format!(
                "the plan {execution} would need {need} of device memory on backend {name}, over \
                 its budget of {budget}, and so would the pointing recomputed one detector at a \
                 time (the detector data are not streamed: the device's memory is the host's, \
                 and the budget is its default)"
            ),
            (0, _) => format!(
                "the plan {execution} would need {need} of device memory on backend {name}, over \
                 its budget of {budget}, and so would the pointing recomputed one detector at a \
                 time with the detector data streamed"
            ),
            (_, false) => format!(
                "the plan {execution} would need {need} of device memory on backend {name}, over \
                 its budget of {budget}: the pointing is recomputed on the device, {batch} \
                 detector(s) a batch"
            ),
            (_, true) => format!(
                "the plan {execution} would need {need} of device memory on backend {name}, over \
                 its budget of {budget}, and one detector a batch beside the whole detector data \
                 would too: the pointing is recomputed on the device and the detector data \
                 streamed, {batch} detector(s) a batch"
            ),
        }))
    }

    /// The batch of compact pointing that fits `bytes` of device memory
    /// for `execution` (a device plan over its budget): `None` where no
    /// batch of one detector fits, or where `execution` neither is compact
    /// nor keeps its pointing, or compact pointing does not apply to it
    /// ([`Plan::choose`] keeps the pointing then, and says why: too many
    /// pixels for an i32, pointing handed over, a plugin before ABI minor
    /// 8). Recomputed pointing (`full_pointing` and `compact_pointing` both
    /// false) stays recomputed: it was asked for. `compact_pointing` alone
    /// chooses nothing while `full_pointing` is on (kept pointing wins in
    /// [`Plan::choose`]), so a kept plan becomes compact whatever it says.
    fn fit_compact(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        registry: &Registry,
        execution: &Plan,
        bytes: f64,
    ) -> Option<u64> {
        let compact = if execution.compact() {
            execution.clone()
        } else if execution.keeps_pointing() {
            let mut config = self.config.clone();
            config.binner.full_pointing = false;
            config.binner.compact_pointing = true;
            let trial = plan_of(&config, registry, &config.dispatch);
            trial.compact().then_some(trial)?
        } else {
            return None;
        };
        let models = self.device_memory_models(plan, sim, &compact);
        let most = models.iter().map(|&(_, n)| n).max().unwrap_or(1);
        let batch = models
            .iter()
            .map(|(m, _)| batch_within(bytes, |b| m.largest_compact_batch(b)))
            .min()
            .unwrap_or(0);
        (batch > 0).then(|| batch.min(most.max(1)))
    }

    /// The device memory budget the run is planned within on the pipeline
    /// backend of `registry`: the one its plugin holds its pool within
    /// (`toast_accel::budget`: the option `memory=`, else
    /// `TOAST_GPU_MEM_GB`, else 90% of the free memory of its device), the
    /// last two divided among the [`SatelliteJob::processes_on_device`]
    /// (`Budget::shared_by`: a planning figure, the plugin's pool holding
    /// the whole one); `None` for a host-addressable backend, or
    /// when the figure cannot be known (no device information). A device
    /// in the host's memory ([`SatelliteJob::device_in_host_memory`])
    /// without a configured budget is planned within less, where this
    /// process's share of the node's memory is known
    /// ([`SatelliteJob::memory_bound`]): 90% of what the host's own
    /// predicted peak on the plan of `plan` and `sim` leaves of it
    /// ([`SatelliteJob::predicted_process_memory`]), as its allocations and
    /// the host's come from the same memory and the host memory check
    /// counts both. Where the host's peak alone leaves nothing, the plain
    /// default stands and the host memory check refuses the run.
    pub fn device_budget(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        registry: &Registry,
    ) -> Result<Option<(String, Budget)>, WorkflowError> {
        let Some(backend) = pipeline_backend_in(registry, &self.config.dispatch, None) else {
            return Ok(None);
        };
        if backend.host_addressable() {
            return Ok(None);
        }
        let name = backend.name().to_string();
        let options = registry
            .entry(&name)
            .map(|e| e.options().to_string())
            .unwrap_or_default();
        let configured =
            Budget::configured(&options, self.gpu_mem_gb.as_deref()).map_err(|reason| {
                WorkflowError::Dispatch {
                    setting: format!("backend {name}"),
                    reason,
                }
            })?;
        if let Some(b) = configured {
            return Ok(Some((name, b.shared_by(self.processes_on_device))));
        }
        let Ok(device) = backend.device_info(0) else {
            return Ok(None);
        };
        let default = Budget::default_for(device.free_memory, device.total_memory)
            .shared_by(self.processes_on_device);
        let share = self.memory_bound().filter(|_| device.memory_kind.is_host());
        let Some(share) = share else {
            return Ok(Some((name, default)));
        };
        let host = self.predicted_process_memory(plan, sim, &self.execution_plan(registry));
        let room = (0.9 * (share.bytes - host)).max(0.0) as u64;
        Ok(Some((
            name,
            match room > 0 && room < default.bytes {
                true => Budget {
                    bytes: room,
                    source: BudgetSource::HostShare,
                },
                false => default,
            },
        )))
    }

    /// This process's share of its node's memory ([`presets::process_share`]
    /// of [`presets::memory_bounds`]: `MemAvailable` and the cgroups'
    /// limits over [`SatelliteJob::processes_on_node`], the rlimits whole),
    /// read on the first call (or agreed by
    /// [`SatelliteJob::share_memory_bound`], or set by
    /// [`SatelliteJob::set_memory_bound`]) and kept for the job: the budget
    /// of a device in the host's memory and the host memory check take the
    /// same figure (the free memory moves while the plugins start and the
    /// job plans). `None` where none can be read.
    pub fn memory_bound(&self) -> Option<presets::MemoryBound> {
        self.memory_bound
            .get_or_init(|| self.read_memory_share())
            .clone()
    }

    /// This process's share of its node's memory as it reads now, of
    /// [`SatelliteJob::processes_on_node`] processes.
    fn read_memory_share(&self) -> Option<presets::MemoryBound> {
        presets::process_share(&presets::memory_bounds(), self.processes_on_node)
    }

    /// Set the bound [`SatelliteJob::memory_bound`] gives (a process's
    /// share, or `None`: unknown, as for a plan of other nodes), instead of
    /// reading it; `false` where it was read or set already (it stays).
    pub fn set_memory_bound(&self, bound: Option<presets::MemoryBound>) -> bool {
        self.memory_bound.set(bound).is_ok()
    }

    /// Count, over the processes of `comm` (a collective; call it on every
    /// process before the device budget is read), those that drive each
    /// device: the processes whose device has the same [`device_key`] (its
    /// node and UUID; a process without a device backend, or whose device
    /// tells no UUID, counts 1). [`SatelliteJob::processes_on_device`] is
    /// the most of them on any device, the same on every process, so that
    /// the processes plan alike (3 ranks on 2 GPUs: every rank plans within
    /// half a device).
    pub fn share_device(
        &mut self,
        comm: &dyn Comm,
        registry: &Registry,
    ) -> Result<(), WorkflowError> {
        let key = pipeline_backend_in(registry, &self.config.dispatch, None)
            .filter(|b| !b.host_addressable())
            .and_then(|b| b.device_info(0).ok())
            .map(|d| device_key(&node_name(), &d))
            .unwrap_or_default();
        // The root counts; every process gets the most.
        let most = comm
            .gather_bytes(0, &key)
            .map_err(|e| WorkflowError::gather("device sharing", e))?
            .and_then(|keys| processes_per_device(&keys).into_iter().max());
        let mut most = (most.unwrap_or(1) as u64).to_le_bytes().to_vec();
        comm.broadcast_bytes(0, &mut most)
            .map_err(|e| WorkflowError::gather("device sharing", e))?;
        let most = <[u8; 8]>::try_from(most.as_slice()).map_or(1, u64::from_le_bytes);
        self.processes_on_device = usize::try_from(most).unwrap_or(usize::MAX).max(1);
        Ok(())
    }

    /// Agree on [`SatelliteJob::memory_bound`] over the processes of
    /// `comm` (a collective; call it on every process before the budget
    /// and the checks, with [`SatelliteJob::processes_on_node`] set): the
    /// smallest share of them, named as this process's when it is its own,
    /// `None` when some process can read none. Nothing changes where the
    /// bound was read or set already.
    pub fn share_memory_bound(&self, comm: &dyn Comm) -> Result<(), WorkflowError> {
        if self.memory_bound.get().is_some() {
            return Ok(());
        }
        let own = self.read_memory_share();
        let mut avail = [own.as_ref().map_or(-1.0, |b| b.bytes)];
        comm.allreduce_f64(&mut avail, ReduceOp::Min)
            .map_err(|e| WorkflowError::gather("memory check", e))?;
        let agreed = match own {
            _ if avail[0] < 0.0 => None,
            Some(b) if b.bytes == avail[0] => Some(b),
            _ => Some(presets::MemoryBound {
                bytes: avail[0],
                source: "the memory bound of another process".into(),
                per_process: true,
            }),
        };
        self.set_memory_bound(agreed);
        Ok(())
    }

    /// Refuse, before any work, a configuration whose steps read an item
    /// (a timestream, a shared field, an interval list, a noise model) that
    /// no earlier step provides: a field name set to one the workflow
    /// never makes (`mapmaker.det_data=qq`, `pixels.view=x`,
    /// `det_pointing.boresight=zz`) passed the dry run and failed the run
    /// part way, after the simulation. The steps are those of
    /// [`SatelliteJob::run`], in its order, each under its configuration
    /// section (the scan's pointing as `det_pointing`, `pixels`, `weights`).
    /// The scan and the noise create the timestream they add to where it
    /// is missing (as TOAST's do), so theirs may be new.
    pub fn check_wiring(&self, sim: &SimSatellite) -> Result<(), WorkflowError> {
        let cfg = &self.config;
        let bad = |section: &str| {
            let section = section.to_string();
            move |e: OpError| {
                WorkflowError::Config(ConfigError::Section {
                    section,
                    reason: e.to_string(),
                })
            }
        };
        // A step: its section, what it reads, what it provides, and what
        // of what it reads it creates where missing (`creates`).
        let items = |section: &'static str, op: &dyn Operator, creates: Requirements| {
            (section, op.requires(), op.provides(), creates)
        };
        let mut steps = vec![items(
            "default_model",
            &DefaultNoiseModel::new("default_model", cfg.default_model.clone()),
            Requirements::new(),
        )];
        if cfg.scan_map.enabled {
            let pixels = PixelsHealpix::new("pixels", cfg.pixels.clone(), cfg.det_pointing.clone())
                .map_err(bad("pixels"))?;
            let (requires, provides) = ScanHealpixMap::items(&cfg.scan_map);
            steps.extend([
                items(
                    "det_pointing",
                    &PointingDetector::new("det_pointing", cfg.det_pointing.clone()),
                    Requirements::new(),
                ),
                items("pixels", &pixels, Requirements::new()),
                items(
                    "weights",
                    &StokesWeights::new("weights", cfg.weights.clone(), cfg.det_pointing.clone()),
                    Requirements::new(),
                ),
                (
                    "scan_map",
                    requires,
                    provides,
                    Requirements::new().detdata(&cfg.scan_map.det_data),
                ),
            ]);
        }
        if cfg.sim_noise.enabled {
            steps.push(items(
                "sim_noise",
                &SimNoise::new("sim_noise", cfg.sim_noise.clone()),
                Requirements::new().detdata(&cfg.sim_noise.det_data),
            ));
        }
        if cfg.mapmaker.enabled {
            let mm = MapMaker::new(mapmaker_setup(cfg)).map_err(bad("mapmaker"))?;
            steps.push(items("mapmaker", &mm, Requirements::new()));
        }
        let mut have = sim.provides();
        for (section, requires, provides, creates) in steps {
            for category in toast_core::Category::ALL {
                let unmet = requires.get(category).iter().find(|name| {
                    !have.contains(category, name) && !creates.contains(category, name)
                });
                if let Some(name) = unmet {
                    let before = have.get(category);
                    return Err(WorkflowError::Wiring {
                        step: section.to_string(),
                        category,
                        name: name.clone(),
                        before: match before.is_empty() {
                            true => "none".into(),
                            false => before.join(", "),
                        },
                    });
                }
            }
            have.extend(&provides);
        }
        Ok(())
    }

    /// Refuse, before any planning, a configuration whose `dispatch`
    /// settings (`--backend`, `run`, `pipeline`, `operator.*`, `kernel.*`)
    /// name a backend that is absent or cannot start (a bad option, no
    /// device): planning resolves the pipeline backend as dispatch does,
    /// falling back to `cpu`, so without this check a dry run would plan
    /// the named device's run on the host and say it fits, where the run
    /// itself is refused ([`SatelliteJob::run`] checks the same).
    pub fn check_backends(&self, registry: &Registry) -> Result<(), WorkflowError> {
        check_named_backends(&self.config, registry)
    }

    /// Refuse, before any work, a noise simulation on a device whose
    /// plugin option `workspace_bytes=` is smaller than one detector's
    /// noise stream of the longest observation of `sim`
    /// (`toast_accel::budget::noise_stream_doubles` of
    /// [`presets::noise_fft_len`]): a stream cannot be split, so its plugin
    /// would refuse the first `sim_noise` call, after the scan. (The
    /// default limit holds one stream, where the device's largest
    /// allocation does.)
    pub fn check_device_workspace(
        &self,
        sim: &SimSatellite,
        registry: &Registry,
    ) -> Result<(), WorkflowError> {
        if !self.config.sim_noise.enabled {
            return Ok(());
        }
        let Ok(resolved) =
            self.config
                .dispatch
                .resolve(registry, Kernel::SimNoise, Some("sim_noise"))
        else {
            return Ok(());
        };
        let backend = &resolved.backend;
        if backend.host_addressable() {
            return Ok(());
        }
        let name = backend.name();
        let options = registry
            .entry(name)
            .map(|e| e.options().to_string())
            .unwrap_or_default();
        let refused = |reason: String| WorkflowError::Dispatch {
            setting: format!("backend {name}"),
            reason,
        };
        let limit = WorkspaceLimit::configured(&options).map_err(refused)?;
        let samples = sim
            .obs_samples()
            .map_err(|e| {
                WorkflowError::Config(ConfigError::Section {
                    section: "sim_satellite".into(),
                    reason: e.to_string(),
                })
            })?
            .into_iter()
            .max()
            .unwrap_or(0);
        let fft_len = presets::noise_fft_len(samples);
        let stream = noise_stream_doubles(fft_len).saturating_mul(8);
        limit
            .launch_bytes(stream, u64::MAX, u64::MAX)
            .map(drop)
            .map_err(|why| {
                refused(format!(
                    "sim_noise needs {stream} bytes of device workspace for one detector's noise \
                 stream ({samples} samples an observation: an FFT of {fft_len} points), {why}"
                ))
            })
    }

    /// The name of the pipeline backend of `registry` where its device's
    /// allocations take the host's memory (its plugin says so, ABI minor 9:
    /// a CPU device such as PoCL's, an integrated GPU or APU, one emulated
    /// with `TOAST_EMU_INTEGRATED=1`); `None` otherwise (a host-addressable backend, whose
    /// arrays are the host's own and counted as such, a device with its
    /// own memory, or one that does not say).
    pub fn device_in_host_memory(&self, registry: &Registry) -> Option<String> {
        let backend = pipeline_backend_in(registry, &self.config.dispatch, None)?;
        let shared = !backend.host_addressable()
            && backend
                .device_info(0)
                .is_ok_and(|d| d.memory_kind.is_host());
        shared.then(|| backend.name().to_string())
    }

    /// Refuse, before any work, a device run whose predicted device peak
    /// (`predicted`, [`SatelliteJob::predicted_device_memory`]) passes the
    /// budget of its backend ([`SatelliteJob::device_budget`]): its plugin
    /// would refuse an allocation part way through, or, for a device in
    /// the host's memory, its pool would take what the host needs.
    pub fn check_device_memory(
        &self,
        predicted: f64,
        backend: &str,
        budget: Budget,
        execution: &Plan,
    ) -> Result<(), WorkflowError> {
        if predicted > budget.bytes as f64 {
            return Err(WorkflowError::DeviceMemory {
                predicted,
                backend: backend.to_string(),
                plan: execution.to_string(),
                budget,
            });
        }
        Ok(())
    }

    /// Refuse a job whose largest process's predicted peak, `host` bytes
    /// of its own (see [`SatelliteJob::predicted_process_memory`]) and,
    /// with `device`, the backend and the predicted device peak of a
    /// device in the host's memory, would not fit in `available`, a
    /// process's share of its node's memory ([`SatelliteJob::memory_bound`]:
    /// of the node's `MemAvailable` and the cgroups' limits, the rlimits
    /// whole): a run that does not fit is killed by the kernel, or aborts
    /// on a failed allocation, after doing most of its work. The front-end
    /// skips this check when asked to (`toast-cli run
    /// --ignore-memory-check`).
    pub fn check_memory(
        &self,
        available: &presets::MemoryBound,
        host: f64,
        device: Option<(&str, f64)>,
    ) -> Result<(), WorkflowError> {
        let predicted = host + device.map_or(0.0, |(_, bytes)| bytes);
        if predicted > available.bytes {
            return Err(WorkflowError::Memory {
                predicted,
                device: device.map(|(name, bytes)| (name.to_string(), bytes)),
                processes: self.processes_on_node.max(1),
                available: available.bytes,
                bound: available.source.clone(),
            });
        }
        Ok(())
    }

    /// The predicted peak of the largest process of `plan` on `execution`
    /// in the host's memory: its own
    /// ([`SatelliteJob::predicted_process_memory`]) and, for a device in
    /// the host's memory ([`SatelliteJob::device_in_host_memory`]), the
    /// backend and its device's ([`SatelliteJob::predicted_device_memory`]).
    pub fn predicted_host_memory(
        &self,
        plan: &JobDistribution,
        sim: &SimSatellite,
        execution: &Plan,
        registry: &Registry,
    ) -> (f64, Option<(String, f64)>) {
        let own = self.predicted_process_memory(plan, sim, execution);
        let device = self.device_in_host_memory(registry).and_then(|name| {
            self.predicted_device_memory(plan, sim, execution)
                .map(|bytes| (name, bytes))
        });
        (own, device)
    }

    /// [`SatelliteJob::check_memory`] on every process of `comm` against
    /// the share they agree on ([`SatelliteJob::share_memory_bound`]),
    /// each predicted by [`SatelliteJob::predicted_host_memory`] (the
    /// device's peak counted where its memory is the host's): all
    /// processes take the same decision. Nothing is checked when some
    /// process can read no bound.
    pub fn check_memory_on(
        &self,
        comm: &dyn Comm,
        plan: &JobDistribution,
        sim: &SimSatellite,
        execution: &Plan,
        registry: &Registry,
    ) -> Result<(), WorkflowError> {
        self.share_memory_bound(comm)?;
        let Some(bound) = self.memory_bound() else {
            return Ok(());
        };
        let (host, device) = self.predicted_host_memory(plan, sim, execution, registry);
        let device = device.as_ref().map(|(name, bytes)| (name.as_str(), *bytes));
        self.check_memory(&bound, host, device)
    }

    /// The focal plane and the simulation operator, which fix the
    /// distribution.
    pub fn simulation(&self) -> Result<SimSatellite, WorkflowError> {
        let s = self.sizing;
        let fp = benchmark_focalplane(s.n_det as usize).map_err(|e| WorkflowError::Phase {
            phase: "focalplane".into(),
            source: Box::new(OpError::Config(e.to_string())),
        })?;
        let fp = Arc::new(core_focalplane(&fp).map_err(WorkflowError::phase("focalplane"))?);
        SimSatellite::new(
            "sim_satellite",
            self.config.sim_satellite.clone(),
            fp,
            0,
            s.n_obs as usize,
        )
        .map_err(WorkflowError::phase("SimSatellite"))
    }

    /// Set the simulation's group size (`None`: TOAST's rule for `n_procs`
    /// processes, `ppn` per node) and return the distribution of the job
    /// over `n_procs` processes.
    pub fn plan(
        &self,
        sim: &mut SimSatellite,
        n_procs: usize,
        ppn: usize,
        group_size: Option<usize>,
    ) -> Result<JobDistribution, WorkflowError> {
        let s = self.sizing;
        sim.group_size = match group_size {
            Some(0) => {
                return Err(WorkflowError::BadSize {
                    option: "--group-size",
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                })
            }
            Some(g) => g,
            None => default_group_size(n_procs, ppn, s.n_obs as usize, s.n_det),
        };
        sim.plan(n_procs)
            .map_err(WorkflowError::phase("SimSatellite"))
    }

    /// Run the job on `comm`'s processes with the kernels of `registry`.
    /// `sim` comes from [`SatelliteJob::simulation`] and
    /// [`SatelliteJob::plan`]; `timer_root` names the outermost timer
    /// frame. Rank 0 hands the gathered maps to `sink` and gets the
    /// statistics back.
    pub fn run(
        &self,
        mut sim: SimSatellite,
        registry: Registry,
        comm: Arc<dyn Comm>,
        timer_root: &str,
        phases: &mut dyn Phases,
        sink: &mut dyn ProductSink,
    ) -> Result<Option<SatelliteRun>, WorkflowError> {
        let cfg = &self.config;
        let s = self.sizing;
        let root = comm.rank() == 0;
        let group_size = sim.group_size;
        let t_start = Instant::now();
        self.check_wiring(&sim)?;
        let dispatcher = dispatcher(cfg, registry)?;
        let registry = Arc::clone(dispatcher.registry());
        // The map-maker's plan, chosen before any work: the sky scan keeps
        // the pointing for it or not.
        let plan = plan_of(cfg, &registry, dispatcher.policy());
        // What was predicted for the host (the largest process) and the
        // device, for the statistics.
        let job_distribution = sim.plan(comm.size()).ok();
        let predicted_memory_bytes = match &job_distribution {
            Some(dist) => self.predicted_process_memory(dist, &sim, &plan),
            None => self.predicted_memory(&plan),
        };
        let predicted_device_memory_bytes = job_distribution
            .as_ref()
            .and_then(|dist| self.predicted_device_memory(dist, &sim, &plan));
        let device_in_host_memory = self.device_in_host_memory(&registry);
        // A device pipeline backend: SimNoise runs in the scan's scope.
        let noise_on_device = scan_enabled_on_device(cfg, &registry, dispatcher.policy());
        let mut ctx = ExecContext::new();
        ctx.insert(dispatcher);
        ctx.insert(CommHandle(Arc::clone(&comm)));
        ctx.timers.enter(timer_root).map_err(timer_error)?;
        let bus_start = BusBytes::now(&ctx);

        // On a device run the synthetic sky is made in the background from
        // here, beside the simulation, the noise model and the device's
        // pointing (see `SkySynthesis`); the scan waits for it. Its own
        // seconds are recorded under the root, as `sky synthesis
        // (background)`. A host run synthesises it in its scan.
        let scan_cfg = cfg.scan_map.clone();
        let sky_timer = ctx.timers.path_name("sky synthesis (background)");
        let background = scan_cfg.enabled && self.sky_file.is_none() && noise_on_device;
        let mut synthesis = background.then(|| SkySynthesis::start(sky_config(cfg), &*comm));
        let detsets = sim.detector_sets();
        let mut data = Data::new();
        run_phase(phases, 0, &mut ctx, |ctx| {
            sim.apply(&mut data, ctx)
                .map_err(WorkflowError::phase("SimSatellite"))
        })?;
        let mut model = DefaultNoiseModel::new("default_model", cfg.default_model.clone());
        run_phase(phases, 1, &mut ctx, |ctx| {
            model
                .apply(&mut data, ctx)
                .map_err(WorkflowError::phase("DefaultNoiseModel"))
        })?;
        // What the map-maker solves: named if its solve diverges.
        let mut sky_input = "no sky (scan_map.enabled = false)".to_string();
        let mut noise = SimNoise::new("sim_noise", cfg.sim_noise.clone());
        let mut mm =
            MapMaker::new(mapmaker_setup(cfg)).map_err(WorkflowError::phase("MapMaker"))?;
        mm.reuse_pointing(scan_cfg.enabled);
        // The timestreams are dropped before the maps are written.
        mm.discard_timestream(true);
        // On a device, one device scope from the sky scan to the maps: the
        // timestream the scan (and SimNoise, in its scope) leaves on the
        // device is the map-maker's input there, never copied back and up
        // again; each step frees the device copies it is done with
        // (`movement::forget`), and nothing is copied back at the end (the
        // maps come back as the map-maker's products).
        let enabled = cfg.mapmaker.enabled;
        let one_scope = noise_on_device && enabled;
        let outer = if one_scope {
            let backend = ctx
                .extensions
                .get::<Dispatcher>()
                .and_then(|d| pipeline_backend(d, None));
            let scope = open_scope(&mut ctx, backend.as_ref());
            // A streamed plan from the scan on: the scan and the noise
            // write their batches' rows, which go back to the host's
            // timestream as the next batch's come up.
            crate::exec::movement::stream_detector_data(&mut ctx, plan.streams_detector_data());
            Some(scope)
        } else {
            None
        };
        let scanned_and_solved = (|| {
            run_phase(phases, 2, &mut ctx, |ctx| {
                if !scan_cfg.enabled {
                    return Ok(());
                }
                let err = WorkflowError::phase("ScanHealpixMap");
                // A file is read now, and so is the synthetic sky made on
                // a host run; on a device run the scan waits for the
                // synthesis started with the run when it needs the sky.
                let sky: SkySource = match (&self.sky_file, synthesis.take()) {
                    (Some(p), _) => InputSky::from_file_on(p, &*comm_of(ctx))
                        .map_err(&err)?
                        .into(),
                    (None, Some(pending)) => pending.into(),
                    (None, None) => InputSky::synthetic_on(&sky_config(cfg), &*comm_of(ctx))
                        .map_err(&err)?
                        .into(),
                };
                let pointing = PointingOps::new(
                    PointingDetector::new("det_pointing", cfg.det_pointing.clone()),
                    PixelsHealpix::new("pixels", cfg.pixels.clone(), cfg.det_pointing.clone())
                        .map_err(&err)?,
                    StokesWeights::new("weights", cfg.weights.clone(), cfg.det_pointing.clone()),
                );
                let mut op = ScanHealpixMap::new("scan_map", scan_cfg.clone(), pointing, sky)
                    .map_err(&err)?;
                op.options = RunOptions {
                    detector_sets: DetectorSets::Sets(detsets.clone()),
                    ..RunOptions::default()
                };
                // Where the map-maker's plan keeps a full host copy of its
                // pointing, the scan keeps its pixels and weights: they are the
                // map-maker's (same configuration), so it reuses them instead
                // of expanding them again. Else it keeps none.
                let kept = plan.host_pointing_kept();
                // On a device the scan's pointing is transient where the
                // map-maker's is (a batched plan, for a small device memory
                // budget), in the map-maker's batches; else whole fields.
                op.transient_pointing = if plan.host() {
                    !kept
                } else {
                    plan.transient_pointing()
                };
                if !plan.host() && plan.transient_pointing() {
                    op.options.detector_sets =
                        DetectorSets::Sets(merge_sets(&detsets, plan.batch.max(1)));
                }
                op.keep_pointing = kept && cfg.mapmaker.enabled;
                // The map-maker discards the detector data: on a device it
                // reads no host weights.
                op.keep_weights = false;
                // On a device the noise is simulated in the scan's scope, where
                // the timestream is: it comes back once, with the noise.
                if noise_on_device {
                    op.noise = Some(SimNoise::new("sim_noise", cfg.sim_noise.clone()));
                }
                let scanned = op.apply(&mut data, ctx).map_err(&err);
                if let Some(sky) = &op.scanned {
                    sky_input = describe_sky(sky, &scan_cfg);
                    if let Some(seconds) = sky.synthesis_seconds {
                        ctx.timers.record(&sky_timer, seconds, 1);
                    }
                }
                scanned
            })?;
            run_phase(phases, 3, &mut ctx, |ctx| {
                if noise_on_device {
                    tracing::info!("SimNoise: ran in ScanHealpixMap's device scope");
                    return Ok(());
                }
                noise
                    .apply(&mut data, ctx)
                    .map_err(WorkflowError::phase("SimNoise"))
            })?;
            run_phase(phases, 4, &mut ctx, |ctx| {
                if !enabled {
                    tracing::info!("MapMaker: skipped (mapmaker.enabled = false)");
                    return Ok(None);
                }
                mm.run(&mut data, ctx).map(Some).map_err(|e| match e {
                    e @ OpError::Numerical { .. } => WorkflowError::Diverged {
                        input: sky_input.clone(),
                        source: Box::new(e),
                    },
                    e => WorkflowError::phase("MapMaker")(e),
                })
            })
        })();
        let closed = match outer {
            Some(scope) => close_scope(&mut data, &mut ctx, scope, &Requirements::new()).map_err(
                WorkflowError::phase("the device scope of ScanHealpixMap and MapMaker"),
            ),
            None => Ok(None),
        };
        let res = scanned_and_solved?;
        closed?;
        // The plan the map-maker took (one function of the same facts as
        // the workflow's: a difference is a bug).
        let taken = res.as_ref().map(|_| mm.plan().clone());
        if let Some(taken) = taken.as_ref().filter(|t| **t != plan) {
            tracing::warn!("MapMaker: ran plan {taken}, the workflow chose {plan}");
        }
        let span = time_span(&*comm, &data)?;
        // What each rank really holds (from its data, not from the plan).
        let processes = gather_processes(&*comm, &data, &cfg.binner.pixel_dist)?;
        // Rank 0: `Some(None)` when the map-maker did not run.
        let map_stats = run_phase(phases, 5, &mut ctx, |ctx| {
            let Some(res) = &res else {
                return Ok(Some(None));
            };
            let comm = comm_of(ctx);
            let header =
                fits::toast_extra_header(span.0, span.1, s.n_det as i64, s.n_det as i64, "3.0.6");
            drop_detector_data(&mut data);
            let Some(products) = gather_products(&*comm, &mut data, res, &cfg.mapmaker, header)?
            else {
                return Ok(None);
            };
            sink.store(self, &products)
                .map_err(WorkflowError::FrontEnd)?;
            // Every hit submap is stored once in the gathered map.
            let hits = products.hits.data().iter().sum::<i64>();
            Ok(Some(Some((hits, products.map.stats()))))
        })?;
        let _ = ctx.timers.exit(timer_root);
        ctx.timers.stop_all();
        let wall = t_start.elapsed().as_secs_f64();
        let iterations = res.as_ref().map_or(0, |r| r.iterations);
        let communication = communication_times(&*comm, &ctx, iterations)?;
        let timers = toast_core::comm::gather_timer_stats(&*comm, &ctx.timers)
            .map_err(|e| WorkflowError::gather("gathering timers", e))?;
        let mut peaks = [presets::peak_rss().unwrap_or(0.0); 2];
        let mut walls = [wall];
        let ledger = crate::exec::movement::ledger(&ctx);
        let kernels = ctx
            .ext::<Dispatcher>()
            .map(|d| d.kernel_log())
            .unwrap_or_default();
        // The backends that ran a kernel here, once each.
        let ran: BTreeSet<&String> = kernels.values().flat_map(|b| b.keys()).collect();
        // The device peak the plugins measured: their allocators'
        // high-water marks since init (every buffer, kernel scratch and
        // cache), the largest over those backends.
        let held = ran
            .iter()
            .filter_map(|n| registry.get(n).ok()?.device_info(0).ok()?.peak_held_bytes)
            .max();
        let mut device_peak = [
            ledger.map_or(0, |l| l.peak_staged_bytes()) as i64,
            held.unwrap_or(0) as i64,
        ];
        let device_peak_staged_buffers =
            ledger.map(|l| l.peak_staged_buffers()).unwrap_or_default();
        comm.allreduce_f64(&mut peaks[..1], ReduceOp::Max)
            .and_then(|_| comm.allreduce_f64(&mut peaks[1..], ReduceOp::Sum))
            .and_then(|_| comm.allreduce_f64(&mut walls, ReduceOp::Max))
            .and_then(|_| comm.allreduce_i64(&mut device_peak, ReduceOp::Max))
            .map_err(|e| WorkflowError::gather("gathering statistics", e))?;
        let (Some(map_stats), Some(timers), Some(distribution), true) =
            (map_stats, timers, processes, root)
        else {
            return Ok(None);
        };
        let transfer_phases = TransferPhases::new(
            bus_start,
            BusBytes::now(&ctx),
            ctx.extensions.get::<CgTransfers>(),
        );
        let transfers = ran
            .into_iter()
            .filter_map(|n| {
                registry
                    .get(n)
                    .ok()
                    .map(|b| (n.clone(), Transfers::from(b.stats().snapshot())))
            })
            .collect();
        let pd = data
            .meta
            .object::<Arc<PixelDistribution>>(&cfg.binner.pixel_dist)
            .ok();
        let maps = map_stats
            .zip(res.as_ref())
            .map(|((totalhits, st), res)| MapSummary {
                totalhits,
                mean_I: st.mean[0],
                mean_Q: st.mean[1],
                mean_U: st.mean[2],
                rms_I: st.rms[0],
                rms_Q: st.rms[1],
                rms_U: st.rms[2],
                cg_iterations: res.iterations,
                converged: res.converged,
                n_amplitudes: res.n_amplitudes,
                n_flagged_amplitudes: res.n_flagged_amplitudes,
            });
        let stats = RunStats {
            case: self.case.clone(),
            mapmaker_enabled: enabled,
            execution_plan: taken,
            maps,
            sky_map: self.sky_file.as_ref().map(|p| p.display().to_string()),
            processes: comm.size(),
            group_size,
            mpi: comm.describe(),
            distribution,
            peak_memory_bytes_all_processes: peaks[1],
            communication,
            wall_time_s: walls[0],
            peak_memory_bytes: peaks[0],
            bytes_per_det_sample_at_peak: peaks[1] / (s.samples().max(1) as f64),
            predicted_memory_bytes,
            n_det: s.n_det,
            n_obs: s.n_obs,
            samples: s.samples(),
            local_submaps: local_submaps(&data, &cfg.binner.pixel_dist),
            job_hit_submaps: pd.map(|d| d.global_submaps().len()),
            shared_submaps: pd.map(|d| d.shared_submaps().len()),
            threads: rayon::current_num_threads(),
            transfers,
            transfer_phases,
            device_peak_staged_bytes: device_peak[0].max(0) as u64,
            predicted_device_memory_bytes,
            device_in_host_memory,
            // Absent where no process's plugin told (0: not told).
            device_peak_bytes: (device_peak[1] > 0).then_some(device_peak[1] as u64),
            device_peak_staged_buffers,
            kernels,
        };
        Ok(Some(SatelliteRun { stats, timers }))
    }
}

/// The fraction of a device memory budget that
/// [`SatelliteJob::fit_device_budget`] sizes the detector batches to.
const DEVICE_BUDGET_FILL: f64 = 0.9;

/// Consecutive detector sets of `sets` merged into sets of at most `batch`
/// detectors, in order; a set larger than `batch` is cut into pieces of
/// `batch` (the scan and the noise are per detector), so the scan's
/// batches are never larger than the map-maker's, which the device
/// memory model counts.
fn merge_sets(sets: &[Vec<String>], batch: usize) -> Vec<Vec<String>> {
    let batch = batch.max(1);
    let mut merged: Vec<Vec<String>> = Vec::new();
    for piece in sets.iter().flat_map(|s| s.chunks(batch)) {
        match merged.last_mut() {
            Some(last) if last.len() + piece.len() <= batch => last.extend_from_slice(piece),
            _ => merged.push(piece.to_vec()),
        }
    }
    merged
}

/// A timer misuse, reported as the workflow's own failure.
fn timer_error(e: toast_core::TimerError) -> WorkflowError {
    WorkflowError::FrontEnd(Box::new(e))
}

/// Run phase `index` of [`PHASES`] under its timer frame, telling the
/// front-end when it starts (it may stop the run there) and ends.
fn run_phase<R>(
    phases: &mut dyn Phases,
    index: usize,
    ctx: &mut ExecContext,
    f: impl FnOnce(&mut ExecContext) -> Result<R, WorkflowError>,
) -> Result<R, WorkflowError> {
    let name = PHASES[index];
    phases.start(index, name).map_err(WorkflowError::FrontEnd)?;
    let t0 = Instant::now();
    ctx.timers.enter(name).map_err(timer_error)?;
    let r = f(ctx);
    // The phase's freed transients go back to the system before the next.
    toast_core::mem::release_free_memory();
    let _ = ctx.timers.exit(name);
    phases.finish(index, name, t0.elapsed().as_secs_f64());
    r
}

/// The map-maker of the workflow.
fn mapmaker_setup(cfg: &SatelliteConfig) -> MapMakerSetup {
    MapMakerSetup {
        name: "mapmaker".into(),
        mapmaker: cfg.mapmaker.clone(),
        baselines: cfg.baselines.clone(),
        binner: cfg.binner.clone(),
        binner_final: None,
        det_pointing: cfg.det_pointing.clone(),
        pixels: cfg.pixels.clone(),
        weights: cfg.weights.clone(),
        pixels_final: None,
    }
}

/// Whether the sky scan runs in a device scope (a pipeline backend that is
/// not host-addressable), so that SimNoise joins it.
fn scan_enabled_on_device(
    cfg: &SatelliteConfig,
    registry: &Registry,
    policy: &DispatchPolicy,
) -> bool {
    cfg.scan_map.enabled
        && pipeline_backend_in(registry, policy, None).is_some_and(|b| !b.host_addressable())
}

/// The plan the workflow's map-maker takes with the pipeline backend
/// `policy` resolves in `registry` (the facts [`MapMaker::run`] finds at
/// its start: no pointing handed over where the plan keeps none on the
/// host, fused passes allowed).
fn plan_of(cfg: &SatelliteConfig, registry: &Registry, policy: &DispatchPolicy) -> Plan {
    let backend = pipeline_backend_in(registry, policy, None)
        .map(|b| (b.name().to_string(), b.host_addressable()));
    let setup = mapmaker_setup(cfg);
    // A dispatch error here is the run's to report (it names the setting).
    let kernels = KernelFacts::of(registry, policy, &setup.name).unwrap_or_default();
    let facts = PlanFacts::of_setup(&setup, backend, false, true, kernels);
    Plan::choose(&cfg.binner, &facts)
}

/// Every backend the configuration's `dispatch` settings name is there
/// and starts ([`SatelliteJob::check_backends`]).
fn check_named_backends(cfg: &SatelliteConfig, registry: &Registry) -> Result<(), WorkflowError> {
    let policy = &cfg.dispatch;
    let named = policy
        .named_backends()
        .into_iter()
        .map(|(key, name)| (format!("{key}={name}"), name));
    // Where neither `run` nor `pipeline` names one, the pipeline's data
    // live on the default backend: it must start too (a CPU plugin refusing
    // `TOAST_CPU_THREADS=abc` once let the dry run plan without a backend
    // and the run fail in its first kernel).
    let default = (policy.run.is_none() && policy.pipeline.is_none()).then(|| {
        (
            format!("run (unset: the default backend, {DEFAULT_BACKEND})"),
            DEFAULT_BACKEND,
        )
    });
    for (setting, name) in named.chain(default) {
        registry.get(name).map_err(|e| WorkflowError::Dispatch {
            setting,
            reason: e.to_string(),
        })?;
    }
    Ok(())
}

/// The dispatcher of the configuration's `dispatch` settings. A backend
/// asked for by name must be there and usable: fail before any work rather
/// than silently running elsewhere. (Dispatch still falls back, per
/// kernel, when a named backend lacks that one kernel.)
fn dispatcher(cfg: &SatelliteConfig, registry: Registry) -> Result<Dispatcher, WorkflowError> {
    check_named_backends(cfg, &registry)?;
    Ok(Dispatcher::new(Arc::new(registry), cfg.dispatch.clone()))
}

/// The NSIDE of a HEALPix FITS file, checked as the reader checks it, without
/// reading the data; it must have I, Q, U columns whose units convert to K
/// (`sim::check_sky_header`).
fn sky_header_nside(path: &Path) -> Result<u64, WorkflowError> {
    let sky_map = |reason: String| WorkflowError::SkyMap {
        path: path.to_path_buf(),
        reason,
    };
    // The FITS error's path is the one `SkyMap` names already.
    let header = fits::read_healpix_header(path).map_err(|e| sky_map(e.reason()))?;
    crate::sim::check_sky_header(&header).map_err(sky_map)?;
    Ok(header.nside)
}

fn local_submaps(data: &Data, key: &str) -> usize {
    data.meta
        .object::<Arc<PixelDistribution>>(key)
        .map(|d| d.n_local_submap())
        .unwrap_or(0)
}

/// The first and last timestamps of the job.
fn time_span(comm: &dyn Comm, data: &Data) -> Result<(f64, f64), WorkflowError> {
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
        .map_err(|e| WorkflowError::gather("time span", e))?;
    Ok((l[0], h[0]))
}

/// Each rank's observations and detectors, as rank 0 receives them (`None`
/// on other ranks).
fn gather_processes(
    comm: &dyn Comm,
    data: &Data,
    pixel_dist: &str,
) -> Result<Option<Vec<ProcessRecord>>, WorkflowError> {
    let mut dets: Vec<String> = Vec::new();
    let mut det_samples = 0u64;
    for o in &data.obs {
        for d in o.local_detectors() {
            if !dets.iter().any(|x| x == d) {
                dets.push(d.clone());
            }
        }
        det_samples += (o.local_detectors().len() * o.n_samples()) as u64;
    }
    let mine = ProcessRecord {
        rank: comm.rank(),
        observations: data.obs.iter().map(|o| o.name().to_string()).collect(),
        detectors: dets,
        detector_samples: det_samples,
        local_submaps: local_submaps(data, pixel_dist),
        peak_memory_bytes: presets::peak_rss().unwrap_or(0.0),
    };
    let gerr = |reason: String| WorkflowError::gather("gathering the distribution", reason);
    let bytes = serde_json::to_vec(&mine).map_err(|e| gerr(e.to_string()))?;
    let all = comm
        .gather_bytes(0, &bytes)
        .map_err(|e| gerr(e.to_string()))?;
    let Some(all) = all else {
        return Ok(None);
    };
    all.iter()
        .map(|b| serde_json::from_slice(b).map_err(|e| gerr(format!("record: {e}"))))
        .collect::<Result<Vec<ProcessRecord>, _>>()
        .map(Some)
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
) -> Result<Communication, WorkflowError> {
    let mut t = [0.0f64; 3];
    for name in ctx.timers.names() {
        let Some(timer) = ctx.timers.get(name) else {
            continue;
        };
        let sec = timer.seconds();
        if name.ends_with(&format!("|{SYNC_TIMER}")) {
            t[0] += sec;
            if name.contains("SolverLHS") {
                t[2] += sec;
            }
        } else if name.ends_with(&format!("|{}", crate::mapmaker::DOT_TIMER)) {
            t[1] += sec;
            t[2] += sec;
        }
    }
    comm.allreduce_f64(&mut t, ReduceOp::Max)
        .map_err(|e| WorkflowError::gather("communication times", e))?;
    Ok(Communication {
        sync_map_s: t[0],
        dot_allreduce_s: t[1],
        cg_s: t[2],
        per_cg_iteration_s: if iterations > 0 {
            t[2] / iterations as f64
        } else {
            0.0
        },
    })
}

/// Gather the map-maker's products onto rank 0 (`None` on other ranks):
/// the hits and the destriped map, and those `mm` asks to write (see
/// [`MapProducts`]). Every rank calls it.
///
/// The products leave `data`: a product is moved out of it on one process
/// (no copy) and gathered, then dropped, on several; those not written
/// are dropped unread, so only what the outputs need is held while they
/// are written.
fn gather_products(
    comm: &dyn Comm,
    data: &mut Data,
    res: &MapMakerResult,
    mm: &MapMakerConfig,
    header: Vec<fits::HeaderCard>,
) -> Result<Option<MapProducts>, WorkflowError> {
    let hits = take_product::<i64>(comm, data, Some(&res.hits), true)?;
    let binmap = take_product(comm, data, res.binmap.as_ref(), true)?;
    let cov = take_product(comm, data, Some(&res.cov), mm.write_cov)?;
    let invcov = take_product(comm, data, res.invcov.as_ref(), mm.write_invcov)?;
    let rcond = take_product(comm, data, Some(&res.rcond), mm.write_rcond)?;
    let noiseweighted = take_product(
        comm,
        data,
        res.noiseweighted_map.as_ref(),
        mm.write_noiseweighted_map,
    )?;
    let map = take_product(comm, data, Some(&res.map), true)?;
    let (Some(hits), Some(map)) = (hits, map) else {
        return Ok(None);
    };
    Ok(Some(MapProducts {
        hits,
        binmap,
        map,
        cov,
        invcov,
        rcond,
        noiseweighted,
        header,
    }))
}

/// Map-maker product `key` out of `data`: when `wanted`, whole on rank 0
/// (moved on one process, gathered on several; `None` on other ranks);
/// dropped either way.
fn take_product<T: crate::pixels::Reducible>(
    comm: &dyn Comm,
    data: &mut Data,
    key: Option<&String>,
    wanted: bool,
) -> Result<Option<PixelData<T>>, WorkflowError> {
    let Some(key) = key else {
        return Ok(None);
    };
    let missing =
        |e: &dyn std::fmt::Display| WorkflowError::gather(format!("map-maker product {key}"), e);
    if !wanted {
        data.meta.remove(key);
        return Ok(None);
    }
    if comm.size() > 1 {
        let m = data
            .meta
            .object::<PixelData<T>>(key)
            .map_err(|e| missing(&e))?;
        let whole = gather_map(comm, m, 0)
            .map_err(|e| WorkflowError::gather(format!("gathering map {key}"), e))?;
        data.meta.remove(key);
        return Ok(whole);
    }
    // Checked first, so that a wrong type names both types and keeps the entry.
    data.meta
        .object::<PixelData<T>>(key)
        .map_err(|e| missing(&e))?;
    match data.meta.remove(key) {
        Some(toast_core::MetaItem::Object { object, .. }) => object
            .downcast::<PixelData<T>>()
            .map(|b| Some(*b))
            .map_err(|_| missing(&"changed type while taken")),
        _ => Err(missing(&"vanished while taken")),
    }
}

/// Drop every observation's detector data (signal, flags, kept pointing):
/// once the map-maker has run nothing reads it, and the outputs are
/// written without it. The observations themselves (detectors, times)
/// stay for the run's statistics.
fn drop_detector_data(data: &mut Data) {
    for ob in data.obs.iter_mut() {
        let names: Vec<String> = ob.detdata.names().map(str::to_string).collect();
        for n in names {
            // Present: the name was just listed.
            let _ = ob.detdata.remove(&n);
        }
    }
}

/// The synthetic sky of `cfg` (`scan_map`'s settings at `pixels.nside`).
fn sky_config(cfg: &SatelliteConfig) -> SkyConfig {
    SkyConfig {
        nside: cfg.pixels.nside,
        seed: cfg.scan_map.seed,
        fwhm_arcmin: cfg.scan_map.fwhm_arcmin,
        toast_ring_as_nest: cfg.scan_map.toast_ring_as_nest,
        ..SkyConfig::default()
    }
}

/// The sky a run scans, as a solve that diverges names it: the file or the
/// synthetic sky's settings, and its largest absolute value.
fn describe_sky(sky: &ScannedSky, cfg: &crate::sim::ScanHealpixMapConfig) -> String {
    let peak = sky.largest_abs;
    let what = if sky.source == "synthetic" {
        format!(
            "the synthetic sky (scan_map.seed = {}, fwhm_arcmin = {})",
            cfg.seed, cfg.fwhm_arcmin
        )
    } else {
        format!("sky map {}", sky.source)
    };
    format!("{what}, largest |value| {peak:e} K")
}

/// The detectors a batch that fit a device budget of `bytes`, given the
/// most that fit a number of bytes (`largest`): sized to 90% of the budget
/// ([`DEVICE_BUDGET_FILL`]: the local pixels are an estimate, within a few
/// percent of the measured ones on xsmall), or one detector where only the
/// whole budget holds it; 0 where not even that fits.
fn batch_within(bytes: f64, largest: impl Fn(f64) -> u64) -> u64 {
    largest(DEVICE_BUDGET_FILL * bytes).max(largest(bytes).min(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(sets: &[&str], n_det: u64) -> Result<SatelliteJob, WorkflowError> {
        let mut table = super::super::config::workflow_defaults("tiny");
        for s in ["pixels.nside=32"].iter().chain(sets) {
            super::super::config::apply_set(&mut table, s).unwrap();
        }
        let cfg = super::super::config::build(table).unwrap();
        let overrides = SizeOverrides {
            n_det: Some(n_det),
            n_obs: None,
        };
        SatelliteJob::new("tiny", cfg, overrides)
    }

    /// Processes share a device where node and UUID agree: two GPUs of a
    /// node are apart even with one name (and one ordinal, as per-rank
    /// `CUDA_VISIBLE_DEVICES` gives them); a device without a UUID, or no
    /// device, counts 1.
    #[test]
    fn processes_per_device_count_node_and_uuid() {
        let gpu = |uuid: Option<u8>| DeviceSummary {
            name: "GPU (sm_90)".into(),
            total_memory: 80 << 30,
            free_memory: 79 << 30,
            compute_units: 132,
            peak_held_bytes: None,
            memory_kind: toast_accel::abi::DeviceMemoryKind::Own,
            identity: uuid.map(|u| [u; 16]),
        };
        let keys = [
            device_key("n1", &gpu(Some(1))),
            device_key("n1", &gpu(Some(2))),
            device_key("n1", &gpu(Some(1))),
            device_key("n2", &gpu(Some(1))),
            Vec::new(),
            device_key("n3", &gpu(None)),
            device_key("n3", &gpu(None)),
        ];
        assert_eq!(processes_per_device(&keys), [2, 1, 2, 1, 1, 1, 1]);
        assert!(device_key("n1", &gpu(None)).is_empty());
    }

    /// Every item a step reads is provided by an earlier step, or created
    /// by the step itself where it does (the scan's and the noise's
    /// timestreams): a field name the workflow never makes is refused
    /// before any work, naming the step's section and the item.
    #[test]
    fn every_item_a_step_reads_is_made_before_it() {
        let wiring = |sets: &[&str]| {
            let j = job(sets, 2).unwrap();
            let sim = j.simulation().unwrap();
            j.check_wiring(&sim).map_err(|e| e.to_string())
        };
        for good in [
            &[][..],
            &["sim_noise.det_data=foo"],
            &["scan_map.det_data=sky"],
            &["sim_noise.det_data=foo", "mapmaker.det_data=foo"],
            &[
                "sim_noise.noise_model=x",
                "default_model.noise_model=x",
                "binner.noise_model=x",
            ],
            &["scan_map.enabled=false"],
            &["mapmaker.enabled=false", "mapmaker.det_data=qq"],
            // A flag field under mask 0 is never read, so never required.
            &[
                "det_pointing.shared_flags=zz",
                "det_pointing.shared_flag_mask=0",
                "mapmaker.enabled=false",
            ],
            &["binner.shared_flags=zz", "binner.shared_flag_mask=0"],
            &["binner.det_flags=zz", "binner.det_flag_mask=0"],
        ] {
            wiring(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
        for (bad, says) in [
            (&["pixels.view=x"][..], "pixels: reads intervals `x`"),
            (&["weights.view=vv"], "weights: reads intervals `vv`"),
            (
                &["det_pointing.boresight=zz"],
                "det_pointing: reads shared `zz`",
            ),
            (&["sim_noise.noise_model=x"], "sim_noise: reads meta `x`"),
            (
                &["default_model.noise_model=y"],
                "sim_noise: reads meta `noise_model`",
            ),
            (&["mapmaker.det_data=qq"], "mapmaker: reads detdata `qq`"),
            (
                &["det_pointing.shared_flags=zz", "mapmaker.enabled=false"],
                "det_pointing: reads shared `zz`",
            ),
            (&["binner.det_flags=zz"], "mapmaker: reads detdata `zz`"),
            (&["baselines.times=tt"], "mapmaker: reads shared `tt`"),
            (&["baselines.view=vv"], "mapmaker: reads intervals `vv`"),
            (
                &["scan_map.enabled=false", "det_pointing.boresight=zz"],
                "mapmaker: reads shared `zz`",
            ),
        ] {
            let e = wiring(bad).unwrap_err();
            assert!(
                e.contains(says) && e.contains("which no earlier step of the workflow provides"),
                "{bad:?}: {e}"
            );
        }
    }

    /// This process, with another whose `--case auto` pick is `other`
    /// (an index into the presets; -1: it cannot read its memory; `None`:
    /// no collective is expected).
    #[derive(Debug)]
    struct BesideAnother {
        other: Option<i64>,
    }

    impl Comm for BesideAnother {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn describe(&self) -> String {
            "this process and another".into()
        }
        fn barrier(&self) -> Result<(), toast_core::CommError> {
            Ok(())
        }
        fn allreduce_f64(&self, _: &mut [f64], _: ReduceOp) -> Result<(), toast_core::CommError> {
            unreachable!("agreed_case reduces one integer")
        }
        fn allreduce_i64(
            &self,
            buf: &mut [i64],
            op: ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            let other = self.other.expect("no collective expected");
            assert_eq!((buf.len(), op), (1, ReduceOp::Min));
            buf[0] = buf[0].min(other);
            Ok(())
        }
        fn reduce_f64(
            &self,
            _: usize,
            _: &mut [f64],
            _: ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            unreachable!()
        }
        fn reduce_i64(
            &self,
            _: usize,
            _: &mut [i64],
            _: ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            unreachable!()
        }
        fn gather_bytes(
            &self,
            _: usize,
            _: &[u8],
        ) -> Result<Option<Vec<Vec<u8>>>, toast_core::CommError> {
            unreachable!()
        }
        fn broadcast_bytes(&self, _: usize, _: &mut Vec<u8>) -> Result<(), toast_core::CommError> {
            unreachable!()
        }
        fn abort(&self, code: i32) -> ! {
            panic!("abort({code})")
        }
    }

    /// `--case auto` is one preset for every process: the smallest of
    /// their picks (a process on a node with less free memory, or sharing
    /// it with a task farm's runs, picks smaller), and an error on every
    /// process when one cannot read its memory (not a process left
    /// waiting in the collective).
    #[test]
    fn every_process_takes_the_smallest_auto_pick() {
        let table = super::super::config::workflow_defaults("auto");
        let cfg = super::super::config::build(table).unwrap();
        let Some(own) = presets::memory_bound() else {
            return; // No memory to read here: nothing to agree on.
        };
        let (alone, _) = presets::auto(own.bytes, cfg.pixels.nside.get(), pointing_of(&cfg));
        let heroic = presets::PRESETS.len() as i64 - 1;
        let agreed = |other: i64, runs: usize| {
            SatelliteJob::agreed_case("auto", &cfg, &BesideAnother { other: Some(other) }, runs)
        };
        assert_eq!(agreed(heroic, 1).unwrap(), alone);
        assert_eq!(agreed(0, 1).unwrap(), "tiny");
        assert!(matches!(
            agreed(-1, 1),
            Err(WorkflowError::BadSize {
                option: "--case",
                ..
            })
        ));
        // Sharing the node with 2^40 runs leaves each too little for more
        // than the smallest (on any machine).
        assert_eq!(agreed(heroic, 1 << 40).unwrap(), "tiny");
        // A named case needs no collective (the communicator refuses one).
        let none = BesideAnother { other: None };
        assert_eq!(
            SatelliteJob::agreed_case("xsmall", &cfg, &none, 1).unwrap(),
            "xsmall"
        );
    }

    fn bad_option(r: Result<SatelliteJob, WorkflowError>) -> &'static str {
        match r {
            Err(WorkflowError::BadSize { option, .. }) => option,
            other => panic!("expected BadSize, got {other:?}"),
        }
    }

    #[test]
    fn detector_sets_merge_into_batches_in_order() {
        let sets: Vec<Vec<String>> = (0..5)
            .map(|p| vec![format!("{p}A"), format!("{p}B")])
            .collect();
        let merged = merge_sets(&sets, 4);
        assert_eq!(merged.len(), 3);
        assert_eq!(merged[0], ["0A", "0B", "1A", "1B"]);
        assert_eq!(merged[2], ["4A", "4B"]);
        assert_eq!(merged.concat(), sets.concat());
        // A set larger than the batch is cut into batches.
        let singles = merge_sets(&sets, 1);
        assert_eq!(singles.len(), 10);
        assert!(singles.iter().all(|s| s.len() == 1));
        assert_eq!(singles.concat(), sets.concat());
        let threes = merge_sets(&sets, 3);
        assert_eq!(
            threes.iter().map(Vec::len).collect::<Vec<_>>(),
            [2, 2, 2, 2, 2]
        );
    }

    #[test]
    fn derived_sizes_are_checked() {
        let j = job(&["baselines.step_time=1e16"], 2);
        assert_eq!(bad_option(j), "baselines.step_time");
        let j = job(&["baselines.step_time=0.001"], 2);
        assert_eq!(bad_option(j), "baselines.step_time");
        // Longer than the observation: one baseline per observation, as TOAST.
        assert!(job(&["baselines.step_time=1e6"], 2).is_ok());
        let j = job(&["sim_satellite.obs_minutes=1e12"], 2);
        assert_eq!(bad_option(j), "sim_satellite.obs_minutes");
        // Fewer than 2 samples an observation (1e-300 gave 0, the dry run
        // said so and the run failed in SimSatellite naming no setting).
        for short in ["1e-300", "1e-4", "0.000166"] {
            let e = job(&[&format!("sim_satellite.obs_minutes={short}")], 2)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("it needs at least 2"), "{short}: {e}");
        }
        assert!(job(&["sim_satellite.obs_minutes=0.00017"], 2).is_ok());
        // A mission that runs past the ephemeris's end.
        let j = job(
            &[
                "sim_satellite.mission_start=2099-12-31",
                "sim_satellite.obs_minutes=2000",
            ],
            2,
        );
        assert_eq!(bad_option(j), "sim_satellite.mission_start");
        let j = job(&["sim_satellite.obs_minutes=1e300"], 2);
        assert_eq!(bad_option(j), "sim_satellite.obs_minutes");
        let j = job(&["sim_satellite.gap_minutes=1e10"], 2);
        assert_eq!(bad_option(j), "sim_satellite.gap_minutes");
        // 2 x 1 x 2^52 samples fits the sample count but not the mission length.
        let j = job(&["sim_satellite.obs_minutes=7e11"], 2);
        assert_eq!(bad_option(j), "sim_satellite.obs_minutes");
        let e = job(&["sim_satellite.obs_minutes=1e12"], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sim_satellite.obs_minutes 1000000000000"), "{e}");
        // A rotation in less than two samples (a subnormal period's rate
        // overflowed to infinity: NaN pointing after the simulation).
        for option in ["sim_satellite.spin_period", "sim_satellite.prec_period"] {
            for fast in ["5e-324", "1e-300", "3e-4"] {
                let j = job(&[&format!("{option}={fast}")], 2);
                assert_eq!(bad_option(j), option, "{fast}");
            }
            assert!(job(&[&format!("{option}=3.4e-4")], 2).is_ok());
        }
        assert!(job(&[], 2).is_ok());
    }

    #[test]
    fn a_diverging_solve_names_its_input() {
        let sky = InputSky {
            nside: 1,
            maps: [vec![1.0; 12], vec![-3e38; 12], vec![0.0; 12]],
            source: "sky.fits".into(),
        };
        let cfg = crate::sim::ScanHealpixMapConfig::default();
        let e = WorkflowError::Diverged {
            input: describe_sky(&ScannedSky::of(&sky, None), &cfg),
            source: Box::new(OpError::Numerical {
                what: "mapmaker: PCG residual is not finite (NaN) at iteration 0".into(),
            }),
        };
        let msg = e.to_string();
        assert!(
            msg.starts_with("MapMaker: the solve diverged on sky map sky.fits"),
            "{msg}"
        );
        assert!(msg.contains("largest |value| 3e38 K"), "{msg}");
        assert!(msg.contains("PCG residual is not finite"), "{msg}");
        assert!(!msg.contains("invalid configuration"), "{msg}");
        let synthetic = InputSky {
            source: "synthetic".into(),
            ..sky
        };
        assert!(describe_sky(&ScannedSky::of(&synthetic, None), &cfg)
            .starts_with("the synthetic sky (scan_map.seed = "));
    }

    #[test]
    fn memory_check_refuses_what_does_not_fit() {
        let j = job(&[], 2).unwrap();
        let mut sim = j.simulation().unwrap();
        let plan = j.plan(&mut sim, 1, 1, None).unwrap();
        let execution = j.execution_plan(&Registry::new());
        assert!(execution.host());
        let per = j.predicted_process_memory(&plan, &sim, &execution);
        assert!(
            (per - j.predicted_memory(&execution)).abs() <= 1e-6 * per,
            "{per}"
        );
        let avail = |bytes: f64| presets::MemoryBound {
            bytes,
            source: "MemAvailable".into(),
            per_process: true,
        };
        assert!(j.check_memory(&avail(per), per, None).is_ok());
        let e = j.check_memory(&avail(per - 1.0), per, None).unwrap_err();
        assert!(matches!(e, WorkflowError::Memory { .. }));
        let msg = e.to_string();
        assert!(msg.contains("--ignore-memory-check"), "{msg}");
        assert!(msg.contains("MemAvailable"), "{msg}");
        assert!(!msg.contains("device"), "{msg}");
        // A device in the host's memory: its peak counts, and is named.
        assert!(j
            .check_memory(&avail(per), 0.75 * per, Some(("opencl", 0.25 * per)))
            .is_ok());
        let e = j
            .check_memory(&avail(per), 0.75 * per, Some(("opencl", 0.5 * per)))
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("backend opencl's device, whose memory is the host's"),
            "{msg}"
        );
        assert!(j
            .check_memory_on(
                &toast_core::SerialComm,
                &plan,
                &sim,
                &execution,
                &Registry::new()
            )
            .is_ok());
    }
}
