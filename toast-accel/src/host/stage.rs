//! Kernel array arguments backed by host memory.
//!
//! For a host-addressable backend (the CPU plugin) an [`ArrayArg`] passes the
//! host address straight through. For any other backend it allocates a
//! device buffer, uploads the data, and (for outputs) downloads it again in
//! [`ArrayArg::finish`]. These are the "unstaged" transfers a kernel call
//! makes when its inputs were not already on the device; pipelines avoid
//! them by staging data once, but one-off callers (`verify`, `bench`'s
//! correctness pass, tests) use this.

use super::{AccelError, Backend};
use crate::abi;
use std::marker::PhantomData;

/// AbiElement types that may cross the ABI in arrays.
pub trait AbiElement: Copy + Send + Sync + 'static {
    /// `TOAST_DTYPE_*` code, where one exists.
    const DTYPE: Option<i32>;
}
impl AbiElement for f64 {
    const DTYPE: Option<i32> = Some(abi::DTYPE_F64);
}
impl AbiElement for f32 {
    const DTYPE: Option<i32> = Some(abi::DTYPE_F32);
}
impl AbiElement for i64 {
    const DTYPE: Option<i32> = Some(abi::DTYPE_I64);
}
impl AbiElement for i32 {
    const DTYPE: Option<i32> = Some(abi::DTYPE_I32);
}
impl AbiElement for u8 {
    const DTYPE: Option<i32> = None;
}

/// A host slice presented to a kernel as an [`abi::Array`].
#[derive(Debug)]
pub struct ArrayArg<'a> {
    backend: &'a Backend,
    handle: Option<u64>,
    /// Host address of the data, for write-back.
    host: *mut u8,
    bytes: u64,
    len: u64,
    writeback: bool,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> ArrayArg<'a> {
    fn make(
        backend: &'a Backend,
        host: *mut u8,
        len: usize,
        size: usize,
        name: &str,
        writeback: bool,
    ) -> Result<Self, AccelError> {
        let bytes = (len * size) as u64;
        let mut arg = ArrayArg {
            backend,
            handle: None,
            host,
            bytes,
            len: len as u64,
            writeback,
            _borrow: PhantomData,
        };
        if len > 0 && !backend.host_addressable() {
            let h = backend.alloc(bytes, name)?;
            arg.handle = Some(h);
            // SAFETY: `host` points to `bytes` initialised bytes borrowed for 'a.
            let src = unsafe { std::slice::from_raw_parts(host as *const u8, bytes as usize) };
            backend.copy_to_device(h, 0, src)?;
        }
        Ok(arg)
    }

    /// A read-only argument.
    pub fn input<T: AbiElement>(
        backend: &'a Backend,
        data: &'a [T],
        name: &str,
    ) -> Result<Self, AccelError> {
        Self::make(
            backend,
            data.as_ptr() as *mut u8,
            data.len(),
            std::mem::size_of::<T>(),
            name,
            false,
        )
    }

    /// An output or in/out argument: the kernel's result lands in `data`
    /// after [`ArrayArg::finish`].
    pub fn output<T: AbiElement>(
        backend: &'a Backend,
        data: &'a mut [T],
        name: &str,
    ) -> Result<Self, AccelError> {
        Self::make(
            backend,
            data.as_mut_ptr() as *mut u8,
            data.len(),
            std::mem::size_of::<T>(),
            name,
            true,
        )
    }

    /// The ABI view: absent for an empty slice.
    pub fn abi(&self) -> abi::Array {
        if self.len == 0 {
            return abi::Array::ABSENT;
        }
        match self.handle {
            Some(h) => abi::Array {
                ptr: h,
                len: self.len,
            },
            None => abi::Array {
                ptr: self.host as u64,
                len: self.len,
            },
        }
    }

    /// Copy an output back to the host (when staged) and release the device buffer.
    pub fn finish(mut self) -> Result<(), AccelError> {
        if let Some(h) = self.handle.take() {
            let result = if self.writeback {
                // SAFETY: `host` is the exclusive borrow taken in `output`, valid for `bytes`.
                let dst = unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes as usize) };
                self.backend.copy_to_host(h, 0, dst)
            } else {
                Ok(())
            };
            let freed = self.backend.free(h);
            result?;
            freed?;
        }
        Ok(())
    }
}

impl Drop for ArrayArg<'_> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            // Best effort on an error path; `finish` reports errors.
            let _ = self.backend.free(h);
        }
    }
}
