//! Binned maps (TOAST's `BinMap`): `m = (Pᵀ N⁻¹ P)⁻¹ Pᵀ N⁻¹ d` with the
//! inverted covariance already in the data.

use super::mapmaker_utils::{ensure_map, BuildNoiseWeighted, FlagSelection};
use super::util::{PointingOps, ResetData};
use crate::exec::kernels;
use crate::exec::movement::{self, with_host_step};
use crate::exec::pipeline::{run_operators, DetectorSets, OpRef, RunOptions};
use crate::pixels::covariance::{apply_covariance, nnz_of_block};
use crate::pixels::{get_distribution, sync_maps, PixelData, PixelDistribution, SYNC_TIMER};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use toast_core::observation::defaults;
use toast_core::{comm_of, Category, Data, ExecContext, OpError, Operator, Requirements};

/// Configuration of a binning operator (TOAST's `BinMap` traits and
/// defaults; the `binner` and `binner_final` sections).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BinnerConfig {
    /// Whether the operator is used (for `binner_final`: whether the final
    /// maps use it instead of `binner`).
    pub enabled: bool,
    /// Global key of the pixel distribution.
    pub pixel_dist: String,
    /// Global key of the (inverted) covariance.
    pub covariance: String,
    /// Global key of the binned map.
    pub binned: String,
    /// Global key to keep the noise-weighted map under (`None`: not kept).
    pub noiseweighted: Option<String>,
    /// Timestream field.
    pub det_data: String,
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
    /// `alltoallv` or `allreduce` (TOAST's map reduction), accepted for
    /// TOAST compatibility: both use the allreduce of the shared hit
    /// submaps (docs/DISTRIBUTED.md).
    pub sync_type: String,
    /// Expand the pointing once and keep it, instead of recomputing it in
    /// every pass over the data (TOAST's default: `false`).
    pub full_pointing: bool,
    /// Detectors per pointing pass (0: all at once). With `full_pointing`,
    /// each pass of the one expansion expands its detectors' quaternions,
    /// pixels and weights and drops the quaternions, so only one batch of
    /// quaternions (32 bytes a sample) exists at a time. Without it (host
    /// runs of the map-maker), every pass that reads pointing recomputes
    /// it per batch and keeps only the batch's quaternions, pixels and
    /// weights (see [`crate::mapmaker`]). The maps do not depend on it
    /// with one observation (to rounding with several).
    pub pointing_batch: usize,
    /// Without `full_pointing`, on the host: keep the solver's pixels in
    /// compact form (i32, 4 bytes a sample) and rebuild each batch's
    /// pixels and weights from them and the boresight in every pass,
    /// instead of recomputing them with the pointing kernels (see
    /// [`crate::ops::ExpandCompactPointing`]: exact pixels, weights within
    /// a few ulp of the kernel's; the map-maker's solver and final binning
    /// passes rebuild the weights inside their loops, see
    /// [`crate::mapmaker`]). Used where `12 nside²` fits an i32; staged
    /// (device) runs keep the pointing instead, as with `full_pointing`.
    /// Off here (TOAST's default); the satellite workflow turns it on from
    /// `xsmall` on.
    pub compact_pointing: bool,
    /// On a device, with the pointing recomputed in batches (neither
    /// `full_pointing` nor `compact_pointing`, a `pointing_batch` above 0):
    /// stream the detector data, each pass staging one batch's rows of the
    /// timestream and flags while the host holds them whole
    /// ([`crate::exec::movement::window`]), so the device holds the maps,
    /// the boresight and one batch whatever the length of the timestream,
    /// for a bus cost of the batch's rows in every pass that reads them.
    /// Off by default; the satellite workflow turns it on when its device
    /// memory budget holds not even one batch beside the whole detector
    /// data. No effect on the host.
    pub stream_detector_data: bool,
}

impl Default for BinnerConfig {
    fn default() -> Self {
        BinnerConfig {
            enabled: true,
            pixel_dist: "pixel_dist".into(),
            covariance: "covariance".into(),
            binned: "binned".into(),
            noiseweighted: None,
            det_data: defaults::DET_DATA.into(),
            det_mask: defaults::DET_MASK_NONSCIENCE,
            det_flags: Some(defaults::DET_FLAGS.into()),
            det_flag_mask: defaults::DET_MASK_NONSCIENCE,
            shared_flags: Some(defaults::SHARED_FLAGS.into()),
            shared_flag_mask: defaults::SHARED_MASK_NONSCIENCE,
            noise_model: defaults::NOISE_MODEL.into(),
            sync_type: "alltoallv".into(),
            full_pointing: false,
            pointing_batch: 8,
            compact_pointing: false,
            stream_detector_data: false,
        }
    }
}

impl BinnerConfig {
    /// The flag selection of this binner.
    pub fn flags(&self) -> FlagSelection {
        FlagSelection {
            det_mask: self.det_mask,
            det_flags: self.det_flags.clone(),
            det_flag_mask: self.det_flag_mask,
            shared_flags: self.shared_flags.clone(),
            shared_flag_mask: self.shared_flag_mask,
        }
    }

    /// Check the values.
    pub fn validate(&self) -> Result<(), OpError> {
        if self.sync_type != "alltoallv" && self.sync_type != "allreduce" {
            return Err(OpError::Config(format!(
                "binner: sync_type '{}' is neither 'alltoallv' nor 'allreduce'",
                self.sync_type
            )));
        }
        Ok(())
    }
}

/// One binning pass.
pub(crate) struct BinPass<'a> {
    /// Timer frame / operator name prefix.
    pub name: &'a str,
    /// The binner's keys and noise model.
    pub config: &'a BinnerConfig,
    /// Covariance key (overrides the config's).
    pub covariance: &'a str,
    /// Output map key (overrides the config's).
    pub binned: &'a str,
    /// Timestream field.
    pub det_data: &'a str,
    /// Which samples to bin.
    pub flags: FlagSelection,
    /// Keep the noise-weighted map under this key.
    pub noiseweighted: Option<&'a str>,
    /// Apply the covariance where the map is: on the device when the pass
    /// runs in a device device scope (the covariance is uploaded once and
    /// stays there, the map does not come back), for a map that the device
    /// uses next (the solver's). `false`: on the host, which needs no
    /// covariance on the device, for a map that goes to the host anyway
    /// (the final maps). Without a device scope both are the host path.
    pub covariance_on_device: bool,
}

/// The pointing a binning pass reads: made by operators the pass runs, or
/// left by them earlier (kept pointing). Either way the field names are
/// those operators' (`pixels.pixels`, `weights.weights`, their view).
pub(crate) enum PassPointing<'a> {
    /// Run these operators before the accumulation (per detector set).
    Run(&'a mut PointingOps),
    /// Read the pixels and weights these operators left.
    Kept(&'a PointingOps),
}

impl<'a> PassPointing<'a> {
    /// The pointing of `ops`: kept (`kept`) or run by the pass.
    pub(crate) fn of(ops: &'a mut PointingOps, kept: bool) -> Self {
        if kept {
            PassPointing::Kept(ops)
        } else {
            PassPointing::Run(ops)
        }
    }

    /// The operators that make (or made) the pointing.
    fn ops(&self) -> &PointingOps {
        match self {
            PassPointing::Run(p) => p,
            PassPointing::Kept(p) => p,
        }
    }

    /// The operators the pass runs, if it runs them.
    fn into_run(self) -> Option<&'a mut PointingOps> {
        match self {
            PassPointing::Run(p) => Some(p),
            PassPointing::Kept(_) => None,
        }
    }
}

/// Bin `det_data`: run `pre` (e.g. a template projection), the pointing
/// operators (when they are to run), and the noise-weighted accumulation as one
/// pipeline, sum the map over the processes (on the host), then apply the
/// covariance (see [`BinPass::covariance_on_device`]). With detector `sets`
/// other than `All`, the map reset runs first over all detectors and then
/// `pre`, the pointing and the accumulation once per set (in detector
/// order, so the sums are the same as one pass's; `pre` may make a
/// transient work timestream of the set, see [`ResetData::transient`]).
pub(crate) fn bin_map(
    data: &mut Data,
    ctx: &mut ExecContext,
    pass: BinPass<'_>,
    pointing: PassPointing<'_>,
    pre: Vec<OpRef<'_>>,
    sets: &DetectorSets,
) -> Result<(), OpError> {
    bin_map_with(data, ctx, pass, pointing, pre, sets, None)
}

/// [`bin_map`] with the accumulation step `accumulate` in place of the
/// noise-weighted accumulation of `pass.det_data` (`None`: that one), for
/// a step that accumulates into `pass.binned` from another source (the
/// map-maker's fused device step, which rebuilds `F a` from amplitudes).
pub(crate) fn bin_map_with(
    data: &mut Data,
    ctx: &mut ExecContext,
    pass: BinPass<'_>,
    pointing: PassPointing<'_>,
    pre: Vec<OpRef<'_>>,
    sets: &DetectorSets,
    accumulate: Option<OpRef<'_>>,
) -> Result<(), OpError> {
    let cfg = pass.config;
    prepare_bin_map(data, &pass)?;

    let ops = pointing.ops();
    let (pix_field, wts_field, view) = (
        ops.pixels_field().to_string(),
        ops.weights_field().to_string(),
        ops.view().map(str::to_string),
    );
    let pointing = pointing.into_run();
    let mut reset = ResetData {
        name: format!("{}_reset", pass.name),
        detdata: Vec::new(),
        global: vec![pass.binned.to_string()],
        transient: false,
    };
    let mut accum = BuildNoiseWeighted::new(
        format!("{}_build_zmap", pass.name),
        &cfg.pixel_dist,
        pass.binned,
        pix_field,
        wts_field,
        pass.det_data,
        &cfg.noise_model,
        view,
        pass.flags.clone(),
    );
    let mut ops: Vec<OpRef<'_>> = vec![&mut reset];
    if *sets != DetectorSets::All {
        run_operators(pass.name, &mut ops, data, ctx, &RunOptions::default())?;
        ops.clear();
    }
    ops.extend(pre);
    if let Some(p) = pointing {
        ops.extend(p.operators());
    }
    match accumulate {
        Some(step) => ops.push(step),
        None => ops.push(&mut accum),
    }
    let opts = RunOptions {
        detector_sets: sets.clone(),
        ..RunOptions::default()
    };
    run_operators(pass.name, &mut ops, data, ctx, &opts)?;

    finish_bin_map(data, ctx, &pass)
}

/// The checks and the output map of a binning pass: the covariance is a
/// packed symmetric matrix on the binner's pixel distribution, and the
/// binned map exists with its `nnz` values per pixel. Returns the
/// distribution and `nnz`.
pub(crate) fn prepare_bin_map(
    data: &mut Data,
    pass: &BinPass<'_>,
) -> Result<(Arc<PixelDistribution>, usize), OpError> {
    let cfg = pass.config;
    let dist = get_distribution(data, &cfg.pixel_dist)?;
    let (nnz, cov_dist) = {
        let cov = data.meta.object::<PixelData<f64>>(pass.covariance)?;
        let nnz = nnz_of_block(cov.n_value()).ok_or_else(|| OpError::Global {
            key: pass.covariance.to_string(),
            problem: format!(
                "a covariance with {} values per pixel, not a packed symmetric matrix",
                cov.n_value()
            ),
        })?;
        (nnz, cov.distribution().clone())
    };
    if cov_dist != dist {
        return Err(OpError::Global {
            key: pass.covariance.to_string(),
            problem: format!(
                "the covariance does not use the pixel distribution '{}'",
                cfg.pixel_dist
            ),
        });
    }
    ensure_map::<f64>(data, pass.binned, &cfg.pixel_dist, &dist, nnz)?;
    Ok((dist, nnz))
}

/// The end of a binning pass whose noise-weighted map is accumulated (in
/// `pass.binned`): sum it over the job, keep a copy when asked for, apply
/// the covariance (see [`BinPass::covariance_on_device`]).
pub(crate) fn finish_bin_map(
    data: &mut Data,
    ctx: &mut ExecContext,
    pass: &BinPass<'_>,
) -> Result<(), OpError> {
    // Sum the noise-weighted map over the job (nothing to do in one process).
    if comm_of(ctx).size() > 1 {
        let binned = pass.binned.to_string();
        with_host_step(
            data,
            ctx,
            SYNC_TIMER,
            Requirements::new().global(&binned),
            Requirements::new().global(&binned),
            |data, ctx| sync_maps(data, ctx, &[&binned], &[]),
        )?;
    }

    if let Some(nw) = pass.noiseweighted {
        let binned = pass.binned.to_string();
        with_host_step(
            data,
            ctx,
            "keep_noiseweighted",
            Requirements::new().global(&binned),
            Requirements::new().global(nw),
            |data, _| {
                let m = data.meta.object::<PixelData<f64>>(&binned)?.clone();
                data.meta.set_object(nw, m);
                Ok(())
            },
        )?;
    }
    let mut apply = ApplyCovariance {
        name: format!("{}_apply_covariance", pass.name),
        covariance: pass.covariance.to_string(),
        map: pass.binned.to_string(),
    };
    if pass.covariance_on_device {
        run_operators(
            "apply_covariance",
            &mut [&mut apply],
            data,
            ctx,
            &RunOptions::default(),
        )
    } else {
        let (req, prov) = (apply.requires(), apply.provides());
        with_host_step(data, ctx, "apply_covariance", req, prov, |data, _| {
            apply.on_host(data)
        })?;
        // The map is the host's now; in a device scope its device copy is
        // stale and no device step reads it: freed rather than kept until
        // the scope closes (8 bytes a local pixel and Stokes value).
        movement::forget(data, ctx, &Requirements::new().global(pass.binned))?;
        Ok(())
    }
}

/// `m ← C m` at every local pixel of a binned map (TOAST's `cov_apply_diag`
/// step of `BinMap`), as a pipeline step: in an accelerated pipeline the
/// `cov_apply_diag` kernel on the staged copies, otherwise
/// [`apply_covariance`] on the host (the CPU path, bit-identical to it).
#[derive(Debug, Clone)]
pub(crate) struct ApplyCovariance {
    name: String,
    covariance: String,
    map: String,
}

impl ApplyCovariance {
    fn on_host(&self, data: &mut Data) -> Result<(), OpError> {
        let (binned, cov) = (&self.map, &self.covariance);
        // Check both types first, then take the map out of the metadata so
        // that the covariance is borrowed in place, not copied.
        data.meta.object::<PixelData<f64>>(cov)?;
        let mut m = crate::pixels::take_map(data, binned)?;
        let r = match data.meta.object::<PixelData<f64>>(cov) {
            Ok(c) => apply_covariance(c, &mut m),
            Err(e) => Err(e.into()),
        };
        data.meta.set_object(binned.clone(), *m);
        r
    }
}

impl Operator for ApplyCovariance {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new()
            .global(&self.map)
            .global(&self.covariance)
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.map)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if ctx.use_accel {
            kernels::cov_apply_diag(ctx, &self.name, &mut data.meta, &self.covariance, &self.map)
        } else {
            self.on_host(data)
        }
    }
}

/// Bin a timestream into a map with an existing inverted covariance
/// (TOAST's `BinMap`). Composite: it runs its own pipeline (joining an open
/// device scope), so it reports `supports_accel() == false`.
#[derive(Debug, Clone)]
pub struct BinMap {
    name: String,
    /// The configuration.
    pub config: BinnerConfig,
    /// The pointing operators.
    pub pointing: PointingOps,
}

impl BinMap {
    /// An operator.
    pub fn new(
        name: impl Into<String>,
        config: BinnerConfig,
        pointing: PointingOps,
    ) -> Result<Self, OpError> {
        config.validate()?;
        Ok(BinMap {
            name: name.into(),
            config,
            pointing,
        })
    }
}

impl Operator for BinMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = self.pointing.requires();
        let c = &self.config;
        r.add(Category::Global, &c.pixel_dist);
        r.add(Category::Global, &c.covariance);
        r.add(Category::Meta, &c.noise_model);
        r.add(Category::DetData, &c.det_data);
        c.flags().add_requirements(&mut r);
        r
    }
    fn provides(&self) -> Requirements {
        let mut p = Requirements::new().global(&self.config.binned);
        if let Some(n) = &self.config.noiseweighted {
            p.add(Category::Global, n);
        }
        p
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let c = self.config.clone();
        let pass = BinPass {
            name: &self.name,
            config: &c,
            covariance: &c.covariance,
            binned: &c.binned,
            det_data: &c.det_data,
            flags: c.flags(),
            noiseweighted: c.noiseweighted.as_deref(),
            covariance_on_device: false,
        };
        bin_map(
            data,
            ctx,
            pass,
            PassPointing::Run(&mut self.pointing),
            Vec::new(),
            &DetectorSets::All,
        )
    }
}
