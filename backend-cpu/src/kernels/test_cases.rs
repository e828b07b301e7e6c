//! Test support: the TOAST 3.0.6 reference cases
//! (`tests/data/toast-kernels/cases/`, FORMAT.md) read directly, for the unit
//! tests of the plain functions under the plugin entries.

use ndarray::ArrayD;
use ndarray_npy::NpzReader;
use std::fs::File;
use std::path::PathBuf;

pub(crate) fn cases_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/toast-kernels/cases")
}

/// One case file.
pub(crate) struct Case {
    name: String,
    npz: NpzReader<File>,
}

pub(crate) fn reference_case(name: &str) -> Case {
    let p = cases_dir().join(format!("{name}.npz"));
    let f = File::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    Case {
        name: name.to_string(),
        npz: NpzReader::new(f).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    }
}

impl Case {
    fn array<T: ndarray_npy::ReadableElement>(&mut self, field: &str) -> ArrayD<T> {
        self.npz
            .by_name(field)
            .unwrap_or_else(|e| panic!("{}: field {field}: {e}", self.name))
    }

    /// A field's elements in row-major order, and its shape.
    pub(crate) fn shaped<T: ndarray_npy::ReadableElement + Clone>(
        &mut self,
        field: &str,
    ) -> (Vec<T>, Vec<usize>) {
        let a = self.array::<T>(field);
        (a.iter().cloned().collect(), a.shape().to_vec())
    }

    pub(crate) fn f64(&mut self, field: &str) -> Vec<f64> {
        self.shaped(field).0
    }
    pub(crate) fn i64(&mut self, field: &str) -> Vec<i64> {
        self.shaped(field).0
    }
    pub(crate) fn i32(&mut self, field: &str) -> Vec<i32> {
        self.shaped(field).0
    }
    pub(crate) fn u8(&mut self, field: &str) -> Vec<u8> {
        self.shaped(field).0
    }
    pub(crate) fn scalar_i64(&mut self, field: &str) -> i64 {
        self.i64(field)[0]
    }
    pub(crate) fn scalar_f64(&mut self, field: &str) -> f64 {
        self.f64(field)[0]
    }
}
