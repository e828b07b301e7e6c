//! Compact pointing for the map-maker's passes, on the host and on a
//! device (`binner.compact_pointing`).
//!
//! The expanded pointing of a sample is 32 bytes (an i64 HEALPix pixel and
//! three f64 IQU weights). In compact form the map-maker keeps only a
//! 4-byte pixel (i32, exactly TOAST's pixel: it is computed once by the
//! `pixels_healpix` kernel, which writes it as an i32,
//! [`super::PixelsHealpix::compact`]) and, in every
//! pass that reads pointing, [`ExpandCompactPointing`] rebuilds one
//! detector batch's pixels and weights with the backends'
//! `compact_expand_pointing` kernel: the pixels by widening, the weights
//! from the boresight and the detector's focal-plane quaternion without the
//! two `atan2` and the `cos`/`sin` of the `stokes_weights_IQU` kernel (the
//! CPU plugin's `kernels/compact.rs` gives the math: within a few ulp of
//! that kernel's weights). That costs a few nanoseconds a sample instead of
//! the three pointing kernels' ~70, so the pointing can be rebuilt twice
//! per CG iteration. The fused passes ([`crate::mapmaker`]) rebuild the
//! weights inside their own kernels instead.

use super::pixels_healpix::PixelsHealpixConfig;
use super::stokes_weights::StokesWeightsConfig;
use super::util::{pointing_field, select_detectors};
use super::PointingDetectorConfig;
use crate::exec::kernels::{self, view_intervals, CompactPointing, KernelCall};
use toast_core::{Category, DType, Data, ExecContext, OpError, Operator, Requirements};

/// Rebuild the selected detectors' pixels (i64) and Stokes weights from
/// the compact pixels and the boresight (see the module documentation),
/// into fields that hold only those detectors (passes over detector
/// batches, as [`pointing_field`]'s `transient`; on a device, a device
/// step whose fields are the batch's there too).
#[derive(Debug, Clone)]
pub struct ExpandCompactPointing {
    /// Instance name.
    pub name: String,
    /// The i32 compact pixel field.
    pub compact: String,
    /// The detector pointing (boresight, shared flags, detector mask).
    pub det_pointing: PointingDetectorConfig,
    /// The pixelization (its output field).
    pub pixels: PixelsHealpixConfig,
    /// The weights (mode, HWP, convention, view, output field).
    pub weights: StokesWeightsConfig,
}

impl ExpandCompactPointing {
    fn view(&self) -> Option<&str> {
        self.weights
            .view
            .as_deref()
            .or(self.det_pointing.view.as_deref())
    }

    /// The pass's detectors of `ob`, with the batch's pixel and weight
    /// fields made for them.
    fn output_fields(
        &self,
        ob: &mut toast_core::Observation,
        ctx: &ExecContext,
    ) -> Result<Vec<String>, OpError> {
        let nnz = self.weights.mode.nnz();
        let dets = select_detectors(ctx, ob, self.det_pointing.det_mask);
        pointing_field(ob, &self.pixels.pixels, DType::I64, &[], &dets, true)?;
        pointing_field(ob, &self.weights.weights, DType::F64, &[nnz], &dets, true)?;
        Ok(dets)
    }
}

impl Operator for ExpandCompactPointing {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .detdata(&self.compact)
            .shared(&self.det_pointing.boresight);
        if let Some((f, _)) = self.det_pointing.shared_flags_in_use() {
            r.add(Category::Shared, f);
        }
        if let Some(v) = self.view() {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new()
            .detdata(&self.pixels.pixels)
            .detdata(&self.weights.weights)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn prepare_outputs(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            self.output_fields(ob, ctx)?;
        }
        Ok(())
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let nnz = self.weights.mode.nnz();
        let view = self.view().map(str::to_string);
        let dp = &self.det_pointing;
        let shared_flags = dp.shared_flags_in_use();
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = self.output_fields(ob, ctx)?;
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, view.as_deref())?;
            let compact = CompactPointing {
                compact: &self.compact,
                boresight: &dp.boresight,
                shared_flags,
                hwp: self
                    .weights
                    .hwp_angle
                    .as_deref()
                    .filter(|h| ob.shared.contains(h)),
                iau: self.weights.iau,
            };
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            kernels::compact_expand_pointing(
                ctx,
                call,
                ob,
                meta,
                compact,
                &self.pixels.pixels,
                &self.weights.weights,
                nnz,
            )?;
        }
        Ok(())
    }
}
