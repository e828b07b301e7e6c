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
//! `TSCALn`/`TZEROn`, `ORDERING` `RING` or `NESTED`, implicit (full-sky) or
//! explicit (partial-sky, first column `PIXEL`, missing pixels set to
//! [`UNSEEN`]) indexing. Values are returned as `f64` in **NEST** order.
//! Every failure is a [`FitsError`] naming the file and the problem.

use std::fs::File;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::math::healpix::{self, Healpix};

/// FITS block size in bytes.
pub const BLOCK: usize = 2880;
/// Header card length in bytes.
const CARD: usize = 80;
/// The HEALPix "unseen" sentinel value used for missing pixels.
pub const UNSEEN: f64 = -1.6375e30;

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

// =====================================================================
// Header values and cards
// =====================================================================

/// A FITS header value.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    /// Logical `T` / `F`.
    Bool(bool),
    /// Integer.
    Int(i64),
    /// Real (must be finite to be written).
    Float(f64),
    /// Character string.
    Str(String),
}

impl HeaderValue {
    /// The value as an integer, if it is one (or a float with an integral value).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            HeaderValue::Int(v) => Some(*v),
            HeaderValue::Float(v) if v.fract() == 0.0 && v.abs() < 9.0e15 => Some(*v as i64),
            _ => None,
        }
    }

    /// The value as a float, if numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            HeaderValue::Int(v) => Some(*v as f64),
            HeaderValue::Float(v) => Some(*v),
            _ => None,
        }
    }

    /// The value as a string slice, if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            HeaderValue::Str(s) => Some(s),
            _ => None,
        }
    }

    fn display(&self) -> String {
        match self {
            HeaderValue::Bool(b) => (if *b { "T" } else { "F" }).to_string(),
            HeaderValue::Int(v) => v.to_string(),
            HeaderValue::Float(v) => format_float(*v),
            HeaderValue::Str(s) => format!("'{s}'"),
        }
    }
}

/// A header card: keyword, value and optional comment.
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderCard {
    /// Keyword (at most 8 characters of `A-Z 0-9 - _`).
    pub key: String,
    /// Value.
    pub value: HeaderValue,
    /// Comment (may be truncated to fit the 80-character card).
    pub comment: Option<String>,
}

impl HeaderCard {
    /// A card with a value and an optional comment.
    pub fn new(key: &str, value: HeaderValue, comment: Option<&str>) -> Self {
        Self {
            key: key.to_string(),
            value,
            comment: comment.map(str::to_string),
        }
    }

    /// An integer card.
    pub fn int(key: &str, value: i64, comment: &str) -> Self {
        Self::new(key, HeaderValue::Int(value), Some(comment))
    }

    /// A real card.
    pub fn float(key: &str, value: f64, comment: &str) -> Self {
        Self::new(key, HeaderValue::Float(value), Some(comment))
    }

    /// A string card.
    pub fn string(key: &str, value: &str, comment: &str) -> Self {
        Self::new(key, HeaderValue::Str(value.to_string()), Some(comment))
    }
}

/// Shortest round-tripping representation of a finite float in FITS syntax
/// (always with a decimal point, exponent letter `E`).
fn format_float(v: f64) -> String {
    let s = format!("{v:?}");
    if !s.contains('e') {
        return s;
    }
    // Rust's Debug uses e.g. "1e20" / "1.5e-7": make it "1.0E20" / "1.5E-7".
    let (mant, exp) = s.split_once('e').expect("checked for 'e'");
    let mant = if mant.contains('.') {
        mant.to_string()
    } else {
        format!("{mant}.0")
    };
    format!("{mant}E{exp}")
}

/// Formats one 80-character card. Errors are plain strings (wrapped by the caller).
fn format_card(card: &HeaderCard) -> Result<String, String> {
    let key = &card.key;
    if key.is_empty()
        || key.len() > 8
        || !key
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(format!(
            "invalid header keyword {key:?} (1-8 characters of A-Z 0-9 - _)"
        ));
    }
    let value = match &card.value {
        HeaderValue::Float(v) if !v.is_finite() => {
            return Err(format!("header keyword {key}: non-finite value {v}"));
        }
        HeaderValue::Str(s) => {
            if !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(format!("header keyword {key}: non-ASCII string {s:?}"));
            }
            let escaped = s.replace('\'', "''");
            // Fixed format: at least 8 characters between the quotes.
            let v = format!("'{escaped:<8}'");
            // Pad so that a comment starts in column 32, as astropy does.
            let v = format!("{v:<20}");
            if v.trim_end().len() > 70 {
                return Err(format!(
                    "header keyword {key}: string too long for one card ({} characters)",
                    s.len()
                ));
            }
            v
        }
        other => format!("{:>20}", other.display()),
    };
    let mut line = format!("{key:<8}= {value}");
    if let Some(c) = &card.comment {
        if !c.is_empty() {
            if !c.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(format!("header keyword {key}: non-ASCII comment {c:?}"));
            }
            line.push_str(" / ");
            line.push_str(c);
        }
    }
    line.truncate(CARD);
    Ok(format!("{line:<80}"))
}

/// A parsed header: cards in order (keyword, value, comment); commentary cards
/// (without `= `) are kept with a `None` value.
#[derive(Debug, Clone, Default)]
pub struct Header {
    cards: Vec<(String, Option<HeaderValue>)>,
}

impl Header {
    /// The value of the first card with keyword `key`.
    pub fn get(&self, key: &str) -> Option<&HeaderValue> {
        self.cards
            .iter()
            .find(|(k, v)| k == key && v.is_some())
            .and_then(|(_, v)| v.as_ref())
    }

    /// All keywords with values, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.cards
            .iter()
            .filter(|(_, v)| v.is_some())
            .map(|(k, _)| k.as_str())
    }

    fn get_int(&self, key: &str) -> Result<i64, String> {
        match self.get(key) {
            None => Err(format!("missing keyword {key}")),
            Some(v) => v
                .as_int()
                .ok_or_else(|| format!("keyword {key} = {} is not an integer", v.display())),
        }
    }

    fn get_str(&self, key: &str) -> Option<String> {
        self.get(key).and_then(|v| v.as_str()).map(str::to_string)
    }
}

/// Parses the value part (columns 11-80) of a card.
fn parse_value(text: &str) -> Result<HeaderValue, String> {
    let t = text.trim_start();
    if let Some(rest) = t.strip_prefix('\'') {
        // String with '' escapes; ends at the first lone quote.
        let mut out = String::new();
        let mut chars = rest.chars().peekable();
        loop {
            match chars.next() {
                None => return Err(format!("unterminated string {t:?}")),
                Some('\'') => {
                    if chars.peek() == Some(&'\'') {
                        chars.next();
                        out.push('\'');
                    } else {
                        break;
                    }
                }
                Some(c) => out.push(c),
            }
        }
        return Ok(HeaderValue::Str(out.trim_end().to_string()));
    }
    let token = t.split('/').next().unwrap_or("").trim();
    match token {
        "T" => return Ok(HeaderValue::Bool(true)),
        "F" => return Ok(HeaderValue::Bool(false)),
        "" => return Ok(HeaderValue::Str(String::new())),
        _ => {}
    }
    if let Ok(i) = token.parse::<i64>() {
        return Ok(HeaderValue::Int(i));
    }
    let f = token.replace(['D', 'd'], "E");
    f.parse::<f64>()
        .map(HeaderValue::Float)
        .map_err(|_| format!("unparsable value {token:?}"))
}

// =====================================================================
// Reading
// =====================================================================

/// Reader state: the file and its path, for error messages.
struct FitsReader {
    path: PathBuf,
    file: BufReader<File>,
    len: u64,
}

impl FitsReader {
    fn open(path: &Path) -> Result<Self, FitsError> {
        let file = File::open(path).map_err(|source| FitsError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| FitsError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Ok(Self {
            path: path.to_path_buf(),
            file: BufReader::with_capacity(1 << 20, file),
            len,
        })
    }

    fn io(&self, source: std::io::Error) -> FitsError {
        FitsError::Io {
            path: self.path.clone(),
            source,
        }
    }

    fn pos(&mut self) -> Result<u64, FitsError> {
        self.file.stream_position().map_err(|e| self.io(e))
    }

    /// Reads exactly `buf.len()` bytes, reporting truncation against the file size.
    fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), FitsError> {
        let offset = self.pos()?;
        match self.file.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(FitsError::Truncated {
                path: self.path.clone(),
                what: what.to_string(),
                offset,
                expected: buf.len() as u64,
                available: self.len.saturating_sub(offset),
            }),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Reads one header (up to its END card) starting at the current position.
    /// Returns `None` at a clean end of file.
    fn read_header(&mut self, hdu: usize) -> Result<Option<Header>, FitsError> {
        let start = self.pos()?;
        if start >= self.len {
            return Ok(None);
        }
        let mut header = Header::default();
        let mut block = vec![0u8; BLOCK];
        let mut first = true;
        loop {
            self.read_exact(&mut block, &format!("header of HDU {hdu}"))?;
            for card in block.chunks_exact(CARD) {
                if !card.iter().all(|b| (0x20..0x7f).contains(b)) {
                    let reason = "header contains non-ASCII bytes".to_string();
                    return Err(if hdu == 0 && first {
                        FitsError::NotFits {
                            path: self.path.clone(),
                            reason,
                        }
                    } else {
                        FitsError::BadHeader {
                            path: self.path.clone(),
                            hdu,
                            reason,
                        }
                    });
                }
                let text = std::str::from_utf8(card).expect("checked ASCII");
                let key = text[..8].trim_end().to_string();
                if first {
                    first = false;
                    let expected = if hdu == 0 { "SIMPLE" } else { "XTENSION" };
                    if key != expected {
                        let reason = format!(
                            "HDU {hdu} starts with {:?} instead of keyword {expected}",
                            text[..8].trim_end()
                        );
                        return Err(if hdu == 0 {
                            FitsError::NotFits {
                                path: self.path.clone(),
                                reason,
                            }
                        } else {
                            FitsError::BadHeader {
                                path: self.path.clone(),
                                hdu,
                                reason,
                            }
                        });
                    }
                }
                if key == "END" {
                    return Ok(Some(header));
                }
                if &text[8..10] == "= " {
                    let value =
                        parse_value(&text[10..]).map_err(|reason| FitsError::BadHeader {
                            path: self.path.clone(),
                            hdu,
                            reason: format!("keyword {key}: {reason}"),
                        })?;
                    header.cards.push((key, Some(value)));
                } else {
                    header.cards.push((key, None));
                }
            }
        }
    }

    fn bad_header(&self, hdu: usize, reason: String) -> FitsError {
        FitsError::BadHeader {
            path: self.path.clone(),
            hdu,
            reason,
        }
    }

    /// Size in bytes (unpadded) of the data unit described by `header`.
    fn data_size(&self, header: &Header, hdu: usize) -> Result<u64, FitsError> {
        let bitpix = header
            .get_int("BITPIX")
            .map_err(|r| self.bad_header(hdu, r))?;
        if ![8, 16, 32, 64, -32, -64].contains(&bitpix) {
            return Err(self.bad_header(hdu, format!("invalid BITPIX {bitpix}")));
        }
        let naxis = header
            .get_int("NAXIS")
            .map_err(|r| self.bad_header(hdu, r))?;
        if !(0..=999).contains(&naxis) {
            return Err(self.bad_header(hdu, format!("invalid NAXIS {naxis}")));
        }
        if naxis == 0 {
            return Ok(0);
        }
        let mut n: u64 = 1;
        for i in 1..=naxis {
            let d = header
                .get_int(&format!("NAXIS{i}"))
                .map_err(|r| self.bad_header(hdu, r))?;
            if d < 0 {
                return Err(self.bad_header(hdu, format!("negative NAXIS{i} {d}")));
            }
            n = n
                .checked_mul(d as u64)
                .ok_or_else(|| self.bad_header(hdu, "data size overflows".into()))?;
        }
        let pcount = header.get("PCOUNT").and_then(|v| v.as_int()).unwrap_or(0);
        let gcount = header.get("GCOUNT").and_then(|v| v.as_int()).unwrap_or(1);
        if pcount < 0 || gcount < 0 {
            return Err(self.bad_header(hdu, format!("invalid PCOUNT {pcount} / GCOUNT {gcount}")));
        }
        Ok((bitpix.unsigned_abs() / 8) * gcount as u64 * (pcount as u64 + n))
    }
}

/// Element type of a binary-table column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColType {
    U8,
    I16,
    I32,
    I64,
    F32,
    F64,
    /// Any type this reader skips over but cannot convert (L, X, A, C, M, P, Q).
    Other,
}

impl ColType {
    fn size(self) -> usize {
        match self {
            ColType::U8 => 1,
            ColType::I16 => 2,
            ColType::I32 | ColType::F32 => 4,
            ColType::I64 | ColType::F64 => 8,
            ColType::Other => 0,
        }
    }
}

/// A column of a binary table.
#[derive(Debug, Clone)]
struct TableColumn {
    index: usize,
    name: String,
    tform: String,
    ty: ColType,
    repeat: usize,
    offset: usize,
    scale: f64,
    zero: f64,
    unit: Option<String>,
}

/// Parses TFORM into (type, repeat, width in bytes). `Err` gives the reason.
fn parse_tform(tform: &str) -> Result<(ColType, usize, usize), String> {
    let t = tform.trim();
    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
    let repeat: usize = if digits.is_empty() {
        1
    } else {
        digits
            .parse()
            .map_err(|_| format!("bad repeat count {digits:?}"))?
    };
    let code = t[digits.len()..]
        .chars()
        .next()
        .ok_or_else(|| "missing type code".to_string())?;
    let (ty, width) = match code {
        'B' => (ColType::U8, repeat),
        'I' => (ColType::I16, 2 * repeat),
        'J' => (ColType::I32, 4 * repeat),
        'K' => (ColType::I64, 8 * repeat),
        'E' => (ColType::F32, 4 * repeat),
        'D' => (ColType::F64, 8 * repeat),
        'L' | 'A' => (ColType::Other, repeat),
        'X' => (ColType::Other, repeat.div_ceil(8)),
        'C' => (ColType::Other, 8 * repeat),
        'M' => (ColType::Other, 16 * repeat),
        'P' => (ColType::Other, 8 * repeat.min(1)),
        'Q' => (ColType::Other, 16 * repeat.min(1)),
        c => return Err(format!("unknown type code '{c}'")),
    };
    Ok((ty, repeat, width))
}

/// Pixel ordering of a HEALPix map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ordering {
    /// NESTED ordering.
    Nested,
    /// RING ordering.
    Ring,
}

impl Ordering {
    fn keyword(self) -> &'static str {
        match self {
            Ordering::Nested => "NESTED",
            Ordering::Ring => "RING",
        }
    }
}

/// One map (column) of a HEALPix file, in NEST ordering.
#[derive(Debug, Clone)]
pub struct MapField {
    /// Column name (`TTYPEn`).
    pub name: String,
    /// Column unit (`TUNITn`), if given.
    pub unit: Option<String>,
    /// The pixel values in NEST order, scaled by `TSCALn`/`TZEROn`.
    pub data: Vec<f64>,
}

/// A HEALPix map read from FITS: its fields in NEST order.
#[derive(Debug, Clone)]
pub struct HealpixMap {
    /// Resolution.
    pub nside: u64,
    /// Ordering of the file (the data here are always NEST).
    pub file_ordering: Ordering,
    /// Whether the file used explicit (partial-sky) indexing.
    pub partial: bool,
    /// The fields (maps) read, in the order requested.
    pub fields: Vec<MapField>,
    /// The full header of the table extension.
    pub header: Header,
}

/// Reads a HEALPix map from the first binary-table extension of `path`.
///
/// `fields` selects map columns by 0-based index among the map columns (the
/// `PIXEL` column of partial-sky files is not counted), like healpy's
/// `field=`; `None` reads all of them. Returns the maps in NEST order, as
/// `f64`, whatever the file's ordering and column types.
pub fn read_healpix_map(path: &Path, fields: Option<&[usize]>) -> Result<HealpixMap, FitsError> {
    let mut rd = FitsReader::open(path)?;
    let p = || path.to_path_buf();
    if rd.len < BLOCK as u64 {
        // Distinguish "not FITS" from "truncated FITS" by the first card.
        let mut head = vec![0u8; rd.len as usize];
        rd.read_exact(&mut head, "file start")?;
        if head.starts_with(b"SIMPLE  =") {
            return Err(FitsError::Truncated {
                path: p(),
                what: "primary header".into(),
                offset: 0,
                expected: BLOCK as u64,
                available: rd.len,
            });
        }
        return Err(FitsError::NotFits {
            path: p(),
            reason: format!(
                "file is {} bytes, smaller than one 2880-byte FITS block",
                rd.len
            ),
        });
    }
    // Primary HDU, then extensions until a BINTABLE.
    let mut hdu = 0usize;
    let header = loop {
        let Some(h) = rd.read_header(hdu)? else {
            return Err(FitsError::NoBinTable {
                path: p(),
                nhdu: hdu,
            });
        };
        if hdu == 0 && h.get("SIMPLE") != Some(&HeaderValue::Bool(true)) {
            return Err(FitsError::NotFits {
                path: p(),
                reason: "SIMPLE is not T".into(),
            });
        }
        if hdu > 0 && h.get_str("XTENSION").as_deref() == Some("BINTABLE") {
            break h;
        }
        let size = rd.data_size(&h, hdu)?;
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        let here = rd.pos()?;
        if here + padded > rd.len {
            if here + size > rd.len {
                return Err(FitsError::Truncated {
                    path: p(),
                    what: format!("data of HDU {hdu}"),
                    offset: here,
                    expected: size,
                    available: rd.len - here,
                });
            }
            // Data complete but final padding missing: no more HDUs.
            return Err(FitsError::NoBinTable {
                path: p(),
                nhdu: hdu + 1,
            });
        }
        rd.file
            .seek(SeekFrom::Current(padded as i64))
            .map_err(|e| rd.io(e))?;
        hdu += 1;
    };

    // Table structure.
    let bad = |reason: String| FitsError::BadHeader {
        path: p(),
        hdu,
        reason,
    };
    let not_hp = |reason: String| FitsError::NotHealpix {
        path: p(),
        hdu,
        reason,
    };
    let row_bytes = header.get_int("NAXIS1").map_err(bad)?;
    let nrows = header.get_int("NAXIS2").map_err(bad)?;
    let tfields = header.get_int("TFIELDS").map_err(bad)?;
    if row_bytes < 0 || nrows < 0 || !(0..=999).contains(&tfields) {
        return Err(bad(format!(
            "invalid table shape NAXIS1={row_bytes} NAXIS2={nrows} TFIELDS={tfields}"
        )));
    }
    let (row_bytes, nrows) = (row_bytes as usize, nrows as usize);
    let mut columns = Vec::new();
    let mut offset = 0usize;
    for i in 1..=tfields as usize {
        let name = header.get_str(&format!("TTYPE{i}")).unwrap_or_default();
        let tform = header
            .get_str(&format!("TFORM{i}"))
            .ok_or_else(|| bad(format!("missing TFORM{i}")))?;
        let (ty, repeat, width) =
            parse_tform(&tform).map_err(|reason| FitsError::UnsupportedTform {
                path: p(),
                index: i,
                name: name.clone(),
                tform: tform.clone(),
                reason,
            })?;
        let scale = header
            .get(&format!("TSCAL{i}"))
            .and_then(HeaderValue::as_f64)
            .unwrap_or(1.0);
        let zero = header
            .get(&format!("TZERO{i}"))
            .and_then(HeaderValue::as_f64)
            .unwrap_or(0.0);
        let unit = header.get_str(&format!("TUNIT{i}"));
        columns.push(TableColumn {
            index: i,
            name,
            tform,
            ty,
            repeat,
            offset,
            scale,
            zero,
            unit,
        });
        offset += width;
    }
    if offset != row_bytes {
        return Err(bad(format!(
            "column widths add up to {offset} bytes but NAXIS1 = {row_bytes}"
        )));
    }

    // HEALPix keywords.
    match header.get_str("PIXTYPE") {
        Some(s) if s.eq_ignore_ascii_case("HEALPIX") => {}
        Some(s) => return Err(not_hp(format!("PIXTYPE = '{s}', expected 'HEALPIX'"))),
        None => return Err(not_hp("missing keyword PIXTYPE".into())),
    }
    let file_ordering = match header.get_str("ORDERING").map(|s| s.to_ascii_uppercase()) {
        Some(s) if s == "NESTED" || s == "NEST" => Ordering::Nested,
        Some(s) if s == "RING" => Ordering::Ring,
        Some(s) => {
            return Err(not_hp(format!(
                "ORDERING = '{s}', expected 'NESTED' or 'RING'"
            )))
        }
        None => return Err(not_hp("missing keyword ORDERING".into())),
    };
    let partial = header
        .get_str("INDXSCHM")
        .is_some_and(|s| s.eq_ignore_ascii_case("EXPLICIT"))
        || header
            .get_str("OBJECT")
            .is_some_and(|s| s.eq_ignore_ascii_case("PARTIAL"));
    let nside_kw = header.get("NSIDE").cloned();

    // Map columns.
    let (pixel_col, map_cols): (Option<TableColumn>, Vec<TableColumn>) = if partial {
        let first = columns
            .first()
            .cloned()
            .ok_or_else(|| not_hp("explicit-indexing (partial-sky) table has no columns".into()))?;
        if !first.name.eq_ignore_ascii_case("PIXEL") {
            return Err(not_hp(format!(
                "explicit-indexing (partial-sky) table: first column is '{}', expected 'PIXEL'",
                first.name
            )));
        }
        (Some(first), columns[1..].to_vec())
    } else {
        (None, columns.clone())
    };
    if map_cols.is_empty() {
        return Err(not_hp("table has no map columns".into()));
    }
    let selected: Vec<TableColumn> = match fields {
        None => map_cols.clone(),
        Some(idx) => idx
            .iter()
            .map(|&i| {
                map_cols.get(i).cloned().ok_or_else(|| {
                    not_hp(format!(
                        "field {i} requested but the table has {} map column(s)",
                        map_cols.len()
                    ))
                })
            })
            .collect::<Result<_, _>>()?,
    };
    if selected.is_empty() {
        return Err(not_hp("no fields requested".into()));
    }
    for c in selected.iter().chain(pixel_col.iter()) {
        if c.ty == ColType::Other {
            return Err(FitsError::UnsupportedTform {
                path: p(),
                index: c.index,
                name: c.name.clone(),
                tform: c.tform.clone(),
                reason: "only numeric columns (B, I, J, K, E, D) can hold map values".into(),
            });
        }
    }
    let repeat = selected[0].repeat;
    if let Some(c) = selected
        .iter()
        .chain(pixel_col.iter())
        .find(|c| c.repeat != repeat)
    {
        return Err(FitsError::UnsupportedTform {
            path: p(),
            index: c.index,
            name: c.name.clone(),
            tform: c.tform.clone(),
            reason: format!(
                "repeat count {} differs from {} of column '{}'",
                c.repeat, repeat, selected[0].name
            ),
        });
    }
    let nelem = nrows
        .checked_mul(repeat)
        .ok_or_else(|| bad("row count overflows".into()))?;

    // Resolution: from NSIDE if present (must be valid), else from the element count.
    let nside = match &nside_kw {
        Some(v) => {
            let n = v.as_int().ok_or_else(|| FitsError::BadNside {
                path: p(),
                value: v.display(),
                reason: "not an integer".into(),
            })?;
            if n <= 0 || healpix::check_nside(n as u64).is_err() {
                return Err(FitsError::BadNside {
                    path: p(),
                    value: n.to_string(),
                    reason: "must be a power of two between 1 and 2^29".into(),
                });
            }
            n as u64
        }
        None if partial => return Err(not_hp("partial-sky map without NSIDE keyword".into())),
        None => healpix::npix2nside(nelem as u64).map_err(|_| FitsError::RowCount {
            path: p(),
            reason: format!(
                "no NSIDE keyword and {nelem} pixels ({nrows} rows x {repeat}) is not 12*nside^2"
            ),
        })?,
    };
    let hp = Healpix::new(nside).expect("nside validated");
    let npix = hp.npix() as usize;
    if !partial && nelem != npix {
        return Err(FitsError::RowCount {
            path: p(),
            reason: format!(
                "NSIDE = {nside} needs {npix} pixels but the table has {nrows} rows x {repeat} = {nelem}"
            ),
        });
    }
    if partial && nelem > npix {
        return Err(FitsError::RowCount {
            path: p(),
            reason: format!(
                "partial map has {nelem} entries, more than the {npix} pixels of NSIDE = {nside}"
            ),
        });
    }

    // Data, read in chunks of whole rows.
    let data_start = rd.pos()?;
    let total = (row_bytes as u64) * nrows as u64;
    if data_start + total > rd.len {
        return Err(FitsError::Truncated {
            path: p(),
            what: format!("table data of HDU {hdu} ({nrows} rows x {row_bytes} bytes)"),
            offset: data_start,
            expected: total,
            available: rd.len - data_start,
        });
    }
    let mut raw: Vec<Vec<f64>> = selected.iter().map(|_| vec![0.0; nelem]).collect();
    let mut pixels: Vec<f64> = if pixel_col.is_some() {
        vec![0.0; nelem]
    } else {
        Vec::new()
    };
    let rows_per_chunk = ((4 << 20) / row_bytes.max(1)).max(1);
    let mut buf = vec![0u8; rows_per_chunk * row_bytes];
    let mut row0 = 0usize;
    while row0 < nrows {
        let nr = rows_per_chunk.min(nrows - row0);
        let chunk = &mut buf[..nr * row_bytes];
        rd.read_exact(chunk, &format!("table data of HDU {hdu}"))?;
        let chunk = &buf[..nr * row_bytes];
        for (col, out) in selected.iter().zip(raw.iter_mut()) {
            decode_column(
                chunk,
                row_bytes,
                col,
                &mut out[row0 * repeat..(row0 + nr) * repeat],
            );
        }
        if let Some(pc) = &pixel_col {
            decode_column(
                chunk,
                row_bytes,
                pc,
                &mut pixels[row0 * repeat..(row0 + nr) * repeat],
            );
        }
        row0 += nr;
    }

    // Scatter partial maps to full sky (file ordering), then reorder to NEST.
    let full: Vec<Vec<f64>> = if partial {
        for (k, &pix) in pixels.iter().enumerate() {
            if !(pix >= 0.0 && pix < npix as f64 && pix.fract() == 0.0) {
                return Err(not_hp(format!(
                    "PIXEL entry {k} = {pix} is not a pixel index of NSIDE = {nside}"
                )));
            }
        }
        raw.into_iter()
            .map(|vals| {
                let mut m = vec![UNSEEN; npix];
                for (&pix, &v) in pixels.iter().zip(vals.iter()) {
                    m[pix as usize] = v;
                }
                m
            })
            .collect()
    } else {
        raw
    };
    let fields_out = selected
        .iter()
        .zip(full)
        .map(|(c, data)| {
            let data = match file_ordering {
                Ordering::Nested => data,
                Ordering::Ring => {
                    healpix::ring_to_nest(&data).expect("length is 12 nside^2 by construction")
                }
            };
            MapField {
                name: c.name.clone(),
                unit: c.unit.clone(),
                data,
            }
        })
        .collect();
    Ok(HealpixMap {
        nside,
        file_ordering,
        partial,
        fields: fields_out,
        header,
    })
}

/// Decodes the big-endian values of `col` from whole rows in `chunk` into `out`
/// (`rows × repeat` values), applying TSCAL/TZERO.
fn decode_column(chunk: &[u8], row_bytes: usize, col: &TableColumn, out: &mut [f64]) {
    let size = col.ty.size();
    let (scale, zero) = (col.scale, col.zero);
    let scaled = scale != 1.0 || zero != 0.0;
    out.par_chunks_mut(col.repeat * 4096)
        .enumerate()
        .for_each(|(ci, out)| {
            let row_first = ci * 4096;
            for (k, o) in out.iter_mut().enumerate() {
                let row = row_first + k / col.repeat;
                let e = k % col.repeat;
                let at = row * row_bytes + col.offset + e * size;
                let b = &chunk[at..at + size];
                let v = match col.ty {
                    ColType::U8 => b[0] as f64,
                    ColType::I16 => i16::from_be_bytes([b[0], b[1]]) as f64,
                    ColType::I32 => i32::from_be_bytes(b.try_into().expect("4 bytes")) as f64,
                    ColType::I64 => i64::from_be_bytes(b.try_into().expect("8 bytes")) as f64,
                    ColType::F32 => f32::from_be_bytes(b.try_into().expect("4 bytes")) as f64,
                    ColType::F64 => f64::from_be_bytes(b.try_into().expect("8 bytes")),
                    ColType::Other => unreachable!("non-numeric columns rejected earlier"),
                };
                *o = if scaled { zero + scale * v } else { v };
            }
        });
}

// =====================================================================
// Writing
// =====================================================================

/// Source data of a column to write (any of these can be stored in any
/// [`ColumnFormat`]; float → integer conversion is refused).
#[derive(Debug, Clone, Copy)]
pub enum ColumnSource<'a> {
    /// float32 values.
    F32(&'a [f32]),
    /// float64 values.
    F64(&'a [f64]),
    /// int32 values.
    I32(&'a [i32]),
    /// int64 values.
    I64(&'a [i64]),
}

impl ColumnSource<'_> {
    fn len(&self) -> usize {
        match self {
            ColumnSource::F32(d) => d.len(),
            ColumnSource::F64(d) => d.len(),
            ColumnSource::I32(d) => d.len(),
            ColumnSource::I64(d) => d.len(),
        }
    }

    fn is_float(&self) -> bool {
        matches!(self, ColumnSource::F32(_) | ColumnSource::F64(_))
    }
}

/// Storage format of a written column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnFormat {
    /// `E`: IEEE float32.
    F32,
    /// `D`: IEEE float64.
    F64,
    /// `J`: int32 (values outside the range are an error).
    I32,
    /// `K`: int64.
    I64,
}

impl ColumnFormat {
    fn code(self) -> &'static str {
        match self {
            ColumnFormat::F32 => "E",
            ColumnFormat::F64 => "D",
            ColumnFormat::I32 => "J",
            ColumnFormat::I64 => "K",
        }
    }

    fn size(self) -> usize {
        match self {
            ColumnFormat::F32 | ColumnFormat::I32 => 4,
            ColumnFormat::F64 | ColumnFormat::I64 => 8,
        }
    }
}

/// A map column to write.
#[derive(Debug, Clone, Copy)]
pub struct WriteColumn<'a> {
    /// Column name (`TTYPEn`).
    pub name: &'a str,
    /// Column unit (`TUNITn`), omitted if `None`.
    pub unit: Option<&'a str>,
    /// Storage format (`TFORMn`).
    pub format: ColumnFormat,
    /// Pixel values, `12 nside²` of them, in the file's ordering.
    pub data: ColumnSource<'a>,
}

/// Float precision of written I/Q/U maps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapPrecision {
    /// float32 (`E`), TOAST's default.
    #[default]
    F32,
    /// float64 (`D`), TOAST's `write_float64`.
    F64,
}

/// TOAST MapMaker's extra header cards, in TOAST's order:
/// `START`, `STOP` (unix seconds), `NDET`, `NGOOD`, `OPERATOR = 'TOAST MapMaker'`,
/// `CREATED` (unix time now), `VERSION`.
pub fn toast_extra_header(
    start: f64,
    stop: f64,
    ndet: i64,
    ngood: i64,
    version: &str,
) -> Vec<HeaderCard> {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    vec![
        HeaderCard::float("START", start, "Dataset start time"),
        HeaderCard::float("STOP", stop, "Dataset stop time"),
        HeaderCard::int("NDET", ndet, "Total number of detectors"),
        HeaderCard::int("NGOOD", ngood, "Total number of usable detectors"),
        HeaderCard::string("OPERATOR", "TOAST MapMaker", "Generating code"),
        HeaderCard::float("CREATED", created, "Creation time [UTC]"),
        HeaderCard::string("VERSION", version, "TOAST version"),
    ]
}

/// Writes a full-sky HEALPix map (one scalar column per map) in the layout of
/// `healpy.write_map(..., fits_IDL=False)` (see the module documentation).
///
/// All columns must have `12 nside²` values for a valid `nside`; `extra` cards
/// are appended after the HEALPix keywords (an `EXTNAME` card replaces the
/// default `'xtension'`; structural and HEALPix keywords are refused). An
/// existing file is replaced.
pub fn write_healpix_map(
    path: &Path,
    ordering: Ordering,
    columns: &[WriteColumn<'_>],
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    let invalid = |reason: String| FitsError::InvalidInput {
        path: path.to_path_buf(),
        reason,
    };
    if columns.is_empty() {
        return Err(invalid("no columns".into()));
    }
    if columns.len() > 999 {
        return Err(invalid(format!(
            "{} columns (FITS allows 999)",
            columns.len()
        )));
    }
    let npix = columns[0].data.len();
    let nside = healpix::npix2nside(npix as u64).map_err(|e| invalid(e.to_string()))?;
    for c in columns {
        if c.data.len() != npix {
            return Err(invalid(format!(
                "column '{}' has {} values, column '{}' has {npix}",
                c.name,
                c.data.len(),
                columns[0].name
            )));
        }
        if c.data.is_float() && matches!(c.format, ColumnFormat::I32 | ColumnFormat::I64) {
            return Err(invalid(format!(
                "column '{}': refusing to store float data as integer TFORM {}",
                c.name,
                c.format.code()
            )));
        }
    }
    let row_bytes: usize = columns.iter().map(|c| c.format.size()).sum();

    let mut cards = vec![
        HeaderCard::new(
            "XTENSION",
            HeaderValue::Str("BINTABLE".into()),
            Some("binary table extension"),
        ),
        HeaderCard::int("BITPIX", 8, "array data type"),
        HeaderCard::int("NAXIS", 2, "number of array dimensions"),
        HeaderCard::int("NAXIS1", row_bytes as i64, "length of dimension 1"),
        HeaderCard::int("NAXIS2", npix as i64, "length of dimension 2"),
        HeaderCard::int("PCOUNT", 0, "number of group parameters"),
        HeaderCard::int("GCOUNT", 1, "number of groups"),
        HeaderCard::int("TFIELDS", columns.len() as i64, "number of table fields"),
    ];
    for (i, c) in columns.iter().enumerate() {
        let n = i + 1;
        cards.push(HeaderCard::new(
            &format!("TTYPE{n}"),
            HeaderValue::Str(c.name.into()),
            None,
        ));
        cards.push(HeaderCard::new(
            &format!("TFORM{n}"),
            HeaderValue::Str(c.format.code().into()),
            None,
        ));
        if let Some(u) = c.unit {
            cards.push(HeaderCard::new(
                &format!("TUNIT{n}"),
                HeaderValue::Str(u.into()),
                None,
            ));
        }
    }
    cards.extend([
        HeaderCard::string("PIXTYPE", "HEALPIX", "HEALPIX pixelisation"),
        HeaderCard::string(
            "ORDERING",
            ordering.keyword(),
            "Pixel ordering scheme, either RING or NESTED",
        ),
        HeaderCard::string("EXTNAME", "xtension", "name of this binary table extension"),
        HeaderCard::int("NSIDE", nside as i64, "Resolution parameter of HEALPIX"),
        HeaderCard::int("FIRSTPIX", 0, "First pixel # (0 based)"),
        HeaderCard::int("LASTPIX", npix as i64 - 1, "Last pixel # (0 based)"),
        HeaderCard::string("INDXSCHM", "IMPLICIT", "Indexing: IMPLICIT or EXPLICIT"),
        HeaderCard::string(
            "OBJECT",
            "FULLSKY",
            "Sky coverage, either FULLSKY or PARTIAL",
        ),
    ]);
    let reserved = [
        "XTENSION", "BITPIX", "NAXIS", "NAXIS1", "NAXIS2", "PCOUNT", "GCOUNT", "TFIELDS",
        "PIXTYPE", "ORDERING", "NSIDE", "FIRSTPIX", "LASTPIX", "INDXSCHM", "OBJECT", "END",
    ];
    for c in extra {
        if reserved.contains(&c.key.as_str())
            || ["TTYPE", "TFORM", "TUNIT"].iter().any(|p| {
                c.key.strip_prefix(p).is_some_and(|r| {
                    r.parse::<usize>()
                        .is_ok_and(|n| n >= 1 && n <= columns.len())
                })
            })
        {
            return Err(invalid(format!(
                "extra header keyword {} is set by the writer",
                c.key
            )));
        }
        if extra.iter().filter(|o| o.key == c.key).count() > 1 {
            return Err(invalid(format!(
                "extra header keyword {} given more than once",
                c.key
            )));
        }
        if let Some(existing) = cards.iter_mut().find(|o| o.key == c.key) {
            // e.g. EXTNAME: replaced, as healpy's extra_header does.
            *existing = c.clone();
        } else {
            cards.push(c.clone());
        }
    }
    let mut header = Vec::with_capacity(cards.len() * CARD + BLOCK);
    for c in &cards {
        header.extend_from_slice(format_card(c).map_err(&invalid)?.as_bytes());
    }
    header.extend_from_slice(format!("{:<80}", "END").as_bytes());
    pad_block(&mut header, b' ');

    // Validate integer ranges before touching the file.
    for c in columns {
        if c.format == ColumnFormat::I32 {
            if let ColumnSource::I64(d) = c.data {
                if let Some((i, v)) = d
                    .iter()
                    .enumerate()
                    .find(|(_, &v)| i32::try_from(v).is_err())
                {
                    return Err(invalid(format!(
                        "column '{}': value {v} at pixel {i} does not fit int32 (TFORM J)",
                        c.name
                    )));
                }
            }
        }
    }

    let file = File::create(path).map_err(|source| FitsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| FitsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let mut primary = Vec::with_capacity(BLOCK);
    for c in [
        HeaderCard::new(
            "SIMPLE",
            HeaderValue::Bool(true),
            Some("conforms to FITS standard"),
        ),
        HeaderCard::int("BITPIX", 8, "array data type"),
        HeaderCard::int("NAXIS", 0, "number of array dimensions"),
        HeaderCard::new("EXTEND", HeaderValue::Bool(true), None),
    ] {
        primary.extend_from_slice(format_card(&c).map_err(&invalid)?.as_bytes());
    }
    primary.extend_from_slice(format!("{:<80}", "END").as_bytes());
    pad_block(&mut primary, b' ');
    w.write_all(&primary).map_err(io)?;
    w.write_all(&header).map_err(io)?;

    // Rows, encoded in parallel chunks.
    const ROWS: usize = 1 << 16;
    let mut buf = vec![0u8; ROWS * row_bytes];
    let mut row0 = 0usize;
    while row0 < npix {
        let nr = ROWS.min(npix - row0);
        let chunk = &mut buf[..nr * row_bytes];
        chunk
            .par_chunks_mut(row_bytes * 1024)
            .enumerate()
            .for_each(|(ci, sub)| {
                let first = row0 + ci * 1024;
                let mut off = 0usize;
                for c in columns {
                    encode_column(sub, row_bytes, off, first, c);
                    off += c.format.size();
                }
            });
        w.write_all(chunk).map_err(io)?;
        row0 += nr;
    }
    let data_bytes = npix * row_bytes;
    let pad = (BLOCK - data_bytes % BLOCK) % BLOCK;
    w.write_all(&vec![0u8; pad]).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(())
}

/// Encodes column `c` for rows `first..first + sub.len()/row_bytes` into `sub`
/// at byte offset `off` of each row. Integer ranges were validated before.
fn encode_column(sub: &mut [u8], row_bytes: usize, off: usize, first: usize, c: &WriteColumn<'_>) {
    let size = c.format.size();
    for (k, row) in sub.chunks_exact_mut(row_bytes).enumerate() {
        let i = first + k;
        let dst = &mut row[off..off + size];
        match (c.format, c.data) {
            (ColumnFormat::F32, ColumnSource::F32(d)) => dst.copy_from_slice(&d[i].to_be_bytes()),
            (ColumnFormat::F32, ColumnSource::F64(d)) => {
                dst.copy_from_slice(&(d[i] as f32).to_be_bytes())
            }
            (ColumnFormat::F32, ColumnSource::I32(d)) => {
                dst.copy_from_slice(&(d[i] as f32).to_be_bytes())
            }
            (ColumnFormat::F32, ColumnSource::I64(d)) => {
                dst.copy_from_slice(&(d[i] as f32).to_be_bytes())
            }
            (ColumnFormat::F64, ColumnSource::F32(d)) => {
                dst.copy_from_slice(&(d[i] as f64).to_be_bytes())
            }
            (ColumnFormat::F64, ColumnSource::F64(d)) => dst.copy_from_slice(&d[i].to_be_bytes()),
            (ColumnFormat::F64, ColumnSource::I32(d)) => {
                dst.copy_from_slice(&(d[i] as f64).to_be_bytes())
            }
            (ColumnFormat::F64, ColumnSource::I64(d)) => {
                dst.copy_from_slice(&(d[i] as f64).to_be_bytes())
            }
            (ColumnFormat::I32, ColumnSource::I32(d)) => dst.copy_from_slice(&d[i].to_be_bytes()),
            (ColumnFormat::I32, ColumnSource::I64(d)) => {
                dst.copy_from_slice(&(d[i] as i32).to_be_bytes())
            }
            (ColumnFormat::I64, ColumnSource::I32(d)) => {
                dst.copy_from_slice(&(d[i] as i64).to_be_bytes())
            }
            (ColumnFormat::I64, ColumnSource::I64(d)) => dst.copy_from_slice(&d[i].to_be_bytes()),
            (
                ColumnFormat::I32 | ColumnFormat::I64,
                ColumnSource::F32(_) | ColumnSource::F64(_),
            ) => {
                unreachable!("float to integer columns rejected before writing")
            }
        }
    }
}

fn pad_block(buf: &mut Vec<u8>, fill: u8) {
    let rem = buf.len() % BLOCK;
    if rem != 0 {
        buf.resize(buf.len() + BLOCK - rem, fill);
    }
}

/// Writes an I/Q/U map the way TOAST's MapMaker does: columns `TEMPERATURE`,
/// `Q_POLARISATION`, `U_POLARISATION`, each with unit `unit`, as float32 (`E`)
/// or float64 (`D`).
pub fn write_iqu_map(
    path: &Path,
    ordering: Ordering,
    maps: [&[f64]; 3],
    unit: &str,
    precision: MapPrecision,
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    let format = match precision {
        MapPrecision::F32 => ColumnFormat::F32,
        MapPrecision::F64 => ColumnFormat::F64,
    };
    let names = ["TEMPERATURE", "Q_POLARISATION", "U_POLARISATION"];
    let cols: Vec<WriteColumn<'_>> = names
        .iter()
        .zip(maps)
        .map(|(name, data)| WriteColumn {
            name,
            unit: Some(unit),
            format,
            data: ColumnSource::F64(data),
        })
        .collect();
    write_healpix_map(path, ordering, &cols, extra)
}

/// Writes a hit-count map the way TOAST's MapMaker does: one int32 (`J`)
/// column named `T`, no unit. Counts above `i32::MAX` are an error.
pub fn write_hits_map(
    path: &Path,
    ordering: Ordering,
    hits: &[i64],
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    write_healpix_map(
        path,
        ordering,
        &[WriteColumn {
            name: "T",
            unit: None,
            format: ColumnFormat::I32,
            data: ColumnSource::I64(hits),
        }],
        extra,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_format_roundtrips() {
        for v in [
            0.0,
            1.0,
            -2.5,
            1800000000.0,
            1.795352134329217e9,
            1e20,
            -1.5e-7,
            1e-300,
            123.456,
        ] {
            let s = format_float(v);
            assert!(s.contains('.'), "{s}");
            assert!(!s.contains('e'), "{s}");
            match parse_value(&s).unwrap() {
                HeaderValue::Float(x) => assert_eq!(x, v, "{s}"),
                other => panic!("{s} parsed as {other:?}"),
            }
        }
    }

    #[test]
    fn card_format_and_parse() {
        let c = format_card(&HeaderCard::string(
            "PIXTYPE",
            "HEALPIX",
            "HEALPIX pixelisation",
        ))
        .unwrap();
        assert_eq!(c.len(), 80);
        assert_eq!(&c[..33], "PIXTYPE = 'HEALPIX '           / ");
        let c = format_card(&HeaderCard::int(
            "NSIDE",
            16,
            "Resolution parameter of HEALPIX",
        ))
        .unwrap();
        assert_eq!(&c[..33], "NSIDE   =                   16 / ");
        let c = format_card(&HeaderCard::new("EXTEND", HeaderValue::Bool(true), None)).unwrap();
        assert_eq!(c.trim_end(), "EXTEND  =                    T");
        assert_eq!(
            parse_value(" 'it''s  ' / x").unwrap(),
            HeaderValue::Str("it's".into())
        );
        assert_eq!(
            parse_value("  1.5D3 / c").unwrap(),
            HeaderValue::Float(1500.0)
        );
        assert_eq!(parse_value("  -42").unwrap(), HeaderValue::Int(-42));
        assert!(parse_value(" 'abc").is_err());
        assert!(format_card(&HeaderCard::int("lower", 1, "")).is_err());
        assert!(format_card(&HeaderCard::float("X", f64::NAN, "")).is_err());
    }

    #[test]
    fn tform_parsing() {
        assert_eq!(parse_tform("E").unwrap(), (ColType::F32, 1, 4));
        assert_eq!(parse_tform("1024E").unwrap(), (ColType::F32, 1024, 4096));
        assert_eq!(parse_tform("K").unwrap(), (ColType::I64, 1, 8));
        assert_eq!(parse_tform("2I").unwrap(), (ColType::I16, 2, 4));
        assert_eq!(parse_tform("16X").unwrap(), (ColType::Other, 16, 2));
        assert!(parse_tform("1Z").is_err());
        assert!(parse_tform("").is_err());
    }
}
