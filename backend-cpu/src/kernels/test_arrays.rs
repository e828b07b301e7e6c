//! Test helpers: an ABI `Array` header over a test's local slice (the
//! kernels' unit tests call `run` directly with host pointers).

use toast_accel::abi::Array;

/// The header of an input slice.
pub(crate) fn arr<T>(v: &[T]) -> Array {
    Array {
        ptr: v.as_ptr() as u64,
        len: v.len() as u64,
    }
}

/// The header of an output slice.
pub(crate) fn arr_mut<T>(v: &mut [T]) -> Array {
    Array {
        ptr: v.as_mut_ptr() as u64,
        len: v.len() as u64,
    }
}
