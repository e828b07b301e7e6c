//! The simulation operators of TOAST's satellite workflow, on the
//! observation data model: `SimSatellite`, `DefaultNoiseModel`, `SimNoise`
//! and `ScanHealpixMap`.
//!
//! The simulation's own building blocks sit beside them: [`noise`] (the
//! analytic 1/f model and counter-based noise streams) and [`sky`] (the
//! benchmark's synthetic input sky). The operators also use
//! [`crate::astro::scan_strategy`], [`crate::astro::focalplane`],
//! [`crate::io::fits`] and the pointing/scanning operators of [`crate::ops`]:
//!
//! * [`SimSatellite`] creates one [`toast_core::Observation`] per scan of the schedule
//!   (observations in parallel with rayon), with the shared fields `times`,
//!   `flags` (u8, zero), `boresight_radec` (4 per sample), `position` and
//!   `velocity` (3 per sample, km and km/s), the detector fields `signal`
//!   (f64, K, zero) and `flags` (u8, zero), and the metadata `session_name`
//!   and `session_uid` (the key of the noise streams).
//! * [`DefaultNoiseModel`] stores an [`AnalyticNoiseModel`] (one
//!   [`crate::sim::noise::AnalyticNoiseParams`] per detector, from the focal plane) under
//!   `noise_model`. It implements the map-maker's [`crate::ops::DetectorWeights`]
//!   (`1 / (NET² f_s)`).
//! * [`SimNoise`] adds 1/f + white noise to `signal` through the `sim_noise`
//!   kernel on the run's backend (the host computes only the Fourier
//!   amplitudes per noise model and the keys), with TOAST's keys
//!   `(realization, telescope UID, component 0, session UID, detector UID)`
//!   and the sample rate measured from the timestamps, so the noise of a
//!   detector does not depend on how the work is split.
//! * [`ScanHealpixMap`] expands the pointing, builds the pixel distribution
//!   (kept under `pixel_dist` for the map-maker, as TOAST's benchmark
//!   reuses it), restricts the input sky to the hit submaps and scans I, Q,
//!   U into `signal` through the `scan_map` kernel. The pointing pass runs
//!   per detector set ([`ScanHealpixMap::options`]) and keeps only the
//!   current set's quaternions (`PointingDetector::transient`); pixels and
//!   weights are dropped at the end (the map-maker expands its own) unless
//!   [`ScanHealpixMap::keep_pointing`] hands them to a map-maker with the
//!   same pointing configuration (the workflow does with `full_pointing`).
//!   With [`ScanHealpixMap::transient_pointing`] (host runs; the workflow
//!   sets it when the map-maker recomputes its pointing) the pixels and
//!   weights too hold only the current set, and the scan pass recomputes
//!   them.
//!
//! # Data movement
//!
//! `ScanHealpixMap` is one device scope on a device backend: the device
//! expands whole pointing fields once and the scan reads them there; the
//! host builds the pixel distribution from pixels it expands itself from
//! the boresight ([`crate::exec::pipeline::mirror_on_host`]), so no
//! pointing crosses the bus: the boresight and the input map go up, the
//! timestream comes back. On a device the workflow runs `SimNoise` in the
//! same scope ([`ScanHealpixMap::noise`]): the `sim_noise` kernel makes the
//! noise on the device and adds it there, so the timestream comes back once,
//! with the noise, and the noise itself never crosses the bus. Inside a
//! caller's scope (the workflow's, from the scan to the maps) it does not
//! come back at all: the scan frees its input map and pointing on the
//! device ([`crate::exec::movement::forget`]) and leaves the timestream
//! there for the map-maker.
//!
//! The input sky is an [`InputSky`]: read from a HEALPix FITS file
//! ([`InputSky::from_file`], any ordering; the file's `ORDERING` header is
//! honoured, exactly as TOAST does, so TOAST's own
//! `fake_input_sky_nside1024.fits` — RING data labelled NESTED — gives the
//! same scrambled sky TOAST scans), or synthesised
//! ([`InputSky::synthetic`], correctly NEST-ordered unless
//! `toast_ring_as_nest` is asked for). The synthesis can be started early
//! on a background thread ([`SkySynthesis`]) and handed to the scan as a
//! [`SkySource`]: the scan waits for it only once its pointing and pixel
//! distribution are done, so on a device the host synthesises while the
//! device expands the pointing (the satellite workflow starts it with a
//! device run).

mod model;
pub mod noise;
mod satellite;
mod scan;
pub mod sky;

pub use model::{
    AnalyticNoiseModel, DefaultNoiseModel, DefaultNoiseModelConfig, SimNoise, SimNoiseConfig,
};
pub use satellite::{
    core_focalplane, SimSatellite, SimSatelliteConfig, EPHEMERIS_YEARS, SESSION_UID,
};
pub use scan::{
    check_sky_header, InputSky, ScanHealpixMap, ScanHealpixMapConfig, ScannedSky, SkySource,
    SkySynthesis,
};
