//! toast-ops: operators and pipelines.
//!
//! * [`healpix`]: HEALPix pixel indexing, angle/vector conversions and ring geometry.

pub mod healpix;
