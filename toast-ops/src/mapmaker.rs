//! The destriping map-maker (TOAST's `MapMaker` with `SolveAmplitudes`, an
//! `Offset` template and `BinMap`).
//!
//! It solves `(Fᵀ N⁻¹ Z F) a = Fᵀ N⁻¹ Z d` for the offset amplitudes `a`,
//! with `Z = I - P (Pᵀ N⁻¹ P)⁻¹ Pᵀ N⁻¹`, by preconditioned conjugate
//! gradients, then bins `d - F a` into the destriped map. The steps, named
//! as in the project's `toast-satellite.md` §2 row 5:
//!
//! * **5a** solver flags (`{name}_solve_flags`, u8): bit 1 where the binner's
//!   detector or shared flags cut the sample, or the sample lies outside the
//!   pointing's view;
//! * **5b** hits and inverse covariance with those flags, inverted per pixel
//!   with `mapmaker.solve_rcond_threshold` (`{name}_solve_hits`,
//!   `{name}_solve_cov`, `{name}_solve_rcond`);
//! * **5c** bit 4 of the solver flags on every sample that falls in a pixel
//!   whose rcond is below the threshold (TOAST's `ScanMask`);
//! * **5d** the offset template is laid out and its amplitudes flagged from
//!   the solver flags (see [`crate::templates::offset`]); the right-hand side
//!   `b = Fᵀ N⁻¹ (d - P m)` with `m` the binned map of `d`
//!   (`{name}_solve_bin`, `{name}_solve_rhs`);
//! * **5e** PCG from `a = 0` with the diagonal preconditioner: each
//!   iteration applies the left-hand side once (`F`: add amplitudes to a
//!   zeroed timestream; bin it; subtract the scanned map; noise weight;
//!   `Fᵀ`). Convergence when `‖r‖² / ‖b‖² < mapmaker.convergence` or `‖r‖² <
//!   1e-30`, at most `iter_max` iterations, and TOAST's stall test every 10
//!   iterations from `iter_min` on;
//! * **5f** hits, covariance and rcond for the final map with the final
//!   binner's flags and `mapmaker.map_rcond_threshold` (`{name}_hits`,
//!   `{name}_cov`, `{name}_rcond`, optionally `{name}_invcov`);
//! * **5g** the binned map of the raw timestream (`{name}_binmap`);
//! * **5h** the amplitudes subtracted from the timestream (in place with
//!   `save_cleaned` and `overwrite_cleaned`, else into `{name}_cleaned`);
//! * **5i** the destriped map (`{name}_map`; `{name}_noiseweighted_map` too
//!   with `write_noiseweighted_map` or `keep_final_products`).
//!
//! The final products stay in `data.meta` for the caller to write (FITS
//! output is the CLI's); solver products are removed unless
//! `keep_solver_products`.
//!
//! # Departures from TOAST, all exact
//!
//! * The initial residual skips the LHS application to the zero starting
//!   vector (it is exactly zero), so there is one LHS per iteration.
//! * In the LHS, the timestream `F d` built for the binning is reused for the
//!   projection instead of being rebuilt.
//! * The unconstrained direction of the offsets (a common constant, which
//!   the map's monopole absorbs) is left as TOAST leaves it: CG from zero
//!   does not excite it, and nothing removes it.
//!
//! # Not implemented
//!
//! TOAST options outside the satellite benchmark's path are refused by the
//! configuration (unknown keys) or by validation: the offset noise prior and
//! its banded/Toeplitz preconditioners (`baselines.use_noise_prior`), the
//! pixel mask (`mapmaker.mask`), Monte-Carlo mode (`mc_mode`), detector
//! splits (`focalplane_key`, `pattern`), QU-only Stokes weights, detector
//! calibration tables and coordinate rotations of the boresight.
//!
//! # Determinism
//!
//! The CG vectors live on the host and every dot product and update runs
//! sequentially in amplitude order; the map accumulations are the kernels'
//! (fixed detector → interval → sample order per map element), the
//! covariance work is per pixel. Results are bit-identical for any thread
//! count.
//!
//! # Data movement
//!
//! With a backend that is not host-addressable, the map-maker opens one
//! staging scope for the whole run (see [`crate::pipeline`]): the timestream,
//! flags and pointing are uploaded once, and per iteration only the
//! amplitude vectors and the map cross the bus (the map because the
//! covariance is applied on the host, as in TOAST).
//!
//! # Memory
//!
//! With `binner.full_pointing`, pixels (8 bytes a sample) and weights (24
//! with IQU) are expanded once for all detectors and kept; the quaternions
//! (32 bytes a sample) are expanded per batch of `binner.pointing_batch`
//! detectors and each batch's are dropped once its pixels and weights are
//! written (host runs; a staged run keeps the full field on the device), so
//! they never exist for all detectors at once. The batch size does not
//! change any result.

use crate::global_data::HostArray;
use crate::kernels::view_intervals;
use crate::ops::binning::{bin_map, BinPass};
use crate::ops::covariance_and_hits::{covariance_and_hits, CovPass};
use crate::ops::{
    select_detectors, BinnerConfig, BuildPixelDistribution, CopyDetData, FlagSelection,
    NoiseWeight, NoiseWeightConfig, PixelsHealpix, PixelsHealpixConfig, PointingDetector,
    PointingDetectorConfig, PointingOps, ResetData, ScanMap, ScanMapConfig, StokesWeights,
    StokesWeightsConfig,
};
use crate::pipeline::{
    close_scope, open_scope, pipeline_backend, run_operators, with_host_step, DetectorSets, OpRef,
    RunOptions, StagingState,
};
use crate::pixel_dist::PixelData;
use crate::templates::offset::{
    OffsetAddToSignal, OffsetApplyPrecond, OffsetInit, OffsetProjectSignal,
};
use crate::templates::{OffsetConfig, OffsetTemplate};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use toast_accel::host::Dispatcher;
use toast_core::observation::defaults;
use toast_core::{
    comm_of, Category, DType, Data, ExecContext, OpError, Operator, ReduceOp, Requirements,
};

/// Configuration of the map-maker (TOAST's `MapMaker` traits and defaults;
/// the `mapmaker` section).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MapMakerConfig {
    /// Whether the map-maker runs.
    pub enabled: bool,
    /// Timestream field.
    pub det_data: String,
    /// Relative convergence limit on `‖r‖² / ‖b‖²`.
    pub convergence: f64,
    /// Iterations before the stall test applies.
    pub iter_min: usize,
    /// Maximum number of iterations.
    pub iter_max: usize,
    /// rcond cut for the solver's covariance.
    pub solve_rcond_threshold: f64,
    /// rcond cut for the final map's covariance.
    pub map_rcond_threshold: f64,
    /// Produce the binned map of the raw timestream (`{name}_binmap`).
    pub write_binmap: bool,
    /// Write the destriped map (for the output writer).
    pub write_map: bool,
    /// Keep the noise-weighted map (`{name}_noiseweighted_map`).
    pub write_noiseweighted_map: bool,
    /// Write the hit map (for the output writer).
    pub write_hits: bool,
    /// Write the covariance (for the output writer).
    pub write_cov: bool,
    /// Keep the inverse covariance (`{name}_invcov`).
    pub write_invcov: bool,
    /// Write the rcond map (for the output writer).
    pub write_rcond: bool,
    /// Write maps in double precision (for the output writer).
    pub write_float64: bool,
    /// Write the solver products (for the output writer; implies keeping them).
    pub write_solver_products: bool,
    /// Keep the solver products in the data.
    pub keep_solver_products: bool,
    /// Keep the final products (they are always kept here; accepted for TOAST compatibility).
    pub keep_final_products: bool,
    /// Keep the template-subtracted timestream.
    pub save_cleaned: bool,
    /// With `save_cleaned`, subtract in place.
    pub overwrite_cleaned: bool,
    /// Output directory (for the output writer).
    pub output_dir: String,
    /// Rebuild the pixel distributions even if they exist.
    pub reset_pix_dist: bool,
}

impl Default for MapMakerConfig {
    fn default() -> Self {
        MapMakerConfig {
            enabled: true,
            det_data: defaults::DET_DATA.into(),
            convergence: 1.0e-12,
            iter_min: 3,
            iter_max: 100,
            solve_rcond_threshold: 1.0e-8,
            map_rcond_threshold: 1.0e-8,
            write_binmap: true,
            write_map: true,
            write_noiseweighted_map: false,
            write_hits: true,
            write_cov: true,
            write_invcov: false,
            write_rcond: true,
            write_float64: false,
            write_solver_products: false,
            keep_solver_products: false,
            keep_final_products: false,
            save_cleaned: false,
            overwrite_cleaned: false,
            output_dir: ".".into(),
            reset_pix_dist: false,
        }
    }
}

impl MapMakerConfig {
    /// Check the values.
    pub fn validate(&self) -> Result<(), OpError> {
        let bad = |m: String| Err(OpError::Config(format!("mapmaker: {m}")));
        if !(self.convergence.is_finite() && self.convergence > 0.0) {
            return bad(format!(
                "convergence = {} must be positive",
                self.convergence
            ));
        }
        for (n, v) in [
            ("solve_rcond_threshold", self.solve_rcond_threshold),
            ("map_rcond_threshold", self.map_rcond_threshold),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(format!("{n} = {v} must be a non-negative number"));
            }
        }
        Ok(())
    }
}

/// Everything a map-maker is built from: the configuration sections TOAST's
/// satellite workflow exposes (`mapmaker`, `baselines`, `binner`,
/// `binner_final`, `det_pointing`, `pixels`, `weights`, `pixels_final`).
///
/// It deserializes from a table with those sections (each optional, each
/// strict about its own keys); other top-level sections are ignored, so a
/// whole job configuration can be read into it. `pixels_final` and
/// `binner_final` are used only when present and `enabled`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct MapMakerSetup {
    /// Instance name (prefix of the product keys; not read from a configuration).
    #[serde(skip)]
    pub name: String,
    /// Map-maker parameters.
    pub mapmaker: MapMakerConfig,
    /// The offset template.
    pub baselines: OffsetConfig,
    /// The solver's binner (and the final one unless `binner_final` is set).
    pub binner: BinnerConfig,
    /// The final binner (used when `Some` and enabled).
    pub binner_final: Option<BinnerConfig>,
    /// Detector pointing.
    pub det_pointing: PointingDetectorConfig,
    /// Pixelization of the solve.
    pub pixels: PixelsHealpixConfig,
    /// Stokes weights.
    pub weights: StokesWeightsConfig,
    /// Pixelization of the final maps (used when `Some`).
    pub pixels_final: Option<PixelsHealpixConfig>,
}

impl Default for MapMakerSetup {
    fn default() -> Self {
        MapMakerSetup {
            name: "mapmaker".into(),
            mapmaker: MapMakerConfig::default(),
            baselines: OffsetConfig::default(),
            binner: BinnerConfig::default(),
            binner_final: None,
            det_pointing: PointingDetectorConfig::default(),
            pixels: PixelsHealpixConfig::default(),
            weights: StokesWeightsConfig::default(),
            pixels_final: None,
        }
    }
}

/// How the PCG solve ended, and the products it left in `data.meta`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MapMakerResult {
    /// PCG iterations run, i.e. LHS applications (TOAST logs the 0-based
    /// index of the last one, `iterations - 1`, as "converged after N
    /// iterations").
    pub iterations: usize,
    /// Whether the convergence criterion was met.
    pub converged: bool,
    /// Whether TOAST's stall test stopped the solve.
    pub stalled: bool,
    /// `‖b‖²`, TOAST's "initial residual".
    pub initial_residual: f64,
    /// `‖r‖² / ‖b‖²` after each iteration.
    pub residuals: Vec<f64>,
    /// Offset amplitudes.
    pub n_amplitudes: usize,
    /// Of which flagged (not solved).
    pub n_flagged_amplitudes: usize,
    /// Samples the solver flags cut (of the selected detectors, in the view).
    pub solver_cut_samples: u64,
    /// Samples of the selected detectors in the view.
    pub solver_total_samples: u64,
    /// Global key of the hit map (`PixelData<i64>`).
    pub hits: String,
    /// Global key of the final covariance (`PixelData<f64>`, packed).
    pub cov: String,
    /// Global key of the final rcond map.
    pub rcond: String,
    /// Global key of the inverse covariance, if kept.
    pub invcov: Option<String>,
    /// Global key of the binned raw map, if made.
    pub binmap: Option<String>,
    /// Global key of the destriped map.
    pub map: String,
    /// Global key of the noise-weighted destriped map, if kept.
    pub noiseweighted_map: Option<String>,
    /// Detdata field of the cleaned timestream, if kept.
    pub cleaned: Option<String>,
    /// Global key of the solved amplitudes, if kept.
    pub amplitudes: Option<String>,
}

/// Keys of the solver's products and work vectors.
struct Keys {
    solve_flags: String,
    temp: String,
    solve_hits: String,
    solve_cov: String,
    solve_rcond: String,
    solve_bin: String,
    rhs: String,
    amplitudes: String,
    lhs_in: String,
    lhs_out: String,
    residual: String,
    precond: String,
    hits: String,
    cov: String,
    invcov: String,
    rcond: String,
    binmap: String,
    map: String,
    noiseweighted: String,
    cleaned: String,
    neg_amplitudes: String,
}

impl Keys {
    fn new(name: &str) -> Self {
        let k = |s: &str| format!("{name}_{s}");
        Keys {
            solve_flags: k("solve_flags"),
            temp: k("temp"),
            solve_hits: k("solve_hits"),
            solve_cov: k("solve_cov"),
            solve_rcond: k("solve_rcond"),
            solve_bin: k("solve_bin"),
            rhs: k("solve_rhs"),
            amplitudes: k("solve_amplitudes"),
            lhs_in: k("lhs_in"),
            lhs_out: k("lhs_out"),
            residual: k("solve_residual"),
            precond: k("solve_precond"),
            hits: k("hits"),
            cov: k("cov"),
            invcov: k("invcov"),
            rcond: k("rcond"),
            binmap: k("binmap"),
            map: k("map"),
            noiseweighted: k("noiseweighted_map"),
            cleaned: k("cleaned"),
            neg_amplitudes: k("solve_neg_amplitudes"),
        }
    }
}

/// The destriping map-maker (see the module documentation).
#[derive(Debug, Clone)]
pub struct MapMaker {
    setup: MapMakerSetup,
    solve_pointing: PointingOps,
    final_pointing: Option<PointingOps>,
    result: Option<MapMakerResult>,
    /// Pointing fields that existed before the run (never deleted).
    preexisting: Vec<String>,
}

/// Run `f` inside the timer frame `frame`.
fn timed<R>(
    data: &mut Data,
    ctx: &mut ExecContext,
    frame: &str,
    f: impl FnOnce(&mut Data, &mut ExecContext) -> Result<R, OpError>,
) -> Result<R, OpError> {
    ctx.timers.enter(frame)?;
    let r = f(data, ctx);
    ctx.timers.exit(frame)?;
    r
}

/// A detdata-only read of host vectors out of `data.meta`.
fn read_amps(data: &Data, key: &str) -> Result<Vec<f64>, OpError> {
    Ok(data.meta.object::<HostArray<f64>>(key)?.values.clone())
}

fn write_amps(data: &mut Data, key: &str, v: &[f64]) -> Result<(), OpError> {
    let a = data.meta.object_mut::<HostArray<f64>>(key)?;
    a.values.copy_from_slice(v);
    Ok(())
}

/// Timer frame of the CG dot-product reductions.
pub const DOT_TIMER: &str = "allreduce_dot";

/// The job-wide `Σ a_i c_i` over unflagged entries: the local sum in index
/// order, then an allreduce over the processes (timed as [`DOT_TIMER`]).
fn gdot(ctx: &mut ExecContext, a: &[f64], c: &[f64], flags: &[u8]) -> Result<f64, OpError> {
    let mut v = [dot(a, c, flags)];
    let comm = comm_of(ctx);
    if comm.size() > 1 {
        ctx.timers.enter(DOT_TIMER)?;
        let r = comm.allreduce_f64(&mut v, ReduceOp::Sum);
        ctx.timers.exit(DOT_TIMER)?;
        r.map_err(|e| OpError::Config(format!("PCG dot product: {e}")))?;
    }
    Ok(v[0])
}

/// `Σ a_i c_i` over unflagged entries, in index order.
fn dot(a: &[f64], c: &[f64], flags: &[u8]) -> f64 {
    let mut s = 0.0;
    for ((x, y), f) in a.iter().zip(c).zip(flags) {
        if *f == 0 {
            s += x * y;
        }
    }
    s
}

impl MapMaker {
    /// A map-maker; checks the configuration.
    pub fn new(setup: MapMakerSetup) -> Result<Self, OpError> {
        setup.mapmaker.validate()?;
        setup.baselines.validate()?;
        setup.binner.validate()?;
        if let Some(b) = &setup.binner_final {
            b.validate()?;
        }
        let det_pointing = PointingDetector::new("det_pointing", setup.det_pointing.clone());
        let weights =
            StokesWeights::new("weights", setup.weights.clone(), setup.det_pointing.clone());
        let pixels =
            PixelsHealpix::new("pixels", setup.pixels.clone(), setup.det_pointing.clone())?;
        let solve_pointing = PointingOps::new(det_pointing.clone(), pixels, weights.clone());
        let final_pointing = match setup.pixels_final.as_ref().filter(|p| p.enabled) {
            Some(p) => Some(PointingOps::new(
                det_pointing,
                PixelsHealpix::new("pixels_final", p.clone(), setup.det_pointing.clone())?,
                weights,
            )),
            None => None,
        };
        Ok(MapMaker {
            setup,
            solve_pointing,
            final_pointing,
            result: None,
            preexisting: Vec::new(),
        })
    }

    /// The setup.
    pub fn setup(&self) -> &MapMakerSetup {
        &self.setup
    }

    /// The result of the last run.
    pub fn result(&self) -> Option<&MapMakerResult> {
        self.result.as_ref()
    }

    fn final_binner(&self) -> &BinnerConfig {
        match &self.setup.binner_final {
            Some(b) if b.enabled => b,
            _ => &self.setup.binner,
        }
    }

    /// Make the maps (see the module documentation). The detectors are
    /// those `ctx` selects, minus those the binner's `det_mask` cuts.
    pub fn run(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
    ) -> Result<MapMakerResult, OpError> {
        toast_core::check_requirements(data, &self.requires())?;
        self.preexisting = self
            .pointing_fields()
            .into_iter()
            .filter(|f| data.obs.iter().any(|ob| ob.detdata.contains(f)))
            .collect();
        let backend = ctx
            .extensions
            .get::<Dispatcher>()
            .and_then(|d| pipeline_backend(d, None));
        let scope = open_scope(ctx, backend.as_ref());
        let keys = Keys::new(&self.setup.name);
        let name = self.setup.name.clone();
        let result = timed(data, ctx, &name, |data, ctx| {
            self.run_scoped(data, ctx, &keys)
        });
        let mut outputs = Requirements::new()
            .detdata(&self.setup.mapmaker.det_data)
            .detdata(&keys.cleaned);
        if self.setup.binner.full_pointing {
            outputs.extend(&self.solve_pointing.provides());
        }
        let closed = close_scope(data, ctx, scope, &outputs);
        let cleanup = self.cleanup(data, &keys);
        let mut res = result?;
        closed?;
        cleanup?;
        if !(self.setup.mapmaker.keep_solver_products || self.setup.mapmaker.write_solver_products)
        {
            res.amplitudes = None;
        }
        self.result = Some(res.clone());
        Ok(res)
    }

    /// Remove temporaries and (unless kept) solver products.
    fn cleanup(&self, data: &mut Data, keys: &Keys) -> Result<(), OpError> {
        let mm = &self.setup.mapmaker;
        let keep_solver = mm.keep_solver_products || mm.write_solver_products;
        let mut detdata = vec![keys.temp.clone()];
        // Pointing this run made: the quaternions always go, the pixels and
        // weights unless they are kept (`full_pointing`).
        for f in self.pointing_fields() {
            let kept = self.setup.binner.full_pointing && f != self.setup.det_pointing.quats;
            if !kept && !self.preexisting.contains(&f) {
                detdata.push(f);
            }
        }
        if !keep_solver {
            detdata.push(keys.solve_flags.clone());
        }
        if !mm.save_cleaned {
            detdata.push(keys.cleaned.clone());
        }
        for ob in &mut data.obs {
            for f in &detdata {
                if ob.detdata.contains(f) {
                    ob.detdata.remove(f)?;
                }
            }
        }
        let mut global = vec![
            keys.lhs_in.clone(),
            keys.lhs_out.clone(),
            keys.residual.clone(),
            keys.precond.clone(),
            keys.neg_amplitudes.clone(),
        ];
        if !keep_solver {
            global.extend([
                keys.solve_hits.clone(),
                keys.solve_cov.clone(),
                keys.solve_rcond.clone(),
                keys.solve_bin.clone(),
                keys.rhs.clone(),
                keys.amplitudes.clone(),
                format!("{}_amp_flags", "baselines"),
                format!("{}_offset_var", "baselines"),
            ]);
        }
        for g in global {
            data.meta.remove(&g);
        }
        Ok(())
    }

    /// Free the solver's work timestream, flags and map-domain products
    /// (those not kept by `keep_solver_products`/`write_solver_products`).
    fn free_solver(&self, data: &mut Data, keys: &Keys) -> Result<(), OpError> {
        let mm = &self.setup.mapmaker;
        let keep_solver = mm.keep_solver_products || mm.write_solver_products;
        let mut detdata = vec![keys.temp.clone()];
        if !keep_solver {
            detdata.push(keys.solve_flags.clone());
        }
        for ob in &mut data.obs {
            for f in &detdata {
                if ob.detdata.contains(f) {
                    ob.detdata.remove(f)?;
                }
            }
        }
        let mut global = vec![
            &keys.lhs_in,
            &keys.lhs_out,
            &keys.residual,
            &keys.precond,
            &keys.neg_amplitudes,
        ];
        if !keep_solver {
            global.extend([
                &keys.solve_hits,
                &keys.solve_cov,
                &keys.solve_rcond,
                &keys.solve_bin,
                &keys.rhs,
            ]);
        }
        for g in global {
            data.meta.remove(g);
        }
        Ok(())
    }

    fn run_scoped(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<MapMakerResult, OpError> {
        let mm = self.setup.mapmaker.clone();
        let binner = self.setup.binner.clone();
        let full = binner.full_pointing;
        let det_data = mm.det_data.clone();
        let mut res = MapMakerResult::default();

        // Pointing for the solve, once, when it is kept.
        if full {
            // Nothing reads the quaternions again unless the final maps
            // have their own pixelization: expand per detector batch, each
            // pass replacing the previous batch's quaternions (host runs,
            // see `PointingDetector::transient`), and free the last batch
            // (32 bytes a sample). A staged device copy stays until the
            // scope closes.
            let quats = self.setup.det_pointing.quats.clone();
            let drop_quats = self.final_pointing.is_none() && !self.preexisting.contains(&quats);
            let mut opts = RunOptions::default();
            if drop_quats && binner.pointing_batch > 0 {
                // `run_operators` intersects each set with the selection.
                let dets = data.all_local_detectors(0);
                opts.detector_sets = DetectorSets::Sets(
                    dets.chunks(binner.pointing_batch)
                        .map(|c| c.to_vec())
                        .collect(),
                );
            }
            self.solve_pointing.det_pointing.transient = drop_quats;
            let r = {
                let mut ops = self.solve_pointing.operators();
                run_operators("pointing", &mut ops, data, ctx, &opts)
            };
            self.solve_pointing.det_pointing.transient = false;
            r?;
            if drop_quats {
                for ob in &mut data.obs {
                    if ob.detdata.contains(&quats) {
                        ob.detdata.remove(&quats)?;
                    }
                }
            }
        }

        // Pixel distribution of the solve.
        if mm.reset_pix_dist {
            data.meta.remove(&binner.pixel_dist);
        }
        if !data.meta.contains(&binner.pixel_dist) {
            let pixels = self.solve_pointing.pixels.clone();
            let mut build = BuildPixelDistribution::new("pixel_dist", &binner.pixel_dist, &pixels);
            self.run_with_pointing(
                data,
                ctx,
                "BuildPixelDistribution",
                !full,
                false,
                vec![&mut build],
            )?;
        }

        let templates = self.setup.baselines.enabled;
        let amps = if templates {
            timed(data, ctx, "SolveAmplitudes", |data, ctx| {
                self.solve_amplitudes(data, ctx, keys, &mut res)
            })?
        } else {
            None
        };

        // The solver's work timestream and products are not read again:
        // free them before the final products (host runs; a staging scope
        // keeps its buffers until it closes, so there `cleanup` does it).
        let host_run = ctx.extensions.get::<StagingState>().is_none();
        if host_run {
            self.free_solver(data, keys)?;
        }

        // 5f-5i: final products.
        let fb = self.final_binner().clone();
        let separate_final = self.final_pointing.is_some();
        let expand_final = separate_final || !full;
        if mm.reset_pix_dist && fb.pixel_dist != binner.pixel_dist {
            data.meta.remove(&fb.pixel_dist);
        }
        if !data.meta.contains(&fb.pixel_dist) {
            let pixels = self.final_ops().pixels.clone();
            let mut build =
                BuildPixelDistribution::new("pixel_dist_final", &fb.pixel_dist, &pixels);
            self.run_with_pointing(
                data,
                ctx,
                "BuildPixelDistribution",
                expand_final,
                true,
                vec![&mut build],
            )?;
        }
        timed(data, ctx, "CovarianceAndHits", |data, ctx| {
            let invcov = mm.write_invcov.then_some(keys.invcov.as_str());
            self.covariance_and_hits(
                data,
                ctx,
                CovKeys {
                    pixel_dist: &fb.pixel_dist,
                    hits: &keys.hits,
                    cov: &keys.cov,
                    rcond: &keys.rcond,
                    invcov,
                },
                fb.flags(),
                &fb.noise_model,
                mm.map_rcond_threshold,
                expand_final,
                true,
            )
        })?;
        res.hits = keys.hits.clone();
        res.cov = keys.cov.clone();
        res.rcond = keys.rcond.clone();
        res.invcov = mm.write_invcov.then(|| keys.invcov.clone());

        if mm.write_binmap {
            timed(data, ctx, "BinMap", |data, ctx| {
                let pass = BinPass {
                    name: "binmap",
                    config: &fb,
                    covariance: &keys.cov,
                    binned: &keys.binmap,
                    det_data: &det_data,
                    flags: fb.flags(),
                    noiseweighted: None,
                };
                let pointing = if expand_final {
                    Some(self.final_ops_mut())
                } else {
                    None
                };
                bin_map(data, ctx, pass, pointing, Vec::new())
            })?;
            res.binmap = Some(keys.binmap.clone());
        }

        // 5h: subtract the amplitudes, after the raw signal is binned (as
        // TOAST's MapMaker does: `_bin_and_write_raw_signal` precedes
        // `_clean_signal`, so the binned map is the undestriped one even
        // when the timestream is cleaned in place).
        let mut cleaned_field = det_data.clone();
        if let Some((tmpl, x)) = amps {
            cleaned_field = if mm.save_cleaned && mm.overwrite_cleaned {
                det_data.clone()
            } else {
                keys.cleaned.clone()
            };
            timed(data, ctx, "ApplyAmplitudes", |data, ctx| {
                self.apply_amplitudes(data, ctx, keys, &tmpl, &x, &cleaned_field)
            })?;
            if host_run {
                data.meta.remove(&keys.neg_amplitudes);
            }
            if mm.keep_solver_products || mm.write_solver_products {
                data.meta
                    .set_object(&keys.amplitudes, HostArray { values: x });
                res.amplitudes = Some(keys.amplitudes.clone());
            }
        }

        let keep_nw = mm.write_noiseweighted_map || mm.keep_final_products;
        timed(data, ctx, "BinMap", |data, ctx| {
            let pass = BinPass {
                name: "binner_final",
                config: &fb,
                covariance: &keys.cov,
                binned: &keys.map,
                det_data: &cleaned_field,
                flags: fb.flags(),
                noiseweighted: keep_nw.then_some(keys.noiseweighted.as_str()),
            };
            let pointing = if expand_final {
                Some(self.final_ops_mut())
            } else {
                None
            };
            bin_map(data, ctx, pass, pointing, Vec::new())
        })?;
        res.map = keys.map.clone();
        res.noiseweighted_map = keep_nw.then(|| keys.noiseweighted.clone());
        res.cleaned = (templates
            && mm.save_cleaned
            && !mm.overwrite_cleaned
            && cleaned_field == keys.cleaned)
            .then(|| keys.cleaned.clone());
        Ok(res)
    }

    fn pointing_fields(&self) -> Vec<String> {
        let mut v = vec![
            self.setup.det_pointing.quats.clone(),
            self.solve_pointing.pixels_field().to_string(),
            self.solve_pointing.weights_field().to_string(),
        ];
        if let Some(f) = &self.final_pointing {
            v.push(f.pixels_field().to_string());
        }
        v.dedup();
        v
    }

    fn final_ops(&self) -> &PointingOps {
        self.final_pointing.as_ref().unwrap_or(&self.solve_pointing)
    }

    fn final_ops_mut(&mut self) -> &mut PointingOps {
        match &mut self.final_pointing {
            Some(p) => p,
            None => &mut self.solve_pointing,
        }
    }

    /// Run `ops`, preceded by the pointing operators when `expand`.
    fn run_with_pointing(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        name: &str,
        expand: bool,
        final_pointing: bool,
        ops: Vec<OpRef<'_>>,
    ) -> Result<(), OpError> {
        let pointing = if final_pointing {
            self.final_ops_mut()
        } else {
            &mut self.solve_pointing
        };
        let mut all: Vec<OpRef<'_>> = Vec::new();
        if expand {
            all.extend(pointing.operators());
        }
        all.extend(ops);
        run_operators(name, &mut all, data, ctx, &RunOptions::default())
    }

    /// Hits, inverse covariance, inversion with `threshold`, with the
    /// solver's or the final pointing (expanded first when `expand`).
    #[allow(clippy::too_many_arguments)]
    fn covariance_and_hits(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        k: CovKeys<'_>,
        flags: FlagSelection,
        noise_model: &str,
        threshold: f64,
        expand: bool,
        final_pointing: bool,
    ) -> Result<(), OpError> {
        let ops = if final_pointing {
            self.final_ops_mut()
        } else {
            &mut self.solve_pointing
        };
        let (pix, wts, view) = (
            ops.pixels_field().to_string(),
            ops.weights_field().to_string(),
            ops.view().map(str::to_string),
        );
        let pass = CovPass {
            name: "CovarianceAndHits",
            pixel_dist: k.pixel_dist,
            hits: k.hits,
            covariance: k.cov,
            rcond: k.rcond,
            inverse_covariance: k.invcov,
            pixels: &pix,
            weights: &wts,
            view: view.as_deref(),
            flags,
            noise_model,
            threshold,
        };
        covariance_and_hits(data, ctx, pass, expand.then_some(ops))
    }

    /// 5a-5e. Returns the template and the solved amplitudes, or `None` when
    /// there is nothing to solve.
    fn solve_amplitudes(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        res: &mut MapMakerResult,
    ) -> Result<Option<Solved>, OpError> {
        let mm = self.setup.mapmaker.clone();
        let binner = self.setup.binner.clone();
        let full = binner.full_pointing;
        let view = self.solve_pointing.view().map(str::to_string);

        // 5a: solver flags.
        let flags0 = binner.flags();
        let mut req = Requirements::new();
        if let Some((f, _)) = flags0.det() {
            req.add(Category::DetData, f);
        }
        if let Some((f, _)) = flags0.shared() {
            req.add(Category::Shared, f);
        }
        let sf = keys.solve_flags.clone();
        with_host_step(
            data,
            ctx,
            "solver_flags",
            req,
            Requirements::new().detdata(&sf),
            |data, ctx| {
                for ob in &mut data.obs {
                    let dets = select_detectors(ctx, ob, binner.det_mask);
                    ob.detdata.create(&sf, DType::U8, &[], None)?;
                    if dets.is_empty() {
                        continue;
                    }
                    let ranges = view_intervals(ob, view.as_deref())?;
                    let mut rows = Vec::with_capacity(dets.len());
                    for d in &dets {
                        let cut = flags0.sample_cut(ob, d)?;
                        let mut row = vec![1u8; ob.n_samples()];
                        for iv in &ranges {
                            for s in iv.first as usize..iv.last as usize {
                                row[s] = u8::from(cut[s]);
                            }
                        }
                        rows.push(row);
                    }
                    let f = ob.detdata.get_mut(&sf)?;
                    for (d, row) in dets.iter().zip(rows) {
                        f.row_of_mut::<u8>(d)?.copy_from_slice(&row);
                    }
                }
                Ok(())
            },
        )?;

        // 5b: solver hits and covariance.
        let solve_sel = FlagSelection {
            det_mask: binner.det_mask,
            det_flags: Some(keys.solve_flags.clone()),
            det_flag_mask: 255,
            shared_flags: binner.shared_flags.clone(),
            shared_flag_mask: binner.shared_flag_mask,
        };
        timed(data, ctx, "CovarianceAndHits", |data, ctx| {
            self.covariance_and_hits(
                data,
                ctx,
                CovKeys {
                    pixel_dist: &binner.pixel_dist,
                    hits: &keys.solve_hits,
                    cov: &keys.solve_cov,
                    rcond: &keys.solve_rcond,
                    invcov: None,
                },
                solve_sel,
                &binner.noise_model,
                mm.solve_rcond_threshold,
                !full,
                false,
            )
        })?;

        // 5c: flag samples in poorly conditioned pixels (bit 4).
        if !full {
            let mut ops = self.solve_pointing.operators();
            ops.truncate(2);
            run_operators(
                "rcond_mask_pointing",
                &mut ops,
                data,
                ctx,
                &RunOptions::default(),
            )?;
        }
        let pix_field = self.solve_pointing.pixels_field().to_string();
        let rcond_key = keys.solve_rcond.clone();
        let threshold = mm.solve_rcond_threshold;
        let (cut, total) = with_host_step(
            data,
            ctx,
            "rcond_mask",
            Requirements::new()
                .detdata(&pix_field)
                .detdata(&sf)
                .global(&rcond_key),
            Requirements::new().detdata(&sf),
            |data, ctx| {
                let Data { obs, meta } = data;
                let rcond = meta.object::<PixelData<f64>>(&rcond_key)?;
                let (mut cut, mut total) = (0u64, 0u64);
                for ob in obs.iter_mut() {
                    let dets = select_detectors(ctx, ob, binner.det_mask);
                    if dets.is_empty() {
                        continue;
                    }
                    let ranges = view_intervals(ob, view.as_deref())?;
                    let [pix, flags] = ob
                        .detdata
                        .get_disjoint_mut([pix_field.as_str(), sf.as_str()])?;
                    for d in &dets {
                        let p = pix.row_of::<i64>(d)?;
                        let f = flags.row_of_mut::<u8>(d)?;
                        for iv in &ranges {
                            for s in iv.first as usize..iv.last as usize {
                                if p[s] >= 0 {
                                    if let Some(r) = rcond.pixel(p[s]) {
                                        if r[0] < threshold {
                                            f[s] |= 4;
                                        }
                                    }
                                }
                                total += 1;
                                cut += u64::from(f[s] != 0);
                            }
                        }
                    }
                }
                Ok((cut, total))
            },
        )?;
        res.solver_cut_samples = cut;
        res.solver_total_samples = total;
        if total > 0 {
            tracing::info!(
                "{}: solver flags cut {cut} / {total} = {:.2}% of samples",
                self.setup.name,
                100.0 * cut as f64 / total as f64
            );
        }

        // 5d: the template and the right-hand side.
        let tmpl = OffsetTemplate::initialize(
            "baselines",
            self.setup.baselines.clone(),
            data,
            ctx,
            OffsetInit {
                det_data: &mm.det_data,
                det_mask: binner.det_mask,
                det_flags: Some((&keys.solve_flags, 255)),
                view: view.as_deref(),
            },
        )?;
        // Job-wide counts (every process must take the same branch below).
        let mut counts = [tmpl.n_amplitudes() as i64, tmpl.n_flagged() as i64];
        comm_of(ctx)
            .allreduce_i64(&mut counts, ReduceOp::Sum)
            .map_err(|e| OpError::Config(format!("{}: amplitude counts: {e}", self.setup.name)))?;
        res.n_amplitudes = counts[0] as usize;
        res.n_flagged_amplitudes = counts[1] as usize;
        if counts[0] == 0 {
            tracing::info!(
                "{}: no offset amplitudes, nothing to solve",
                self.setup.name
            );
            return Ok(None);
        }
        let tmpl = Arc::new(tmpl);
        for k in [
            &keys.rhs,
            &keys.lhs_in,
            &keys.lhs_out,
            &keys.residual,
            &keys.precond,
        ] {
            data.meta.set_object(k, tmpl.zeros());
        }
        let solver_bin_flags = FlagSelection {
            det_mask: binner.det_mask,
            det_flags: Some(keys.solve_flags.clone()),
            det_flag_mask: 255,
            shared_flags: binner.shared_flags.clone(),
            shared_flag_mask: 0,
        };
        let b = timed(data, ctx, "SolverRHS", |data, ctx| {
            let pass = BinPass {
                name: "solver_binning",
                config: &binner,
                covariance: &keys.solve_cov,
                binned: &keys.solve_bin,
                det_data: &mm.det_data,
                flags: solver_bin_flags.clone(),
                noiseweighted: None,
            };
            let pointing = if full {
                None
            } else {
                Some(&mut self.solve_pointing)
            };
            bin_map(data, ctx, pass, pointing, Vec::new())?;
            let mut copy = CopyDetData {
                name: "copy_rhs".into(),
                input: mm.det_data.clone(),
                output: keys.temp.clone(),
                det_mask: binner.det_mask,
            };
            let mut reset = ResetData {
                name: "reset_rhs".into(),
                detdata: Vec::new(),
                global: vec![keys.rhs.clone()],
            };
            let mut tail = self.projection_ops(&tmpl, keys, &keys.rhs)?;
            let mut ops: Vec<OpRef<'_>> = vec![&mut copy];
            if !full {
                ops.extend(self.solve_pointing.operators());
            }
            ops.push(&mut reset);
            for op in tail.iter_mut() {
                ops.push(op.as_mut());
            }
            run_operators("SolverRHS", &mut ops, data, ctx, &RunOptions::default())?;
            with_host_step(
                data,
                ctx,
                "read_rhs",
                Requirements::new().global(&keys.rhs),
                Requirements::new(),
                |data, _| read_amps(data, &keys.rhs),
            )
        })?;

        // 5e: PCG.
        let x = timed(data, ctx, "solve", |data, ctx| {
            self.pcg(data, ctx, &tmpl, keys, &b, res)
        })?;
        Ok(Some((tmpl, x)))
    }

    /// Scan-subtract the solver's binned map from the temporary timestream,
    /// noise weight it, project into `amplitudes` (which must be zeroed).
    fn projection_ops(
        &self,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        amplitudes: &str,
    ) -> Result<Vec<Box<dyn Operator>>, OpError> {
        let binner = &self.setup.binner;
        let view = self.solve_pointing.view().map(str::to_string);
        let scan = ScanMap::new(
            "scan_map",
            ScanMapConfig {
                enabled: true,
                det_data: keys.temp.clone(),
                det_mask: binner.det_mask,
                view: view.clone(),
                pixels: self.solve_pointing.pixels_field().to_string(),
                weights: self.solve_pointing.weights_field().to_string(),
                map_key: keys.solve_bin.clone(),
                pixel_dist: binner.pixel_dist.clone(),
                subtract: true,
                zero: false,
                scale: false,
            },
        )?;
        let nw = NoiseWeight::new(
            "noise_weight",
            NoiseWeightConfig {
                enabled: true,
                noise_model: binner.noise_model.clone(),
                view,
                det_data: keys.temp.clone(),
                det_mask: binner.det_mask,
            },
        );
        let project = OffsetProjectSignal {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            det_data: keys.temp.clone(),
            det_flags: Some((keys.solve_flags.clone(), 255)),
            amplitudes: amplitudes.to_string(),
        };
        Ok(vec![Box::new(scan), Box::new(nw), Box::new(project)])
    }

    /// `q = A d` (TOAST's `SolverLHS`), `d` read from `keys.lhs_in`, `q`
    /// written to `keys.lhs_out`.
    fn lhs(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let binner = self.setup.binner.clone();
        let full = binner.full_pointing;
        let solver_bin_flags = FlagSelection {
            det_mask: binner.det_mask,
            det_flags: Some(keys.solve_flags.clone()),
            det_flag_mask: 255,
            shared_flags: binner.shared_flags.clone(),
            shared_flag_mask: 0,
        };
        // F d into a zeroed timestream, binned.
        let mut zero = ResetData {
            name: "reset_lhs".into(),
            detdata: vec![keys.temp.clone()],
            global: Vec::new(),
        };
        let mut add = OffsetAddToSignal {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            amplitudes: keys.lhs_in.clone(),
            det_data: keys.temp.clone(),
        };
        let pass = BinPass {
            name: "solver_binning",
            config: &binner,
            covariance: &keys.solve_cov,
            binned: &keys.solve_bin,
            det_data: &keys.temp,
            flags: solver_bin_flags,
            noiseweighted: None,
        };
        let pointing = if full {
            None
        } else {
            Some(&mut self.solve_pointing)
        };
        let pre: Vec<OpRef<'_>> = vec![&mut zero, &mut add];
        bin_map(data, ctx, pass, pointing, pre)?;
        // Z, N⁻¹, Fᵀ on the same timestream.
        let mut reset = ResetData {
            name: "reset_lhs_out".into(),
            detdata: Vec::new(),
            global: vec![keys.lhs_out.clone()],
        };
        let mut tail = self.projection_ops(tmpl, keys, &keys.lhs_out)?;
        let mut ops: Vec<OpRef<'_>> = vec![&mut reset];
        for op in tail.iter_mut() {
            ops.push(op.as_mut());
        }
        run_operators("SolverLHS", &mut ops, data, ctx, &RunOptions::default())
    }

    fn precond(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        r: &[f64],
    ) -> Result<Vec<f64>, OpError> {
        with_host_step(
            data,
            ctx,
            "write_residual",
            Requirements::new(),
            Requirements::new().global(&keys.residual),
            |data, _| write_amps(data, &keys.residual, r),
        )?;
        let mut op = OffsetApplyPrecond {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            input: keys.residual.clone(),
            output: keys.precond.clone(),
        };
        run_operators("precond", &mut [&mut op], data, ctx, &RunOptions::default())?;
        with_host_step(
            data,
            ctx,
            "read_precond",
            Requirements::new().global(&keys.precond),
            Requirements::new(),
            |data, _| read_amps(data, &keys.precond),
        )
    }

    /// The PCG solve of TOAST's `solve()` from a zero starting vector.
    fn pcg(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        b: &[f64],
        res: &mut MapMakerResult,
    ) -> Result<Vec<f64>, OpError> {
        let mm = self.setup.mapmaker.clone();
        let flags = data
            .meta
            .object::<HostArray<u8>>(&tmpl.flags_key())?
            .values
            .clone();
        let n = b.len();
        let mut x = vec![0.0f64; n];
        // r = b - A·0 = b exactly.
        let mut r = b.to_vec();
        let mut s = self.precond(data, ctx, tmpl, keys, &r)?;
        let mut d = s.clone();
        let mut sqsum = gdot(ctx, b, b, &flags)?;
        let sqsum_init = sqsum;
        let mut sqsum_best = sqsum;
        let mut last_best = sqsum;
        let mut delta = gdot(ctx, &d, &r, &flags)?;
        res.initial_residual = sqsum_init;
        tracing::info!("{}: PCG initial residual = {sqsum_init:e}", self.setup.name);
        if sqsum_init == 0.0 {
            res.converged = true;
            return Ok(x);
        }
        for iter in 0..mm.iter_max {
            if !sqsum.is_finite() {
                return Err(OpError::Config(format!(
                    "{}: PCG residual is not finite ({sqsum}) at iteration {iter}",
                    self.setup.name
                )));
            }
            // q = A d
            with_host_step(
                data,
                ctx,
                "write_proposal",
                Requirements::new(),
                Requirements::new().global(&keys.lhs_in),
                |data, _| write_amps(data, &keys.lhs_in, &d),
            )?;
            timed(data, ctx, "SolverLHS", |data, ctx| {
                self.lhs(data, ctx, tmpl, keys)
            })?;
            let q = with_host_step(
                data,
                ctx,
                "read_lhs",
                Requirements::new().global(&keys.lhs_out),
                Requirements::new(),
                |data, _| read_amps(data, &keys.lhs_out),
            )?;
            let alpha = delta / gdot(ctx, &d, &q, &flags)?;
            for (xi, di) in x.iter_mut().zip(&d) {
                *xi += di * alpha;
            }
            for (ri, qi) in r.iter_mut().zip(&q) {
                *ri -= qi * alpha;
            }
            sqsum = gdot(ctx, &r, &r, &flags)?;
            let relative = sqsum / sqsum_init;
            res.residuals.push(relative);
            res.iterations = iter + 1;
            tracing::info!(
                "{}: PCG iteration {iter:4}, relative residual = {relative:.6e}",
                self.setup.name
            );
            if relative < mm.convergence || sqsum < 1e-30 {
                res.converged = true;
                tracing::info!(
                    "{}: PCG converged after {} iterations",
                    self.setup.name,
                    iter + 1
                );
                break;
            }
            sqsum_best = sqsum_best.min(sqsum);
            if iter % 10 == 0 && iter >= mm.iter_min {
                if last_best < sqsum_best * 2.0 {
                    res.stalled = true;
                    tracing::info!(
                        "{}: PCG stalled after {} iterations",
                        self.setup.name,
                        iter + 1
                    );
                    break;
                }
                last_best = sqsum_best;
            }
            s = self.precond(data, ctx, tmpl, keys, &r)?;
            let delta_last = delta;
            delta = gdot(ctx, &s, &r, &flags)?;
            let beta = delta / delta_last;
            for (di, si) in d.iter_mut().zip(&s) {
                *di = *di * beta + si;
            }
        }
        if !res.converged && !res.stalled {
            tracing::warn!(
                "{}: PCG reached iter_max = {} without converging (relative residual {:e})",
                self.setup.name,
                mm.iter_max,
                res.residuals.last().copied().unwrap_or(f64::NAN)
            );
        }
        Ok(x)
    }

    /// 5h: subtract `F x` from the timestream, into `target` (copied from the
    /// timestream first unless it is the timestream).
    fn apply_amplitudes(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        tmpl: &Arc<OffsetTemplate>,
        x: &[f64],
        target: &str,
    ) -> Result<(), OpError> {
        let det_data = self.setup.mapmaker.det_data.clone();
        let neg: Vec<f64> = x.iter().map(|v| -v).collect();
        data.meta
            .set_object(&keys.neg_amplitudes, HostArray { values: neg });
        let mut ops: Vec<Box<dyn Operator>> = Vec::new();
        if target != det_data {
            ops.push(Box::new(CopyDetData {
                name: "copy_cleaned".into(),
                input: det_data,
                output: target.to_string(),
                det_mask: self.setup.binner.det_mask,
            }));
        }
        ops.push(Box::new(OffsetAddToSignal {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            amplitudes: keys.neg_amplitudes.clone(),
            det_data: target.to_string(),
        }));
        let mut refs: Vec<OpRef<'_>> = ops.iter_mut().map(|o| o.as_mut() as OpRef<'_>).collect();
        run_operators(
            "ApplyAmplitudes",
            &mut refs,
            data,
            ctx,
            &RunOptions::default(),
        )
    }
}

/// The template and its solved amplitudes.
type Solved = (Arc<OffsetTemplate>, Vec<f64>);

/// Keys of one covariance-and-hits pass.
struct CovKeys<'a> {
    pixel_dist: &'a str,
    hits: &'a str,
    cov: &'a str,
    rcond: &'a str,
    invcov: Option<&'a str>,
}

impl Operator for MapMaker {
    fn name(&self) -> &str {
        &self.setup.name
    }

    /// What the map-maker reads: the pointing inputs, the timestream, its
    /// flags and the noise model.
    fn requires(&self) -> Requirements {
        let mut r = self.solve_pointing.requires();
        if let Some(f) = &self.final_pointing {
            r.extend(&f.requires());
        }
        let b = &self.setup.binner;
        r.add(Category::DetData, &self.setup.mapmaker.det_data);
        r.add(Category::Meta, &b.noise_model);
        for cfg in [b, self.final_binner()] {
            if let Some(f) = &cfg.det_flags {
                r.add(Category::DetData, f);
            }
            if let Some(f) = &cfg.shared_flags {
                r.add(Category::Shared, f);
            }
            r.add(Category::Meta, &cfg.noise_model);
        }
        if let Some(nm) = &self.setup.baselines.noise_model {
            r.add(Category::Meta, nm);
        }
        r.add(Category::Shared, &self.setup.baselines.times);
        r
    }

    /// The final products (and the pixel distributions).
    fn provides(&self) -> Requirements {
        let k = Keys::new(&self.setup.name);
        let mm = &self.setup.mapmaker;
        let mut p = Requirements::new()
            .global(&self.setup.binner.pixel_dist)
            .global(&self.final_binner().pixel_dist)
            .global(&k.hits)
            .global(&k.cov)
            .global(&k.rcond)
            .global(&k.map);
        if mm.write_binmap {
            p.add(Category::Global, &k.binmap);
        }
        if mm.write_invcov {
            p.add(Category::Global, &k.invcov);
        }
        if mm.write_noiseweighted_map || mm.keep_final_products {
            p.add(Category::Global, &k.noiseweighted);
        }
        if mm.save_cleaned {
            p.add(
                Category::DetData,
                if mm.overwrite_cleaned {
                    &mm.det_data
                } else {
                    &k.cleaned
                },
            );
        }
        if self.setup.binner.full_pointing {
            p.extend(&self.solve_pointing.provides());
        }
        p
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.setup.mapmaker.enabled {
            return Ok(());
        }
        self.run(data, ctx).map(|_| ())
    }
}
