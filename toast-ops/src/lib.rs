//! toast-ops: operators and pipelines.
//!
//! Standalone building blocks of the satellite simulation (plain functions
//! over slices and small structs, independent of the observation data
//! model):
//!
//! * [`qarray`]: quaternions with TOAST's conventions.
//! * [`ephemeris`]: barycentric Earth position/velocity (ICRS).
//! * [`satellite`]: TOAST's satellite schedule, timestamps and boresight.
//! * [`focalplane`]: the benchmark's hexagonal focal plane.
//! * [`noise`]: analytic 1/f noise model and counter-based noise simulation.
//! * [`uid`]: TOAST's `name_UID` identifiers.

pub mod ephemeris;
pub mod focalplane;
pub mod noise;
pub mod qarray;
pub mod satellite;
pub mod uid;
