//! Loading a reference case: the `.npz` file, its typed arrays, and the
//! fields each kernel needs.
//!
//! [`load_case`] identifies the kernel from the file name ([`kernel_of`]),
//! reads every array of the file whatever its dtype, then hands them to the
//! kernel's case type (`PointingDetectorCase::load`, ...), which takes out
//! the fields it needs with their dtype, number of dimensions and lengths
//! checked. Any problem is a [`CaseError`] naming the file and the field.

use super::CaseData;
use crate::abi::{Kernel, SampleRange};
use ndarray::ArrayD;
use ndarray_npy::npy::header::Header;
use ndarray_npy::{ReadNpyError, ReadNpyExt};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The most bytes the arrays of one case file may hold together, as the zip
/// directory declares them and as read (the shipped cases hold under 1 MiB
/// each). Nothing is allocated for an entry over it.
pub const MAX_CASE_BYTES: u64 = 1 << 30;

/// The bytes a case file may hold beyond [`MAX_CASE_BYTES`]: its zip
/// headers and directory and the `.npy` headers (a few hundred bytes an
/// array).
pub const CASE_FILE_SLACK_BYTES: u64 = 16 << 20;

/// A case file that cannot be used.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum CaseError {
    #[error("{file}: cannot read the case: {reason}")]
    Read { file: PathBuf, reason: String },
    #[error("{file}: the file name does not start with the name of a known kernel")]
    UnknownKernel { file: PathBuf },
    #[error("{file}: field `{field}`: {problem}")]
    Field {
        file: PathBuf,
        field: String,
        problem: String,
    },
    /// An array whose `.npy` header claims more (or fewer) data bytes than
    /// its zip entry holds: refused before anything is allocated for it.
    #[error(
        "{file}: array `{field}`: the .npy header claims shape {shape:?} of {dtype} = {}, but the zip entry holds {actual} bytes of data",
        claimed_text(.claimed)
    )]
    ClaimedSize {
        file: PathBuf,
        field: String,
        shape: Vec<usize>,
        dtype: String,
        /// The bytes the header's shape × element size makes (`None`: more
        /// than `u64` holds).
        claimed: Option<u64>,
        /// The data bytes actually in the entry (after the header).
        actual: u64,
    },
    /// The case's reading, running or comparison panicked (a bug in an
    /// adapter or the host): the message, caught so that the other cases
    /// still run.
    #[error("{file}: the case panicked: {message}")]
    Panicked { file: PathBuf, message: String },
    /// A case file larger than [`MAX_CASE_BYTES`] and room for its zip
    /// headers ([`CASE_FILE_SLACK_BYTES`]): refused before the zip reader
    /// looks for its directory, which it searches for through the whole
    /// of a file that has none (minutes for a 100 GB file).
    #[error(
        "{file}: the file holds {bytes} bytes, over the {limit} bytes a case file may hold in all (its arrays and the zip's headers)"
    )]
    FileTooLarge {
        file: PathBuf,
        bytes: u64,
        limit: u64,
    },
    /// An array whose zip entry is larger than what is left of
    /// [`MAX_CASE_BYTES`] for the case: refused before it is read.
    #[error(
        "{file}: array `{field}`: the zip directory says {bytes} bytes, over the {limit} bytes a case file may hold in all"
    )]
    TooLarge {
        file: PathBuf,
        field: String,
        bytes: u64,
        limit: u64,
    },
}

fn claimed_text(claimed: &Option<u64>) -> String {
    match claimed {
        Some(b) => format!("{b} bytes"),
        None => "more bytes than a u64 counts".to_string(),
    }
}

/// A numeric array read from a case: row-major data and its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Arr<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

/// One reference case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub path: PathBuf,
    /// The file name without `.npz`.
    pub name: String,
    pub kernel: Kernel,
    pub data: CaseData,
}

/// The kernel whose name is the longest prefix of `stem`, followed by `_` or
/// nothing (`stokes_weights_IQU_x` is IQU, not I).
pub fn kernel_of(stem: &str) -> Option<Kernel> {
    Kernel::ALL
        .into_iter()
        .filter(|k| {
            let n = k.name();
            // `get`: a name whose bytes at the kernel name's length are
            // inside a character (`noise_weight_é`) is not that kernel's.
            stem.get(..n.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(n))
                && (stem.len() == n.len() || stem.as_bytes()[n.len()] == b'_')
        })
        .max_by_key(|k| k.name().len())
}

/// Read and check a case file.
pub fn load_case(path: &Path) -> Result<Case, CaseError> {
    let file = path.to_path_buf();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = name.strip_suffix(".npz").unwrap_or(&name).to_string();
    let kernel = kernel_of(&name).ok_or_else(|| CaseError::UnknownKernel { file: file.clone() })?;
    let map = read_fields(path, MAX_CASE_BYTES)?;
    let mut fl = Fields {
        file: file.clone(),
        map,
    };
    let data = CaseData::load(kernel, &mut fl)?;
    Ok(Case {
        path: file,
        name,
        kernel,
        data,
    })
}

// ---------------------------------------------------------------------------
// Reading the arrays of a file
// ---------------------------------------------------------------------------

/// One field of a case file, with whichever dtype it has.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    F64(Arr<f64>),
    F32(Arr<f32>),
    I64(Arr<i64>),
    I32(Arr<i32>),
    U8(Arr<u8>),
}

impl Field {
    fn dtype(&self) -> &'static str {
        match self {
            Field::F64(_) => "float64",
            Field::F32(_) => "float32",
            Field::I64(_) => "int64",
            Field::I32(_) => "int32",
            Field::U8(_) => "uint8",
        }
    }
}

/// Element types a case field may have.
trait CaseElem: Sized + Clone {
    const DTYPE: &'static str;
    fn take(f: Field) -> Result<Arr<Self>, Field>;
}

macro_rules! case_elem {
    ($t:ty, $v:ident, $name:literal) => {
        impl CaseElem for $t {
            const DTYPE: &'static str = $name;
            fn take(f: Field) -> Result<Arr<Self>, Field> {
                match f {
                    Field::$v(a) => Ok(a),
                    other => Err(other),
                }
            }
        }
    };
}
case_elem!(f64, F64, "float64");
case_elem!(f32, F32, "float32");
case_elem!(i64, I64, "int64");
case_elem!(i32, I32, "int32");
case_elem!(u8, U8, "uint8");

fn to_arr<T: Clone>(a: ArrayD<T>) -> Arr<T> {
    Arr {
        shape: a.shape().to_vec(),
        // Logical (row-major) order whatever the file's memory order.
        data: a.iter().cloned().collect(),
    }
}

/// Read every array of the npz file at `path` whatever its dtype, the arrays
/// together holding at most `cap` bytes.
///
/// Nothing is allocated from a size the file claims: each zip entry is read
/// to its end (at most its size in the zip directory, which must fit in
/// what is left of `cap`), and its `.npy` header's shape × element size must
/// be exactly the data bytes read before an array is made from it.
fn read_fields(path: &Path, cap: u64) -> Result<BTreeMap<String, Field>, CaseError> {
    let file = path.to_path_buf();
    let read = |e: &dyn fmt::Display| CaseError::Read {
        file: file.clone(),
        reason: e.to_string(),
    };
    let f = toast_core::input::open_regular(path).map_err(|e| read(&e))?;
    let bytes = f.metadata().map_err(|e| read(&e))?.len();
    let limit = cap.saturating_add(CASE_FILE_SLACK_BYTES);
    if bytes > limit {
        return Err(CaseError::FileTooLarge { file, bytes, limit });
    }
    let mut zip = zip::ZipArchive::new(BufReader::new(f))
        .map_err(|e| read(&format!("not a readable zip archive: {e}")))?;
    let mut map = BTreeMap::new();
    let mut left = cap;
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| read(&format!("zip entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let name = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        let problem = |p: String| CaseError::Field {
            file: file.clone(),
            field: name.clone(),
            problem: p,
        };
        let size = entry.size();
        if size > left {
            return Err(CaseError::TooLarge {
                file: file.clone(),
                field: name,
                bytes: size,
                limit: cap,
            });
        }
        // Grows with the bytes actually there; one byte more than the
        // directory says is read to tell a longer entry.
        let mut bytes = Vec::new();
        (&mut entry)
            .take(size + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| problem(format!("cannot read the zip entry: {e}")))?;
        if bytes.len() as u64 != size {
            return Err(problem(format!(
                "the zip entry holds {} bytes, the zip directory says {size} (truncated or corrupt)",
                bytes.len()
            )));
        }
        left -= size;
        npy_preamble_fits(&bytes).map_err(|p| problem(format!("bad .npy header: {p}")))?;
        let mut data = &bytes[..];
        let header =
            Header::from_reader(&mut data).map_err(|e| problem(format!("bad .npy header: {e}")))?;
        let descr = header.type_descriptor.as_string();
        let dtype = descr.map_or_else(|| header.type_descriptor.to_string(), |d| d.clone());
        let elem = descr
            .and_then(|d| elem_size(d))
            .ok_or_else(|| problem(format!("unsupported dtype {dtype}")))?;
        let claimed = header
            .shape
            .iter()
            .try_fold(elem, |n, &d| n.checked_mul(d as u64));
        let actual = data.len() as u64;
        if claimed != Some(actual) {
            return Err(CaseError::ClaimedSize {
                file: file.clone(),
                field: name,
                shape: header.shape,
                dtype,
                claimed,
                actual,
            });
        }
        let field = read_field(&bytes).map_err(|e| problem(e.to_string()))?;
        map.insert(name, field);
    }
    Ok(map)
}

/// Check the fixed preamble of a `.npy` (magic, version, header length)
/// and that the header it announces lies within `bytes`, before the
/// header reader allocates a buffer of the announced length (a version
/// byte changed from 1 to 2 makes the length a u32 read from the header's
/// first characters: hundreds of MB asked for by a 100-byte entry).
fn npy_preamble_fits(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\x93NUMPY";
    if bytes.len() < MAGIC.len() + 2 || &bytes[..MAGIC.len()] != MAGIC {
        return Err("no .npy magic string".into());
    }
    let major = bytes[MAGIC.len()];
    let (start, len) = match major {
        1 => (
            10usize,
            bytes
                .get(8..10)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as u64),
        ),
        2 | 3 => (
            12usize,
            bytes
                .get(8..12)
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        ),
        v => return Err(format!("format version {v} is not 1, 2 or 3")),
    };
    let len = len.ok_or("the preamble is cut")?;
    let room = (bytes.len() - start.min(bytes.len())) as u64;
    if len > room {
        return Err(format!(
            "the header claims {len} bytes, the entry holds {room} after the preamble"
        ));
    }
    Ok(())
}

/// The size in bytes of one element of a simple numpy dtype descriptor
/// (`<f8`, `|u1`, `i4`, ...): the digits after the kind letter.
fn elem_size(descr: &str) -> Option<u64> {
    let d = descr.strip_prefix(['<', '>', '|', '=']).unwrap_or(descr);
    let mut chars = d.chars();
    if !chars.next()?.is_ascii_alphabetic() {
        return None;
    }
    let digits = chars.as_str();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&n| n > 0)
}

/// Read one `.npy` (whose header has been checked against its length)
/// whatever its dtype.
fn read_field(bytes: &[u8]) -> Result<Field, ReadNpyError> {
    macro_rules! attempt {
        ($t:ty, $v:ident) => {
            match ArrayD::<$t>::read_npy(bytes) {
                Ok(a) => return Ok(Field::$v(to_arr(a))),
                Err(ReadNpyError::WrongDescriptor(_)) => {}
                Err(e) => return Err(e),
            }
        };
    }
    attempt!(f64, F64);
    attempt!(f32, F32);
    attempt!(i64, I64);
    attempt!(i32, I32);
    Ok(Field::U8(to_arr(ArrayD::<u8>::read_npy(bytes)?)))
}

/// The fields of a case file, taken out one by one with checks.
pub(super) struct Fields {
    file: PathBuf,
    map: BTreeMap<String, Field>,
}

impl Fields {
    fn err(&self, field: &str, problem: impl Into<String>) -> CaseError {
        CaseError::Field {
            file: self.file.clone(),
            field: field.to_string(),
            problem: problem.into(),
        }
    }

    /// Field `name` with element type `T` and `ndim` dimensions (any if None).
    fn arr<T: CaseElem>(&mut self, name: &str, ndim: Option<usize>) -> Result<Arr<T>, CaseError> {
        let f = self
            .map
            .remove(name)
            .ok_or_else(|| self.err(name, "missing from the file"))?;
        let a = T::take(f)
            .map_err(|f| self.err(name, format!("dtype {}, expected {}", f.dtype(), T::DTYPE)))?;
        if let Some(n) = ndim {
            if a.shape.len() != n {
                return Err(self.err(
                    name,
                    format!(
                        "shape {:?} has {} dimensions, expected {n}",
                        a.shape,
                        a.shape.len()
                    ),
                ));
            }
        }
        Ok(a)
    }

    /// A 0-d (or one-element) field.
    fn scalar<T: CaseElem + Copy>(&mut self, name: &str) -> Result<T, CaseError> {
        let a = self.arr::<T>(name, None)?;
        if a.data.len() != 1 {
            return Err(self.err(name, format!("shape {:?}, expected a scalar", a.shape)));
        }
        Ok(a.data[0])
    }

    /// A field of dtype f64 or f32 or i64 or i32 (a map).
    fn map_data(&mut self, name: &str) -> Result<MapData, CaseError> {
        let f = self
            .map
            .remove(name)
            .ok_or_else(|| self.err(name, "missing from the file"))?;
        let m = match f {
            Field::F64(a) => MapData::F64(a),
            Field::F32(a) => MapData::F32(a),
            Field::I64(a) => MapData::I64(a),
            Field::I32(a) => MapData::I32(a),
            other => {
                return Err(self.err(
                    name,
                    format!(
                        "dtype {}, expected float64, float32, int64 or int32",
                        other.dtype()
                    ),
                ))
            }
        };
        if m.shape().len() != 3 {
            return Err(self.err(
                name,
                format!("shape {:?}, expected 3 dimensions", m.shape()),
            ));
        }
        Ok(m)
    }

    /// `intervals_first` and `intervals_last`.
    fn intervals(&mut self) -> Result<Vec<SampleRange>, CaseError> {
        let first = self.arr::<i64>("intervals_first", Some(1))?;
        let last = self.arr::<i64>("intervals_last", Some(1))?;
        if first.data.len() != last.data.len() {
            return Err(self.err(
                "intervals_last",
                format!(
                    "{} entries, but intervals_first has {}",
                    last.data.len(),
                    first.data.len()
                ),
            ));
        }
        Ok(first
            .data
            .iter()
            .zip(&last.data)
            .map(|(&first, &last)| SampleRange { first, last })
            .collect())
    }

    /// `got` elements in field `name` where `want` are expected (`what`
    /// says why).
    fn same_len(&self, name: &str, got: usize, want: usize, what: &str) -> Result<(), CaseError> {
        if got != want {
            return Err(self.err(name, format!("{got} elements, expected {want} ({what})")));
        }
        Ok(())
    }

    /// The pair `name_in` (the output's initial value) and `name_out`
    /// (TOAST's result), both with `ndim` dimensions and the same length.
    fn in_out<T: CaseElem>(
        &mut self,
        name_in: &str,
        name_out: &str,
        ndim: usize,
    ) -> Result<(Arr<T>, Arr<T>), CaseError> {
        let a_in: Arr<T> = self.arr(name_in, Some(ndim))?;
        let a_out: Arr<T> = self.arr(name_out, Some(ndim))?;
        self.same_len(
            name_out,
            a_out.data.len(),
            a_in.data.len(),
            &format!("as {name_in}"),
        )?;
        Ok((a_in, a_out))
    }

    /// The `weights` of `scan_map` and `build_noise_weighted`: `[n_det,
    /// n_samp]` (nnz = 1) or `[n_det, n_samp, nnz]`.
    fn weights(&mut self) -> Result<Arr<f64>, CaseError> {
        let weights: Arr<f64> = self.arr("weights", None)?;
        if !(2..=3).contains(&weights.shape.len()) {
            return Err(self.err(
                "weights",
                format!("shape {:?}, expected 2 or 3 dimensions", weights.shape),
            ));
        }
        Ok(weights)
    }

    /// Check that an array passed as a plain host pointer (whose length the
    /// kernel infers from `n_det` or the number of intervals) has `n`
    /// elements, so that a malformed case cannot make a plugin read past it.
    fn need<T>(&self, name: &str, a: &Arr<T>, n: usize, what: &str) -> Result<(), CaseError> {
        if a.data.len() != n {
            return Err(self.err(
                name,
                format!("shape {:?}, expected {n} elements ({what})", a.shape),
            ));
        }
        Ok(())
    }
}

/// A map of one of the four dtypes `scan_map` accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum MapData {
    F64(Arr<f64>),
    F32(Arr<f32>),
    I64(Arr<i64>),
    I32(Arr<i32>),
}

impl MapData {
    /// The map's shape, whatever its dtype.
    pub fn shape(&self) -> &[usize] {
        match self {
            MapData::F64(a) => &a.shape,
            MapData::F32(a) => &a.shape,
            MapData::I64(a) => &a.shape,
            MapData::I32(a) => &a.shape,
        }
    }
}

// ---------------------------------------------------------------------------
// The fields of each kernel's cases (names as in FORMAT.md; `*_in` is the
// output's initial value, `*_out` TOAST's result).
// ---------------------------------------------------------------------------

/// A `pointing_detector` case.
#[derive(Debug, Clone, PartialEq)]
pub struct PointingDetectorCase {
    pub focalplane: Arr<f64>,
    pub boresight: Arr<f64>,
    pub quat_index: Arr<i32>,
    pub quats_in: Arr<f64>,
    pub quats_out: Arr<f64>,
    pub shared_flags: Arr<u8>,
    pub shared_flag_mask: u8,
    pub intervals: Vec<SampleRange>,
}

impl PointingDetectorCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (quats_in, quats_out) = f.in_out("quats_in", "quats_out", 3)?;
        let c = PointingDetectorCase {
            focalplane: f.arr("focalplane", Some(2))?,
            boresight: f.arr("boresight", Some(2))?,
            quat_index: f.arr("quat_index", Some(1))?,
            quats_in,
            quats_out,
            shared_flags: f.arr("shared_flags", Some(1))?,
            shared_flag_mask: f.scalar("shared_flag_mask")?,
            intervals: f.intervals()?,
        };
        let n_det = c.quat_index.data.len();
        f.need("focalplane", &c.focalplane, 4 * n_det, "[n_det, 4]")?;
        Ok(c)
    }
}

/// A `pixels_healpix` case.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelsHealpixCase {
    pub quat_index: Arr<i32>,
    pub quats: Arr<f64>,
    pub shared_flags: Arr<u8>,
    pub shared_flag_mask: u8,
    pub pixel_index: Arr<i32>,
    pub pixels_in: Arr<i64>,
    pub pixels_out: Arr<i64>,
    pub hit_submaps_in: Arr<u8>,
    pub hit_submaps_out: Arr<u8>,
    pub n_pix_submap: i64,
    pub nside: i64,
    pub nest: u8,
    pub intervals: Vec<SampleRange>,
}

impl PixelsHealpixCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (pixels_in, pixels_out) = f.in_out("pixels_in", "pixels_out", 2)?;
        let (hit_submaps_in, hit_submaps_out) = f.in_out("hit_submaps_in", "hit_submaps_out", 1)?;
        let c = PixelsHealpixCase {
            quat_index: f.arr("quat_index", Some(1))?,
            quats: f.arr("quats", Some(3))?,
            shared_flags: f.arr("shared_flags", Some(1))?,
            shared_flag_mask: f.scalar("shared_flag_mask")?,
            pixel_index: f.arr("pixel_index", Some(1))?,
            pixels_in,
            pixels_out,
            hit_submaps_in,
            hit_submaps_out,
            n_pix_submap: f.scalar("n_pix_submap")?,
            nside: f.scalar("nside")?,
            nest: f.scalar("nest")?,
            intervals: f.intervals()?,
        };
        let n_det = c.quat_index.data.len();
        f.need("pixel_index", &c.pixel_index, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `stokes_weights_I` case.
#[derive(Debug, Clone, PartialEq)]
pub struct StokesWeightsICase {
    pub weight_index: Arr<i32>,
    pub weights_in: Arr<f64>,
    pub weights_out: Arr<f64>,
    pub cal: Arr<f64>,
    pub intervals: Vec<SampleRange>,
}

impl StokesWeightsICase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (weights_in, weights_out) = f.in_out("weights_in", "weights_out", 2)?;
        let c = StokesWeightsICase {
            weight_index: f.arr("weight_index", Some(1))?,
            weights_in,
            weights_out,
            cal: f.arr("cal", Some(1))?,
            intervals: f.intervals()?,
        };
        f.need("cal", &c.cal, c.weight_index.data.len(), PER_DET)?;
        Ok(c)
    }
}

/// A `stokes_weights_IQU` case.
#[derive(Debug, Clone, PartialEq)]
pub struct StokesWeightsIquCase {
    pub quat_index: Arr<i32>,
    pub quats: Arr<f64>,
    pub weight_index: Arr<i32>,
    pub weights_in: Arr<f64>,
    pub weights_out: Arr<f64>,
    pub hwp: Arr<f64>,
    pub epsilon: Arr<f64>,
    pub gamma: Arr<f64>,
    pub cal: Arr<f64>,
    pub iau: u8,
    pub intervals: Vec<SampleRange>,
}

impl StokesWeightsIquCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (weights_in, weights_out) = f.in_out("weights_in", "weights_out", 3)?;
        let c = StokesWeightsIquCase {
            quat_index: f.arr("quat_index", Some(1))?,
            quats: f.arr("quats", Some(3))?,
            weight_index: f.arr("weight_index", Some(1))?,
            weights_in,
            weights_out,
            hwp: f.arr("hwp", Some(1))?,
            epsilon: f.arr("epsilon", Some(1))?,
            gamma: f.arr("gamma", Some(1))?,
            cal: f.arr("cal", Some(1))?,
            iau: f.scalar("IAU")?,
            intervals: f.intervals()?,
        };
        let n_det = c.quat_index.data.len();
        f.need("weight_index", &c.weight_index, n_det, PER_DET)?;
        f.need("epsilon", &c.epsilon, n_det, PER_DET)?;
        f.need("gamma", &c.gamma, n_det, PER_DET)?;
        f.need("cal", &c.cal, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `scan_map` case.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanMapCase {
    pub global2local: Arr<i64>,
    pub n_pix_submap: i64,
    pub mapdata: MapData,
    pub det_data_in: Arr<f64>,
    pub det_data_out: Arr<f64>,
    pub data_index: Arr<i32>,
    pub pixels: Arr<i64>,
    pub pixel_index: Arr<i32>,
    pub weights: Arr<f64>,
    pub weight_index: Arr<i32>,
    pub data_scale: f64,
    pub should_zero: u8,
    pub should_subtract: u8,
    pub should_scale: u8,
    pub intervals: Vec<SampleRange>,
}

impl ScanMapCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (det_data_in, det_data_out) = f.in_out("det_data_in", "det_data_out", 2)?;
        let weights = f.weights()?;
        let c = ScanMapCase {
            global2local: f.arr("global2local", Some(1))?,
            n_pix_submap: f.scalar("n_pix_submap")?,
            mapdata: f.map_data("mapdata")?,
            det_data_in,
            det_data_out,
            data_index: f.arr("data_index", Some(1))?,
            pixels: f.arr("pixels", Some(2))?,
            pixel_index: f.arr("pixel_index", Some(1))?,
            weights,
            weight_index: f.arr("weight_index", Some(1))?,
            data_scale: f.scalar("data_scale")?,
            should_zero: f.scalar("should_zero")?,
            should_subtract: f.scalar("should_subtract")?,
            should_scale: f.scalar("should_scale")?,
            intervals: f.intervals()?,
        };
        let n_det = c.pixel_index.data.len();
        f.need("weight_index", &c.weight_index, n_det, PER_DET)?;
        f.need("data_index", &c.data_index, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `build_noise_weighted` case.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildNoiseWeightedCase {
    pub global2local: Arr<i64>,
    pub zmap_in: Arr<f64>,
    pub zmap_out: Arr<f64>,
    pub pixel_index: Arr<i32>,
    pub pixels: Arr<i64>,
    pub weight_index: Arr<i32>,
    pub weights: Arr<f64>,
    pub data_index: Arr<i32>,
    pub det_data: Arr<f64>,
    pub flag_index: Arr<i32>,
    pub det_flags: Arr<u8>,
    pub det_scale: Arr<f64>,
    pub det_flag_mask: u8,
    pub shared_flags: Arr<u8>,
    pub shared_flag_mask: u8,
    pub intervals: Vec<SampleRange>,
}

impl BuildNoiseWeightedCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (zmap_in, zmap_out) = f.in_out("zmap_in", "zmap_out", 3)?;
        let weights = f.weights()?;
        let c = BuildNoiseWeightedCase {
            global2local: f.arr("global2local", Some(1))?,
            zmap_in,
            zmap_out,
            pixel_index: f.arr("pixel_index", Some(1))?,
            pixels: f.arr("pixels", Some(2))?,
            weight_index: f.arr("weight_index", Some(1))?,
            weights,
            data_index: f.arr("data_index", Some(1))?,
            det_data: f.arr("det_data", Some(2))?,
            flag_index: f.arr("flag_index", Some(1))?,
            det_flags: f.arr("det_flags", Some(2))?,
            det_scale: f.arr("det_scale", Some(1))?,
            det_flag_mask: f.scalar("det_flag_mask")?,
            shared_flags: f.arr("shared_flags", Some(1))?,
            shared_flag_mask: f.scalar("shared_flag_mask")?,
            intervals: f.intervals()?,
        };
        let n_det = c.pixel_index.data.len();
        f.need("weight_index", &c.weight_index, n_det, PER_DET)?;
        f.need("data_index", &c.data_index, n_det, PER_DET)?;
        f.need("flag_index", &c.flag_index, n_det, PER_DET)?;
        f.need("det_scale", &c.det_scale, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `noise_weight` case.
#[derive(Debug, Clone, PartialEq)]
pub struct NoiseWeightCase {
    pub det_data_in: Arr<f64>,
    pub det_data_out: Arr<f64>,
    pub data_index: Arr<i32>,
    pub detector_weights: Arr<f64>,
    pub intervals: Vec<SampleRange>,
}

impl NoiseWeightCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (det_data_in, det_data_out) = f.in_out("det_data_in", "det_data_out", 2)?;
        let c = NoiseWeightCase {
            det_data_in,
            det_data_out,
            data_index: f.arr("data_index", Some(1))?,
            detector_weights: f.arr("detector_weights", Some(1))?,
            intervals: f.intervals()?,
        };
        let n_det = c.data_index.data.len();
        f.need("detector_weights", &c.detector_weights, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `template_offset_add_to_signal` case: one call per entry of the
/// `call_*` arrays, one detector each.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateOffsetAddToSignalCase {
    pub step_length: i64,
    pub n_amp_views: Arr<i64>,
    pub amplitudes: Arr<f64>,
    pub amplitude_flags: Arr<u8>,
    pub call_data_index: Arr<i32>,
    pub call_amp_offset: Arr<i64>,
    pub det_data_in: Arr<f64>,
    pub det_data_out: Arr<f64>,
    pub intervals: Vec<SampleRange>,
}

impl TemplateOffsetAddToSignalCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (det_data_in, det_data_out) = f.in_out("det_data_in", "det_data_out", 2)?;
        let call_data_index: Arr<i32> = f.arr("call_data_index", Some(1))?;
        let call_amp_offset: Arr<i64> = f.arr("call_amp_offset", Some(1))?;
        f.same_len(
            "call_amp_offset",
            call_amp_offset.data.len(),
            call_data_index.data.len(),
            "one per call, as call_data_index",
        )?;
        let c = TemplateOffsetAddToSignalCase {
            step_length: f.scalar("step_length")?,
            n_amp_views: f.arr("n_amp_views", Some(1))?,
            amplitudes: f.arr("amplitudes", Some(1))?,
            amplitude_flags: f.arr("amplitude_flags", Some(1))?,
            call_data_index,
            call_amp_offset,
            det_data_in,
            det_data_out,
            intervals: f.intervals()?,
        };
        let n_iv = c.intervals.len();
        f.need("n_amp_views", &c.n_amp_views, n_iv, PER_INTERVAL)?;
        Ok(c)
    }
}

/// A `template_offset_project_signal` case: one call per entry of the
/// `call_*` arrays, one detector each.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateOffsetProjectSignalCase {
    pub call_data_index: Arr<i32>,
    pub det_data: Arr<f64>,
    pub call_flag_index: Arr<i32>,
    pub flag_data: Arr<u8>,
    pub flag_mask: u8,
    pub step_length: i64,
    pub call_amp_offset: Arr<i64>,
    pub n_amp_views: Arr<i64>,
    pub amplitudes_in: Arr<f64>,
    pub amplitudes_out: Arr<f64>,
    pub amplitude_flags: Arr<u8>,
    pub intervals: Vec<SampleRange>,
}

impl TemplateOffsetProjectSignalCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (amplitudes_in, amplitudes_out) = f.in_out("amplitudes_in", "amplitudes_out", 1)?;
        let call_data_index: Arr<i32> = f.arr("call_data_index", Some(1))?;
        let call_amp_offset: Arr<i64> = f.arr("call_amp_offset", Some(1))?;
        let call_flag_index: Arr<i32> = f.arr("call_flag_index", Some(1))?;
        let n_call = call_data_index.data.len();
        let per_call = "one per call";
        f.same_len(
            "call_amp_offset",
            call_amp_offset.data.len(),
            n_call,
            per_call,
        )?;
        f.same_len(
            "call_flag_index",
            call_flag_index.data.len(),
            n_call,
            per_call,
        )?;
        let c = TemplateOffsetProjectSignalCase {
            call_data_index,
            det_data: f.arr("det_data", Some(2))?,
            call_flag_index,
            flag_data: f.arr("flag_data", None)?,
            flag_mask: f.scalar("flag_mask")?,
            step_length: f.scalar("step_length")?,
            call_amp_offset,
            n_amp_views: f.arr("n_amp_views", Some(1))?,
            amplitudes_in,
            amplitudes_out,
            amplitude_flags: f.arr("amplitude_flags", Some(1))?,
            intervals: f.intervals()?,
        };
        let n_iv = c.intervals.len();
        f.need("n_amp_views", &c.n_amp_views, n_iv, PER_INTERVAL)?;
        Ok(c)
    }
}

/// A `template_offset_apply_diag_precond` case.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateOffsetApplyDiagPrecondCase {
    pub offset_var: Arr<f64>,
    pub amplitudes_in: Arr<f64>,
    pub amplitude_flags: Arr<u8>,
    pub amplitudes_out_in: Arr<f64>,
    pub amplitudes_out_out: Arr<f64>,
}

impl TemplateOffsetApplyDiagPrecondCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (amplitudes_out_in, amplitudes_out_out) =
            f.in_out("amplitudes_out_in", "amplitudes_out_out", 1)?;
        Ok(TemplateOffsetApplyDiagPrecondCase {
            offset_var: f.arr("offset_var", Some(1))?,
            amplitudes_in: f.arr("amplitudes_in", Some(1))?,
            amplitude_flags: f.arr("amplitude_flags", Some(1))?,
            amplitudes_out_in,
            amplitudes_out_out,
        })
    }
}

/// A `cov_accum_diag_hits` case.
#[derive(Debug, Clone, PartialEq)]
pub struct CovAccumDiagHitsCase {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub submap: Arr<i64>,
    pub subpix: Arr<i64>,
    pub hits_in: Arr<i64>,
    pub hits_out: Arr<i64>,
}

impl CovAccumDiagHitsCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (hits_in, hits_out) = f.in_out("hits_in", "hits_out", 1)?;
        Ok(CovAccumDiagHitsCase {
            nsub: f.scalar("nsub")?,
            nsubpix: f.scalar("nsubpix")?,
            nnz: f.scalar("nnz")?,
            submap: f.arr("submap", Some(1))?,
            subpix: f.arr("subpix", Some(1))?,
            hits_in,
            hits_out,
        })
    }
}

/// A `cov_accum_timestream` case (FORMAT.md section 19): TOAST's
/// `BuildHitMap` and `BuildInverseCovariance` on one observation. An output
/// with no elements (`hits_in`/`invnpp_in` of shape `[0, ..]`) is absent
/// from the call, as are `weights` then (a hits-only case), `det_flags`
/// without rows and `shared_flags` without samples.
#[derive(Debug, Clone, PartialEq)]
pub struct CovAccumTimestreamCase {
    pub global2local: Arr<i64>,
    pub n_pix_submap: i64,
    pub nnz: i64,
    pub pixel_index: Arr<i32>,
    pub pixels: Arr<i64>,
    pub weight_index: Arr<i32>,
    pub weights: Arr<f64>,
    pub flag_index: Arr<i32>,
    pub det_flags: Arr<u8>,
    pub det_flag_mask: u8,
    pub shared_flags: Arr<u8>,
    pub shared_flag_mask: u8,
    pub det_scale: Arr<f64>,
    pub intervals: Vec<SampleRange>,
    pub hits_in: Arr<i64>,
    pub hits_out: Arr<i64>,
    pub invnpp_in: Arr<f64>,
    pub invnpp_out: Arr<f64>,
}

impl CovAccumTimestreamCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (hits_in, hits_out) = f.in_out("hits_in", "hits_out", 2)?;
        let (invnpp_in, invnpp_out) = f.in_out("invnpp_in", "invnpp_out", 3)?;
        let c = CovAccumTimestreamCase {
            global2local: f.arr("global2local", Some(1))?,
            n_pix_submap: f.scalar("n_pix_submap")?,
            nnz: f.scalar("nnz")?,
            pixel_index: f.arr("pixel_index", Some(1))?,
            pixels: f.arr("pixels", Some(2))?,
            weight_index: f.arr("weight_index", Some(1))?,
            weights: f.arr("weights", Some(3))?,
            flag_index: f.arr("flag_index", Some(1))?,
            det_flags: f.arr("det_flags", Some(2))?,
            det_flag_mask: f.scalar("det_flag_mask")?,
            shared_flags: f.arr("shared_flags", Some(1))?,
            shared_flag_mask: f.scalar("shared_flag_mask")?,
            det_scale: f.arr("det_scale", Some(1))?,
            intervals: f.intervals()?,
            hits_in,
            hits_out,
            invnpp_in,
            invnpp_out,
        };
        let n_det = c.pixel_index.data.len();
        f.need("weight_index", &c.weight_index, n_det, PER_DET)?;
        f.need("flag_index", &c.flag_index, n_det, PER_DET)?;
        f.need("det_scale", &c.det_scale, n_det, PER_DET)?;
        Ok(c)
    }
}

/// A `solver_flags` case (FORMAT.md section 20): the destriping solver's
/// flags (TOAST's `SolveAmplitudes` solver flags, then its `ScanMask` of
/// the poorly conditioned pixels) OR-ed into `flags_in`, with the counts.
/// `det_flags` without rows and `shared_flags` without samples are absent
/// from the call, as are `pixels`, `pixel_index` and `global2local` when
/// `pixel_mask` is empty.
#[derive(Debug, Clone, PartialEq)]
pub struct SolverFlagsCase {
    pub global2local: Arr<i64>,
    pub n_pix_submap: i64,
    pub flag_index: Arr<i32>,
    pub det_flags: Arr<u8>,
    pub det_flag_mask: u8,
    pub shared_flags: Arr<u8>,
    pub shared_flag_mask: u8,
    pub pixel_index: Arr<i32>,
    pub pixels: Arr<i64>,
    pub pixel_mask: Arr<u8>,
    pub out_index: Arr<i32>,
    pub cut_bit: u8,
    pub mask_bit: u8,
    pub intervals: Vec<SampleRange>,
    pub flags_in: Arr<u8>,
    pub flags_out: Arr<u8>,
    pub counts_in: Arr<i64>,
    pub counts_out: Arr<i64>,
}

impl SolverFlagsCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (flags_in, flags_out) = f.in_out("flags_in", "flags_out", 2)?;
        let (counts_in, counts_out) = f.in_out("counts_in", "counts_out", 1)?;
        let c = SolverFlagsCase {
            global2local: f.arr("global2local", Some(1))?,
            n_pix_submap: f.scalar("n_pix_submap")?,
            flag_index: f.arr("flag_index", Some(1))?,
            det_flags: f.arr("det_flags", Some(2))?,
            det_flag_mask: f.scalar("det_flag_mask")?,
            shared_flags: f.arr("shared_flags", Some(1))?,
            shared_flag_mask: f.scalar("shared_flag_mask")?,
            pixel_index: f.arr("pixel_index", Some(1))?,
            pixels: f.arr("pixels", Some(2))?,
            pixel_mask: f.arr("pixel_mask", Some(1))?,
            out_index: f.arr("out_index", Some(1))?,
            cut_bit: f.scalar("cut_bit")?,
            mask_bit: f.scalar("mask_bit")?,
            intervals: f.intervals()?,
            flags_in,
            flags_out,
            counts_in,
            counts_out,
        };
        let n_det = c.out_index.data.len();
        if !c.det_flags.data.is_empty() {
            f.need("flag_index", &c.flag_index, n_det, PER_DET)?;
        }
        if !c.pixel_mask.data.is_empty() {
            f.need("pixel_index", &c.pixel_index, n_det, PER_DET)?;
        }
        Ok(c)
    }
}

/// A `cov_apply_diag` case.
#[derive(Debug, Clone, PartialEq)]
pub struct CovApplyDiagCase {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub mat: Arr<f64>,
    pub vec_in: Arr<f64>,
    pub vec_out: Arr<f64>,
}

impl CovApplyDiagCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (vec_in, vec_out) = f.in_out("vec_in", "vec_out", 1)?;
        Ok(CovApplyDiagCase {
            nsub: f.scalar("nsub")?,
            nsubpix: f.scalar("nsubpix")?,
            nnz: f.scalar("nnz")?,
            mat: f.arr("mat", Some(1))?,
            vec_in,
            vec_out,
        })
    }
}

/// An `amp_dot` case (the PCG solver's dot product; numpy reference).
#[derive(Debug, Clone, PartialEq)]
pub struct AmpDotCase {
    pub n: i64,
    pub nblock: i64,
    pub a: Arr<f64>,
    pub b: Arr<f64>,
    pub flags: Arr<u8>,
    pub partials: Arr<f64>,
}

impl AmpDotCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        Ok(AmpDotCase {
            n: f.scalar("n")?,
            nblock: f.scalar("nblock")?,
            a: f.arr("a", Some(1))?,
            b: f.arr("b", Some(1))?,
            flags: f.arr("flags", Some(1))?,
            partials: f.arr("partials", Some(1))?,
        })
    }
}

/// An `amp_axpby` case (the PCG solver's vector update; numpy reference).
#[derive(Debug, Clone, PartialEq)]
pub struct AmpAxpbyCase {
    pub n: i64,
    pub alpha: f64,
    pub beta: f64,
    pub x: Arr<f64>,
    pub y_in: Arr<f64>,
    pub y_out: Arr<f64>,
}

impl AmpAxpbyCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (y_in, y_out) = f.in_out("y_in", "y_out", 1)?;
        Ok(AmpAxpbyCase {
            n: f.scalar("n")?,
            alpha: f.scalar("alpha")?,
            beta: f.scalar("beta")?,
            x: f.arr("x", Some(1))?,
            y_in,
            y_out,
        })
    }
}

/// A `cov_accum_diag_invnpp` case.
#[derive(Debug, Clone, PartialEq)]
pub struct CovAccumDiagInvnppCase {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub scale: f64,
    pub submap: Arr<i64>,
    pub subpix: Arr<i64>,
    pub weights: Arr<f64>,
    pub invnpp_in: Arr<f64>,
    pub invnpp_out: Arr<f64>,
}

impl CovAccumDiagInvnppCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (invnpp_in, invnpp_out) = f.in_out("invnpp_in", "invnpp_out", 1)?;
        Ok(CovAccumDiagInvnppCase {
            nsub: f.scalar("nsub")?,
            nsubpix: f.scalar("nsubpix")?,
            nnz: f.scalar("nnz")?,
            scale: f.scalar("scale")?,
            submap: f.arr("submap", Some(1))?,
            subpix: f.arr("subpix", Some(1))?,
            weights: f.arr("weights", Some(1))?,
            invnpp_in,
            invnpp_out,
        })
    }
}

/// A `filter_polynomial` case: every row of `signals_in` filtered.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterPolynomialCase {
    pub order: i64,
    pub flags: Arr<u8>,
    pub signals_in: Arr<f64>,
    pub signals_out: Arr<f64>,
    pub starts: Arr<i64>,
    pub stops: Arr<i64>,
}

impl FilterPolynomialCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (signals_in, signals_out) = f.in_out("signals_in", "signals_out", 2)?;
        let c = FilterPolynomialCase {
            order: f.scalar("order")?,
            flags: f.arr("flags", Some(1))?,
            signals_in,
            signals_out,
            starts: f.arr("starts", Some(1))?,
            stops: f.arr("stops", Some(1))?,
        };
        f.same_len(
            "stops",
            c.stops.data.len(),
            c.starts.data.len(),
            "one per scan, as starts",
        )?;
        f.same_len(
            "flags",
            c.flags.data.len(),
            c.signals_in.shape[1],
            "n_samp, as signals_in",
        )?;
        Ok(c)
    }
}

/// A `filter_poly2D` case.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterPoly2dCase {
    pub det_groups: Arr<i32>,
    pub templates: Arr<f64>,
    pub signals: Arr<f64>,
    pub masks: Arr<u8>,
    pub coeff_in: Arr<f64>,
    pub coeff_out: Arr<f64>,
}

impl FilterPoly2dCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (coeff_in, coeff_out) = f.in_out("coeff_in", "coeff_out", 3)?;
        let c = FilterPoly2dCase {
            det_groups: f.arr("det_groups", Some(1))?,
            templates: f.arr("templates", Some(2))?,
            signals: f.arr("signals", Some(2))?,
            masks: f.arr("masks", Some(2))?,
            coeff_in,
            coeff_out,
        };
        let n_det = c.det_groups.data.len();
        f.same_len("templates", c.templates.shape[0], n_det, PER_DET)?;
        f.same_len("signals", c.signals.shape[1], n_det, PER_DET)?;
        f.same_len(
            "masks",
            c.masks.data.len(),
            c.signals.data.len(),
            "as signals",
        )?;
        Ok(c)
    }
}

/// Why a per-detector array must have `n_det` elements.
const PER_DET: &str = "one per detector, as the index arrays";
/// Why `n_amp_views` must have one element per interval.
const PER_INTERVAL: &str = "one per interval";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_from_file_name() {
        assert_eq!(
            kernel_of("stokes_weights_IQU_hwp_iau"),
            Some(Kernel::StokesWeightsIqu)
        );
        assert_eq!(
            kernel_of("stokes_weights_I_basic"),
            Some(Kernel::StokesWeightsI)
        );
        assert_eq!(kernel_of("scan_map_f32_nnz1_scale"), Some(Kernel::ScanMap));
        assert_eq!(
            kernel_of("template_offset_apply_diag_precond_empty"),
            Some(Kernel::TemplateOffsetApplyDiagPrecond)
        );
        assert_eq!(kernel_of("scanmap_x"), None);
        assert_eq!(kernel_of("noise_weightx"), None);
        // A character across a kernel name's length (`é` is two bytes,
        // `☃` three) is no kernel's, and no panic.
        assert_eq!(kernel_of("noise_weight_é☃"), Some(Kernel::NoiseWeight));
        assert_eq!(kernel_of("noise_weigh\u{e9}"), None);
        assert_eq!(kernel_of("pointing_detecto\u{2603}_x"), None);
    }

    #[test]
    fn element_sizes_of_dtype_descriptors() {
        assert_eq!(elem_size("<f8"), Some(8));
        assert_eq!(elem_size("|u1"), Some(1));
        assert_eq!(elem_size("i4"), Some(4));
        assert_eq!(elem_size("|O"), None);
        assert_eq!(elem_size("<U0"), None);
        assert_eq!(elem_size("<f8x"), None);
        assert_eq!(elem_size(""), None);
    }

    #[test]
    fn arrays_over_the_case_limit_are_refused_unread() {
        let p = cases_dir().join("noise_weight_basic.npz");
        assert!(read_fields(&p, MAX_CASE_BYTES).is_ok());
        // det_data_in, the first entry, is 28128 bytes.
        match read_fields(&p, 20_000).unwrap_err() {
            CaseError::TooLarge {
                field,
                bytes,
                limit,
                ..
            } => {
                assert_eq!(field, "det_data_in");
                assert_eq!(bytes, 28_128);
                assert_eq!(limit, 20_000);
            }
            other => panic!("{other:?}"),
        }
        // The limit holds for the arrays together: the second one is over.
        let e = read_fields(&p, 50_000).unwrap_err();
        assert!(
            matches!(&e, CaseError::TooLarge { field, .. } if field == "det_data_out"),
            "{e:?}"
        );
        assert!(e.to_string().contains("noise_weight_basic.npz"), "{e}");
    }

    /// A file over the limit with its zip headers is refused before the
    /// zip reader searches it for a directory (a sparse 100 GB file took
    /// minutes).
    #[test]
    fn a_file_over_the_case_limit_is_refused_unread() {
        let p = tmp("noise_weight_huge.npz", b"");
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(100 << 30).unwrap();
        let e = read_fields(&p, MAX_CASE_BYTES).unwrap_err();
        assert!(
            matches!(e, CaseError::FileTooLarge { bytes, limit, .. }
                if bytes == 100 << 30 && limit == MAX_CASE_BYTES + CASE_FILE_SLACK_BYTES),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("noise_weight_huge.npz: the file holds"),
            "{e}"
        );
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn unknown_kernel_names_the_file() {
        let e = load_case(Path::new("/nonexistent/foo_bar.npz")).unwrap_err();
        assert!(matches!(e, CaseError::UnknownKernel { .. }));
        assert!(e.to_string().contains("foo_bar.npz"), "{e}");
    }

    fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("toast-conformance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn cases_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/toast-kernels/cases")
    }

    #[test]
    fn corrupt_file_is_an_error_naming_the_file() {
        let p = tmp("noise_weight_garbage.npz", b"this is not a zip file");
        let e = load_case(&p).unwrap_err();
        assert!(matches!(e, CaseError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("noise_weight_garbage.npz"), "{e}");
    }

    #[test]
    fn truncated_file_is_an_error() {
        let src = std::fs::read(cases_dir().join("noise_weight_basic.npz")).unwrap();
        let p = tmp("noise_weight_truncated.npz", &src[..src.len() / 2]);
        let e = load_case(&p).unwrap_err();
        assert!(e.to_string().contains("noise_weight_truncated.npz"), "{e}");
    }

    fn write_npz(
        name: &str,
        fields: &[(&str, ArrayD<f64>)],
        ints: &[(&str, ArrayD<i32>)],
    ) -> PathBuf {
        let p = tmp(name, b"");
        let mut w = ndarray_npy::NpzWriter::new(std::fs::File::create(&p).unwrap());
        for (n, a) in fields {
            w.add_array(*n, a).unwrap();
        }
        for (n, a) in ints {
            w.add_array(*n, a).unwrap();
        }
        w.finish().unwrap();
        p
    }

    #[test]
    fn missing_field_names_file_and_field() {
        let d = ArrayD::<f64>::zeros(vec![2, 5]);
        let p = write_npz(
            "noise_weight_missing.npz",
            &[("det_data_in", d.clone()), ("det_data_out", d)],
            &[],
        );
        let e = load_case(&p).unwrap_err();
        match &e {
            CaseError::Field { field, .. } => assert_eq!(field, "data_index"),
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("noise_weight_missing.npz"), "{e}");
    }

    #[test]
    fn wrong_dtype_names_the_field() {
        let d = ArrayD::<f64>::zeros(vec![2, 5]);
        let p = write_npz(
            "noise_weight_dtype.npz",
            &[
                ("det_data_in", d.clone()),
                ("det_data_out", d),
                ("data_index", ArrayD::<f64>::zeros(vec![2])),
            ],
            &[],
        );
        let e = load_case(&p).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("data_index") && s.contains("float64") && s.contains("int32"),
            "{s}"
        );
    }

    #[test]
    fn wrong_shape_names_the_field() {
        let p = write_npz(
            "noise_weight_shape.npz",
            &[
                ("det_data_in", ArrayD::<f64>::zeros(vec![10])),
                ("det_data_out", ArrayD::<f64>::zeros(vec![10])),
            ],
            &[],
        );
        let e = load_case(&p).unwrap_err();
        assert!(e.to_string().contains("det_data_in"), "{e}");
    }

    #[test]
    fn a_header_longer_than_its_entry_is_refused_before_it_is_read() {
        use ndarray_npy::WriteNpyExt;
        let mut npy = Vec::new();
        ArrayD::<f64>::zeros(vec![3]).write_npy(&mut npy).unwrap();
        assert_eq!(npy_preamble_fits(&npy), Ok(()));
        // Version 2: the length becomes a u32 that takes in the header's
        // first characters ("{'" after the u16): far beyond the entry.
        let mut v2 = npy.clone();
        v2[6] = 2;
        let e = npy_preamble_fits(&v2).unwrap_err();
        assert!(e.contains("the header claims"), "{e}");
        let mut v1 = npy.clone();
        v1[8] = 0xff;
        v1[9] = 0xff;
        assert!(npy_preamble_fits(&v1).unwrap_err().contains("65535"));
        let mut v9 = npy.clone();
        v9[6] = 9;
        assert!(npy_preamble_fits(&v9).unwrap_err().contains("version 9"));
        assert!(npy_preamble_fits(&npy[..7]).is_err());
        assert!(npy_preamble_fits(b"not npy at all").is_err());
    }

    #[test]
    fn short_per_detector_array_names_the_field() {
        let p = tmp("noise_weight_short2.npz", b"");
        let mut w = ndarray_npy::NpzWriter::new(std::fs::File::create(&p).unwrap());
        let d = ArrayD::<f64>::zeros(vec![2, 5]);
        w.add_array("det_data_in", &d).unwrap();
        w.add_array("det_data_out", &d).unwrap();
        w.add_array("detector_weights", &ArrayD::<f64>::zeros(vec![1]))
            .unwrap();
        w.add_array("data_index", &ArrayD::<i32>::zeros(vec![2]))
            .unwrap();
        w.add_array("intervals_first", &ArrayD::<i64>::zeros(vec![0]))
            .unwrap();
        w.add_array("intervals_last", &ArrayD::<i64>::zeros(vec![0]))
            .unwrap();
        w.finish().unwrap();
        let e = load_case(&p).unwrap_err();
        match &e {
            CaseError::Field { field, .. } => assert_eq!(field, "detector_weights", "{e}"),
            other => panic!("{other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------
// The map-maker's fused kernels (ABI minor 4; FORMAT.md section 17): one
// set of fields for the three, each kernel's case a newtype with its `run`.

/// The fields of a fused-kernel case: TOAST's pointing of the detectors
/// (the inputs of both forms), the timestream or offset amplitudes, the
/// flags, the map and the expected output.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedCase {
    pub pixel_index: Arr<i32>,
    pub weight_index: Arr<i32>,
    pub focalplane: Arr<f64>,
    pub epsilon: Arr<f64>,
    pub gamma: Arr<f64>,
    pub cal: Arr<f64>,
    /// TOAST's pixels narrowed to i32 `[n_det, n_samp]`.
    pub compact: Arr<i32>,
    pub boresight: Arr<f64>,
    pub pointing_flags: Arr<u8>,
    pub pointing_flag_mask: u8,
    pub hwp: Arr<f64>,
    pub iau: u8,
    /// TOAST's pixels and weights (the kept form; the expected output of
    /// `compact_expand_pointing`).
    pub pixels: Arr<i64>,
    pub weights: Arr<f64>,
    pub intervals: Vec<SampleRange>,
    /// The kernel-specific fields (absent for `compact_expand_pointing`).
    pub pass: Option<FusedPassFields>,
}

/// The fields of a `fused_accumulate` or `fused_project` case.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedPassFields {
    /// Run the compact form (else the kept form).
    pub compact_form: bool,
    pub step_length: i64,
    pub n_amp_views: Arr<i64>,
    pub amp_offset: Arr<i64>,
    pub amplitudes: Arr<f64>,
    pub amplitude_flags: Arr<u8>,
    pub data_index: Arr<i32>,
    /// `[0, n_samp]`: `F a`.
    pub det_data: Arr<f64>,
    pub flag_index: Arr<i32>,
    pub det_flags: Arr<u8>,
    pub det_flag_mask: u8,
    pub det_scale: Arr<f64>,
    pub global2local: Arr<i64>,
    pub n_pix_submap: i64,
    /// `fused_accumulate`: `shared_flag_mask` (on `pointing_flags`),
    /// `finite`; `fused_project`: `mapdata`.
    pub shared_flag_mask: u8,
    pub finite: Arr<u8>,
    pub mapdata: Arr<f64>,
    /// The output's initial value and TOAST's result (`zmap` or
    /// `amplitudes_out`).
    pub out_in: Arr<f64>,
    pub out_want: Arr<f64>,
}

impl FusedCase {
    fn load_common(f: &mut Fields) -> Result<Self, CaseError> {
        let c = FusedCase {
            pixel_index: f.arr("pixel_index", Some(1))?,
            weight_index: f.arr("weight_index", Some(1))?,
            focalplane: f.arr("focalplane", Some(2))?,
            epsilon: f.arr("epsilon", Some(1))?,
            gamma: f.arr("gamma", Some(1))?,
            cal: f.arr("cal", Some(1))?,
            compact: f.arr("compact", Some(2))?,
            boresight: f.arr("boresight", Some(2))?,
            pointing_flags: f.arr("pointing_flags", Some(1))?,
            pointing_flag_mask: f.scalar("pointing_flag_mask")?,
            hwp: f.arr("hwp", Some(1))?,
            iau: f.scalar("iau")?,
            pixels: f.arr("pixels", Some(2))?,
            weights: f.arr("weights", Some(3))?,
            intervals: f.intervals()?,
            pass: None,
        };
        let n_det = c.pixel_index.data.len();
        f.need("weight_index", &c.weight_index, n_det, PER_DET)?;
        f.need("focalplane", &c.focalplane, 4 * n_det, "4 per detector")?;
        f.need("epsilon", &c.epsilon, n_det, PER_DET)?;
        f.need("gamma", &c.gamma, n_det, PER_DET)?;
        f.need("cal", &c.cal, n_det, PER_DET)?;
        Ok(c)
    }

    fn load_pass(f: &mut Fields, accumulate: bool) -> Result<Self, CaseError> {
        let mut c = Self::load_common(f)?;
        let n_det = c.pixel_index.data.len();
        let (out_in, out_want) = if accumulate {
            f.in_out("zmap_in", "zmap_out", 3)?
        } else {
            f.in_out("amplitudes_out_in", "amplitudes_out_out", 1)?
        };
        let p = FusedPassFields {
            compact_form: f.scalar::<u8>("compact_form")? != 0,
            step_length: f.scalar("step_length")?,
            n_amp_views: f.arr("n_amp_views", Some(1))?,
            amp_offset: f.arr("amp_offset", Some(1))?,
            amplitudes: f.arr("amplitudes", Some(1))?,
            amplitude_flags: f.arr("amplitude_flags", Some(1))?,
            data_index: f.arr("data_index", Some(1))?,
            det_data: f.arr("det_data", Some(2))?,
            flag_index: f.arr("flag_index", Some(1))?,
            det_flags: f.arr("det_flags", Some(2))?,
            det_flag_mask: f.scalar("det_flag_mask")?,
            det_scale: f.arr("det_scale", Some(1))?,
            global2local: f.arr("global2local", Some(1))?,
            n_pix_submap: f.scalar("n_pix_submap")?,
            shared_flag_mask: if accumulate {
                f.scalar("shared_flag_mask")?
            } else {
                0
            },
            finite: if accumulate {
                f.arr("finite", Some(1))?
            } else {
                Arr {
                    shape: vec![0],
                    data: Vec::new(),
                }
            },
            mapdata: if accumulate {
                Arr {
                    shape: vec![0],
                    data: Vec::new(),
                }
            } else {
                f.arr("mapdata", Some(3))?
            },
            out_in,
            out_want,
        };
        f.need("amp_offset", &p.amp_offset, n_det, PER_DET)?;
        f.need(
            "n_amp_views",
            &p.n_amp_views,
            c.intervals.len(),
            "one per interval",
        )?;
        f.need("data_index", &p.data_index, n_det, PER_DET)?;
        f.need("flag_index", &p.flag_index, n_det, PER_DET)?;
        f.need("det_scale", &p.det_scale, n_det, PER_DET)?;
        if accumulate {
            f.need("finite", &p.finite, n_det, PER_DET)?;
        }
        c.pass = Some(p);
        Ok(c)
    }
}

/// A `compact_expand_pointing` case: TOAST's pixels and weights from the
/// compact pixels and the boresight.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactExpandPointingCase(pub FusedCase);

impl CompactExpandPointingCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        Ok(CompactExpandPointingCase(FusedCase::load_common(f)?))
    }
}

/// A `fused_accumulate` case: TOAST's `build_noise_weighted` of the same
/// timestream (or `template_offset_add_to_signal` on zeros).
#[derive(Debug, Clone, PartialEq)]
pub struct FusedAccumulateCase(pub FusedCase);

impl FusedAccumulateCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        Ok(FusedAccumulateCase(FusedCase::load_pass(f, true)?))
    }
}

/// A `fused_project` case: TOAST's `scan_map` (subtract), `noise_weight`
/// and `template_offset_project_signal` into zeroed amplitudes.
#[derive(Debug, Clone, PartialEq)]
pub struct FusedProjectCase(pub FusedCase);

impl FusedProjectCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        Ok(FusedProjectCase(FusedCase::load_pass(f, false)?))
    }
}

/// A `sim_noise` case (TOAST's `tod_sim_noise_timestream`; FORMAT.md
/// section 18): `keys` are the Threefry key words stored as int64 bit
/// patterns, `[n_det, 2]`; `amplitudes` `[n_filter, fft_len / 2 + 1]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SimNoiseCase {
    pub n_samp: i64,
    pub fft_len: i64,
    pub counter0: i64,
    pub data_index: Arr<i32>,
    pub filter_index: Arr<i32>,
    pub keys: Arr<i64>,
    pub amplitudes: Arr<f64>,
    pub det_data_in: Arr<f64>,
    pub det_data_out: Arr<f64>,
}

impl SimNoiseCase {
    pub(super) fn load(f: &mut Fields) -> Result<Self, CaseError> {
        let (det_data_in, det_data_out) = f.in_out("det_data_in", "det_data_out", 2)?;
        let c = SimNoiseCase {
            n_samp: f.scalar("n_samp")?,
            fft_len: f.scalar("fft_len")?,
            counter0: f.scalar("counter0")?,
            data_index: f.arr("data_index", Some(1))?,
            filter_index: f.arr("filter_index", Some(1))?,
            keys: f.arr("keys", Some(2))?,
            amplitudes: f.arr("amplitudes", Some(2))?,
            det_data_in,
            det_data_out,
        };
        // The kernel reads `filter_index` and `keys` per detector and each
        // row of `amplitudes` over fft_len / 2 + 1 frequencies, through
        // plain pointers: their lengths must be those.
        let n_det = c.data_index.data.len();
        f.need("filter_index", &c.filter_index, n_det, PER_DET)?;
        f.need("keys", &c.keys, 2 * n_det, "two key words per detector")?;
        if c.keys.shape[1] != 2 {
            return Err(f.err(
                "keys",
                format!("shape {:?}, expected [n_det, 2]", c.keys.shape),
            ));
        }
        let Some(n_freq) = usize::try_from(c.fft_len).ok().map(|n| n / 2 + 1) else {
            return Err(f.err("fft_len", format!("{} is negative", c.fft_len)));
        };
        if c.amplitudes.shape[1] != n_freq {
            return Err(f.err(
                "amplitudes",
                format!(
                    "shape {:?}, expected rows of fft_len / 2 + 1 = {n_freq} frequencies",
                    c.amplitudes.shape
                ),
            ));
        }
        Ok(c)
    }
}
