//! The solver flags (steps 5a and 5c) as one accelerated step, the
//! `solver_flags` kernel: on a device they are made where the solver reads
//! them, from the flags and pixels already there, and only the two counts
//! of 5c come back.
//!
//! * 5a ([`SolverFlagBits::Selection`]): bit 1 on every sample that the
//!   binner's detector or shared flags cut or that lies outside the
//!   pointing's view, into a zeroed field.
//! * 5c ([`SolverFlagBits::RcondMask`]): bit 4 on every sample of the view
//!   whose pixel is set in a mask map (the pixels whose solver rcond is
//!   below `solve_rcond_threshold`, TOAST's `ScanMask`), made on the host
//!   from the rcond map (a byte a local pixel); the counts of the samples
//!   the solver flags then cut, and of all, are the kernel's.

use crate::exec::global_data::HostArray;
use crate::exec::kernels::{self, view_intervals, KernelCall, SolverFlagPass};
use crate::ops::select_detectors;
use toast_core::{Category, DType, Data, ExecContext, OpError, Operator, Requirements};

/// What a [`SolverFlagsStep`] ORs into the solver flags.
#[derive(Debug, Clone)]
pub(super) enum SolverFlagBits {
    /// 5a: bit 1 where the detector flags (`(field, mask)`) or the shared
    /// flags cut a sample, or outside the view.
    Selection {
        det_flags: Option<(String, u8)>,
        shared_flags: Option<(String, u8)>,
    },
    /// 5c: bit 4 where the pixel (field `pixels`, on the distribution
    /// `pixel_dist`) is set in the mask map `mask` (`PixelData<u8>`).
    RcondMask {
        pixels: String,
        pixel_dist: String,
        mask: String,
    },
}

/// Bit of the solver flags for a sample cut by the binner's flags or
/// outside the view.
pub(super) const CUT_BIT: u8 = 1;
/// Bit of the solver flags for a sample in a poorly conditioned pixel.
pub(super) const RCOND_BIT: u8 = 4;

/// One pass of the `solver_flags` kernel over the detectors `det_mask`
/// keeps, in every observation, on the view `view`.
#[derive(Debug, Clone)]
pub(super) struct SolverFlagsStep {
    pub(super) name: String,
    pub(super) bits: SolverFlagBits,
    pub(super) det_mask: u8,
    pub(super) view: Option<String>,
    /// The solver flags field (u8), made zeroed by 5a (absent before it:
    /// the map-maker removes a stale one).
    pub(super) flags: String,
    /// Global `HostArray<i64>` of 2: the view's samples the flags cut, and
    /// all of them, added to.
    pub(super) counts: String,
}

impl Operator for SolverFlagsStep {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new().global(&self.counts);
        if let Some(v) = &self.view {
            r.add(Category::Intervals, v);
        }
        match &self.bits {
            SolverFlagBits::Selection {
                det_flags,
                shared_flags,
            } => {
                if let Some((f, _)) = det_flags {
                    r.add(Category::DetData, f);
                }
                if let Some((f, _)) = shared_flags {
                    r.add(Category::Shared, f);
                }
            }
            SolverFlagBits::RcondMask {
                pixels,
                pixel_dist,
                mask,
            } => {
                r.add(Category::DetData, &self.flags);
                r.add(Category::DetData, pixels);
                r.add(Category::Global, pixel_dist);
                r.add(Category::Global, mask);
            }
        }
        r
    }

    fn provides(&self) -> Requirements {
        Requirements::new()
            .detdata(&self.flags)
            .global(&self.counts)
    }

    fn supports_accel(&self) -> bool {
        true
    }

    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        if matches!(self.bits, SolverFlagBits::Selection { .. }) {
            for ob in &mut data.obs {
                ob.detdata.create(&self.flags, DType::U8, &[], None)?;
            }
        }
        if !data.meta.contains(&self.counts) {
            data.meta
                .set_object(&self.counts, HostArray::<i64>::zeros(2));
        }
        Ok(())
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.prepare_outputs(data, ctx)?;
        let pass = match &self.bits {
            SolverFlagBits::Selection {
                det_flags,
                shared_flags,
            } => SolverFlagPass::Selection {
                det_flags: det_flags.as_ref().map(|(f, m)| (f.as_str(), *m)),
                shared_flags: shared_flags.as_ref().map(|(f, m)| (f.as_str(), *m)),
                cut_bit: CUT_BIT,
            },
            SolverFlagBits::RcondMask {
                pixels,
                pixel_dist,
                mask,
            } => SolverFlagPass::PixelMask {
                pixels,
                pixel_dist,
                mask,
                cut_bit: CUT_BIT,
                mask_bit: RCOND_BIT,
            },
        };
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = select_detectors(ctx, ob, self.det_mask);
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, self.view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            kernels::solver_flags(ctx, call, ob, meta, pass, &self.flags, &self.counts)?;
        }
        Ok(())
    }
}
