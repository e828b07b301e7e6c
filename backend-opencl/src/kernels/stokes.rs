//! stokes_weights_I and stokes_weights_IQU.

use super::{conflicts, len, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::{StokesWeightsIArgs, StokesWeightsIquArgs};
use toast_accel::check::{StokesWeightsI, StokesWeightsIqu};
use toast_accel::plugin_support::PluginError;

pub(crate) fn run_i(
    c: &OpenClContext,
    v: &StokesWeightsI<'_>,
    a: &StokesWeightsIArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "stokes_weights_I");
    let weights = call.array::<f64>("weights", a.weights, true)?;
    let ivs = call.intervals(v.intervals)?;
    let wi = call.small("weight_index", v.weight_index)?;
    let cal = call.small("cal", v.cal)?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(wi),
        Mem(cal),
        Mem(weights),
    ];
    let serial = conflicts(v.weight_index, v.intervals);
    call.samples(
        "toast_stokes_weights_i",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    call.finish()?;
    Ok(())
}

pub(crate) fn run_iqu(
    c: &OpenClContext,
    v: &StokesWeightsIqu<'_>,
    a: &StokesWeightsIquArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "stokes_weights_IQU");
    let weights = call.array::<f64>("weights", a.weights, true)?;
    let quats = call.array::<f64>("quats", a.quats, false)?;
    let hwp = call.array::<f64>("hwp", a.hwp, false)?;
    call.check_disjoint()?;
    let ivs = call.intervals(v.intervals)?;
    let qi = call.small("quat_index", v.quat_index)?;
    let wi = call.small("weight_index", v.weight_index)?;
    let eps = call.small("epsilon", v.epsilon)?;
    let gamma = call.small("gamma", v.gamma)?;
    let cal = call.small("cal", v.cal)?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(qi),
        Mem(wi),
        Mem(eps),
        Mem(gamma),
        Mem(cal),
        Mem(quats),
        Mem(hwp),
        I32(v.use_hwp as i32),
        I32(a.iau as i32),
        Mem(weights),
    ];
    let serial = conflicts(v.weight_index, v.intervals);
    call.samples(
        "toast_stokes_weights_iqu",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    call.finish()?;
    Ok(())
}
