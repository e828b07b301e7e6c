//! HEALPix map FITS I/O, compatible with healpy and TOAST 3.
//!
//! A small pure-Rust FITS implementation covering what HEALPix maps need:
//! 2880-byte blocks, 80-character header cards, and binary tables
//! (`XTENSION = 'BINTABLE'`) of big-endian numeric columns. No cfitsio.
//!
//! # Layout written
//!
//! [`write_healpix_map`] writes what `healpy.write_map(..., fits_IDL=False)` and
//! TOAST's `PixelData.write` write:
//!
//! * HDU 0: an empty primary HDU (`SIMPLE = T`, `BITPIX = 8`, `NAXIS = 0`, `EXTEND = T`);
//! * HDU 1: a binary table with one row per pixel and one scalar column per map
//!   (`TFORMn = 'E'` float32, `'D'` float64, `'J'` int32 or `'K'` int64),
//!   `TTYPEn`/`TUNITn` per column, then the HEALPix keywords in healpy's order:
//!   `PIXTYPE = 'HEALPIX'`, `ORDERING = 'NESTED'|'RING'`, `EXTNAME = 'xtension'`,
//!   `NSIDE`, `FIRSTPIX = 0`, `LASTPIX = npix-1`, `INDXSCHM = 'IMPLICIT'`,
//!   `OBJECT = 'FULLSKY'`, followed by caller-supplied cards (e.g. TOAST's
//!   `START`, `STOP`, `NDET`, `NGOOD`, `OPERATOR`, `CREATED`, `VERSION`, see
//!   [`toast_extra_header`]).
//!
//! TOAST 3.0.6 names the single column of its hits map `T` (healpy indexes the
//! default name string `"TEMPERATURE"` for a one-map write) and stores it as
//! `J`; [`write_hits_map`] reproduces that. TOAST also adds cards `TUNIT0..`
//! with 0-based indices (an off-by-one in `PixelData._write_healpix_fits`); we
//! write the standard 1-based `TUNITn` of each column instead, which is what
//! FITS readers (astropy, healpy, cfitsio) associate with the columns.
//!
//! # Reading
//!
//! [`read_healpix_map`] reads the first binary-table extension of any
//! healpy-written map: scalar or vector columns (`TFORM = '1024E'` as written by
//! `healpy.write_map` with `fits_IDL=True`), types `B I J K E D` with optional
//! `TSCALn`/`TZEROn` (finite numbers where present) and, on integer columns,
//! `TNULLn` (its value is an undefined pixel, read as [`UNSEEN`]),
//! `ORDERING` `RING` or `NESTED`, implicit (full-sky) or explicit
//! (partial-sky, first column `PIXEL`, each pixel at most once, missing
//! pixels set to [`UNSEEN`]) indexing. Values are returned as `f64` in
//! **NEST** order.
//! Every failure is a [`FitsError`] naming the file and the problem.
//!
//! # Files
//!
//! * `header`: 2880-byte blocks, 80-character cards, keyword parsing and
//!   formatting, and the HDU walk of a file (headers read, data units
//!   skipped, every size checked against the file's length).
//! * `bintable`: binary-table layout (`TFORMn`, `TTYPEn`, `TSCALn`, ...),
//!   column types and the big-endian encoding and decoding of rows.
//! * `healpix_map`: HEALPix semantics (`PIXTYPE`, `NSIDE`, `ORDERING`,
//!   `INDXSCHM`, map columns and units): [`read_healpix_map`] in steps, and
//!   the writers.
//! * [`units`]: the temperature units of a column (`TUNITn`) and their
//!   scale to kelvin (an absent unit is K).

mod bintable;
mod header;
mod healpix_map;
pub mod units;

use std::path::PathBuf;

pub use bintable::{ColumnFormat, ColumnSource, MapValue, SubmapColumn, WriteColumn};
pub use header::{Header, HeaderCard, HeaderValue, BLOCK};
pub use healpix_map::{
    read_healpix_header, read_healpix_map, read_healpix_nside, toast_extra_header,
    write_float_columns, write_float_maps, write_healpix_map, write_hits_column, write_hits_map,
    write_iqu_map, HealpixHeader, HealpixMap, MapField, MapPrecision, Ordering, UNSEEN,
};

/// Errors of FITS reading and writing. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum FitsError {
    /// The file could not be opened or created.
    #[error("{path}: cannot open: {source}")]
    Open {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// A read or write failed.
    #[error("{path}: I/O error: {source}")]
    Io {
        /// File path.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file does not start with a FITS primary header.
    #[error("{path}: not a FITS file: {reason}")]
    NotFits {
        /// File path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A header is malformed.
    #[error("{path}: HDU {hdu}: bad header: {reason}")]
    BadHeader {
        /// File path.
        path: PathBuf,
        /// HDU index (0 = primary).
        hdu: usize,
        /// What is wrong.
        reason: String,
    },
    /// The file has no binary-table extension.
    #[error("{path}: no BINTABLE extension (file has {nhdu} HDU(s))")]
    NoBinTable {
        /// File path.
        path: PathBuf,
        /// Number of HDUs found.
        nhdu: usize,
    },
    /// Reading the file would allocate more memory than is available (a
    /// partial-sky map expands to the full sky its `NSIDE` claims).
    #[error(
        "{path}: {what} needs {bytes} bytes of memory, more than {}",
        match available {
            Some(a) => format!("the {a} bytes available (MemAvailable)"),
            None => "the allocator can give".to_string(),
        }
    )]
    TooLarge {
        /// File path.
        path: PathBuf,
        /// What would be allocated.
        what: String,
        /// The bytes it needs (saturated at `u64::MAX`).
        bytes: u64,
        /// The bytes available (`MemAvailable`), `None` when the allocator
        /// refused.
        available: Option<u64>,
    },
    /// The binary table is not a HEALPix map.
    #[error("{path}: HDU {hdu}: not a HEALPix map: {reason}")]
    NotHealpix {
        /// File path.
        path: PathBuf,
        /// HDU index.
        hdu: usize,
        /// What is wrong.
        reason: String,
    },
    /// The `NSIDE` keyword is not a valid HEALPix resolution.
    #[error("{path}: bad NSIDE {value}: {reason}")]
    BadNside {
        /// File path.
        path: PathBuf,
        /// The keyword's value as written.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The number of rows/elements does not match the resolution.
    #[error("{path}: wrong row count: {reason}")]
    RowCount {
        /// File path.
        path: PathBuf,
        /// Details.
        reason: String,
    },
    /// A column has a TFORM this reader does not support.
    #[error("{path}: column {index} ('{name}'): unsupported TFORM '{tform}': {reason}")]
    UnsupportedTform {
        /// File path.
        path: PathBuf,
        /// 1-based column index.
        index: usize,
        /// Column name (TTYPE).
        name: String,
        /// The TFORM value.
        tform: String,
        /// Why it is not supported.
        reason: String,
    },
    /// The file ends before the data it declares.
    #[error("{path}: truncated: {what} needs {expected} bytes from offset {offset}, file has {available}")]
    Truncated {
        /// File path.
        path: PathBuf,
        /// Which part is truncated.
        what: String,
        /// Byte offset where it starts.
        offset: u64,
        /// Bytes needed.
        expected: u64,
        /// Bytes available.
        available: u64,
    },
    /// The arguments of a write are inconsistent.
    #[error("{path}: cannot write map: {reason}")]
    InvalidInput {
        /// File path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl FitsError {
    /// The message without the file name it starts with, for a caller
    /// whose own error names the file already.
    pub fn reason(&self) -> String {
        let text = self.to_string();
        let path = match self {
            FitsError::Open { path, .. }
            | FitsError::Io { path, .. }
            | FitsError::NotFits { path, .. }
            | FitsError::BadHeader { path, .. }
            | FitsError::NoBinTable { path, .. }
            | FitsError::TooLarge { path, .. }
            | FitsError::NotHealpix { path, .. }
            | FitsError::BadNside { path, .. }
            | FitsError::RowCount { path, .. }
            | FitsError::UnsupportedTform { path, .. }
            | FitsError::Truncated { path, .. }
            | FitsError::InvalidInput { path, .. } => path,
        };
        match text.strip_prefix(&format!("{}: ", path.display())) {
            Some(rest) => rest.to_string(),
            None => text,
        }
    }
}
