//! The small dynamic type system of the data model: element types and
//! typed columns.
//!
//! Fields of an observation are stored as one [`Column`] each: an enum of
//! typed `Vec`s. Code that knows the type asks for a slice with
//! [`Column::slice`]/[`Column::slice_mut`] (generic over the sealed
//! [`Element`] trait), and gets `None` on a mismatch; the owners of the
//! columns turn that into an error naming the field. Byte views for device
//! transfers come from `bytemuck`, so no `unsafe` is needed.

use std::fmt;

/// Element type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `f64`
    F64,
    /// `f32`
    F32,
    /// `i64`
    I64,
    /// `i32`
    I32,
    /// `u8` (flags)
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::U8 => 1,
        }
    }

    /// The numpy-style name (`float64`, `uint8`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "float64",
            DType::F32 => "float32",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A contiguous, typed block of elements.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// `f64` elements.
    F64(Vec<f64>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `u8` elements.
    U8(Vec<u8>),
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f64 {}
    impl Sealed for f32 {}
    impl Sealed for i64 {}
    impl Sealed for i32 {}
    impl Sealed for u8 {}
}

/// The element types a [`Column`] can hold. Sealed: exactly the [`DType`]s.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + Default + PartialEq + fmt::Debug + Send + Sync + 'static
{
    /// The matching [`DType`].
    const DTYPE: DType;
    /// The elements, if `col` holds this type.
    fn slice(col: &Column) -> Option<&[Self]>;
    /// The elements, mutably, if `col` holds this type.
    fn slice_mut(col: &mut Column) -> Option<&mut [Self]>;
    /// Wrap a vector.
    fn into_column(v: Vec<Self>) -> Column;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn slice(col: &Column) -> Option<&[Self]> {
                match col {
                    Column::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(col: &mut Column) -> Option<&mut [Self]> {
                match col {
                    Column::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn into_column(v: Vec<Self>) -> Column {
                Column::$variant(v)
            }
        }
    };
}
element!(f64, F64);
element!(f32, F32);
element!(i64, I64);
element!(i32, I32);
element!(u8, U8);

macro_rules! each {
    ($col:expr, $v:ident => $body:expr) => {
        match $col {
            Column::F64($v) => $body,
            Column::F32($v) => $body,
            Column::I64($v) => $body,
            Column::I32($v) => $body,
            Column::U8($v) => $body,
        }
    };
}

impl Column {
    /// `len` zeros of type `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F64 => Column::F64(vec![0.0; len]),
            DType::F32 => Column::F32(vec![0.0; len]),
            DType::I64 => Column::I64(vec![0; len]),
            DType::I32 => Column::I32(vec![0; len]),
            DType::U8 => Column::U8(vec![0; len]),
        }
    }

    /// `len` zeros of type `dtype`, or `None` when the memory cannot be
    /// had (see [`crate::mem::try_zeroed`]): for the large per-observation
    /// buffers, whose failed allocation must be an error, not an abort.
    pub fn try_zeros(dtype: DType, len: usize) -> Option<Self> {
        use crate::mem::try_zeroed;
        Some(match dtype {
            DType::F64 => Column::F64(try_zeroed(len)?),
            DType::F32 => Column::F32(try_zeroed(len)?),
            DType::I64 => Column::I64(try_zeroed(len)?),
            DType::I32 => Column::I32(try_zeroed(len)?),
            DType::U8 => Column::U8(try_zeroed(len)?),
        })
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            Column::F64(_) => DType::F64,
            Column::F32(_) => DType::F32,
            Column::I64(_) => DType::I64,
            Column::I32(_) => DType::I32,
            Column::U8(_) => DType::U8,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each!(self, v => v.len())
    }

    /// Whether the column holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size in bytes.
    pub fn n_bytes(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// The elements as `T`, or `None` if the column holds another type.
    pub fn slice<T: Element>(&self) -> Option<&[T]> {
        T::slice(self)
    }

    /// The elements as `T`, mutably, or `None` if the column holds another type.
    pub fn slice_mut<T: Element>(&mut self) -> Option<&mut [T]> {
        T::slice_mut(self)
    }

    /// The raw bytes (native endianness), for device transfers.
    pub fn as_bytes(&self) -> &[u8] {
        each!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    /// The raw bytes, mutably (a device→host copy writes here).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        each!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }

    /// Set every element to zero.
    pub fn fill_zero(&mut self) {
        self.as_bytes_mut().fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_access_and_bytes() {
        let mut c = Column::zeros(DType::I32, 3);
        assert_eq!(c.dtype(), DType::I32);
        assert_eq!(c.n_bytes(), 12);
        assert!(c.slice::<f64>().is_none());
        c.slice_mut::<i32>().unwrap().copy_from_slice(&[1, -2, 3]);
        assert_eq!(c.as_bytes()[0..4], 1i32.to_ne_bytes());
        c.as_bytes_mut()[4..8].copy_from_slice(&7i32.to_ne_bytes());
        assert_eq!(c.slice::<i32>().unwrap(), &[1, 7, 3]);
        c.fill_zero();
        assert_eq!(c.slice::<i32>().unwrap(), &[0, 0, 0]);
        assert_eq!(f32::into_column(vec![1.0]).dtype(), DType::F32);
        for (d, s, n) in [
            (DType::F64, 8, "float64"),
            (DType::F32, 4, "float32"),
            (DType::I64, 8, "int64"),
            (DType::I32, 4, "int32"),
            (DType::U8, 1, "uint8"),
        ] {
            assert_eq!(d.size(), s);
            assert_eq!(d.to_string(), n);
            assert_eq!(Column::zeros(d, 5).n_bytes(), 5 * s);
        }
    }
}
