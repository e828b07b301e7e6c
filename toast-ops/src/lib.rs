//! toast-ops: operators and pipelines.
//!
//! Standalone numerical modules (plain functions over slices, independent of
//! the observation data model):
//!
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.
//! * [`fits`]: healpy-compatible HEALPix map FITS reading and writing.
//! * [`sht`]: spherical-harmonic synthesis (a_lm → I, Q, U HEALPix maps).
//! * [`sky`]: the synthetic CMB-like input sky of the satellite benchmark
//!   (TOAST's power spectra and beam, Philox-seeded a_lm, band-limited synthesis).
//! * [`plot`]: Mollweide-projection PNG rendering of I/Q/U maps.

pub mod fits;
pub mod healpix;
pub mod plot;
pub mod sht;
pub mod sky;
