//! toast-ops: operators and pipelines.

pub mod ephemeris;
pub mod focalplane;
pub mod noise;
pub mod qarray;
pub mod satellite;
pub mod uid;
