//! The plugin glue: the function table and header of the C ABI
//! (`toast-accel/include/toast_backend.h`), and the lifecycle and memory
//! entry points, generic over the [`Driver`]. The exported entry symbol
//! itself is emitted into each backend by
//! [`export_plugin!`](crate::export_plugin), with the table and header it
//! returns.

use crate::context::{ctx_ref, Context};
use crate::driver::Driver;
use crate::kernels::entries;
use std::ffi::{c_char, c_void};
use toast_accel::abi::{self, HostApi, Status};
use toast_accel::plugin_support::{self, guard, PluginError};

pub use toast_accel::abi::{BackendHeader, BackendTable};

/// The function table of the driver `D`'s plugin: every kernel of the
/// table is `kernels::entries::entry` for `D` and its argument struct.
pub const fn table<D: Driver>() -> BackendTable {
    toast_accel::backend_table! {
        init: Some(init::<D>),
        shutdown: Some(shutdown::<D>),
        last_error: Some(last_error),
        device_count: Some(device_count::<D>),
        device_info: Some(device_info::<D>),
        alloc: Some(alloc::<D>),
        free: Some(free::<D>),
        copy_to_device: Some(copy_to_device::<D>),
        copy_to_host: Some(copy_to_host::<D>),
        reset: Some(reset::<D>),
        synchronize: Some(synchronize::<D>);
        kernels = entries::entry::<D, _>
    }
}

/// The plugin header of a device backend (not host-addressable): `name`,
/// `version` and `description` are NUL-terminated, `table` is the plugin's
/// static [`table`].
pub const fn header(
    name: &'static [u8],
    version: &'static [u8],
    description: &'static [u8],
    table: &'static BackendTable,
) -> BackendHeader {
    BackendHeader {
        magic: abi::MAGIC,
        abi_major: abi::ABI_MAJOR,
        abi_minor: abi::ABI_MINOR,
        table_size: std::mem::size_of::<BackendTable>() as u32,
        flags: 0,
        name: name.as_ptr() as *const c_char,
        version: version.as_ptr() as *const c_char,
        description: description.as_ptr() as *const c_char,
        table,
    }
}

/// Whether `a` and `b` are the same string (for the compile-time check of
/// [`export_plugin!`](crate::export_plugin) that the header's name is the
/// driver's).
pub const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Why the driver `D` cannot run here, or `None` when a device is usable.
/// Runs the same probe as `init` (for tests and tools).
pub fn unavailable_reason<D: Driver>() -> Option<String> {
    // SAFETY: a null host API is allowed.
    match unsafe { Context::<D>::new(std::ptr::null()) } {
        Ok(_) => None,
        Err(e) if e.status == abi::ERR_UNAVAILABLE => Some(e.message),
        Err(e) => Some(format!("init failed: {}", e.message)),
    }
}

fn buffer_name(name: *const c_char) -> String {
    if name.is_null() {
        "(unnamed)".to_string()
    } else {
        // SAFETY: NUL-terminated by the ABI.
        unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }
}

unsafe extern "C" fn init<D: Driver>(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    guard(|| {
        if ctx.is_null() {
            return Err(PluginError::invalid("init: null ctx out pointer"));
        }
        // SAFETY: the host passes a valid (or null) HostApi.
        let c = unsafe { Context::<D>::new(host)? };
        // SAFETY: non-null out pointer.
        unsafe { *ctx = Box::into_raw(Box::new(c)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn shutdown<D: Driver>(ctx: *mut c_void) {
    let _ = guard(|| {
        if !ctx.is_null() {
            // SAFETY: `ctx` came from `Box::into_raw` in `init` and the host
            // calls shutdown once; dropping it frees its buffers.
            drop(unsafe { Box::from_raw(ctx as *mut Context<D>) });
        }
        Ok(())
    });
}

unsafe extern "C" fn last_error() -> *const c_char {
    plugin_support::last_error_ptr()
}

unsafe extern "C" fn device_count<D: Driver>(ctx: *mut c_void, count: *mut u32) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref::<D>(ctx)? };
        if count.is_null() {
            return Err(PluginError::invalid("device_count: null out pointer"));
        }
        // SAFETY: non-null out pointer from the host.
        unsafe { *count = 1 };
        Ok(())
    })
}

unsafe extern "C" fn device_info<D: Driver>(
    ctx: *mut c_void,
    index: u32,
    info: *mut abi::DeviceInfo,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        if index != 0 {
            return Err(PluginError::invalid(format!(
                "device_info: device index {index} does not exist (this context drives 1 device)"
            )));
        }
        if info.is_null() {
            return Err(PluginError::invalid("device_info: null out pointer"));
        }
        let name = format!("{} ({})", c.driver.device_name(), c.driver.arch());
        let (free, total) = c.driver.mem_info();
        let mut out = abi::DeviceInfo {
            name: [0; 128],
            total_memory: total,
            free_memory: free,
            compute_units: c.driver.compute_units(),
            peak_held_mib: c
                .memory
                .peak_held()
                .div_ceil(1 << 20)
                .min(u64::from(u32::MAX)) as u32,
            memory_kind: c.driver.memory_kind().to_abi(),
            reserved: 0,
            uuid: c.driver.uuid().unwrap_or([0; 16]),
        };
        for (d, &b) in out.name.iter_mut().zip(name.as_bytes().iter().take(127)) {
            *d = b as c_char;
        }
        // SAFETY: non-null out pointer from the host, to the struct of the
        // host's minor (the ABI contract), of which this writes no more.
        unsafe { out.write_for_host(info, c.host_abi_minor) };
        Ok(())
    })
}

unsafe extern "C" fn alloc<D: Driver>(
    ctx: *mut c_void,
    bytes: u64,
    name: *const c_char,
    handle: *mut u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        if handle.is_null() {
            return Err(PluginError::invalid("alloc: null handle out pointer"));
        }
        let h = c.memory.alloc(&c.driver, bytes, &buffer_name(name))?;
        // SAFETY: non-null out pointer from the host.
        unsafe { *handle = h };
        Ok(())
    })
}

unsafe extern "C" fn free<D: Driver>(ctx: *mut c_void, handle: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        c.written(handle);
        c.memory.free(&c.driver, handle)
    })
}

unsafe extern "C" fn copy_to_device<D: Driver>(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        if bytes > 0 && src.is_null() {
            return Err(PluginError::invalid("copy_to_device: null source"));
        }
        let (buf, offset) = c.memory.range("copy_to_device", handle, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        c.written(handle);
        // SAFETY: non-null, and `bytes` readable bytes at `src` by the ABI
        // contract; `bytes` fits the buffer, so it fits a slice.
        let src = unsafe { std::slice::from_raw_parts(src as *const u8, bytes as usize) };
        // SAFETY: `buf` is live and range-checked for `bytes` at `offset`.
        unsafe { c.driver.upload(buf, offset, src) }
    })
}

unsafe extern "C" fn copy_to_host<D: Driver>(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        if bytes > 0 && dst.is_null() {
            return Err(PluginError::invalid("copy_to_host: null destination"));
        }
        let (buf, offset) = c.memory.range("copy_to_host", handle, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: non-null, and `bytes` writable bytes at `dst` that nothing
        // else uses during the call, by the ABI contract.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, bytes as usize) };
        // SAFETY: `buf` is live and range-checked for `bytes` at `offset`.
        unsafe { c.driver.download(buf, offset, dst) }
    })
}

unsafe extern "C" fn reset<D: Driver>(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        let (buf, offset) = c.memory.range("reset", handle, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        c.written(handle);
        // SAFETY: `buf` is live and range-checked for `bytes` at `offset`.
        unsafe { c.driver.zero(buf, offset, bytes) }
    })
}

unsafe extern "C" fn synchronize<D: Driver>(ctx: *mut c_void) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref::<D>(ctx)? }.driver.synchronize()
    })
}
