//! toast-ops: operators and pipelines.
//!
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.
//! * [`fits`]: healpy-compatible HEALPix map FITS reading and writing.

pub mod fits;
pub mod healpix;
