//! The OpenCL device the tests that run the device source directly use
//! (`opencl_trig.rs`).

use opencl3::device::{Device, CL_DEVICE_TYPE_ALL};
use opencl3::platform::get_platforms;

/// The first OpenCL device with doubles, or the reason there is none.
pub fn fp64_device() -> Result<Device, String> {
    if let Err(e) = cl3::load_library() {
        return Err(format!("no OpenCL runtime (libOpenCL.so.1): {e}"));
    }
    let platforms = get_platforms().map_err(|e| format!("no OpenCL platform: {e}"))?;
    platforms
        .iter()
        .flat_map(|p| p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default())
        .map(Device::new)
        .find(|d| {
            d.extensions()
                .unwrap_or_default()
                .split_whitespace()
                .any(|e| e == "cl_khr_fp64")
        })
        .ok_or_else(|| "no OpenCL device with cl_khr_fp64".to_string())
}

/// Held by each test for its whole run: the tests of one binary run on
/// several threads, and the OpenCL loader's platform and device enumeration
/// (ocl-icd with PoCL) seen from two threads at once can report no device.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The device for a test, held with [`one_at_a_time`]; `None` (the test
/// prints `SKIPPED: <reason>` and returns) when there is none and
/// `TOAST_REQUIRE_OPENCL` is unset.
pub fn device_for_test() -> Option<(std::sync::MutexGuard<'static, ()>, Device)> {
    let one = one_at_a_time();
    match fp64_device() {
        Ok(d) => Some((one, d)),
        Err(why) => {
            toast_testkit::plugins::skip_unless_required("TOAST_REQUIRE_OPENCL", why);
            None
        }
    }
}
