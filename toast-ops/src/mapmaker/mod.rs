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
//!   `Fᵀ`; on the host fused into two walks without the timestream, see
//!   `fused`). Convergence when `‖r‖² / ‖b‖² < mapmaker.convergence` or `‖r‖² <
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
//! The CG vectors live where the run's data lives (`vectors`): on the host
//! for the CPU, on the device for a device backend. A dot product is summed
//! in amplitude order within fixed blocks and the block partials are added
//! on the host in block order (one block on the host), and updates are
//! element-wise (`toast_accel::math`); the map accumulations are the
//! kernels' (fixed detector → interval → sample order per map element), the
//! covariance work is per pixel. CPU results are bit-identical for any
//! thread count; a device's atomic accumulation in `build_noise_weighted`
//! can reorder sums (differences at float rounding).
//!
//! # Data movement
//!
//! With a backend that is not host-addressable, the map-maker opens one
//! device scope for the whole run (see [`crate::exec::movement`]): the
//! timestream, flags and boresight are uploaded once, and per CG iteration
//! only the dot products' partial sums cross the bus (see `vectors`).
//! Pointing never crosses it, and no pass reads pointing on the host: the
//! pixel distribution is built from the submaps the device's pixels hit
//! (a byte a submap comes back), the hits and covariance are accumulated
//! by `cov_accum_timestream`, the solver flags and the rcond mask are the
//! `solver_flags` kernel (`flags`; the mask map, a byte a local pixel, is
//! made on the host from the rcond map and goes up, two counts come back).
//! With `full_pointing` the device expands its copy from the boresight
//! once; a caller that reads the pointing afterwards gets a host copy
//! that the host expands itself ([`crate::exec::pipeline::mirror_on_host`])
//! or the one it handed over ([`MapMaker::reuse_pointing`]), declared
//! equal to the device's, so neither is copied (32 bytes a detector sample
//! each way saved); a caller that discards the detector data gets none.
//! Without `full_pointing` a device run recomputes it in every pass, per
//! batch of `binner.pointing_batch` detectors (`device-recomputed`): the
//! pointing fields are transient on the device too. On both device plans
//! the solver's passes are the fused kernels as pipeline steps
//! (`fused::AccumulateStep`, `fused::ProjectStep`): the right-hand side
//! reads the timestream's rows of the pass (or batch) and the left-hand
//! side rebuilds `F a` from the amplitudes inside the kernels, so no work
//! timestream exists on the device (with a plugin that lacks the fused
//! kernels, the unfused passes make one, per batch when batched). The
//! batched device holds the timestream, the flags, the boresight, the maps
//! and one batch (10 bytes a detector sample and 64 a batch sample,
//! against 42 kept, the quaternions freed once the pointing is
//! expanded): what a small device memory budget runs with.
//!
//! The final hits, covariance and rcond are the solver's when nothing
//! differs (`share_solver_covariance`): one pass instead of two. A caller
//! that reads no timestream afterwards says so
//! ([`MapMaker::discard_timestream`]) and the cleaned timestream is not
//! copied back.
//!
//! # Memory
//!
//! On the host, the solver's work timestream (`{name}_temp`, 8 bytes a
//! sample) exists for one batch of `binner.pointing_batch` detectors at a
//! time (`MapMaker::work_sets`): the right-hand side copies the batch's
//! timestream, scans, weights and projects it; the left-hand side builds
//! `F d` for the batch and bins it, then, once the map is complete,
//! builds it again (the same values) to scan, weight and project. The
//! arithmetic per detector and the order of the map sums are one pass's,
//! so the maps are bit-identical to those of a full-size work timestream
//! (which staged runs keep). Batches are as even as possible
//! (`batches`), so each batch reuses the previous one's transient fields
//! in place.
//!
//! With `binner.full_pointing`, pixels (8 bytes a sample) and weights (24
//! with IQU) are expanded once for all detectors and kept; the quaternions
//! (32 bytes a sample) are expanded per batch of `binner.pointing_batch`
//! detectors and each batch's are dropped once its pixels and weights are
//! written (host runs; a staged run keeps the full field on the device), so
//! they never exist for all detectors at once. The batch size does not
//! change any result. On the host (IQU weights, a template on the
//! pointing's views) the solver's right- and left-hand sides then run
//! *fused* on the kept fields (`fused`): no work timestream, each sample
//! read once per accumulation and once per projection, bit-identical to
//! the unfused passes (on tiny, on a loaded 2-core machine, the 24
//! left-hand sides took 2.80 s unfused and 2.53 s fused; 1.29 s and 0.95 s
//! once the solver's map is confined to its samples' pixels).
//!
//! Without `full_pointing` (TOAST's default) every pass that reads pointing
//! recomputes it. On the host the pass runs per batch of `pointing_batch`
//! detectors and the three pointing fields are *transient*
//! ([`crate::ops::pointing_field`]): each batch replaces the previous one's,
//! so only one batch's pointing (64 bytes a sample with IQU) exists at a
//! time. A pass over batches runs its global resets (the binned map, the
//! amplitudes) and the template's `F a` over all detectors first, then the
//! pointing, accumulation and projection per batch. In the solver's
//! left-hand side the pointing is recomputed twice (to bin `F a`, then to
//! scan the map back), as in TOAST. With one observation the per-pixel sums
//! run in the same order as one pass's, so the maps are bit-identical to
//! those of the kept pointing; with several, a batch visits every
//! observation before the next batch (as TOAST's detector sets do), so they
//! agree to rounding. With `binner.compact_pointing` (`12 nside²` within
//! i32; on the host and, as `device-compact`, on a device), the first pass
//! has the `pixels_healpix` kernel write each batch's pixels as i32 into
//! `{name}_compact_pixels` (4 bytes a sample, kept to the end) and
//! every later pass rebuilds the batch's pixels from them and its weights
//! from the boresight ([`crate::ops::ExpandCompactPointing`]: exact
//! pixels, so exact hits; weights within a few ulp of the kernel's, so
//! maps equal to the kept pointing's to rounding: on xsmall three pixels
//! differ by one float32 ulp) instead of running the three pointing
//! kernels: 14 bytes a detector sample instead of 42 kept, at a few ns a
//! sample per pass instead of the kernels' ~70. The covariance pass (5b)
//! and the rcond mask (5c) write each batch's pixels and weights out for
//! the kernels; the right-hand side, the left-hand side and the final
//! binning passes run *fused* instead (`fused`, IQU weights and a
//! template on the pointing's views; [`MapMaker::fused_passes`]): the
//! weights are rebuilt per block of samples in cache and consumed at once,
//! with no batch pointing or work timestream, and the results are
//! bit-identical to the unfused passes' (xsmall's CG solve is then faster
//! than with the kept pointing).
//! A staged run asked for it
//! keeps the pointing (`full_pointing`). The pixel distribution, when the map-maker builds it,
//! is built in one pass (its builder reduces over the job after each pass,
//! and processes may hold different numbers of batches). Device runs of
//! `device-kept` keep one pass over full fields; `device-recomputed` and
//! `device-compact` run the batches as the host does (see "Data
//! movement"); `device-compact`'s fused device steps read the compact
//! pixels and the boresight, so its solver passes run no pointing step.
//!
//! # Files
//!
//! As TOAST splits its own map-maker (`mapmaker.py`, `mapmaker_solve.py`,
//! `mapmaker_binning.py`):
//!
//! * this file: the [`MapMaker`] type and its top-level flow ([`MapMaker::run`]);
//! * `config.rs`: [`MapMakerConfig`] and [`MapMakerSetup`], TOAST's traits
//!   and defaults;
//! * `solve.rs`: steps 5a–5e (TOAST's `SolveAmplitudes`): solver flags,
//!   rcond mask, right-hand side, the PCG loop, the preconditioner and the
//!   left-hand side;
//! * `binning.rs`: the pixel distributions, covariance-and-hits passes and
//!   the final binning passes (5f, 5g, 5i);
//! * `products.rs`: product keys, [`MapMakerResult`], the cleaned
//!   timestream (5h) and the removal of solver products and temporaries.
//!
//! The pixel-domain covariance (accumulation, inversion, application) is a
//! layer below, in [`crate::pixels::covariance`], since the `ops` builders
//! use it too.

mod binning;
mod config;
mod confine;
mod flags;
mod fused;
mod plan;
mod products;
mod solve;
mod vectors;

pub use config::{MapMakerConfig, MapMakerSetup};
pub use plan::{
    DetectorData, ExecutionPlan, FusedForm, KernelFacts, Passes, Plan, PlanFacts, PIXELS_OPERATOR,
};
pub use products::MapMakerResult;
pub use solve::DOT_TIMER;

use crate::exec::global_data::HostArray;
use crate::exec::movement::{self, close_scope, mark_host_copies, open_scope};
use crate::exec::pipeline::{
    mirror_on_host, pipeline_backend, run_operators, DetectorSets, RunOptions,
};
use crate::ops::{BinnerConfig, PixelsHealpix, PointingDetector, PointingOps, StokesWeights};
use products::Keys;
use toast_accel::host::Dispatcher;
use toast_core::{Category, Data, ExecContext, OpError, Operator, Requirements, Residence};

/// The destriping map-maker (see the module documentation).
#[derive(Debug, Clone)]
pub struct MapMaker {
    setup: MapMakerSetup,
    solve_pointing: PointingOps,
    final_pointing: Option<PointingOps>,
    result: Option<MapMakerResult>,
    /// Pointing fields that existed before the run (never deleted).
    preexisting: Vec<String>,
    /// How this run holds and reads the pointing: chosen once at the start
    /// of [`MapMaker::run`] ([`MapMaker::choose_plan`]); every pass reads
    /// its mode from here.
    plan: Plan,
    /// Use pixels and weights already present (with `full_pointing`)
    /// instead of expanding them: see [`MapMaker::reuse_pointing`].
    reuse_pointing: bool,
    /// The caller reads no timestream after the run: see
    /// [`MapMaker::discard_timestream`].
    discard_timestream: bool,
    /// The caller allows fused passes (an input of the plan; on by
    /// default, see [`MapMaker::fused_passes`]).
    fused_allowed: bool,
    /// The fused passes' per-(observation, detector) finiteness of the
    /// weights (rebuilt or kept), found once per run (see `fused`).
    weights_finite: Option<std::collections::HashMap<(String, String), bool>>,
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

/// `dets` in batches of at most `batch` (> 0) detectors, in order, as even
/// as possible (12 detectors in batches of 8 make two of 6), so that
/// consecutive batches' transient fields have the same size and are
/// reused in place (see [`crate::ops::pointing_field`]).
fn batches(dets: &[String], batch: usize) -> DetectorSets {
    let n = dets.len().div_ceil(batch).max(1);
    let size = dets.len().div_ceil(n).max(1);
    DetectorSets::Sets(dets.chunks(size).map(|c| c.to_vec()).collect())
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
        let pixels = PixelsHealpix::new(
            PIXELS_OPERATOR,
            setup.pixels.clone(),
            setup.det_pointing.clone(),
        )?;
        let solve_pointing = PointingOps::new(det_pointing.clone(), pixels, weights.clone());
        let final_pointing = match setup.pixels_final.as_ref().filter(|p| p.enabled) {
            Some(p) => Some(PointingOps::new(
                det_pointing,
                PixelsHealpix::new("pixels_final", p.clone(), setup.det_pointing.clone())?,
                weights,
            )),
            None => None,
        };
        let mut mm = MapMaker {
            plan: Plan::choose(&setup.binner, &PlanFacts::default()),
            setup,
            solve_pointing,
            final_pointing,
            result: None,
            preexisting: Vec::new(),
            reuse_pointing: false,
            discard_timestream: false,
            fused_allowed: true,
            weights_finite: None,
        };
        // Until a run finds its backends: the host, unfused, with the CPU
        // plugin's pixels kernel (which writes i32 pixels).
        let kernels = KernelFacts {
            fused: false,
            i32_pixels: true,
        };
        mm.plan = Plan::choose(&mm.setup.binner, &mm.plan_facts(None, kernels));
        Ok(mm)
    }

    /// With `on`, the caller reads no detector timestream nor pointing
    /// after the run (the satellite workflow drops them before
    /// writing the maps): a device run does not copy the cleaned timestream
    /// back (the size of the timestream, the largest copy back after the
    /// solve) and instead removes the host fields whose newest copy was on
    /// the device (`det_data` when cleaned in place, `{name}_cleaned`, the
    /// pointing), so no stale copy is left behind; and the host never makes
    /// pointing of its own (32 bytes a detector sample of host memory and
    /// a host pass). Host runs are unchanged. Off by default (TOAST's map-maker
    /// leaves the cleaned timestream in the data).
    pub fn discard_timestream(&mut self, on: bool) {
        self.discard_timestream = on;
    }

    /// With `on`, a run with `binner.full_pointing` whose solver pixels and
    /// weights fields are already present in every observation uses them
    /// instead of expanding its own (on the host; a device scope still
    /// expands its device copy, from the boresight, and takes the host's as
    /// equal). The caller guarantees they were made with this map-maker's
    /// `det_pointing`, `pixels` and `weights` configuration (the satellite
    /// workflow hands over the sky scan's). Off by default, as TOAST's
    /// map-maker always expands its own.
    pub fn reuse_pointing(&mut self, on: bool) {
        self.reuse_pointing = on;
    }

    /// With `on` (the default), a host run with compact pointing runs the
    /// solver's right- and left-hand sides and the final binning passes
    /// fused, rebuilding the weights block by block in cache instead of per
    /// detector batch, and one with kept pointing (`full_pointing`) runs
    /// the solver's sides fused on the kept fields, without a work
    /// timestream (the module `fused`; byte-identical results); `false`
    /// keeps the unfused passes (to compare them).
    pub fn fused_passes(&mut self, on: bool) {
        self.fused_allowed = on;
    }

    /// The facts of a run that decide its [`Plan`] besides the
    /// configuration: the pipeline's backend (`None`: the host) and what
    /// this map-maker's setup and the data say.
    pub fn plan_facts(&self, backend: Option<(String, bool)>, kernels: KernelFacts) -> PlanFacts {
        PlanFacts::of_setup(
            &self.setup,
            backend,
            !self.preexisting.is_empty(),
            self.fused_allowed,
            kernels,
        )
    }

    /// The plan of the current (or last) run; before the first run, the
    /// plan of the setup on the host.
    pub fn plan(&self) -> &Plan {
        &self.plan
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
        // The one decision of how this run holds the pointing.
        let staged = movement::scope_open(ctx);
        let kernels = match ctx.extensions.get::<Dispatcher>() {
            Some(d) => KernelFacts::of(d.registry(), d.policy(), &self.setup.name)
                .map_err(|e| OpError::Config(format!("{}: dispatch: {e}", self.setup.name)))?,
            None => KernelFacts::default(),
        };
        let facts = self.plan_facts(
            backend.as_ref().map(|b| (b.name().to_string(), !staged)),
            kernels,
        );
        self.plan = Plan::choose(&self.setup.binner, &facts);
        tracing::debug!(
            "{}: plan {} ({:?})",
            self.setup.name,
            self.plan,
            self.plan.why
        );
        // A streamed plan stages each pass's rows of the detector data (the
        // scope's setting, restored for a caller's scope afterwards).
        let streamed = movement::streams_detector_data(ctx);
        movement::stream_detector_data(ctx, self.plan.streams_detector_data());
        let keys = Keys::new(&self.setup.name);
        let name = self.setup.name.clone();
        let result = timed(data, ctx, &name, |data, ctx| {
            self.run_scoped(data, ctx, &keys)
        });
        movement::stream_detector_data(ctx, streamed);
        let timestreams = Requirements::new()
            .detdata(&self.setup.mapmaker.det_data)
            .detdata(&keys.cleaned);
        let discard = self.discard_timestream && scope.accel;
        let mut outputs = if discard {
            Requirements::new()
        } else {
            timestreams.clone()
        };
        // A discarding caller reads no pointing either: made on the device
        // only (`expand_solve_pointing`), it is removed, not copied back.
        if self.plan.keeps_pointing() && !discard {
            outputs.extend(&self.solve_pointing.provides());
        }
        let stale = if discard {
            let mut dropped = timestreams.clone();
            dropped.extend(&self.solve_pointing.provides());
            device_newer(ctx, &dropped)
        } else {
            Vec::new()
        };
        let closed = close_scope(data, ctx, scope, &outputs);
        // In a caller's scope (this run joined it), what the map-maker drops
        // from the host it drops from the device too.
        let stale_items = stale.iter().fold(Requirements::new(), |r, f| r.detdata(f));
        let removed = movement::forget(data, ctx, &stale_items)
            .and_then(|_| Ok(data.remove_detdata(&stale)?));
        self.set_transient(false);
        self.solve_pointing.set_compact(None);
        let cleanup = self.cleanup(data, ctx, &keys);
        let mut res = result?;
        closed?;
        removed?;
        cleanup?;
        if !self.keeps_solver_products() {
            res.amplitudes = None;
        }
        self.result = Some(res.clone());
        Ok(res)
    }

    fn run_scoped(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<MapMakerResult, OpError> {
        let mm = self.setup.mapmaker.clone();
        let full = self.plan.keeps_pointing();
        let det_data = mm.det_data.clone();
        let res = MapMakerResult::default();

        // Pointing for the solve, once, when it is kept.
        if full {
            self.expand_solve_pointing(data, ctx)?;
        }
        // Else recomputed in every pass; on the host, one batch of
        // detectors at a time, from the compact pixels when asked for.
        let host_run = self.plan.host();
        let compact = self.plan.compact();
        if compact {
            self.compact_solve_pixels(data, ctx)?;
        }
        self.set_transient(self.plan.transient_pointing());
        if compact {
            let field = self.compact_field();
            self.solve_pointing.set_compact(Some(&field));
        }
        // Found again for this run's pointing (see `fused`).
        self.weights_finite = None;

        // Pixel distribution of the solve (on a device with compact
        // pointing, from the submaps the compact pass just hit).
        let pixel_dist = self.setup.binner.pixel_dist.clone();
        let hits_recorded = compact && !host_run;
        self.ensure_pixel_dist(
            data,
            ctx,
            "pixel_dist",
            &pixel_dist,
            mm.reset_pix_dist,
            !full && !hits_recorded,
            false,
        )?;
        // The pixels the samples reach, for the maps of this distribution
        // (removed at the end of the run, see `confine`).
        self.register_support(data, ctx, compact)?;
        let r = self.run_products(data, ctx, keys, res, det_data, host_run);
        self.unregister_support(data);
        r
    }

    /// The solve and the final products of [`MapMaker::run_scoped`], once
    /// the pixel distribution exists.
    fn run_products(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        mut res: MapMakerResult,
        det_data: String,
        host_run: bool,
    ) -> Result<MapMakerResult, OpError> {
        let mm = self.setup.mapmaker.clone();
        let templates = self.setup.baselines.enabled;
        let amps = if templates {
            timed(data, ctx, "SolveAmplitudes", |data, ctx| {
                self.solve_amplitudes(data, ctx, keys, &mut res)
            })?
        } else {
            // No unknowns: the empty system is solved as it stands (the
            // maps are the binned ones), not a solve that failed.
            res.converged = true;
            None
        };

        // On a device, the solver's maps leave the device before the final
        // passes (the host holds what they read of them).
        if !host_run {
            self.free_solver_maps_on_device(data, ctx, keys)?;
        }
        // 5f's hits, covariance and rcond are 5b's when nothing differs.
        let shared_cov = self.share_solver_covariance(data, keys)?;

        // The solver's work timestream and products are not read again:
        // free them before the final products (host runs; a device scope
        // keeps its buffers until it closes, so there `cleanup` does it).
        if host_run {
            self.free_solver(data, ctx, keys)?;
        }

        // 5f, 5g: hits, covariance and the binned map of the raw signal.
        self.final_covariance_and_binmap(data, ctx, keys, &mut res, shared_cov)?;

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
            if self.keeps_solver_products() {
                data.meta
                    .set_object(&keys.amplitudes, HostArray { values: x });
                res.amplitudes = Some(keys.amplitudes.clone());
            }
        }

        // 5i: the destriped map.
        self.final_map(data, ctx, keys, &cleaned_field, &mut res)?;
        res.cleaned = (templates
            && mm.save_cleaned
            && !mm.overwrite_cleaned
            && cleaned_field == keys.cleaned)
            .then(|| keys.cleaned.clone());
        Ok(res)
    }

    /// The solver's pointing (`full_pointing`), expanded once for all
    /// detectors. Nothing reads the quaternions again unless the final maps
    /// have their own pixelization: they are expanded per detector batch,
    /// each pass replacing the previous batch's (host runs, see
    /// `PointingDetector::transient`), and the last batch is freed (32 bytes
    /// a sample); on a device, where they are expanded per batch too (all
    /// at once with `binner.pointing_batch = 0`), the last batch's device
    /// copy is freed as well.
    fn expand_solve_pointing(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
    ) -> Result<(), OpError> {
        let quats = self.setup.det_pointing.quats.clone();
        let drop_quats = self.final_pointing.is_none() && !self.preexisting.contains(&quats);
        // `run_operators` intersects each set with the selection.
        let opts = RunOptions {
            detector_sets: self.batched_sets(data, drop_quats),
            ..RunOptions::default()
        };
        let staged = movement::scope_open(ctx);
        let have = |f: &str| data.obs.iter().all(|ob| ob.detdata.contains(f));
        // On a device no host step reads pointing (binning, covariance,
        // solver flags and templates are kernels on the device copies; a
        // kernel a dispatch override sends to the CPU gets the device's
        // copy, a download the ledger counts), so the host has pointing
        // only for a caller that reads it afterwards: none when the caller
        // discards the detector data ([`MapMaker::discard_timestream`]).
        let host_copy = !(staged && self.discard_timestream);
        let reuse = self.reuse_pointing
            && have(self.solve_pointing.pixels_field())
            && have(self.solve_pointing.weights_field());
        if reuse && !staged {
            return Ok(());
        }
        self.solve_pointing.det_pointing.transient = drop_quats;
        let provides = self.solve_pointing.provides();
        let r = {
            let mut ops = self.solve_pointing.operators();
            if !staged {
                run_operators("pointing", &mut ops, data, ctx, &opts)
            } else {
                // The device's copy, whole (the quaternions per detector
                // set when nobody reads them again, as on the host: 32
                // bytes a detector sample never all on the device), then
                // the host's for the caller: the one it handed over, or its
                // own, recomputed from the boresight; either way none
                // crosses the bus.
                match run_operators("pointing", &mut ops, data, ctx, &opts) {
                    Ok(()) if !host_copy => Ok(()),
                    Ok(()) if reuse => mark_host_copies(data, ctx, &provides),
                    Ok(()) => mirror_on_host("pointing_host", &mut ops, data, ctx, &opts),
                    Err(e) => Err(e),
                }
            }
        };
        self.solve_pointing.det_pointing.transient = false;
        r?;
        if drop_quats {
            // Gone from the device too: no later step reads the last
            // batch's quaternions (32 bytes a sample of a batch detector).
            movement::forget(data, ctx, &Requirements::new().detdata(&quats))?;
            data.remove_detdata(&[&quats])?;
        }
        Ok(())
    }

    /// The final hits, covariance and rcond (5f) are the solver's (5b)
    /// when they are made from the same samples with the same settings:
    /// the solve ran, there is no separate final binner or pixelization,
    /// the two rcond thresholds are equal, no inverse covariance is asked
    /// for, and the solver's products are not kept. The solver's flags cut
    /// what the binner's flags cut plus the samples outside the pointing's
    /// view, which the covariance pass skips anyway, and 5c marks them only
    /// after 5b; so the pass would give the same bits. Then the solver's
    /// products are moved under the final keys (no copy) and `true` is
    /// returned: the pass runs once instead of twice.
    fn share_solver_covariance(&self, data: &mut Data, keys: &Keys) -> Result<bool, OpError> {
        let mm = &self.setup.mapmaker;
        let same = self.setup.baselines.enabled
            && self.final_pointing.is_none()
            && std::ptr::eq(self.final_binner(), &self.setup.binner)
            && mm.solve_rcond_threshold.to_bits() == mm.map_rcond_threshold.to_bits()
            && !mm.write_invcov
            && !self.keeps_solver_products()
            && [&keys.solve_hits, &keys.solve_cov, &keys.solve_rcond]
                .iter()
                .all(|k| data.meta.contains(k));
        if same {
            data.meta.rename(&keys.solve_hits, keys.hits.clone())?;
            data.meta.rename(&keys.solve_cov, keys.cov.clone())?;
            data.meta.rename(&keys.solve_rcond, keys.rcond.clone())?;
        }
        Ok(same)
    }

    /// The i32 field of the compact pixels.
    pub(super) fn compact_field(&self) -> String {
        format!("{}_compact_pixels", self.setup.name)
    }

    /// The compact pixels of the solver's pixelization, once: the
    /// quaternions of each batch of `binner.pointing_batch` detectors (a
    /// transient field) and their pixels, which `pixels_healpix` writes as
    /// i32 straight into [`MapMaker::compact_field`] (ABI minor 8: no i64
    /// field); the quaternions are then dropped. On a device both live
    /// there, and the kernel records the submaps hit for the pixel
    /// distribution.
    fn compact_solve_pixels(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
    ) -> Result<(), OpError> {
        let opts = RunOptions {
            detector_sets: self.batched_sets(data, true),
            ..RunOptions::default()
        };
        let compact = self.compact_field();
        let p = &mut self.solve_pointing;
        // The hits this pass records are the pixel distribution's: none
        // left over from an earlier run may join them.
        p.pixels.take_hit_submaps(ctx)?;
        let wide = std::mem::replace(&mut p.pixels.config.pixels, compact);
        p.pixels.compact = true;
        p.det_pointing.transient = true;
        let r = run_operators(
            "pointing",
            &mut [&mut p.det_pointing, &mut p.pixels],
            data,
            ctx,
            &opts,
        );
        p.det_pointing.transient = false;
        p.pixels.compact = false;
        p.pixels.config.pixels = wide;
        r?;
        // The last batch's quaternions, on the device too.
        let quats = self.setup.det_pointing.quats.clone();
        if !self.preexisting.contains(&quats) {
            movement::forget(data, ctx, &Requirements::new().detdata(&quats))?;
        }
        self.drop_pointing(data)
    }

    /// Make the pointing operators' outputs transient (or not).
    fn set_transient(&mut self, on: bool) {
        self.solve_pointing.set_transient(on);
        if let Some(p) = &mut self.final_pointing {
            p.set_transient(on);
        }
    }

    /// The detector sets of a pass that expands pointing: with transient
    /// pointing and a `binner.pointing_batch` of `n > 0`, the local
    /// detectors in batches of `n` (in order, so every map sum is the same
    /// as one pass's), else all at once. A pass over batches runs its
    /// global resets first, over all detectors (see
    /// [`crate::ops::binning`]'s `bin_map`).
    pub(super) fn pointing_sets(&self, data: &Data) -> DetectorSets {
        self.batched_sets(data, self.plan.transient_pointing())
    }

    /// The detector sets of the solver's passes over its work timestream
    /// (`{name}_temp`): on the host with a `binner.pointing_batch` of `n >
    /// 0`, the local detectors in batches of `n`, each batch's timestream
    /// made, used and replaced by the next one's, so it never exists for
    /// all detectors (8 bytes a sample saved); else all at once. The
    /// per-detector arithmetic and the map sums' order are those of one
    /// pass, so the results do not depend on it. With transient pointing
    /// these are the [`MapMaker::pointing_sets`].
    fn work_sets(&self, data: &Data) -> DetectorSets {
        self.batched_sets(data, self.plan.work_batches())
    }

    /// The local detectors in [`batches`] of `binner.pointing_batch` when
    /// `on` and the batch is not 0, else all at once.
    pub(super) fn batched_sets(&self, data: &Data, on: bool) -> DetectorSets {
        let batch = self.setup.binner.pointing_batch;
        if !on || batch == 0 {
            return DetectorSets::All;
        }
        batches(&data.all_local_detectors(0), batch)
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
}

/// The detdata fields among `items` whose newest copy is on the device in
/// the open device scope.
fn device_newer(ctx: &ExecContext, items: &Requirements) -> Vec<String> {
    items
        .items()
        .into_iter()
        .filter(|it| movement::residence(ctx, it) == Some(Residence::DeviceNewer))
        .map(|it| it.name)
        .collect()
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
            cfg.flags().add_requirements(&mut r);
            r.add(Category::Meta, &cfg.noise_model);
        }
        if let Some(nm) = &self.setup.baselines.noise_model {
            r.add(Category::Meta, nm);
        }
        if let Some(v) = &self.setup.baselines.view {
            r.add(Category::Intervals, v);
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
        if self.plan.keeps_pointing() {
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
