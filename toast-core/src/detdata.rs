//! Per-detector data: one contiguous row-major block per field.
//!
//! A field of element type `T` and per-sample shape `S` over `n_det`
//! detectors is one `Vec<T>` of `n_det * n_samples * prod(S)` elements laid
//! out as `[n_det, n_samples, ...S]`. Detector `i` is row `i`; the kernels'
//! `data_index` arrays are indices of these rows, and a device mirror of the
//! field is a single buffer copied in one transfer.

use crate::dtype::{Column, DType, Element};
use crate::error::{Category, DataError};
use std::collections::HashMap;
use std::sync::Arc;

/// What [`DetDataManager::create`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// A new zeroed field was allocated.
    New,
    /// An identical field (same type, shape, and a superset of the detectors)
    /// already existed; it was left as it was.
    Existing,
}

/// One per-detector field.
#[derive(Debug, Clone, PartialEq)]
pub struct DetData {
    observation: Arc<str>,
    name: String,
    sample_shape: Vec<usize>,
    n_samples: usize,
    detectors: Vec<String>,
    index: HashMap<String, usize>,
    units: String,
    data: Column,
}

fn elements_per_sample(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl DetData {
    fn new(
        observation: Arc<str>,
        name: &str,
        dtype: DType,
        sample_shape: &[usize],
        n_samples: usize,
        detectors: Vec<String>,
    ) -> Result<Self, DataError> {
        let index = detectors
            .iter()
            .enumerate()
            .map(|(i, d)| (d.clone(), i))
            .collect();
        let elements = (detectors.len() as u128)
            * (n_samples as u128)
            * (elements_per_sample(sample_shape) as u128);
        let data = usize::try_from(elements)
            .ok()
            .and_then(|len| Column::try_zeros(dtype, len))
            .ok_or_else(|| DataError::OutOfMemory {
                observation: observation.to_string(),
                category: Category::DetData,
                field: name.to_string(),
                bytes: u64::try_from(elements * dtype.size() as u128).unwrap_or(u64::MAX),
            })?;
        Ok(DetData {
            observation,
            name: name.to_string(),
            sample_shape: sample_shape.to_vec(),
            n_samples,
            detectors,
            index,
            units: String::new(),
            data,
        })
    }

    /// Field name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Shape of one sample (`[]` for a scalar per sample, `[3]` for IQU weights).
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    /// Full shape `[n_det, n_samples, ...sample_shape]`.
    pub fn shape(&self) -> Vec<usize> {
        let mut s = vec![self.detectors.len(), self.n_samples];
        s.extend_from_slice(&self.sample_shape);
        s
    }

    /// Samples per detector.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }

    /// Detectors (rows), in row order.
    pub fn detectors(&self) -> &[String] {
        &self.detectors
    }

    /// Number of rows.
    pub fn n_det(&self) -> usize {
        self.detectors.len()
    }

    /// Row of a detector.
    pub fn row_index(&self, det: &str) -> Option<usize> {
        self.index.get(det).copied()
    }

    /// Elements in one row (`n_samples * prod(sample_shape)`).
    pub fn row_len(&self) -> usize {
        self.n_samples * elements_per_sample(&self.sample_shape)
    }

    /// Units (free text, `K` for a calibrated signal).
    pub fn units(&self) -> &str {
        &self.units
    }

    /// Set the units.
    pub fn set_units(&mut self, units: impl Into<String>) {
        self.units = units.into();
    }

    fn type_error(&self, expected: DType) -> DataError {
        DataError::TypeMismatch {
            observation: self.observation.to_string(),
            category: Category::DetData,
            field: self.name.clone(),
            expected,
            actual: self.dtype(),
        }
    }

    fn row_error(&self, index: usize) -> DataError {
        DataError::RowOutOfRange {
            observation: self.observation.to_string(),
            field: self.name.clone(),
            index,
            n_det: self.n_det(),
        }
    }

    fn det_error(&self, det: &str) -> DataError {
        DataError::MissingDetector {
            observation: self.observation.to_string(),
            where_: format!("detdata '{}'", self.name),
            detector: det.to_string(),
        }
    }

    /// The whole block as `T`.
    pub fn data<T: Element>(&self) -> Result<&[T], DataError> {
        self.data
            .slice::<T>()
            .ok_or_else(|| self.type_error(T::DTYPE))
    }

    /// The whole block as `T`, mutably.
    pub fn data_mut<T: Element>(&mut self) -> Result<&mut [T], DataError> {
        let e = self.type_error(T::DTYPE);
        self.data.slice_mut::<T>().ok_or(e)
    }

    /// Row `index` as `T`.
    pub fn row<T: Element>(&self, index: usize) -> Result<&[T], DataError> {
        if index >= self.n_det() {
            return Err(self.row_error(index));
        }
        let n = self.row_len();
        Ok(&self.data::<T>()?[index * n..(index + 1) * n])
    }

    /// Row `index` as `T`, mutably.
    pub fn row_mut<T: Element>(&mut self, index: usize) -> Result<&mut [T], DataError> {
        if index >= self.n_det() {
            return Err(self.row_error(index));
        }
        let n = self.row_len();
        Ok(&mut self.data_mut::<T>()?[index * n..(index + 1) * n])
    }

    /// The row of detector `det` as `T`.
    pub fn row_of<T: Element>(&self, det: &str) -> Result<&[T], DataError> {
        let i = self.row_index(det).ok_or_else(|| self.det_error(det))?;
        self.row(i)
    }

    /// The row of detector `det` as `T`, mutably.
    pub fn row_of_mut<T: Element>(&mut self, det: &str) -> Result<&mut [T], DataError> {
        let i = self.row_index(det).ok_or_else(|| self.det_error(det))?;
        self.row_mut(i)
    }

    /// Check the element type and per-sample shape.
    pub fn check<T: Element>(&self, sample_shape: &[usize]) -> Result<(), DataError> {
        if self.dtype() != T::DTYPE {
            return Err(self.type_error(T::DTYPE));
        }
        if self.sample_shape != sample_shape {
            return Err(DataError::ShapeMismatch {
                observation: self.observation.to_string(),
                category: Category::DetData,
                field: self.name.clone(),
                expected: sample_shape.to_vec(),
                actual: self.sample_shape.clone(),
            });
        }
        Ok(())
    }

    /// The underlying column.
    pub fn column(&self) -> &Column {
        &self.data
    }

    /// The raw bytes of the whole block.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// The raw bytes of the whole block, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_bytes_mut()
    }

    /// Zero every element.
    pub fn fill_zero(&mut self) {
        self.data.fill_zero();
    }
}

/// The per-detector fields of one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct DetDataManager {
    observation: Arc<str>,
    n_samples: usize,
    detectors: Arc<[String]>,
    fields: Vec<DetData>,
}

impl DetDataManager {
    pub(crate) fn new(observation: Arc<str>, n_samples: usize, detectors: Arc<[String]>) -> Self {
        DetDataManager {
            observation,
            n_samples,
            detectors,
            fields: Vec::new(),
        }
    }

    fn missing(&self, name: &str) -> DataError {
        DataError::MissingField {
            observation: self.observation.to_string(),
            category: Category::DetData,
            field: name.to_string(),
        }
    }

    /// Create the field `name` of type `dtype` and per-sample shape
    /// `sample_shape` for `detectors` (all local detectors if `None`, in the
    /// observation's order; otherwise in the given order), zero-filled.
    ///
    /// Idempotent: if the field exists with the same type and shape and
    /// holds every requested detector, it is left untouched
    /// ([`Created::Existing`]). It is an error if it exists with another
    /// type or shape, or without one of the requested detectors.
    pub fn create(
        &mut self,
        name: &str,
        dtype: DType,
        sample_shape: &[usize],
        detectors: Option<&[String]>,
    ) -> Result<Created, DataError> {
        let dets: Vec<String> = match detectors {
            None => self.detectors.to_vec(),
            Some(list) => {
                for (i, d) in list.iter().enumerate() {
                    if list[..i].contains(d) {
                        return Err(DataError::DuplicateDetector {
                            where_: format!("observation '{}': detdata '{name}'", self.observation),
                            detector: d.clone(),
                        });
                    }
                    if !self.detectors.contains(d) {
                        return Err(DataError::MissingDetector {
                            observation: self.observation.to_string(),
                            where_: "local detectors".into(),
                            detector: d.clone(),
                        });
                    }
                }
                list.to_vec()
            }
        };
        if let Some(existing) = self.fields.iter().find(|f| f.name == name) {
            if existing.dtype() != dtype || existing.sample_shape != sample_shape {
                return Err(DataError::FieldConflict {
                    observation: self.observation.to_string(),
                    category: Category::DetData,
                    field: name.to_string(),
                    existing_dtype: existing.dtype(),
                    existing_shape: existing.sample_shape.clone(),
                    dtype,
                    shape: sample_shape.to_vec(),
                });
            }
            if let Some(d) = dets.iter().find(|d| existing.row_index(d).is_none()) {
                return Err(existing.det_error(d));
            }
            return Ok(Created::Existing);
        }
        self.fields.push(DetData::new(
            self.observation.clone(),
            name,
            dtype,
            sample_shape,
            self.n_samples,
            dets,
        )?);
        Ok(Created::New)
    }

    /// Give the existing field `name` to the detectors `dets` in place of
    /// its own, keeping its buffer and contents (not zeroed), when it has
    /// `dtype`, `sample_shape` and as many rows as `dets`, and `dets` are
    /// distinct local detectors; returns whether it did. A pass over
    /// detector batches reuses one batch's work field for the next this
    /// way instead of freeing and allocating (and faulting in) it again.
    pub fn recycle(
        &mut self,
        name: &str,
        dtype: DType,
        sample_shape: &[usize],
        dets: &[String],
    ) -> bool {
        let local = &self.detectors;
        let distinct = dets.iter().enumerate().all(|(i, d)| !dets[..i].contains(d));
        if !distinct || !dets.iter().all(|d| local.contains(d)) {
            return false;
        }
        match self.fields.iter_mut().find(|f| f.name == name) {
            Some(f)
                if f.dtype() == dtype
                    && f.sample_shape == sample_shape
                    && f.detectors.len() == dets.len() =>
            {
                f.detectors = dets.to_vec();
                f.index = dets
                    .iter()
                    .enumerate()
                    .map(|(i, d)| (d.clone(), i))
                    .collect();
                true
            }
            _ => false,
        }
    }

    /// Whether the field exists.
    pub fn contains(&self, name: &str) -> bool {
        self.fields.iter().any(|f| f.name == name)
    }

    /// Field names, in creation order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|f| f.name.as_str())
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there is no field.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// A field.
    pub fn get(&self, name: &str) -> Result<&DetData, DataError> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| self.missing(name))
    }

    /// A field, mutably.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut DetData, DataError> {
        let e = self.missing(name);
        self.fields.iter_mut().find(|f| f.name == name).ok_or(e)
    }

    /// Several distinct fields, mutably, at once (e.g. read `signal` while
    /// writing `pixels` and `weights`).
    pub fn get_disjoint_mut<const N: usize>(
        &mut self,
        names: [&str; N],
    ) -> Result<[&mut DetData; N], DataError> {
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                return Err(DataError::DuplicateBorrow {
                    observation: self.observation.to_string(),
                    category: Category::DetData,
                    field: n.to_string(),
                });
            }
            if !self.contains(n) {
                return Err(self.missing(n));
            }
        }
        let mut slots: [Option<&mut DetData>; N] = std::array::from_fn(|_| None);
        for f in self.fields.iter_mut() {
            if let Some(i) = names.iter().position(|n| *n == f.name) {
                slots[i] = Some(f);
            }
        }
        Ok(slots.map(|s| s.expect("presence checked above")))
    }

    /// Remove a field, returning it.
    pub fn remove(&mut self, name: &str) -> Result<DetData, DataError> {
        let i = self
            .fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| self.missing(name))?;
        Ok(self.fields.remove(i))
    }

    /// Iterate over the fields.
    pub fn iter(&self) -> impl Iterator<Item = &DetData> {
        self.fields.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager() -> DetDataManager {
        let dets: Arc<[String]> = vec!["d0".to_string(), "d1".into(), "d2".into()].into();
        DetDataManager::new(Arc::from("obs0"), 4, dets)
    }

    #[test]
    fn layout_is_det_major_contiguous() {
        let mut m = manager();
        assert_eq!(
            m.create("weights", DType::F64, &[3], None).unwrap(),
            Created::New
        );
        let w = m.get_mut("weights").unwrap();
        assert_eq!(w.shape(), vec![3, 4, 3]);
        assert_eq!(w.row_len(), 12);
        // Write (det, sample, k) = 100 det + 10 sample + k through rows.
        for d in 0..3 {
            let row = w.row_mut::<f64>(d).unwrap();
            for s in 0..4 {
                for k in 0..3 {
                    row[s * 3 + k] = (100 * d + 10 * s + k) as f64;
                }
            }
        }
        let flat = w.data::<f64>().unwrap();
        // Row-major [n_det, n_samples, 3].
        assert_eq!(flat[(2 * 4 + 1) * 3 + 2], 212.0);
        assert_eq!(w.row_of::<f64>("d1").unwrap()[0], 100.0);
        assert_eq!(w.as_bytes().len(), 3 * 4 * 3 * 8);
        w.fill_zero();
        assert!(w.data::<f64>().unwrap().iter().all(|&x| x == 0.0));
    }

    #[test]
    fn recycle_relabels_a_field_of_the_same_size() {
        let mut m = manager();
        let a = ["d0".to_string()];
        let b = ["d2".to_string()];
        m.create("w", DType::F64, &[], Some(&a)).unwrap();
        m.get_mut("w").unwrap().row_of_mut::<f64>("d0").unwrap()[1] = 3.0;
        assert!(m.recycle("w", DType::F64, &[], &b));
        let f = m.get("w").unwrap();
        assert!(f.row_index("d0").is_none());
        assert_eq!(f.row_of::<f64>("d2").unwrap()[1], 3.0, "contents kept");
        // Another size, type, shape, an unknown or repeated detector: no.
        let two = ["d0".to_string(), "d1".to_string()];
        assert!(!m.recycle("w", DType::F64, &[], &two));
        assert!(!m.recycle("w", DType::F32, &[], &b));
        assert!(!m.recycle("w", DType::F64, &[3], &b));
        assert!(!m.recycle("w", DType::F64, &[], &["x".to_string()]));
        assert!(!m.recycle("missing", DType::F64, &[], &b));
        m.create("w2", DType::F64, &[], Some(&two)).unwrap();
        assert!(!m.recycle("w2", DType::F64, &[], &["d1".to_string(), "d1".to_string()]));
    }

    #[test]
    fn create_is_idempotent_and_checks_conflicts() {
        let mut m = manager();
        m.create("signal", DType::F64, &[], None).unwrap();
        m.get_mut("signal").unwrap().row_mut::<f64>(0).unwrap()[0] = 5.0;
        assert_eq!(
            m.create("signal", DType::F64, &[], None).unwrap(),
            Created::Existing
        );
        assert_eq!(
            m.get("signal").unwrap().row::<f64>(0).unwrap()[0],
            5.0,
            "existing data kept"
        );
        let sub = ["d2".to_string()];
        assert_eq!(
            m.create("signal", DType::F64, &[], Some(&sub)).unwrap(),
            Created::Existing
        );
        let e = m.create("signal", DType::F32, &[], None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': detdata field 'signal' already exists as float64 []; cannot \
             create it as float32 []"
        );
        assert!(matches!(
            m.create("signal", DType::F64, &[3], None),
            Err(DataError::FieldConflict { .. })
        ));
        let e = m
            .create("x", DType::U8, &[], Some(&["d9".to_string()]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': local detectors has no detector 'd9'"
        );
        let dup = ["d1".to_string(), "d1".to_string()];
        let e = m.create("y", DType::U8, &[], Some(&dup)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': detdata 'y': duplicate detector 'd1'"
        );
        // A subset field, then a request with a detector it lacks.
        m.create("tmp", DType::F64, &[], Some(&sub)).unwrap();
        assert_eq!(m.get("tmp").unwrap().n_det(), 1);
        assert!(matches!(
            m.create("tmp", DType::F64, &[], None),
            Err(DataError::MissingDetector { .. })
        ));
    }

    #[test]
    fn typed_errors_name_everything() {
        let mut m = manager();
        m.create("flags", DType::U8, &[], None).unwrap();
        let f = m.get("flags").unwrap();
        let e = f.data::<f64>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': detdata field 'flags' has type uint8, expected float64"
        );
        let e = f.row::<u8>(3).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': detdata field 'flags' has 3 detector rows, no row 3"
        );
        let e = f.row_of::<u8>("zz").unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': detdata 'flags' has no detector 'zz'"
        );
        assert!(f.check::<u8>(&[]).is_ok());
        assert!(matches!(
            f.check::<u8>(&[2]),
            Err(DataError::ShapeMismatch { .. })
        ));
        let e = m.get("nope").unwrap_err();
        assert_eq!(e.to_string(), "observation 'obs0': no detdata field 'nope'");
    }

    #[test]
    fn disjoint_borrows_and_removal() {
        let mut m = manager();
        m.create("signal", DType::F64, &[], None).unwrap();
        m.create("pixels", DType::I64, &[], None).unwrap();
        m.create("weights", DType::F64, &[3], None).unwrap();
        let [sig, pix] = m.get_disjoint_mut(["signal", "pixels"]).unwrap();
        sig.row_mut::<f64>(1).unwrap()[2] = 1.5;
        pix.row_mut::<i64>(1).unwrap()[2] = sig.row::<f64>(1).unwrap()[2] as i64 + 7;
        assert_eq!(m.get("pixels").unwrap().row::<i64>(1).unwrap()[2], 8);
        assert!(matches!(
            m.get_disjoint_mut(["signal", "signal"]),
            Err(DataError::DuplicateBorrow { .. })
        ));
        assert!(matches!(
            m.get_disjoint_mut(["signal", "nope"]),
            Err(DataError::MissingField { .. })
        ));
        assert_eq!(
            m.names().collect::<Vec<_>>(),
            ["signal", "pixels", "weights"]
        );
        let w = m.remove("weights").unwrap();
        assert_eq!(w.name(), "weights");
        assert!(!m.contains("weights"));
        assert!(m.remove("weights").is_err());
        assert_eq!(m.len(), 2);
    }
}
