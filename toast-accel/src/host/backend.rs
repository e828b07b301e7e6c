//! Loading one plugin file and initialising a backend from it.

use super::error::{AccelError, LoadError, StatusKind};
use crate::abi::{self, BackendHeader, BackendTable, DeviceMemoryKind, EntryFn, Kernel};
pub use crate::kernels::KernelArgs;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A plugin file that passed the header checks. Never unloaded.
#[derive(Debug)]
pub struct Plugin {
    pub path: PathBuf,
    pub name: String,
    pub version: String,
    pub description: String,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub flags: u32,
    /// The plugin's table, truncated or zero-extended to the host's layout.
    pub table: BackendTable,
}

// SAFETY: the table holds only `extern "C"` function pointers, which plugins
// must make callable from any thread (documented in the header).
unsafe impl Send for Plugin {}
// SAFETY: the fields are immutable after loading (no interior mutability) and the
// table's function pointers are callable from any thread (header rule), so `&Plugin`
// may be shared between threads.
unsafe impl Sync for Plugin {}

/// The most bytes the host reads of a string a plugin hands it (header
/// strings, `last_error`, log messages), its NUL excluded.
pub const MAX_PLUGIN_STRING: usize = 4096;
/// The longest backend name the host accepts, in bytes.
pub const MAX_NAME_LEN: usize = 64;
/// The most devices the host believes a backend has (`device_count`).
pub const MAX_DEVICES: u32 = 1024;
/// The largest `table_size` the host accepts (8192 entries): a table grows
/// by one pointer per kernel, so anything bigger is not a real table.
pub const MAX_TABLE_SIZE: u32 = 64 * 1024;

/// A string a plugin handed over, read byte by byte up to its NUL and never
/// past [`MAX_PLUGIN_STRING`] bytes: `Ok` with the text (lossy UTF-8; empty
/// for null), or `Err` with the bytes read when no NUL came within the
/// limit.
///
/// # Safety
/// `p` is null, or the bytes from `p` up to its first NUL, or up to
/// [`MAX_PLUGIN_STRING`] bytes when there is none sooner, are readable.
unsafe fn plugin_str(p: *const c_char) -> Result<String, String> {
    if p.is_null() {
        return Ok(String::new());
    }
    let mut bytes = Vec::new();
    for i in 0..MAX_PLUGIN_STRING {
        // SAFETY: every byte before the first NUL, within the limit, is
        // readable by the caller's contract, and reading stops at the NUL.
        let b = unsafe { p.add(i).read() } as u8;
        if b == 0 {
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        bytes.push(b);
    }
    Err(String::from_utf8_lossy(&bytes).into_owned())
}

/// A header string, or why the header is malformed.
///
/// # Safety
/// As [`plugin_str`].
unsafe fn header_str(p: *const c_char, field: &str) -> Result<String, String> {
    // SAFETY: forwarded to the caller.
    unsafe { plugin_str(p) }.map_err(|_| {
        format!("the {field} string has no terminating NUL within {MAX_PLUGIN_STRING} bytes")
    })
}

/// The dynamic loader's own message (`dlerror`'s text, which libloading
/// keeps as the error's source behind a bare "dlopen failed"), else the
/// error's.
fn loader_message(e: &libloading::Error) -> String {
    match std::error::Error::source(e) {
        Some(system) => system.to_string(),
        None => e.to_string(),
    }
}

impl Plugin {
    /// Open `path`, find the entry symbol and check the header.
    pub fn load(path: &Path) -> Result<Plugin, LoadError> {
        let p = path.to_path_buf();
        if !path.exists() {
            return Err(LoadError::Missing { path: p });
        }
        // dlopen maps segments as the file's headers say: a file cut short
        // faults (SIGBUS) when touched, so look before handing it over.
        if let Some(reason) = super::elf::check_library_file(path) {
            return Err(LoadError::NotLibrary { path: p, reason });
        }
        // SAFETY: loading a shared library runs its initialisers; plugins are
        // trusted code the user pointed us at (explicit path, environment
        // variable or the executable's directory).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| LoadError::Open {
            path: p.clone(),
            reason: loader_message(&e),
        })?;
        // Plugins are never unloaded: leak the library handle.
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: the symbol's type is fixed by the ABI (`toast_backend_entry_fn`).
        let entry: libloading::Symbol<'static, EntryFn> = unsafe {
            lib.get(abi::ENTRY_SYMBOL.as_bytes())
        }
        .map_err(|e| LoadError::MissingSymbol {
            path: p.clone(),
            symbol: abi::ENTRY_SYMBOL,
            reason: loader_message(&e),
        })?;
        // SAFETY: `entry` is the plugin's exported `toast_backend_entry`, and
        // the library stays loaded for the life of the process.
        unsafe { Self::from_entry(*entry, path) }
    }

    /// Check the header returned by an entry function that is already in
    /// the process (a backend linked statically, or one a test defines).
    /// `origin` names it in errors and listings.
    ///
    /// # Safety
    /// `entry` must behave as `toast_backend_entry` of the ABI: it returns
    /// null or a pointer to a header that, when its magic matches, is a
    /// complete static `toast_backend_header` of ABI major 1, whose table and
    /// functions stay valid for the life of the process.
    pub unsafe fn from_entry(entry: EntryFn, origin: &Path) -> Result<Plugin, LoadError> {
        let p = origin.to_path_buf();
        // SAFETY: calling the entry function the ABI defines; it takes no arguments.
        let hdr_ptr = unsafe { entry() };
        if hdr_ptr.is_null() {
            return Err(LoadError::NullHeader {
                path: p,
                symbol: abi::ENTRY_SYMBOL,
            });
        }
        if !(hdr_ptr as usize).is_multiple_of(std::mem::align_of::<BackendHeader>()) {
            return Err(LoadError::Malformed {
                path: p,
                reason: format!(
                    "the header at {hdr_ptr:p} is not aligned to {} bytes",
                    std::mem::align_of::<BackendHeader>()
                ),
            });
        }
        // Read the magic alone first: a foreign symbol may point at anything
        // small, and the magic is the first field.
        // SAFETY: non-null; the first 8 bytes are the magic in every ABI version.
        let magic = unsafe { std::ptr::read_unaligned(hdr_ptr as *const u64) };
        if magic != abi::MAGIC {
            return Err(LoadError::BadMagic {
                path: p,
                found: magic,
                expected: abi::MAGIC,
            });
        }
        // SAFETY: the magic matched, so this is a toast header whose fixed
        // prefix (through `table`) is present in every ABI major 1 plugin.
        let hdr: &BackendHeader = unsafe { &*hdr_ptr };
        if hdr.abi_major != abi::ABI_MAJOR {
            return Err(LoadError::AbiMajor {
                path: p,
                plugin: hdr.abi_major,
                host: abi::ABI_MAJOR,
            });
        }
        if hdr.table.is_null() {
            return Err(LoadError::Malformed {
                path: p,
                reason: "null function table".into(),
            });
        }
        if hdr.name.is_null() {
            return Err(LoadError::Malformed {
                path: p,
                reason: "null backend name".into(),
            });
        }
        let entry_size = std::mem::size_of::<Option<abi::InitFn>>() as u32;
        if hdr.table_size > MAX_TABLE_SIZE || !hdr.table_size.is_multiple_of(entry_size) {
            return Err(LoadError::Malformed {
                path: p,
                reason: format!(
                    "table_size {} is not a whole number of {entry_size}-byte entries of at \
                     most {MAX_TABLE_SIZE} bytes",
                    hdr.table_size
                ),
            });
        }
        let mut table = BackendTable::default();
        let n = (hdr.table_size as usize).min(std::mem::size_of::<BackendTable>());
        // SAFETY: the plugin's table has at least `table_size` bytes; we copy
        // at most that many into a zeroed table of the host's layout, whose
        // fields are all `Option<fn>` (all-zero bytes are `None`).
        unsafe {
            std::ptr::copy_nonoverlapping(
                hdr.table as *const u8,
                &mut table as *mut BackendTable as *mut u8,
                n,
            );
        }
        // SAFETY: the header strings are static and NUL-terminated by the
        // ABI; none is read past its NUL or MAX_PLUGIN_STRING bytes.
        let strings = unsafe {
            (
                header_str(hdr.name, "name"),
                header_str(hdr.version, "version"),
                header_str(hdr.description, "description"),
            )
        };
        let (name, version, description) = match strings {
            (Ok(n), Ok(v), Ok(d)) => (n, v, d),
            (Err(reason), _, _) | (_, Err(reason), _) | (_, _, Err(reason)) => {
                return Err(LoadError::Malformed { path: p, reason });
            }
        };
        if name.len() > MAX_NAME_LEN {
            return Err(LoadError::Malformed {
                path: p,
                reason: format!(
                    "the backend name has {} bytes, more than {MAX_NAME_LEN}",
                    name.len()
                ),
            });
        }
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(LoadError::Malformed {
                path: p,
                reason: format!("invalid backend name {name:?}"),
            });
        }
        if table.init.is_none() || table.last_error.is_none() {
            return Err(LoadError::Malformed {
                path: p,
                reason: "the table has no `init` or no `last_error`".into(),
            });
        }
        Ok(Plugin {
            path: p,
            name,
            version,
            description,
            abi_major: hdr.abi_major,
            abi_minor: hdr.abi_minor,
            flags: hdr.flags,
            table,
        })
    }

    /// Whether kernels of this plugin take host addresses.
    pub fn host_addressable(&self) -> bool {
        self.flags & abi::FLAG_HOST_ADDRESSABLE != 0
    }

    /// The kernels this plugin implements.
    pub fn kernels(&self) -> Vec<Kernel> {
        Kernel::ALL
            .into_iter()
            .filter(|k| k.in_table(&self.table))
            .collect()
    }

    /// The plugin's last error message on this thread, cut at
    /// [`MAX_PLUGIN_STRING`] bytes (saying so) when it has no NUL by then.
    pub fn last_error(&self) -> String {
        let Some(f) = self.table.last_error else {
            return String::new();
        };
        // SAFETY: `last_error` takes no arguments and returns null or a
        // NUL-terminated string valid until the next call on this thread;
        // it is not read past its NUL or MAX_PLUGIN_STRING bytes.
        match unsafe { plugin_str(f()) } {
            Ok(s) => s,
            Err(head) => format!(
                "{head} [cut: the plugin's message has no NUL within {MAX_PLUGIN_STRING} bytes]"
            ),
        }
    }

    /// Initialise a backend context. A plugin whose hardware or runtime is
    /// absent answers `Unavailable` with its reason.
    pub fn init(self: &Arc<Self>, options: &str) -> Result<Backend, AccelError> {
        let Some(init) = self.table.init else {
            return Err(AccelError::Unavailable {
                backend: self.name.clone(),
                reason: "the plugin's table has no `init` entry".into(),
            });
        };
        let Ok(opts) = CString::new(options) else {
            return Err(AccelError::InitFailed {
                backend: self.name.clone(),
                kind: StatusKind::InvalidArgument,
                message: format!(
                    "its options {options:?} contain a NUL byte, which would cut them short"
                ),
            });
        };
        let log_user = Box::leak(Box::new(self.name.clone())) as *mut String as *mut c_void;
        let api = abi::HostApi {
            size: std::mem::size_of::<abi::HostApi>() as u32,
            abi_minor: abi::ABI_MINOR,
            log: Some(log_bridge),
            log_user,
            options: opts.as_ptr(),
        };
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: `api` and `opts` outlive the call; `ctx` is a valid out pointer.
        let status = unsafe { init(&api, &mut ctx) };
        match status {
            abi::OK => Ok(Backend {
                plugin: Arc::clone(self),
                ctx,
                stats: TransferStats::default(),
            }),
            abi::ERR_UNAVAILABLE => Err(AccelError::Unavailable {
                backend: self.name.clone(),
                reason: self.last_error(),
            }),
            s => Err(AccelError::InitFailed {
                backend: self.name.clone(),
                kind: StatusKind::from_status(s),
                message: self.last_error(),
            }),
        }
    }
}

/// The logging callback handed to plugins; forwards into `tracing`.
unsafe extern "C" fn log_bridge(user: *mut c_void, level: i32, msg: *const c_char, len: usize) {
    let _ = std::panic::catch_unwind(|| {
        if msg.is_null() {
            return;
        }
        let name: &str = if user.is_null() {
            "?"
        } else {
            // SAFETY: `user` is the leaked (never freed) backend name that
            // `Plugin::init` passed to the plugin as `log_user`.
            unsafe { &*(user as *const String) }
        };
        let shown = len.min(MAX_PLUGIN_STRING);
        // SAFETY: the plugin passes `len` readable bytes at `msg`; at most
        // `shown <= len` of them are read.
        let bytes = unsafe { std::slice::from_raw_parts(msg as *const u8, shown) };
        let mut text = String::from_utf8_lossy(bytes);
        if shown < len {
            text.to_mut()
                .push_str(&format!(" [cut at {shown} of {len} bytes]"));
        }
        match level {
            abi::LOG_ERROR => tracing::error!(target: "toast_backend", backend = name, "{text}"),
            abi::LOG_WARN => tracing::warn!(target: "toast_backend", backend = name, "{text}"),
            abi::LOG_INFO => tracing::info!(target: "toast_backend", backend = name, "{text}"),
            abi::LOG_DEBUG => tracing::debug!(target: "toast_backend", backend = name, "{text}"),
            _ => tracing::trace!(target: "toast_backend", backend = name, "{text}"),
        }
    });
}

/// Counts of memory operations, in each direction.
#[derive(Debug, Default)]
pub struct TransferStats {
    pub allocs: AtomicU64,
    pub alloc_bytes: AtomicU64,
    pub frees: AtomicU64,
    pub h2d_calls: AtomicU64,
    pub h2d_bytes: AtomicU64,
    pub d2h_calls: AtomicU64,
    pub d2h_bytes: AtomicU64,
    pub resets: AtomicU64,
}

/// A plain copy of [`TransferStats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TransferSnapshot {
    pub allocs: u64,
    pub alloc_bytes: u64,
    pub frees: u64,
    pub h2d_calls: u64,
    pub h2d_bytes: u64,
    pub d2h_calls: u64,
    pub d2h_bytes: u64,
    pub resets: u64,
}

impl TransferStats {
    pub fn snapshot(&self) -> TransferSnapshot {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransferSnapshot {
            allocs: l(&self.allocs),
            alloc_bytes: l(&self.alloc_bytes),
            frees: l(&self.frees),
            h2d_calls: l(&self.h2d_calls),
            h2d_bytes: l(&self.h2d_bytes),
            d2h_calls: l(&self.d2h_calls),
            d2h_bytes: l(&self.d2h_bytes),
            resets: l(&self.resets),
        }
    }
    pub fn reset(&self) {
        for a in [
            &self.allocs,
            &self.alloc_bytes,
            &self.frees,
            &self.h2d_calls,
            &self.h2d_bytes,
            &self.d2h_calls,
            &self.d2h_bytes,
            &self.resets,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// An initialised backend: a plugin and its context.
#[derive(Debug)]
pub struct Backend {
    plugin: Arc<Plugin>,
    ctx: *mut c_void,
    stats: TransferStats,
}

// SAFETY: plugins must accept calls on a context from any thread (ABI rule).
unsafe impl Send for Backend {}
// SAFETY: `&Backend` only reads `plugin` and `ctx` and updates the atomic `stats`;
// plugins must accept concurrent calls on a context from any thread (ABI rule).
unsafe impl Sync for Backend {}

impl Backend {
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }
    pub fn name(&self) -> &str {
        &self.plugin.name
    }
    pub fn host_addressable(&self) -> bool {
        self.plugin.host_addressable()
    }
    pub fn supports(&self, k: Kernel) -> bool {
        k.in_table(&self.plugin.table)
    }
    /// Whether `pixels_healpix` can write i32 pixels (`pixels_i32`, the
    /// compact pointing): a plugin of ABI minor 8 or later. An older one
    /// reads the field as reserved and would write i64s.
    pub fn writes_i32_pixels(&self) -> bool {
        self.plugin.abi_minor >= 8
    }
    pub fn stats(&self) -> &TransferStats {
        &self.stats
    }

    /// Run a kernel with raw ABI arguments.
    ///
    /// # Safety
    /// Every pointer in `args` must be valid for the lengths it declares
    /// (host memory for host arrays; host addresses or live handles of this
    /// backend for `Array` fields, as [`Backend::host_addressable`] says),
    /// and nothing else may access the output arrays during the call.
    pub unsafe fn launch<A: KernelArgs>(&self, args: &A) -> Result<(), AccelError> {
        let Some(f) = A::entry(&self.plugin.table) else {
            return Err(AccelError::Unsupported {
                backend: self.name().to_string(),
                kernel: A::KERNEL,
            });
        };
        // SAFETY: the caller guarantees the arguments are valid.
        let status = unsafe { f(self.ctx, args) };
        self.kernel_status(A::KERNEL, status)
    }

    fn kernel_status(&self, kernel: Kernel, status: abi::Status) -> Result<(), AccelError> {
        if status == abi::OK {
            return Ok(());
        }
        let kind = StatusKind::from_status(status);
        if kind == StatusKind::Unsupported {
            return Err(AccelError::Unsupported {
                backend: self.name().to_string(),
                kernel,
            });
        }
        Err(AccelError::Kernel {
            backend: self.name().to_string(),
            kernel,
            kind,
            message: self.plugin.last_error(),
        })
    }

    fn mem_status(&self, op: &'static str, status: abi::Status) -> Result<(), AccelError> {
        if status == abi::OK {
            return Ok(());
        }
        Err(AccelError::Memory {
            backend: self.name().to_string(),
            op,
            kind: StatusKind::from_status(status),
            message: self.plugin.last_error(),
        })
    }

    fn mem_unsupported(&self, op: &'static str) -> AccelError {
        AccelError::Memory {
            backend: self.name().to_string(),
            op,
            kind: StatusKind::Unsupported,
            message: "the plugin has no entry for this operation".into(),
        }
    }

    /// Number of devices the backend sees.
    pub fn device_count(&self) -> Result<u32, AccelError> {
        let Some(f) = self.plugin.table.device_count else {
            return Ok(0);
        };
        let mut n = 0u32;
        // SAFETY: valid context and out pointer.
        let s = unsafe { f(self.ctx, &mut n) };
        self.mem_status("device_count", s)?;
        if n > MAX_DEVICES {
            return Err(AccelError::Memory {
                backend: self.name().to_string(),
                op: "device_count",
                kind: StatusKind::Internal,
                message: format!(
                    "the plugin reports {n} devices, more than the {MAX_DEVICES} the host accepts"
                ),
            });
        }
        Ok(n)
    }

    /// Name, memory and compute units of device `index`.
    pub fn device_info(&self, index: u32) -> Result<DeviceSummary, AccelError> {
        let Some(f) = self.plugin.table.device_info else {
            return Err(self.mem_unsupported("device_info"));
        };
        // Zeroed: a plugin of an older minor writes only the fields it
        // knows, and leaves the memory kind unknown.
        let mut info = abi::DeviceInfo::ZERO;
        // SAFETY: valid context and out pointer to the whole struct of
        // this host's minor.
        let s = unsafe { f(self.ctx, index, &mut info) };
        self.mem_status("device_info", s)?;
        // The name is a fixed array: read up to its first NUL, or all of it
        // when the plugin left none.
        let bytes: Vec<u8> = info.name.iter().map(|&c| c as u8).collect();
        let name = match CStr::from_bytes_until_nul(&bytes) {
            Ok(c) => c.to_string_lossy().into_owned(),
            Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
        };
        Ok(DeviceSummary {
            name,
            total_memory: info.total_memory,
            free_memory: info.free_memory,
            compute_units: info.compute_units,
            // Before minor 7 the field was `reserved`: not read.
            peak_held_bytes: (self.plugin.abi_minor >= 7 && info.peak_held_mib > 0)
                .then(|| u64::from(info.peak_held_mib) << 20),
            // Before minor 9 the struct ended above: not read.
            memory_kind: match self.plugin.abi_minor >= 9 {
                true => DeviceMemoryKind::from_abi(info.memory_kind),
                false => DeviceMemoryKind::Unknown,
            },
            identity: info.identity(self.plugin.abi_minor),
        })
    }

    /// Allocate a device buffer of `bytes` bytes.
    pub fn alloc(&self, bytes: u64, name: &str) -> Result<u64, AccelError> {
        let Some(f) = self.plugin.table.alloc else {
            return Err(self.mem_unsupported("alloc"));
        };
        let cname = CString::new(name.replace('\0', "")).unwrap_or_default();
        let mut h = 0u64;
        // SAFETY: valid context, NUL-terminated name, valid out pointer.
        let s = unsafe { f(self.ctx, bytes, cname.as_ptr(), &mut h) };
        self.mem_status("alloc", s)?;
        self.stats.allocs.fetch_add(1, Ordering::Relaxed);
        self.stats.alloc_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(h)
    }

    /// Free a buffer of this backend.
    pub fn free(&self, handle: u64) -> Result<(), AccelError> {
        let Some(f) = self.plugin.table.free else {
            return Err(self.mem_unsupported("free"));
        };
        // SAFETY: the plugin validates the handle.
        let s = unsafe { f(self.ctx, handle) };
        self.mem_status("free", s)?;
        self.stats.frees.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Copy host bytes into a buffer at `offset`.
    pub fn copy_to_device(&self, handle: u64, offset: u64, src: &[u8]) -> Result<(), AccelError> {
        let Some(f) = self.plugin.table.copy_to_device else {
            return Err(self.mem_unsupported("copy_to_device"));
        };
        // SAFETY: `src` is valid for its length; the plugin validates the handle and range.
        let s = unsafe {
            f(
                self.ctx,
                handle,
                offset,
                src.as_ptr() as *const c_void,
                src.len() as u64,
            )
        };
        self.mem_status("copy_to_device", s)?;
        self.stats.h2d_calls.fetch_add(1, Ordering::Relaxed);
        self.stats
            .h2d_bytes
            .fetch_add(src.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Copy bytes from a buffer at `offset` into host memory.
    pub fn copy_to_host(&self, handle: u64, offset: u64, dst: &mut [u8]) -> Result<(), AccelError> {
        let Some(f) = self.plugin.table.copy_to_host else {
            return Err(self.mem_unsupported("copy_to_host"));
        };
        // SAFETY: `dst` is valid for writes of its length; the plugin validates the handle and range.
        let s = unsafe {
            f(
                self.ctx,
                handle,
                offset,
                dst.as_mut_ptr() as *mut c_void,
                dst.len() as u64,
            )
        };
        self.mem_status("copy_to_host", s)?;
        self.stats.d2h_calls.fetch_add(1, Ordering::Relaxed);
        self.stats
            .d2h_bytes
            .fetch_add(dst.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Zero `bytes` bytes of a buffer from `offset`.
    pub fn reset(&self, handle: u64, offset: u64, bytes: u64) -> Result<(), AccelError> {
        let Some(f) = self.plugin.table.reset else {
            return Err(self.mem_unsupported("reset"));
        };
        // SAFETY: the plugin validates the handle and range.
        let s = unsafe { f(self.ctx, handle, offset, bytes) };
        self.mem_status("reset", s)?;
        self.stats.resets.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Wait for all queued work of the backend.
    pub fn synchronize(&self) -> Result<(), AccelError> {
        let Some(f) = self.plugin.table.synchronize else {
            return Ok(());
        };
        // SAFETY: valid context.
        let s = unsafe { f(self.ctx) };
        self.mem_status("synchronize", s)
    }
}

/// Host-side copy of a device's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    pub name: String,
    pub total_memory: u64,
    pub free_memory: u64,
    pub compute_units: u32,
    /// The most device memory the backend's allocator has held at once
    /// since `init` (buffers, kernel scratch, caches), in bytes, rounded up
    /// to a MiB: the measured device peak. `None` when the plugin does not
    /// tell (host-addressable, or built before ABI minor 7).
    pub peak_held_bytes: Option<u64>,
    /// Whose memory the device's allocations take (ABI minor 9; unknown
    /// from an older plugin).
    pub memory_kind: DeviceMemoryKind,
    /// The device's UUID (ABI minor 10), the same in every process that
    /// drives it: `None` from an older plugin or one that cannot tell.
    pub identity: Option<[u8; 16]>,
}

impl toast_core::device::DeviceMemory for Backend {
    fn backend_name(&self) -> &str {
        self.name()
    }
    fn alloc(&self, bytes: u64, name: &str) -> Result<u64, toast_core::device::DeviceError> {
        Backend::alloc(self, bytes, name).map_err(|e| to_device_error(self, "alloc", e))
    }
    fn free(&self, handle: u64) -> Result<(), toast_core::device::DeviceError> {
        Backend::free(self, handle).map_err(|e| to_device_error(self, "free", e))
    }
    fn copy_to_device(
        &self,
        handle: u64,
        offset: u64,
        src: &[u8],
    ) -> Result<(), toast_core::device::DeviceError> {
        Backend::copy_to_device(self, handle, offset, src)
            .map_err(|e| to_device_error(self, "copy_to_device", e))
    }
    fn copy_to_host(
        &self,
        handle: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), toast_core::device::DeviceError> {
        Backend::copy_to_host(self, handle, offset, dst)
            .map_err(|e| to_device_error(self, "copy_to_host", e))
    }
    fn reset(
        &self,
        handle: u64,
        offset: u64,
        bytes: u64,
    ) -> Result<(), toast_core::device::DeviceError> {
        Backend::reset(self, handle, offset, bytes).map_err(|e| to_device_error(self, "reset", e))
    }
}

fn to_device_error(
    b: &Backend,
    op: &'static str,
    e: AccelError,
) -> toast_core::device::DeviceError {
    let message = match e {
        AccelError::Memory { kind, message, .. } => format!("{kind}: {message}"),
        other => other.to_string(),
    };
    toast_core::device::DeviceError {
        backend: b.name().to_string(),
        op,
        message,
    }
}
