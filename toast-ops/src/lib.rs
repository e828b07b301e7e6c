//! toast-ops: operators, pipelines, map containers and the destriping
//! map-maker of toast-rs.
//!
//! # Layers of this crate (bottom to top)
//!
//! Each folder is a layer; a module uses only the layers below it
//! (`tests/layers.rs` checks it; `sysinfo` and [`dist`] are leaves).
//!
//! * [`math`]: HEALPix indexing, quaternions, spherical-harmonic synthesis,
//!   the counter-based random generators. Plain functions over slices.
//! * [`astro`]: the Earth's ephemeris, TOAST's satellite scan strategy and
//!   the benchmark's focal plane. Plain functions.
//! * [`noise_model`]: TOAST's analytic noise model (the PSD and the
//!   detector weights), read by the noise weighting and the simulation.
//! * [`io`]: HEALPix maps in FITS and Mollweide PNG plots.
//! * [`pixels`]: `PixelDistribution` (submaps, `global2local`) and
//!   `PixelData<T>` (TOAST's `toast.pixels`), with the map reductions
//!   across processes, and the pixel-domain covariance
//!   ([`pixels::covariance`]); [`dist`]: how observations and detectors are split
//!   across processes (TOAST's `toast.dist`).
//! * [`exec`]: the kernel call layer ([`exec::kernels`]: one safe
//!   function per TOAST kernel, dispatched to a backend), TOAST's
//!   `Pipeline` ([`exec::pipeline`]), the one owner of data movement
//!   ([`exec::movement`]) and the device
//!   forms of data-level objects ([`exec::global_data`]).
//! * [`ops`]: operators with TOAST's names, traits and defaults, each with
//!   exact `requires()`/`provides()`: `PointingDetector`, `PixelsHealpix`,
//!   `StokesWeights`, `ScanMap`, `NoiseWeight`, `BuildNoiseWeighted`,
//!   `BuildHitMap`, `BuildInverseCovariance` (kernel-backed), and the
//!   host-only `BuildPixelDistribution`, plus the
//!   composites `CovarianceAndHits` and `BinMap`.
//! * [`templates`]: the offset template (TOAST's `toast.templates`).
//! * [`mapmaker`]: the destriping `MapMaker` (TOAST's solver steps 5a–5i,
//!   PCG with the diagonal preconditioner).
//! * [`sim`]: the simulation operators (`SimSatellite`,
//!   `DefaultNoiseModel`, `SimNoise`, `ScanHealpixMap`) with the noise
//!   simulation and the synthetic sky they use.
//! * [`workflow`]: TOAST's satellite benchmark as a library call: a
//!   [`workflow::SatelliteConfig`] in, the map-maker's products, timers and
//!   statistics out. `toast-cli run` is a thin front-end over it.
//!
//! # Conventions
//!
//! Fields, keys and defaults are TOAST's (`signal`, `flags`, `quats`,
//! `pixels`, `weights`, `noise_model`; detector masks, shared masks). Data
//! products of the map-maker live in `Data::meta` under TOAST's names
//! (`mapmaker_hits`, `mapmaker_map`, ...). Errors name the observation,
//! detector, field or key involved; nothing panics on bad input. Results are
//! deterministic: reductions run in a fixed order, so one and several threads
//! give the same bits.
//!
//! # How the map-making is tested
//!
//! The integration tests (`tests/mapmaker.rs`, `tests/pipeline.rs`,
//! `tests/toast_reference.rs`) run on synthetic scans through the CPU plugin
//! and through `fakedev`, a test backend that is not host-addressable (its
//! buffers are opaque handles; its kernels forward to the CPU plugin), so
//! the staged path is exercised without a GPU: binned maps of a noiseless
//! sky equal the sky, the destriper removes many offsets per observation,
//! hits count unflagged samples, 1 and 2 threads give identical bits, data
//! is uploaded once per pipeline, and the products agree with TOAST 3.0.6's
//! own `MapMaker` on identical inputs (`scripts/mapmaker_vs_toast.py`).
//!

pub mod astro;
pub mod dist;
pub mod exec;
pub mod io;
pub mod mapmaker;
pub mod math;
pub mod noise_model;
pub mod ops;
pub mod pixels;
pub mod sim;
pub mod sysinfo;
pub mod templates;
pub mod workflow;

pub use exec::pipeline::{DetectorSets, Pipeline};
pub use mapmaker::{MapMaker, MapMakerConfig, MapMakerResult, MapMakerSetup};
pub use pixels::{MapStats, PixelData, PixelDistribution};
