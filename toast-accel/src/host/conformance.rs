//! The conformance runner: replays TOAST 3.0.6's reference cases (one `.npz`
//! file per case, see `tests/data/toast-kernels/FORMAT.md`) on a backend and
//! compares its outputs with TOAST's, bit for bit.
//!
//! * [`load_case`] reads a file, identifies the kernel from the file name
//!   (the longest known kernel name that prefixes it) and extracts every
//!   field that kernel needs with its dtype and shape checked, so a corrupt,
//!   truncated or incomplete file is a [`CaseError`] naming the file and the
//!   field, never a panic.
//! * [`run_case`] runs the kernel through [`ArrayArg`] (so a backend that is
//!   not host-addressable gets its arrays staged) and compares every output.
//!   TOAST's "disabled by length" conventions (flags of length 1, a dummy
//!   HWP array, `det_flags` of shape (1, 1)) become absent arrays, and the
//!   template-offset cases replay their per-detector `call_*` arrays in
//!   order, one detector per call, as TOAST's `OffsetTemplate` does.
//! * Comparison ([`Comparison`]) is exact for backends that claim
//!   bit-exactness: f64 and f32 by bits, except that two NaNs match. Device
//!   backends are compared in the documented tolerant mode below.
//!
//! # Tolerance policy (device backends)
//!
//! The CPU backend reproduces TOAST bit for bit (same libm, same operation
//! order) and is always compared exactly. A backend that is not
//! host-addressable runs on a device whose `atan2`/`sin`/`cos` are not
//! glibc's (a few ulps apart), and whose `build_noise_weighted` sums with
//! atomics in a scheduling-dependent order. [`Comparison::for_backend`]
//! compares those in [`Comparison::Tolerant`] mode, which relaxes exactly
//! two outputs and nothing else:
//!
//! * `stokes_weights_IQU` `weights` (trigonometry of the pointing) and
//!   `build_noise_weighted` `zmap` (atomic accumulation): an element
//!   matches when its bits match, or when both values are finite and
//!   `|got - want| <= rtol * max|want|` over the field, with `rtol` =
//!   [`TRIG_RTOL`] (1e-14) for the weights and [`ACCUM_RTOL`] (1e-13) for
//!   zmap (a
//!   norm-wise relative bound: the error of `cos(x)` near a zero of the
//!   cosine is relative to the field's scale, not to the tiny element).
//!   NaN must meet NaN and infinities must be identical (the same NaN
//!   pattern). A case that passes only thanks to the tolerance is reported
//!   as [`CaseOutcome::PassTolerant`] with the count and the largest
//!   norm-wise difference, never silently as an exact pass;
//! * everything else (pointing quaternions, pixel indices, hit maps,
//!   `scan_map`, `noise_weight`, the template kernels) stays exact. In
//!   particular pixel indices must be identical: a device whose trigonometry
//!   moves a direction lying on a pixel boundary (FORMAT.md's special
//!   directions) across it fails the case, with the index reported, rather
//!   than being excused. (PoCL reproduces every reference pixel exactly.)
//! * [`run_dir`] runs every `.npz` of a directory, sorted by file name.

use super::{AccelError, ArrayArg, Backend, Element, KernelArgs};
use crate::abi::{self, Interval, Intervals, Kernel};
use ndarray::ArrayD;
use ndarray_npy::{NpzReader, ReadNpyError, ReadNpzError};
use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use thiserror::Error;

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
}

/// The result of running one case.
#[derive(Debug, Clone, PartialEq)]
pub enum CaseOutcome {
    /// Every output matched TOAST's exactly.
    Pass,
    /// Every output matched within the tolerant comparison, and some
    /// elements differed (the first such field).
    PassTolerant {
        field: String,
        /// Number of elements that differ (all within the tolerance).
        n_diff: usize,
        /// Largest `|got - want| / max|want|` over the field.
        max_rel_diff: f64,
    },
    /// An output differs (the first such field, in the kernel's output order).
    Fail {
        field: String,
        /// Largest |ours - TOAST's| (infinite when only one side is NaN).
        max_abs_diff: f64,
        /// Number of differing elements.
        n_diff: usize,
        /// Flat (row-major) index of the first differing element.
        first_diff_index: usize,
    },
    /// The kernel call itself failed.
    Error { message: String },
    /// The case could not run here (e.g. the backend lacks the kernel).
    Skipped { reason: String },
}

impl CaseOutcome {
    /// A pass, exact or within tolerance.
    pub fn is_pass(&self) -> bool {
        matches!(self, CaseOutcome::Pass | CaseOutcome::PassTolerant { .. })
    }
}

impl fmt::Display for CaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaseOutcome::Pass => f.write_str("pass"),
            CaseOutcome::PassTolerant {
                field,
                n_diff,
                max_rel_diff,
            } => write!(
                f,
                "pass within tolerance: {field} n = {n_diff} differ, max |diff| / max|want| = {max_rel_diff:e}"
            ),
            CaseOutcome::Fail {
                field,
                max_abs_diff,
                n_diff,
                first_diff_index,
            } => write!(
                f,
                "{field} max |diff| = {max_abs_diff:e}, n = {n_diff} (first at flat index {first_diff_index})"
            ),
            CaseOutcome::Error { message } => write!(f, "kernel error: {message}"),
            CaseOutcome::Skipped { reason } => f.write_str(reason),
        }
    }
}

/// A numeric array read from a case: row-major data and its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Arr<T> {
    pub shape: Vec<usize>,
    pub data: Vec<T>,
}

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

/// Read entry `index` of an npz whatever its dtype.
fn read_field(npz: &mut NpzReader<File>, index: usize) -> Result<Field, ReadNpzError> {
    fn wrong(e: &ReadNpzError) -> bool {
        matches!(e, ReadNpzError::Npy(ReadNpyError::WrongDescriptor(_)))
    }
    macro_rules! attempt {
        ($t:ty, $v:ident) => {
            match npz.by_index::<ndarray::OwnedRepr<$t>, ndarray::IxDyn>(index) {
                Ok(a) => return Ok(Field::$v(to_arr(a))),
                Err(e) if wrong(&e) => e,
                Err(e) => return Err(e),
            }
        };
    }
    attempt!(f64, F64);
    attempt!(f32, F32);
    attempt!(i64, I64);
    attempt!(i32, I32);
    Ok(Field::U8(to_arr(
        npz.by_index::<ndarray::OwnedRepr<u8>, ndarray::IxDyn>(index)?,
    )))
}

/// The fields of a case file, taken out one by one with checks.
struct Fields {
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
    fn intervals(&mut self) -> Result<Vec<Interval>, CaseError> {
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
            .map(|(&first, &last)| Interval { first, last })
            .collect())
    }

    /// Dimension `dim` of a field's shape (checked to exist by `arr`).
    fn same_len(&self, name: &str, got: usize, want: usize, what: &str) -> Result<(), CaseError> {
        if got != want {
            return Err(self.err(name, format!("{got} elements, expected {want} ({what})")));
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
    fn shape(&self) -> &[usize] {
        match self {
            MapData::F64(a) => &a.shape,
            MapData::F32(a) => &a.shape,
            MapData::I64(a) => &a.shape,
            MapData::I32(a) => &a.shape,
        }
    }
}

/// The typed contents of a case, per kernel.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum CaseData {
    PointingDetector {
        focalplane: Arr<f64>,
        boresight: Arr<f64>,
        quat_index: Arr<i32>,
        quats_in: Arr<f64>,
        quats_out: Arr<f64>,
        shared_flags: Arr<u8>,
        shared_flag_mask: u8,
        intervals: Vec<Interval>,
    },
    PixelsHealpix {
        quat_index: Arr<i32>,
        quats: Arr<f64>,
        shared_flags: Arr<u8>,
        shared_flag_mask: u8,
        pixel_index: Arr<i32>,
        pixels_in: Arr<i64>,
        pixels_out: Arr<i64>,
        hit_submaps_in: Arr<u8>,
        hit_submaps_out: Arr<u8>,
        n_pix_submap: i64,
        nside: i64,
        nest: u8,
        intervals: Vec<Interval>,
    },
    StokesWeightsI {
        weight_index: Arr<i32>,
        weights_in: Arr<f64>,
        weights_out: Arr<f64>,
        cal: Arr<f64>,
        intervals: Vec<Interval>,
    },
    StokesWeightsIqu {
        quat_index: Arr<i32>,
        quats: Arr<f64>,
        weight_index: Arr<i32>,
        weights_in: Arr<f64>,
        weights_out: Arr<f64>,
        hwp: Arr<f64>,
        epsilon: Arr<f64>,
        gamma: Arr<f64>,
        cal: Arr<f64>,
        iau: u8,
        intervals: Vec<Interval>,
    },
    ScanMap {
        global2local: Arr<i64>,
        n_pix_submap: i64,
        mapdata: MapData,
        det_data_in: Arr<f64>,
        det_data_out: Arr<f64>,
        data_index: Arr<i32>,
        pixels: Arr<i64>,
        pixel_index: Arr<i32>,
        weights: Arr<f64>,
        weight_index: Arr<i32>,
        data_scale: f64,
        should_zero: u8,
        should_subtract: u8,
        should_scale: u8,
        intervals: Vec<Interval>,
    },
    BuildNoiseWeighted {
        global2local: Arr<i64>,
        zmap_in: Arr<f64>,
        zmap_out: Arr<f64>,
        pixel_index: Arr<i32>,
        pixels: Arr<i64>,
        weight_index: Arr<i32>,
        weights: Arr<f64>,
        data_index: Arr<i32>,
        det_data: Arr<f64>,
        flag_index: Arr<i32>,
        det_flags: Arr<u8>,
        det_scale: Arr<f64>,
        det_flag_mask: u8,
        shared_flags: Arr<u8>,
        shared_flag_mask: u8,
        intervals: Vec<Interval>,
    },
    NoiseWeight {
        det_data_in: Arr<f64>,
        det_data_out: Arr<f64>,
        data_index: Arr<i32>,
        detector_weights: Arr<f64>,
        intervals: Vec<Interval>,
    },
    TemplateOffsetAdd {
        step_length: i64,
        n_amp_views: Arr<i64>,
        amplitudes: Arr<f64>,
        amplitude_flags: Arr<u8>,
        call_data_index: Arr<i32>,
        call_amp_offset: Arr<i64>,
        det_data_in: Arr<f64>,
        det_data_out: Arr<f64>,
        intervals: Vec<Interval>,
    },
    TemplateOffsetProject {
        call_data_index: Arr<i32>,
        det_data: Arr<f64>,
        call_flag_index: Arr<i32>,
        flag_data: Arr<u8>,
        flag_mask: u8,
        step_length: i64,
        call_amp_offset: Arr<i64>,
        n_amp_views: Arr<i64>,
        amplitudes_in: Arr<f64>,
        amplitudes_out: Arr<f64>,
        amplitude_flags: Arr<u8>,
        intervals: Vec<Interval>,
    },
    TemplateOffsetPrecond {
        offset_var: Arr<f64>,
        amplitudes_in: Arr<f64>,
        amplitude_flags: Arr<u8>,
        amplitudes_out_in: Arr<f64>,
        amplitudes_out_out: Arr<f64>,
    },
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
            stem.len() >= n.len()
                && stem[..n.len()].eq_ignore_ascii_case(n)
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
    let read = |e: &dyn fmt::Display| CaseError::Read {
        file: file.clone(),
        reason: e.to_string(),
    };
    let f = File::open(path).map_err(|e| read(&e))?;
    let mut npz = NpzReader::new(f).map_err(|e| read(&e))?;
    let names = npz.names().map_err(|e| read(&e))?;
    let mut map = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let field = read_field(&mut npz, i).map_err(|e| CaseError::Field {
            file: file.clone(),
            field: n.clone(),
            problem: e.to_string(),
        })?;
        map.insert(n.clone(), field);
    }
    let mut fl = Fields {
        file: file.clone(),
        map,
    };
    let data = load_data(kernel, &mut fl)?;
    host_lengths(&data).map_err(|(field, problem)| fl.err(field, problem))?;
    Ok(Case {
        path: file,
        name,
        kernel,
        data,
    })
}

fn load_data(kernel: Kernel, f: &mut Fields) -> Result<CaseData, CaseError> {
    Ok(match kernel {
        Kernel::PointingDetector => {
            let quats_in = f.arr("quats_in", Some(3))?;
            let quats_out: Arr<f64> = f.arr("quats_out", Some(3))?;
            f.same_len(
                "quats_out",
                quats_out.data.len(),
                quats_in.data.len(),
                "as quats_in",
            )?;
            CaseData::PointingDetector {
                focalplane: f.arr("focalplane", Some(2))?,
                boresight: f.arr("boresight", Some(2))?,
                quat_index: f.arr("quat_index", Some(1))?,
                quats_in,
                quats_out,
                shared_flags: f.arr("shared_flags", Some(1))?,
                shared_flag_mask: f.scalar("shared_flag_mask")?,
                intervals: f.intervals()?,
            }
        }
        Kernel::PixelsHealpix => {
            let pixels_in = f.arr("pixels_in", Some(2))?;
            let pixels_out: Arr<i64> = f.arr("pixels_out", Some(2))?;
            f.same_len(
                "pixels_out",
                pixels_out.data.len(),
                pixels_in.data.len(),
                "as pixels_in",
            )?;
            let hit_submaps_in = f.arr("hit_submaps_in", Some(1))?;
            let hit_submaps_out: Arr<u8> = f.arr("hit_submaps_out", Some(1))?;
            f.same_len(
                "hit_submaps_out",
                hit_submaps_out.data.len(),
                hit_submaps_in.data.len(),
                "as hit_submaps_in",
            )?;
            CaseData::PixelsHealpix {
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
            }
        }
        Kernel::StokesWeightsI => {
            let weights_in = f.arr("weights_in", Some(2))?;
            let weights_out: Arr<f64> = f.arr("weights_out", Some(2))?;
            f.same_len(
                "weights_out",
                weights_out.data.len(),
                weights_in.data.len(),
                "as weights_in",
            )?;
            CaseData::StokesWeightsI {
                weight_index: f.arr("weight_index", Some(1))?,
                weights_in,
                weights_out,
                cal: f.arr("cal", Some(1))?,
                intervals: f.intervals()?,
            }
        }
        Kernel::StokesWeightsIqu => {
            let weights_in = f.arr("weights_in", Some(3))?;
            let weights_out: Arr<f64> = f.arr("weights_out", Some(3))?;
            f.same_len(
                "weights_out",
                weights_out.data.len(),
                weights_in.data.len(),
                "as weights_in",
            )?;
            CaseData::StokesWeightsIqu {
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
            }
        }
        Kernel::ScanMap => {
            let det_data_in = f.arr("det_data_in", Some(2))?;
            let det_data_out: Arr<f64> = f.arr("det_data_out", Some(2))?;
            f.same_len(
                "det_data_out",
                det_data_out.data.len(),
                det_data_in.data.len(),
                "as det_data_in",
            )?;
            let weights: Arr<f64> = f.arr("weights", None)?;
            if !(2..=3).contains(&weights.shape.len()) {
                return Err(f.err(
                    "weights",
                    format!("shape {:?}, expected 2 or 3 dimensions", weights.shape),
                ));
            }
            CaseData::ScanMap {
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
            }
        }
        Kernel::BuildNoiseWeighted => {
            let zmap_in = f.arr("zmap_in", Some(3))?;
            let zmap_out: Arr<f64> = f.arr("zmap_out", Some(3))?;
            f.same_len(
                "zmap_out",
                zmap_out.data.len(),
                zmap_in.data.len(),
                "as zmap_in",
            )?;
            let weights: Arr<f64> = f.arr("weights", None)?;
            if !(2..=3).contains(&weights.shape.len()) {
                return Err(f.err(
                    "weights",
                    format!("shape {:?}, expected 2 or 3 dimensions", weights.shape),
                ));
            }
            CaseData::BuildNoiseWeighted {
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
            }
        }
        Kernel::NoiseWeight => {
            let det_data_in = f.arr("det_data_in", Some(2))?;
            let det_data_out: Arr<f64> = f.arr("det_data_out", Some(2))?;
            f.same_len(
                "det_data_out",
                det_data_out.data.len(),
                det_data_in.data.len(),
                "as det_data_in",
            )?;
            CaseData::NoiseWeight {
                det_data_in,
                det_data_out,
                data_index: f.arr("data_index", Some(1))?,
                detector_weights: f.arr("detector_weights", Some(1))?,
                intervals: f.intervals()?,
            }
        }
        Kernel::TemplateOffsetAddToSignal => {
            let det_data_in = f.arr("det_data_in", Some(2))?;
            let det_data_out: Arr<f64> = f.arr("det_data_out", Some(2))?;
            f.same_len(
                "det_data_out",
                det_data_out.data.len(),
                det_data_in.data.len(),
                "as det_data_in",
            )?;
            let call_data_index: Arr<i32> = f.arr("call_data_index", Some(1))?;
            let call_amp_offset: Arr<i64> = f.arr("call_amp_offset", Some(1))?;
            f.same_len(
                "call_amp_offset",
                call_amp_offset.data.len(),
                call_data_index.data.len(),
                "one per call, as call_data_index",
            )?;
            CaseData::TemplateOffsetAdd {
                step_length: f.scalar("step_length")?,
                n_amp_views: f.arr("n_amp_views", Some(1))?,
                amplitudes: f.arr("amplitudes", Some(1))?,
                amplitude_flags: f.arr("amplitude_flags", Some(1))?,
                call_data_index,
                call_amp_offset,
                det_data_in,
                det_data_out,
                intervals: f.intervals()?,
            }
        }
        Kernel::TemplateOffsetProjectSignal => {
            let amplitudes_in = f.arr("amplitudes_in", Some(1))?;
            let amplitudes_out: Arr<f64> = f.arr("amplitudes_out", Some(1))?;
            f.same_len(
                "amplitudes_out",
                amplitudes_out.data.len(),
                amplitudes_in.data.len(),
                "as amplitudes_in",
            )?;
            let call_data_index: Arr<i32> = f.arr("call_data_index", Some(1))?;
            let call_amp_offset: Arr<i64> = f.arr("call_amp_offset", Some(1))?;
            let call_flag_index: Arr<i32> = f.arr("call_flag_index", Some(1))?;
            let n_call = call_data_index.data.len();
            f.same_len(
                "call_amp_offset",
                call_amp_offset.data.len(),
                n_call,
                "one per call",
            )?;
            f.same_len(
                "call_flag_index",
                call_flag_index.data.len(),
                n_call,
                "one per call",
            )?;
            CaseData::TemplateOffsetProject {
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
            }
        }
        Kernel::TemplateOffsetApplyDiagPrecond => {
            let amplitudes_out_in = f.arr("amplitudes_out_in", Some(1))?;
            let amplitudes_out_out: Arr<f64> = f.arr("amplitudes_out_out", Some(1))?;
            f.same_len(
                "amplitudes_out_out",
                amplitudes_out_out.data.len(),
                amplitudes_out_in.data.len(),
                "as amplitudes_out_in",
            )?;
            CaseData::TemplateOffsetPrecond {
                offset_var: f.arr("offset_var", Some(1))?,
                amplitudes_in: f.arr("amplitudes_in", Some(1))?,
                amplitude_flags: f.arr("amplitude_flags", Some(1))?,
                amplitudes_out_in,
                amplitudes_out_out,
            }
        }
    })
}

/// Check the arrays passed as plain host pointers (whose length the kernel
/// infers from `n_det` or the number of intervals) are long enough, so a
/// malformed case cannot make a plugin read past them.
fn host_lengths(data: &CaseData) -> Result<(), (&'static str, String)> {
    fn need<T>(
        name: &'static str,
        a: &Arr<T>,
        n: usize,
        what: &str,
    ) -> Result<(), (&'static str, String)> {
        if a.data.len() != n {
            return Err((
                name,
                format!("shape {:?}, expected {n} elements ({what})", a.shape),
            ));
        }
        Ok(())
    }
    let per_det = "one per detector, as the index arrays";
    match data {
        CaseData::PointingDetector {
            focalplane,
            quat_index,
            ..
        } => need(
            "focalplane",
            focalplane,
            4 * quat_index.data.len(),
            "[n_det, 4]",
        ),
        CaseData::PixelsHealpix {
            quat_index,
            pixel_index,
            ..
        } => need("pixel_index", pixel_index, quat_index.data.len(), per_det),
        CaseData::StokesWeightsI {
            weight_index, cal, ..
        } => need("cal", cal, weight_index.data.len(), per_det),
        CaseData::StokesWeightsIqu {
            quat_index,
            weight_index,
            epsilon,
            gamma,
            cal,
            ..
        } => {
            let n = quat_index.data.len();
            need("weight_index", weight_index, n, per_det)?;
            need("epsilon", epsilon, n, per_det)?;
            need("gamma", gamma, n, per_det)?;
            need("cal", cal, n, per_det)
        }
        CaseData::ScanMap {
            pixel_index,
            weight_index,
            data_index,
            ..
        } => {
            let n = pixel_index.data.len();
            need("weight_index", weight_index, n, per_det)?;
            need("data_index", data_index, n, per_det)
        }
        CaseData::BuildNoiseWeighted {
            pixel_index,
            weight_index,
            data_index,
            flag_index,
            det_scale,
            ..
        } => {
            let n = pixel_index.data.len();
            need("weight_index", weight_index, n, per_det)?;
            need("data_index", data_index, n, per_det)?;
            need("flag_index", flag_index, n, per_det)?;
            need("det_scale", det_scale, n, per_det)
        }
        CaseData::NoiseWeight {
            data_index,
            detector_weights,
            ..
        } => need(
            "detector_weights",
            detector_weights,
            data_index.data.len(),
            per_det,
        ),
        CaseData::TemplateOffsetAdd {
            n_amp_views,
            intervals,
            ..
        }
        | CaseData::TemplateOffsetProject {
            n_amp_views,
            intervals,
            ..
        } => need(
            "n_amp_views",
            n_amp_views,
            intervals.len(),
            "one per interval",
        ),
        CaseData::TemplateOffsetPrecond { .. } => Ok(()),
    }
}

// ---------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------

/// Exact comparison of one element type.
trait Exact: Copy {
    fn same(a: Self, b: Self) -> bool;
    fn diff(a: Self, b: Self) -> f64;
}

impl Exact for f64 {
    fn same(a: f64, b: f64) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }
    fn diff(a: f64, b: f64) -> f64 {
        if a.is_nan() != b.is_nan() {
            f64::INFINITY
        } else {
            (a - b).abs()
        }
    }
}
impl Exact for i64 {
    fn same(a: i64, b: i64) -> bool {
        a == b
    }
    fn diff(a: i64, b: i64) -> f64 {
        (a as f64 - b as f64).abs()
    }
}
impl Exact for u8 {
    fn same(a: u8, b: u8) -> bool {
        a == b
    }
    fn diff(a: u8, b: u8) -> f64 {
        (a as f64 - b as f64).abs()
    }
}

/// Compare `got` with `want`; `None` when identical.
fn compare<T: Exact>(field: &str, got: &[T], want: &[T]) -> Option<CaseOutcome> {
    let mut n_diff = 0;
    let mut first = None;
    let mut max = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !T::same(g, w) {
            n_diff += 1;
            first.get_or_insert(i);
            let d = T::diff(g, w);
            if d > max || d.is_nan() {
                max = d;
            }
        }
    }
    if got.len() != want.len() {
        n_diff += got.len().abs_diff(want.len());
        first.get_or_insert(got.len().min(want.len()));
        max = f64::INFINITY;
    }
    first.map(|i| CaseOutcome::Fail {
        field: field.to_string(),
        max_abs_diff: max,
        n_diff,
        first_diff_index: i,
    })
}

/// The first failing comparison, else the first tolerant pass, else Pass.
fn verdict(results: impl IntoIterator<Item = Option<CaseOutcome>>) -> CaseOutcome {
    let mut tolerant = None;
    for r in results.into_iter().flatten() {
        if matches!(r, CaseOutcome::PassTolerant { .. }) {
            tolerant.get_or_insert(r);
        } else {
            return r;
        }
    }
    tolerant.unwrap_or(CaseOutcome::Pass)
}

/// The norm-wise relative tolerance of [`Comparison::Tolerant`] for outputs
/// of the device's trigonometry (`stokes_weights_IQU` weights).
pub const TRIG_RTOL: f64 = 1e-14;
/// The norm-wise relative tolerance of [`Comparison::Tolerant`] for atomic
/// accumulations (`build_noise_weighted` zmap).
pub const ACCUM_RTOL: f64 = 1e-13;

/// How outputs are compared with TOAST's (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    /// Bit for bit (two NaNs match).
    Exact,
    /// Exact, except `stokes_weights_IQU` weights within [`TRIG_RTOL`] and
    /// `build_noise_weighted` zmap within [`ACCUM_RTOL`], norm-wise, with
    /// identical NaN patterns.
    Tolerant,
}

impl Comparison {
    /// Exact for a host-addressable backend (the CPU class, which claims
    /// bit-exactness), tolerant for a device backend.
    pub fn for_backend(b: &Backend) -> Self {
        if b.host_addressable() {
            Comparison::Exact
        } else {
            Comparison::Tolerant
        }
    }

    /// A one-line description, for reports.
    pub fn describe(self) -> String {
        match self {
            Comparison::Exact => "exact (bit for bit; NaN matches NaN)".to_string(),
            Comparison::Tolerant => format!(
                "tolerant (device backend: stokes_weights_IQU weights within {TRIG_RTOL:e} and build_noise_weighted zmap within {ACCUM_RTOL:e} x max|want|, same NaN/inf pattern; all other outputs exact)"
            ),
        }
    }

    /// Compare a float field that the tolerant mode relaxes.
    fn float(self, field: &str, got: &[f64], want: &[f64], rtol: f64) -> Option<CaseOutcome> {
        let exact = compare(field, got, want);
        if self == Comparison::Exact || exact.is_none() || got.len() != want.len() {
            return exact;
        }
        let scale = want
            .iter()
            .filter(|w| w.is_finite())
            .fold(0.0f64, |m, w| m.max(w.abs()));
        let tol = rtol * scale;
        let mut n_diff = 0;
        let mut max_rel = 0.0f64;
        for (&g, &w) in got.iter().zip(want) {
            if <f64 as Exact>::same(g, w) {
                continue;
            }
            let d = (g - w).abs();
            if !(g.is_finite() && w.is_finite()) || d > tol {
                return exact;
            }
            n_diff += 1;
            max_rel = max_rel.max(d / scale);
        }
        Some(CaseOutcome::PassTolerant {
            field: field.to_string(),
            n_diff,
            max_rel_diff: max_rel,
        })
    }
}

// ---------------------------------------------------------------------------
// Running.
// ---------------------------------------------------------------------------

fn ivs(iv: &[Interval]) -> Intervals {
    Intervals {
        ptr: if iv.is_empty() {
            std::ptr::null()
        } else {
            iv.as_ptr()
        },
        len: iv.len() as u64,
    }
}

/// Present when `a` has exactly `n` elements, absent otherwise (TOAST's
/// "disabled by length" convention).
fn if_len<T>(a: &[T], n: usize) -> &[T] {
    if a.len() == n {
        a
    } else {
        &[]
    }
}

fn stage_in<'a, T: Element>(
    b: &'a Backend,
    data: &'a [T],
    name: &str,
) -> Result<ArrayArg<'a>, AccelError> {
    ArrayArg::input(b, data, name)
}

fn stage_out<'a, T: Element>(
    b: &'a Backend,
    data: &'a mut [T],
    name: &str,
) -> Result<ArrayArg<'a>, AccelError> {
    ArrayArg::output(b, data, name)
}

/// Launch and turn the result into an outcome-or-continue.
///
/// # Safety
/// As [`Backend::launch`].
unsafe fn launch<A: KernelArgs>(b: &Backend, args: &A) -> Result<(), CaseOutcome> {
    // SAFETY: forwarded contract.
    match unsafe { b.launch(args) } {
        Ok(()) => Ok(()),
        Err(AccelError::Unsupported { backend, kernel }) => Err(CaseOutcome::Skipped {
            reason: format!("backend `{backend}` does not implement kernel `{kernel}`"),
        }),
        Err(e) => Err(CaseOutcome::Error {
            message: e.to_string(),
        }),
    }
}

fn finish(args: Vec<ArrayArg<'_>>) -> Result<(), CaseOutcome> {
    for a in args {
        a.finish().map_err(|e| CaseOutcome::Error {
            message: e.to_string(),
        })?;
    }
    Ok(())
}

fn staging_error(e: AccelError) -> CaseOutcome {
    CaseOutcome::Error {
        message: format!("staging an array failed: {e}"),
    }
}

/// Run one case on `backend` and compare its outputs with TOAST's, in the
/// backend's default [`Comparison`] ([`Comparison::for_backend`]).
pub fn run_case(backend: &Backend, case: &Case) -> CaseOutcome {
    run_case_with(backend, case, Comparison::for_backend(backend))
}

/// [`run_case`] with an explicit comparison mode.
pub fn run_case_with(backend: &Backend, case: &Case, cmp: Comparison) -> CaseOutcome {
    if !backend.supports(case.kernel) {
        return CaseOutcome::Skipped {
            reason: format!(
                "backend `{}` does not implement kernel `{}`",
                backend.name(),
                case.kernel
            ),
        };
    }
    match run_inner(backend, &case.data, cmp) {
        Ok(o) | Err(o) => o,
    }
}

/// Second dimension of a shape, or 0.
fn dim(shape: &[usize], i: usize) -> usize {
    shape.get(i).copied().unwrap_or(0)
}

fn run_inner(b: &Backend, data: &CaseData, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
    let se = staging_error;
    match data {
        CaseData::PointingDetector {
            focalplane,
            boresight,
            quat_index,
            quats_in,
            quats_out,
            shared_flags,
            shared_flag_mask,
            intervals,
        } => {
            let n_samp = dim(&quats_in.shape, 1);
            let mut quats = quats_in.data.clone();
            {
                let bo = stage_in(b, &boresight.data, "boresight").map_err(se)?;
                let fl =
                    stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags").map_err(se)?;
                let q = stage_out(b, &mut quats, "quats").map_err(se)?;
                let args = abi::PointingDetectorArgs {
                    n_det: quat_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    quat_index: quat_index.data.as_ptr(),
                    focalplane: focalplane.data.as_ptr(),
                    intervals: ivs(intervals),
                    boresight: bo.abi(),
                    shared_flags: fl.abi(),
                    shared_flag_mask: *shared_flag_mask,
                    reserved: [0; 7],
                    quats: q.abi(),
                };
                // SAFETY: every pointer is a live host array (or staged
                // buffer) of the length the struct declares.
                unsafe { launch(b, &args)? };
                finish(vec![q, bo, fl])?;
            }
            Ok(verdict([compare("quats", &quats, &quats_out.data)]))
        }
        CaseData::PixelsHealpix {
            quat_index,
            quats,
            shared_flags,
            shared_flag_mask,
            pixel_index,
            pixels_in,
            pixels_out,
            hit_submaps_in,
            hit_submaps_out,
            n_pix_submap,
            nside,
            nest,
            intervals,
        } => {
            let n_samp = dim(&pixels_in.shape, 1);
            let mut pixels = pixels_in.data.clone();
            let mut hits = hit_submaps_in.data.clone();
            {
                let q = stage_in(b, &quats.data, "quats").map_err(se)?;
                let fl =
                    stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags").map_err(se)?;
                let p = stage_out(b, &mut pixels, "pixels").map_err(se)?;
                let h = stage_out(b, &mut hits, "hit_submaps").map_err(se)?;
                let args = abi::PixelsHealpixArgs {
                    n_det: quat_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    quat_index: quat_index.data.as_ptr(),
                    pixel_index: pixel_index.data.as_ptr(),
                    intervals: ivs(intervals),
                    quats: q.abi(),
                    shared_flags: fl.abi(),
                    pixels: p.abi(),
                    hit_submaps: h.abi(),
                    nside: *nside,
                    n_pix_submap: *n_pix_submap,
                    shared_flag_mask: *shared_flag_mask,
                    nest: *nest,
                    reserved: [0; 6],
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![p, h, q, fl])?;
            }
            Ok(verdict([
                compare("pixels", &pixels, &pixels_out.data),
                compare("hit_submaps", &hits, &hit_submaps_out.data),
            ]))
        }
        CaseData::StokesWeightsI {
            weight_index,
            weights_in,
            weights_out,
            cal,
            intervals,
        } => {
            let n_samp = dim(&weights_in.shape, 1);
            let mut weights = weights_in.data.clone();
            {
                let w = stage_out(b, &mut weights, "weights").map_err(se)?;
                let args = abi::StokesWeightsIArgs {
                    n_det: weight_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    weight_index: weight_index.data.as_ptr(),
                    cal: cal.data.as_ptr(),
                    intervals: ivs(intervals),
                    weights: w.abi(),
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![w])?;
            }
            Ok(verdict([compare("weights", &weights, &weights_out.data)]))
        }
        CaseData::StokesWeightsIqu {
            quat_index,
            quats,
            weight_index,
            weights_in,
            weights_out,
            hwp,
            epsilon,
            gamma,
            cal,
            iau,
            intervals,
        } => {
            let n_samp = dim(&weights_in.shape, 1);
            let mut weights = weights_in.data.clone();
            {
                let q = stage_in(b, &quats.data, "quats").map_err(se)?;
                let h = stage_in(b, if_len(&hwp.data, n_samp), "hwp").map_err(se)?;
                let w = stage_out(b, &mut weights, "weights").map_err(se)?;
                let args = abi::StokesWeightsIquArgs {
                    n_det: quat_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    quat_index: quat_index.data.as_ptr(),
                    weight_index: weight_index.data.as_ptr(),
                    epsilon: epsilon.data.as_ptr(),
                    gamma: gamma.data.as_ptr(),
                    cal: cal.data.as_ptr(),
                    intervals: ivs(intervals),
                    quats: q.abi(),
                    hwp: h.abi(),
                    weights: w.abi(),
                    iau: *iau,
                    reserved: [0; 7],
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![w, q, h])?;
            }
            Ok(verdict([cmp.float(
                "weights",
                &weights,
                &weights_out.data,
                TRIG_RTOL,
            )]))
        }
        CaseData::ScanMap {
            global2local,
            n_pix_submap,
            mapdata,
            det_data_in,
            det_data_out,
            data_index,
            pixels,
            pixel_index,
            weights,
            weight_index,
            data_scale,
            should_zero,
            should_subtract,
            should_scale,
            intervals,
        } => {
            let n_samp = dim(&pixels.shape, 1);
            let nnz = if weights.shape.len() == 3 {
                dim(&weights.shape, 2)
            } else {
                1
            };
            let mut det_data = det_data_in.data.clone();
            {
                let g = stage_in(b, &global2local.data, "global2local").map_err(se)?;
                let (m, dtype) = match mapdata {
                    MapData::F64(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_F64),
                    MapData::F32(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_F32),
                    MapData::I64(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_I64),
                    MapData::I32(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_I32),
                };
                let m = m.map_err(se)?;
                let p = stage_in(b, &pixels.data, "pixels").map_err(se)?;
                let w = stage_in(b, &weights.data, "weights").map_err(se)?;
                let d = stage_out(b, &mut det_data, "det_data").map_err(se)?;
                let args = abi::ScanMapArgs {
                    n_det: pixel_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    nnz: nnz as u64,
                    pixel_index: pixel_index.data.as_ptr(),
                    weight_index: weight_index.data.as_ptr(),
                    data_index: data_index.data.as_ptr(),
                    intervals: ivs(intervals),
                    global2local: g.abi(),
                    n_pix_submap: *n_pix_submap,
                    map_dtype: dtype,
                    reserved0: 0,
                    mapdata: m.abi(),
                    pixels: p.abi(),
                    weights: w.abi(),
                    det_data: d.abi(),
                    data_scale: *data_scale,
                    should_zero: *should_zero,
                    should_subtract: *should_subtract,
                    should_scale: *should_scale,
                    reserved: [0; 5],
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![d, g, m, p, w])?;
            }
            Ok(verdict([compare(
                "det_data",
                &det_data,
                &det_data_out.data,
            )]))
        }
        CaseData::BuildNoiseWeighted {
            global2local,
            zmap_in,
            zmap_out,
            pixel_index,
            pixels,
            weight_index,
            weights,
            data_index,
            det_data,
            flag_index,
            det_flags,
            det_scale,
            det_flag_mask,
            shared_flags,
            shared_flag_mask,
            intervals,
        } => {
            let n_samp = dim(&pixels.shape, 1);
            let nnz = if weights.shape.len() == 3 {
                dim(&weights.shape, 2)
            } else {
                1
            };
            // TOAST uses det_flags only when its second dimension is n_samp.
            let det_flags_used: &[u8] = if dim(&det_flags.shape, 1) == n_samp {
                &det_flags.data
            } else {
                &[]
            };
            let mut zmap = zmap_in.data.clone();
            {
                let g = stage_in(b, &global2local.data, "global2local").map_err(se)?;
                let p = stage_in(b, &pixels.data, "pixels").map_err(se)?;
                let w = stage_in(b, &weights.data, "weights").map_err(se)?;
                let d = stage_in(b, &det_data.data, "det_data").map_err(se)?;
                let df = stage_in(b, det_flags_used, "det_flags").map_err(se)?;
                let sf =
                    stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags").map_err(se)?;
                let z = stage_out(b, &mut zmap, "zmap").map_err(se)?;
                let args = abi::BuildNoiseWeightedArgs {
                    n_det: pixel_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    nnz: nnz as u64,
                    pixel_index: pixel_index.data.as_ptr(),
                    weight_index: weight_index.data.as_ptr(),
                    data_index: data_index.data.as_ptr(),
                    flag_index: flag_index.data.as_ptr(),
                    det_scale: det_scale.data.as_ptr(),
                    intervals: ivs(intervals),
                    global2local: g.abi(),
                    // TOAST takes n_pix_submap from the shape of zmap.
                    n_pix_submap: dim(&zmap_in.shape, 1) as i64,
                    pixels: p.abi(),
                    weights: w.abi(),
                    det_data: d.abi(),
                    det_flags: df.abi(),
                    shared_flags: sf.abi(),
                    zmap: z.abi(),
                    det_flag_mask: *det_flag_mask,
                    shared_flag_mask: *shared_flag_mask,
                    reserved: [0; 6],
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![z, g, p, w, d, df, sf])?;
            }
            Ok(verdict([cmp.float(
                "zmap",
                &zmap,
                &zmap_out.data,
                ACCUM_RTOL,
            )]))
        }
        CaseData::NoiseWeight {
            det_data_in,
            det_data_out,
            data_index,
            detector_weights,
            intervals,
        } => {
            let n_samp = dim(&det_data_in.shape, 1);
            let mut det_data = det_data_in.data.clone();
            {
                let d = stage_out(b, &mut det_data, "det_data").map_err(se)?;
                let args = abi::NoiseWeightArgs {
                    n_det: data_index.data.len() as u64,
                    n_samp: n_samp as u64,
                    data_index: data_index.data.as_ptr(),
                    detector_weights: detector_weights.data.as_ptr(),
                    intervals: ivs(intervals),
                    det_data: d.abi(),
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![d])?;
            }
            Ok(verdict([compare(
                "det_data",
                &det_data,
                &det_data_out.data,
            )]))
        }
        CaseData::TemplateOffsetAdd {
            step_length,
            n_amp_views,
            amplitudes,
            amplitude_flags,
            call_data_index,
            call_amp_offset,
            det_data_in,
            det_data_out,
            intervals,
        } => {
            let n_samp = dim(&det_data_in.shape, 1);
            let mut det_data = det_data_in.data.clone();
            for c in 0..call_data_index.data.len() {
                let a = stage_in(b, &amplitudes.data, "amplitudes").map_err(se)?;
                let f = stage_in(b, &amplitude_flags.data, "amplitude_flags").map_err(se)?;
                let d = stage_out(b, &mut det_data, "det_data").map_err(se)?;
                let args = abi::TemplateOffsetAddArgs {
                    n_det: 1,
                    n_samp: n_samp as u64,
                    data_index: &call_data_index.data[c],
                    layout: abi::OffsetLayout {
                        step_length: *step_length,
                        n_amp_views: n_amp_views.data.as_ptr(),
                        amp_offset: &call_amp_offset.data[c],
                    },
                    intervals: ivs(intervals),
                    amplitudes: a.abi(),
                    amplitude_flags: f.abi(),
                    det_data: d.abi(),
                };
                // SAFETY: as above (n_amp_views has one entry per interval,
                // checked at load).
                unsafe { launch(b, &args)? };
                finish(vec![d, a, f])?;
            }
            Ok(verdict([compare(
                "det_data",
                &det_data,
                &det_data_out.data,
            )]))
        }
        CaseData::TemplateOffsetProject {
            call_data_index,
            det_data,
            call_flag_index,
            flag_data,
            flag_mask,
            step_length,
            call_amp_offset,
            n_amp_views,
            amplitudes_in,
            amplitudes_out,
            amplitude_flags,
            intervals,
        } => {
            let n_samp = dim(&det_data.shape, 1);
            // TOAST reads flag_data only for flag_index >= 0, as [*, n_samp].
            let flags_used: &[u8] =
                if flag_data.shape.len() == 2 && dim(&flag_data.shape, 1) == n_samp {
                    &flag_data.data
                } else {
                    &[]
                };
            let mut amps = amplitudes_in.data.clone();
            for c in 0..call_data_index.data.len() {
                let d = stage_in(b, &det_data.data, "det_data").map_err(se)?;
                let fd = stage_in(b, flags_used, "flag_data").map_err(se)?;
                let f = stage_in(b, &amplitude_flags.data, "amplitude_flags").map_err(se)?;
                let a = stage_out(b, &mut amps, "amplitudes").map_err(se)?;
                let args = abi::TemplateOffsetProjectArgs {
                    n_det: 1,
                    n_samp: n_samp as u64,
                    data_index: &call_data_index.data[c],
                    flag_index: &call_flag_index.data[c],
                    layout: abi::OffsetLayout {
                        step_length: *step_length,
                        n_amp_views: n_amp_views.data.as_ptr(),
                        amp_offset: &call_amp_offset.data[c],
                    },
                    intervals: ivs(intervals),
                    det_data: d.abi(),
                    flag_data: fd.abi(),
                    amplitudes: a.abi(),
                    amplitude_flags: f.abi(),
                    flag_mask: *flag_mask,
                    reserved: [0; 7],
                };
                // SAFETY: as above (n_amp_views has one entry per interval,
                // checked at load).
                unsafe { launch(b, &args)? };
                finish(vec![a, d, fd, f])?;
            }
            Ok(verdict([compare(
                "amplitudes",
                &amps,
                &amplitudes_out.data,
            )]))
        }
        CaseData::TemplateOffsetPrecond {
            offset_var,
            amplitudes_in,
            amplitude_flags,
            amplitudes_out_in,
            amplitudes_out_out,
        } => {
            let mut out = amplitudes_out_in.data.clone();
            {
                let v = stage_in(b, &offset_var.data, "offset_var").map_err(se)?;
                let i = stage_in(b, &amplitudes_in.data, "amplitudes_in").map_err(se)?;
                let f = stage_in(b, &amplitude_flags.data, "amplitude_flags").map_err(se)?;
                let o = stage_out(b, &mut out, "amplitudes_out").map_err(se)?;
                let args = abi::TemplateOffsetPrecondArgs {
                    n_amp: amplitudes_in.data.len() as u64,
                    offset_var: v.abi(),
                    amplitudes_in: i.abi(),
                    amplitude_flags: f.abi(),
                    amplitudes_out: o.abi(),
                };
                // SAFETY: as above.
                unsafe { launch(b, &args)? };
                finish(vec![o, v, i, f])?;
            }
            Ok(verdict([compare(
                "amplitudes_out",
                &out,
                &amplitudes_out_out.data,
            )]))
        }
    }
}

/// Run every `.npz` case of `dir`, sorted by file name, in the backend's
/// default [`Comparison`].
pub fn run_dir(backend: &Backend, dir: &Path) -> Vec<(PathBuf, Result<CaseOutcome, CaseError>)> {
    run_dir_with(backend, dir, Comparison::for_backend(backend))
}

/// [`run_dir`] with an explicit comparison mode.
pub fn run_dir_with(
    backend: &Backend,
    dir: &Path,
    cmp: Comparison,
) -> Vec<(PathBuf, Result<CaseOutcome, CaseError>)> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "npz") && p.is_file())
            .collect(),
        Err(e) => {
            return vec![(
                dir.to_path_buf(),
                Err(CaseError::Read {
                    file: dir.to_path_buf(),
                    reason: format!("cannot list the directory: {e}"),
                }),
            )]
        }
    };
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    files
        .into_iter()
        .map(|p| {
            let r = load_case(&p).map(|c| run_case_with(backend, &c, cmp));
            (p, r)
        })
        .collect()
}

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
        let mut w = ndarray_npy::NpzWriter::new(File::create(&p).unwrap());
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
    fn short_per_detector_array_names_the_field() {
        let p = tmp("noise_weight_short2.npz", b"");
        let mut w = ndarray_npy::NpzWriter::new(File::create(&p).unwrap());
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

    #[test]
    fn comparison_is_bitwise_with_nan_equal() {
        assert!(compare("x", &[1.0, f64::NAN], &[1.0, f64::NAN]).is_none());
        let f = compare("x", &[0.0, 1.0, 3.0], &[-0.0, 1.0, 2.5]).unwrap();
        assert_eq!(
            f,
            CaseOutcome::Fail {
                field: "x".into(),
                max_abs_diff: 0.5,
                n_diff: 2,
                first_diff_index: 0
            }
        );
        let f = compare("x", &[f64::NAN], &[1.0]).unwrap();
        assert!(matches!(f, CaseOutcome::Fail { max_abs_diff, .. } if max_abs_diff.is_infinite()));
    }

    #[test]
    fn tolerant_comparison_is_normwise_keeps_nan_patterns_and_reports() {
        let want = [1.0, 1e-17, f64::NAN, -2.0];
        // Exact mode: any bit difference fails.
        let got = [1.0 + 2e-16, 3e-17, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Exact.float("w", &got, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { n_diff: 2, .. })
        ));
        // Tolerant: both within 1e-14 x max|want| = 2e-14, reported.
        match Comparison::Tolerant.float("w", &got, &want, TRIG_RTOL) {
            Some(CaseOutcome::PassTolerant {
                n_diff,
                max_rel_diff,
                ..
            }) => {
                assert_eq!(n_diff, 2);
                assert!(max_rel_diff > 0.0 && max_rel_diff < TRIG_RTOL);
            }
            o => panic!("{o:?}"),
        }
        // Identical: a plain pass (None).
        assert!(Comparison::Tolerant
            .float("w", &want, &want, TRIG_RTOL)
            .is_none());
        // Beyond the tolerance, or a NaN where TOAST has a number: failure.
        let far = [1.0 + 1e-12, 1e-17, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Tolerant.float("w", &far, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { .. })
        ));
        let nan = [1.0, f64::NAN, f64::NAN, -2.0];
        assert!(matches!(
            Comparison::Tolerant.float("w", &nan, &want, TRIG_RTOL),
            Some(CaseOutcome::Fail { .. })
        ));
        // A tolerant pass never hides a failure of another field.
        let v = verdict([
            Comparison::Tolerant.float("w", &got, &want, TRIG_RTOL),
            compare("p", &[1i64], &[2i64]),
        ]);
        assert!(matches!(v, CaseOutcome::Fail { ref field, .. } if field == "p"));
        assert!(!v.is_pass());
    }
}
