//! Argument validation shared by every backend written in Rust.
//!
//! A kernel entry point calls the matching `check_*` function before it
//! touches any memory. Checks here need only the argument struct and the
//! small host-side arrays (index arrays, intervals); data-dependent checks on
//! large arrays (a pixel beyond the map, a hit submap whose `global2local`
//! is -1) happen inside the kernels, which report the detector and sample.
//!
//! Every error names the argument and the offending value.

use crate::abi::{Interval, Intervals};
use std::fmt;

/// A rejected kernel argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgError {
    /// Kernel name, as [`crate::abi::Kernel::name`].
    pub kernel: &'static str,
    /// Argument name, as in the C header.
    pub arg: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl ArgError {
    pub fn new(kernel: &'static str, arg: &'static str, problem: impl Into<String>) -> Self {
        ArgError {
            kernel,
            arg,
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: argument `{}`: {}",
            self.kernel, self.arg, self.problem
        )
    }
}

impl std::error::Error for ArgError {}

/// View the intervals of an argument struct as a slice, checking each one
/// lies in `[0, n_samp]` with `first <= last`.
///
/// # Safety
/// `iv.ptr` must point to `iv.len` readable intervals (or `iv.len == 0`).
pub unsafe fn intervals<'a>(
    kernel: &'static str,
    iv: &Intervals,
    n_samp: u64,
) -> Result<&'a [Interval], ArgError> {
    if iv.len == 0 {
        return Ok(&[]);
    }
    if iv.ptr.is_null() {
        return Err(ArgError::new(
            kernel,
            "intervals",
            format!("null pointer with length {}", iv.len),
        ));
    }
    // SAFETY: non-null and, by the caller's contract, valid for iv.len items.
    let s = unsafe { std::slice::from_raw_parts(iv.ptr, iv.len as usize) };
    for (i, it) in s.iter().enumerate() {
        if it.first < 0 || it.last < it.first || it.last as u64 > n_samp {
            return Err(ArgError::new(
                kernel,
                "intervals",
                format!(
                    "interval {i} is [{}, {}), which is not a range inside [0, n_samp = {n_samp})",
                    it.first, it.last
                ),
            ));
        }
    }
    Ok(s)
}

/// View a host array of `n` elements, refusing a null pointer when `n > 0`.
///
/// # Safety
/// `ptr` must point to `n` readable elements of `T` (or `n == 0`).
pub unsafe fn host_slice<'a, T>(
    kernel: &'static str,
    arg: &'static str,
    ptr: *const T,
    n: u64,
) -> Result<&'a [T], ArgError> {
    if n == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("null pointer, expected {n} elements"),
        ));
    }
    // SAFETY: non-null and valid for n elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n as usize) })
}

/// Check that every entry of an index array lies in `[0, n_rows)`.
pub fn index_rows(
    kernel: &'static str,
    arg: &'static str,
    index: &[i32],
    n_rows: u64,
    rows_of: &str,
) -> Result<(), ArgError> {
    for (i, &r) in index.iter().enumerate() {
        if r < 0 || r as u64 >= n_rows {
            return Err(ArgError::new(
                kernel,
                arg,
                format!("{arg}[{i}] = {r} is not a row of {rows_of}, which has {n_rows} rows"),
            ));
        }
    }
    Ok(())
}

/// The number of rows of an array of `len` elements made of rows of
/// `row_len` elements, requiring an exact multiple.
pub fn rows(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    row_len: u64,
    shape: &str,
) -> Result<u64, ArgError> {
    if row_len == 0 {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("row length of shape {shape} is zero"),
        ));
    }
    if len % row_len != 0 {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("length {len} is not a whole number of rows of shape {shape} ({row_len} elements each)"),
        ));
    }
    Ok(len / row_len)
}

/// An optional array must be absent (length 0) or have exactly `expected`
/// elements. Returns whether it is present.
pub fn optional_len(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    expected: u64,
    what: &str,
) -> Result<bool, ArgError> {
    match len {
        0 => Ok(false),
        l if l == expected => Ok(true),
        l => Err(ArgError::new(
            kernel,
            arg,
            format!("length {l}, expected {expected} ({what}) or 0 (absent)"),
        )),
    }
}

/// A required array must have exactly `expected` elements.
pub fn exact_len(
    kernel: &'static str,
    arg: &'static str,
    len: u64,
    expected: u64,
    what: &str,
) -> Result<(), ArgError> {
    if len != expected {
        return Err(ArgError::new(
            kernel,
            arg,
            format!("length {len}, expected {expected} ({what})"),
        ));
    }
    Ok(())
}
