//! The kernel entries: one generic entry ([`entry`]) that every slot of
//! the function table instantiates, and per kernel its marshalling and
//! launch planning ([`DeviceKernel`]). Each launch fills the kernel's
//! parameters by name ([`super::params`], generated from the prototypes of
//! `toast-accel/device/kernels.h`).

use super::params::{self, LaunchParams};
use super::{
    blocks_overlap, check_key_range, grid_chunks, has_duplicates, intervals_overlap, pixel_fault,
    KernelLaunch,
};
use crate::context::ctx_ref;
use crate::driver::Driver;
use std::ffi::c_void;
use std::sync::Arc;
use toast_accel::abi::{self, Status};
use toast_accel::check;
use toast_accel::device_source as ds;
use toast_accel::kernels::{aliased_output, ArrayDir, KernelArgs};
use toast_accel::plugin_support::{guard, kernel_args, PluginError};

/// One kernel on a device: resolve the array handles, upload the small
/// arrays, plan and launch (with `call`, which frees the scratch buffers
/// afterwards), and turn a recorded data-dependent fault into an error. One
/// impl per kernel of the table (`toast_accel::toast_kernels!`).
pub(crate) trait DeviceKernel: KernelArgs {
    /// Run the kernel for the validated arguments `v` of `a`.
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError>;
}

/// The entry of every kernel (the function table instantiates it per
/// driver and argument struct): resolve the context and the arguments,
/// validate them, refuse an output that aliases another array argument (the
/// source's arrays are `restrict`; the table marks the in-place inputs),
/// then [`DeviceKernel::launch`].
pub(crate) unsafe extern "C" fn entry<D: Driver, A: DeviceKernel>(
    ctx: *mut c_void,
    args: *const A,
) -> Status {
    guard(|| {
        // SAFETY: ABI contract on ctx.
        let c = unsafe { ctx_ref::<D>(ctx)? };
        // SAFETY: ABI contract on args: a valid struct whose host pointers
        // are valid for the lengths it declares, for the call.
        let (a, v) = unsafe { kernel_args(args)? };
        let kernel = A::KERNEL.name();
        if let Some((out, other)) = aliased_output(a) {
            return Err(PluginError::invalid(format!(
                "{kernel}: output array `{out}` is the same buffer as `{other}`"
            )));
        }
        // What the call may write is no longer what a check read back.
        for (_, dir, array) in a.arrays() {
            if dir != ArrayDir::In && array.len > 0 {
                c.written(array.ptr);
            }
        }
        let mut call = KernelLaunch::new(&c, kernel);
        A::launch(&mut call, &v, a)?;
        call.finish()
    })
}

const F64: u64 = 8;
const I32: u64 = 4;
const I64: u64 = 8;
const U8: u64 = 1;

impl DeviceKernel for abi::PointingDetectorArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let bore = call.array("boresight", a.boresight, F64)?;
        let flags = call.array("shared_flags", a.shared_flags, U8)?;
        let quats = call.array("quats", a.quats, F64)?;
        let iv = call.intervals(v.intervals)?;
        let qi = call.small("quat_index", v.quat_index)?;
        let fp = call.small("focalplane", v.focalplane)?;
        let split_det = has_duplicates(v.quat_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_pointing_detector",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastPointingDetector {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                quat_index: qi,
                focalplane: fp,
                boresight: bore,
                shared_flags: flags,
                use_flags: v.use_flags as i32,
                mask: i32::from(a.shared_flag_mask),
                quats,
            },
        )
    }
}

impl DeviceKernel for abi::PixelsHealpixArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("pixels_healpix", v.n_det, v.n_samp)?;
        let quats = call.array("quats", a.quats, F64)?;
        let flags = call.array("shared_flags", a.shared_flags, U8)?;
        let (kernel, pixels) = if v.pixels_i32 {
            (
                "toast_pixels_healpix_i32",
                call.array("pixels", a.pixels, I32)?,
            )
        } else {
            (
                "toast_pixels_healpix_i64",
                call.array("pixels", a.pixels, I64)?,
            )
        };
        let hits = call.array("hit_submaps", a.hit_submaps, U8)?;
        let iv = call.intervals(v.intervals)?;
        let qi = call.small("quat_index", v.quat_index)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let err = call.error_buffer()?;
        let split_det = has_duplicates(v.pixel_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            kernel,
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastPixelsHealpix {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                quat_index: qi,
                pixel_index: pi,
                quats,
                shared_flags: flags,
                use_flags: v.use_flags as i32,
                mask: i32::from(a.shared_flag_mask),
                pixels,
                hit_submaps: hits,
                nside: a.nside,
                factor: i64::from(v.factor),
                n_pix_submap: a.n_pix_submap,
                nest: i32::from(a.nest != 0),
                err,
            },
        )?;
        if let Some((det, s)) = call.read_error(err)? {
            let mut q = [0f64; 4];
            let row = u64::from(v.quat_index[det as usize] as u32);
            call.read_into(quats, 4 * (row * v.n_samp as u64 + s), &mut q)?;
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
}

impl DeviceKernel for abi::StokesWeightsIArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let w = call.array("weights", a.weights, F64)?;
        let iv = call.intervals(v.intervals)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let cal = call.small("cal", v.cal)?;
        let split_det = has_duplicates(v.weight_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_stokes_weights_i",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastStokesWeightsI {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                weight_index: wi,
                cal,
                weights: w,
            },
        )
    }
}

impl DeviceKernel for abi::StokesWeightsIquArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let quats = call.array("quats", a.quats, F64)?;
        let hwp = call.array("hwp", a.hwp, F64)?;
        let w = call.array("weights", a.weights, F64)?;
        let iv = call.intervals(v.intervals)?;
        let qi = call.small("quat_index", v.quat_index)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let eps = call.small("epsilon", v.epsilon)?;
        let gamma = call.small("gamma", v.gamma)?;
        let cal = call.small("cal", v.cal)?;
        let split_det = has_duplicates(v.weight_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_stokes_weights_iqu",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastStokesWeightsIqu {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                quat_index: qi,
                weight_index: wi,
                epsilon: eps,
                gamma,
                cal,
                quats,
                hwp,
                use_hwp: v.use_hwp as i32,
                iau: i32::from(a.iau != 0),
                weights: w,
            },
        )
    }
}

impl DeviceKernel for abi::ScanMapArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let (kname, elem) = match a.map_dtype {
            abi::DTYPE_F32 | abi::DTYPE_I32 => (ds::scan_map_kernel(a.map_dtype), 4),
            _ => (ds::scan_map_kernel(a.map_dtype), 8),
        };
        let kname = kname.ok_or_else(|| {
            PluginError::invalid(format!(
                "scan_map: map_dtype {} is not a TOAST_DTYPE_*",
                a.map_dtype
            ))
        })?;
        check_key_range("scan_map", v.n_det, v.n_samp)?;
        let g2l = call.array("global2local", a.global2local, I64)?;
        let map = call.array("mapdata", a.mapdata, elem)?;
        let pixels = call.array("pixels", a.pixels, I64)?;
        let weights = call.array("weights", a.weights, F64)?;
        let det_data = call.array("det_data", a.det_data, F64)?;
        let g2l_host =
            call.global2local(a.global2local, g2l, v.n_global_submap, v.n_local_submap)?;
        let iv = call.intervals(v.intervals)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let di = call.small("data_index", v.data_index)?;
        let err = call.error_buffer()?;
        let mode = if a.should_subtract != 0 {
            1
        } else if a.should_scale != 0 {
            2
        } else {
            0
        };
        let split_det = has_duplicates(v.data_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            kname,
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastScanMap {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                nnz: v.nnz as i64,
                pixel_index: pi,
                weight_index: wi,
                data_index: di,
                g2l,
                n_global_submap: v.n_global_submap as i64,
                n_pix_submap: v.n_pix_submap,
                mapdata: map,
                pixels,
                weights,
                det_data,
                data_scale: a.data_scale,
                should_zero: i32::from(a.should_zero != 0),
                mode,
                err,
            },
        )?;
        call.map_pixel_fault(
            err,
            pixels,
            v.pixel_index,
            v.n_samp,
            v.intervals,
            &g2l_host,
            v.n_pix_submap,
        )
    }
}

impl DeviceKernel for abi::BuildNoiseWeightedArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("build_noise_weighted", v.n_det, v.n_samp)?;
        let g2l = call.array("global2local", a.global2local, I64)?;
        let pixels = call.array("pixels", a.pixels, I64)?;
        let weights = call.array("weights", a.weights, F64)?;
        let det_data = call.array("det_data", a.det_data, F64)?;
        let det_flags = call.array("det_flags", a.det_flags, U8)?;
        let shared = call.array("shared_flags", a.shared_flags, U8)?;
        let zmap = call.array("zmap", a.zmap, F64)?;
        let g2l_host =
            call.global2local(a.global2local, g2l, v.n_global_submap, v.n_local_submap)?;
        let iv = call.intervals(v.intervals)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let di = call.small("data_index", v.data_index)?;
        let fi = call.small("flag_index", v.flag_index)?;
        let scale = call.small("det_scale", v.det_scale)?;
        let err = call.error_buffer()?;
        // Atomic accumulation: no two launches are needed for correctness.
        call.launch_samples(
            "toast_build_noise_weighted",
            v.n_det,
            v.intervals,
            false,
            false,
            |d0, d1, i0, i1| params::ToastBuildNoiseWeighted {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                nnz: v.nnz as i64,
                pixel_index: pi,
                weight_index: wi,
                data_index: di,
                flag_index: fi,
                det_scale: scale,
                g2l,
                n_global_submap: v.n_global_submap as i64,
                n_pix_submap: v.n_pix_submap,
                pixels,
                weights,
                det_data,
                det_flags,
                use_det_flags: v.use_det_flags as i32,
                det_mask: i32::from(a.det_flag_mask),
                shared_flags: shared,
                use_shared_flags: v.use_shared_flags as i32,
                shared_mask: i32::from(a.shared_flag_mask),
                zmap,
                err,
            },
        )?;
        call.map_pixel_fault(
            err,
            pixels,
            v.pixel_index,
            v.n_samp,
            v.intervals,
            &g2l_host,
            v.n_pix_submap,
        )
    }
}

impl DeviceKernel for abi::NoiseWeightArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let det_data = call.array("det_data", a.det_data, F64)?;
        let iv = call.intervals(v.intervals)?;
        let di = call.small("data_index", v.data_index)?;
        let w = call.small("detector_weights", v.detector_weights)?;
        let split_det = has_duplicates(v.data_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_noise_weight",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastNoiseWeight {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                data_index: di,
                detector_weights: w,
                det_data,
            },
        )
    }
}

impl DeviceKernel for abi::TemplateOffsetAddArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let amps = call.array("amplitudes", a.amplitudes, F64)?;
        let aflags = call.array("amplitude_flags", a.amplitude_flags, U8)?;
        let det_data = call.array("det_data", a.det_data, F64)?;
        let iv = call.intervals(v.intervals)?;
        let di = call.small("data_index", v.data_index)?;
        let ao = call.small("amp_offset", v.layout.amp_offset)?;
        let vo = call.small("view_offset", &v.layout.view_offset)?;
        let split_det = has_duplicates(v.data_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_template_offset_add_to_signal",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastTemplateOffsetAddToSignal {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                data_index: di,
                step_length: v.layout.step_length,
                amp_offset: ao,
                view_offset: vo,
                amplitudes: amps,
                amplitude_flags: aflags,
                det_data,
            },
        )
    }
}

impl DeviceKernel for abi::TemplateOffsetProjectArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let det_data = call.array("det_data", a.det_data, F64)?;
        let flag_data = call.array("flag_data", a.flag_data, U8)?;
        let amps = call.array("amplitudes", a.amplitudes, F64)?;
        let aflags = call.array("amplitude_flags", a.amplitude_flags, U8)?;
        let iv = call.intervals(v.intervals)?;
        let di = call.small("data_index", v.data_index)?;
        let fi = call.small("flag_index", v.flag_index)?;
        let ao = call.small("amp_offset", v.layout.amp_offset)?;
        let vo = call.small("view_offset", &v.layout.view_offset)?;
        let split_det = blocks_overlap(v.layout.amp_offset, v.layout.block_len);
        let max_amp = v
            .layout
            .n_amp_views
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(0) as u64;
        let name = "toast_template_offset_project_signal";
        for (d0, d1) in super::ranges(v.n_det, split_det) {
            for (i0, i1) in super::ranges(v.intervals.len(), false) {
                call.launch_blocks_of(
                    name,
                    params::PROJECT_THREADS,
                    max_amp,
                    i1 - i0,
                    d1 - d0,
                    params::ToastTemplateOffsetProjectSignal {
                        det0: d0 as i64,
                        det_end: d1 as i64,
                        iv0: i0 as i64,
                        iv_end: i1 as i64,
                        n_samp: v.n_samp as i64,
                        intervals: iv,
                        data_index: di,
                        flag_index: fi,
                        step_length: v.layout.step_length,
                        amp_offset: ao,
                        view_offset: vo,
                        det_data,
                        flag_data,
                        flag_mask: i32::from(a.flag_mask),
                        amplitudes: amps,
                        amplitude_flags: aflags,
                    },
                )?;
            }
        }
        Ok(())
    }
}

impl DeviceKernel for abi::TemplateOffsetPrecondArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let n_amp = *v;
        let var = call.array("offset_var", a.offset_var, F64)?;
        let fl = call.array("amplitude_flags", a.amplitude_flags, U8)?;
        let aout = call.array("amplitudes_out", a.amplitudes_out, F64)?;
        let ain = call.array("amplitudes_in", a.amplitudes_in, F64)?;
        call.launch(
            "toast_template_offset_apply_diag_precond",
            n_amp as u64,
            1,
            1,
            params::ToastTemplateOffsetApplyDiagPrecond {
                n_amp: n_amp as i64,
                offset_var: var,
                amplitudes_in: ain,
                amplitude_flags: fl,
                amplitudes_out: aout,
            },
        )
    }
}

/// The error of a covariance accumulation whose sample `s` (recorded by
/// the device) lies beyond the local map, worded as the CPU backend's.
fn cov_fault<D: Driver>(
    call: &KernelLaunch<'_, D>,
    v: &check::CovAccum,
    (submap, subpix): (Option<D::Buffer>, Option<D::Buffer>),
    s: u64,
) -> Result<PluginError, PluginError> {
    let sm: i64 = call.read(submap, s)?;
    let px: i64 = call.read(subpix, s)?;
    Ok(PluginError::invalid(format!(
        "{}: detector 0 (interval 0), sample {s}: submap {sm}, pixel {px} is beyond the local \
         map ({} submaps x {} pixels)",
        call.kernel, v.nsub, v.nsubpix
    )))
}

/// Launch the covariance accumulation `name` (one thread per sample) with
/// the parameters `params(call, [submap, subpix, err])` gives, and turn a
/// recorded pixel fault into the CPU's error. Nothing to do for an inactive
/// call (`nsub < 1`) or no samples.
fn launch_cov<D: Driver, L: LaunchParams<D::Buffer>>(
    call: &mut KernelLaunch<'_, D>,
    v: &check::CovAccum,
    name: &'static str,
    (submap, subpix): (abi::Array, abi::Array),
    params: impl FnOnce(&mut KernelLaunch<'_, D>, [Option<D::Buffer>; 3]) -> Result<L, PluginError>,
) -> Result<(), PluginError> {
    if !v.active || v.n_samp == 0 {
        return Ok(());
    }
    check_key_range(call.kernel, 1, v.n_samp)?;
    let sm = call.array("submap", submap, I64)?;
    let px = call.array("subpix", subpix, I64)?;
    let err = call.error_buffer()?;
    let p = params(call, [sm, px, err])?;
    call.launch(name, v.n_samp as u64, 1, 1, p)?;
    match call.read_error(err)? {
        Some((_, s)) => Err(cov_fault(call, v, (sm, px), s)?),
        None => Ok(()),
    }
}

impl DeviceKernel for abi::CovAccumDiagHitsArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let name = "toast_cov_accum_diag_hits";
        launch_cov(
            call,
            v,
            name,
            (a.submap, a.subpix),
            |call, [sm, px, err]| {
                let hits = call.array("hits", a.hits, I64)?;
                Ok(params::ToastCovAccumDiagHits {
                    nsamp: v.n_samp as i64,
                    nsub: v.nsub,
                    nsubpix: v.nsubpix,
                    submap: sm,
                    subpix: px,
                    hits,
                    err,
                })
            },
        )
    }
}

impl DeviceKernel for abi::CovAccumDiagInvnppArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let name = "toast_cov_accum_diag_invnpp";
        launch_cov(
            call,
            v,
            name,
            (a.submap, a.subpix),
            |call, [sm, px, err]| {
                let weights = call.array("weights", a.weights, F64)?;
                let invnpp = call.array("invnpp", a.invnpp, F64)?;
                Ok(params::ToastCovAccumDiagInvnpp {
                    nsamp: v.n_samp as i64,
                    nsub: v.nsub,
                    nsubpix: v.nsubpix,
                    nnz: v.nnz as i64,
                    submap: sm,
                    subpix: px,
                    weights,
                    scale: a.scale,
                    invnpp,
                    err,
                })
            },
        )
    }
}

impl DeviceKernel for abi::CovApplyDiagArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        if !v.active || v.n_pix == 0 {
            return Ok(());
        }
        let mat = call.array("mat", a.mat, F64)?;
        let vec = call.array("vec", a.vec, F64)?;
        call.launch(
            "toast_cov_apply_diag",
            v.n_pix as u64,
            1,
            1,
            params::ToastCovApplyDiag {
                npix: v.n_pix as i64,
                nnz: v.nnz as i64,
                mat,
                vec,
            },
        )
    }
}

impl DeviceKernel for abi::AmpDotArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let x = call.array("a", a.a, F64)?;
        let y = call.array("b", a.b, F64)?;
        let flags = call.array("flags", a.flags, U8)?;
        let partials = call.array("partials", a.partials, F64)?;
        call.launch(
            "toast_amp_dot",
            v.nblock as u64,
            1,
            1,
            params::ToastAmpDot {
                n: v.n as i64,
                nblock: v.nblock as i64,
                chunk: v.chunk as i64,
                a: x,
                b: y,
                flags,
                partials,
            },
        )
    }
}

impl DeviceKernel for abi::AmpAxpbyArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        n: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        if *n == 0 {
            return Ok(());
        }
        let x = call.array("x", a.x, F64)?;
        let y = call.array("y", a.y, F64)?;
        call.launch(
            "toast_amp_axpby",
            *n as u64,
            1,
            1,
            params::ToastAmpAxpby {
                n: *n as i64,
                alpha: a.alpha,
                beta: a.beta,
                x,
                y,
            },
        )
    }
}

/// The workspace of `n` templates per fit: the matrix and its eigenvectors
/// (`n * n` each) and `vectors` vectors of `n` (`kernels.h`).
fn poly_item_len(n: u64, vectors: u64) -> u64 {
    2 * n * n + vectors * n
}

impl DeviceKernel for abi::FilterPolynomialArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        if v.order < 0 || v.n_signal == 0 || v.n_samp == 0 || v.starts.is_empty() {
            return Ok(());
        }
        let n = v.n_samp as i64;
        // The scans as the kernel clamps them: overlapping ones must run one
        // at a time, in order (the second fits what the first left).
        let clamped: Vec<abi::SampleRange> = v
            .starts
            .iter()
            .zip(v.stops)
            .map(|(&s, &e)| {
                let first = s.max(0);
                let last = if e < 0 || e > n { n } else { e };
                abi::SampleRange { first, last }
            })
            .collect();
        let one_at_a_time = intervals_overlap(&clamped);
        let pairs: Vec<i64> = v
            .starts
            .iter()
            .zip(v.stops)
            .flat_map(|(&s, &e)| [s, e])
            .collect();
        let flags = call.array("flags", a.flags, U8)?;
        let signals = call.array("signals", a.signals, F64)?;
        let scans = call.small("scans", &pairs)?;
        let index = call.small("signal_index", v.signal_index)?;
        // The validator bounds the order (check::MAX_POLY_TEMPLATES).
        let item_len = poly_item_len(v.order as u64 + 1, 3);
        let items = (v.n_signal as u64).saturating_mul(v.starts.len() as u64);
        let ws = call.workspace(item_len, items)?;
        for (i0, i1) in super::ranges(v.starts.len(), one_at_a_time) {
            for ((k0, k1), (j0, j1)) in grid_chunks(v.n_signal, i1 - i0, i1 - i0, ws.per_launch) {
                let w = ws.params(((k1 - k0) * (j1 - j0)) as u64);
                let p = params::ToastFilterPolynomial {
                    k0: k0 as i64,
                    k_end: k1 as i64,
                    iv0: (i0 + j0) as i64,
                    iv_end: (i0 + j1) as i64,
                    n_samp: n,
                    order: v.order,
                    scans,
                    flags,
                    signal_index: index,
                    signals,
                    work: w.work,
                    item_step: w.item_step,
                    elem_step: w.elem_step,
                };
                call.launch_blocks("toast_filter_polynomial", (k1 - k0) as u64, j1 - j0, 1, p)?;
            }
        }
        Ok(())
    }
}

impl DeviceKernel for abi::FilterPoly2dArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        if v.n_samp == 0 || v.n_group == 0 || v.n_mode == 0 {
            return Ok(());
        }
        let signals = call.array("signals", a.signals, F64)?;
        let masks = call.array("masks", a.masks, U8)?;
        let coeff = call.array("coeff", a.coeff, F64)?;
        let groups = call.small("det_groups", v.det_groups)?;
        let templates = call.small("templates", v.templates)?;
        // Per (sample, group) of a launch: a head's decomposition (a, v),
        // the solve's scratch w and the head mark (kernels.h, section 14).
        // The validator bounds the modes (check::MAX_POLY_TEMPLATES).
        let item_len = poly_item_len(v.n_mode as u64, 1) + 1;
        let ws = call.workspace(item_len, (v.n_samp as u64).saturating_mul(v.n_group as u64))?;
        // Each chunk marks its own heads (its first sample among them) and
        // decomposes at them: no chunk reads another's workspace.
        for ((s0, s1), (g0, g1)) in
            grid_chunks(v.n_samp, v.n_group, super::MAX_GRID_YZ, ws.per_launch)
        {
            let w = ws.params(((s1 - s0) * (g1 - g0)) as u64);
            let (ns, ng) = ((s1 - s0) as u64, g1 - g0);
            let (s0, s_end, g0, g_end) = (s0 as i64, s1 as i64, g0 as i64, g1 as i64);
            let (n_det, n_mode) = (v.n_det as i64, v.n_mode as i64);
            let heads = params::ToastFilterPoly2dHeads {
                s0,
                s_end,
                g0,
                g_end,
                n_det,
                n_mode,
                det_groups: groups,
                masks,
                work: w.work,
                item_step: w.item_step,
                elem_step: w.elem_step,
            };
            call.launch("toast_filter_poly2d_heads", ns, ng, 1, heads)?;
            let decompose = params::ToastFilterPoly2d {
                s0,
                s_end,
                g0,
                g_end,
                n_det,
                n_mode,
                det_groups: groups,
                templates,
                masks,
                work: w.work,
                item_step: w.item_step,
                elem_step: w.elem_step,
            };
            call.launch_blocks("toast_filter_poly2d", ns, ng, 1, decompose)?;
            let solve = params::ToastFilterPoly2dSolve {
                s0,
                s_end,
                g0,
                g_end,
                n_det,
                n_group: v.n_group as i64,
                n_mode,
                det_groups: groups,
                templates,
                signals,
                masks,
                coeff,
                work: w.work,
                item_step: w.item_step,
                elem_step: w.elem_step,
            };
            call.launch("toast_filter_poly2d_solve", ns, ng, 1, solve)?;
        }
        Ok(())
    }
}

// ---- the map-maker's fused kernels (ABI minor 4) --------------------------

/// The arrays of a fused pass as device buffers (the absent ones `None`)
/// and its small arrays uploaded: what `toast_fused_accumulate` and
/// `toast_fused_project` take in the same order up to `det_mask`.
struct FusedBuffers<B> {
    intervals: Option<B>,
    pixel_index: Option<B>,
    weight_index: Option<B>,
    focalplane: Option<B>,
    epsilon: Option<B>,
    gamma: Option<B>,
    cal: Option<B>,
    data_index: Option<B>,
    flag_index: Option<B>,
    det_scale: Option<B>,
    amp_offset: Option<B>,
    view_offset: Option<B>,
    global2local: Option<B>,
    compact: Option<B>,
    boresight: Option<B>,
    pointing_flags: Option<B>,
    hwp: Option<B>,
    pixels: Option<B>,
    weights: Option<B>,
    det_data: Option<B>,
    det_flags: Option<B>,
    /// `global2local` on the host (for a fault's message).
    g2l_host: Arc<[i64]>,
    n_global_submap: usize,
}

/// The arrays of a fused pass's argument struct, by name.
struct FusedArrays {
    global2local: abi::Array,
    compact: abi::Array,
    boresight: abi::Array,
    pointing_flags: abi::Array,
    hwp: abi::Array,
    pixels: abi::Array,
    weights: abi::Array,
    det_data: abi::Array,
    det_flags: abi::Array,
}

/// The [`FusedArrays`] of a `fused_accumulate` or `fused_project` struct
/// (the same field names in both).
macro_rules! fused_arrays {
    ($a:expr) => {
        FusedArrays {
            global2local: $a.global2local,
            compact: $a.compact,
            boresight: $a.boresight,
            pointing_flags: $a.pointing_flags,
            hwp: $a.hwp,
            pixels: $a.pixels,
            weights: $a.weights,
            det_data: $a.det_data,
            det_flags: $a.det_flags,
        }
    };
}

/// The launch parameters (`$kernel`, a `params` struct) of a fused pass:
/// the prefix both passes take, from the grid ranges to `det_mask`, filled
/// from the buffers `$b`, the validated arguments `$v`, the grid ranges
/// and the masks; then the pass's own fields.
macro_rules! fused_params {
    ($kernel:ident, $b:expr, $v:expr, $range:expr, $masks:expr, { $($own:tt)* }) => {{
        let (b, v) = (&$b, $v);
        let p = &v.pointing;
        let (det0, det_end, iv0, iv_end): (i64, i64, i64, i64) = $range;
        let (pmask, iau, det_mask): (u8, u8, u8) = $masks;
        params::$kernel {
            det0,
            det_end,
            iv0,
            iv_end,
            n_samp: v.n_samp as i64,
            intervals: b.intervals,
            compact_form: i32::from(p.compact),
            pixel_index: b.pixel_index,
            weight_index: b.weight_index,
            focalplane: b.focalplane,
            epsilon: b.epsilon,
            gamma: b.gamma,
            cal: b.cal,
            data_index: b.data_index,
            flag_index: b.flag_index,
            det_scale: b.det_scale,
            step_length: v.values.step_length,
            amp_offset: b.amp_offset,
            view_offset: b.view_offset,
            g2l: b.global2local,
            n_global_submap: b.n_global_submap as i64,
            n_pix_submap: v.n_pix_submap,
            compact: b.compact,
            boresight: b.boresight,
            pflags: b.pointing_flags,
            use_pflags: i32::from(p.use_pointing_flags),
            pmask: i32::from(pmask),
            hwp: b.hwp,
            use_hwp: i32::from(p.use_hwp),
            iau: i32::from(iau != 0),
            pixels: b.pixels,
            weights: b.weights,
            det_data: b.det_data,
            use_data: i32::from(!v.values.data_index.is_empty()),
            det_flags: b.det_flags,
            use_det_flags: i32::from(!v.flag_index.is_empty()),
            det_mask: i32::from(det_mask),
            $($own)*
        }
    }};
}

impl<B: Copy> FusedBuffers<B> {
    fn new<D: Driver<Buffer = B>>(
        call: &mut KernelLaunch<'_, D>,
        v: &check::Fused<'_>,
        a: FusedArrays,
    ) -> Result<Self, PluginError> {
        let p = &v.pointing;
        let global2local = call.array("global2local", a.global2local, I64)?;
        let n_global_submap = a.global2local.len as usize;
        Ok(FusedBuffers {
            intervals: call.intervals(v.intervals)?,
            pixel_index: call.small("pixel_index", p.pixel_index)?,
            weight_index: call.small("weight_index", p.weight_index)?,
            focalplane: call.small("focalplane", p.focalplane)?,
            epsilon: call.small("epsilon", p.epsilon)?,
            gamma: call.small("gamma", p.gamma)?,
            cal: call.small("cal", p.cal)?,
            data_index: call.small("data_index", v.values.data_index)?,
            flag_index: call.small("flag_index", v.flag_index)?,
            det_scale: call.small("det_scale", v.det_scale)?,
            amp_offset: call.small("amp_offset", v.values.amp_offset)?,
            view_offset: call.small("view_offset", &v.values.view_offset)?,
            g2l_host: call.global2local(
                a.global2local,
                global2local,
                n_global_submap,
                v.n_local_submap,
            )?,
            global2local,
            compact: call.array("compact", a.compact, I32)?,
            boresight: call.array("boresight", a.boresight, F64)?,
            pointing_flags: call.array("pointing_flags", a.pointing_flags, U8)?,
            hwp: call.array("hwp", a.hwp, F64)?,
            pixels: call.array("pixels", a.pixels, I64)?,
            weights: call.array("weights", a.weights, F64)?,
            det_data: call.array("det_data", a.det_data, F64)?,
            det_flags: call.array("det_flags", a.det_flags, U8)?,
            n_global_submap,
        })
    }

    /// A pixel fault the device recorded at `(det, s)`: the pixel read back
    /// from the form's pixel array.
    fn fault<D: Driver<Buffer = B>>(
        &self,
        call: &KernelLaunch<'_, D>,
        v: &check::Fused<'_>,
        (det, s): (u64, u64),
    ) -> Result<PluginError, PluginError> {
        let row = u64::from(v.pointing.pixel_index[det as usize] as u32) * v.n_samp as u64 + s;
        let pix: i64 = if v.pointing.compact {
            i64::from(call.read::<i32>(self.compact, row)?)
        } else {
            call.read(self.pixels, row)?
        };
        Ok(call.fault(
            v.intervals,
            det,
            s,
            &pixel_fault(pix, &self.g2l_host, v.n_pix_submap),
        ))
    }
}

impl DeviceKernel for abi::CompactExpandPointingArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        let compact = call.array("compact", a.compact, I32)?;
        let bore = call.array("boresight", a.boresight, F64)?;
        let flags = call.array("pointing_flags", a.pointing_flags, U8)?;
        let hwp = call.array("hwp", a.hwp, F64)?;
        let pixels = call.array("pixels", a.pixels, I64)?;
        let weights = call.array("weights", a.weights, F64)?;
        let iv = call.intervals(v.intervals)?;
        let ci = call.small("compact_index", v.compact_index)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let fp = call.small("focalplane", v.focalplane)?;
        let eps = call.small("epsilon", v.epsilon)?;
        let gamma = call.small("gamma", v.gamma)?;
        let cal = call.small("cal", v.cal)?;
        let split_det = has_duplicates(v.pixel_index) || has_duplicates(v.weight_index);
        let split_iv = intervals_overlap(v.intervals);
        call.launch_samples(
            "toast_compact_expand_pointing",
            v.n_det,
            v.intervals,
            split_det,
            split_iv,
            |d0, d1, i0, i1| params::ToastCompactExpandPointing {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                nnz: v.nnz as i64,
                out_first: v.out_first as i64,
                out_n_samp: v.out_n_samp as i64,
                compact_index: ci,
                pixel_index: pi,
                weight_index: wi,
                focalplane: fp,
                epsilon: eps,
                gamma,
                cal,
                compact,
                boresight: bore,
                pflags: flags,
                use_pflags: i32::from(v.use_pointing_flags),
                pmask: i32::from(a.pointing_flag_mask),
                hwp,
                use_hwp: i32::from(v.use_hwp),
                iau: i32::from(a.iau != 0),
                pixels,
                weights,
            },
        )
    }
}

impl DeviceKernel for abi::FusedAccumulateArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("fused_accumulate", v.n_det, v.n_samp)?;
        let b = FusedBuffers::new(call, v, fused_arrays!(a))?;
        let finite = call.small("finite", v.finite)?;
        let shared = call.array("shared_flags", a.shared_flags, U8)?;
        let amps = call.array("amplitudes", a.amplitudes, F64)?;
        let aflags = call.array("amplitude_flags", a.amplitude_flags, U8)?;
        let zmap = call.array("zmap", a.zmap, F64)?;
        let err = call.error_buffer()?;
        let masks = (a.pointing_flag_mask, a.iau, a.det_flag_mask);
        // Atomic accumulation: no two launches are needed for correctness.
        call.launch_samples(
            "toast_fused_accumulate",
            v.n_det,
            v.intervals,
            false,
            false,
            |d0, d1, i0, i1| {
                fused_params!(ToastFusedAccumulate, b, v, (d0, d1, i0, i1), masks, {
                    finite,
                    shared_flags: shared,
                    use_shared_flags: i32::from(v.use_shared_flags),
                    shared_mask: i32::from(a.shared_flag_mask),
                    amplitudes: amps,
                    amplitude_flags: aflags,
                    zmap,
                    err,
                })
            },
        )?;
        match call.read_error(err)? {
            Some(at) => Err(b.fault(call, v, at)?),
            None => Ok(()),
        }
    }
}

impl DeviceKernel for abi::FusedProjectArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("fused_project", v.n_det, v.n_samp)?;
        let b = FusedBuffers::new(call, v, fused_arrays!(a))?;
        let map = call.array("mapdata", a.mapdata, F64)?;
        let amps = call.array("amplitudes", a.amplitudes, F64)?;
        let aflags = call.array("amplitude_flags", a.amplitude_flags, U8)?;
        let out = call.array("amplitudes_out", a.amplitudes_out, F64)?;
        let err = call.error_buffer()?;
        let masks = (a.pointing_flag_mask, a.iau, a.det_flag_mask);
        // Detectors whose amplitude blocks overlap add to the same
        // amplitudes: one launch each, in order.
        let blocks: Vec<i64> = v
            .values
            .amp_offset
            .iter()
            .copied()
            .filter(|&o| o >= 0)
            .collect();
        let split_det = blocks_overlap(&blocks, v.values.block_len);
        let max_amp = v
            .values
            .n_amp_views
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .max(0) as u64;
        for (d0, d1) in super::ranges(v.n_det, split_det) {
            for (i0, i1) in super::ranges(v.intervals.len(), false) {
                let range = (d0 as i64, d1 as i64, i0 as i64, i1 as i64);
                let p = fused_params!(ToastFusedProject, b, v, range, masks, {
                    mapdata: map,
                    amplitudes: amps,
                    amplitude_flags: aflags,
                    amplitudes_out: out,
                    err,
                });
                call.launch_blocks_of(
                    "toast_fused_project",
                    params::PROJECT_THREADS,
                    max_amp,
                    i1 - i0,
                    d1 - d0,
                    p,
                )?;
            }
        }
        match call.read_error(err)? {
            Some(at) => Err(b.fault(call, v, at)?),
            None => Ok(()),
        }
    }
}

// ---- noise simulation (ABI minor 5) ---------------------------------------

/// Samples per partial sum of `toast_sim_noise_partial` (the mean of the
/// kept samples: chunk sums in sample order, then the sums in chunk order).
const NOISE_SUM_CHUNK: i64 = 4096;

impl DeviceKernel for abi::SimNoiseArgs {
    /// The launches of `kernels.h`'s "noise simulation": the twiddle table
    /// once, then six per batch of
    /// detectors, each detector of a batch in its own contiguous slice of
    /// the workspace (`2 N + 2` doubles; the plugin option `workspace`
    /// does not apply: a stream is read whole by each FFT stage), as many
    /// per batch as the workspace budget holds (`workspace_items`).
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        if v.n_det == 0 || v.n_samp == 0 {
            return Ok(());
        }
        let n = v.fft_len as i64;
        let half = n / 2;
        let det_data = call.array("det_data", a.det_data, F64)?;
        let keys = call.small("keys", v.keys)?;
        let filter_index = call.small("filter_index", v.filter_index)?;
        let data_index = call.small("data_index", v.data_index)?;
        let amplitudes = call.small("amplitudes", v.amplitudes)?;
        // The twiddle table (N/2 complex values), then the streams' slices.
        let table = call.workspace(v.fft_len as u64, 1)?;
        let tw = Some(table.buf);
        call.launch(
            "toast_sim_noise_twiddles",
            half as u64,
            1,
            1,
            params::ToastSimNoiseTwiddles { fft_len: n, tw },
        )?;
        let item_len = toast_accel::budget::noise_stream_doubles(v.fft_len as u64);
        let ws = call.workspace(item_len, v.n_det as u64)?;
        let per_batch = (ws.per_launch as usize).clamp(1, super::MAX_GRID_YZ);
        let item_step = item_len as i64;
        let work = Some(ws.buf);
        // The stages alternate between R0 = [0, N) and R1 = [N, 2N + 2).
        let stages = half.trailing_zeros() as i64;
        let (res_off, sum_off) = if stages % 2 == 1 { (n, 0) } else { (0, n) };
        let n_samp = v.n_samp as i64;
        let n_chunk = (n_samp + NOISE_SUM_CHUNK - 1) / NOISE_SUM_CHUNK;
        for b0 in (0..v.n_det).step_by(per_batch) {
            let b1 = (b0 + per_batch).min(v.n_det);
            let nb = b1 - b0;
            let (d0, d_end) = (b0 as i64, b1 as i64);
            call.launch(
                "toast_sim_noise_spectrum",
                half as u64 + 1,
                nb,
                1,
                params::ToastSimNoiseSpectrum {
                    d0,
                    d_end,
                    fft_len: n,
                    counter0: v.counter0 as i64,
                    n_amp: v.n_amp() as i64,
                    keys,
                    filter_index,
                    amplitudes,
                    work,
                    item_step,
                },
            )?;
            call.launch(
                "toast_sim_noise_pack",
                half as u64,
                nb,
                1,
                params::ToastSimNoisePack {
                    d0,
                    d_end,
                    fft_len: n,
                    tw,
                    work,
                    item_step,
                },
            )?;
            let mut sub = half;
            let (mut src_off, mut dst_off) = (0, n);
            while sub >= 2 {
                call.launch(
                    "toast_sim_noise_fft_stage",
                    (half / 2) as u64,
                    nb,
                    1,
                    params::ToastSimNoiseFftStage {
                        d0,
                        d_end,
                        m_len: half,
                        n: sub,
                        src_off,
                        dst_off,
                        tw,
                        work,
                        item_step,
                    },
                )?;
                std::mem::swap(&mut src_off, &mut dst_off);
                sub /= 2;
            }
            debug_assert_eq!(src_off, res_off);
            call.launch(
                "toast_sim_noise_partial",
                n_chunk as u64,
                nb,
                1,
                params::ToastSimNoisePartial {
                    d0,
                    d_end,
                    fft_len: n,
                    n_samp,
                    chunk: NOISE_SUM_CHUNK,
                    res_off,
                    sum_off,
                    work,
                    item_step,
                },
            )?;
            call.launch(
                "toast_sim_noise_mean",
                1,
                nb,
                1,
                params::ToastSimNoiseMean {
                    d0,
                    d_end,
                    n_samp,
                    chunk: NOISE_SUM_CHUNK,
                    sum_off,
                    work,
                    item_step,
                },
            )?;
            call.launch(
                "toast_sim_noise_add",
                n_samp as u64,
                nb,
                1,
                params::ToastSimNoiseAdd {
                    d0,
                    d_end,
                    fft_len: n,
                    n_samp,
                    chunk: NOISE_SUM_CHUNK,
                    res_off,
                    sum_off,
                    data_index,
                    work,
                    item_step,
                    det_data,
                },
            )?;
        }
        Ok(())
    }
}

impl DeviceKernel for abi::CovAccumTimestreamArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("cov_accum_timestream", v.n_det, v.n_samp)?;
        let g2l = call.array("global2local", a.global2local, I64)?;
        let pixels = call.array("pixels", a.pixels, I64)?;
        let weights = call.array("weights", a.weights, F64)?;
        let det_flags = call.array("det_flags", a.det_flags, U8)?;
        let shared = call.array("shared_flags", a.shared_flags, U8)?;
        let hits = call.array("hits", a.hits, I64)?;
        let invnpp = call.array("invnpp", a.invnpp, F64)?;
        let g2l_host =
            call.global2local(a.global2local, g2l, v.n_global_submap, v.n_local_submap)?;
        let iv = call.intervals(v.intervals)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let wi = call.small("weight_index", v.weight_index)?;
        let fi = call.small("flag_index", v.flag_index)?;
        let scale = call.small("det_scale", v.det_scale)?;
        let err = call.error_buffer()?;
        // Atomic accumulation: no two launches are needed for correctness.
        call.launch_samples(
            "toast_cov_accum_timestream",
            v.n_det,
            v.intervals,
            false,
            false,
            |d0, d1, i0, i1| params::ToastCovAccumTimestream {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                nnz: v.nnz as i64,
                pixel_index: pi,
                weight_index: wi,
                flag_index: fi,
                det_scale: scale,
                g2l,
                n_global_submap: v.n_global_submap as i64,
                n_pix_submap: v.n_pix_submap,
                pixels,
                weights,
                det_flags,
                use_det_flags: v.use_det_flags as i32,
                det_mask: i32::from(a.det_flag_mask),
                shared_flags: shared,
                use_shared_flags: v.use_shared_flags as i32,
                shared_mask: i32::from(a.shared_flag_mask),
                hits,
                use_hits: v.use_hits as i32,
                invnpp,
                use_invnpp: v.use_invnpp as i32,
                err,
            },
        )?;
        call.map_pixel_fault(
            err,
            pixels,
            v.pixel_index,
            v.n_samp,
            v.intervals,
            &g2l_host,
            v.n_pix_submap,
        )
    }
}

// ---- the solver flags (ABI minor 6) ---------------------------------------

/// Samples each thread of `toast_solver_flags` takes (one pair of count
/// atomics per thread).
const SOLVER_FLAGS_CHUNK: u64 = 64;

impl DeviceKernel for abi::SolverFlagsArgs {
    fn launch<D: Driver>(
        call: &mut KernelLaunch<'_, D>,
        v: &Self::Valid<'_>,
        a: &Self,
    ) -> Result<(), PluginError> {
        check_key_range("solver_flags", v.n_det, v.n_samp)?;
        let g2l = call.array("global2local", a.global2local, I64)?;
        let det_flags = call.array("det_flags", a.det_flags, U8)?;
        let shared = call.array("shared_flags", a.shared_flags, U8)?;
        let pixels = call.array("pixels", a.pixels, I64)?;
        let mask = call.array("pixel_mask", a.pixel_mask, U8)?;
        let flags = call.array("flags", a.flags, U8)?;
        let counts = call.array("counts", a.counts, I64)?;
        let g2l_host = if v.use_mask {
            call.global2local(a.global2local, g2l, v.n_global_submap, v.n_local_submap)?
        } else {
            Arc::from([])
        };
        let oi = call.small("out_index", v.out_index)?;
        let cut_bit = i32::from(a.cut_bit);
        if cut_bit != 0 && !v.gaps.is_empty() {
            let gaps = call.intervals(&v.gaps)?;
            call.launch_samples(
                "toast_solver_flags_gaps",
                v.n_det,
                &v.gaps,
                false,
                false,
                |d0, d1, i0, i1| params::ToastSolverFlagsGaps {
                    det0: d0,
                    det_end: d1,
                    iv0: i0,
                    iv_end: i1,
                    n_samp: v.n_samp as i64,
                    gaps,
                    out_index: oi,
                    flags,
                    cut_bit,
                },
            )?;
        }
        if v.intervals.is_empty() {
            return Ok(());
        }
        let iv = call.intervals(v.intervals)?;
        let fi = call.small("flag_index", v.flag_index)?;
        let pi = call.small("pixel_index", v.pixel_index)?;
        let err = call.error_buffer()?;
        call.launch_sample_chunks(
            "toast_solver_flags",
            v.n_det,
            v.intervals,
            (false, false),
            SOLVER_FLAGS_CHUNK,
            |d0, d1, i0, i1, stride| params::ToastSolverFlags {
                det0: d0,
                det_end: d1,
                iv0: i0,
                iv_end: i1,
                n_samp: v.n_samp as i64,
                intervals: iv,
                chunk: SOLVER_FLAGS_CHUNK as i64,
                stride,
                flag_index: fi,
                pixel_index: pi,
                out_index: oi,
                g2l,
                n_global_submap: v.n_global_submap as i64,
                n_pix_submap: v.n_pix_submap,
                det_flags,
                use_det_flags: v.use_det_flags as i32,
                det_mask: i32::from(a.det_flag_mask),
                shared_flags: shared,
                use_shared_flags: v.use_shared_flags as i32,
                shared_mask: i32::from(a.shared_flag_mask),
                pixels,
                pixel_mask: mask,
                use_mask: v.use_mask as i32,
                flags,
                counts,
                cut_bit,
                mask_bit: i32::from(a.mask_bit),
                err,
            },
        )?;
        call.map_pixel_fault(
            err,
            pixels,
            v.pixel_index,
            v.n_samp,
            v.intervals,
            &g2l_host,
            v.n_pix_submap,
        )
    }
}
