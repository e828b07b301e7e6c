//! Temporaries removed when the run is interrupted.
//!
//! The outputs are staged as `.NAME.tmp-PID` files beside their final
//! names ([`crate::output`]) and are only put in place once all are whole,
//! so an interrupted run never leaves a truncated output under a final
//! name. But a run stopped by Ctrl-C (SIGINT), SIGTERM (a batch system's
//! time limit) or SIGHUP (a closed terminal) left its temporaries behind:
//! hidden files, up to hundreds of MB each, removed only by the next run's
//! commit into the same directory. [`install`] handles those three signals:
//! the handler removes every temporary still [`track`]ed, then ends the
//! process by the same signal with its default action (so the shell and
//! the batch system see the signal, as before).
//!
//! The handler may run on any thread at any point, so it does only what is
//! async-signal-safe: it reads a fixed table of atomic pointers to
//! NUL-terminated paths and calls `unlink`, `signal` and `raise`. Paths are
//! never freed once tracked (a few dozen bytes each, a dozen per run), so
//! a handler reading a slot while the main thread clears it never reads
//! freed memory. SIGKILL cannot be handled: its temporaries are removed by
//! the next commit (`remove_dead_temporaries`), as before.

use std::ffi::{c_char, CString};
use std::path::Path;
use std::sync::atomic::{AtomicPtr, Ordering};

/// Tracked temporaries at once: a run stages at most
/// [`crate::output::OUTPUTS`]' eleven files.
const SLOTS: usize = 32;

/// The tracked paths (null: a free slot).
static TRACKED: [AtomicPtr<c_char>; SLOTS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];

/// The signals whose default action ends the process and that a user or
/// a batch system sends to stop a run.
#[cfg(unix)]
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

#[cfg(unix)]
extern "C" fn remove_tracked_and_end(signal: libc::c_int) {
    for slot in &TRACKED {
        let p = slot.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a non-null slot holds a `CString` leaked by `track`,
            // never freed, so `p` is a valid NUL-terminated path; `unlink`
            // is async-signal-safe.
            unsafe { libc::unlink(p) };
        }
    }
    // SAFETY: `signal` and `raise` are async-signal-safe; with the default
    // disposition restored, `raise` ends the process by `signal`.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        libc::raise(signal);
    }
}

/// Handle SIGINT, SIGTERM and SIGHUP as the module describes. A signal the
/// process ignores (`nohup` ignores SIGHUP) stays ignored.
#[cfg(unix)]
pub fn install() {
    let handler = remove_tracked_and_end as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for s in SIGNALS {
        // SAFETY: `sigaction` with a zeroed (then filled) struct and an
        // out-pointer to a live local; the handler does only
        // async-signal-safe work (see the module's description).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(s, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = handler;
            libc::sigemptyset(&mut new.sa_mask);
            libc::sigaction(s, &new, std::ptr::null_mut());
        }
    }
}

#[cfg(not(unix))]
pub fn install() {}

/// Remove `path` if the run is interrupted, until [`untrack`]ed. A path
/// that cannot be a C string, or one past the table's slots, is not
/// tracked (the next commit removes it, as after SIGKILL).
pub fn track(path: &Path) {
    let Ok(c) = CString::new(path_bytes(path)) else {
        return;
    };
    let p = c.into_raw();
    for slot in &TRACKED {
        if slot
            .compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
    }
    // SAFETY: `p` came from `into_raw` above and was stored nowhere.
    drop(unsafe { CString::from_raw(p) });
}

/// Stop tracking `path` (renamed into place, or removed). Its string is
/// left allocated: a handler may be reading it (see the module).
pub fn untrack(path: &Path) {
    let bytes = path_bytes(path);
    let bytes = bytes.as_slice();
    for slot in &TRACKED {
        let p = slot.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // SAFETY: a non-null slot holds a leaked, never freed `CString`.
        let held = unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes();
        if held == bytes {
            let _ =
                slot.compare_exchange(p, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire);
            return;
        }
    }
}

/// The bytes of `path`, as `unlink` takes them.
#[cfg(unix)]
fn path_bytes(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    path.as_os_str().as_bytes().to_vec()
}

/// Elsewhere the handler is not installed; the bytes only identify paths.
#[cfg(not(unix))]
fn path_bytes(path: &Path) -> Vec<u8> {
    path.to_string_lossy().into_owned().into_bytes()
}

/// The paths tracked now, as bytes.
#[cfg(test)]
fn tracked() -> Vec<Vec<u8>> {
    TRACKED
        .iter()
        .map(|s| s.load(Ordering::Acquire))
        .filter(|p| !p.is_null())
        // SAFETY: as in `untrack`.
        .map(|p| unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes().to_vec())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_paths_come_and_go() {
        let a = Path::new("/tmp/toast-cli-interrupt-test/.a.tmp-1");
        let b = Path::new("/tmp/toast-cli-interrupt-test/.b.tmp-1");
        let has = |p: &Path| tracked().contains(&path_bytes(p));
        track(a);
        track(b);
        assert!(has(a) && has(b));
        untrack(a);
        assert!(!has(a) && has(b));
        untrack(b);
        assert!(!has(b));
    }
}
