//! Workflow sizes: TOAST's benchmark presets and the memory estimate behind
//! `auto`.
//!
//! # Presets (`toast_benchmark_satellite`'s `select_case` / `select_distribution`)
//!
//! Each preset is a sample cap. Detectors are added two at a time (whole
//! focal-plane pixels) to one 1-hour observation of 360 000 samples while
//! `n_det · 360 000 ≤ cap`, up to 2054 detectors; after that whole
//! observations of 2054 detectors are added while `2054 · n_obs · 360 000 ≤
//! cap`, up to the 4320 observations of the schedule:
//!
//! | case | cap | n_det | n_obs |
//! |---|---|---|---|
//! | tiny | 5e6 | 12 | 1 |
//! | xsmall | 5e7 | 138 | 1 |
//! | small | 5e8 | 1388 | 1 |
//! | medium | 5e9 | 2054 | 6 |
//! | large | 5e10 | 2054 | 67 |
//! | xlarge | 5e11 | 2054 | 676 |
//! | heroic | 5e12 | 2054 | 4320 |
//!
//! # Memory estimate
//!
//! The peak resident memory of `toast-cli run` is predicted from the byte
//! counts of our own data layout (one process, all observations in memory)
//! and the pointing mode ([`Pointing`]: `binner.full_pointing` and
//! `pointing_batch`):
//!
//! * **per detector sample**, during map-making: `signal` (f64, 8), detector
//!   flags (u8, 1) and solver flags (u8, 1), and with `full_pointing` the
//!   kept pixels (i64, 8) and IQU weights (3×f64, 24):
//!   [`BYTES_PER_DET_SAMPLE_KEPT`] = 42 B; with `compact_pointing` the
//!   compact pixels (i32, 4): [`BYTES_PER_DET_SAMPLE_COMPACT`] = 12.5 B
//!   (14 allocated, but the detector flags stay untouched zero pages when
//!   nothing flags a sample, and the solver flags are written only where
//!   they cut: on xsmall the rcond cut touches most of their pages, on
//!   small none; counted as half a byte); else [`BYTES_PER_DET_SAMPLE`] = 10 B. The solver's work timestream
//!   (f64, 8) exists for one batch of `pointing_batch` detectors at a time
//!   (host runs), and so do the detector quaternions (4×f64, 32) and,
//!   unless kept, the pixels and weights, rebuilt in every pass: one
//!   batch's [`BYTES_PER_BATCH_SAMPLE`] = 72 B (recomputed: quaternions,
//!   pixels, weights, work timestream), [`BYTES_PER_BATCH_SAMPLE_COMPACT`]
//!   = 40 B (pixels, weights and work timestream; the first pass's
//!   quaternions are as many, its pixels written as i32 straight into the
//!   compact field) or [`BYTES_PER_BATCH_SAMPLE_KEPT`]
//!   = 8 B (the work timestream) per sample of each batch detector. With
//!   the map-maker's fused passes (the host default with compact or kept
//!   pointing) the solver makes no work timestream; the terms are left as
//!   they were measured, since tiny's and xsmall's peaks are not in the
//!   solve (tiny's measured peak is the same with and without them);
//! * **per time sample** ([`BYTES_PER_TIME_SAMPLE`] = 89 B): `times` 8,
//!   shared flags 1, `boresight_radec` 32, `position` 24, `velocity` 24;
//! * **per local map pixel** ([`BYTES_PER_LOCAL_PIXEL`] = 45 B): the
//!   final products held at once (hits, 3×3 covariance, rcond, binned and
//!   destriped I/Q/U maps: 112 B allocated; the solver's are freed before
//!   them), counted as resident: the maps are allocated as untouched zero
//!   pages on ordinary (not huge) pages, and the resets, the covariance
//!   inversion and the products' moves write only where a value is
//!   non-zero, so the pages that hold no hit pixel are never mapped (on
//!   xsmall a third of the local pixels are hit and about 70% of the
//!   pages are touched; tiny's 5% hit touches fewer); the local pixels are
//!   those of the hit submaps, estimated as a fraction
//!   [`SUBMAP_FRACTION_PER_OBS`] of the sky per observation (tiny: 911 of
//!   3072 submaps), at most the whole sky;
//! * **the input sky** ([`BYTES_PER_SKY_PIXEL_SCAN`] = 28 B per pixel of
//!   `12·nside²`, before the scan's pointing exists): the map as
//!   read from a file (3×f64; the synthetic sky is 3×f32 from the start) and one component converted to f32 (each
//!   f64 component is freed once converted); then, while it is scanned,
//!   the sky (3×f32, [`BYTES_PER_SKY_PIXEL_HELD`] = 12 B) beside the
//!   timestream of the scan: [`BYTES_PER_DET_SAMPLE_IO`] = 9 B (signal and
//!   flags), or 41 B with `full_pointing` (the scan then keeps its
//!   pointing between its two passes). A device run makes the synthetic
//!   sky on a background thread from its start (`SkySynthesis`), so the
//!   sky and its a_ℓm (about 25 MB at nside 1024) are also held during the
//!   simulation, which holds less than the scan; a host run makes it at
//!   the scan's start;
//! * **the outputs**: the map-maker's products are moved (one process) or
//!   gathered out of the data after the detector data are dropped, and the
//!   maps are written from their submaps without full-sky copies
//!   ([`BYTES_PER_OUTPUT_LOCAL_PIXEL`] = 56 B: hits, binned and destriped
//!   maps), the plot expanding one full-sky component at a time beside the
//!   hit mask ([`BYTES_PER_SKY_PIXEL_OUT`] = 9 B);
//! * a fixed [`BASE_BYTES`] (program, plugin, thread stacks, allocator slack).
//!
//! The peak is the base, the time samples, and the largest of the
//! map-making term (detector samples, local pixels and a pointing batch),
//! the sky term and the output term.
//!
//! Checked against measured runs (VmHWM, 2 threads, this repository's
//! 2-core 24 GB machine; tests `estimate_matches_measured_*`): tiny
//! (pointing kept) 493 844 kB (prediction −8%; its peak is the map-maker's
//! end); tiny with `--sky-map` (a NSIDE 1024 I/Q/U file) 422 020 kB (+8%);
//! xsmall (default, compact pointing with the fused passes) 1 005 256 kB
//! (+4%; the peak is the final maps); xsmall (kept) 2 326 156 kB (−0.4%).
//! small (default, compact pointing with the fused passes) 6 281 292 kB
//! (+3%; 380.8 s, exact hits).
//!
//! # Host memory of a device run
//!
//! On a device plan ([`HostRole::BesideDevice`]) the device scopes hold
//! every per-sample field: the host creates the detector data's fields
//! but never touches their pages (untouched zero pages are not resident),
//! and expands no pointing. Its peak is the base, the time samples, and
//! the largest of:
//!
//! * the sky, as on the host (the scan's scope uploads it);
//! * the products on the device's pixel grid ([`DeviceGrid::local_pixels`],
//!   the distribution the device's hit submaps give): the hits and
//!   covariance downloaded for the 3x3 inversion, and the outputs
//!   ([`BYTES_PER_LOCAL_PIXEL`], [`BYTES_PER_OUTPUT_LOCAL_PIXEL`] and
//!   [`BYTES_PER_SKY_PIXEL_OUT`], as on the host);
//! * the run-time compiler, when the compiled device code is not in the
//!   disk cache: it compiles at the scan's first kernel, beside the sky
//!   the scan holds ([`HOST_BYTES_DEVICE_COMPILER`] = 240 MB: with the
//!   cache off, the emulated drivers' runs of tiny peaked at 457 468 kB
//!   (hiprtc) and 387 556 kB (NVRTC) of resident memory in all, 376 MB and
//!   296 MB beside the base and the time samples, of which the sky is
//!   151 MB; at nside 128, 247 964 kB and 194 104 kB);
//! * with the detector data streamed, the signal and both flags on the host
//!   ([`BYTES_PER_DET_SAMPLE`] = 10 B a detector sample; the scan's
//!   timestream too, [`BYTES_PER_DET_SAMPLE_IO`]).
//!
//! So a resident device plan's host memory does not grow with the
//! detector samples. Measured as the resident memory outside the emulated
//! device's shared mappings (`toast-gpu-emu`'s heap), sampled while the
//! run ran (`--backend cuda` on the emulator, the synthetic sky): tiny
//! 324 104 kB (predicted 0.41 GiB; the CPU run 486 092 kB), xsmall
//! 386 456 kB at its outputs (predicted 0.41 GiB; the CPU run
//! 1 005 256 kB). small is predicted at 0.41 GiB against the CPU's 6.17
//! GiB. `toast-cli run --dry-run` prints this prediction for a device
//! run, the run's `stats.json` keeps it (`predicted_memory_bytes`), and
//! the memory check holds the run to it. `auto` still sizes the case by
//! the host plan's model: the backend is not known when it chooses.
//!
//! # Device memory estimate (device plans)
//!
//! On a device backend the largest device scope is the map-maker's, whose
//! staged buffers all live until it closes (the peak is their sum). From
//! the buffers of `tiny` on `--backend opencl` (`device-kept-fused`; the
//! run's summary and `stats.json`'s `device_peak_staged_buffers` list
//! them):
//!
//! * per detector sample [`DEVICE_BYTES_PER_DET_SAMPLE`] = 42 B: `signal` 8,
//!   detector flags 1, solver flags 1, pixels 8 and IQU weights 24 (the
//!   quaternions they are expanded from are freed at once;
//!   `device-recomputed` with all detectors at once holds the same fields,
//!   refilled in every pass);
//! * per time sample [`DEVICE_BYTES_PER_TIME_SAMPLE`] = 33 B: the boresight
//!   32 and the shared flags 1;
//! * per local pixel 8 bytes per value of the solver's binned map (`nnz`
//!   values) and covariance (`nnz (nnz + 1) / 2`), the peak in the solve,
//!   and of the hits, which the covariance passes accumulate beside it: 80 B
//!   for IQU ([`device_bytes_per_local_pixel`]). The hits go back to the
//!   host once accumulated, the solver's maps once the solve is over, and a
//!   final map once binned (its covariance is applied on the host), so the
//!   final passes hold one map at a time. The local pixels are those of
//!   the hit submaps, so they depend on the grid (`pixels.nside_submap`,
//!   [`DeviceGrid`]): a device allocates every pixel of every local
//!   submap, where the host never touches the pages that hold no hit
//!   pixel. A device run that does not set `pixels.nside_submap` gets the
//!   grid of [`DEVICE_SUBMAPS_A_SIDE`]² submaps ([`device_nside_submap`]:
//!   2 for nside 1024, submaps of 48 pixels instead of TOAST's 3072), which
//!   follow the scan's footprint: tiny 946 080 local pixels instead of
//!   2 798 592, xsmall 2 595 168 instead of 3 879 936, small 2 741 856
//!   (measured), the maps unchanged. On that grid the estimate is
//!   [`FINE_PIXEL_FRACTION_PER_OBS`] of the sky per observation (small's
//!   measured fraction is 0.218, xsmall's 0.206; tiny's narrower focal
//!   plane 0.075), else
//!   [`SUBMAP_FRACTION_PER_OBS`], as for the host. The grid's tables add
//!   [`DEVICE_BYTES_PER_SUBMAP`] = 9 B a submap (`global2local`, i64, and
//!   the pixel kernel's hit-submap bytes).
//!
//! ## Transients
//!
//! Two phases before the solve's maps exist can hold more, and the peak is
//! the largest phase:
//!
//! * the kept pointing's expansion: the quaternions of every detector
//!   beside the pixels, weights and timestream they make,
//!   [`DEVICE_BYTES_PER_DET_SAMPLE_EXPANDING`] = 73 B a detector sample
//!   (quaternions 32, pixels 8, weights 24, `signal` 8, flags 1; the scan
//!   frees its quaternions' device copy once they are expanded);
//! * the noise simulation's FFT workspace: the twiddle table and at least
//!   one detector's stream, [`DEVICE_NOISE_BYTES_PER_FFT_POINT`] = 24 B a
//!   point of [`noise_fft_len`] (2^20 for an hour at 100 Hz: 25 MB), beside
//!   the time samples and the detector data (with the kept pointing, its
//!   pixels and weights; a batched plan's transient pointing is dropped
//!   first), before any map ([`DeviceMemory::noise`]). The kernel fits more
//!   detectors a launch only in the budget's room (`toast-gpu`'s
//!   `workspace`), so it never needs more.
//!
//! The expansion outweighs the solve wherever 31 B a detector sample
//! outweigh the maps: at nside 128 (a 4-detector tiny run peaked there,
//! 1.6x the solve's model), and from about 7e6 detector samples at nside
//! 1024. It is conservative where the expansion runs per detector set:
//! xsmall's kept plan is predicted at 3.39 GiB against 2.1 GiB of staged
//! buffers measured.
//!
//! The fused device passes (the default: `device-kept-fused`,
//! `device-compact-fused`, `device-recomputed-fused`) make no work timestream; the unfused ones (a
//! plugin without the fused kernels) add [`DEVICE_BYTES_WORK_TIMESTREAM`] =
//! 8 B per detector sample (the right-hand side's whole copy) and, batched,
//! per sample of each batch detector (the left-hand side's): the
//! `work_timestream` argument of [`DeviceMemory::of`].
//!
//! Measured: tiny 394 856 180 bytes on TOAST's grid
//! (`device_peak_staged_bytes`, opencl, fused: 72 B a local pixel at the
//! peak); predicted 495 309 888 (+25%: the local pixels are overestimated,
//! as for the host), an estimate on the safe side for refusing, before any
//! work, a run that would not fit its device memory budget. On the device
//! grid (the default): 263 797 748 bytes (the bus 0.08 GiB up and 0.09 GiB
//! down instead of 0.20 and 0.27), predicted 0.39 GiB (+58%: tiny's
//! footprint is narrower than small's, whose fraction the model takes). The sky
//! scan's scope (72 B per detector sample and the input map) is smaller.
//!
//! `device-recomputed` with a batch of `b` detectors
//! ([`DevicePointing::Batched`]) holds per detector sample
//! [`DEVICE_BYTES_PER_DET_SAMPLE_RESIDENT`] = 10 B (`signal` 8, detector
//! and solver flags 1 each) and per time sample of each batch detector
//! [`DEVICE_BYTES_PER_BATCH_SAMPLE`] = 64 B (quaternions 32, pixels 8, IQU
//! weights 24). Measured: tiny with batches of 4 (opencl, fused),
//! 348 780 276 bytes; with the measured local pixels (2 798 592) at the
//! solve's 72 B, the model gives 348.74 MB.
//! The sky scan then expands its pointing per batch too (its scope: the
//! timestream, the input map and one batch). The satellite workflow
//! chooses it, with the largest batch that fits, when neither the kept
//! pointing nor the compact pointing (below) fits the budget
//! (`SatelliteJob::fit_device_budget`).
//!
//! `device-compact` ([`DevicePointing::Compact`], `binner.compact_pointing`
//! on a device) holds what `device-recomputed` does plus the compact pixels,
//! [`DEVICE_BYTES_COMPACT_PIXEL`] = 4 B per detector sample (the
//! `pixels_healpix` kernel writes them as i32 once, ABI minor 8), and per
//! batch the pointing fields of the passes that read them (the
//! quaternions while the compact pixels are made, then pixels and weights
//! rebuilt by `compact_expand_pointing`: at most 32 B a batch sample, counted
//! at 64). The fused solver passes rebuild the weights inside their kernels,
//! so no pass recomputes the pointing kernels. Over the budget, the
//! satellite workflow keeps it (or turns kept pointing into it, where the
//! pixels fit an i32 and the plugin writes them), with the largest batch
//! that fits, before it falls back to recomputed pointing.
//!
//! With the detector data streamed as well (`binner.stream_detector_data`,
//! [`DevicePointing::Streamed`]) nothing is held per detector sample: each
//! batch detector adds its pointing (64 B a time sample) and
//! [`DEVICE_BYTES_PER_DET_SAMPLE_STREAMED`] = 18 B of detector data
//! (`signal` 8, detector and solver flags 1 each, and the offset
//! template's good-sample work field 8, which lives beside them while the
//! template is set up), so the device holds the time samples, the pixels
//! and one batch ([`DeviceMemory::fixed`]) whatever the number of
//! detectors. The workflow chooses it when not even one detector a batch
//! fits beside the whole detector data. Measured: xsmall in a budget of
//! 256 MiB (opencl, batches of one detector): 230 873 536 bytes, the
//! solve's maps 186.9 MB of them (2 595 168 local pixels at 72 B);
//! predicted 0.25 GiB (265 MB: 80 B a pixel of 0.22 of the sky).
//!
//! # Pointing by case
//!
//! The workflow keeps the pointing ([`keeps_pointing`]) for `tiny`, where
//! the kept pointing is small and saves rebuilding it. From `xsmall` on
//! (and for `auto`) it keeps it in compact form
//! ([`Pointing::default_for`]: `binner.compact_pointing`): 14 B per
//! detector sample instead of 42, the weights rebuilt from the 4-byte
//! pixels and the boresight inside the map-maker's fused passes, as fast
//! as the kept pointing on xsmall. `compact_pointing = false` gives
//! TOAST's recomputation by the kernels (10 B, slowest).

/// The machine's memory, read where the lower layers need it too.
pub use crate::sysinfo::{
    mem_available, mem_total, memory_bound, memory_bounds, peak_rss, process_share, MemoryBound,
};

/// Samples per detector in one 1-hour observation at 100 Hz.
pub const SAMPLES_PER_OBS: u64 = 360_000;
/// Detectors in the full focal plane.
pub const MAX_DETECTORS: u64 = 2054;
/// Observations in the schedule (six months).
pub const MAX_OBSERVATIONS: u64 = 4320;

/// The named presets, smallest first, with their sample caps.
pub const PRESETS: [(&str, f64); 7] = [
    ("tiny", 5e6),
    ("xsmall", 5e7),
    ("small", 5e8),
    ("medium", 5e9),
    ("large", 5e10),
    ("xlarge", 5e11),
    ("heroic", 5e12),
];

/// See the module documentation.
pub const BYTES_PER_DET_SAMPLE: f64 = 10.0;
/// See the module documentation.
pub const BYTES_PER_DET_SAMPLE_KEPT: f64 = 42.0;
/// See the module documentation.
pub const BYTES_PER_DET_SAMPLE_COMPACT: f64 = 12.5;
/// See the module documentation.
pub const BYTES_PER_DET_SAMPLE_IO: f64 = 9.0;
/// See the module documentation.
pub const BYTES_PER_KEPT_POINTING: f64 = 32.0;
/// See the module documentation.
pub const BYTES_PER_BATCH_SAMPLE: f64 = 72.0;
/// See the module documentation.
pub const BYTES_PER_BATCH_SAMPLE_COMPACT: f64 = 40.0;
/// See the module documentation.
pub const BYTES_PER_BATCH_SAMPLE_KEPT: f64 = 8.0;
/// See the module documentation.
pub const BYTES_PER_TIME_SAMPLE: f64 = 89.0;
/// See the module documentation.
pub const BYTES_PER_LOCAL_PIXEL: f64 = 45.0;
/// See the module documentation.
pub const BYTES_PER_SKY_PIXEL_SCAN: f64 = 28.0;
/// See the module documentation.
pub const BYTES_PER_SKY_PIXEL_HELD: f64 = 12.0;
/// See the module documentation.
pub const BYTES_PER_OUTPUT_LOCAL_PIXEL: f64 = 56.0;
/// See the module documentation.
pub const BYTES_PER_SKY_PIXEL_OUT: f64 = 9.0;
/// See the module documentation.
pub const SUBMAP_FRACTION_PER_OBS: f64 = 0.30;
/// See the module documentation.
pub const FINE_PIXEL_FRACTION_PER_OBS: f64 = 0.22;
/// See the module documentation.
pub const DEVICE_SUBMAPS_A_SIDE: u64 = 512;
/// See the module documentation.
pub const DEVICE_BYTES_PER_SUBMAP: f64 = 9.0;
/// See the module documentation.
pub const BASE_BYTES: f64 = 60.0e6;

/// See the module documentation.
pub const HOST_BYTES_DEVICE_COMPILER: f64 = 240.0e6;

/// How the map-maker holds the pointing (`binner.full_pointing`,
/// `compact_pointing` and `pointing_batch`), for the memory estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointing {
    /// Pixels and weights expanded once and kept for all detectors.
    pub full: bool,
    /// Without `full`: the pixels kept in compact form (i32).
    pub compact: bool,
    /// Detectors per pointing pass (0: all at once).
    pub batch: u64,
}

impl Pointing {
    /// The workflow's default for `case` (see [`keeps_pointing`]): kept,
    /// else compact, with the default batch of 8 detectors.
    pub fn default_for(case: &str) -> Self {
        let full = keeps_pointing(case);
        Pointing {
            full,
            compact: !full,
            batch: 8,
        }
    }
}

/// Whether the workflow keeps the pointing by default for `case` (see the
/// module documentation): `tiny` only; the other cases (and `auto`) keep
/// it in compact form.
pub fn keeps_pointing(case: &str) -> bool {
    matches!(case, "tiny")
}

/// A workflow size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// Detectors.
    pub n_det: u64,
    /// Observations.
    pub n_obs: u64,
    /// Samples per detector of the longest observation (360 000 for 1 hour
    /// at 100 Hz).
    pub samples_per_obs: u64,
    /// Samples per detector over all the observations: `n_obs` ×
    /// `samples_per_obs` where they are all as long, as in the presets;
    /// the simulation's sampling may make some one sample shorter
    /// (`SimSatelliteConfig::schedule`, which the workflow's size check
    /// sets both from).
    pub samples_per_det: u64,
}

impl Sizing {
    /// `n_det` detectors of `n_obs` observations of `samples_per_obs`
    /// samples each.
    pub fn uniform(n_det: u64, n_obs: u64, samples_per_obs: u64) -> Sizing {
        Sizing {
            n_det,
            n_obs,
            samples_per_obs,
            samples_per_det: n_obs * samples_per_obs,
        }
    }

    /// Total detector samples (= the expected total hits).
    pub fn samples(&self) -> u64 {
        self.n_det * self.samples_per_det
    }
}

/// TOAST's `select_distribution` for a sample cap (see the module documentation).
pub fn select_distribution(cap: f64) -> Sizing {
    let per = SAMPLES_PER_OBS as f64;
    let mut n_det = 0u64;
    while n_det + 2 <= MAX_DETECTORS && ((n_det + 2) as f64) * per <= cap {
        n_det += 2;
    }
    let mut n_obs = 1u64;
    if n_det == MAX_DETECTORS {
        while n_obs < MAX_OBSERVATIONS && (n_det * (n_obs + 1)) as f64 * per <= cap {
            n_obs += 1;
        }
    }
    Sizing::uniform(n_det.max(2), n_obs, SAMPLES_PER_OBS)
}

/// The sizing of a named preset, or `None` for an unknown name.
pub fn preset(name: &str) -> Option<Sizing> {
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, cap)| select_distribution(*cap))
}

/// Names accepted by `--case`.
pub fn names() -> String {
    let mut v: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
    v.push("auto");
    v.join(", ")
}

/// See the module documentation.
pub const DEVICE_BYTES_PER_DET_SAMPLE: f64 = 42.0;
/// See the module documentation.
pub const DEVICE_BYTES_PER_TIME_SAMPLE: f64 = 33.0;

/// See the module documentation.
pub const DEVICE_BYTES_PER_DET_SAMPLE_RESIDENT: f64 = 10.0;
/// See the module documentation.
pub const DEVICE_BYTES_PER_BATCH_SAMPLE: f64 = 64.0;
/// See the module documentation.
pub const DEVICE_BYTES_PER_DET_SAMPLE_STREAMED: f64 = 18.0;
/// See the module documentation.
pub const DEVICE_BYTES_WORK_TIMESTREAM: f64 = 8.0;
/// See the module documentation.
pub const DEVICE_BYTES_PER_DET_SAMPLE_EXPANDING: f64 = 73.0;
/// See the module documentation.
pub const DEVICE_BYTES_COMPACT_PIXEL: f64 = 4.0;
/// See the module documentation.
pub const DEVICE_NOISE_BYTES_PER_FFT_POINT: f64 = 24.0;

/// The FFT length of the noise simulation of `n_samples` samples: the
/// smallest power of two above twice them (TOAST's oversampling of 2,
/// `sim::noise::NoiseFilter`).
pub fn noise_fft_len(n_samples: u64) -> u64 {
    (2 * n_samples + 1).next_power_of_two()
}

/// Device bytes per local pixel of `nnz` Stokes values (see the module
/// documentation): a map of `nnz` values, the covariance and the hits.
pub fn device_bytes_per_local_pixel(nnz: u64) -> f64 {
    (8 * (nnz + nnz * (nnz + 1) / 2 + 1)) as f64
}

/// The pixel grid of a device run, for its device memory: the map
/// resolution, the submaps' (`pixels.nside_submap`) and the Stokes values
/// per pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceGrid {
    /// `pixels.nside`.
    pub nside: u64,
    /// `pixels.nside_submap`.
    pub nside_submap: u64,
    /// Stokes values per pixel (3 for IQU).
    pub nnz: u64,
}

impl DeviceGrid {
    /// Submaps: `(nside / nside_submap)²`.
    pub fn n_submap(&self) -> f64 {
        let r = (self.nside / self.nside_submap.max(1)) as f64;
        r * r
    }

    /// The estimated local pixels of `n_obs` observations (see the module
    /// documentation): the fraction of the sky their submaps cover,
    /// [`FINE_PIXEL_FRACTION_PER_OBS`] per observation on a grid of at
    /// least [`DEVICE_SUBMAPS_A_SIDE`]² submaps, else
    /// [`SUBMAP_FRACTION_PER_OBS`], at most the whole sky.
    pub fn local_pixels(&self, n_obs: u64) -> f64 {
        let npix = 12.0 * (self.nside as f64) * (self.nside as f64);
        let fine = DEVICE_SUBMAPS_A_SIDE * DEVICE_SUBMAPS_A_SIDE;
        let fraction = if self.n_submap() >= fine as f64 {
            FINE_PIXEL_FRACTION_PER_OBS
        } else {
            SUBMAP_FRACTION_PER_OBS
        };
        npix * (fraction * n_obs as f64).min(1.0)
    }
}

/// `pixels.nside_submap` of a device run that does not set it: the grid
/// of [`DEVICE_SUBMAPS_A_SIDE`]² submaps (2 for nside 1024: submaps of
/// 48 pixels), at least 1 and at most TOAST's 16 (see the module
/// documentation).
pub fn device_nside_submap(nside: u64) -> u64 {
    (nside / DEVICE_SUBMAPS_A_SIDE)
        .clamp(1, 16)
        .min(nside.max(1))
}

/// How a device plan holds the pointing, for its device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevicePointing {
    /// Every detector's, expanded once and kept (`device-kept`, or
    /// `device-recomputed` all at once).
    Kept,
    /// One batch of this many detectors at a time (`device-recomputed`).
    Batched(u64),
    /// One batch of this many detectors at a time, with their detector
    /// data (`device-recomputed`, detector data streamed).
    Streamed(u64),
    /// The compact pixels of every detector kept (4 B a detector sample),
    /// and one batch of this many detectors' pointing fields at a time
    /// for the passes that read them (`device-compact`).
    Compact(u64),
}

/// The device memory of one process on a device plan (see the module
/// documentation): what does not depend on the pointing batch, and what
/// each batch detector adds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DeviceMemory {
    /// Bytes with the pointing kept ([`DevicePointing::Kept`]), the
    /// largest of its phases.
    pub kept: f64,
    /// Bytes of a batched plan besides its batch.
    pub resident: f64,
    /// Bytes each detector of a batch adds.
    pub per_batch_detector: f64,
    /// Bytes with no detector data at all (the time samples, the pixels
    /// and the grid's tables): a streamed plan's besides its batch.
    pub fixed: f64,
    /// Bytes of one detector's data (`signal` and flags) beside its
    /// pointing in a streamed batch.
    pub per_detector_data: f64,
    /// The noise simulation's phase besides the detector data: the time
    /// samples and the FFT workspace (see "Transients"; no map, no
    /// transient pointing).
    pub noise: f64,
    /// The detector data a batched plan holds in that phase.
    pub resident_data: f64,
    /// The compact pixels of every detector (`device-compact`).
    pub compact_pixels: f64,
}

impl DeviceMemory {
    /// The model for one process holding `det_samples` detector samples of
    /// `n_obs` observations with `time_samples` time samples in all, on
    /// the pixel grid `grid`, with the unfused passes' `work_timestream`
    /// or not.
    pub fn of(
        det_samples: f64,
        time_samples: f64,
        n_obs: u64,
        grid: DeviceGrid,
        work_timestream: bool,
    ) -> Self {
        let time = DEVICE_BYTES_PER_TIME_SAMPLE * time_samples;
        let fixed = time
            + device_bytes_per_local_pixel(grid.nnz) * grid.local_pixels(n_obs)
            + DEVICE_BYTES_PER_SUBMAP * grid.n_submap();
        // The scan's noise, before any map (see "Transients").
        let per_obs = (time_samples / n_obs.max(1) as f64).ceil() as u64;
        let noise = time + DEVICE_NOISE_BYTES_PER_FFT_POINT * noise_fft_len(per_obs) as f64;
        let work = if work_timestream {
            DEVICE_BYTES_WORK_TIMESTREAM
        } else {
            0.0
        };
        let kept = (fixed + (DEVICE_BYTES_PER_DET_SAMPLE + work) * det_samples)
            .max(time + DEVICE_BYTES_PER_DET_SAMPLE_EXPANDING * det_samples)
            .max(noise + DEVICE_BYTES_PER_DET_SAMPLE * det_samples);
        DeviceMemory {
            kept,
            resident: fixed + (DEVICE_BYTES_PER_DET_SAMPLE_RESIDENT + work) * det_samples,
            per_batch_detector: (DEVICE_BYTES_PER_BATCH_SAMPLE + work) * time_samples,
            fixed,
            per_detector_data: DEVICE_BYTES_PER_DET_SAMPLE_STREAMED * time_samples,
            noise,
            resident_data: DEVICE_BYTES_PER_DET_SAMPLE_RESIDENT * det_samples,
            compact_pixels: DEVICE_BYTES_COMPACT_PIXEL * det_samples,
        }
    }

    /// The predicted peak with `pointing`: the largest of its phases.
    pub fn peak(&self, pointing: DevicePointing) -> f64 {
        match pointing {
            DevicePointing::Kept => self.kept,
            DevicePointing::Batched(b) => (self.resident + self.per_batch_detector * b as f64)
                .max(self.noise + self.resident_data),
            DevicePointing::Compact(b) => {
                (self.resident + self.compact_pixels + self.per_batch_detector * b as f64)
                    .max(self.noise + self.resident_data)
            }
            DevicePointing::Streamed(b) => {
                let b = b as f64;
                (self.fixed + (self.per_batch_detector + self.per_detector_data) * b)
                    .max(self.noise + self.per_detector_data * b)
            }
        }
    }

    /// The most detectors a batch may hold within `budget` bytes (0: not
    /// even one, or not the noise's phase).
    pub fn largest_batch(&self, budget: f64) -> u64 {
        if self.noise + self.resident_data > budget {
            return 0;
        }
        Self::most(budget - self.resident, self.per_batch_detector)
    }

    /// The most detectors a batch of the compact plan may hold within
    /// `budget` bytes (0: not even one, or not the noise's phase).
    pub fn largest_compact_batch(&self, budget: f64) -> u64 {
        if self.noise + self.resident_data > budget {
            return 0;
        }
        Self::most(
            budget - self.resident - self.compact_pixels,
            self.per_batch_detector,
        )
    }

    /// The most detectors a streamed batch may hold within `budget` bytes
    /// (0: not even one).
    pub fn largest_streamed_batch(&self, budget: f64) -> u64 {
        Self::most(
            budget - self.fixed,
            self.per_batch_detector + self.per_detector_data,
        )
        .min(Self::most(budget - self.noise, self.per_detector_data))
    }

    fn most(room: f64, each: f64) -> u64 {
        if room < each {
            return 0;
        }
        (room / each.max(1.0)).floor() as u64
    }
}

/// Predicted peak memory in bytes of one process running the whole job
/// `s` with the map-maker's work where `role` says (see the module
/// documentation).
pub fn predicted_memory(s: Sizing, nside: u64, role: HostRole) -> f64 {
    predicted_process_memory(
        s.samples() as f64,
        s.samples_per_det as f64,
        s.n_obs,
        nside,
        role,
    )
}

/// Where a run's per-sample work is, for the host's memory: on the host
/// (the map-maker holding the pointing as [`Pointing`] says) or on a
/// device (see "Host memory of a device run" in the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRole {
    /// A host plan: the host holds the detector data and the map-maker's
    /// pointing.
    MapMaker(Pointing),
    /// A device plan: the device scopes hold the per-sample data; the host
    /// holds the time samples, the sky, the products on the device's pixel
    /// grid `grid` and, with `detector_data`, the detector data (streamed a
    /// batch at a time, or copied back by a run without one device scope).
    BesideDevice {
        /// The device's pixel grid, on which the products are distributed.
        grid: DeviceGrid,
        /// The detector data live on the host (`binner.stream_detector_data`,
        /// or the map-maker or the scan off).
        detector_data: bool,
    },
}

/// Predicted peak memory of one process holding `det_samples` detector
/// samples of `n_obs` observations with `time_samples` time samples in all
/// (the same model as [`predicted_memory`]; each process of a distributed
/// run reads the full input sky and holds the hit submaps of its own
/// observations).
pub fn predicted_process_memory(
    det_samples: f64,
    time_samples: f64,
    n_obs: u64,
    nside: u64,
    role: HostRole,
) -> f64 {
    let npix = 12.0 * (nside as f64) * (nside as f64);
    let (local_pix, per_sample, per_io_sample, batch, compile) = match role {
        HostRole::MapMaker(pointing) => {
            let n_det = if time_samples > 0.0 {
                det_samples / time_samples
            } else {
                0.0
            };
            let batch_dets = match pointing.batch {
                0 => n_det,
                b => n_det.min(b as f64),
            };
            let (per_sample, per_io_sample, per_batch_sample) = if pointing.full {
                (
                    BYTES_PER_DET_SAMPLE_KEPT,
                    BYTES_PER_DET_SAMPLE_IO + BYTES_PER_KEPT_POINTING,
                    BYTES_PER_BATCH_SAMPLE_KEPT,
                )
            } else if pointing.compact {
                (
                    BYTES_PER_DET_SAMPLE_COMPACT,
                    BYTES_PER_DET_SAMPLE_IO,
                    BYTES_PER_BATCH_SAMPLE_COMPACT,
                )
            } else {
                (
                    BYTES_PER_DET_SAMPLE,
                    BYTES_PER_DET_SAMPLE_IO,
                    BYTES_PER_BATCH_SAMPLE,
                )
            };
            (
                npix * (SUBMAP_FRACTION_PER_OBS * n_obs as f64).min(1.0),
                per_sample,
                per_io_sample,
                per_batch_sample * batch_dets * time_samples,
                0.0,
            )
        }
        HostRole::BesideDevice {
            grid,
            detector_data,
        } => {
            let (per_sample, per_io_sample) = if detector_data {
                (BYTES_PER_DET_SAMPLE, BYTES_PER_DET_SAMPLE_IO)
            } else {
                (0.0, 0.0)
            };
            let local = grid.local_pixels(n_obs);
            (
                local,
                per_sample,
                per_io_sample,
                0.0,
                HOST_BYTES_DEVICE_COMPILER,
            )
        }
    };
    let mapmaking = per_sample * det_samples + BYTES_PER_LOCAL_PIXEL * local_pix + batch;
    // The device code is compiled at the scan's first kernel, beside the
    // sky it holds.
    let sky = (BYTES_PER_SKY_PIXEL_SCAN * npix)
        .max(BYTES_PER_SKY_PIXEL_HELD * npix + per_io_sample * det_samples + compile);
    let outputs = BYTES_PER_OUTPUT_LOCAL_PIXEL * local_pix + BYTES_PER_SKY_PIXEL_OUT * npix;
    let phases = mapmaking.max(sky).max(outputs);
    BASE_BYTES + BYTES_PER_TIME_SAMPLE * time_samples + phases
}

/// `bytes` as GiB with two decimals, as the workflow's messages print
/// memory.
pub fn gib(bytes: f64) -> String {
    let g = bytes / (1u64 << 30) as f64;
    if g.abs() < 1e9 {
        format!("{g:.2} GiB")
    } else {
        format!("{g:.3e} GiB")
    }
}

/// `auto`: the largest preset whose predicted memory with `pointing` on
/// the host is at most 80% of `available` bytes (tiny if none fits).
pub fn auto(available: f64, nside: u64, pointing: Pointing) -> (&'static str, Sizing) {
    let mut best = ("tiny", select_distribution(PRESETS[0].1));
    for (name, cap) in PRESETS {
        let s = select_distribution(cap);
        if predicted_memory(s, nside, HostRole::MapMaker(pointing)) <= 0.8 * available {
            best = (name, s);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_match_toast() {
        let want = [
            ("tiny", 12, 1, 4_320_000u64),
            ("xsmall", 138, 1, 49_680_000),
            ("small", 1388, 1, 499_680_000),
            ("medium", 2054, 6, 4_436_640_000),
            ("large", 2054, 67, 49_542_480_000),
            ("xlarge", 2054, 676, 499_861_440_000),
            ("heroic", 2054, 4320, 3_194_380_800_000),
        ];
        for (name, n_det, n_obs, samples) in want {
            let s = preset(name).unwrap();
            assert_eq!((s.n_det, s.n_obs), (n_det, n_obs), "{name}");
            assert_eq!(s.samples(), samples, "{name}");
        }
        assert!(preset("huge").is_none());
        assert!(names().contains("auto"));
    }

    /// Within 10% of `measured` bytes (VmHWM of `toast-cli run --case
    /// CASE`, 2 threads, the workflow's default pointing for the case).
    fn check_measured(case: &str, measured: f64) {
        check_measured_with(case, Pointing::default_for(case), measured);
    }

    fn check_measured_with(case: &str, pointing: Pointing, measured: f64) {
        let p = predicted_memory(preset(case).unwrap(), 1024, HostRole::MapMaker(pointing));
        assert!(
            (measured * 0.9..measured * 1.1).contains(&p),
            "{case}: predicted {p}, measured {measured}"
        );
    }

    /// The device model of one process running `tiny` on `grid`.
    fn tiny_device_model(grid: DeviceGrid, work_timestream: bool) -> DeviceMemory {
        let s = preset("tiny").unwrap();
        DeviceMemory::of(
            s.samples() as f64,
            s.samples_per_det as f64,
            s.n_obs,
            grid,
            work_timestream,
        )
    }

    #[test]
    fn device_estimate_is_above_the_measured_device_peak_and_close() {
        // tiny on --backend opencl (device-kept-fused):
        // device_peak_staged_bytes.
        let measured = 394_856_180.0;
        let s = preset("tiny").unwrap();
        let toast_grid = DeviceGrid {
            nside: 1024,
            nside_submap: 16,
            nnz: 3,
        };
        let model = |work_timestream| tiny_device_model(toast_grid, work_timestream);
        let p = model(false).peak(DevicePointing::Kept);
        assert!(
            p >= measured && p <= 1.3 * measured,
            "predicted {p}, measured {measured}"
        );
        // The unfused passes' work timestream: 8 bytes a detector sample,
        // and 8 a batch sample.
        let unfused = model(true);
        assert_eq!(unfused.kept - p, 8.0 * s.samples() as f64);
        assert_eq!(
            unfused.resident - model(false).resident,
            8.0 * s.samples() as f64
        );
        assert_eq!(
            unfused.per_batch_detector - model(false).per_batch_detector,
            8.0 * 360_000.0
        );
        assert_eq!(device_bytes_per_local_pixel(3), 80.0);
        assert_eq!(device_bytes_per_local_pixel(1), 24.0);
        // tiny on --backend opencl with the pointing recomputed 4
        // detectors a batch (fused): 348 780 276 bytes, with 2 798 592
        // local pixels (the rcond mask's bytes) at the solve's peak (the
        // map and the covariance: 72 bytes).
        let m = model(false);
        let model = DEVICE_BYTES_PER_DET_SAMPLE_RESIDENT * 4_320_000.0
            + DEVICE_BYTES_PER_TIME_SAMPLE * 360_000.0
            + 72.0 * 2_798_592.0
            + m.per_batch_detector * 4.0;
        let measured = 348_780_276.0;
        assert!(
            (model - measured).abs() < 0.001 * measured,
            "model {model}, measured {measured}"
        );
        // The largest batch within a budget, and none below one detector.
        let b = m.largest_batch(m.peak(DevicePointing::Batched(5)) + 1.0);
        assert_eq!(b, 5);
        assert_eq!(m.largest_batch(m.resident), 0);
        // Streamed: no detector data besides the batch's (its pointing,
        // timestream, flags and the template's good-sample field).
        assert_eq!(m.resident - m.fixed, 10.0 * s.samples() as f64);
        assert_eq!(
            m.peak(DevicePointing::Streamed(2)),
            m.fixed + 2.0 * (64.0 + 18.0) * 360_000.0
        );
        assert_eq!(
            m.largest_streamed_batch(m.peak(DevicePointing::Streamed(3)) + 1.0),
            3
        );
        assert_eq!(m.largest_streamed_batch(m.fixed), 0);
        assert!(m.peak(DevicePointing::Streamed(4)) < m.peak(DevicePointing::Batched(4)));
        // Compact: the recomputed plan's batch beside 4 B a detector sample
        // of compact pixels; its largest batch within a budget, and none
        // where the compact pixels alone do not fit beside the rest.
        assert_eq!(
            m.peak(DevicePointing::Compact(3)),
            m.peak(DevicePointing::Batched(3)) + 4.0 * s.samples() as f64
        );
        let b = m.largest_compact_batch(m.peak(DevicePointing::Compact(5)) + 1.0);
        assert_eq!(b, 5);
        assert_eq!(m.largest_compact_batch(m.resident + m.compact_pixels), 0);
        assert_eq!(
            m.largest_compact_batch(m.peak(DevicePointing::Batched(1))),
            0,
            "a budget that holds one recomputed batch holds no compact one"
        );
    }

    #[test]
    fn a_device_grid_follows_the_footprint_and_the_model_counts_it() {
        // 512² submaps from nside 512 on, never coarser than TOAST's 16.
        for (nside, nss) in [(8, 1), (128, 1), (512, 1), (1024, 2), (4096, 8), (8192, 16)] {
            assert_eq!(device_nside_submap(nside), nss, "nside {nside}");
        }
        assert_eq!(device_nside_submap(1 << 14), 16);
        let grid = |nside_submap| DeviceGrid {
            nside: 1024,
            nside_submap,
            nnz: 3,
        };
        assert_eq!(grid(2).n_submap(), 262_144.0);
        assert_eq!(grid(16).n_submap(), 4096.0);
        let npix = 12.0 * 1024.0 * 1024.0;
        assert_eq!(grid(2).local_pixels(1), FINE_PIXEL_FRACTION_PER_OBS * npix);
        assert_eq!(grid(16).local_pixels(1), SUBMAP_FRACTION_PER_OBS * npix);
        assert_eq!(grid(2).local_pixels(100), npix);
        // tiny on --backend opencl (device-kept-fused) on the device grid:
        // 263 797 748 bytes (946 080 local pixels), against 394 856 180 on
        // TOAST's; the model stays above the measured peak.
        let model = |g| tiny_device_model(g, false).peak(DevicePointing::Kept);
        let (fine, coarse) = (model(grid(2)), model(grid(16)));
        assert!(fine >= 263_797_748.0 && fine < coarse, "{fine} {coarse}");
        // The grid's tables: 9 bytes a submap.
        let nnz1 = |nside_submap| {
            DeviceMemory::of(
                0.0,
                0.0,
                0,
                DeviceGrid {
                    nnz: 1,
                    ..grid(nside_submap)
                },
                false,
            )
            .kept
        };
        assert_eq!(nnz1(2), DEVICE_BYTES_PER_SUBMAP * 262_144.0);
    }

    #[test]
    fn estimate_matches_measured_tiny() {
        // 493 844 kB (synthetic sky); with `--sky-map`: 422 020 kB.
        check_measured("tiny", 0.5057e9);
        check_measured("tiny", 0.4321e9);
    }

    #[test]
    fn estimate_matches_measured_xsmall() {
        // The default (compact pointing, fused passes): 1 005 256 kB.
        check_measured("xsmall", 1.0294e9);
    }

    #[test]
    fn estimate_matches_measured_small() {
        // The default (compact pointing, fused passes): 6 281 292 kB.
        check_measured("small", 6.4320e9);
    }

    #[test]
    fn estimate_matches_measured_xsmall_kept() {
        // `--set binner.full_pointing=true --set
        // binner.compact_pointing=false`: 2 326 156 kB.
        let kept = Pointing {
            full: true,
            compact: false,
            batch: 8,
        };
        check_measured_with("xsmall", kept, 2.3820e9);
    }

    #[test]
    fn recomputed_pointing_costs_less_than_kept() {
        let s = preset("xsmall").unwrap();
        let kept = predicted_memory(
            s,
            1024,
            HostRole::MapMaker(Pointing {
                full: true,
                compact: false,
                batch: 8,
            }),
        );
        let recomputed = predicted_memory(
            s,
            1024,
            HostRole::MapMaker(Pointing {
                full: false,
                compact: false,
                batch: 8,
            }),
        );
        let all_at_once = predicted_memory(
            s,
            1024,
            HostRole::MapMaker(Pointing {
                full: false,
                compact: false,
                batch: 0,
            }),
        );
        let compact = predicted_memory(
            s,
            1024,
            HostRole::MapMaker(Pointing {
                full: false,
                compact: true,
                batch: 8,
            }),
        );
        assert!(
            recomputed < compact && compact < kept,
            "{recomputed} {compact} {kept}"
        );
        assert!(recomputed < all_at_once, "{recomputed} {all_at_once}");
        assert!(keeps_pointing("tiny") && !keeps_pointing("xsmall"));
        assert!(!keeps_pointing("small") && !keeps_pointing("auto"));
        assert!(Pointing::default_for("xsmall").compact && !Pointing::default_for("tiny").compact);
    }

    /// A device plan's host holds no detector sample (unless the detector
    /// data are streamed): its prediction is that of the time samples, the
    /// sky, the run-time compiler and the products on the device grid,
    /// below the host plan's of the same case; measured (resident memory
    /// outside the emulated device's, sampled every 20-50 ms by a script;
    /// the emulator, the synthetic sky): tiny on hip with the kernel cache
    /// off 457 468 kB (the compiler beside the sky; warm, on cuda,
    /// 324 104 kB), xsmall on cuda 386 456 kB (its outputs), where the CPU
    /// runs peak at 486 092 kB and 1 005 256 kB.
    #[test]
    fn a_device_run_s_host_holds_no_detector_sample() {
        let grid = DeviceGrid {
            nside: 1024,
            nside_submap: device_nside_submap(1024),
            nnz: 3,
        };
        let device = |detector_data| HostRole::BesideDevice {
            grid,
            detector_data,
        };
        let kib = 1024.0;
        for (case, measured) in [("tiny", 457_468.0 * kib), ("xsmall", 386_456.0 * kib)] {
            let s = preset(case).unwrap();
            let p = predicted_memory(s, 1024, device(false));
            assert!(
                (measured..1.4 * measured).contains(&p),
                "{case}: predicted {p}, measured {measured}"
            );
            // tiny's host plan is about the sky and the compiler's size:
            // within 4% (and measured below the CPU run's peak); from
            // xsmall on, the detector samples make the host plan larger.
            let host = predicted_memory(s, 1024, HostRole::MapMaker(Pointing::default_for(case)));
            assert!(
                p < 1.04 * host,
                "{case}: {p} on a device, {host} on the host"
            );
        }
        for case in ["xsmall", "small", "medium"] {
            let s = preset(case).unwrap();
            let host = HostRole::MapMaker(Pointing::default_for(case));
            assert!(
                predicted_memory(s, 1024, device(false)) < 0.5 * predicted_memory(s, 1024, host),
                "{case}"
            );
        }
        // No term per detector sample: small and tiny differ by nothing.
        let resident = |case| predicted_memory(preset(case).unwrap(), 1024, device(false));
        assert_eq!(resident("small"), resident("tiny"));
        // Streamed, the host holds the signal and both flags (10 B a
        // sample), which outweigh the sky and the products on medium.
        let medium = preset("medium").unwrap();
        let streamed = predicted_memory(medium, 1024, device(true));
        let data = BYTES_PER_DET_SAMPLE * medium.samples() as f64;
        assert!((data..1.05 * data).contains(&streamed), "{streamed} {data}");
        let host = predicted_memory(
            medium,
            1024,
            HostRole::MapMaker(Pointing::default_for("medium")),
        );
        assert!(streamed < host, "{streamed} {host}");
    }

    #[test]
    fn auto_picks_the_largest_that_fits() {
        let lean = Pointing::default_for("auto");
        let tiny = predicted_memory(preset("tiny").unwrap(), 1024, HostRole::MapMaker(lean));
        let xs = predicted_memory(preset("xsmall").unwrap(), 1024, HostRole::MapMaker(lean));
        let small = predicted_memory(preset("small").unwrap(), 1024, HostRole::MapMaker(lean));
        assert!(tiny < xs && xs < small);
        assert_eq!(auto(xs / 0.8 + 1.0, 1024, lean).0, "xsmall");
        assert_eq!(auto(xs / 0.8 - 1.0, 1024, lean).0, "tiny");
        assert_eq!(auto(1.0, 1024, lean).0, "tiny");
        assert_eq!(auto(1e18, 1024, lean).0, "heroic");
        // This repository's 2-core machine: 24 GB, about 21 GB available.
        assert_eq!(auto(21e9, 1024, lean).0, "small");
    }
}
