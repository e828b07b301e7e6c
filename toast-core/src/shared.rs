//! Shared data: per-sample fields common to all detectors of an observation
//! (times, boresight quaternions, shared flags, position, velocity, HWP
//! angle), each one contiguous row-major block `[n_rows, ...sample_shape]`
//! where `n_rows` is normally the number of samples.

use crate::dtype::{Column, DType, Element};
use crate::error::{Category, DataError};
use std::sync::Arc;

/// One shared field.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedField {
    observation: Arc<str>,
    name: String,
    n_rows: usize,
    sample_shape: Vec<usize>,
    data: Column,
}

impl SharedField {
    /// Field name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// Rows (samples, for a per-sample field).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Shape of one row (`[4]` for quaternions, `[]` for times).
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    /// Full shape `[n_rows, ...sample_shape]`.
    pub fn shape(&self) -> Vec<usize> {
        let mut s = vec![self.n_rows];
        s.extend_from_slice(&self.sample_shape);
        s
    }

    fn type_error(&self, expected: DType) -> DataError {
        DataError::TypeMismatch {
            observation: self.observation.to_string(),
            category: Category::Shared,
            field: self.name.clone(),
            expected,
            actual: self.dtype(),
        }
    }

    /// The elements as `T`.
    pub fn data<T: Element>(&self) -> Result<&[T], DataError> {
        self.data
            .slice::<T>()
            .ok_or_else(|| self.type_error(T::DTYPE))
    }

    /// The elements as `T`, mutably.
    pub fn data_mut<T: Element>(&mut self) -> Result<&mut [T], DataError> {
        let e = self.type_error(T::DTYPE);
        self.data.slice_mut::<T>().ok_or(e)
    }

    /// Check the element type and per-row shape.
    pub fn check<T: Element>(&self, sample_shape: &[usize]) -> Result<(), DataError> {
        if self.dtype() != T::DTYPE {
            return Err(self.type_error(T::DTYPE));
        }
        if self.sample_shape != sample_shape {
            return Err(DataError::ShapeMismatch {
                observation: self.observation.to_string(),
                category: Category::Shared,
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

    /// Raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.as_bytes()
    }

    /// Raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_bytes_mut()
    }
}

/// The shared fields of one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedData {
    observation: Arc<str>,
    n_samples: usize,
    fields: Vec<SharedField>,
}

impl SharedData {
    pub(crate) fn new(observation: Arc<str>, n_samples: usize) -> Self {
        SharedData {
            observation,
            n_samples,
            fields: Vec::new(),
        }
    }

    fn missing(&self, name: &str) -> DataError {
        DataError::MissingField {
            observation: self.observation.to_string(),
            category: Category::Shared,
            field: name.to_string(),
        }
    }

    /// Create a zeroed per-sample field (`n_samples` rows). Idempotent if it
    /// exists with the same type and shape; an error otherwise. Returns
    /// whether it was created.
    pub fn create(
        &mut self,
        name: &str,
        dtype: DType,
        sample_shape: &[usize],
    ) -> Result<bool, DataError> {
        self.create_rows(name, dtype, self.n_samples, sample_shape)
    }

    /// Create a zeroed field with `n_rows` rows (for shared data that is
    /// not per sample). Same rules as [`SharedData::create`].
    pub fn create_rows(
        &mut self,
        name: &str,
        dtype: DType,
        n_rows: usize,
        sample_shape: &[usize],
    ) -> Result<bool, DataError> {
        if let Some(f) = self.fields.iter().find(|f| f.name == name) {
            if f.dtype() != dtype || f.n_rows != n_rows || f.sample_shape != sample_shape {
                let mut shape = vec![n_rows];
                shape.extend_from_slice(sample_shape);
                return Err(DataError::FieldConflict {
                    observation: self.observation.to_string(),
                    category: Category::Shared,
                    field: name.to_string(),
                    existing_dtype: f.dtype(),
                    existing_shape: f.shape(),
                    dtype,
                    shape,
                });
            }
            return Ok(false);
        }
        let elements = (n_rows as u128) * (sample_shape.iter().product::<usize>() as u128);
        let data = usize::try_from(elements)
            .ok()
            .and_then(|len| Column::try_zeros(dtype, len))
            .ok_or_else(|| DataError::OutOfMemory {
                observation: self.observation.to_string(),
                category: Category::Shared,
                field: name.to_string(),
                bytes: u64::try_from(elements * dtype.size() as u128).unwrap_or(u64::MAX),
            })?;
        self.fields.push(SharedField {
            observation: self.observation.clone(),
            name: name.to_string(),
            n_rows,
            sample_shape: sample_shape.to_vec(),
            data,
        });
        Ok(true)
    }

    /// Create (if needed) a per-sample field and fill it with `values`
    /// (`n_samples * prod(sample_shape)` elements).
    pub fn set<T: Element>(
        &mut self,
        name: &str,
        sample_shape: &[usize],
        values: &[T],
    ) -> Result<(), DataError> {
        let expected = self.n_samples * sample_shape.iter().product::<usize>();
        if values.len() != expected {
            return Err(DataError::LengthMismatch {
                observation: self.observation.to_string(),
                category: Category::Shared,
                field: name.to_string(),
                expected,
                actual: values.len(),
            });
        }
        self.create(name, T::DTYPE, sample_shape)?;
        self.get_mut(name)?.data_mut::<T>()?.copy_from_slice(values);
        Ok(())
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
    pub fn get(&self, name: &str) -> Result<&SharedField, DataError> {
        self.fields
            .iter()
            .find(|f| f.name == name)
            .ok_or_else(|| self.missing(name))
    }

    /// A field, mutably.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut SharedField, DataError> {
        let e = self.missing(name);
        self.fields.iter_mut().find(|f| f.name == name).ok_or(e)
    }

    /// The elements of a field as `T` (shortcut for `get(name)?.data()`).
    pub fn data<T: Element>(&self, name: &str) -> Result<&[T], DataError> {
        self.get(name)?.data::<T>()
    }

    /// Remove a field, returning it.
    pub fn remove(&mut self, name: &str) -> Result<SharedField, DataError> {
        let i = self
            .fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| self.missing(name))?;
        Ok(self.fields.remove(i))
    }

    /// Iterate over the fields.
    pub fn iter(&self) -> impl Iterator<Item = &SharedField> {
        self.fields.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_set_get() {
        let mut s = SharedData::new(Arc::from("obs0"), 3);
        assert!(s.create("boresight_radec", DType::F64, &[4]).unwrap());
        assert!(!s.create("boresight_radec", DType::F64, &[4]).unwrap());
        assert_eq!(s.get("boresight_radec").unwrap().shape(), vec![3, 4]);
        let e = s.create("boresight_radec", DType::F64, &[3]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': shared field 'boresight_radec' already exists as float64 \
             [3, 4]; cannot create it as float64 [3, 3]"
        );
        s.set("times", &[], &[0.0, 0.01, 0.02]).unwrap();
        assert_eq!(s.data::<f64>("times").unwrap()[2], 0.02);
        assert!(matches!(
            s.set("times", &[], &[0.0]),
            Err(DataError::LengthMismatch {
                expected: 3,
                actual: 1,
                ..
            })
        ));
        assert!(matches!(
            s.set::<u8>("times", &[], &[0, 0, 0]),
            Err(DataError::FieldConflict { .. })
        ));
        s.set::<u8>("flags", &[], &[0, 1, 0]).unwrap();
        let e = s.data::<f64>("flags").unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': shared field 'flags' has type uint8, expected float64"
        );
        assert!(s.get("flags").unwrap().check::<u8>(&[]).is_ok());
        assert!(s.get("flags").unwrap().check::<u8>(&[1]).is_err());
        s.create_rows("fp_matrix", DType::F64, 2, &[2]).unwrap();
        assert_eq!(s.get("fp_matrix").unwrap().as_bytes().len(), 32);
        assert_eq!(s.names().collect::<Vec<_>>().len(), 4);
        s.remove("fp_matrix").unwrap();
        assert!(matches!(
            s.remove("fp_matrix"),
            Err(DataError::MissingField { .. })
        ));
    }
}
