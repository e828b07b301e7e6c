//! Views of the kernel arrays of a host-addressable backend.
//!
//! `abi::Array::ptr` is a host address here. Before a kernel builds a slice
//! it checks the pointer is non-null and aligned, and that no output array
//! overlaps another argument (Rust slices must not alias a mutable one).

use toast_accel::abi::Array;
use toast_accel::plugin_support::PluginError;

/// A kernel array argument: its name, ABI view and element size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arg {
    pub name: &'static str,
    pub array: Array,
    pub elem: usize,
}

impl Arg {
    pub(crate) fn new<T>(name: &'static str, array: Array) -> Self {
        Arg {
            name,
            array,
            elem: std::mem::size_of::<T>(),
        }
    }

    fn range(&self) -> (u64, u64) {
        let start = self.array.ptr;
        (
            start,
            start.saturating_add(self.array.len.saturating_mul(self.elem as u64)),
        )
    }
}

/// Refuse an output whose bytes overlap any other argument.
pub(crate) fn check_disjoint(
    kernel: &'static str,
    outputs: &[Arg],
    others: &[Arg],
) -> Result<(), PluginError> {
    for (i, o) in outputs.iter().enumerate() {
        if o.array.len == 0 {
            continue;
        }
        let (a0, a1) = o.range();
        let rest = outputs[i + 1..].iter().chain(others);
        for x in rest {
            if x.array.len == 0 {
                continue;
            }
            let (b0, b1) = x.range();
            if a0 < b1 && b0 < a1 {
                return Err(PluginError::invalid(format!(
                    "{kernel}: argument `{}` (output) overlaps argument `{}` in memory",
                    o.name, x.name
                )));
            }
        }
    }
    Ok(())
}

fn check_ptr<T>(kernel: &'static str, arg: &'static str, a: Array) -> Result<(), PluginError> {
    if a.len == 0 {
        return Ok(());
    }
    if a.ptr == 0 {
        return Err(PluginError::invalid(format!(
            "{kernel}: argument `{arg}`: null pointer with length {}",
            a.len
        )));
    }
    if !a.ptr.is_multiple_of(std::mem::align_of::<T>() as u64) {
        return Err(PluginError::invalid(format!(
            "{kernel}: argument `{arg}`: address 0x{:x} is not aligned for its {}-byte elements",
            a.ptr,
            std::mem::size_of::<T>()
        )));
    }
    if a.len.saturating_mul(std::mem::size_of::<T>() as u64) > isize::MAX as u64 {
        return Err(PluginError::invalid(format!(
            "{kernel}: argument `{arg}`: length {} is too large",
            a.len
        )));
    }
    Ok(())
}

/// A read-only view of a kernel array (empty when absent).
///
/// # Safety
/// `a.ptr` must be the host address of `a.len` initialised elements of `T`
/// that nothing writes during the kernel call.
pub(crate) unsafe fn input<'a, T>(
    kernel: &'static str,
    arg: &'static str,
    a: Array,
) -> Result<&'a [T], PluginError> {
    check_ptr::<T>(kernel, arg, a)?;
    if a.len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-null, aligned, and valid for a.len elements by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(a.ptr as *const T, a.len as usize) })
}

/// A mutable view of a kernel array (empty when absent).
///
/// # Safety
/// `a.ptr` must be the host address of `a.len` initialised elements of `T`
/// that nothing else accesses during the kernel call (see [`check_disjoint`]).
pub(crate) unsafe fn output<'a, T>(
    kernel: &'static str,
    arg: &'static str,
    a: Array,
) -> Result<&'a mut [T], PluginError> {
    check_ptr::<T>(kernel, arg, a)?;
    if a.len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: non-null, aligned, valid and exclusive by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(a.ptr as *mut T, a.len as usize) })
}
