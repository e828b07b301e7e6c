//! The safe calls of the map-maker's fused kernels (ABI minor 4):
//! `compact_expand_pointing`, `fused_accumulate`, `fused_project`. Like the
//! other calls of this module they name each array's source and build the
//! argument struct; the per-detector weight parameters of compact pointing
//! (focal-plane quaternion, polarization leakage, angle, calibration 1) are
//! read from the observation's focal plane here.

use super::{
    check_len, check_shared, dist_for_map, launch, map_info, rows, shared_flags, KernelCall,
    OffsetLayout, Source, Spec, Target,
};
use toast_accel::abi;
use toast_core::{Meta, Observation, OpError};

/// Compact pointing: the i32 pixels, the weights rebuilt from the
/// boresight.
#[derive(Debug, Clone, Copy)]
pub struct CompactPointing<'a> {
    /// The i32 compact pixel field.
    pub compact: &'a str,
    /// The boresight quaternions (shared).
    pub boresight: &'a str,
    /// Shared flags that cut the boresight to the identity, with the mask.
    pub shared_flags: Option<(&'a str, u8)>,
    /// The HWP angle (shared), if the observation has one.
    pub hwp: Option<&'a str>,
    /// IAU convention (U sign flipped).
    pub iau: bool,
}

/// The pointing a fused pass reads.
#[derive(Debug, Clone, Copy)]
pub enum FusedPointing<'a> {
    /// Rebuilt from the compact pixels.
    Compact(CompactPointing<'a>),
    /// Kept fields: i64 pixels and IQU weights.
    Kept { pixels: &'a str, weights: &'a str },
}

/// The value of a sample in a fused pass.
#[derive(Debug, Clone, Copy)]
pub enum FusedInput<'a> {
    /// A timestream field.
    Timestream(&'a str),
    /// `F a`: the offset amplitudes at this global key (`HostArray<f64>`).
    Amplitudes(&'a str),
}

/// The offset template of a pass: its layout (`amp_offset -1`: a detector
/// without amplitudes) and the global key of the amplitude flags.
#[derive(Debug, Clone, Copy)]
pub struct FusedOffsets<'a> {
    pub layout: OffsetLayout<'a>,
    pub flags: &'a str,
}

/// A flag field and the mask of the bits that cut a sample, if any.
pub type FlagField<'a> = Option<(&'a str, u8)>;

/// The compact form's per-detector arrays: focal-plane quaternions (4 per
/// detector), ε, γ, cal.
struct WeightParams {
    focalplane: Vec<f64>,
    epsilon: Vec<f64>,
    gamma: Vec<f64>,
    cal: Vec<f64>,
}

impl WeightParams {
    fn of(ob: &Observation, dets: &[String]) -> Result<Self, OpError> {
        let mut p = WeightParams {
            focalplane: Vec::with_capacity(4 * dets.len()),
            epsilon: Vec::with_capacity(dets.len()),
            gamma: Vec::with_capacity(dets.len()),
            cal: vec![1.0; dets.len()],
        };
        for d in dets {
            let det = ob.detector(d)?;
            p.focalplane.extend_from_slice(&det.quat);
            p.epsilon.push(det.pol_leakage);
            p.gamma.push(det.gamma);
        }
        Ok(p)
    }
}

/// The pointing part of a fused call: the index arrays, the per-detector
/// parameters and the six array sources (compact, boresight, pointing
/// flags, hwp, pixels, weights) with the pointing flag mask and IAU flag.
struct PointingArgs {
    pixel_index: Vec<i32>,
    weight_index: Vec<i32>,
    params: Option<WeightParams>,
    flag_mask: u8,
    iau: u8,
}

fn pointing_args<'a>(
    ctx: &toast_core::ExecContext,
    ob: &Observation,
    pointing: &FusedPointing<'a>,
    dets: &[String],
) -> Result<(PointingArgs, [Spec<'a>; 6]), OpError> {
    Ok(match *pointing {
        FusedPointing::Compact(c) => {
            check_shared::<f64>(ob, c.boresight, &[4])?;
            let (pflags, pmask) = shared_flags(ob, c.shared_flags)?;
            let hwp = match c.hwp {
                Some(h) => {
                    check_shared::<f64>(ob, h, &[])?;
                    Source::Shared(h)
                }
                None => Source::Absent,
            };
            (
                PointingArgs {
                    pixel_index: rows::<i32>(ctx, ob, c.compact, &[], dets)?,
                    weight_index: Vec::new(),
                    params: Some(WeightParams::of(ob, dets)?),
                    flag_mask: pmask,
                    iau: u8::from(c.iau),
                },
                [
                    Spec::input(Source::DetData(c.compact), 4),
                    Spec::input(Source::Shared(c.boresight), 8),
                    Spec::input(pflags, 1),
                    Spec::input(hwp, 8),
                    Spec::input(Source::Absent, 8),
                    Spec::input(Source::Absent, 8),
                ],
            )
        }
        FusedPointing::Kept { pixels, weights } => (
            PointingArgs {
                pixel_index: rows::<i64>(ctx, ob, pixels, &[], dets)?,
                weight_index: rows::<f64>(ctx, ob, weights, &[3], dets)?,
                params: None,
                flag_mask: 0,
                iau: 0,
            },
            [
                Spec::input(Source::Absent, 4),
                Spec::input(Source::Absent, 8),
                Spec::input(Source::Absent, 1),
                Spec::input(Source::Absent, 8),
                Spec::input(Source::DetData(pixels), 8),
                Spec::input(Source::DetData(weights), 8),
            ],
        ),
    })
}

impl PointingArgs {
    fn ptr<T>(v: &[T]) -> *const T {
        if v.is_empty() {
            std::ptr::null()
        } else {
            v.as_ptr()
        }
    }
    fn focalplane(&self) -> *const f64 {
        self.params
            .as_ref()
            .map_or(std::ptr::null(), |p| Self::ptr(&p.focalplane))
    }
    fn epsilon(&self) -> *const f64 {
        self.params
            .as_ref()
            .map_or(std::ptr::null(), |p| Self::ptr(&p.epsilon))
    }
    fn gamma(&self) -> *const f64 {
        self.params
            .as_ref()
            .map_or(std::ptr::null(), |p| Self::ptr(&p.gamma))
    }
    fn cal(&self) -> *const f64 {
        self.params
            .as_ref()
            .map_or(std::ptr::null(), |p| Self::ptr(&p.cal))
    }
}

/// `compact_expand_pointing`: the detectors' i64 pixels (`pixels`) and
/// Stokes weights (`weights`, `nnz` 1 or 3) from the compact pixels and the
/// boresight, over the call's intervals.
#[allow(clippy::too_many_arguments)]
pub fn compact_expand_pointing(
    ctx: &mut toast_core::ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    compact: CompactPointing<'_>,
    pixels: &str,
    weights: &str,
    nnz: usize,
) -> Result<(), OpError> {
    let pixel_index = rows::<i64>(ctx, ob, pixels, &[], call.detectors)?;
    let weight_index = rows::<f64>(ctx, ob, weights, &[nnz], call.detectors)?;
    let n_samp = ob.n_samples();
    let out = [
        Spec::output(Source::DetData(pixels), 8),
        Spec::output(Source::DetData(weights), 8),
    ];
    expand(
        ctx,
        call,
        (ob, meta),
        compact,
        (out, &pixel_index, &weight_index),
        (nnz, 0, n_samp),
    )
}

/// [`compact_expand_pointing`] of one detector into host buffers that hold
/// the samples `first..first + pixels.len()` (IQU weights, 3 a sample): a
/// window, so a pass over a whole observation needs no field of its length.
/// Only for a host-addressable backend (the buffers are the kernel's
/// arrays; a device backend's copies would not come back).
pub fn compact_expand_window(
    ctx: &mut toast_core::ExecContext,
    call: KernelCall<'_>,
    (ob, meta): (&mut Observation, &mut Meta),
    compact: CompactPointing<'_>,
    first: usize,
    (pixels, weights): (&mut [i64], &mut [f64]),
) -> Result<(), OpError> {
    check_len("detectors", call.detectors.len(), 1)?;
    check_len("weights", weights.len(), 3 * pixels.len())?;
    let n = pixels.len();
    let out = [
        Spec::output(
            Source::Scratch(bytemuck::cast_slice_mut(pixels), "compact_window_pixels"),
            8,
        ),
        Spec::output(
            Source::Scratch(bytemuck::cast_slice_mut(weights), "compact_window_weights"),
            8,
        ),
    ];
    expand(
        ctx,
        call,
        (ob, meta),
        compact,
        (out, &[0], &[0]),
        (3, first, n),
    )
}

/// The `compact_expand_pointing` call of the two above: the outputs' specs
/// and rows, `(nnz, out_first, out_n_samp)`.
fn expand(
    ctx: &mut toast_core::ExecContext,
    call: KernelCall<'_>,
    (ob, meta): (&mut Observation, &mut Meta),
    compact: CompactPointing<'_>,
    (out, pixel_index, weight_index): ([Spec<'_>; 2], &[i32], &[i32]),
    (nnz, out_first, out_n_samp): (usize, usize, usize),
) -> Result<(), OpError> {
    let (p, [c, b, f, h, _, _]) =
        pointing_args(ctx, ob, &FusedPointing::Compact(compact), call.detectors)?;
    let n_samp = ob.n_samples() as u64;
    let [po, wo] = out;
    let specs = vec![c, b, f, h, po, wo];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::CompactExpandPointingArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            nnz: nnz as u64,
            compact_index: p.pixel_index.as_ptr(),
            pixel_index: pixel_index.as_ptr(),
            weight_index: weight_index.as_ptr(),
            focalplane: p.focalplane(),
            epsilon: p.epsilon(),
            gamma: p.gamma(),
            cal: p.cal(),
            intervals: call.intervals(),
            compact: a[0],
            boresight: a[1],
            pointing_flags: a[2],
            hwp: a[3],
            pixels: a[4],
            weights: a[5],
            out_first: out_first as i64,
            out_n_samp: out_n_samp as u64,
            pointing_flag_mask: p.flag_mask,
            iau: p.iau,
            reserved: [0; 6],
        },
    )
}

/// The map and its pixel distribution of a fused pass (an IQU f64 map).
#[derive(Debug, Clone, Copy)]
pub struct FusedMap<'a> {
    /// Global key of the map.
    pub map: &'a str,
    /// Global key of its pixel distribution.
    pub pixel_dist: &'a str,
}

fn iqu_map(meta: &Meta, m: FusedMap<'_>) -> Result<i64, OpError> {
    let (dtype, nnz, map_dist) = map_info(meta, m.map)?;
    if dtype != abi::DTYPE_F64 || nnz != 3 {
        return Err(OpError::Global {
            key: m.map.to_string(),
            problem: "a fused pass needs an IQU map of f64 values".into(),
        });
    }
    Ok(dist_for_map(meta, m.pixel_dist, m.map, &map_dist)?.n_pix_submap())
}

/// The value source of a fused call: the data index and the timestream
/// and amplitude sources.
fn input_args<'a>(
    ctx: &toast_core::ExecContext,
    ob: &Observation,
    input: FusedInput<'a>,
    dets: &[String],
) -> Result<(Vec<i32>, Source<'a>, Source<'a>), OpError> {
    Ok(match input {
        FusedInput::Timestream(f) => (
            rows::<f64>(ctx, ob, f, &[], dets)?,
            Source::DetData(f),
            Source::Absent,
        ),
        FusedInput::Amplitudes(k) => (vec![-1; dets.len()], Source::Absent, Source::Global(k)),
    })
}

/// `fused_accumulate`: the detectors' timestream or `F a` binned into the
/// noise-weighted IQU map `zmap` (`+=`), cut by the detector and shared
/// flags; `finite[d]`: the detector's weights are all finite over the
/// intervals (a zero value may then be skipped).
#[allow(clippy::too_many_arguments)]
pub fn fused_accumulate(
    ctx: &mut toast_core::ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    (pointing, input, offsets): (&FusedPointing<'_>, FusedInput<'_>, Option<FusedOffsets<'_>>),
    (det_flags, shared): (FlagField<'_>, FlagField<'_>),
    (det_scale, finite): (&[f64], &[u8]),
    zmap: FusedMap<'_>,
) -> Result<(), OpError> {
    let n_det = call.detectors.len();
    check_len("det_scale", det_scale.len(), n_det)?;
    check_len("finite", finite.len(), n_det)?;
    let n_pix_submap = iqu_map(meta, zmap)?;
    let (p, [c, b, f, h, px, w]) = pointing_args(ctx, ob, pointing, call.detectors)?;
    let (data_index, signal, amps) = input_args(ctx, ob, input, call.detectors)?;
    let (dflags, dmask, flag_index) = det_flag_args(ctx, ob, det_flags, call.detectors)?;
    let (sflags, smask) = shared_flags(ob, shared)?;
    let (layout, amp_flags) = match (input, offsets) {
        (FusedInput::Amplitudes(_), Some(o)) => {
            check_len("amp_offset", o.layout.amp_offset.len(), n_det)?;
            (o.layout.abi(), Source::Global(o.flags))
        }
        (FusedInput::Amplitudes(k), None) => return Err(no_layout(k)),
        (FusedInput::Timestream(_), _) => (NO_LAYOUT, Source::Absent),
    };
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Global(zmap.pixel_dist), 8),
        c,
        b,
        f,
        h,
        px,
        w,
        Spec::input(signal, 8),
        Spec::input(dflags, 1),
        Spec::input(sflags, 1),
        Spec::input(amps, 8),
        Spec::input(amp_flags, 1),
        Spec::output(Source::Global(zmap.map), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::FusedAccumulateArgs {
            n_det: n_det as u64,
            n_samp,
            pixel_index: p.pixel_index.as_ptr(),
            weight_index: PointingArgs::ptr(&p.weight_index),
            focalplane: p.focalplane(),
            epsilon: p.epsilon(),
            gamma: p.gamma(),
            cal: p.cal(),
            data_index: data_index.as_ptr(),
            flag_index: flag_index.as_ptr(),
            det_scale: det_scale.as_ptr(),
            finite: finite.as_ptr(),
            layout,
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap,
            compact: a[1],
            boresight: a[2],
            pointing_flags: a[3],
            hwp: a[4],
            pixels: a[5],
            weights: a[6],
            det_data: a[7],
            det_flags: a[8],
            shared_flags: a[9],
            amplitudes: a[10],
            amplitude_flags: a[11],
            zmap: a[12],
            det_flag_mask: dmask,
            shared_flag_mask: smask,
            pointing_flag_mask: p.flag_mask,
            iau: p.iau,
            reserved: [0; 4],
        },
    )
}

/// No offset layout (a timestream input of `fused_accumulate`).
const NO_LAYOUT: abi::OffsetLayout = abi::OffsetLayout {
    step_length: 1,
    n_amp_views: std::ptr::null(),
    amp_offset: std::ptr::null(),
};

fn no_layout(key: &str) -> OpError {
    OpError::KernelArgument {
        argument: key.to_string(),
        problem: "F a without the offset template's layout".into(),
    }
}

/// The detector flags of a fused call: source, mask and rows (-1: none).
fn det_flag_args<'a>(
    ctx: &toast_core::ExecContext,
    ob: &Observation,
    det_flags: Option<(&'a str, u8)>,
    dets: &[String],
) -> Result<(Source<'a>, u8, Vec<i32>), OpError> {
    Ok(match det_flags {
        Some((name, mask)) if mask != 0 => (
            Source::DetData(name),
            mask,
            rows::<u8>(ctx, ob, name, &[], dets)?,
        ),
        _ => (Source::Absent, 0, vec![-1; dets.len()]),
    })
}

/// `fused_project`: `out[a] += Σ (t - P m) · det_scale` over each unflagged
/// amplitude's samples whose detector flags are clear (`det_flags`), `t`
/// the timestream or `F a`, `m` the IQU map `map`.
#[allow(clippy::too_many_arguments)]
pub fn fused_project(
    ctx: &mut toast_core::ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    (pointing, input, offsets): (&FusedPointing<'_>, FusedInput<'_>, FusedOffsets<'_>),
    det_flags: Option<(&str, u8)>,
    det_scale: &[f64],
    map: FusedMap<'_>,
    out: &str,
) -> Result<(), OpError> {
    let n_det = call.detectors.len();
    check_len("det_scale", det_scale.len(), n_det)?;
    check_len("amp_offset", offsets.layout.amp_offset.len(), n_det)?;
    let n_pix_submap = iqu_map(meta, map)?;
    let (p, [c, b, f, h, px, w]) = pointing_args(ctx, ob, pointing, call.detectors)?;
    let (data_index, signal, amps) = input_args(ctx, ob, input, call.detectors)?;
    let (dflags, dmask, flag_index) = det_flag_args(ctx, ob, det_flags, call.detectors)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Global(map.pixel_dist), 8),
        c,
        b,
        f,
        h,
        px,
        w,
        Spec::input(signal, 8),
        Spec::input(dflags, 1),
        Spec::input(Source::Global(map.map), 8),
        Spec::input(amps, 8),
        Spec::input(Source::Global(offsets.flags), 1),
        Spec::output(Source::Global(out), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::FusedProjectArgs {
            n_det: n_det as u64,
            n_samp,
            pixel_index: p.pixel_index.as_ptr(),
            weight_index: PointingArgs::ptr(&p.weight_index),
            focalplane: p.focalplane(),
            epsilon: p.epsilon(),
            gamma: p.gamma(),
            cal: p.cal(),
            data_index: data_index.as_ptr(),
            flag_index: flag_index.as_ptr(),
            det_scale: det_scale.as_ptr(),
            layout: offsets.layout.abi(),
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap,
            compact: a[1],
            boresight: a[2],
            pointing_flags: a[3],
            hwp: a[4],
            pixels: a[5],
            weights: a[6],
            det_data: a[7],
            det_flags: a[8],
            mapdata: a[9],
            amplitudes: a[10],
            amplitude_flags: a[11],
            amplitudes_out: a[12],
            det_flag_mask: dmask,
            pointing_flag_mask: p.flag_mask,
            iau: p.iau,
            reserved: [0; 5],
        },
    )
}
