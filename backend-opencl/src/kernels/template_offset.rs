//! The offset-template kernels: add_to_signal, project_signal and
//! apply_diag_precond.
//!
//! The amplitude layout (`check::OffsetLayout`) is validated before the call,
//! so every amplitude index a sample maps to lies inside `amplitudes`.
//! project_signal gives each amplitude one thread that sums its samples in
//! sample order into the existing value (deterministic, and the CPU's sum);
//! detectors whose amplitude blocks overlap run one launch each, in order.

use super::{conflicts, len, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::{
    TemplateOffsetAddArgs, TemplateOffsetPrecondArgs, TemplateOffsetProjectArgs,
};
use toast_accel::check::{TemplateOffsetAdd, TemplateOffsetProject};
use toast_accel::plugin_support::PluginError;

pub(crate) fn run_add(
    c: &OpenClContext,
    v: &TemplateOffsetAdd<'_>,
    a: &TemplateOffsetAddArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "template_offset_add_to_signal");
    let data = call.array::<f64>("det_data", a.det_data, true)?;
    let amps = call.array::<f64>("amplitudes", a.amplitudes, false)?;
    let flags = call.array::<u8>("amplitude_flags", a.amplitude_flags, false)?;
    call.check_disjoint()?;
    let lay = &v.layout;
    let ivs = call.intervals(v.intervals)?;
    let di = call.small("data_index", v.data_index)?;
    let ao = call.small("amp_offset", lay.amp_offset)?;
    let vo = call.small("view_offset", &lay.view_offset)?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(di),
        I64(lay.step_length),
        Mem(ao),
        Mem(vo),
        Mem(amps),
        Mem(flags),
        Mem(data),
    ];
    let serial = conflicts(v.data_index, v.intervals);
    call.samples(
        "toast_template_offset_add_to_signal",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    call.finish()?;
    Ok(())
}

pub(crate) fn run_project(
    c: &OpenClContext,
    v: &TemplateOffsetProject<'_>,
    a: &TemplateOffsetProjectArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "template_offset_project_signal");
    let amps = call.array::<f64>("amplitudes", a.amplitudes, true)?;
    let data = call.array::<f64>("det_data", a.det_data, false)?;
    let flag_data = call.array::<u8>("flag_data", a.flag_data, false)?;
    let amp_flags = call.array::<u8>("amplitude_flags", a.amplitude_flags, false)?;
    call.check_disjoint()?;
    let lay = &v.layout;
    let step = lay.step_length as usize;
    let ivs = call.intervals(v.intervals)?;
    let di = call.small("data_index", v.data_index)?;
    let fi = call.small("flag_index", v.flag_index)?;
    let ao = call.small("amp_offset", lay.amp_offset)?;
    let vo = call.small("view_offset", &lay.view_offset)?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(di),
        Mem(fi),
        I64(lay.step_length),
        Mem(ao),
        Mem(vo),
        Mem(data),
        Mem(flag_data),
        I32(a.flag_mask as i32),
        Mem(amps),
        Mem(amp_flags),
    ];
    let name = "toast_template_offset_project_signal";
    let amps_of = |iv: &toast_accel::abi::SampleRange| len(iv).div_ceil(step);
    if blocks_disjoint(lay.amp_offset, lay.block_len) {
        call.samples(name, v.n_det, v.intervals, false, &args, amps_of)?;
    } else {
        // Detector by detector, so a shared amplitude sums detectors in order.
        let mut full = vec![I64(0); 4];
        full.extend_from_slice(&args);
        let longest = v.intervals.iter().map(amps_of).max().unwrap_or(0);
        for d in 0..v.n_det {
            full[0] = I64(d as i64);
            full[1] = I64(d as i64 + 1);
            full[2] = I64(0);
            full[3] = I64(v.intervals.len() as i64);
            call.launch(
                name,
                &full,
                &[longest.div_ceil(64) * 64, v.intervals.len(), 1],
            )?;
        }
    }
    call.finish()?;
    Ok(())
}

/// Whether the blocks `[off, off + len)` of all detectors are pairwise disjoint.
fn blocks_disjoint(offsets: &[i64], len: i64) -> bool {
    if len == 0 {
        return true;
    }
    let mut o = offsets.to_vec();
    o.sort_unstable();
    o.windows(2).all(|w| w[1] >= w[0] + len)
}

/// `out = flags == 0 ? in * offset_var : 0.0`, in place when the two
/// amplitude handles are the same buffer.
pub(crate) fn run_precond(
    c: &OpenClContext,
    a: &TemplateOffsetPrecondArgs,
) -> Result<(), PluginError> {
    let mut call = KernelLaunch::new(c, "template_offset_apply_diag_precond");
    let out = call.array::<f64>("amplitudes_out", a.amplitudes_out, true)?;
    let var = call.array::<f64>("offset_var", a.offset_var, false)?;
    let flags = call.array::<u8>("amplitude_flags", a.amplitude_flags, false)?;
    call.check_disjoint()?;
    // amplitudes_in may be amplitudes_out (element-wise, well defined).
    let inp = call.array::<f64>("amplitudes_in", a.amplitudes_in, false)?;
    let n = a.n_amp as usize;
    let args = [I64(n as i64), Mem(var), Mem(inp), Mem(flags), Mem(out)];
    call.launch(
        "toast_template_offset_apply_diag_precond",
        &args,
        &[n.div_ceil(64) * 64],
    )?;
    call.finish()?;
    Ok(())
}
