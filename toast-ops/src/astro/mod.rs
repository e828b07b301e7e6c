//! Where the telescope is and where it looks: the Earth's barycentric
//! ephemeris, TOAST's satellite scan strategy (schedule, timestamps,
//! boresight) and the benchmark's focal plane. Standalone functions,
//! independent of the observation data model; the operators that put their
//! results into observations are in [`crate::sim`].
//!
//! * [`ephemeris`]: barycentric Earth position and velocity (ICRS).
//! * [`scan_strategy`]: TOAST's satellite schedule, sampling and boresight
//!   quaternions (`SimSatellite` with a `SpaceSite`).
//! * [`focalplane`]: TOAST's fake hexagonal focal plane and the benchmark's
//!   truncation of it.

pub mod ephemeris;
pub mod focalplane;
pub mod scan_strategy;
