//! Hits, inverse covariance and inverted covariance in one pass (TOAST's
//! `CovarianceAndHits`).

use super::mapmaker_utils::{
    BuildHitMap, BuildInverseCovariance, BuildPixelDistribution, FlagSelection,
};
use super::util::PointingOps;
use crate::exec::movement::with_host_step;
use crate::exec::pipeline::{run_operators, DetectorSets, OpRef, RunOptions};
use crate::pixels::covariance::invert_covariance;
use crate::pixels::sync_maps;
use serde::Deserialize;
use toast_core::observation::defaults;
use toast_core::{Category, Data, ExecContext, OpError, Operator, Requirements};

/// One covariance-and-hits pass.
#[derive(Debug, Clone)]
pub(crate) struct CovPass<'a> {
    /// Timer frame.
    pub name: &'a str,
    /// Global key of the pixel distribution (must exist).
    pub pixel_dist: &'a str,
    /// Output hit map key.
    pub hits: &'a str,
    /// Output (inverted) covariance key.
    pub covariance: &'a str,
    /// Output rcond key.
    pub rcond: &'a str,
    /// Keep the inverse covariance under this key.
    pub inverse_covariance: Option<&'a str>,
    /// Pixel field.
    pub pixels: &'a str,
    /// Stokes weight field.
    pub weights: &'a str,
    /// Interval list.
    pub view: Option<&'a str>,
    /// Which samples count.
    pub flags: FlagSelection,
    /// Observation key of the noise model.
    pub noise_model: &'a str,
    /// rcond cut.
    pub threshold: f64,
}

/// Accumulate hits and the inverse covariance (expanding the pointing first
/// when `pointing` is given), then invert the covariance per pixel on the
/// host with the rcond cut. Existing products under the output keys are
/// replaced.
pub(crate) fn covariance_and_hits(
    data: &mut Data,
    ctx: &mut ExecContext,
    pass: CovPass<'_>,
    pointing: Option<&mut PointingOps>,
    sets: &DetectorSets,
) -> Result<(), OpError> {
    for key in [pass.hits, pass.covariance, pass.rcond] {
        data.meta.remove(key);
    }
    let view = pass.view.map(str::to_string);
    let mut hits = BuildHitMap::new(
        format!("{}_hits", pass.name),
        pass.pixel_dist,
        pass.hits,
        pass.pixels,
        view.clone(),
        pass.flags.clone(),
    );
    let mut invcov = BuildInverseCovariance::new(
        format!("{}_invcov", pass.name),
        pass.pixel_dist,
        pass.covariance,
        pass.pixels,
        pass.weights,
        pass.noise_model,
        view,
        pass.flags.clone(),
    );
    let mut ops: Vec<OpRef<'_>> = Vec::new();
    if let Some(p) = pointing {
        ops.extend(p.operators());
    }
    ops.push(&mut hits);
    ops.push(&mut invcov);
    let opts = RunOptions {
        detector_sets: sets.clone(),
        ..RunOptions::default()
    };
    run_operators(pass.name, &mut ops, data, ctx, &opts)?;

    let (cov, rcond) = (pass.covariance.to_string(), pass.rcond.to_string());
    let hits_key = pass.hits.to_string();
    let invcov_key = pass.inverse_covariance.map(str::to_string);
    let mut provides = Requirements::new()
        .global(&cov)
        .global(&rcond)
        .global(&hits_key);
    if let Some(i) = &invcov_key {
        provides.add(Category::Global, i);
    }
    let threshold = pass.threshold;
    with_host_step(
        data,
        ctx,
        "covariance_invert",
        Requirements::new().global(&cov).global(&hits_key),
        provides,
        |data, ctx| {
            // Sum the hits and the inverse covariance over the job.
            sync_maps(data, ctx, &[&cov], &[&hits_key])?;
            // Inverted in place, not copied (a copy would also commit the
            // pages of every unhit pixel); the inverse covariance, when
            // asked for, keeps the accumulated one.
            let mut c = crate::pixels::take_map(data, &cov)?;
            if let Some(i) = &invcov_key {
                data.meta.set_object(i, (*c).clone());
            }
            let r = invert_covariance(&mut c, threshold)?;
            let (lo, hi) = r
                .data()
                .iter()
                .filter(|&&x| x > 0.0)
                .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            if hi < 1e-10 {
                tracing::warn!("there are no valid pixels (rcond max {hi:e})");
            } else {
                tracing::debug!("pixel covariance condition number range = {lo:.3e} ... {hi:.3e}");
            }
            data.meta.set_object(&cov, *c);
            data.meta.set_object(&rcond, r);
            Ok(())
        },
    )
}

/// Configuration of [`CovarianceAndHits`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CovarianceAndHitsConfig {
    /// Whether the operator runs.
    pub enabled: bool,
    /// Global key of the pixel distribution (built from the pointing if missing).
    pub pixel_dist: String,
    /// Global key of the (inverted) covariance.
    pub covariance: String,
    /// Global key to keep the inverse covariance under.
    pub inverse_covariance: Option<String>,
    /// Global key of the hit map.
    pub hits: String,
    /// Global key of the rcond map.
    pub rcond: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Per-sample detector flags.
    pub det_flags: Option<String>,
    /// Detector flag bits that exclude a sample.
    pub det_flag_mask: u8,
    /// Shared flags.
    pub shared_flags: Option<String>,
    /// Shared flag bits that exclude a sample.
    pub shared_flag_mask: u8,
    /// Observation key of the noise model.
    pub noise_model: String,
    /// Minimum rcond of a kept pixel.
    pub rcond_threshold: f64,
    /// `alltoallv` or `allreduce`, accepted for TOAST compatibility: both
    /// use the allreduce of the shared hit submaps (docs/DISTRIBUTED.md).
    pub sync_type: String,
    /// Keep the expanded pointing (accepted for TOAST compatibility: the
    /// pointing fields are kept anyway).
    pub save_pointing: bool,
}

impl Default for CovarianceAndHitsConfig {
    fn default() -> Self {
        CovarianceAndHitsConfig {
            enabled: true,
            pixel_dist: "pixel_dist".into(),
            covariance: "covariance".into(),
            inverse_covariance: None,
            hits: "hits".into(),
            rcond: "rcond".into(),
            det_mask: defaults::DET_MASK_NONSCIENCE,
            det_flags: Some(defaults::DET_FLAGS.into()),
            det_flag_mask: defaults::DET_MASK_NONSCIENCE,
            shared_flags: Some(defaults::SHARED_FLAGS.into()),
            shared_flag_mask: defaults::SHARED_MASK_NONSCIENCE,
            noise_model: defaults::NOISE_MODEL.into(),
            rcond_threshold: 1.0e-8,
            sync_type: "alltoallv".into(),
            save_pointing: false,
        }
    }
}

/// Expand the pointing, accumulate the hit map and the inverse covariance,
/// and invert it per pixel with the rcond cut (TOAST's `CovarianceAndHits`).
/// Builds the pixel distribution first when it does not exist. Composite:
/// `supports_accel() == false`.
#[derive(Debug, Clone)]
pub struct CovarianceAndHits {
    name: String,
    /// The configuration.
    pub config: CovarianceAndHitsConfig,
    /// The pointing operators.
    pub pointing: PointingOps,
}

impl CovarianceAndHits {
    /// An operator.
    pub fn new(
        name: impl Into<String>,
        config: CovarianceAndHitsConfig,
        pointing: PointingOps,
    ) -> Result<Self, OpError> {
        if config.sync_type != "alltoallv" && config.sync_type != "allreduce" {
            return Err(OpError::Config(format!(
                "CovarianceAndHits: sync_type '{}' is neither 'alltoallv' nor 'allreduce'",
                config.sync_type
            )));
        }
        Ok(CovarianceAndHits {
            name: name.into(),
            config,
            pointing,
        })
    }

    fn flags(&self) -> FlagSelection {
        let c = &self.config;
        FlagSelection {
            det_mask: c.det_mask,
            det_flags: c.det_flags.clone(),
            det_flag_mask: c.det_flag_mask,
            shared_flags: c.shared_flags.clone(),
            shared_flag_mask: c.shared_flag_mask,
        }
    }
}

impl Operator for CovarianceAndHits {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = self.pointing.requires();
        r.add(Category::Meta, &self.config.noise_model);
        self.flags().add_requirements(&mut r);
        r
    }
    fn provides(&self) -> Requirements {
        let c = &self.config;
        let mut p = Requirements::new()
            .global(&c.pixel_dist)
            .global(&c.hits)
            .global(&c.covariance)
            .global(&c.rcond);
        if let Some(i) = &c.inverse_covariance {
            p.add(Category::Global, i);
        }
        p.extend(&self.pointing.provides());
        p
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let c = self.config.clone();
        let mut expand = true;
        if !data.meta.contains(&c.pixel_dist) {
            let pixels = self.pointing.pixels.clone();
            let mut build = BuildPixelDistribution::new(
                format!("{}_pixel_dist", self.name),
                &c.pixel_dist,
                &pixels,
            );
            let mut ops = self.pointing.operators();
            ops.push(&mut build);
            run_operators(&self.name, &mut ops, data, ctx, &RunOptions::default())?;
            expand = false;
        }
        let (pix, wts, view) = (
            self.pointing.pixels_field().to_string(),
            self.pointing.weights_field().to_string(),
            self.pointing.view().map(str::to_string),
        );
        let pass = CovPass {
            name: &self.name,
            pixel_dist: &c.pixel_dist,
            hits: &c.hits,
            covariance: &c.covariance,
            rcond: &c.rcond,
            inverse_covariance: c.inverse_covariance.as_deref(),
            pixels: &pix,
            weights: &wts,
            view: view.as_deref(),
            flags: self.flags(),
            noise_model: &c.noise_model,
            threshold: c.rcond_threshold,
        };
        let pointing = if expand {
            Some(&mut self.pointing)
        } else {
            None
        };
        covariance_and_hits(data, ctx, pass, pointing, &DetectorSets::All)
    }
}
