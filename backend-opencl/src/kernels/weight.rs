//! noise_weight: `det_data[data_index[i], s] *= detector_weights[i]`.

use super::{conflicts, len, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::NoiseWeightArgs;
use toast_accel::check::NoiseWeight;
use toast_accel::plugin_support::PluginError;

pub(crate) fn run(
    c: &OpenClContext,
    v: &NoiseWeight<'_>,
    a: &NoiseWeightArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "noise_weight");
    let data = call.array::<f64>("det_data", a.det_data, true)?;
    let ivs = call.intervals(v.intervals)?;
    let di = call.small("data_index", v.data_index)?;
    let w = call.small("detector_weights", v.detector_weights)?;
    let args = [I64(v.n_samp as i64), Mem(ivs), Mem(di), Mem(w), Mem(data)];
    let serial = conflicts(v.data_index, v.intervals);
    call.samples(
        "toast_noise_weight",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    call.finish()?;
    Ok(())
}
