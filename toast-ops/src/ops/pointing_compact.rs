//! Compact pointing for the map-maker's host passes
//! (`binner.compact_pointing`).
//!
//! The expanded pointing of a sample is 32 bytes (an i64 HEALPix pixel and
//! three f64 IQU weights). In compact form the map-maker keeps only a
//! 4-byte pixel (i32, exactly TOAST's pixel: it is computed once by the
//! `pixels_healpix` kernel and narrowed, [`CompactPixels`]) and, in every
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

/// Narrow the pixels of the selected detectors into the i32 field
/// `compact` (made for every local detector when missing). A pixel beyond
/// `i32` is an error naming it (the map-maker uses compact pointing only
/// where `12 nside²` fits).
#[derive(Debug, Clone)]
pub struct CompactPixels {
    /// Instance name.
    pub name: String,
    /// The i64 pixel field.
    pub pixels: String,
    /// The i32 output field.
    pub compact: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
}

impl Operator for CompactPixels {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new().detdata(&self.pixels)
    }
    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.compact)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            let dets = select_detectors(ctx, ob, self.det_mask);
            if dets.is_empty() {
                continue;
            }
            if !ob.detdata.contains(&self.compact) {
                ob.detdata.create(&self.compact, DType::I32, &[], None)?;
            }
            let name = ob.name().to_string();
            let [pix, out] = ob
                .detdata
                .get_disjoint_mut([self.pixels.as_str(), self.compact.as_str()])?;
            for d in &dets {
                let p = pix.row_of::<i64>(d)?;
                let o = out.row_of_mut::<i32>(d)?;
                for (s, (o, &p)) in o.iter_mut().zip(p).enumerate() {
                    *o = i32::try_from(p).map_err(|_| -> OpError {
                        toast_core::PixelOutOfRange {
                            what: "compact pixels".into(),
                            observation: name.clone(),
                            detector: d.clone(),
                            sample: s,
                            pixel: p,
                            limit: "does not fit the compact pointing's 32-bit pixels".into(),
                        }
                        .into()
                    })?;
                }
            }
        }
        Ok(())
    }
}

/// Rebuild the selected detectors' pixels (i64) and Stokes weights from
/// the compact pixels and the boresight (see the module documentation),
/// into fields that hold only those detectors (host runs over detector
/// batches, as [`pointing_field`]'s `transient`).
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
}

impl Operator for ExpandCompactPointing {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .detdata(&self.compact)
            .shared(&self.det_pointing.boresight);
        if let Some(f) = &self.det_pointing.shared_flags {
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
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let nnz = self.weights.mode.nnz();
        let view = self.view().map(str::to_string);
        let dp = &self.det_pointing;
        let shared_flags = match (&dp.shared_flags, dp.shared_flag_mask) {
            (Some(f), m) if m != 0 => Some((f.as_str(), m)),
            _ => None,
        };
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = select_detectors(ctx, ob, dp.det_mask);
            pointing_field(ob, &self.pixels.pixels, DType::I64, &[], &dets, true)?;
            pointing_field(ob, &self.weights.weights, DType::F64, &[nnz], &dets, true)?;
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
