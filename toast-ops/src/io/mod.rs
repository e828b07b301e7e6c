//! Files in and out: HEALPix maps in FITS (healpy- and TOAST-compatible)
//! and Mollweide PNG plots.
//!
//! * [`fits`]: FITS blocks, header cards, binary tables and HEALPix map
//!   semantics, reading and writing.
//! * [`plot`]: Mollweide-projection PNG rendering of I/Q/U maps.

pub mod fits;
pub mod plot;
