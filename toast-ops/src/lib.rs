//! toast-ops: operators and pipelines.
//!
//! Standalone numerical modules (plain functions over slices, independent of
//! the observation data model):
//!
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.
//! * [`fits`]: healpy-compatible HEALPix map FITS reading and writing.
//! * [`sht`]: spherical-harmonic synthesis (a_lm → I, Q, U HEALPix maps).
//! * [`sky`]: the synthetic CMB-like input sky of the satellite benchmark
//!   (power spectra, seeded a_lm, spherical-harmonic synthesis).
//! * [`plot`]: Mollweide-projection PNG rendering of I/Q/U maps.

pub mod fits;
pub mod healpix;
pub mod plot;
pub mod sht;
pub mod sky;
