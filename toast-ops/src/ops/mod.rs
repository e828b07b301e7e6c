//! Operators: pointing expansion, map scanning, noise weighting, and the
//! map-domain accumulations of the map-maker.
//!
//! Each operator is a plain struct with a `name` and a serde-loadable
//! configuration whose fields are TOAST's trait names and defaults, and
//! implements [`toast_core::Operator`] with exact `requires()`/`provides()`.
//! The kernel-backed ones (`supports_accel() == true`) run through
//! [`crate::exec::kernels`], so they work unchanged on any backend and on staged
//! data; the host-only one is the pixel distribution (a scan of the
//! pixels). `BuildHitMap` and `BuildInverseCovariance`, which TOAST runs on
//! the host, are kernel-backed here (`cov_accum_timestream`, a kernel of our
//! own), so a device run accumulates the hits and the inverse covariance on
//! the device and copies the two maps back once.
//!
//! Differences from TOAST's composition, on purpose:
//!
//! * TOAST's `PixelsHealpix` and `StokesWeights` call their
//!   `detector_pointing` operator themselves. Here the three are separate
//!   steps of a pipeline (`PointingDetector`, `PixelsHealpix`,
//!   `StokesWeights`), built together by [`PointingOps`], so the staging
//!   plan sees that quaternions, pixels and weights are intermediates that
//!   never need to leave the device.
//! * Output fields cover every local detector of an observation (one
//!   contiguous block, see `toast_core::detdata`); an operator writes the
//!   rows of the detectors it processes. TOAST instead re-creates its
//!   buffers per detector set.

pub(crate) mod binning;
pub(crate) mod covariance_and_hits;
pub(crate) mod mapmaker_utils;
mod noise_weight;
mod pixels_healpix;
mod pointing_compact;
mod pointing_detector;
mod scan_map;
mod stokes_weights;
mod util;

pub use binning::{BinMap, BinnerConfig};
pub use covariance_and_hits::{CovarianceAndHits, CovarianceAndHitsConfig};
pub use mapmaker_utils::{
    BuildHitMap, BuildInverseCovariance, BuildNoiseWeighted, BuildPixelDistribution, FlagSelection,
};
pub use noise_weight::{
    detector_weights, register_noise_model, DetectorWeights, NoiseWeight, NoiseWeightConfig,
    WhiteNoiseWeights,
};
pub use pixels_healpix::{PixelsHealpix, PixelsHealpixConfig};
pub use pointing_compact::ExpandCompactPointing;
pub use pointing_detector::{PointingDetector, PointingDetectorConfig};
pub use scan_map::{ScanMap, ScanMapConfig};
pub use stokes_weights::{StokesMode, StokesWeights, StokesWeightsConfig};
pub use util::{
    ensure_timestream, pointing_field, select_detectors, CopyDetData, DeleteDetData, PointingOps,
    ResetData,
};
