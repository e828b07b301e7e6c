//! toast-ops: operators and pipelines.
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
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.
//! * [`fits`]: healpy-compatible HEALPix map FITS reading and writing.
//! * [`sht`]: spherical-harmonic synthesis (a_lm → I, Q, U HEALPix maps).
//! * [`sky`]: the synthetic CMB-like input sky of the satellite benchmark
//!   (TOAST's power spectra and beam, Philox-seeded a_lm, band-limited synthesis).
//! * [`plot`]: Mollweide-projection PNG rendering of I/Q/U maps.

pub mod ephemeris;
pub mod fits;
pub mod focalplane;
pub mod healpix;
pub mod noise;
pub mod plot;
pub mod qarray;
pub mod satellite;
pub mod sht;
pub mod sky;
pub mod uid;
