//! Detector quaternions from the boresight (TOAST's `PointingDetectorSimple`).

use super::util::{pointing_field, select_detectors};
use crate::exec::kernels::{self, view_intervals, KernelCall};
use serde::{Deserialize, Serialize};
use toast_core::observation::defaults;
use toast_core::{DType, Data, ExecContext, Observation, OpError, Operator, Requirements};

/// Configuration of [`PointingDetector`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PointingDetectorConfig {
    /// Whether the operator runs (TOAST's `enabled`).
    pub enabled: bool,
    /// Interval list to process (`None`: every sample).
    pub view: Option<String>,
    /// Shared field of boresight quaternions.
    pub boresight: String,
    /// Shared flags (`None`: no flags).
    pub shared_flags: Option<String>,
    /// Shared flag bits that replace the boresight by the identity.
    pub shared_flag_mask: u8,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Output detdata field of detector quaternions.
    pub quats: String,
}

impl PointingDetectorConfig {
    /// The shared flags the pointing reads, with their mask: `None` when there is
    /// no field or the mask is 0 (no bit can replace a sample's boresight, so the
    /// field is neither read nor required). The one place the operators that
    /// follow this configuration (pointing, pixels, compact pointing, the fused
    /// passes) decide it.
    pub fn shared_flags_in_use(&self) -> Option<(&str, u8)> {
        self.shared_flags
            .as_deref()
            .filter(|_| self.shared_flag_mask != 0)
            .map(|f| (f, self.shared_flag_mask))
    }
}

impl Default for PointingDetectorConfig {
    fn default() -> Self {
        PointingDetectorConfig {
            enabled: true,
            view: None,
            boresight: defaults::BORESIGHT_RADEC.into(),
            shared_flags: Some(defaults::SHARED_FLAGS.into()),
            shared_flag_mask: defaults::SHARED_MASK_INVALID,
            det_mask: defaults::DET_MASK_INVALID,
            quats: defaults::QUATS.into(),
        }
    }
}

/// Detector quaternions `quats = boresight ⊗ detector offset` (the
/// `pointing_detector` kernel). Samples with a shared flag bit of
/// `shared_flag_mask` get the bare detector offset.
#[derive(Debug, Clone)]
pub struct PointingDetector {
    name: String,
    /// The configuration.
    pub config: PointingDetectorConfig,
    /// Each `exec` replaces the quaternion field by one that holds only the
    /// detectors of the current pass (on a device its mirror too), so a pipeline run per
    /// detector set never holds the quaternions of all detectors at once
    /// (the consumers read them by detector name). Off by default; set by
    /// callers that drop the quaternions after the pixels and weights.
    pub transient: bool,
}

impl PointingDetector {
    /// An operator.
    pub fn new(name: impl Into<String>, config: PointingDetectorConfig) -> Self {
        PointingDetector {
            name: name.into(),
            config,
            transient: false,
        }
    }
}

impl PointingDetector {
    /// The detectors of `ob` this pass processes, with the quaternions field made
    /// for them: whole, or only theirs when transient
    /// ([`super::pointing_field`]; on a device its mirror is sized to it).
    fn output_field(
        &self,
        ob: &mut Observation,
        ctx: &ExecContext,
    ) -> Result<Vec<String>, OpError> {
        let dets = select_detectors(ctx, ob, self.config.det_mask);
        pointing_field(
            ob,
            &self.config.quats,
            DType::F64,
            &[4],
            &dets,
            self.transient,
        )?;
        Ok(dets)
    }
}

impl Operator for PointingDetector {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new().shared(&self.config.boresight);
        if let Some((f, _)) = self.config.shared_flags_in_use() {
            r.add(toast_core::Category::Shared, f);
        }
        if let Some(v) = &self.config.view {
            r.add(toast_core::Category::Intervals, v);
        }
        r
    }

    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.config.quats)
    }

    fn supports_accel(&self) -> bool {
        true
    }

    fn prepare_outputs(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            self.output_field(ob, ctx)?;
        }
        Ok(())
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = self.output_field(ob, ctx)?;
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, self.config.view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            kernels::pointing_detector(
                ctx,
                call,
                ob,
                meta,
                &self.config.boresight,
                self.config.shared_flags_in_use(),
                &self.config.quats,
            )?;
        }
        Ok(())
    }
}
