//! Helpers for plugins written in Rust: what `init` reads of the host API
//! ([`HostSettings`], [`HostLog`]), the thread-local last error, and the
//! guard that turns a Rust result (or a panic) into a status code so that
//! nothing unwinds across the C boundary.

use crate::abi::{self, HostApi, LogFn, Status};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};

/// The host's log callback and its user pointer (none without a host API).
#[derive(Debug)]
pub struct HostLog {
    log: LogFn,
    user: *mut c_void,
}

// SAFETY: `user` is the host's pointer, which the ABI lets any thread pass
// back to its callback (`toast_log_fn` in the header: from any thread,
// concurrently); the callback itself is a plain function pointer.
unsafe impl Send for HostLog {}
// SAFETY: as for `Send`: the ABI allows the callback from any thread,
// concurrently, and a `HostLog` is never mutated after `init`.
unsafe impl Sync for HostLog {}

impl HostLog {
    /// No callback: messages are dropped.
    pub fn none() -> Self {
        HostLog {
            log: None,
            user: std::ptr::null_mut(),
        }
    }

    /// Hand `msg` at `level` (`abi::LOG_*`) to the host's callback, if any.
    pub fn log(&self, level: i32, msg: &str) {
        if let Some(f) = self.log {
            // SAFETY: the host's callback takes `len` bytes at `msg` and the
            // user pointer it gave us.
            unsafe { f(self.user, level, msg.as_ptr() as *const c_char, msg.len()) };
        }
    }
}

/// What a plugin's `init` reads of the host API: one parser for every Rust
/// plugin, so each reads the same fields under the same size rule.
#[derive(Debug)]
pub struct HostSettings {
    /// The log callback.
    pub log: HostLog,
    /// The options string (`key=value;...`), empty without one.
    pub options: String,
    /// The host's ABI minor: 0 without a host API, or with one shorter
    /// than this crate's struct (the device information a plugin writes
    /// is then the oldest struct's, `DeviceInfo::write_for_host`).
    pub abi_minor: u32,
}

impl HostSettings {
    /// Read the host API at `host`: its fields only where the struct the
    /// host declares (`size`) holds all of this crate's; else the
    /// settings of no host API.
    ///
    /// # Safety
    /// `host` is null or points to a `HostApi` of at least `host.size`
    /// bytes whose `options` is null or NUL-terminated.
    pub unsafe fn read(host: *const HostApi) -> Self {
        let mut settings = HostSettings {
            log: HostLog::none(),
            options: String::new(),
            abi_minor: 0,
        };
        if host.is_null() {
            return settings;
        }
        // SAFETY: non-null; the host passes a valid struct. Read the size first.
        let size = unsafe { std::ptr::addr_of!((*host).size).read() } as usize;
        if size >= std::mem::size_of::<HostApi>() {
            // SAFETY: the whole struct is present.
            let h = unsafe { &*host };
            settings.abi_minor = h.abi_minor;
            settings.log = HostLog {
                log: h.log,
                user: h.log_user,
            };
            if !h.options.is_null() {
                // SAFETY: NUL-terminated by the caller's contract.
                settings.options = unsafe { CStr::from_ptr(h.options) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        settings
    }
}

/// An error a plugin returns from a call: a status code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    pub status: Status,
    pub message: String,
}

impl PluginError {
    pub fn new(status: Status, message: impl Into<String>) -> Self {
        PluginError {
            status,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(abi::ERR_INVALID_ARGUMENT, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(abi::ERR_UNSUPPORTED, message)
    }
    pub fn invalid_handle(message: impl Into<String>) -> Self {
        Self::new(abi::ERR_INVALID_HANDLE, message)
    }
}

impl From<crate::check::ArgError> for PluginError {
    fn from(e: crate::check::ArgError) -> Self {
        PluginError::invalid(e.to_string())
    }
}

/// The start of every kernel entry of a Rust plugin, for the argument
/// struct `A` of any kernel of the table (`crate::kernels`): the struct
/// behind `args` (a null pointer is an error naming the kernel) and its
/// validator's view ([`KernelArgs::check`](crate::kernels::KernelArgs::check)).
///
/// # Safety
/// `args` is null or points to a valid `A` whose host pointers are valid for
/// the lengths it declares, for `'a` (the ABI contract of a kernel call).
pub unsafe fn kernel_args<'a, A: crate::kernels::KernelArgs>(
    args: *const A,
) -> Result<(&'a A, A::Valid<'a>), PluginError> {
    if args.is_null() {
        return Err(PluginError::invalid(format!(
            "{}: null argument struct",
            A::KERNEL.name()
        )));
    }
    // SAFETY: non-null and valid by the caller's contract.
    let a = unsafe { &*args };
    // SAFETY: the caller's contract is the validator's.
    let v = unsafe { a.check()? };
    Ok((a, v))
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Store `msg` as this thread's last error (interior NULs are replaced).
pub fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', "\u{FFFD}")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Pointer to this thread's last error message; valid until the next call
/// that sets it on this thread. Never null.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Run `f`, catching panics, and convert its outcome to a status code,
/// recording the message of a failure as the thread's last error.
pub fn guard<F>(f: F) -> Status
where
    F: FnOnce() -> Result<(), PluginError>,
{
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            abi::OK
        }
        Ok(Err(e)) => {
            set_last_error(&e.message);
            e.status
        }
        Err(payload) => {
            let what = panic_message(&*payload);
            set_last_error(&format!("internal panic in plugin: {what}"));
            abi::ERR_PANIC
        }
    }
}

/// The message of a caught panic (its `&str` or `String` payload).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
