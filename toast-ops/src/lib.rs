//! toast-ops: operators, pipelines, map containers and the destriping
//! map-maker of toast-rs.
//!
//! # Layers of this crate
//!
//! * [`kernels`]: the kernel call layer. One safe function per TOAST kernel
//!   runs it for a set of detectors of an observation on the backend the
//!   dispatcher resolves (kernel > operator > pipeline > run > cpu), timed
//!   under the resolved timer name, with host addresses for host-addressable
//!   backends and the device handles of staged fields otherwise (temporary
//!   copies, counted as unstaged transfers, when a field was not staged).
//! * [`ops`]: operators with TOAST's names, traits and defaults, each with
//!   exact `requires()`/`provides()`: `PointingDetector`, `PixelsHealpix`,
//!   `StokesWeights`, `ScanMap`, `NoiseWeight`, `BuildNoiseWeighted`
//!   (kernel-backed, `supports_accel() == true`), and the host-only
//!   `BuildHitMap`, `BuildInverseCovariance`, `BuildPixelDistribution`, plus
//!   the composites `CovarianceAndHits` and `BinMap`.
//! * [`pixel_dist`]: `PixelDistribution` (submaps, `global2local`) and
//!   `PixelData<T>` (local submaps × pixels × values) with TOAST's full-sky
//!   statistics; [`covariance`]: hits and inverse-covariance accumulation,
//!   per-pixel eigendecomposition with the rcond cut, `cov_apply`;
//!   [`global_data`]: which global objects have a device form.
//! * [`pipeline`]: TOAST's `Pipeline` (detector sets, a pipeline-level
//!   backend) with data staging: data moves to a non-host-addressable device
//!   once per staging scope, following toast-core's staging plan.
//! * [`templates`]: the offset template; [`mapmaker`]: the destriping
//!   `MapMaker` (TOAST's solver steps 5a–5i, PCG with the diagonal
//!   preconditioner), configured by serde structs named as TOAST names its
//!   operator traits.
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
//! # Simulation building blocks
//!
//! Standalone building blocks of the satellite simulation and map-making
//! (plain functions over slices and small structs, independent of the
//! observation data model):
//!
//! * [`qarray`]: quaternions with TOAST's conventions.
//! * [`ephemeris`]: barycentric Earth position/velocity (ICRS).
//! * [`satellite`]: TOAST's satellite schedule, timestamps and boresight.
//! * [`focalplane`]: the benchmark's hexagonal focal plane.
//! * [`noise`]: analytic 1/f noise model and counter-based noise simulation.
//! * [`uid`]: TOAST's `name_UID` identifiers.
//! * [`sim`]: the simulation operators on the data model (`SimSatellite`,
//!   `DefaultNoiseModel`, `SimNoise`, `ScanHealpixMap`) that `toast-cli run`
//!   chains with the map-maker.
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.
//! * [`fits`]: healpy-compatible HEALPix map FITS reading and writing.
//! * [`sht`]: spherical-harmonic synthesis (a_lm → I, Q, U HEALPix maps).
//! * [`sky`]: the synthetic CMB-like input sky of the satellite benchmark
//!   (TOAST's power spectra and beam, Philox-seeded a_lm, band-limited synthesis).
//! * [`plot`]: Mollweide-projection PNG rendering of I/Q/U maps.

pub mod covariance;
pub mod dist;
pub mod ephemeris;
pub mod fits;
pub mod focalplane;
pub mod global_data;
pub mod healpix;
pub mod kernels;
pub mod mapmaker;
pub mod noise;
pub mod ops;
pub mod pipeline;
pub mod pixel_dist;
pub mod plot;
pub mod qarray;
pub mod satellite;
pub mod sht;
pub mod sim;
pub mod sky;
pub mod templates;
pub mod uid;

pub use mapmaker::{MapMaker, MapMakerConfig, MapMakerResult, MapMakerSetup};
pub use pipeline::{DetectorSets, Pipeline};
pub use pixel_dist::{MapStats, PixelData, PixelDistribution};
