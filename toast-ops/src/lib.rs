//! toast-ops: operators and pipelines.

pub mod ephemeris;
pub mod qarray;
