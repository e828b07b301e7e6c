//! The OpenCL device the tests that run the device source directly use
//! (`opencl_atan2.rs`).

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
