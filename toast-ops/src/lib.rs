//! toast-ops: operators and pipelines.

pub mod ephemeris;
pub mod qarray;
pub mod satellite;
pub mod uid;
