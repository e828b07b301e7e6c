//! The HIP plugin through its C table. Without an AMD GPU (as in CI)
//! `init` must fail cleanly with `ERR_UNAVAILABLE` and a reason; with one,
//! the memory rules (pool, handle table) are exercised on the device.
//! Conformance on the device is covered by `toast-cli/tests/gpu_backends.rs`.

use std::ffi::{c_void, CStr};
use toast_accel::abi::{self, BackendTable};
use toast_backend_hip::{toast_backend_entry, unavailable_reason};

const NAME: &str = "hip";

fn table() -> &'static BackendTable {
    // SAFETY: the entry returns a pointer to a static header whose table is static.
    unsafe { &*(*toast_backend_entry()).table }
}

fn last_error() -> String {
    // SAFETY: last_error returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(table().last_error.unwrap()()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn header_is_a_device_backend_with_every_kernel() {
    // SAFETY: static header.
    let h = unsafe { &*toast_backend_entry() };
    assert_eq!(h.magic, abi::MAGIC);
    assert_eq!(h.abi_major, abi::ABI_MAJOR);
    assert_eq!(h.flags & abi::FLAG_HOST_ADDRESSABLE, 0);
    // SAFETY: static NUL-terminated name.
    assert_eq!(unsafe { CStr::from_ptr(h.name) }.to_str().unwrap(), NAME);
    let t = table();
    assert!(t.pointing_detector.is_some() && t.template_offset_apply_diag_precond.is_some());
}

#[test]
fn unavailable_is_clean_or_memory_rules_hold() {
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: null host API is allowed; valid out pointer.
    let st = unsafe { table().init.unwrap()(std::ptr::null(), &mut ctx) };
    match unavailable_reason() {
        Some(reason) => {
            assert_eq!(st, abi::ERR_UNAVAILABLE, "init status without a device");
            let msg = last_error();
            assert!(
                !msg.is_empty() && msg == reason,
                "reason `{msg}` vs `{reason}`"
            );
            println!("SKIPPED: {NAME} unavailable: {reason}");
        }
        None => {
            assert_eq!(st, abi::OK, "init: {}", last_error());
            let t = table();
            let mut h = 0u64;
            // SAFETY: live context, valid out pointer and NUL-terminated name.
            let st = unsafe { t.alloc.unwrap()(ctx, 1000, c"buf".as_ptr(), &mut h) };
            assert_eq!(st, abi::OK, "alloc: {}", last_error());
            let src: Vec<u8> = (0..1000).map(|i| i as u8).collect();
            let mut dst = vec![0u8; 1000];
            // SAFETY: 1000 readable / writable bytes.
            unsafe {
                assert_eq!(
                    t.copy_to_device.unwrap()(ctx, h, 0, src.as_ptr() as *const c_void, 1000),
                    abi::OK
                );
                assert_eq!(
                    t.copy_to_host.unwrap()(ctx, h, 0, dst.as_mut_ptr() as *mut c_void, 1000),
                    abi::OK
                );
                assert_eq!(
                    t.copy_to_host.unwrap()(ctx, h, 1, dst.as_mut_ptr() as *mut c_void, 1000),
                    abi::ERR_INVALID_ARGUMENT
                );
                assert_eq!(t.free.unwrap()(ctx, h), abi::OK);
                assert_eq!(t.free.unwrap()(ctx, h), abi::ERR_INVALID_HANDLE);
                assert_eq!(t.free.unwrap()(ctx, 0x1234), abi::ERR_INVALID_HANDLE);
                // An allocation no device has: a clean out-of-memory error.
                let mut big = 0u64;
                assert_eq!(
                    t.alloc.unwrap()(ctx, 1 << 60, c"huge".as_ptr(), &mut big),
                    abi::ERR_OUT_OF_MEMORY
                );
                assert!(last_error().contains("`huge`"), "{}", last_error());
                t.shutdown.unwrap()(ctx);
            }
            assert_eq!(src, dst);
        }
    }
}
