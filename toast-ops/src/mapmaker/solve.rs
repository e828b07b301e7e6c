//! Solving for the offset amplitudes (TOAST's `SolveAmplitudes`, steps
//! 5a–5e): the solver flags, the solver's hits and covariance, the rcond
//! mask, the offset template and the right-hand side (`SolverRHS`), then
//! the PCG loop with the diagonal preconditioner, each iteration applying
//! the left-hand side once (`SolverLHS`).

use super::binning::CovKeys;
use super::flags::{SolverFlagBits, SolverFlagsStep};
use super::fused::StepInput;
use super::products::{Keys, MapMakerResult};
use super::vectors::{VectorOp, VectorStep};
use super::{timed, MapMaker};
use crate::exec::global_data::HostArray;
use crate::exec::kernels::amp_dot_blocks;
use crate::exec::movement::bus::{BusBytes, CgTransfers};
use crate::exec::movement::{self, forget, with_host_step};
use crate::exec::pipeline::{detector_passes, run_operators, DetectorSets, OpRef, RunOptions};
use crate::ops::binning::{bin_map, BinPass, PassPointing};
use crate::ops::{
    CopyDetData, FlagSelection, NoiseWeight, NoiseWeightConfig, ResetData, ScanMap, ScanMapConfig,
};
use crate::pixels::PixelData;
use crate::templates::offset::{
    OffsetAddToSignal, OffsetApplyPrecond, OffsetInit, OffsetProjectSignal,
};
use crate::templates::OffsetTemplate;
use std::sync::Arc;
use toast_core::{comm_of, Data, ExecContext, OpError, Operator, ReduceOp, Requirements};

/// Timer frame of the CG dot-product reductions.
pub const DOT_TIMER: &str = "allreduce_dot";

/// The template and its solved amplitudes.
pub(super) type Solved = (Arc<OffsetTemplate>, Vec<f64>);

/// Host step `step`: the amplitude vector `key` of `data.meta`, read on
/// the host (staged back from the device first when a scope holds it).
fn read_amps(
    data: &mut Data,
    ctx: &mut ExecContext,
    step: &str,
    key: &str,
) -> Result<Vec<f64>, OpError> {
    with_host_step(
        data,
        ctx,
        step,
        Requirements::new().global(key),
        Requirements::new(),
        |data, _| Ok(data.meta.object::<HostArray<f64>>(key)?.values.clone()),
    )
}

/// The name of the solver's vector steps (dispatch, timers, kernel log).
const PCG_OPERATOR: &str = "pcg";

/// `y ← (α x) + (β y)` on the amplitude vectors `x`, `y` (global items),
/// as a pipeline step (on the device inside a device scope).
fn axpby(
    data: &mut Data,
    ctx: &mut ExecContext,
    (alpha, x): (f64, &str),
    (beta, y): (f64, &str),
) -> Result<(), OpError> {
    let mut op = VectorOp {
        name: PCG_OPERATOR.into(),
        step: VectorStep::Axpby {
            alpha,
            x: x.to_string(),
            beta,
            y: y.to_string(),
        },
    };
    run_operators(
        "pcg_axpby",
        &mut [&mut op],
        data,
        ctx,
        &RunOptions::default(),
    )
}

/// The job-wide flagged `Σ a_i b_i` of the amplitude vectors `a`, `b`
/// (flags: the template's amplitude flags): the per-block partial sums
/// (`partials`, one block on the host and host-addressable backends, so the
/// sequential sum in index order), downloaded and added in block order,
/// then an allreduce over the processes (timed as [`DOT_TIMER`]).
fn gdot(
    data: &mut Data,
    ctx: &mut ExecContext,
    (a, b): (&str, &str),
    flags: &str,
    partials: &str,
) -> Result<f64, OpError> {
    let mut op = VectorOp {
        name: PCG_OPERATOR.into(),
        step: VectorStep::Dot {
            a: a.to_string(),
            b: b.to_string(),
            flags: flags.to_string(),
            partials: partials.to_string(),
        },
    };
    run_operators("pcg_dot", &mut [&mut op], data, ctx, &RunOptions::default())?;
    let p = read_amps(data, ctx, "read_dot", partials)?;
    let mut v = [p.iter().fold(0.0, |s, x| s + x)];
    let comm = comm_of(ctx);
    if comm.size() > 1 {
        ctx.timers.enter(DOT_TIMER)?;
        let r = comm.allreduce_f64(&mut v, ReduceOp::Sum);
        ctx.timers.exit(DOT_TIMER)?;
        r.map_err(|source| OpError::Comm {
            what: "PCG dot product".into(),
            source,
        })?;
    }
    Ok(v[0])
}

/// The global key of the solver flags' counts (a `HostArray<i64>` of 2).
fn flag_counts_key(keys: &Keys) -> String {
    format!("{}_counts", keys.solve_flags)
}

/// Free the device copies of the global items `keys` (without copying them
/// back) and remove them.
fn drop_globals(data: &mut Data, ctx: &mut ExecContext, keys: &[&str]) -> Result<(), OpError> {
    let items = keys
        .iter()
        .fold(Requirements::new(), |r, k| r.global(k.to_string()));
    forget(data, ctx, &items)?;
    for k in keys {
        data.meta.remove(k);
    }
    Ok(())
}

impl MapMaker {
    /// 5a-5e. Returns the template and the solved amplitudes, or `None` when
    /// there is nothing to solve.
    pub(super) fn solve_amplitudes(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        res: &mut MapMakerResult,
    ) -> Result<Option<Solved>, OpError> {
        let mm = self.setup.mapmaker.clone();
        let binner = self.setup.binner.clone();

        // 5a: solver flags.
        self.solver_flags(data, ctx, keys)?;

        // 5b: solver hits and covariance.
        let solve_sel = self.solver_selection(keys, binner.shared_flag_mask);
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
                !self.plan.keeps_pointing(),
                false,
            )
        })?;

        // The hits came back once; no device step reads them again.
        movement::release(data, ctx, &Requirements::new().global(&keys.solve_hits))?;

        // 5c: flag samples in poorly conditioned pixels (bit 4).
        self.rcond_mask(data, ctx, keys, res)?;

        // 5d: the template and the right-hand side.
        let Some(tmpl) = self.offset_template(data, ctx, keys, res)? else {
            return Ok(None);
        };
        // The solver's map visits only the pixels its samples reach.
        self.confine_solver_map(data, keys)?;
        let solved = timed(data, ctx, "SolverRHS", |data, ctx| {
            self.rhs(data, ctx, &tmpl, keys)
        })
        .and_then(|()| {
            // 5e: PCG.
            timed(data, ctx, "solve", |data, ctx| {
                self.pcg(data, ctx, &tmpl, keys, res)
            })
        });
        Self::unconfine_solver_map(data, keys);
        Ok(Some((tmpl, solved?)))
    }

    /// The samples the solver uses: the binner's detectors and shared
    /// flags (with `shared_flag_mask`), and any bit of the solver flags.
    pub(super) fn solver_selection(&self, keys: &Keys, shared_flag_mask: u8) -> FlagSelection {
        let binner = &self.setup.binner;
        FlagSelection {
            det_mask: binner.det_mask,
            det_flags: Some(keys.solve_flags.clone()),
            det_flag_mask: 255,
            shared_flags: binner.shared_flags.clone(),
            shared_flag_mask,
        }
    }

    /// 5a: the solver flags (`{name}_solve_flags`): bit 1 where the binner's
    /// flags cut the sample or the sample lies outside the pointing's view
    /// (the `solver_flags` kernel, where the run's data is).
    fn solver_flags(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<(), OpError> {
        // The kernel ORs into the field: a stale one (a caller's, or an
        // earlier run's) goes first, so it starts from zeros.
        let sf = keys.solve_flags.clone();
        forget(data, ctx, &Requirements::new().detdata(&sf))?;
        data.remove_detdata(&[&sf])?;
        let binner = &self.setup.binner;
        let flags0 = binner.flags();
        let owned = |f: Option<(&str, u8)>| f.map(|(n, m)| (n.to_string(), m));
        let mut step = SolverFlagsStep {
            name: "solver_flags".into(),
            bits: SolverFlagBits::Selection {
                det_flags: owned(flags0.det()),
                shared_flags: owned(flags0.shared()),
            },
            det_mask: binner.det_mask,
            view: self.solve_pointing.view().map(str::to_string),
            flags: keys.solve_flags.clone(),
            counts: flag_counts_key(keys),
        };
        // Per batch when the detector data are streamed (the kernel is per
        // detector: the same flags either way).
        let opts = RunOptions {
            detector_sets: self.batched_sets(data, self.plan.streams_detector_data()),
            ..RunOptions::default()
        };
        let r = run_operators(
            "solver_flags",
            &mut [&mut step as OpRef<'_>],
            data,
            ctx,
            &opts,
        );
        // 5a's counts are not reported (5c's are, of the final flags).
        let dropped = drop_globals(data, ctx, &[&step.counts]);
        r?;
        dropped
    }

    /// 5c: bit 4 of the solver flags on every sample in a pixel whose
    /// solver rcond is below `solve_rcond_threshold` (TOAST's `ScanMask`;
    /// the `solver_flags` kernel with the mask of those pixels, made on the
    /// host from the rcond map); counts the samples the solver flags cut.
    fn rcond_mask(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        res: &mut MapMakerResult,
    ) -> Result<(), OpError> {
        let threshold = self.setup.mapmaker.solve_rcond_threshold;
        let mask_key = format!("{}_mask", keys.solve_rcond);
        let rcond_key = keys.solve_rcond.clone();
        let mask = with_host_step(
            data,
            ctx,
            "rcond_mask_map",
            Requirements::new().global(&rcond_key),
            Requirements::new(),
            |data, _| {
                let rcond = data.meta.object::<PixelData<f64>>(&rcond_key)?;
                let mut mask = PixelData::<u8>::try_new(
                    Arc::clone(rcond.distribution()),
                    1,
                    "the solver's rcond mask",
                )?;
                let nv = rcond.n_value().max(1);
                for (m, r) in mask
                    .data_mut()
                    .iter_mut()
                    .zip(rcond.data().chunks_exact(nv))
                {
                    *m = u8::from(r[0] < threshold);
                }
                Ok(mask)
            },
        )?;
        data.meta.set_object(&mask_key, mask);
        let mut step = SolverFlagsStep {
            name: "solver_flags".into(),
            bits: SolverFlagBits::RcondMask {
                pixels: self.solve_pointing.pixels_field().to_string(),
                pixel_dist: self.setup.binner.pixel_dist.clone(),
                mask: mask_key.clone(),
            },
            det_mask: self.setup.binner.det_mask,
            view: self.solve_pointing.view().map(str::to_string),
            flags: keys.solve_flags.clone(),
            counts: flag_counts_key(keys),
        };
        let counts = self.rcond_mask_passes(data, ctx, &mut step);
        let dropped = drop_globals(data, ctx, &[&step.counts, &mask_key]);
        let (cut, total) = counts?;
        dropped?;
        res.solver_cut_samples = cut;
        res.solver_total_samples = total;
        if total > 0 {
            tracing::info!(
                "{}: solver flags cut {cut} / {total} = {:.2}% of samples",
                self.setup.name,
                100.0 * cut as f64 / total as f64
            );
        }
        Ok(())
    }

    /// [`MapMaker::rcond_mask`]'s kernel passes: per detector batch with
    /// transient pointing (each batch's pixels recomputed first), else
    /// one; returns the cut and total samples.
    fn rcond_mask_passes(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        step: &mut SolverFlagsStep,
    ) -> Result<(u64, u64), OpError> {
        let passes = detector_passes(data, ctx, &self.pointing_sets(data));
        let saved = ctx.detectors.clone();
        let mut failed = None;
        for sel in passes {
            ctx.detectors = sel;
            let mut ops: Vec<OpRef<'_>> = Vec::new();
            if !self.plan.keeps_pointing() {
                ops = self.solve_pointing.operators();
                ops.truncate(2);
            }
            ops.push(step);
            let r = run_operators("rcond_mask", &mut ops, data, ctx, &RunOptions::default());
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        ctx.detectors = saved;
        if let Some(e) = failed {
            return Err(e);
        }
        let counts = step.counts.clone();
        with_host_step(
            data,
            ctx,
            "rcond_mask_counts",
            Requirements::new().global(&counts),
            Requirements::new(),
            |data, _| {
                let c = &data.meta.object::<HostArray<i64>>(&counts)?.values;
                Ok((c[0] as u64, c[1] as u64))
            },
        )
    }

    /// 5d, first half: the offset template, its amplitudes flagged from the
    /// solver flags, and the zeroed amplitude vectors of the solve; `None`
    /// when the job has no amplitudes.
    fn offset_template(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        res: &mut MapMakerResult,
    ) -> Result<Option<Arc<OffsetTemplate>>, OpError> {
        let view = self.solve_pointing.view().map(str::to_string);
        let init = OffsetInit {
            det_data: &self.setup.mapmaker.det_data,
            det_mask: self.setup.binner.det_mask,
            det_flags: Some((&keys.solve_flags, 255)),
            view: view.as_deref(),
        };
        let config = self.setup.baselines.clone();
        let tmpl = if movement::scope_open(ctx) {
            // On a device the good samples are counted where the solver
            // flags are: no flag crosses the bus.
            let mut t = OffsetTemplate::lay_out("baselines", config, data, ctx, init)?;
            let good = self.good_samples_on_device(data, ctx, &t, keys)?;
            t.flag_and_weigh(data, &good)?;
            t
        } else {
            OffsetTemplate::initialize("baselines", config, data, ctx, init)?
        };
        // Job-wide counts (every process must take the same branch below).
        let mut counts = [tmpl.n_amplitudes() as i64, tmpl.n_flagged() as i64];
        comm_of(ctx)
            .allreduce_i64(&mut counts, ReduceOp::Sum)
            .map_err(|source| OpError::Comm {
                what: format!("{}: amplitude counts", self.setup.name),
                source,
            })?;
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
            &keys.solution,
        ] {
            data.meta.set_object(k, tmpl.zeros());
        }
        Ok(Some(tmpl))
    }

    /// The good samples of each amplitude's span of `tmpl` (just laid out,
    /// nothing flagged), counted on the device where the solver flags are:
    /// `Fᵀ` over the unflagged samples of `F 1`, a timestream of ones on
    /// the template's spans (the template's own kernels; sums of ones,
    /// exact in any order). The amplitudes' worth of counts comes back.
    /// The work field holds one detector batch (`binner.pointing_batch`) at
    /// a time, 8 bytes a sample of a batch detector, and is freed.
    fn good_samples_on_device(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &OffsetTemplate,
        keys: &Keys,
    ) -> Result<Vec<i64>, OpError> {
        let t = Arc::new(tmpl.clone());
        let n = t.n_amplitudes();
        let ones = format!("{}_good_ones", self.setup.name);
        let good = format!("{}_good", self.setup.name);
        let field = format!("{}_good_temp", self.setup.name);
        data.meta.set_object(
            &ones,
            HostArray {
                values: vec![1.0f64; n],
            },
        );
        data.meta.set_object(&good, HostArray::<f64>::zeros(n));
        let mut zero = ResetData {
            name: "reset_good".into(),
            detdata: vec![field.clone()],
            global: Vec::new(),
            transient: true,
        };
        let mut add = OffsetAddToSignal {
            name: "template_matrix".into(),
            template: Arc::clone(&t),
            amplitudes: ones.clone(),
            det_data: field.clone(),
        };
        let mut project = OffsetProjectSignal {
            name: "template_matrix".into(),
            template: Arc::clone(&t),
            det_data: field.clone(),
            det_flags: Some((keys.solve_flags.clone(), 255)),
            amplitudes: good.clone(),
        };
        let batches = RunOptions {
            detector_sets: self.batched_sets(data, true),
            ..RunOptions::default()
        };
        let counted = run_operators(
            "good_samples",
            &mut [&mut zero as OpRef<'_>, &mut add, &mut project],
            data,
            ctx,
            &batches,
        )
        .and_then(|()| {
            with_host_step(
                data,
                ctx,
                "good_samples",
                Requirements::new().global(&good),
                Requirements::new(),
                |data, _| {
                    let v = &data.meta.object::<HostArray<f64>>(&good)?.values;
                    Ok(v.iter().map(|&x| x as i64).collect::<Vec<i64>>())
                },
            )
        });
        // The template's zero flags and variances go too: the host's are
        // replaced by the counts' (`flag_and_weigh`).
        let dropped = forget(
            data,
            ctx,
            &Requirements::new()
                .detdata(&field)
                .global(t.flags_key())
                .global(t.var_key()),
        )
        .and_then(|_| Ok(data.remove_detdata(&[&field])?))
        .and_then(|()| drop_globals(data, ctx, &[&ones, &good]));
        let counted = counted?;
        dropped?;
        Ok(counted)
    }

    /// 5d, second half: the right-hand side `b = Fᵀ N⁻¹ (d - P m)` with `m`
    /// the solver's binned map of `d` (`{name}_solve_bin`,
    /// `{name}_solve_rhs`; TOAST's `SolverRHS`).
    fn rhs(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        if let Some(fused) = self.fused_applies(data, Some(tmpl))? {
            return self.rhs_fused(data, ctx, (tmpl, fused), keys);
        }
        let mm = self.setup.mapmaker.clone();
        let binner = self.setup.binner.clone();
        let full = self.plan.keeps_pointing();
        let pass = BinPass {
            name: "solver_binning",
            config: &binner,
            covariance: &keys.solve_cov,
            binned: &keys.solve_bin,
            det_data: &mm.det_data,
            flags: self.solver_selection(keys, 0),
            noiseweighted: None,
            covariance_on_device: true,
        };
        let sets = self.work_sets(data);
        let pointing = PassPointing::of(&mut self.solve_pointing, full);
        bin_map(data, ctx, pass, pointing, Vec::new(), &sets)?;
        if self.device_fused_applies(data, tmpl)? {
            // On a device, no work copy: `fused_project` reads the pass's
            // (or batch's) rows of the timestream.
            let input = StepInput::Timestream(mm.det_data.clone());
            let pass = (self.device_pass(tmpl, keys), keys);
            let output = ("reset_rhs", keys.rhs.as_str());
            return self.project_device(data, ctx, pass, ("SolverRHS", input, output), !full);
        }
        // The work copy of the timestream: on the host per detector batch
        // when batched; on a device one whole-field copy before the batches
        // (the copy kernel has no row selection: a batch's copy would go
        // through the host and send the whole field up again), or, with the
        // detector data streamed, per batch on the device (a batch's rows
        // are what it holds of both fields).
        let host = self.plan.host();
        let mut copy = CopyDetData {
            name: "copy_rhs".into(),
            input: mm.det_data.clone(),
            output: keys.temp.clone(),
            det_mask: binner.det_mask,
            transient: host && self.plan.work_batches(),
        };
        let head: Vec<OpRef<'_>> = if host || self.plan.streams_detector_data() {
            vec![&mut copy]
        } else {
            let all = RunOptions::default();
            run_operators("SolverRHS", &mut [&mut copy as OpRef<'_>], data, ctx, &all)?;
            Vec::new()
        };
        let mut tail = self.projection_ops(tmpl, keys, "reset_rhs", &keys.rhs)?;
        self.run_projection(data, ctx, "SolverRHS", head, (!full, false), &mut tail)
    }

    /// Run `head`, the solver's pointing operators (when `expand`) and the
    /// projection `tail` of [`MapMaker::projection_ops`] as the pipeline
    /// `name`. With detector batches ([`MapMaker::work_sets`]), the tail's
    /// amplitude reset runs first over all detectors, then `head` and the
    /// rest once per batch (re-expanding the batch's pointing when it is
    /// transient), unless the tail's kernels rebuild the pointing
    /// themselves (`rebuilt`: the fused device steps of compact pointing,
    /// which then run once for all detectors).
    pub(super) fn run_projection(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        name: &str,
        head: Vec<OpRef<'_>>,
        (expand, rebuilt): (bool, bool),
        tail: &mut [Box<dyn Operator>],
    ) -> Result<(), OpError> {
        // The fused steps of compact pointing make nothing per batch: one
        // call per observation for all detectors.
        let sets = if rebuilt {
            DetectorSets::All
        } else {
            self.work_sets(data)
        };
        let mut ops = head;
        let batched = sets != DetectorSets::All;
        let rest = if batched {
            let (reset, rest) = tail.split_at_mut(1);
            let mut first: Vec<OpRef<'_>> = reset
                .iter_mut()
                .map(|op| op.as_mut() as OpRef<'_>)
                .collect();
            run_operators(name, &mut first, data, ctx, &RunOptions::default())?;
            rest
        } else {
            tail
        };
        if !rebuilt && (expand || (batched && self.plan.transient_pointing())) {
            ops.extend(self.solve_pointing.operators());
        }
        for op in rest.iter_mut() {
            ops.push(op.as_mut());
        }
        let opts = RunOptions {
            detector_sets: sets,
            ..RunOptions::default()
        };
        run_operators(name, &mut ops, data, ctx, &opts)
    }

    /// Zero `amplitudes` (operator `reset_name`), scan-subtract the
    /// solver's binned map from the temporary timestream, noise weight it,
    /// project into `amplitudes`.
    fn projection_ops(
        &self,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        reset_name: &str,
        amplitudes: &str,
    ) -> Result<Vec<Box<dyn Operator>>, OpError> {
        let reset = amplitude_reset(reset_name, amplitudes);
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
        Ok(vec![
            Box::new(reset),
            Box::new(scan),
            Box::new(nw),
            Box::new(project),
        ])
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
        if let Some(fused) = self.fused_applies(data, Some(tmpl))? {
            return self.lhs_fused(data, ctx, (tmpl, fused), keys);
        }
        if self.device_fused_applies(data, tmpl)? {
            return self.lhs_device(data, ctx, tmpl, keys);
        }
        let binner = self.setup.binner.clone();
        let full = self.plan.keeps_pointing();
        let solver_bin_flags = self.solver_selection(keys, 0);
        // F d into a zeroed timestream, binned. On the host the timestream
        // exists for one detector batch at a time ([`MapMaker::work_sets`]),
        // and `F d` is rebuilt for the projection below (the same values).
        let batched = self.plan.work_batches();
        let mut zero = ResetData {
            name: "reset_lhs".into(),
            detdata: vec![keys.temp.clone()],
            global: Vec::new(),
            transient: batched,
        };
        let mut add = OffsetAddToSignal {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            amplitudes: keys.lhs_in.clone(),
            det_data: keys.temp.clone(),
        };
        let (mut zero2, mut add2) = (zero.clone(), add.clone());
        let pass = BinPass {
            name: "solver_binning",
            config: &binner,
            covariance: &keys.solve_cov,
            binned: &keys.solve_bin,
            det_data: &keys.temp,
            flags: solver_bin_flags,
            noiseweighted: None,
            covariance_on_device: true,
        };
        let sets = self.work_sets(data);
        let pointing = PassPointing::of(&mut self.solve_pointing, full);
        let pre: Vec<OpRef<'_>> = vec![&mut zero, &mut add];
        bin_map(data, ctx, pass, pointing, pre, &sets)?;
        // Z, N⁻¹, Fᵀ on the same timestream, rebuilt per batch when batched
        // (else the pointing and timestream that the binning left are
        // reused).
        let head: Vec<OpRef<'_>> = if batched {
            vec![&mut zero2, &mut add2]
        } else {
            Vec::new()
        };
        let mut tail = self.projection_ops(tmpl, keys, "reset_lhs_out", &keys.lhs_out)?;
        self.run_projection(data, ctx, "SolverLHS", head, (false, false), &mut tail)
    }

    /// `s = M⁻¹ r` with the offset template's diagonal preconditioner
    /// (`keys.residual` into `keys.precond`, where they live: on the device
    /// inside a device scope).
    fn precond(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let mut op = OffsetApplyPrecond {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            input: keys.residual.clone(),
            output: keys.precond.clone(),
        };
        run_operators("precond", &mut [&mut op], data, ctx, &RunOptions::default())
    }

    /// The PCG solve of TOAST's `solve()` from a zero starting vector, on
    /// the amplitude vectors as global items: `b` (`keys.rhs`), `x`
    /// (`keys.solution`), `r` (`keys.residual`), `s` (`keys.precond`), `d`
    /// (`keys.lhs_in`) and `q = A d` (`keys.lhs_out`). Every step is a
    /// pipeline step, so in the map-maker's device scope the vectors stay
    /// on the device and per iteration only the dot products' partial sums
    /// come back (three per iteration); `x` comes back once, at the end.
    /// On the host the arithmetic is the same as TOAST's numpy in the same
    /// order (one block per dot product: the sequential sum).
    fn pcg(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        res: &mut MapMakerResult,
    ) -> Result<Vec<f64>, OpError> {
        let mm = self.setup.mapmaker.clone();
        let flags = tmpl.flags_key();
        let n = data.meta.object::<HostArray<f64>>(&keys.rhs)?.values.len();
        let nblock = amp_dot_blocks(ctx, PCG_OPERATOR, n)?;
        data.meta
            .set_object(&keys.dot_partials, HostArray::<f64>::zeros(nblock));
        let (b, x, r, s, d, q) = (
            keys.rhs.as_str(),
            keys.solution.as_str(),
            keys.residual.as_str(),
            keys.precond.as_str(),
            keys.lhs_in.as_str(),
            keys.lhs_out.as_str(),
        );
        let p = keys.dot_partials.as_str();
        // x = 0 where it lives (zeroed on the device, not uploaded); r = b -
        // A·0 = b exactly.
        let mut zero_x = amplitude_reset("reset_solution", x);
        run_operators(
            "pcg_init",
            &mut [&mut zero_x],
            data,
            ctx,
            &RunOptions::default(),
        )?;
        axpby(data, ctx, (1.0, b), (0.0, r))?;
        self.precond(data, ctx, tmpl, keys)?;
        // d = s, exactly.
        axpby(data, ctx, (1.0, s), (0.0, d))?;
        let mut sqsum = gdot(data, ctx, (b, b), &flags, p)?;
        let sqsum_init = sqsum;
        let mut sqsum_best = sqsum;
        let mut last_best = sqsum;
        let mut delta = gdot(data, ctx, (d, r), &flags, p)?;
        res.initial_residual = sqsum_init;
        tracing::info!("{}: PCG initial residual = {sqsum_init:e}", self.setup.name);
        // What crosses the bus per iteration (CgTransfers, for the run's
        // per-phase accounting).
        let before = BusBytes::now(ctx);
        let mut per_iteration = Vec::new();
        ctx.insert(CgTransfers {
            before,
            per_iteration: Vec::new(),
            after: before,
        });
        if sqsum_init == 0.0 {
            res.converged = true;
            return read_amps(data, ctx, "read_solution", x);
        }
        let mut bus = before;
        for iter in 0..mm.iter_max {
            if iter > 0 {
                let now = BusBytes::now(ctx);
                per_iteration.push(now.since(bus));
                bus = now;
            }
            if !sqsum.is_finite() {
                return Err(OpError::Numerical {
                    what: format!(
                        "{}: PCG residual is not finite ({sqsum}) at iteration {iter}",
                        self.setup.name
                    ),
                });
            }
            // q = A d
            timed(data, ctx, "SolverLHS", |data, ctx| {
                self.lhs(data, ctx, tmpl, keys)
            })?;
            let alpha = delta / gdot(data, ctx, (d, q), &flags, p)?;
            axpby(data, ctx, (alpha, d), (1.0, x))?;
            axpby(data, ctx, (-alpha, q), (1.0, r))?;
            sqsum = gdot(data, ctx, (r, r), &flags, p)?;
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
            self.precond(data, ctx, tmpl, keys)?;
            let delta_last = delta;
            delta = gdot(data, ctx, (s, r), &flags, p)?;
            let beta = delta / delta_last;
            // d = β d + s
            axpby(data, ctx, (1.0, s), (beta, d))?;
        }
        let after = BusBytes::now(ctx);
        if res.iterations > 0 {
            per_iteration.push(after.since(bus));
        }
        ctx.insert(CgTransfers {
            before,
            per_iteration,
            after,
        });
        if !res.converged && !res.stalled {
            match res.residuals.last() {
                Some(relative) => tracing::warn!(
                    "{}: PCG reached iter_max = {} without converging (relative residual {:e})",
                    self.setup.name,
                    mm.iter_max,
                    relative
                ),
                // iter_max = 0: no iteration, so no residual to give.
                None => tracing::warn!(
                    "{}: PCG reached iter_max = {} without an iteration: the offsets are the \
                     starting guess",
                    self.setup.name,
                    mm.iter_max
                ),
            }
        }
        read_amps(data, ctx, "read_solution", x)
    }
}

/// The step (`name`) that zeroes the global amplitude vector `amplitudes`
/// where it lives.
pub(super) fn amplitude_reset(name: &str, amplitudes: &str) -> ResetData {
    ResetData {
        name: name.into(),
        detdata: Vec::new(),
        global: vec![amplitudes.to_string()],
        transient: false,
    }
}
