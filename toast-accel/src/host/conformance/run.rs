//! Running a case's kernel on a backend.
//!
//! [`run_case`] checks the backend implements the case's kernel and hands
//! the case to its kernel's `run` method below (one per kernel, chosen by
//! the table in the [parent module](super)). Each `run` copies the output's
//! initial value, stages the arrays through [`ArrayArg`] (so a backend that
//! is not host-addressable gets them uploaded and downloaded), fills the
//! kernel's `#[repr(C)]` argument struct, launches, and compares every
//! output with TOAST's. TOAST's "disabled by length" conventions (flags of
//! length 1, a dummy HWP array, `det_flags` of shape (1, 1)) become absent
//! arrays.

use super::case::{
    AmpAxpbyCase, AmpDotCase, BuildNoiseWeightedCase, Case, CompactExpandPointingCase,
    CovAccumDiagHitsCase, CovAccumDiagInvnppCase, CovAccumTimestreamCase, CovApplyDiagCase,
    FilterPoly2dCase, FilterPolynomialCase, FusedAccumulateCase, FusedCase, FusedProjectCase,
    MapData, NoiseWeightCase, PixelsHealpixCase, PointingDetectorCase, ScanMapCase, SimNoiseCase,
    SolverFlagsCase, StokesWeightsICase, StokesWeightsIquCase, TemplateOffsetAddToSignalCase,
    TemplateOffsetApplyDiagPrecondCase, TemplateOffsetProjectSignalCase,
};
use super::compare::{
    compare, verdict, within, CaseOutcome, Comparison, ACCUM_RTOL, AMP_RTOL, FUSED_COMPACT_RTOL,
    NOISE_RTOL, POLY2D_RTOL, POLYNOMIAL_RTOL, TRIG_RTOL,
};
use crate::abi::{self, SampleRange, SampleRanges};
use crate::host::{AbiElement, AccelError, ArrayArg, Backend, KernelArgs};

/// Run one case on `backend` and compare its outputs with TOAST's, in the
/// backend's default [`Comparison`] ([`Comparison::for_backend`]).
pub fn run_case(backend: &Backend, case: &Case) -> CaseOutcome {
    run_case_with(backend, case, Comparison::for_backend(backend))
}

/// [`run_case`] with an explicit comparison mode.
pub fn run_case_with(backend: &Backend, case: &Case, cmp: Comparison) -> CaseOutcome {
    if !backend.supports(case.kernel) {
        return CaseOutcome::Skipped {
            reason: format!(
                "backend `{}` does not implement kernel `{}`",
                backend.name(),
                case.kernel
            ),
        };
    }
    match case.data.run(backend, cmp) {
        Ok(o) | Err(o) => o,
    }
}

// ---------------------------------------------------------------------------
// Helpers shared by the kernels. An `Err(outcome)` ends the case early with
// that outcome (staging or kernel error, unsupported kernel).
// ---------------------------------------------------------------------------

/// The ABI view of an interval list.
fn ivs(iv: &[SampleRange]) -> SampleRanges {
    SampleRanges {
        ptr: if iv.is_empty() {
            std::ptr::null()
        } else {
            iv.as_ptr()
        },
        len: iv.len() as u64,
    }
}

/// Present when `a` has exactly `n` elements, absent otherwise (TOAST's
/// "disabled by length" convention).
fn if_len<T>(a: &[T], n: usize) -> &[T] {
    if a.len() == n {
        a
    } else {
        &[]
    }
}

/// The tolerance of a device's amplitudes (tolerant mode): [`AMP_RTOL`]
/// for each sample an amplitude sums, `step_length` of them, but never more
/// than the `n_samp` a detector has (a step length past the data must not
/// widen the bound to any value at all).
fn amp_rtol(step_length: i64, n_samp: usize) -> f64 {
    let n_samp = i64::try_from(n_samp).unwrap_or(i64::MAX).max(1);
    AMP_RTOL * step_length.clamp(1, n_samp) as f64
}

/// Dimension `i` of a shape, or 0.
fn dim(shape: &[usize], i: usize) -> usize {
    shape.get(i).copied().unwrap_or(0)
}

/// The number of map components of a `weights` array: its third dimension,
/// or 1 for a two-dimensional one.
fn nnz(weights_shape: &[usize]) -> usize {
    if weights_shape.len() == 3 {
        dim(weights_shape, 2)
    } else {
        1
    }
}

/// Stage an input array.
fn stage_in<'a, T: AbiElement>(
    b: &'a Backend,
    data: &'a [T],
    name: &str,
) -> Result<ArrayArg<'a>, CaseOutcome> {
    ArrayArg::input(b, data, name).map_err(staging_error)
}

/// Stage an output array (its initial value is uploaded too).
fn stage_out<'a, T: AbiElement>(
    b: &'a Backend,
    data: &'a mut [T],
    name: &str,
) -> Result<ArrayArg<'a>, CaseOutcome> {
    ArrayArg::output(b, data, name).map_err(staging_error)
}

fn staging_error(e: AccelError) -> CaseOutcome {
    CaseOutcome::Error {
        message: format!("staging an array failed: {e}"),
    }
}

/// Launch and turn the result into an outcome-or-continue.
///
/// # Safety
/// As [`Backend::launch`].
unsafe fn launch<A: KernelArgs>(b: &Backend, args: &A) -> Result<(), CaseOutcome> {
    // SAFETY: the caller upholds `Backend::launch`'s contract (this
    // function's own), which is all the call needs.
    match unsafe { b.launch(args) } {
        Ok(()) => Ok(()),
        Err(AccelError::Unsupported { backend, kernel }) => Err(CaseOutcome::Skipped {
            reason: format!("backend `{backend}` does not implement kernel `{kernel}`"),
        }),
        Err(e) => Err(CaseOutcome::Error {
            message: e.to_string(),
        }),
    }
}

/// Finish the staged arrays (outputs are downloaded into their host slices).
fn finish(args: Vec<ArrayArg<'_>>) -> Result<(), CaseOutcome> {
    for a in args {
        a.finish().map_err(|e| CaseOutcome::Error {
            message: e.to_string(),
        })?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// One `run` per kernel.
// ---------------------------------------------------------------------------

impl PointingDetectorCase {
    /// `pointing_detector`: the detector quaternions.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let PointingDetectorCase {
            focalplane,
            boresight,
            quat_index,
            quats_in,
            quats_out,
            shared_flags,
            shared_flag_mask,
            intervals,
        } = self;
        let n_samp = dim(&quats_in.shape, 1);
        let mut quats = quats_in.data.clone();
        {
            let bo = stage_in(b, &boresight.data, "boresight")?;
            let fl = stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags")?;
            let q = stage_out(b, &mut quats, "quats")?;
            let args = abi::PointingDetectorArgs {
                n_det: quat_index.data.len() as u64,
                n_samp: n_samp as u64,
                quat_index: quat_index.data.as_ptr(),
                focalplane: focalplane.data.as_ptr(),
                intervals: ivs(intervals),
                boresight: bo.abi(),
                shared_flags: fl.abi(),
                shared_flag_mask: *shared_flag_mask,
                reserved: [0; 7],
                quats: q.abi(),
            };
            // SAFETY: every pointer is a live array of this case, or a
            // staged buffer alive until `finish`, with the length the struct
            // declares: `load` checked the per-detector host arrays against
            // the index arrays (n_det) and ArrayArg carries its own length.
            unsafe { launch(b, &args)? };
            finish(vec![q, bo, fl])?;
        }
        Ok(verdict([compare("quats", &quats, &quats_out.data)]))
    }
}

impl PixelsHealpixCase {
    /// `pixels_healpix`: pixel indices and hit submaps; then, where the
    /// plugin and the nside allow it, the same call with i32 pixels (the
    /// compact pointing, ABI minor 8), which must give the same pixels.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let mut pixels = self.pixels_in.data.clone();
        let mut hits = self.hit_submaps_in.data.clone();
        self.call(b, &mut pixels, &mut hits, 0)?;
        let mut checks = vec![
            compare("pixels", &pixels, &self.pixels_out.data),
            compare("hit_submaps", &hits, &self.hit_submaps_out.data),
        ];
        let npix = 12 * (self.nside as i128) * (self.nside as i128);
        let narrow: Option<Vec<i32>> = self
            .pixels_in
            .data
            .iter()
            .map(|&p| i32::try_from(p).ok())
            .collect();
        if let (true, true, Some(mut pixels32)) =
            (b.writes_i32_pixels(), npix <= i128::from(i32::MAX), narrow)
        {
            let mut hits = self.hit_submaps_in.data.clone();
            self.call(b, &mut pixels32, &mut hits, 1)?;
            let widened: Vec<i64> = pixels32.iter().map(|&p| i64::from(p)).collect();
            checks.push(compare("pixels (i32)", &widened, &self.pixels_out.data));
            checks.push(compare(
                "hit_submaps (i32 pixels)",
                &hits,
                &self.hit_submaps_out.data,
            ));
        }
        Ok(verdict(checks))
    }

    /// One `pixels_healpix` call of this case into `pixels` (i64, or i32
    /// with `pixels_i32` = 1) and `hits`.
    fn call<P: AbiElement>(
        &self,
        b: &Backend,
        pixels: &mut [P],
        hits: &mut [u8],
        pixels_i32: u8,
    ) -> Result<(), CaseOutcome> {
        let PixelsHealpixCase {
            quat_index,
            quats,
            shared_flags,
            shared_flag_mask,
            pixel_index,
            pixels_in,
            n_pix_submap,
            nside,
            nest,
            intervals,
            ..
        } = self;
        let n_samp = dim(&pixels_in.shape, 1);
        let q = stage_in(b, &quats.data, "quats")?;
        let fl = stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags")?;
        let p = stage_out(b, pixels, "pixels")?;
        let h = stage_out(b, hits, "hit_submaps")?;
        let args = abi::PixelsHealpixArgs {
            n_det: quat_index.data.len() as u64,
            n_samp: n_samp as u64,
            quat_index: quat_index.data.as_ptr(),
            pixel_index: pixel_index.data.as_ptr(),
            intervals: ivs(intervals),
            quats: q.abi(),
            shared_flags: fl.abi(),
            pixels: p.abi(),
            hit_submaps: h.abi(),
            nside: *nside,
            n_pix_submap: *n_pix_submap,
            shared_flag_mask: *shared_flag_mask,
            nest: *nest,
            pixels_i32,
            reserved: [0; 5],
        };
        // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
        // case or staged buffers, per-detector lengths checked by `load`;
        // `pixels` is of i32 exactly when `pixels_i32` is 1 (the callers).
        unsafe { launch(b, &args)? };
        finish(vec![p, h, q, fl])
    }
}

impl StokesWeightsICase {
    /// `stokes_weights_I`: the intensity weights.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let StokesWeightsICase {
            weight_index,
            weights_in,
            weights_out,
            cal,
            intervals,
        } = self;
        let n_samp = dim(&weights_in.shape, 1);
        let mut weights = weights_in.data.clone();
        {
            let w = stage_out(b, &mut weights, "weights")?;
            let args = abi::StokesWeightsIArgs {
                n_det: weight_index.data.len() as u64,
                n_samp: n_samp as u64,
                weight_index: weight_index.data.as_ptr(),
                cal: cal.data.as_ptr(),
                intervals: ivs(intervals),
                weights: w.abi(),
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![w])?;
        }
        Ok(verdict([compare("weights", &weights, &weights_out.data)]))
    }
}

impl StokesWeightsIquCase {
    /// `stokes_weights_IQU`: the weights, compared within [`TRIG_RTOL`] in
    /// tolerant mode (the device's trigonometry).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let StokesWeightsIquCase {
            quat_index,
            quats,
            weight_index,
            weights_in,
            weights_out,
            hwp,
            epsilon,
            gamma,
            cal,
            iau,
            intervals,
        } = self;
        let n_samp = dim(&weights_in.shape, 1);
        let mut weights = weights_in.data.clone();
        {
            let q = stage_in(b, &quats.data, "quats")?;
            let h = stage_in(b, if_len(&hwp.data, n_samp), "hwp")?;
            let w = stage_out(b, &mut weights, "weights")?;
            let args = abi::StokesWeightsIquArgs {
                n_det: quat_index.data.len() as u64,
                n_samp: n_samp as u64,
                quat_index: quat_index.data.as_ptr(),
                weight_index: weight_index.data.as_ptr(),
                epsilon: epsilon.data.as_ptr(),
                gamma: gamma.data.as_ptr(),
                cal: cal.data.as_ptr(),
                intervals: ivs(intervals),
                quats: q.abi(),
                hwp: h.abi(),
                weights: w.abi(),
                iau: *iau,
                reserved: [0; 7],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![w, q, h])?;
        }
        Ok(verdict([cmp.float(
            "weights",
            &weights,
            &weights_out.data,
            TRIG_RTOL,
        )]))
    }
}

impl ScanMapCase {
    /// `scan_map`: the map sampled into `det_data`, for any of the four map
    /// dtypes.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let ScanMapCase {
            global2local,
            n_pix_submap,
            mapdata,
            det_data_in,
            det_data_out,
            data_index,
            pixels,
            pixel_index,
            weights,
            weight_index,
            data_scale,
            should_zero,
            should_subtract,
            should_scale,
            intervals,
        } = self;
        let n_samp = dim(&pixels.shape, 1);
        let nnz = nnz(&weights.shape);
        let mut det_data = det_data_in.data.clone();
        {
            let g = stage_in(b, &global2local.data, "global2local")?;
            let (m, dtype) = match mapdata {
                MapData::F64(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_F64),
                MapData::F32(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_F32),
                MapData::I64(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_I64),
                MapData::I32(a) => (stage_in(b, &a.data, "mapdata"), abi::DTYPE_I32),
            };
            let m = m?;
            let p = stage_in(b, &pixels.data, "pixels")?;
            let w = stage_in(b, &weights.data, "weights")?;
            let d = stage_out(b, &mut det_data, "det_data")?;
            let args = abi::ScanMapArgs {
                n_det: pixel_index.data.len() as u64,
                n_samp: n_samp as u64,
                nnz: nnz as u64,
                pixel_index: pixel_index.data.as_ptr(),
                weight_index: weight_index.data.as_ptr(),
                data_index: data_index.data.as_ptr(),
                intervals: ivs(intervals),
                global2local: g.abi(),
                n_pix_submap: *n_pix_submap,
                map_dtype: dtype,
                reserved0: 0,
                mapdata: m.abi(),
                pixels: p.abi(),
                weights: w.abi(),
                det_data: d.abi(),
                data_scale: *data_scale,
                should_zero: *should_zero,
                should_subtract: *should_subtract,
                should_scale: *should_scale,
                reserved: [0; 5],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![d, g, m, p, w])?;
        }
        Ok(verdict([compare(
            "det_data",
            &det_data,
            &det_data_out.data,
        )]))
    }
}

impl BuildNoiseWeightedCase {
    /// `build_noise_weighted`: the noise-weighted map, compared within
    /// [`ACCUM_RTOL`] in tolerant mode (atomic accumulation).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let BuildNoiseWeightedCase {
            global2local,
            zmap_in,
            zmap_out,
            pixel_index,
            pixels,
            weight_index,
            weights,
            data_index,
            det_data,
            flag_index,
            det_flags,
            det_scale,
            det_flag_mask,
            shared_flags,
            shared_flag_mask,
            intervals,
        } = self;
        let n_samp = dim(&pixels.shape, 1);
        let nnz = nnz(&weights.shape);
        // TOAST uses det_flags only when its second dimension is n_samp.
        let det_flags_used: &[u8] = if dim(&det_flags.shape, 1) == n_samp {
            &det_flags.data
        } else {
            &[]
        };
        let mut zmap = zmap_in.data.clone();
        {
            let g = stage_in(b, &global2local.data, "global2local")?;
            let p = stage_in(b, &pixels.data, "pixels")?;
            let w = stage_in(b, &weights.data, "weights")?;
            let d = stage_in(b, &det_data.data, "det_data")?;
            let df = stage_in(b, det_flags_used, "det_flags")?;
            let sf = stage_in(b, if_len(&shared_flags.data, n_samp), "shared_flags")?;
            let z = stage_out(b, &mut zmap, "zmap")?;
            let args = abi::BuildNoiseWeightedArgs {
                n_det: pixel_index.data.len() as u64,
                n_samp: n_samp as u64,
                nnz: nnz as u64,
                pixel_index: pixel_index.data.as_ptr(),
                weight_index: weight_index.data.as_ptr(),
                data_index: data_index.data.as_ptr(),
                flag_index: flag_index.data.as_ptr(),
                det_scale: det_scale.data.as_ptr(),
                intervals: ivs(intervals),
                global2local: g.abi(),
                // TOAST takes n_pix_submap from the shape of zmap.
                n_pix_submap: dim(&zmap_in.shape, 1) as i64,
                pixels: p.abi(),
                weights: w.abi(),
                det_data: d.abi(),
                det_flags: df.abi(),
                shared_flags: sf.abi(),
                zmap: z.abi(),
                det_flag_mask: *det_flag_mask,
                shared_flag_mask: *shared_flag_mask,
                reserved: [0; 6],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![z, g, p, w, d, df, sf])?;
        }
        Ok(verdict([cmp.float(
            "zmap",
            &zmap,
            &zmap_out.data,
            ACCUM_RTOL,
        )]))
    }
}

impl NoiseWeightCase {
    /// `noise_weight`: `det_data` scaled by the detector weights.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let NoiseWeightCase {
            det_data_in,
            det_data_out,
            data_index,
            detector_weights,
            intervals,
        } = self;
        let n_samp = dim(&det_data_in.shape, 1);
        let mut det_data = det_data_in.data.clone();
        {
            let d = stage_out(b, &mut det_data, "det_data")?;
            let args = abi::NoiseWeightArgs {
                n_det: data_index.data.len() as u64,
                n_samp: n_samp as u64,
                data_index: data_index.data.as_ptr(),
                detector_weights: detector_weights.data.as_ptr(),
                intervals: ivs(intervals),
                det_data: d.abi(),
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![d])?;
        }
        Ok(verdict([compare(
            "det_data",
            &det_data,
            &det_data_out.data,
        )]))
    }
}

impl TemplateOffsetAddToSignalCase {
    /// `template_offset_add_to_signal`: one single-detector call per entry
    /// of `call_data_index`, in order, as TOAST's `OffsetTemplate` does.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let TemplateOffsetAddToSignalCase {
            step_length,
            n_amp_views,
            amplitudes,
            amplitude_flags,
            call_data_index,
            call_amp_offset,
            det_data_in,
            det_data_out,
            intervals,
        } = self;
        let n_samp = dim(&det_data_in.shape, 1);
        let mut det_data = det_data_in.data.clone();
        for c in 0..call_data_index.data.len() {
            let a = stage_in(b, &amplitudes.data, "amplitudes")?;
            let f = stage_in(b, &amplitude_flags.data, "amplitude_flags")?;
            let d = stage_out(b, &mut det_data, "det_data")?;
            let args = abi::TemplateOffsetAddArgs {
                n_det: 1,
                n_samp: n_samp as u64,
                data_index: &call_data_index.data[c],
                layout: abi::OffsetLayout {
                    step_length: *step_length,
                    n_amp_views: n_amp_views.data.as_ptr(),
                    amp_offset: &call_amp_offset.data[c],
                },
                intervals: ivs(intervals),
                amplitudes: a.abi(),
                amplitude_flags: f.abi(),
                det_data: d.abi(),
            };
            // SAFETY: as in `PointingDetectorCase::run`; `data_index` (and
            // `flag_index`) and `amp_offset` point at element c of the call
            // arrays, of which n_det = 1 reads one, and `load` checked that
            // n_amp_views has one entry per interval.
            unsafe { launch(b, &args)? };
            finish(vec![d, a, f])?;
        }
        Ok(verdict([compare(
            "det_data",
            &det_data,
            &det_data_out.data,
        )]))
    }
}

impl TemplateOffsetProjectSignalCase {
    /// `template_offset_project_signal`: one single-detector call per entry
    /// of `call_data_index`, in order, as TOAST's `OffsetTemplate` does.
    /// Exact in exact mode (the CPU sums each amplitude's samples in sample
    /// order, as TOAST's references); in tolerant mode within [`AMP_RTOL`]
    /// x `step_length` (at most `n_samp`) of the largest |amplitude| (FORMAT.md section 9: a
    /// device adds an amplitude's samples in a tree, one block per
    /// amplitude).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let TemplateOffsetProjectSignalCase {
            call_data_index,
            det_data,
            call_flag_index,
            flag_data,
            flag_mask,
            step_length,
            call_amp_offset,
            n_amp_views,
            amplitudes_in,
            amplitudes_out,
            amplitude_flags,
            intervals,
        } = self;
        let n_samp = dim(&det_data.shape, 1);
        // TOAST reads flag_data only for flag_index >= 0, as [*, n_samp].
        let flags_used: &[u8] = if flag_data.shape.len() == 2 && dim(&flag_data.shape, 1) == n_samp
        {
            &flag_data.data
        } else {
            &[]
        };
        let mut amps = amplitudes_in.data.clone();
        for c in 0..call_data_index.data.len() {
            let d = stage_in(b, &det_data.data, "det_data")?;
            let fd = stage_in(b, flags_used, "flag_data")?;
            let f = stage_in(b, &amplitude_flags.data, "amplitude_flags")?;
            let a = stage_out(b, &mut amps, "amplitudes")?;
            let args = abi::TemplateOffsetProjectArgs {
                n_det: 1,
                n_samp: n_samp as u64,
                data_index: &call_data_index.data[c],
                flag_index: &call_flag_index.data[c],
                layout: abi::OffsetLayout {
                    step_length: *step_length,
                    n_amp_views: n_amp_views.data.as_ptr(),
                    amp_offset: &call_amp_offset.data[c],
                },
                intervals: ivs(intervals),
                det_data: d.abi(),
                flag_data: fd.abi(),
                amplitudes: a.abi(),
                amplitude_flags: f.abi(),
                flag_mask: *flag_mask,
                reserved: [0; 7],
            };
            // SAFETY: as in `PointingDetectorCase::run`; `data_index` (and
            // `flag_index`) and `amp_offset` point at element c of the call
            // arrays, of which n_det = 1 reads one, and `load` checked that
            // n_amp_views has one entry per interval.
            unsafe { launch(b, &args)? };
            finish(vec![a, d, fd, f])?;
        }
        let rtol = amp_rtol(*step_length, n_samp);
        Ok(verdict([cmp.float(
            "amplitudes",
            &amps,
            &amplitudes_out.data,
            rtol,
        )]))
    }
}

impl TemplateOffsetApplyDiagPrecondCase {
    /// `template_offset_apply_diag_precond`.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let TemplateOffsetApplyDiagPrecondCase {
            offset_var,
            amplitudes_in,
            amplitude_flags,
            amplitudes_out_in,
            amplitudes_out_out,
        } = self;
        let mut out = amplitudes_out_in.data.clone();
        {
            let v = stage_in(b, &offset_var.data, "offset_var")?;
            let i = stage_in(b, &amplitudes_in.data, "amplitudes_in")?;
            let f = stage_in(b, &amplitude_flags.data, "amplitude_flags")?;
            let o = stage_out(b, &mut out, "amplitudes_out")?;
            let args = abi::TemplateOffsetPrecondArgs {
                n_amp: amplitudes_in.data.len() as u64,
                offset_var: v.abi(),
                amplitudes_in: i.abi(),
                amplitude_flags: f.abi(),
                amplitudes_out: o.abi(),
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![o, v, i, f])?;
        }
        Ok(verdict([compare(
            "amplitudes_out",
            &out,
            &amplitudes_out_out.data,
        )]))
    }
}

impl CovAccumDiagHitsCase {
    /// `cov_accum_diag_hits`: the hit map (integer: exact on every backend).
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let mut hits = c.hits_in.data.clone();
        {
            let sm = stage_in(b, &c.submap.data, "submap")?;
            let px = stage_in(b, &c.subpix.data, "subpix")?;
            // TOAST passes its whole local map; the kernel's is nsub x nsubpix.
            let n = if c.nsub < 1 {
                0
            } else {
                (c.nsub * c.nsubpix) as usize
            };
            let h = stage_out(b, &mut hits[..n.min(c.hits_in.data.len())], "hits")?;
            let args = abi::CovAccumDiagHitsArgs {
                nsub: c.nsub,
                nsubpix: c.nsubpix,
                nnz: c.nnz,
                submap: sm.abi(),
                subpix: px.abi(),
                hits: h.abi(),
            };
            // SAFETY: live arrays of this case or staged buffers, each with
            // the length the struct declares (no host pointers).
            unsafe { launch(b, &args)? };
            finish(vec![h, sm, px])?;
        }
        Ok(verdict([compare("hits", &hits, &c.hits_out.data)]))
    }
}

impl CovAccumDiagInvnppCase {
    /// `cov_accum_diag_invnpp`: the inverse covariance (device atomics sum
    /// a pixel's samples in any order: [`ACCUM_RTOL`] in tolerant mode).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let mut invnpp = c.invnpp_in.data.clone();
        {
            let sm = stage_in(b, &c.submap.data, "submap")?;
            let px = stage_in(b, &c.subpix.data, "subpix")?;
            let w = stage_in(b, &c.weights.data, "weights")?;
            let n = if c.nsub < 1 || c.nnz < 1 {
                0
            } else {
                (c.nsub * c.nsubpix * c.nnz * (c.nnz + 1) / 2) as usize
            };
            let o = stage_out(b, &mut invnpp[..n.min(c.invnpp_in.data.len())], "invnpp")?;
            let args = abi::CovAccumDiagInvnppArgs {
                nsub: c.nsub,
                nsubpix: c.nsubpix,
                nnz: c.nnz,
                submap: sm.abi(),
                subpix: px.abi(),
                weights: w.abi(),
                scale: c.scale,
                invnpp: o.abi(),
            };
            // SAFETY: as in `CovAccumDiagHitsCase::run`.
            unsafe { launch(b, &args)? };
            finish(vec![o, sm, px, w])?;
        }
        Ok(verdict([cmp.float(
            "invnpp",
            &invnpp,
            &c.invnpp_out.data,
            ACCUM_RTOL,
        )]))
    }
}

impl CovAccumTimestreamCase {
    /// `cov_accum_timestream`: the hit map (exact on every backend) and the
    /// inverse covariance (device atomics sum a pixel's samples in any
    /// order: [`ACCUM_RTOL`] in tolerant mode).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let n_samp = dim(&c.pixels.shape, 1);
        let use_invnpp = !c.invnpp_in.data.is_empty();
        let mut hits = c.hits_in.data.clone();
        let mut invnpp = c.invnpp_in.data.clone();
        {
            let g = stage_in(b, &c.global2local.data, "global2local")?;
            let p = stage_in(b, &c.pixels.data, "pixels")?;
            let w = stage_in(b, if use_invnpp { &c.weights.data } else { &[] }, "weights")?;
            let df = stage_in(b, &c.det_flags.data, "det_flags")?;
            let sf = stage_in(b, if_len(&c.shared_flags.data, n_samp), "shared_flags")?;
            let h = stage_out(b, &mut hits, "hits")?;
            let o = stage_out(b, &mut invnpp, "invnpp")?;
            let args = abi::CovAccumTimestreamArgs {
                n_det: c.pixel_index.data.len() as u64,
                n_samp: n_samp as u64,
                nnz: c.nnz as u64,
                pixel_index: c.pixel_index.data.as_ptr(),
                weight_index: c.weight_index.data.as_ptr(),
                flag_index: c.flag_index.data.as_ptr(),
                det_scale: c.det_scale.data.as_ptr(),
                intervals: ivs(&c.intervals),
                global2local: g.abi(),
                n_pix_submap: c.n_pix_submap,
                pixels: p.abi(),
                weights: w.abi(),
                det_flags: df.abi(),
                shared_flags: sf.abi(),
                hits: h.abi(),
                invnpp: o.abi(),
                det_flag_mask: c.det_flag_mask,
                shared_flag_mask: c.shared_flag_mask,
                reserved: [0; 6],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![h, o, g, p, w, df, sf])?;
        }
        Ok(verdict([
            compare("hits", &hits, &c.hits_out.data),
            cmp.float("invnpp", &invnpp, &c.invnpp_out.data, ACCUM_RTOL),
        ]))
    }
}

impl SolverFlagsCase {
    /// `solver_flags`: integer work, the same bytes on every backend.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let n_samp = dim(&c.flags_in.shape, 1);
        let use_mask = !c.pixel_mask.data.is_empty();
        let mut flags = c.flags_in.data.clone();
        let mut counts = c.counts_in.data.clone();
        let or_none = |v: &[i32]| {
            if v.is_empty() {
                std::ptr::null()
            } else {
                v.as_ptr()
            }
        };
        {
            let g = stage_in(
                b,
                if use_mask { &c.global2local.data } else { &[] },
                "global2local",
            )?;
            let df = stage_in(b, &c.det_flags.data, "det_flags")?;
            let sf = stage_in(b, if_len(&c.shared_flags.data, n_samp), "shared_flags")?;
            let p = stage_in(b, if use_mask { &c.pixels.data } else { &[] }, "pixels")?;
            let m = stage_in(b, &c.pixel_mask.data, "pixel_mask")?;
            let o = stage_out(b, &mut flags, "flags")?;
            let n = stage_out(b, &mut counts, "counts")?;
            let args = abi::SolverFlagsArgs {
                n_det: c.out_index.data.len() as u64,
                n_samp: n_samp as u64,
                flag_index: or_none(&c.flag_index.data),
                pixel_index: or_none(&c.pixel_index.data),
                out_index: c.out_index.data.as_ptr(),
                intervals: ivs(&c.intervals),
                global2local: g.abi(),
                n_pix_submap: c.n_pix_submap,
                det_flags: df.abi(),
                shared_flags: sf.abi(),
                pixels: p.abi(),
                pixel_mask: m.abi(),
                flags: o.abi(),
                counts: n.abi(),
                det_flag_mask: c.det_flag_mask,
                shared_flag_mask: c.shared_flag_mask,
                cut_bit: c.cut_bit,
                mask_bit: c.mask_bit,
                reserved: [0; 4],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![o, n, g, df, sf, p, m])?;
        }
        Ok(verdict([
            compare("flags", &flags, &c.flags_out.data),
            compare("counts", &counts, &c.counts_out.data),
        ]))
    }
}

impl CovApplyDiagCase {
    /// `cov_apply_diag`: one thread per pixel, in TOAST's operation order
    /// (exact on every backend).
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let mut vec = c.vec_in.data.clone();
        {
            // TOAST passes its whole local map; the kernel's is nsub x nsubpix.
            let (nm, nv) = if c.nsub < 1 || c.nnz < 1 {
                (0, 0)
            } else {
                let npix = (c.nsub * c.nsubpix) as usize;
                let nnz = c.nnz as usize;
                (npix * nnz * (nnz + 1) / 2, npix * nnz)
            };
            let m = stage_in(b, &c.mat.data[..nm.min(c.mat.data.len())], "mat")?;
            let v = stage_out(b, &mut vec[..nv.min(c.vec_in.data.len())], "vec")?;
            let args = abi::CovApplyDiagArgs {
                nsub: c.nsub,
                nsubpix: c.nsubpix,
                nnz: c.nnz,
                mat: m.abi(),
                vec: v.abi(),
            };
            // SAFETY: as in `CovAccumDiagHitsCase::run`.
            unsafe { launch(b, &args)? };
            finish(vec![v, m])?;
        }
        Ok(verdict([compare("vec", &vec, &c.vec_out.data)]))
    }
}

impl AmpDotCase {
    /// `amp_dot`: the per-block partial sums, exact in exact mode; in
    /// tolerant mode each within [`AMP_RTOL`] × the block's length of the
    /// sum of its terms' magnitudes (a fused multiply-add per term).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let mut partials = vec![0.0f64; c.partials.data.len()];
        {
            let x = stage_in(b, &c.a.data, "a")?;
            let y = stage_in(b, &c.b.data, "b")?;
            let fl = stage_in(b, &c.flags.data, "flags")?;
            let p = stage_out(b, &mut partials, "partials")?;
            let args = abi::AmpDotArgs {
                n: c.n,
                nblock: c.nblock,
                a: x.abi(),
                b: y.abi(),
                flags: fl.abi(),
                partials: p.abi(),
            };
            // SAFETY: as in `CovAccumDiagHitsCase::run`.
            unsafe { launch(b, &args)? };
            finish(vec![p, fl, y, x])?;
        }
        if cmp == Comparison::Exact {
            return Ok(verdict([compare("partials", &partials, &c.partials.data)]));
        }
        let (n, nblock) = (c.a.data.len(), partials.len());
        let scale = |k: usize| {
            let r = crate::math::dot_block(k, n, nblock);
            let len = r.len() as f64;
            let mag: f64 = r
                .filter(|&i| c.flags.data[i] == 0)
                .map(|i| (c.a.data[i] * c.b.data[i]).abs())
                .sum();
            mag * len
        };
        Ok(verdict([within(
            "partials",
            &partials,
            &c.partials.data,
            AMP_RTOL,
            |_| false,
            scale,
        )]))
    }
}

impl AmpAxpbyCase {
    /// `amp_axpby`: exact in exact mode; in tolerant mode within
    /// [`AMP_RTOL`] of `|αx| + |βy|` per element (a fused multiply-add).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let mut y = c.y_in.data.clone();
        {
            let x = stage_in(b, &c.x.data, "x")?;
            let yv = stage_out(b, &mut y, "y")?;
            let args = abi::AmpAxpbyArgs {
                n: c.n,
                alpha: c.alpha,
                beta: c.beta,
                x: x.abi(),
                y: yv.abi(),
            };
            // SAFETY: as in `CovAccumDiagHitsCase::run`.
            unsafe { launch(b, &args)? };
            finish(vec![yv, x])?;
        }
        if cmp == Comparison::Exact {
            return Ok(verdict([compare("y", &y, &c.y_out.data)]));
        }
        let scale = |i: usize| {
            let by = if c.beta == 0.0 {
                0.0
            } else {
                c.beta * c.y_in.data[i]
            };
            (c.alpha * c.x.data[i]).abs() + by.abs()
        };
        Ok(verdict([within(
            "y",
            &y,
            &c.y_out.data,
            AMP_RTOL,
            |_| false,
            scale,
        )]))
    }
}

impl FilterPolynomialCase {
    /// `filter_polynomial`: every row filtered, the scans in order. Against
    /// TOAST's LAPACK solve within [`POLYNOMIAL_RTOL`] of the largest input
    /// in every mode; samples TOAST leaves alone must be untouched.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let (n_rows, n_samp) = (dim(&c.signals_in.shape, 0), dim(&c.signals_in.shape, 1));
        let index: Vec<i32> = (0..n_rows as i32).collect();
        let mut signals = c.signals_in.data.clone();
        {
            let f = stage_in(b, &c.flags.data, "flags")?;
            let s = stage_out(b, &mut signals, "signals")?;
            let args = abi::FilterPolynomialArgs {
                n_signal: n_rows as u64,
                n_samp: n_samp as u64,
                n_scan: c.starts.data.len() as u64,
                order: c.order,
                signal_index: index.as_ptr(),
                starts: c.starts.data.as_ptr(),
                stops: c.stops.data.as_ptr(),
                flags: f.abi(),
                signals: s.abi(),
            };
            // SAFETY: live arrays of this case or staged buffers; `index`
            // has n_signal entries and `load` checked stops against starts.
            unsafe { launch(b, &args)? };
            finish(vec![s, f])?;
        }
        let input = &c.signals_in.data;
        let largest = input
            .iter()
            .filter(|x| x.is_finite())
            .fold(0.0f64, |m, x| m.max(x.abs()));
        let want = &c.signals_out.data;
        Ok(verdict([within(
            "signals",
            &signals,
            want,
            POLYNOMIAL_RTOL,
            |i| want[i].to_bits() == input[i].to_bits(),
            |_| largest,
        )]))
    }
}

impl FilterPoly2dCase {
    /// `filter_poly2D`: the coefficients, against TOAST's LAPACK solve
    /// within [`POLY2D_RTOL`] per (sample, group) block in every mode, with
    /// TOAST's exact zeros exact.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let n_samp = dim(&c.signals.shape, 0);
        let n_det = dim(&c.signals.shape, 1);
        let n_group = dim(&c.coeff_in.shape, 1);
        let n_mode = dim(&c.coeff_in.shape, 2);
        let mut coeff = c.coeff_in.data.clone();
        {
            let s = stage_in(b, &c.signals.data, "signals")?;
            let m = stage_in(b, &c.masks.data, "masks")?;
            let o = stage_out(b, &mut coeff, "coeff")?;
            let args = abi::FilterPoly2dArgs {
                n_samp: n_samp as u64,
                n_det: n_det as u64,
                n_group: n_group as u64,
                n_mode: n_mode as u64,
                det_groups: c.det_groups.data.as_ptr(),
                templates: c.templates.data.as_ptr(),
                signals: s.abi(),
                masks: m.abi(),
                coeff: o.abi(),
            };
            // SAFETY: live arrays of this case or staged buffers; `load`
            // checked det_groups and templates against the signals' n_det.
            unsafe { launch(b, &args)? };
            finish(vec![o, s, m])?;
        }
        let want = &c.coeff_out.data;
        let w = n_mode.max(1);
        let block = |i: usize| &want[i - i % w..][..w];
        Ok(verdict([within(
            "coeff",
            &coeff,
            want,
            POLY2D_RTOL,
            |i| block(i).iter().all(|&x| x == 0.0),
            |i| block(i).iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1.0),
        )]))
    }
}

// ---------------------------------------------------------------------------
// The map-maker's fused kernels (ABI minor 4; FORMAT.md section 17).

/// `got` against TOAST's `want`: within [`FUSED_COMPACT_RTOL`] of the
/// largest |want| in every mode when the weights were rebuilt (`compact`),
/// else exact (tolerant mode: within `rtol`, for a device's atomics).
fn fused_compare(
    cmp: Comparison,
    field: &str,
    got: &[f64],
    want: &[f64],
    compact: bool,
    rtol: f64,
) -> Option<CaseOutcome> {
    if compact {
        let scale = want
            .iter()
            .filter(|w| w.is_finite())
            .fold(0.0f64, |m, w| m.max(w.abs()));
        within(field, got, want, FUSED_COMPACT_RTOL, |_| false, |_| scale)
    } else {
        cmp.float(field, got, want, rtol)
    }
}

/// The pointing arrays of a fused case in one form, staged.
struct FusedStaged<'a> {
    compact: ArrayArg<'a>,
    boresight: ArrayArg<'a>,
    pointing_flags: ArrayArg<'a>,
    hwp: ArrayArg<'a>,
    pixels: ArrayArg<'a>,
    weights: ArrayArg<'a>,
}

impl FusedCase {
    fn n_samp(&self) -> usize {
        dim(&self.boresight.shape, 0)
    }

    /// Stage the pointing of the compact form (`compact`) or the kept one.
    fn stage<'a>(&'a self, b: &'a Backend, compact: bool) -> Result<FusedStaged<'a>, CaseOutcome> {
        let n = self.n_samp();
        let pick = |yes: bool| yes == compact;
        Ok(FusedStaged {
            compact: stage_in(
                b,
                if pick(true) {
                    &self.compact.data[..]
                } else {
                    &[]
                },
                "compact",
            )?,
            boresight: stage_in(
                b,
                if pick(true) {
                    &self.boresight.data[..]
                } else {
                    &[]
                },
                "boresight",
            )?,
            pointing_flags: stage_in(
                b,
                if pick(true) {
                    if_len(&self.pointing_flags.data, n)
                } else {
                    &[]
                },
                "pointing_flags",
            )?,
            hwp: stage_in(
                b,
                if pick(true) {
                    if_len(&self.hwp.data, n)
                } else {
                    &[]
                },
                "hwp",
            )?,
            pixels: stage_in(
                b,
                if pick(false) {
                    &self.pixels.data[..]
                } else {
                    &[]
                },
                "pixels",
            )?,
            weights: stage_in(
                b,
                if pick(false) {
                    &self.weights.data[..]
                } else {
                    &[]
                },
                "weights",
            )?,
        })
    }
}

impl CompactExpandPointingCase {
    /// `compact_expand_pointing`: the pixels exact, the weights within
    /// [`FUSED_COMPACT_RTOL`] of TOAST's `stokes_weights_IQU`.
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = &self.0;
        let n_samp = c.n_samp();
        let n_det = c.pixel_index.data.len();
        // The outputs start as TOAST's did (pixels -1, weights 0), so the
        // samples outside the intervals compare too.
        let mut pixels = vec![-1i64; c.pixels.data.len()];
        let mut weights = vec![0.0f64; c.weights.data.len()];
        {
            let s = c.stage(b, true)?;
            let p = stage_out(b, &mut pixels, "pixels")?;
            let w = stage_out(b, &mut weights, "weights")?;
            let args = abi::CompactExpandPointingArgs {
                n_det: n_det as u64,
                n_samp: n_samp as u64,
                nnz: 3,
                compact_index: c.pixel_index.data.as_ptr(),
                pixel_index: c.pixel_index.data.as_ptr(),
                weight_index: c.weight_index.data.as_ptr(),
                focalplane: c.focalplane.data.as_ptr(),
                epsilon: c.epsilon.data.as_ptr(),
                gamma: c.gamma.data.as_ptr(),
                cal: c.cal.data.as_ptr(),
                intervals: ivs(&c.intervals),
                compact: s.compact.abi(),
                boresight: s.boresight.abi(),
                pointing_flags: s.pointing_flags.abi(),
                hwp: s.hwp.abi(),
                pixels: p.abi(),
                weights: w.abi(),
                out_first: 0,
                out_n_samp: n_samp as u64,
                pointing_flag_mask: c.pointing_flag_mask,
                iau: c.iau,
                reserved: [0; 6],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![
                p,
                w,
                s.compact,
                s.boresight,
                s.pointing_flags,
                s.hwp,
                s.pixels,
                s.weights,
            ])?;
        }
        Ok(verdict([
            compare("pixels", &pixels, &c.pixels.data),
            fused_compare(
                Comparison::Exact,
                "weights",
                &weights,
                &c.weights.data,
                true,
                0.0,
            ),
        ]))
    }
}

impl FusedAccumulateCase {
    /// `fused_accumulate`: the noise-weighted map of TOAST's unfused
    /// sequence (see [`fused_compare`]).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = &self.0;
        let Some(p) = &c.pass else {
            return Err(CaseOutcome::Error {
                message: "a fused_accumulate case without its pass fields".into(),
            });
        };
        let n_samp = c.n_samp();
        let n_det = c.pixel_index.data.len();
        let mut zmap = p.out_in.data.clone();
        {
            let s = c.stage(b, p.compact_form)?;
            let g = stage_in(b, &p.global2local.data, "global2local")?;
            let d = stage_in(b, &p.det_data.data, "det_data")?;
            let df = stage_in(b, &p.det_flags.data, "det_flags")?;
            let sf = stage_in(b, if_len(&c.pointing_flags.data, n_samp), "shared_flags")?;
            let am = stage_in(b, &p.amplitudes.data, "amplitudes")?;
            let af = stage_in(b, &p.amplitude_flags.data, "amplitude_flags")?;
            let z = stage_out(b, &mut zmap, "zmap")?;
            let args = abi::FusedAccumulateArgs {
                n_det: n_det as u64,
                n_samp: n_samp as u64,
                pixel_index: c.pixel_index.data.as_ptr(),
                weight_index: c.weight_index.data.as_ptr(),
                focalplane: c.focalplane.data.as_ptr(),
                epsilon: c.epsilon.data.as_ptr(),
                gamma: c.gamma.data.as_ptr(),
                cal: c.cal.data.as_ptr(),
                data_index: p.data_index.data.as_ptr(),
                flag_index: p.flag_index.data.as_ptr(),
                det_scale: p.det_scale.data.as_ptr(),
                finite: p.finite.data.as_ptr(),
                layout: abi::OffsetLayout {
                    step_length: p.step_length,
                    n_amp_views: p.n_amp_views.data.as_ptr(),
                    amp_offset: p.amp_offset.data.as_ptr(),
                },
                intervals: ivs(&c.intervals),
                global2local: g.abi(),
                n_pix_submap: p.n_pix_submap,
                compact: s.compact.abi(),
                boresight: s.boresight.abi(),
                pointing_flags: s.pointing_flags.abi(),
                hwp: s.hwp.abi(),
                pixels: s.pixels.abi(),
                weights: s.weights.abi(),
                det_data: d.abi(),
                det_flags: df.abi(),
                shared_flags: sf.abi(),
                amplitudes: am.abi(),
                amplitude_flags: af.abi(),
                zmap: z.abi(),
                det_flag_mask: p.det_flag_mask,
                shared_flag_mask: p.shared_flag_mask,
                pointing_flag_mask: c.pointing_flag_mask,
                iau: c.iau,
                reserved: [0; 4],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![
                z,
                g,
                d,
                df,
                sf,
                am,
                af,
                s.compact,
                s.boresight,
                s.pointing_flags,
                s.hwp,
                s.pixels,
                s.weights,
            ])?;
        }
        Ok(verdict([fused_compare(
            cmp,
            "zmap",
            &zmap,
            &p.out_want.data,
            p.compact_form,
            ACCUM_RTOL,
        )]))
    }
}

impl FusedProjectCase {
    /// `fused_project`: the amplitudes of TOAST's unfused sequence (see
    /// [`fused_compare`]); the kept form in tolerant mode within
    /// [`AMP_RTOL`] × `step_length` (at most `n_samp`), as `template_offset_project_signal`'s
    /// (a device sums an amplitude's samples by a tree).
    pub(super) fn run(&self, b: &Backend, cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = &self.0;
        let Some(p) = &c.pass else {
            return Err(CaseOutcome::Error {
                message: "a fused_project case without its pass fields".into(),
            });
        };
        let n_samp = c.n_samp();
        let n_det = c.pixel_index.data.len();
        let mut out = p.out_in.data.clone();
        {
            let s = c.stage(b, p.compact_form)?;
            let g = stage_in(b, &p.global2local.data, "global2local")?;
            let d = stage_in(b, &p.det_data.data, "det_data")?;
            let df = stage_in(b, &p.det_flags.data, "det_flags")?;
            let m = stage_in(b, &p.mapdata.data, "mapdata")?;
            let am = stage_in(
                b,
                if p.det_data.data.is_empty() {
                    &p.amplitudes.data[..]
                } else {
                    &[]
                },
                "amplitudes",
            )?;
            let af = stage_in(b, &p.amplitude_flags.data, "amplitude_flags")?;
            let o = stage_out(b, &mut out, "amplitudes_out")?;
            let args = abi::FusedProjectArgs {
                n_det: n_det as u64,
                n_samp: n_samp as u64,
                pixel_index: c.pixel_index.data.as_ptr(),
                weight_index: c.weight_index.data.as_ptr(),
                focalplane: c.focalplane.data.as_ptr(),
                epsilon: c.epsilon.data.as_ptr(),
                gamma: c.gamma.data.as_ptr(),
                cal: c.cal.data.as_ptr(),
                data_index: p.data_index.data.as_ptr(),
                flag_index: p.flag_index.data.as_ptr(),
                det_scale: p.det_scale.data.as_ptr(),
                layout: abi::OffsetLayout {
                    step_length: p.step_length,
                    n_amp_views: p.n_amp_views.data.as_ptr(),
                    amp_offset: p.amp_offset.data.as_ptr(),
                },
                intervals: ivs(&c.intervals),
                global2local: g.abi(),
                n_pix_submap: p.n_pix_submap,
                compact: s.compact.abi(),
                boresight: s.boresight.abi(),
                pointing_flags: s.pointing_flags.abi(),
                hwp: s.hwp.abi(),
                pixels: s.pixels.abi(),
                weights: s.weights.abi(),
                det_data: d.abi(),
                det_flags: df.abi(),
                mapdata: m.abi(),
                amplitudes: am.abi(),
                amplitude_flags: af.abi(),
                amplitudes_out: o.abi(),
                det_flag_mask: p.det_flag_mask,
                pointing_flag_mask: c.pointing_flag_mask,
                iau: c.iau,
                reserved: [0; 5],
            };
            // SAFETY: as in `PointingDetectorCase::run`: live arrays of this
            // case or staged buffers, per-detector lengths checked by `load`.
            unsafe { launch(b, &args)? };
            finish(vec![
                o,
                g,
                d,
                df,
                m,
                am,
                af,
                s.compact,
                s.boresight,
                s.pointing_flags,
                s.hwp,
                s.pixels,
                s.weights,
            ])?;
        }
        Ok(verdict([fused_compare(
            cmp,
            "amplitudes_out",
            &out,
            &p.out_want.data,
            p.compact_form,
            amp_rtol(p.step_length, n_samp),
        )]))
    }
}

impl SimNoiseCase {
    /// `sim_noise`: within [`NOISE_RTOL`] of the RMS of each detector's
    /// noise on every backend (the FFTs round differently).
    pub(super) fn run(&self, b: &Backend, _cmp: Comparison) -> Result<CaseOutcome, CaseOutcome> {
        let c = self;
        let n_det = c.data_index.data.len();
        let keys: Vec<u64> = c.keys.data.iter().map(|&k| k as u64).collect();
        let n_filter = c.amplitudes.shape.first().copied().unwrap_or(0) as u64;
        let mut det_data = c.det_data_in.data.clone();
        {
            let d = stage_out(b, &mut det_data, "det_data")?;
            let args = abi::SimNoiseArgs {
                n_det: n_det as u64,
                n_samp: c.n_samp as u64,
                fft_len: c.fft_len as u64,
                n_filter,
                counter0: c.counter0 as u64,
                data_index: c.data_index.data.as_ptr(),
                filter_index: c.filter_index.data.as_ptr(),
                keys: keys.as_ptr(),
                amplitudes: c.amplitudes.data.as_ptr(),
                det_data: d.abi(),
            };
            // SAFETY: as in `CovAccumDiagHitsCase::run`.
            unsafe { launch(b, &args)? };
            finish(vec![d])?;
        }
        // The RMS of each row's expected noise (out - in).
        let n = (c.n_samp.max(1)) as usize;
        let rms: Vec<f64> = c
            .det_data_out
            .data
            .chunks(n)
            .zip(c.det_data_in.data.chunks(n))
            .map(|(o, i)| {
                let s: f64 = o.iter().zip(i).map(|(o, i)| (o - i) * (o - i)).sum();
                (s / n as f64).sqrt().max(f64::MIN_POSITIVE)
            })
            .collect();
        Ok(verdict([within(
            "det_data",
            &det_data,
            &c.det_data_out.data,
            NOISE_RTOL,
            |_| false,
            |i| rms[i / n],
        )]))
    }
}
