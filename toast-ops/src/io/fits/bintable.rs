//! Binary tables (`XTENSION = 'BINTABLE'`): the row layout a header declares
//! (`NAXIS1`, `NAXIS2`, `TFIELDS`, `TFORMn`, `TTYPEn`, `TUNITn`, `TSCALn`,
//! `TZEROn`), the column types, and the big-endian encoding and decoding of
//! rows: [`TableLayout`] for reading, [`WriteColumn`] and [`write_rows`]
//! for writing.

use std::io::Write;
use std::path::Path;

use rayon::prelude::*;

use super::header::{FitsReader, Header, HeaderCard, HeaderValue, BLOCK};
use super::{FitsError, UNSEEN};

// =====================================================================
// Reading
// =====================================================================

/// Element type of a binary-table column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ColType {
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
    /// An integer type (`B`, `I`, `J`, `K`): the types `TNULLn` applies to.
    fn is_integer(self) -> bool {
        matches!(
            self,
            ColType::U8 | ColType::I16 | ColType::I32 | ColType::I64
        )
    }

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
pub(super) struct TableColumn {
    /// 1-based column index.
    pub(super) index: usize,
    /// `TTYPEn` (empty if absent).
    pub(super) name: String,
    /// `TFORMn` as written.
    pub(super) tform: String,
    pub(super) ty: ColType,
    /// Elements per row.
    pub(super) repeat: usize,
    /// Byte offset in the row.
    offset: usize,
    /// `TSCALn` (default 1).
    scale: f64,
    /// `TZEROn` (default 0).
    zero: f64,
    /// `TNULLn` of an integer column: the stored value of an undefined
    /// element, decoded as [`UNSEEN`] (HEALPix's undefined pixel).
    null: Option<i64>,
    /// `TUNITn`.
    pub(super) unit: Option<String>,
}

impl TableColumn {
    /// The error for a column this reader cannot use, naming file, column and TFORM.
    pub(super) fn unsupported(&self, path: &Path, reason: String) -> FitsError {
        FitsError::UnsupportedTform {
            path: path.to_path_buf(),
            index: self.index,
            name: self.name.clone(),
            tform: self.tform.clone(),
            reason,
        }
    }
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
    let times = |bytes: usize| {
        bytes
            .checked_mul(repeat)
            .ok_or_else(|| format!("repeat count {repeat} overflows the row width"))
    };
    let (ty, width) = match code {
        'B' => (ColType::U8, repeat),
        'I' => (ColType::I16, times(2)?),
        'J' => (ColType::I32, times(4)?),
        'K' => (ColType::I64, times(8)?),
        'E' => (ColType::F32, times(4)?),
        'D' => (ColType::F64, times(8)?),
        'L' | 'A' => (ColType::Other, repeat),
        'X' => (ColType::Other, repeat.div_ceil(8)),
        'C' => (ColType::Other, times(8)?),
        'M' => (ColType::Other, times(16)?),
        'P' => (ColType::Other, 8 * repeat.min(1)),
        'Q' => (ColType::Other, 16 * repeat.min(1)),
        c => return Err(format!("unknown type code '{c}'")),
    };
    Ok((ty, repeat, width))
}

/// The layout of a binary table as its header declares it.
#[derive(Debug, Clone)]
pub(super) struct TableLayout {
    /// `NAXIS1`: bytes per row.
    pub(super) row_bytes: usize,
    /// `NAXIS2`: number of rows.
    pub(super) nrows: usize,
    /// The `TFIELDS` columns, in order.
    pub(super) columns: Vec<TableColumn>,
}

impl TableLayout {
    /// Step 2 of reading a table: the shape (`NAXIS1`, `NAXIS2`,
    /// `TFIELDS`) and the columns (`TTYPEn`, `TFORMn`, `TSCALn`, `TZEROn`,
    /// `TUNITn`) of the table in HDU `hdu`; the column widths must add up to
    /// `NAXIS1`.
    pub(super) fn parse(header: &Header, path: &Path, hdu: usize) -> Result<Self, FitsError> {
        let bad = |reason: String| FitsError::BadHeader {
            path: path.to_path_buf(),
            hdu,
            reason,
        };
        // What the FITS standard (4.0, section 7.3.1) fixes for every
        // binary table: bytes, two axes, no groups, a non-negative heap.
        let fixed = [("BITPIX", 8), ("NAXIS", 2), ("GCOUNT", 1)];
        for (key, want) in fixed {
            let v = header.get_int(key).map_err(bad)?;
            if v != want {
                return Err(bad(format!(
                    "{key} = {v} in a binary table, which has {key} = {want}"
                )));
            }
        }
        let pcount = header.get_int("PCOUNT").map_err(bad)?;
        if pcount < 0 {
            return Err(bad(format!(
                "PCOUNT = {pcount} in a binary table, which has PCOUNT >= 0"
            )));
        }
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
                    path: path.to_path_buf(),
                    index: i,
                    name: name.clone(),
                    tform: tform.clone(),
                    reason,
                })?;
            // A scaling keyword that is present must be a finite number
            // (one that is not was read as absent, and the column used
            // unscaled).
            let number = |key: &str, default: f64| match header.get(key) {
                None => Ok(default),
                Some(v) => match v.as_f64() {
                    Some(x) if x.is_finite() => Ok(x),
                    _ => Err(bad(format!("{key} = {v}: not a finite number"))),
                },
            };
            let scale = number(&format!("TSCAL{i}"), 1.0)?;
            let zero = number(&format!("TZERO{i}"), 0.0)?;
            // TNULLn marks the undefined values of an integer column
            // (FITS 4.0, section 7.3.2); floating-point columns mark theirs
            // with NaN, and the standard gives them no TNULLn (ignored).
            let tnull = format!("TNULL{i}");
            let null = match header.get(&tnull) {
                Some(v) if ty.is_integer() => Some(v.as_int().ok_or_else(|| {
                    bad(format!(
                        "{tnull} = {v}: not an integer (column {i} holds integers)"
                    ))
                })?),
                _ => None,
            };
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
                null,
                unit,
            });
            offset = offset.checked_add(width).ok_or_else(|| {
                bad(format!(
                    "column widths up to TFORM{i} overflow (NAXIS1 = {row_bytes})"
                ))
            })?;
        }
        if offset != row_bytes {
            return Err(bad(format!(
                "column widths add up to {offset} bytes but NAXIS1 = {row_bytes}"
            )));
        }
        Ok(TableLayout {
            row_bytes,
            nrows,
            columns,
        })
    }

    /// Step 3 of reading a table: the data the header claims (`NAXIS1` ×
    /// `NAXIS2` bytes) must be in the file, from the reader's position on.
    pub(super) fn check_in_file(&self, rd: &mut FitsReader, hdu: usize) -> Result<(), FitsError> {
        let (row_bytes, nrows) = (self.row_bytes, self.nrows);
        let data_start = rd.pos()?;
        let total = (row_bytes as u64)
            .checked_mul(nrows as u64)
            .ok_or_else(|| {
                rd.bad_header(
                    hdu,
                    format!("table size NAXIS1 = {row_bytes} x NAXIS2 = {nrows} overflows"),
                )
            })?;
        let available = rd.len.saturating_sub(data_start);
        if total > available {
            return Err(FitsError::Truncated {
                path: rd.path.clone(),
                what: format!(
                    "table data of HDU {hdu} (NAXIS2 = {nrows} rows x NAXIS1 = {row_bytes} bytes)"
                ),
                offset: data_start,
                expected: total,
                available,
            });
        }
        Ok(())
    }

    /// Step 4 of reading a table: reads all rows (in chunks of whole rows,
    /// after [`TableLayout::check_in_file`]) and decodes the numeric
    /// columns `cols`, all with `repeat` elements a row, into one `f64`
    /// vector each (`nrows × repeat` values, `TSCALn`/`TZEROn` applied).
    pub(super) fn read_columns(
        &self,
        rd: &mut FitsReader,
        hdu: usize,
        cols: &[&TableColumn],
        repeat: usize,
    ) -> Result<Vec<Vec<f64>>, FitsError> {
        let (row_bytes, nrows) = (self.row_bytes, self.nrows);
        let nelem = nrows
            .checked_mul(repeat)
            .ok_or_else(|| rd.bad_header(hdu, "row count overflows".into()))?;
        let mut out: Vec<Vec<f64>> = cols.iter().map(|_| vec![0.0; nelem]).collect();
        // Never more than the data (checked against the file) in one buffer.
        let rows_per_chunk = ((4 << 20) / row_bytes.max(1)).max(1).min(nrows);
        let mut buf = vec![0u8; rows_per_chunk * row_bytes];
        let mut row0 = 0usize;
        while row0 < nrows {
            let nr = rows_per_chunk.min(nrows - row0);
            let chunk = &mut buf[..nr * row_bytes];
            rd.read_exact(chunk, &format!("table data of HDU {hdu}"))?;
            let chunk = &buf[..nr * row_bytes];
            for (col, values) in cols.iter().zip(out.iter_mut()) {
                decode_column(
                    chunk,
                    row_bytes,
                    col,
                    &mut values[row0 * repeat..(row0 + nr) * repeat],
                );
            }
            row0 += nr;
        }
        Ok(out)
    }
}

/// Decodes the big-endian values of `col` from whole rows in `chunk` into `out`
/// (`rows × repeat` values), applying TSCAL/TZERO; an integer equal to the
/// column's `TNULLn` is [`UNSEEN`].
fn decode_column(chunk: &[u8], row_bytes: usize, col: &TableColumn, out: &mut [f64]) {
    let size = col.ty.size();
    let (scale, zero) = (col.scale, col.zero);
    let scaled = scale != 1.0 || zero != 0.0;
    let null = col.null;
    out.par_chunks_mut(col.repeat * 4096)
        .enumerate()
        .for_each(|(ci, out)| {
            let row_first = ci * 4096;
            for (k, o) in out.iter_mut().enumerate() {
                let row = row_first + k / col.repeat;
                let e = k % col.repeat;
                let at = row * row_bytes + col.offset + e * size;
                let b = &chunk[at..at + size];
                let int = |i: i64| match null {
                    Some(n) if n == i => None,
                    _ => Some(i as f64),
                };
                let v = match col.ty {
                    ColType::U8 => int(i64::from(b[0])),
                    ColType::I16 => int(i64::from(i16::from_be_bytes([b[0], b[1]]))),
                    ColType::I32 => int(i64::from(i32::from_be_bytes(
                        b.try_into().expect("4 bytes"),
                    ))),
                    ColType::I64 => int(i64::from_be_bytes(b.try_into().expect("8 bytes"))),
                    ColType::F32 => Some(f32::from_be_bytes(b.try_into().expect("4 bytes")) as f64),
                    ColType::F64 => Some(f64::from_be_bytes(b.try_into().expect("8 bytes"))),
                    ColType::Other => unreachable!("non-numeric columns rejected earlier"),
                };
                *o = match v {
                    None => UNSEEN,
                    Some(v) if scaled => zero + scale * v,
                    Some(v) => v,
                };
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
    /// float64 values of one value of a map stored by submaps.
    SubmapsF64(SubmapColumn<'a, f64>),
    /// int64 values of one value of a map stored by submaps.
    SubmapsI64(SubmapColumn<'a, i64>),
}

/// Element types of a map whose values read as `f64` (statistics, plots).
pub trait MapValue: toast_core::Element {
    /// The value as `f64`.
    fn to_f64(self) -> f64;
}

macro_rules! map_value {
    ($($t:ty),*) => {$(
        impl MapValue for $t {
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
        }
    )*};
}
map_value!(f64, f32, i64, i32, u8);

/// One value (`value` of `n_value` per pixel) of a map stored by submaps,
/// read in place as a full-sky column: pixel `p` lies in submap `p /
/// n_pix_submap`, stored at local index `global2local[submap]` or not
/// stored (negative: the pixel reads as zero). A map is written this way
/// without first being expanded to the full sky.
#[derive(Debug, Clone, Copy)]
pub struct SubmapColumn<'a, T> {
    /// The stored submaps, `n_pix_submap × n_value` values each.
    pub data: &'a [T],
    /// Values per pixel.
    pub n_value: usize,
    /// Which value of each pixel this column holds.
    pub value: usize,
    /// Pixels per submap.
    pub n_pix_submap: usize,
    /// Local index of each submap of the sky (negative: not stored).
    pub global2local: &'a [i64],
    /// Pixels of the full sky.
    pub n_pix: usize,
}

impl<T: Copy + Default> SubmapColumn<'_, T> {
    /// Whether the layout is consistent: `value < n_value`, enough submaps
    /// for `n_pix` pixels, and every stored submap inside `data`.
    fn check(&self) -> Result<(), String> {
        let nps = self.n_pix_submap.max(1);
        let need = self.n_pix.div_ceil(nps);
        if self.value >= self.n_value || self.global2local.len() < need {
            return Err(format!(
                "value {} of {} per pixel, {} submaps of {} pixels for {} pixels",
                self.value,
                self.n_value,
                self.global2local.len(),
                self.n_pix_submap,
                self.n_pix
            ));
        }
        let stored = self.data.len() / (nps * self.n_value);
        match self.global2local.iter().find(|&&l| l >= stored as i64) {
            Some(l) => Err(format!("local submap {l}, but {stored} submaps are stored")),
            None => Ok(()),
        }
    }

    /// The value of pixel `p < n_pix` (zero where its submap is not
    /// stored).
    #[inline]
    pub fn get(&self, p: usize) -> T {
        let nps = self.n_pix_submap;
        let loc = self.global2local[p / nps];
        if loc < 0 {
            return T::default();
        }
        self.data[(loc as usize * nps + p % nps) * self.n_value + self.value]
    }
}

impl ColumnSource<'_> {
    pub(super) fn len(&self) -> usize {
        match self {
            ColumnSource::F32(d) => d.len(),
            ColumnSource::F64(d) => d.len(),
            ColumnSource::I32(d) => d.len(),
            ColumnSource::I64(d) => d.len(),
            ColumnSource::SubmapsF64(c) => c.n_pix,
            ColumnSource::SubmapsI64(c) => c.n_pix,
        }
    }

    fn is_float(&self) -> bool {
        matches!(
            self,
            ColumnSource::F32(_) | ColumnSource::F64(_) | ColumnSource::SubmapsF64(_)
        )
    }

    /// The layout of a submap column (see [`SubmapColumn`]).
    fn check_layout(&self) -> Result<(), String> {
        match self {
            ColumnSource::SubmapsF64(c) => c.check(),
            ColumnSource::SubmapsI64(c) => c.check(),
            _ => Ok(()),
        }
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

/// Checks the number of columns of a table to write (1 to 999).
pub(super) fn check_column_count(columns: &[WriteColumn<'_>]) -> Result<(), String> {
    if columns.is_empty() {
        return Err("no columns".into());
    }
    if columns.len() > 999 {
        return Err(format!("{} columns (FITS allows 999)", columns.len()));
    }
    Ok(())
}

/// Checks that every column has `nrows` values and that no float data is
/// to be stored in an integer column.
pub(super) fn check_column_data(columns: &[WriteColumn<'_>], nrows: usize) -> Result<(), String> {
    for c in columns {
        c.data
            .check_layout()
            .map_err(|e| format!("column '{}': {e}", c.name))?;
        if c.data.len() != nrows {
            return Err(format!(
                "column '{}' has {} values, column '{}' has {nrows}",
                c.name,
                c.data.len(),
                columns[0].name
            ));
        }
        if c.data.is_float() && matches!(c.format, ColumnFormat::I32 | ColumnFormat::I64) {
            return Err(format!(
                "column '{}': refusing to store float data as integer TFORM {}",
                c.name,
                c.format.code()
            ));
        }
    }
    Ok(())
}

/// Checks that int64 values to be stored as int32 (`J`) fit.
pub(super) fn check_int_ranges(columns: &[WriteColumn<'_>]) -> Result<(), String> {
    for c in columns {
        if c.format != ColumnFormat::I32 {
            continue;
        }
        let values = match c.data {
            ColumnSource::I64(d) => Values::Slice(d),
            ColumnSource::SubmapsI64(m) => Values::Submaps(m, 0),
            _ => continue,
        };
        let (mut i, mut bad) = (0usize, None);
        values.for_each(c.data.len(), |v| {
            if bad.is_none() && i32::try_from(v).is_err() {
                bad = Some((i, v));
            }
            i += 1;
        });
        if let Some((i, v)) = bad {
            return Err(format!(
                "column '{}': value {v} at pixel {i} does not fit int32 (TFORM J)",
                c.name
            ));
        }
    }
    Ok(())
}

/// Bytes per row of a table of `columns`.
pub(super) fn row_bytes(columns: &[WriteColumn<'_>]) -> usize {
    columns.iter().map(|c| c.format.size()).sum()
}

/// The structural cards of a binary-table extension of `nrows` rows of
/// `columns`: `XTENSION` to `TFIELDS`, then `TTYPEn`, `TFORMn` and (where
/// given) `TUNITn` of each column.
pub(super) fn table_cards(columns: &[WriteColumn<'_>], nrows: usize) -> Vec<HeaderCard> {
    let mut cards = vec![
        HeaderCard::new(
            "XTENSION",
            HeaderValue::Str("BINTABLE".into()),
            Some("binary table extension"),
        ),
        HeaderCard::int("BITPIX", 8, "array data type"),
        HeaderCard::int("NAXIS", 2, "number of array dimensions"),
        HeaderCard::int("NAXIS1", row_bytes(columns) as i64, "length of dimension 1"),
        HeaderCard::int("NAXIS2", nrows as i64, "length of dimension 2"),
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
    cards
}

/// Whether `key` is a column keyword (`TTYPEn`, `TFORMn`, `TUNITn`) of one
/// of `ncols` columns.
pub(super) fn is_column_keyword(key: &str, ncols: usize) -> bool {
    ["TTYPE", "TFORM", "TUNIT"].iter().any(|p| {
        key.strip_prefix(p)
            .is_some_and(|r| r.parse::<usize>().is_ok_and(|n| n >= 1 && n <= ncols))
    })
}

/// Writes the data unit of a table: `nrows` rows of `columns` (validated
/// by the checks above), encoded in parallel chunks, then zeros up to a
/// whole block.
pub(super) fn write_rows(
    w: &mut impl Write,
    columns: &[WriteColumn<'_>],
    nrows: usize,
) -> std::io::Result<()> {
    const ROWS: usize = 1 << 16;
    let row_bytes = row_bytes(columns);
    let mut buf = vec![0u8; ROWS * row_bytes];
    let mut row0 = 0usize;
    while row0 < nrows {
        let nr = ROWS.min(nrows - row0);
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
        w.write_all(chunk)?;
        row0 += nr;
    }
    let data_bytes = nrows * row_bytes;
    let pad = (BLOCK - data_bytes % BLOCK) % BLOCK;
    w.write_all(&vec![0u8; pad])
}

/// Encodes column `c` for rows `first..first + sub.len()/row_bytes` into `sub`
/// at byte offset `off` of each row. Integer ranges were validated before.
///
/// One monomorphic loop per (source type, storage format), reading a
/// submap column submap by submap: no per-value dispatch or division.
fn encode_column(sub: &mut [u8], row_bytes: usize, off: usize, first: usize, c: &WriteColumn<'_>) {
    let rows = Rows {
        sub,
        row_bytes,
        off,
    };
    match c.data {
        ColumnSource::F32(d) => rows.encode(c.format, Values::Slice(&d[first..])),
        ColumnSource::F64(d) => rows.encode(c.format, Values::Slice(&d[first..])),
        ColumnSource::I32(d) => rows.encode(c.format, Values::Slice(&d[first..])),
        ColumnSource::I64(d) => rows.encode(c.format, Values::Slice(&d[first..])),
        ColumnSource::SubmapsF64(m) => rows.encode(c.format, Values::Submaps(m, first)),
        ColumnSource::SubmapsI64(m) => rows.encode(c.format, Values::Submaps(m, first)),
    }
}

/// A source value's big-endian bytes in each storage format (`as`
/// conversions; float → integer columns are refused before encoding, and
/// int64 → int32 ranges checked).
trait Encode: Copy + Default {
    fn e(self) -> [u8; 4];
    fn d(self) -> [u8; 8];
    fn j(self) -> [u8; 4];
    fn k(self) -> [u8; 8];
}

macro_rules! impl_encode {
    ($($t:ty),*) => {$(
        impl Encode for $t {
            #[inline(always)]
            fn e(self) -> [u8; 4] {
                (self as f32).to_be_bytes()
            }
            #[inline(always)]
            fn d(self) -> [u8; 8] {
                (self as f64).to_be_bytes()
            }
            #[inline(always)]
            fn j(self) -> [u8; 4] {
                (self as i32).to_be_bytes()
            }
            #[inline(always)]
            fn k(self) -> [u8; 8] {
                (self as i64).to_be_bytes()
            }
        }
    )*};
}
impl_encode!(f32, f64, i32, i64);

/// The values of consecutive rows of one column, from the first row of a
/// chunk on.
enum Values<'a, T> {
    /// A full-sky slice starting at the chunk's first row.
    Slice(&'a [T]),
    /// A submap column and the chunk's first row (pixel).
    Submaps(SubmapColumn<'a, T>, usize),
}

impl<T: Copy + Default> Values<'_, T> {
    /// Calls `f` with the values of the first `n` rows, in order.
    #[inline(always)]
    fn for_each(&self, n: usize, mut f: impl FnMut(T)) {
        match self {
            Values::Slice(d) => d[..n].iter().for_each(|&v| f(v)),
            Values::Submaps(m, first) => {
                let nps = m.n_pix_submap.max(1);
                let (mut p, end) = (*first, first + n);
                while p < end {
                    let stop = end.min((p / nps + 1) * nps);
                    let loc = m.global2local[p / nps];
                    if loc < 0 {
                        (p..stop).for_each(|_| f(T::default()));
                    } else {
                        let at = (loc as usize * nps + p % nps) * m.n_value + m.value;
                        m.data[at..]
                            .iter()
                            .step_by(m.n_value)
                            .take(stop - p)
                            .for_each(|&v| f(v));
                    }
                    p = stop;
                }
            }
        }
    }
}

/// The rows of a chunk being encoded, one column at byte offset `off`.
struct Rows<'a> {
    sub: &'a mut [u8],
    row_bytes: usize,
    off: usize,
}

impl Rows<'_> {
    /// Stores `values` (one per row) in `format`.
    fn encode<T: Encode>(self, format: ColumnFormat, values: Values<'_, T>) {
        match format {
            ColumnFormat::F32 => self.fill(&values, T::e),
            ColumnFormat::F64 => self.fill(&values, T::d),
            ColumnFormat::I32 => self.fill(&values, T::j),
            ColumnFormat::I64 => self.fill(&values, T::k),
        }
    }

    #[inline(always)]
    fn fill<T: Encode, const N: usize>(self, values: &Values<'_, T>, enc: impl Fn(T) -> [u8; N]) {
        let (off, n) = (self.off, self.sub.len() / self.row_bytes);
        let mut rows = self.sub.chunks_exact_mut(self.row_bytes);
        values.for_each(n, |v| {
            if let Some(row) = rows.next() {
                row[off..off + N].copy_from_slice(&enc(v));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tform_parsing() {
        assert_eq!(parse_tform("E").unwrap(), (ColType::F32, 1, 4));
        assert_eq!(parse_tform("1024E").unwrap(), (ColType::F32, 1024, 4096));
        assert_eq!(parse_tform("K").unwrap(), (ColType::I64, 1, 8));
        assert_eq!(parse_tform("2I").unwrap(), (ColType::I16, 2, 4));
        assert_eq!(parse_tform("16X").unwrap(), (ColType::Other, 16, 2));
        assert!(parse_tform("1Z").is_err());
        assert!(parse_tform("").is_err());
        assert!(parse_tform(&format!("{}D", usize::MAX / 4)).is_err());
    }
}
