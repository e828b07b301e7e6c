//! HEALPix maps in FITS: what makes a binary table a HEALPix map
//! (`PIXTYPE`, `ORDERING`, `NSIDE`, `INDXSCHM`/`OBJECT`, the `PIXEL` column
//! of partial-sky files, map columns with their units), [`read_healpix_map`]
//! as a sequence of small steps, and the writers ([`write_healpix_map`],
//! [`write_iqu_map`], [`write_hits_map`], with TOAST's
//! [`toast_extra_header`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::bintable::{
    self, ColType, ColumnFormat, ColumnSource, TableColumn, TableLayout, WriteColumn,
};
use super::header::{encode_header, primary_cards, FitsReader, Header, HeaderCard, HeaderValue};
use super::FitsError;
use crate::math::healpix::{self, Healpix};

/// The HEALPix "unseen" sentinel value used for missing pixels.
pub const UNSEEN: f64 = -1.6375e30;

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

// =====================================================================
// Reading
// =====================================================================

/// Reads a HEALPix map from the first binary-table extension of `path`.
///
/// `fields` selects map columns by 0-based index among the map columns (the
/// `PIXEL` column of partial-sky files is not counted), like healpy's
/// `field=`; `None` reads all of them. Returns the maps in NEST order, as
/// `f64`, whatever the file's ordering and column types.
///
/// The steps: find the table (`FitsReader::find_bintable`), parse its
/// layout (`TableLayout::parse`), interpret its header as a HEALPix map
/// (keywords, map columns, resolution against the row count), check the
/// table's size against the file (`TableLayout::check_in_file`), decode
/// the columns (`TableLayout::read_columns`), then place partial-sky
/// values on the full sky and reorder to NEST.
pub fn read_healpix_map(path: &Path, fields: Option<&[usize]>) -> Result<HealpixMap, FitsError> {
    let MapFile {
        mut rd,
        at,
        header,
        layout,
        keys,
        nside,
        npix,
    } = MapFile::open(path, fields)?;
    let cols = MapColumns::select(&layout.columns, keys.partial, fields, at)?;
    let mut values = layout.read_columns(&mut rd, at.hdu, &cols.to_read(), cols.repeat)?;
    let values = match cols.pixel {
        Some(_) => {
            let pixels = values.pop().expect("the PIXEL column is read last");
            scatter_partial(values, &pixels, npix, nside, at)?
        }
        None => values,
    };
    let fields = cols
        .selected
        .iter()
        .zip(values)
        .map(|(c, data)| MapField {
            name: c.name.clone(),
            unit: c.unit.clone(),
            data: to_nest(data, keys.ordering),
        })
        .collect();
    Ok(HealpixMap {
        nside,
        file_ordering: keys.ordering,
        partial: keys.partial,
        fields,
        header,
    })
}

/// The resolution of a HEALPix map file, after every check of
/// [`read_healpix_map`] short of reading the data: the header, the
/// columns, `NSIDE` against the row count, the data's size against the
/// file.
pub fn read_healpix_nside(path: &Path) -> Result<u64, FitsError> {
    Ok(read_healpix_header(path)?.nside)
}

/// What the header of a HEALPix map file says (see [`read_healpix_header`]).
#[derive(Debug, Clone)]
pub struct HealpixHeader {
    /// Resolution.
    pub nside: u64,
    /// Whether the file uses explicit (partial-sky) indexing: its map
    /// columns then follow the `PIXEL` column.
    pub partial: bool,
    /// The map columns (`PIXEL` excluded): name (`TTYPEn`) and unit
    /// (`TUNITn`), in file order.
    pub columns: Vec<(String, Option<String>)>,
}

/// The header of a HEALPix map file, after every check of
/// [`read_healpix_nside`]: resolution, indexing, and the map columns with
/// their units, so that a reader can refuse a file before reading its data.
pub fn read_healpix_header(path: &Path) -> Result<HealpixHeader, FitsError> {
    let m = MapFile::open(path, None)?;
    let cols = MapColumns::select(&m.layout.columns, m.keys.partial, None, m.at)?;
    Ok(HealpixHeader {
        nside: m.nside,
        partial: m.keys.partial,
        columns: cols
            .selected
            .iter()
            .map(|c| (c.name.clone(), c.unit.clone()))
            .collect(),
    })
}

/// A map file checked up to its data (see [`read_healpix_nside`]), the
/// reader at the start of the table's data.
struct MapFile<'a> {
    rd: FitsReader,
    at: At<'a>,
    header: Header,
    layout: TableLayout,
    keys: HealpixKeywords,
    nside: u64,
    npix: usize,
}

impl<'a> MapFile<'a> {
    fn open(path: &'a Path, fields: Option<&[usize]>) -> Result<Self, FitsError> {
        let mut rd = FitsReader::open(path)?;
        let (hdu, header) = rd.find_bintable()?;
        let layout = TableLayout::parse(&header, path, hdu)?;
        let at = At { path, hdu };
        let keys = HealpixKeywords::parse(&header, at)?;
        let repeat = MapColumns::select(&layout.columns, keys.partial, fields, at)?.repeat;
        let nelem = layout
            .nrows
            .checked_mul(repeat)
            .ok_or_else(|| at.bad_header("row count overflows".into()))?;
        let (nside, npix) = keys.resolution(nelem, layout.nrows, repeat, at)?;
        layout.check_in_file(&mut rd, hdu)?;
        Ok(MapFile {
            rd,
            at,
            header,
            layout,
            keys,
            nside,
            npix,
        })
    }
}

/// Where a read is (the file and the table's HDU), for its errors.
#[derive(Debug, Clone, Copy)]
struct At<'a> {
    path: &'a Path,
    hdu: usize,
}

impl At<'_> {
    fn not_healpix(self, reason: String) -> FitsError {
        FitsError::NotHealpix {
            path: self.path.to_path_buf(),
            hdu: self.hdu,
            reason,
        }
    }

    fn bad_header(self, reason: String) -> FitsError {
        FitsError::BadHeader {
            path: self.path.to_path_buf(),
            hdu: self.hdu,
            reason,
        }
    }

    fn row_count(self, reason: String) -> FitsError {
        FitsError::RowCount {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    fn bad_nside(self, value: String, reason: &str) -> FitsError {
        FitsError::BadNside {
            path: self.path.to_path_buf(),
            value,
            reason: reason.into(),
        }
    }
}

/// The HEALPix keywords of a table header.
#[derive(Debug, Clone)]
struct HealpixKeywords {
    /// `ORDERING` (`NESTED`/`NEST` or `RING`).
    ordering: Ordering,
    /// Explicit indexing: `INDXSCHM = 'EXPLICIT'` or `OBJECT = 'PARTIAL'`.
    partial: bool,
    /// `NSIDE` as written, checked by [`HealpixKeywords::resolution`].
    nside: Option<HeaderValue>,
    /// `FIRSTPIX` and `LASTPIX` as written, where present: a full-sky map
    /// holds pixels 0 to `npix - 1` ([`HealpixKeywords::resolution`]).
    pixel_range: (Option<HeaderValue>, Option<HeaderValue>),
}

impl HealpixKeywords {
    /// `PIXTYPE` must be `HEALPIX` and `ORDERING` a known scheme.
    fn parse(header: &Header, at: At<'_>) -> Result<Self, FitsError> {
        match header.get_str("PIXTYPE") {
            Some(s) if s.eq_ignore_ascii_case("HEALPIX") => {}
            Some(s) => return Err(at.not_healpix(format!("PIXTYPE = '{s}', expected 'HEALPIX'"))),
            None => return Err(at.not_healpix("missing keyword PIXTYPE".into())),
        }
        let ordering = match header.get_str("ORDERING").map(|s| s.to_ascii_uppercase()) {
            Some(s) if s == "NESTED" || s == "NEST" => Ordering::Nested,
            Some(s) if s == "RING" => Ordering::Ring,
            Some(s) => {
                return Err(at.not_healpix(format!("ORDERING = '{s}', expected 'NESTED' or 'RING'")))
            }
            None => return Err(at.not_healpix("missing keyword ORDERING".into())),
        };
        let partial = header
            .get_str("INDXSCHM")
            .is_some_and(|s| s.eq_ignore_ascii_case("EXPLICIT"))
            || header
                .get_str("OBJECT")
                .is_some_and(|s| s.eq_ignore_ascii_case("PARTIAL"));
        Ok(HealpixKeywords {
            ordering,
            partial,
            nside: header.get("NSIDE").cloned(),
            pixel_range: (
                header.get("FIRSTPIX").cloned(),
                header.get("LASTPIX").cloned(),
            ),
        })
    }

    /// The resolution `(nside, npix)`: from `NSIDE` if present (it must be
    /// valid), else from the element count `nelem` (`nrows × repeat`),
    /// which must then be all pixels of a full-sky map, or at most all of a
    /// partial one.
    fn resolution(
        &self,
        nelem: usize,
        nrows: usize,
        repeat: usize,
        at: At<'_>,
    ) -> Result<(u64, usize), FitsError> {
        let nside = match &self.nside {
            Some(v) => {
                let n = v
                    .as_int()
                    .ok_or_else(|| at.bad_nside(v.display(), "not an integer"))?;
                if healpix::Nside::try_from(n).is_err() {
                    return Err(at.bad_nside(
                        n.to_string(),
                        "must be a power of two between 1 and 2^29",
                    ));
                }
                n as u64
            }
            None if self.partial => {
                return Err(at.not_healpix("partial-sky map without NSIDE keyword".into()))
            }
            None => healpix::npix2nside(nelem as u64).map_err(|_| {
                at.row_count(format!(
                    "no NSIDE keyword and {nelem} pixels ({nrows} rows x {repeat}) is not 12*nside^2"
                ))
            })?,
        };
        let npix = Healpix::new(nside).expect("nside validated").npix() as usize;
        if !self.partial && nelem != npix {
            return Err(at.row_count(format!(
                "NSIDE = {nside} needs {npix} pixels but the table has {nrows} rows x {repeat} = {nelem}"
            )));
        }
        if !self.partial {
            let (first, last) = &self.pixel_range;
            for (key, value, want) in [("FIRSTPIX", first, 0), ("LASTPIX", last, npix as i64 - 1)] {
                if let Some(v) = value.as_ref().filter(|v| v.as_int() != Some(want)) {
                    return Err(at.not_healpix(format!(
                        "{key} = {} but a full-sky map of NSIDE = {nside} holds pixels 0 to {}",
                        v.display(),
                        npix - 1
                    )));
                }
            }
        }
        if self.partial && nelem > npix {
            return Err(at.row_count(format!(
                "partial map has {nelem} entries, more than the {npix} pixels of NSIDE = {nside}"
            )));
        }
        Ok((nside, npix))
    }
}

/// The columns a read decodes: the requested map columns and, in a
/// partial-sky file, the `PIXEL` column; all numeric, all with `repeat`
/// elements a row.
#[derive(Debug)]
struct MapColumns<'a> {
    pixel: Option<&'a TableColumn>,
    selected: Vec<&'a TableColumn>,
    repeat: usize,
}

impl<'a> MapColumns<'a> {
    /// The map columns are all columns but the leading `PIXEL` of a
    /// partial-sky table; `fields` picks among them (`None`: all).
    fn select(
        columns: &'a [TableColumn],
        partial: bool,
        fields: Option<&[usize]>,
        at: At<'_>,
    ) -> Result<Self, FitsError> {
        let (pixel, map_cols) = if partial {
            let first = columns.first().ok_or_else(|| {
                at.not_healpix("explicit-indexing (partial-sky) table has no columns".into())
            })?;
            if !first.name.eq_ignore_ascii_case("PIXEL") {
                return Err(at.not_healpix(format!(
                    "explicit-indexing (partial-sky) table: first column is '{}', expected 'PIXEL'",
                    first.name
                )));
            }
            (Some(first), &columns[1..])
        } else {
            (None, columns)
        };
        if map_cols.is_empty() {
            return Err(at.not_healpix("table has no map columns".into()));
        }
        let selected: Vec<&TableColumn> = match fields {
            None => map_cols.iter().collect(),
            Some(idx) => idx
                .iter()
                .map(|&i| {
                    map_cols.get(i).ok_or_else(|| {
                        at.not_healpix(format!(
                            "field {i} requested but the table has {} map column(s)",
                            map_cols.len()
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        if selected.is_empty() {
            return Err(at.not_healpix("no fields requested".into()));
        }
        for c in selected.iter().chain(pixel.iter()) {
            if c.ty == ColType::Other {
                return Err(c.unsupported(
                    at.path,
                    "only numeric columns (B, I, J, K, E, D) can hold map values".into(),
                ));
            }
        }
        let repeat = selected[0].repeat;
        if let Some(c) = selected
            .iter()
            .chain(pixel.iter())
            .find(|c| c.repeat != repeat)
        {
            return Err(c.unsupported(
                at.path,
                format!(
                    "repeat count {} differs from {} of column '{}'",
                    c.repeat, repeat, selected[0].name
                ),
            ));
        }
        Ok(MapColumns {
            pixel,
            selected,
            repeat,
        })
    }

    /// The columns to decode: the selected ones, then `PIXEL` if any.
    fn to_read(&self) -> Vec<&'a TableColumn> {
        self.selected.iter().copied().chain(self.pixel).collect()
    }
}

/// Places the values of a partial-sky file at their `PIXEL` indices on a
/// full sky of `npix` pixels (the file's ordering), [`UNSEEN`] elsewhere.
fn scatter_partial(
    values: Vec<Vec<f64>>,
    pixels: &[f64],
    npix: usize,
    nside: u64,
    at: At<'_>,
) -> Result<Vec<Vec<f64>>, FitsError> {
    for (k, &pix) in pixels.iter().enumerate() {
        if pix == UNSEEN {
            return Err(at.not_healpix(format!(
                "PIXEL entry {k} is undefined (the column's TNULLn value)"
            )));
        }
        if !(pix >= 0.0 && pix < npix as f64 && pix.fract() == 0.0) {
            return Err(at.not_healpix(format!(
                "PIXEL entry {k} = {pix} is not a pixel index of NSIDE = {nside}"
            )));
        }
    }
    // The full sky is the file's claim (a few entries may claim NSIDE
    // 2^29): checked against the memory available before it is made.
    let bytes = (npix as u64)
        .saturating_mul(8)
        .saturating_mul(values.len() as u64);
    let too_large = |available: Option<u64>| FitsError::TooLarge {
        path: at.path.to_path_buf(),
        what: format!(
            "the full sky of {} field(s) at NSIDE = {nside} ({npix} pixels)",
            values.len()
        ),
        bytes,
        available,
    };
    if let Some(available) = crate::sysinfo::memory_bound() {
        if bytes as f64 > available.bytes {
            return Err(too_large(Some(available.bytes as u64)));
        }
    }
    // A pixel given twice would keep one of its values without a word:
    // one bit a pixel (a sixty-fourth of a map, within the check above).
    let mut seen: Vec<u64> = Vec::new();
    seen.try_reserve_exact(npix.div_ceil(64))
        .map_err(|_| too_large(None))?;
    seen.resize(npix.div_ceil(64), 0);
    for (k, &pix) in pixels.iter().enumerate() {
        let p = pix as usize;
        let (word, bit) = (p / 64, 1u64 << (p % 64));
        if seen[word] & bit != 0 {
            return Err(at.not_healpix(format!(
                "PIXEL entry {k} = {pix} repeats an earlier entry (each pixel at most once)"
            )));
        }
        seen[word] |= bit;
    }
    drop(seen);
    let mut maps = Vec::with_capacity(values.len());
    for vals in &values {
        let mut m = Vec::new();
        m.try_reserve_exact(npix).map_err(|_| too_large(None))?;
        m.resize(npix, UNSEEN);
        for (&pix, &v) in pixels.iter().zip(vals.iter()) {
            m[pix as usize] = v;
        }
        maps.push(m);
    }
    Ok(maps)
}

/// A full-sky map in `ordering`, in NEST order.
fn to_nest(data: Vec<f64>, ordering: Ordering) -> Vec<f64> {
    match ordering {
        Ordering::Nested => data,
        Ordering::Ring => {
            healpix::ring_to_nest(&data).expect("length is 12 nside^2 by construction")
        }
    }
}

// =====================================================================
// Writing
// =====================================================================

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
    bintable::check_column_count(columns).map_err(invalid)?;
    let npix = columns[0].data.len();
    let nside = healpix::npix2nside(npix as u64).map_err(|e| invalid(e.to_string()))?;
    bintable::check_column_data(columns, npix).map_err(invalid)?;

    let mut cards = bintable::table_cards(columns, npix);
    cards.extend(healpix_cards(ordering, nside, npix));
    add_extra_cards(&mut cards, extra, columns.len()).map_err(invalid)?;
    let header = encode_header(&cards).map_err(invalid)?;
    let primary = encode_header(&primary_cards()).map_err(invalid)?;
    // Validate integer ranges before touching the file.
    bintable::check_int_ranges(columns).map_err(invalid)?;

    let file = File::create(path).map_err(|source| FitsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let io = |source| FitsError::Io {
        path: path.to_path_buf(),
        source,
    };
    // The disk writes as the rows are encoded (the run syncs its outputs).
    let mut w = BufWriter::with_capacity(1 << 20, toast_core::mem::WriteBehind::new(file));
    w.write_all(&primary).map_err(io)?;
    w.write_all(&header).map_err(io)?;
    bintable::write_rows(&mut w, columns, npix).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(())
}

/// The HEALPix keywords of a full-sky map, in healpy's order.
fn healpix_cards(ordering: Ordering, nside: u64, npix: usize) -> [HeaderCard; 8] {
    [
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
    ]
}

/// Adds the caller's `extra` cards to `cards`: a card whose keyword is
/// already there (e.g. `EXTNAME`) replaces it, as healpy's `extra_header`
/// does; structural, column and HEALPix keywords and repeated keywords are
/// refused.
fn add_extra_cards(
    cards: &mut Vec<HeaderCard>,
    extra: &[HeaderCard],
    ncols: usize,
) -> Result<(), String> {
    let reserved = [
        "XTENSION", "BITPIX", "NAXIS", "NAXIS1", "NAXIS2", "PCOUNT", "GCOUNT", "TFIELDS",
        "PIXTYPE", "ORDERING", "NSIDE", "FIRSTPIX", "LASTPIX", "INDXSCHM", "OBJECT", "END",
    ];
    for c in extra {
        if reserved.contains(&c.key.as_str()) || bintable::is_column_keyword(&c.key, ncols) {
            return Err(format!(
                "extra header keyword {} is set by the writer",
                c.key
            ));
        }
        if extra.iter().filter(|o| o.key == c.key).count() > 1 {
            return Err(format!(
                "extra header keyword {} given more than once",
                c.key
            ));
        }
        if let Some(existing) = cards.iter_mut().find(|o| o.key == c.key) {
            *existing = c.clone();
        } else {
            cards.push(c.clone());
        }
    }
    Ok(())
}

/// Writes full-sky float maps the way TOAST's `PixelData.write` does
/// (`healpy.write_map` with its default column names): one map is column
/// `T` (healpy indexes its one-map name, the string `"TEMPERATURE"`), three
/// are `TEMPERATURE`, `Q_POLARISATION`, `U_POLARISATION`, six (a packed
/// I/Q/U covariance) `II`, `IQ`, `IU`, `QQ`, `QU`, `UU`, any other number
/// `COLUMN_1`, ...; each column with unit `unit` (none for `None`), as
/// float32 (`E`) or float64 (`D`).
pub fn write_float_maps(
    path: &Path,
    ordering: Ordering,
    maps: &[&[f64]],
    unit: Option<&str>,
    precision: MapPrecision,
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    let sources: Vec<ColumnSource<'_>> = maps.iter().map(|m| ColumnSource::F64(m)).collect();
    write_float_columns(path, ordering, &sources, unit, precision, extra)
}

/// [`write_float_maps`] from any column sources, e.g. the values of a map
/// stored by submaps ([`ColumnSource::SubmapsF64`]), written without a
/// full-sky copy.
pub fn write_float_columns(
    path: &Path,
    ordering: Ordering,
    maps: &[ColumnSource<'_>],
    unit: Option<&str>,
    precision: MapPrecision,
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    let format = match precision {
        MapPrecision::F32 => ColumnFormat::F32,
        MapPrecision::F64 => ColumnFormat::F64,
    };
    let names: Vec<String> = match maps.len() {
        1 => vec!["T".into()],
        3 => ["TEMPERATURE", "Q_POLARISATION", "U_POLARISATION"]
            .map(String::from)
            .to_vec(),
        6 => ["II", "IQ", "IU", "QQ", "QU", "UU"]
            .map(String::from)
            .to_vec(),
        n => (1..=n).map(|i| format!("COLUMN_{i}")).collect(),
    };
    let cols: Vec<WriteColumn<'_>> = names
        .iter()
        .zip(maps)
        .map(|(name, data)| WriteColumn {
            name,
            unit,
            format,
            data: *data,
        })
        .collect();
    write_healpix_map(path, ordering, &cols, extra)
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
    write_float_maps(path, ordering, &maps, Some(unit), precision, extra)
}

/// Writes a hit-count map the way TOAST's MapMaker does: one int32 (`J`)
/// column named `T`, no unit. Counts above `i32::MAX` are an error.
pub fn write_hits_map(
    path: &Path,
    ordering: Ordering,
    hits: &[i64],
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    write_hits_column(path, ordering, ColumnSource::I64(hits), extra)
}

/// [`write_hits_map`] from any column source, e.g. a hit map stored by
/// submaps ([`ColumnSource::SubmapsI64`]), written without a full-sky copy.
pub fn write_hits_column(
    path: &Path,
    ordering: Ordering,
    hits: ColumnSource<'_>,
    extra: &[HeaderCard],
) -> Result<(), FitsError> {
    write_healpix_map(
        path,
        ordering,
        &[WriteColumn {
            name: "T",
            unit: None,
            format: ColumnFormat::I32,
            data: hits,
        }],
        extra,
    )
}
