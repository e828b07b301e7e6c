//! `fakedev`: a backend that is **not** host-addressable, for tests.
//!
//! Its buffers are opaque handles (`0x7000_0000`, `0x7000_1000`, ...) into
//! memory it owns, and its kernels translate the handles to addresses of
//! that memory and forward to the CPU plugin (linked in as an rlib). It
//! stands in for a GPU: a kernel given a host address instead of a handle
//! fails ("not a handle of this device"), so a test passes only if every
//! array was staged or copied, and the results are the CPU plugin's. Its
//! `init` takes the CPU plugin's options and, as the GPU plugins do,
//! `memory=GiB`: a budget the host's fitter reads, not enforced here. Its
//! `device_info` is the CPU plugin's: the host's memory, and (ABI minor 9)
//! a device whose allocations take the host's memory, as the fake's do.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use toast_accel::abi::{self, Array, BackendHeader, BackendTable, HostApi, Status};
use toast_accel::kernels::KernelArgs;

fn cpu_table() -> &'static BackendTable {
    // SAFETY: the CPU plugin's entry point returns a pointer to its static
    // header, whose `table` points to its static function table: both live
    // for the whole program and are never written.
    unsafe { &*(*toast_backend_cpu::toast_backend_entry()).table }
}

struct FakeCtx {
    cpu: *mut c_void,
    mem: Mutex<HashMap<u64, Vec<u8>>>,
    next: AtomicU64,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(status: Status, msg: String) -> Status {
    LAST.with(|l| *l.borrow_mut() = CString::new(msg.replace('\0', "")).unwrap_or_default());
    status
}

fn clear() {
    LAST.with(|l| *l.borrow_mut() = CString::default());
}

/// # Safety
/// `ctx` is a pointer made by `fake_init`.
unsafe fn fctx<'a>(ctx: *mut c_void) -> &'a FakeCtx {
    // SAFETY: the caller guarantees `ctx` came from `fake_init` (a leaked
    // `Box<FakeCtx>`) and that `fake_shutdown` has not freed it yet.
    unsafe { &*(ctx as *const FakeCtx) }
}

/// The `init` options without `memory=`: the device memory budget, which
/// the host reads from the options as it does for a GPU plugin (the budget
/// fitter), is not enforced by the fake device, and the CPU plugin it
/// forwards to knows no such option.
fn cpu_options(options: &str) -> CString {
    let kept: Vec<&str> = options
        .split(';')
        .filter(|item| {
            item.split_once('=')
                .is_none_or(|(k, _)| k.trim() != "memory")
        })
        .collect();
    CString::new(kept.join(";")).unwrap_or_default()
}

unsafe extern "C" fn fake_init(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    clear();
    if host.is_null() {
        return fail(abi::ERR_INVALID_ARGUMENT, "init: null host API".into());
    }
    // SAFETY: `host` is the host's API table, valid for the call as the ABI
    // requires of `init`; `options` is null or NUL-terminated.
    let mut api = unsafe { *host };
    let options = match api.options.is_null() {
        true => String::new(),
        // SAFETY: non-null, NUL-terminated (ABI contract), valid for the call.
        false => unsafe { CStr::from_ptr(api.options) }
            .to_string_lossy()
            .into_owned(),
    };
    let options = cpu_options(&options);
    api.options = options.as_ptr();
    let mut cpu = std::ptr::null_mut();
    // SAFETY: `api` is the host's API table with the options replaced by a
    // string that lives through the call, and `cpu` is a live local out
    // pointer.
    let s = unsafe { cpu_table().init.expect("cpu init")(&api, &mut cpu) };
    if s != abi::OK {
        return fail(s, "cpu init failed".into());
    }
    let c = Box::new(FakeCtx {
        cpu,
        mem: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0x7000_0000),
    });
    // SAFETY: the ABI requires the host to pass a writable out pointer as
    // `ctx` to `init`.
    unsafe { *ctx = Box::into_raw(c) as *mut c_void };
    abi::OK
}

unsafe extern "C" fn fake_shutdown(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: a non-null `ctx` is the `Box::into_raw` of `fake_init`, and
        // the host calls `shutdown` once per context, so it is freed once.
        let c = unsafe { Box::from_raw(ctx as *mut FakeCtx) };
        // SAFETY: `c.cpu` is the CPU plugin's context made by its `init` in
        // `fake_init`, shut down only here.
        unsafe { cpu_table().shutdown.expect("cpu shutdown")(c.cpu) };
    }
}

unsafe extern "C" fn fake_last_error() -> *const c_char {
    let mine = LAST.with(|l| {
        let b = l.borrow();
        (!b.as_bytes().is_empty()).then(|| b.as_ptr())
    });
    // The CString lives in the thread-local until the next call on this thread.
    match mine {
        Some(p) => p,
        // SAFETY: the CPU plugin's `last_error` takes no arguments and
        // returns a NUL-terminated string it owns (ABI contract).
        None => unsafe { cpu_table().last_error.expect("cpu last_error")() },
    }
}

unsafe extern "C" fn fake_device_count(_ctx: *mut c_void, count: *mut u32) -> Status {
    // SAFETY: the ABI requires the host to pass a writable out pointer.
    unsafe { *count = 1 };
    abi::OK
}

unsafe extern "C" fn fake_alloc(
    ctx: *mut c_void,
    bytes: u64,
    _name: *const c_char,
    handle: *mut u64,
) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made; it stays
    // live until `fake_shutdown`, which the host calls last.
    let c = unsafe { fctx(ctx) };
    let h = c.next.fetch_add(0x1000, Ordering::Relaxed);
    c.mem.lock().unwrap().insert(h, vec![0u8; bytes as usize]);
    // SAFETY: the ABI requires the host to pass a writable out pointer.
    unsafe { *handle = h };
    abi::OK
}

unsafe extern "C" fn fake_free(ctx: *mut c_void, handle: u64) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made; it stays
    // live until `fake_shutdown`, which the host calls last.
    let c = unsafe { fctx(ctx) };
    match c.mem.lock().unwrap().remove(&handle) {
        Some(_) => abi::OK,
        None => fail(
            abi::ERR_INVALID_HANDLE,
            format!("free: unknown handle {handle:#x}"),
        ),
    }
}

/// Run `f` on bytes `[offset, offset + bytes)` of buffer `handle`, or fail
/// (an unknown handle, a range outside the buffer) naming the call `what`.
fn with_range(
    c: &FakeCtx,
    what: &str,
    handle: u64,
    offset: u64,
    bytes: u64,
    f: impl FnOnce(&mut [u8]),
) -> Status {
    let mut mem = c.mem.lock().unwrap();
    let Some(b) = mem.get_mut(&handle) else {
        return fail(
            abi::ERR_INVALID_HANDLE,
            format!("{what}: unknown handle {handle:#x}"),
        );
    };
    let (o, n) = (offset as usize, bytes as usize);
    match o.checked_add(n).and_then(|end| b.get_mut(o..end)) {
        Some(range) => {
            f(range);
            abi::OK
        }
        None => fail(abi::ERR_INVALID_ARGUMENT, format!("{what}: out of range")),
    }
}

unsafe extern "C" fn fake_to_device(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made; it stays
    // live until `fake_shutdown`, which the host calls last.
    let c = unsafe { fctx(ctx) };
    with_range(c, "copy_to_device", handle, offset, bytes, |d| {
        // SAFETY: the ABI requires `bytes` readable bytes at `src`, and
        // `d.len()` is `bytes`.
        let s = unsafe { std::slice::from_raw_parts(src as *const u8, d.len()) };
        d.copy_from_slice(s);
    })
}

unsafe extern "C" fn fake_to_host(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made; it stays
    // live until `fake_shutdown`, which the host calls last.
    let c = unsafe { fctx(ctx) };
    with_range(c, "copy_to_host", handle, offset, bytes, |b| {
        // SAFETY: the ABI requires `bytes` writable bytes at `dst`, not
        // overlapping device memory, and `b.len()` is `bytes`.
        let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, b.len()) };
        d.copy_from_slice(b);
    })
}

unsafe extern "C" fn fake_reset(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made; it stays
    // live until `fake_shutdown`, which the host calls last.
    let c = unsafe { fctx(ctx) };
    with_range(c, "reset", handle, offset, bytes, |b| b.fill(0))
}

unsafe extern "C" fn fake_sync(_ctx: *mut c_void) -> Status {
    abi::OK
}

/// A device array (handle) as the host address of the fake device memory.
fn translate(mem: &mut HashMap<u64, Vec<u8>>, a: Array, what: &str) -> Result<Array, String> {
    if a.len == 0 {
        return Ok(a);
    }
    match mem.get_mut(&a.ptr) {
        Some(b) => Ok(Array {
            ptr: b.as_mut_ptr() as u64,
            len: a.len,
        }),
        None => Err(format!(
            "argument `{what}`: {:#x} is not a handle of this device (a host address?)",
            a.ptr
        )),
    }
}

/// Every kernel: translate the argument struct's arrays (the kernel
/// table lists them) from handles to addresses of this device's memory and
/// forward the call to the CPU plugin.
unsafe extern "C" fn forward<A: KernelArgs>(ctx: *mut c_void, a: *const A) -> Status {
    clear();
    // SAFETY: the host passes back the context `fake_init` made (live
    // until `fake_shutdown`), and `a` points to an initialised argument
    // struct of this kernel for the duration of the call (ABI contract).
    let (c, mut args) = unsafe { (fctx(ctx), *a) };
    let mut mem = c.mem.lock().unwrap();
    for (name, _, arr) in args.arrays_mut() {
        match translate(&mut mem, *arr, name) {
            Ok(x) => *arr = x,
            Err(e) => return fail(abi::ERR_INVALID_HANDLE, e),
        }
    }
    // SAFETY: every array now addresses live device memory of its declared
    // length (held locked during the call), and the host arrays are the
    // caller's.
    unsafe { A::entry(cpu_table()).expect("cpu kernel")(c.cpu, &args) }
}

unsafe extern "C" fn fake_device_info(
    ctx: *mut c_void,
    index: u32,
    info: *mut abi::DeviceInfo,
) -> Status {
    clear();
    // SAFETY: `ctx` came from `fake_init` (ABI contract); the CPU plugin's
    // context was made by the same `init` call, from the host's API (so it
    // writes the host's struct only), and `info` is the host's out pointer.
    unsafe { cpu_table().device_info.expect("cpu device_info")(fctx(ctx).cpu, index, info) }
}

static FAKE_TABLE: BackendTable = toast_accel::backend_table! {
    init: Some(fake_init),
    shutdown: Some(fake_shutdown),
    last_error: Some(fake_last_error),
    device_count: Some(fake_device_count),
    device_info: Some(fake_device_info),
    alloc: Some(fake_alloc),
    free: Some(fake_free),
    copy_to_device: Some(fake_to_device),
    copy_to_host: Some(fake_to_host),
    reset: Some(fake_reset),
    synchronize: Some(fake_sync);
    kernels = forward
};

static FAKE_HEADER: BackendHeader = BackendHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    table_size: std::mem::size_of::<BackendTable>() as u32,
    flags: 0,
    name: c"fakedev".as_ptr(),
    version: c"0".as_ptr(),
    description: c"test device: handles, CPU kernels".as_ptr(),
    table: &FAKE_TABLE,
};

/// `fakedev7`: the same device (the same table) under a header of ABI
/// minor 7, as a plugin built before minor 8 says: the host must not ask
/// its `pixels_healpix` for i32 pixels (`pixels_i32` was `reserved[0]`
/// then, and such a plugin writes i64s whatever it holds).
static FAKE_HEADER_MINOR_7: BackendHeader = BackendHeader {
    abi_minor: 7,
    name: c"fakedev7".as_ptr(),
    description: c"test device of ABI minor 7: handles, CPU kernels".as_ptr(),
    ..FAKE_HEADER
};

/// The entry point of `fakedev`, as a plugin's `toast_backend_entry`: its
/// static, complete header. Register it with
/// [`Registry::register_entry`](toast_accel::host::Registry::register_entry)
/// (as [`crate::plugins::registry`] does); its `init` options are passed on
/// to the CPU plugin (e.g. `threads=2`).
pub extern "C" fn entry() -> *const BackendHeader {
    &FAKE_HEADER
}

/// The entry point of `fakedev7` (ABI minor 7), as [`entry`]
/// ([`crate::plugins::registry_with_fakedev_minor_7`]).
pub extern "C" fn entry_abi_minor_7() -> *const BackendHeader {
    &FAKE_HEADER_MINOR_7
}
