// The plugin glue shared by `backend-cuda` and `backend-hip`: the function
// table, the header, the entry symbol and the lifecycle and memory entry
// points. Each crate `include!`s this file at its root, after defining
// `NAME`, `VERSION`, `DESCRIPTION`, `compute_units(&Ctx)` and the modules
// `context`, `kernels` and `memory`, so every name here resolves in that
// crate.

static TABLE: BackendTable = BackendTable {
    init: Some(init),
    shutdown: Some(shutdown),
    last_error: Some(last_error),
    device_count: Some(device_count),
    device_info: Some(device_info),
    alloc: Some(alloc),
    free: Some(free),
    copy_to_device: Some(copy_to_device),
    copy_to_host: Some(copy_to_host),
    reset: Some(reset),
    synchronize: Some(synchronize),
    pointing_detector: Some(kernels::entries::pointing_detector),
    pixels_healpix: Some(kernels::entries::pixels_healpix),
    stokes_weights_i: Some(kernels::entries::stokes_weights_i),
    stokes_weights_iqu: Some(kernels::entries::stokes_weights_iqu),
    scan_map: Some(kernels::entries::scan_map),
    build_noise_weighted: Some(kernels::entries::build_noise_weighted),
    noise_weight: Some(kernels::entries::noise_weight),
    template_offset_add_to_signal: Some(kernels::entries::template_offset_add_to_signal),
    template_offset_project_signal: Some(kernels::entries::template_offset_project_signal),
    template_offset_apply_diag_precond: Some(kernels::entries::template_offset_apply_diag_precond),
};

static HEADER: BackendHeader = BackendHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    table_size: std::mem::size_of::<BackendTable>() as u32,
    flags: 0,
    name: NAME.as_ptr() as *const c_char,
    version: VERSION.as_ptr() as *const c_char,
    description: DESCRIPTION.as_ptr() as *const c_char,
    table: &TABLE,
};

/// The plugin's entry symbol: a pointer to its static header.
#[no_mangle]
pub extern "C" fn toast_backend_entry() -> *const BackendHeader {
    &HEADER
}

/// Why this backend cannot run here, or `None` when a device is usable.
/// Runs the same probe as `init` (for tests and tools).
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: a null host API is allowed.
    match unsafe { Ctx::new(std::ptr::null()) } {
        Ok(_) => None,
        Err(e) if e.status == abi::ERR_UNAVAILABLE => Some(e.message),
        Err(e) => Some(format!("init failed: {}", e.message)),
    }
}

/// The context behind a `ctx` pointer, made current on this thread.
///
/// # Safety
/// `ctx` is null or a pointer `init` returned and `shutdown` has not freed.
pub(crate) unsafe fn ctx_ref<'a>(ctx: *mut c_void) -> Result<&'a Ctx, PluginError> {
    if ctx.is_null() {
        return Err(PluginError::invalid("null backend context"));
    }
    // SAFETY: by the caller's contract, a live `Ctx` made by `init`.
    let c = unsafe { &*(ctx as *const Ctx) };
    c.gpu.bind()?;
    Ok(c)
}

/// The argument struct behind a kernel's `args` pointer.
///
/// # Safety
/// `p` is null or points to a valid `A`.
pub(crate) unsafe fn args_ref<'a, A>(kernel: &str, p: *const A) -> Result<&'a A, PluginError> {
    if p.is_null() {
        return Err(PluginError::invalid(format!(
            "{kernel}: null argument struct"
        )));
    }
    // SAFETY: non-null and valid by the caller's contract.
    Ok(unsafe { &*p })
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

unsafe extern "C" fn init(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    guard(|| {
        if ctx.is_null() {
            return Err(PluginError::invalid("init: null ctx out pointer"));
        }
        // SAFETY: the host passes a valid (or null) HostApi.
        let c = unsafe { Ctx::new(host)? };
        // SAFETY: non-null out pointer.
        unsafe { *ctx = Box::into_raw(Box::new(c)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn shutdown(ctx: *mut c_void) {
    let _ = guard(|| {
        if !ctx.is_null() {
            // SAFETY: `ctx` came from `Box::into_raw` in `init` and the host
            // calls shutdown once; dropping it frees its buffers.
            drop(unsafe { Box::from_raw(ctx as *mut Ctx) });
        }
        Ok(())
    });
}

unsafe extern "C" fn last_error() -> *const c_char {
    plugin::last_error_ptr()
}

unsafe extern "C" fn device_count(ctx: *mut c_void, count: *mut u32) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? };
        if count.is_null() {
            return Err(PluginError::invalid("device_count: null out pointer"));
        }
        // SAFETY: non-null out pointer from the host.
        unsafe { *count = 1 };
        Ok(())
    })
}

unsafe extern "C" fn device_info(
    ctx: *mut c_void,
    index: u32,
    info: *mut abi::DeviceInfo,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if index != 0 {
            return Err(PluginError::invalid(format!(
                "device_info: device index {index} does not exist (this context drives 1 device)"
            )));
        }
        if info.is_null() {
            return Err(PluginError::invalid("device_info: null out pointer"));
        }
        let name = format!("{} ({})", c.gpu.name, c.gpu.arch);
        let (free, total) = c.gpu.mem_info();
        let mut out = abi::DeviceInfo {
            name: [0; 128],
            total_memory: total,
            free_memory: free,
            compute_units: compute_units(c),
            reserved: 0,
        };
        for (d, &b) in out.name.iter_mut().zip(name.as_bytes().iter().take(127)) {
            *d = b as c_char;
        }
        // SAFETY: non-null out pointer from the host.
        unsafe { *info = out };
        Ok(())
    })
}

unsafe extern "C" fn alloc(
    ctx: *mut c_void,
    bytes: u64,
    name: *const c_char,
    handle: *mut u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if handle.is_null() {
            return Err(PluginError::invalid("alloc: null handle out pointer"));
        }
        let h = c.memory.alloc(&c.gpu, bytes, &buffer_name(name))?;
        // SAFETY: non-null out pointer from the host.
        unsafe { *handle = h };
        Ok(())
    })
}

unsafe extern "C" fn free(ctx: *mut c_void, handle: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        c.memory.free(&c.gpu, handle)
    })
}

unsafe extern "C" fn copy_to_device(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if bytes > 0 && src.is_null() {
            return Err(PluginError::invalid("copy_to_device: null source"));
        }
        let dst = c.memory.range("copy_to_device", handle, offset, bytes)?;
        c.gpu.upload(dst, src as *const u8, bytes)
    })
}

unsafe extern "C" fn copy_to_host(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        if bytes > 0 && dst.is_null() {
            return Err(PluginError::invalid("copy_to_host: null destination"));
        }
        let src = c.memory.range("copy_to_host", handle, offset, bytes)?;
        c.gpu.download(dst as *mut u8, src, bytes)
    })
}

unsafe extern "C" fn reset(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref(ctx)? };
        let p = c.memory.range("reset", handle, offset, bytes)?;
        if bytes == 0 {
            return Ok(());
        }
        use memory::DeviceAlloc;
        c.gpu.raw_zero(p, bytes)
    })
}

unsafe extern "C" fn synchronize(ctx: *mut c_void) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        unsafe { ctx_ref(ctx)? }.gpu.synchronize()
    })
}
