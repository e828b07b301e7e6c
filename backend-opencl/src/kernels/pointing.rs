//! pointing_detector: `quats[quat_index[i], s] = b(s) * focalplane[i]`.

use super::{conflicts, len, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::PointingDetectorArgs;
use toast_accel::check::PointingDetector;
use toast_accel::plugin_support::PluginError;

const K: &str = "pointing_detector";

pub(crate) fn run(
    c: &OpenClContext,
    v: &PointingDetector<'_>,
    a: &PointingDetectorArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, K);
    let quats = call.array::<f64>("quats", a.quats, true)?;
    let bore = call.array::<f64>("boresight", a.boresight, false)?;
    let flags = call.array::<u8>("shared_flags", a.shared_flags, false)?;
    call.check_disjoint()?;
    let ivs = call.intervals(v.intervals)?;
    let qi = call.small("quat_index", v.quat_index)?;
    let fp = call.small("focalplane", v.focalplane)?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(qi),
        Mem(fp),
        Mem(bore),
        Mem(flags),
        I32(v.use_flags as i32),
        I32(a.shared_flag_mask as i32),
        Mem(quats),
    ];
    let serial = conflicts(v.quat_index, v.intervals);
    call.samples(
        "toast_pointing_detector",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    call.finish()?;
    Ok(())
}
