//! pixels_healpix: HEALPix pixel of each detector direction (the device
//! port of backend-cpu's `kernels/healpix.rs`, same operation order).

use super::{check_key_range, conflicts, len, KArg::*, KernelLaunch};
use crate::context::OpenClContext;
use toast_accel::abi::PixelsHealpixArgs;
use toast_accel::check::PixelsHealpix;
use toast_accel::plugin_support::PluginError;

const K: &str = "pixels_healpix";

pub(crate) fn run(
    c: &OpenClContext,
    v: &PixelsHealpix<'_>,
    a: &PixelsHealpixArgs,
) -> Result<(), PluginError> {
    check_key_range(K, v.n_det, v.n_samp)?;
    let mut call = KernelLaunch::new(c, K);
    let pixels = call.array::<i64>("pixels", a.pixels, true)?;
    let hits = call.array::<u8>("hit_submaps", a.hit_submaps, true)?;
    let quats = call.array::<f64>("quats", a.quats, false)?;
    let flags = call.array::<u8>("shared_flags", a.shared_flags, false)?;
    call.check_disjoint()?;
    let ivs = call.intervals(v.intervals)?;
    let qi = call.small("quat_index", v.quat_index)?;
    let pi = call.small("pixel_index", v.pixel_index)?;
    let err = call.error_buffer()?;
    let args = [
        I64(v.n_samp as i64),
        Mem(ivs),
        Mem(qi),
        Mem(pi),
        Mem(quats),
        Mem(flags),
        I32(v.use_flags as i32),
        I32(a.shared_flag_mask as i32),
        Mem(pixels),
        Mem(hits),
        I64(a.nside),
        I64(v.factor as i64),
        I64(a.n_pix_submap),
        I32(a.nest as i32),
        Mem(err),
    ];
    let serial = conflicts(v.pixel_index, v.intervals);
    call.samples(
        "toast_pixels_healpix",
        v.n_det,
        v.intervals,
        serial,
        &args,
        len,
    )?;
    if let Some((det, s)) = call.finish()? {
        let off = 4 * (v.quat_index[det] as usize * v.n_samp + s);
        let mut b = [0u8; 32];
        call.read(quats, 8 * off, &mut b)?;
        let q: Vec<f64> = b
            .chunks_exact(8)
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        return Err(call.fault(
            v.intervals,
            det,
            s,
            &format!(
                "quaternion {q:?} gives no valid pixel: its direction is not finite, or the pixel is outside [0, {})",
                v.npix
            ),
        ));
    }
    Ok(())
}
