//! FITS headers: 2880-byte blocks, 80-character cards, keyword values
//! parsed and formatted, and [`FitsReader`], the walk over a file's HDUs
//! (headers read card by card, data units skipped) that stops at the first
//! binary table. Every size a header claims is checked against the file's
//! length before it is read or skipped.

use std::fs::File;
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::FitsError;

/// FITS block size in bytes.
pub const BLOCK: usize = 2880;
/// Header card length in bytes.
const CARD: usize = 80;

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

/// As a header card writes it: `T`/`F`, the number, or the string in
/// single quotes.
impl std::fmt::Display for HeaderValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderValue::Bool(b) => f.write_str(if *b { "T" } else { "F" }),
            HeaderValue::Int(v) => write!(f, "{v}"),
            HeaderValue::Float(v) => write!(f, "{v}"),
            HeaderValue::Str(s) => write!(f, "'{s}'"),
        }
    }
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

    pub(super) fn display(&self) -> String {
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

    pub(super) fn get_int(&self, key: &str) -> Result<i64, String> {
        match self.get(key) {
            None => Err(format!("missing keyword {key}")),
            Some(v) => v
                .as_int()
                .ok_or_else(|| format!("keyword {key} = {} is not an integer", v.display())),
        }
    }

    pub(super) fn get_str(&self, key: &str) -> Option<String> {
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

/// The bytes of a header: `cards`, the `END` card, then blanks up to a whole
/// block. Errors (from [`format_card`]) are plain strings.
pub(super) fn encode_header(cards: &[HeaderCard]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(cards.len() * CARD + BLOCK);
    for c in cards {
        out.extend_from_slice(format_card(c)?.as_bytes());
    }
    out.extend_from_slice(format!("{:<80}", "END").as_bytes());
    let rem = out.len() % BLOCK;
    if rem != 0 {
        out.resize(out.len() + BLOCK - rem, b' ');
    }
    Ok(out)
}

/// The cards of an empty primary HDU that announces extensions
/// (`SIMPLE = T`, `BITPIX = 8`, `NAXIS = 0`, `EXTEND = T`).
pub(super) fn primary_cards() -> [HeaderCard; 4] {
    [
        HeaderCard::new(
            "SIMPLE",
            HeaderValue::Bool(true),
            Some("conforms to FITS standard"),
        ),
        HeaderCard::int("BITPIX", 8, "array data type"),
        HeaderCard::int("NAXIS", 0, "number of array dimensions"),
        HeaderCard::new("EXTEND", HeaderValue::Bool(true), None),
    ]
}

// =====================================================================
// Reading: the walk over HDUs
// =====================================================================

/// Reader state: the file, its path (for error messages) and its length
/// (against which every size a header claims is checked).
pub(super) struct FitsReader {
    pub(super) path: PathBuf,
    file: BufReader<File>,
    pub(super) len: u64,
}

impl FitsReader {
    pub(super) fn open(path: &Path) -> Result<Self, FitsError> {
        let file = toast_core::input::open_regular(path).map_err(|source| FitsError::Open {
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

    pub(super) fn pos(&mut self) -> Result<u64, FitsError> {
        self.file.stream_position().map_err(|e| self.io(e))
    }

    /// Reads exactly `buf.len()` bytes, reporting truncation against the file size.
    pub(super) fn read_exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), FitsError> {
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

    pub(super) fn bad_header(&self, hdu: usize, reason: String) -> FitsError {
        FitsError::BadHeader {
            path: self.path.clone(),
            hdu,
            reason,
        }
    }

    /// Step 1 of reading a table: walks the primary HDU and the extensions
    /// up to the first `XTENSION = 'BINTABLE'`, skipping each data unit once
    /// its size is checked against the file. Returns the table's HDU index
    /// and header, with the reader at the start of the table's data.
    pub(super) fn find_bintable(&mut self) -> Result<(usize, Header), FitsError> {
        self.check_first_block()?;
        let mut hdu = 0usize;
        loop {
            let Some(h) = self.read_header(hdu)? else {
                return Err(FitsError::NoBinTable {
                    path: self.path.clone(),
                    nhdu: hdu,
                });
            };
            if hdu == 0 && h.get("SIMPLE") != Some(&HeaderValue::Bool(true)) {
                return Err(FitsError::NotFits {
                    path: self.path.clone(),
                    reason: "SIMPLE is not T".into(),
                });
            }
            if hdu > 0 && h.get_str("XTENSION").as_deref() == Some("BINTABLE") {
                return Ok((hdu, h));
            }
            self.skip_data(&h, hdu)?;
            hdu += 1;
        }
    }

    /// A file shorter than one block is either not FITS or a truncated
    /// primary header (told apart by its first card).
    fn check_first_block(&mut self) -> Result<(), FitsError> {
        if self.len >= BLOCK as u64 {
            return Ok(());
        }
        let mut head = vec![0u8; self.len as usize];
        self.read_exact(&mut head, "file start")?;
        if head.starts_with(b"SIMPLE  =") {
            return Err(FitsError::Truncated {
                path: self.path.clone(),
                what: "primary header".into(),
                offset: 0,
                expected: BLOCK as u64,
                available: self.len,
            });
        }
        Err(FitsError::NotFits {
            path: self.path.clone(),
            reason: format!(
                "file is {} bytes, smaller than one 2880-byte FITS block",
                self.len
            ),
        })
    }

    /// Skips the data unit `header` describes (padded to whole blocks),
    /// after checking its size against what is left of the file.
    fn skip_data(&mut self, header: &Header, hdu: usize) -> Result<(), FitsError> {
        let (size, claim) = self.data_size(header, hdu)?;
        let padded = size
            .div_ceil(BLOCK as u64)
            .checked_mul(BLOCK as u64)
            .ok_or_else(|| self.bad_header(hdu, format!("data size overflows ({claim})")))?;
        let here = self.pos()?;
        let available = self.len.saturating_sub(here);
        if padded > available {
            if size > available {
                return Err(FitsError::Truncated {
                    path: self.path.clone(),
                    what: format!("data of HDU {hdu} ({claim})"),
                    offset: here,
                    expected: size,
                    available,
                });
            }
            // Data complete but final padding missing: no more HDUs.
            return Err(FitsError::NoBinTable {
                path: self.path.clone(),
                nhdu: hdu + 1,
            });
        }
        self.file
            .seek(SeekFrom::Start(here + padded))
            .map_err(|e| self.io(e))?;
        Ok(())
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
                        self.bad_header(hdu, reason)
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
                            self.bad_header(hdu, reason)
                        });
                    }
                }
                if key == "END" {
                    return Ok(Some(header));
                }
                if &text[8..10] == "= " {
                    let value = parse_value(&text[10..]).map_err(|reason| {
                        self.bad_header(hdu, format!("keyword {key}: {reason}"))
                    })?;
                    header.cards.push((key, Some(value)));
                } else {
                    header.cards.push((key, None));
                }
            }
        }
    }

    /// Size in bytes (unpadded) of the data unit described by `header`, and
    /// the keywords it comes from (`BITPIX = 8, NAXIS1 = ..., ...`) for
    /// error messages.
    fn data_size(&self, header: &Header, hdu: usize) -> Result<(u64, String), FitsError> {
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
        let mut claim = format!("BITPIX = {bitpix}, NAXIS = {naxis}");
        if naxis == 0 {
            return Ok((0, claim));
        }
        let mut n: u64 = 1;
        for i in 1..=naxis {
            let d = header
                .get_int(&format!("NAXIS{i}"))
                .map_err(|r| self.bad_header(hdu, r))?;
            if d < 0 {
                return Err(self.bad_header(hdu, format!("negative NAXIS{i} {d}")));
            }
            claim.push_str(&format!(", NAXIS{i} = {d}"));
            n = n
                .checked_mul(d as u64)
                .ok_or_else(|| self.bad_header(hdu, format!("data size overflows ({claim})")))?;
        }
        let pcount = header.get("PCOUNT").and_then(|v| v.as_int()).unwrap_or(0);
        let gcount = header.get("GCOUNT").and_then(|v| v.as_int()).unwrap_or(1);
        if pcount < 0 || gcount < 0 {
            return Err(self.bad_header(hdu, format!("invalid PCOUNT {pcount} / GCOUNT {gcount}")));
        }
        claim.push_str(&format!(", PCOUNT = {pcount}, GCOUNT = {gcount}"));
        let size = (pcount as u64)
            .checked_add(n)
            .and_then(|e| e.checked_mul(gcount as u64))
            .and_then(|e| e.checked_mul(bitpix.unsigned_abs() / 8))
            .ok_or_else(|| self.bad_header(hdu, format!("data size overflows ({claim})")))?;
        Ok((size, claim))
    }
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
}
