//! The safe call of `solver_flags` (ABI minor 6): the destriping solver's
//! sample flags (TOAST's solver flags of `SolveAmplitudes` and its
//! `ScanMask` of poorly conditioned pixels), OR-ed into a u8 field, with
//! the cut and total samples of the view counted into a global
//! `HostArray<i64>` of two. On a staging backend the field and the counts
//! stay on the device; the host reads the two counts once.

use super::{
    dist_for_map, launch, ptr_or_null, rows, shared_flags, KernelCall, Source, Spec, Target,
};
use crate::exec::global_data::HostArray;
use crate::pixels::PixelData;
use std::sync::Arc;
use toast_accel::abi;
use toast_core::{ExecContext, Meta, Observation, OpError};

/// What one `solver_flags` call ORs into the flags.
#[derive(Debug, Clone, Copy)]
pub enum SolverFlagPass<'a> {
    /// `cut_bit` on every sample outside the view or cut by the detector
    /// flags (`(field, mask)`) or the shared flags.
    Selection {
        det_flags: Option<(&'a str, u8)>,
        shared_flags: Option<(&'a str, u8)>,
        cut_bit: u8,
    },
    /// `mask_bit` on every sample of the view whose pixel (field
    /// `pixels`) is set in the pixel mask `mask` (a `PixelData<u8>` on the
    /// distribution `pixel_dist`); `cut_bit` outside the view.
    PixelMask {
        pixels: &'a str,
        pixel_dist: &'a str,
        mask: &'a str,
        cut_bit: u8,
        mask_bit: u8,
    },
}

/// `solver_flags`: for the detectors of `call`, OR the bits of `pass` into
/// their rows of `flags` (u8), and add the view's samples whose flags are
/// then non-zero and all the view's samples to `counts[0]` and
/// `counts[1]` (global `HostArray<i64>` of 2).
pub fn solver_flags(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    pass: SolverFlagPass<'_>,
    flags: &str,
    counts: &str,
) -> Result<(), OpError> {
    let n = meta
        .object::<HostArray<i64>>(counts)
        .map_err(|_| OpError::Global {
            key: counts.to_string(),
            problem: "the solver flag counts must be a HostArray<i64> of 2".into(),
        })?
        .values
        .len();
    if n != 2 {
        return Err(OpError::Global {
            key: counts.to_string(),
            problem: format!("the solver flag counts hold {n} values, not 2"),
        });
    }
    let out_index = rows::<u8>(ctx, ob, flags, &[], call.detectors)?;
    let none = || (Source::Absent, 0u8, Vec::new());
    let (dflags, dmask, flag_index) = match pass {
        SolverFlagPass::Selection {
            det_flags: Some((name, mask)),
            ..
        } if mask != 0 => (
            Source::DetData(name),
            mask,
            rows::<u8>(ctx, ob, name, &[], call.detectors)?,
        ),
        _ => none(),
    };
    let (sflags, smask) = match pass {
        SolverFlagPass::Selection {
            shared_flags: s, ..
        } => shared_flags(ob, s)?,
        SolverFlagPass::PixelMask { .. } => (Source::Absent, 0),
    };
    let (dist_src, pix_src, mask_src, pixel_index, n_pix_submap) = match pass {
        SolverFlagPass::PixelMask {
            pixels,
            pixel_dist,
            mask,
            ..
        } => {
            let map_dist = match meta.object::<PixelData<u8>>(mask) {
                Ok(m) if m.n_value() == 1 => Arc::clone(m.distribution()),
                _ => {
                    return Err(OpError::Global {
                        key: mask.to_string(),
                        problem: "the pixel mask must be a map of one u8 value per pixel".into(),
                    })
                }
            };
            let dist = dist_for_map(meta, pixel_dist, mask, &map_dist)?;
            (
                Source::Global(pixel_dist),
                Source::DetData(pixels),
                Source::Global(mask),
                rows::<i64>(ctx, ob, pixels, &[], call.detectors)?,
                dist.n_pix_submap(),
            )
        }
        SolverFlagPass::Selection { .. } => (
            Source::Absent,
            Source::Absent,
            Source::Absent,
            Vec::new(),
            0,
        ),
    };
    let (cut_bit, mask_bit) = match pass {
        SolverFlagPass::Selection { cut_bit, .. } => (cut_bit, 0),
        SolverFlagPass::PixelMask {
            cut_bit, mask_bit, ..
        } => (cut_bit, mask_bit),
    };
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(dist_src, 8),
        Spec::input(dflags, 1),
        Spec::input(sflags, 1),
        Spec::input(pix_src, 8),
        Spec::input(mask_src, 1),
        Spec::output(Source::DetData(flags), 1),
        Spec::output(Source::Global(counts), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::SolverFlagsArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            flag_index: ptr_or_null(&flag_index),
            pixel_index: ptr_or_null(&pixel_index),
            out_index: out_index.as_ptr(),
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap,
            det_flags: a[1],
            shared_flags: a[2],
            pixels: a[3],
            pixel_mask: a[4],
            flags: a[5],
            counts: a[6],
            det_flag_mask: dmask,
            shared_flag_mask: smask,
            cut_bit,
            mask_bit,
            reserved: [0; 4],
        },
    )
}
