//! Mathematics with no knowledge of observations or operators: plain
//! functions over slices and small structs.
//!
//! * [`healpix`]: HEALPix pixel indexing (NEST/RING), angle/vector
//!   conversions and the ring geometry of spherical-harmonic transforms.
//! * [`qarray`]: quaternions with TOAST's conventions (`[x, y, z, w]`).
//! * [`sht`]: spherical-harmonic synthesis (a_ℓm → I, Q, U HEALPix maps).
//! * [`rng`]: the counter-based random generators (TOAST's Threefry for
//!   noise, Philox for the synthetic sky's a_ℓm).

pub mod healpix;
pub mod qarray;
pub mod rng;
pub mod sht;
