//! The map-maker's fused passes with compact pointing, on the host.
//!
//! With `binner.compact_pointing` the unfused passes rebuild each detector
//! batch's pixels (i64) and IQU weights (3 f64) into fields of the batch's
//! length (and, in the solver, fill a work timestream), then hand them to
//! the kernels: about 40 bytes a sample written to memory and read back
//! per pass. The fused passes read only what is kept (the i32 compact
//! pixels, the flags, the boresight, the timestream or the amplitudes) and
//! rebuild the weights for blocks of [`BLOCK`] samples into a per-task
//! buffer that stays in cache, consumed at once; no per-sample array of a
//! detector's length is made and no work timestream exists. They run the
//! solver's right-hand side (`SolverRHS`), its left-hand side (`SolverLHS`,
//! twice per CG iteration in the unfused form) and the final binned and
//! destriped maps (`BinMap`):
//!
//! * **Binning** ([`Plan::accumulate`], into the pass's map): the sub-pixel
//!   axis of the map is split into one range per task, as the
//!   `build_noise_weighted` kernel does; every task walks the detectors
//!   (in the unfused pass's order: detector batch, observation, detector),
//!   views and samples in order, keeps the samples whose pixel falls in
//!   its range, rebuilds their weights (each sample's once in all, by the
//!   task that owns its pixel) and accumulates them. Each map element is
//!   summed by one task in the unfused order, so the map is bit-identical
//!   to the unfused pass's for any thread count. The sum over the job and
//!   the covariance follow as in [`crate::ops::binning`].
//! * **Projection** ([`Plan::project`], the solver's `Fᵀ N⁻¹ (t - P m)`):
//!   tasks of about 16384 samples over (observation, detector, view,
//!   amplitude range), as the `template_offset_project_signal` kernel's;
//!   each rebuilds the weights of its samples block by block, scans the
//!   map, subtracts, noise weights and sums each amplitude's good samples
//!   in sample order.
//!
//! Every value is the unfused path's, operation for operation: the work
//! timestream `0 + a` (the zeroed timestream plus the amplitude, `0` under
//! a flagged amplitude) or the copied signal, the accumulation's `(d ·
//! w_det) · w_i`, the scan's `0 + Σ w_i m_i` in component order, the noise
//! weight, the projection's `+ (good ? t : 0)`, and the weights from the
//! same function as [`crate::ops::ExpandCompactPointing`]'s. The one
//! shortcut is exact: a sample of value ±0 is left out of the accumulation
//! where it adds ±0 to a map value that cannot be `-0`
//! (`DetPass::zero_skips`); on xsmall most amplitudes are flagged, so the
//! left-hand side's binning skips most detectors. So the solution and the
//! maps are byte-identical to the unfused compact passes' (test
//! `fused_passes_are_the_unfused_ones_bit_for_bit` in
//! `toast-ops/tests/mapmaker.rs`, at 1 and 2 threads, with one and two
//! observations, and the CLI's xsmall maps).
//!
//! They apply to host runs with compact pointing, IQU weights, no separate
//! final pixelization and, for the solver, a template whose views are the
//! pointing's (the satellite workflow's); otherwise the unfused passes
//! run.

use super::products::Keys;
use super::{timed, MapMaker};
use crate::accel::global_data::HostArray;
use crate::accel::kernels::view_intervals;
use crate::accel::pipeline::DetectorSets;
use crate::ops::binning::{finish_bin_map, prepare_bin_map, BinPass};
use crate::ops::{detector_weights, select_detectors, CompactSource, DetParams, StokesMode};
use crate::pixels::{PixelData, PixelDistribution};
use crate::templates::OffsetTemplate;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use toast_accel::abi::SampleRange;
use toast_core::{Data, ExecContext, OpError, PixelOutOfRange};

/// Samples per block of rebuilt weights (24 KiB of weights per block).
const BLOCK: usize = 1024;

/// Samples of work per projection task (the kernel's).
const PROJECT_TASK: usize = 16384;

/// One detector of one observation, as the fused passes read it.
struct DetPass<'a> {
    name: &'a str,
    params: DetParams,
    /// The compact pixels.
    pix: &'a [i32],
    /// The binning's detector flags (a sample is cut where `flags &
    /// Plan::bin_mask != 0`), if any.
    bin_flags: Option<&'a [u8]>,
    /// The projection's flags (the solver flags; a sample counts where
    /// `flags & 255 == 0`), when the pass projects.
    proj_flags: Option<&'a [u8]>,
    /// The timestream, when the pass reads one (else `F a`).
    signal: Option<&'a [f64]>,
    /// The noise weight.
    scale: f64,
    /// The first amplitude of each view, if the detector has amplitudes.
    view_amp: Option<Vec<usize>>,
    /// Whether a sample whose timestream value is ±0 may be left out of
    /// the accumulation: the noise weight is finite and so is every
    /// rebuilt weight of the detector ([`MapMaker::weights_finite`]), so
    /// it adds `(±0 · w_det) · w_i = ±0` to a map value that is never
    /// `-0` (it starts at `+0`, and a sum is `-0` only when both terms
    /// are): no change. On `xsmall` most amplitudes are flagged (their `F
    /// a` is 0), which this skips.
    zero_skips: bool,
}

/// One observation, as the fused passes read it.
struct ObsPass<'a> {
    name: &'a str,
    src: CompactSource<'a>,
    intervals: Vec<SampleRange>,
    step: usize,
    /// Shared flags that cut a sample in the binning, if any.
    shared_cut: Option<(&'a [u8], u8)>,
    dets: Vec<DetPass<'a>>,
}

/// What both passes read: the observations and the amplitudes.
struct Plan<'a> {
    obs: Vec<ObsPass<'a>>,
    n_pix: i64,
    /// Pixels per submap, and its log2 when a power of two.
    nps: i64,
    shift: Option<u32>,
    g2l: &'a [i64],
    /// The input amplitudes (`F a` passes) and the amplitude flags.
    amps: &'a [f64],
    amp_flags: &'a [u8],
    /// The binning's detector flag mask.
    bin_mask: u8,
}

impl Plan<'_> {
    /// The local submap and sub-pixel of pixel `p >= 0` of sample `s` of
    /// detector `d` of observation `o`, or the error naming it when the
    /// pixel is not stored here (as the kernels' fault).
    #[inline(always)]
    fn locate(
        &self,
        o: &ObsPass<'_>,
        d: &DetPass<'_>,
        s: usize,
        p: i32,
    ) -> Result<(usize, usize), OpError> {
        let p = i64::from(p);
        if p < self.n_pix {
            // A power-of-two submap (every HEALPix one) divides by shifting.
            let (sm, sub) = match self.shift {
                Some(k) => (p >> k, p & (self.nps - 1)),
                None => (p / self.nps, p % self.nps),
            };
            let l = self.g2l[sm as usize];
            if l >= 0 {
                return Ok((l as usize, sub as usize));
            }
        }
        Err(PixelOutOfRange {
            what: "the map-maker's fused passes".into(),
            observation: o.name.to_string(),
            detector: d.name.to_string(),
            sample: s,
            pixel: p,
            limit: "is not in a local submap of the solver's pixel distribution".into(),
        }
        .into())
    }

    /// The timestream value `F d` under amplitude `k` of view `v`: the
    /// zeroed work timestream plus the amplitude (`0 + a`), `0` under a
    /// flagged amplitude or without amplitudes.
    #[inline(always)]
    fn value(&self, d: &DetPass<'_>, v: usize, k: usize) -> f64 {
        match &d.view_amp {
            Some(va) => {
                let a = va[v] + k;
                if self.amp_flags[a] == 0 {
                    0.0 + self.amps[a]
                } else {
                    0.0
                }
            }
            None => 0.0,
        }
    }

    /// Accumulate `F d` of the samples whose sub-pixel lies in `[lo, hi)`
    /// into `zmap` (one slice of `3 (hi - lo)` values per local submap), the
    /// detectors in `order`.
    fn accumulate(
        &self,
        order: &[(usize, usize)],
        (lo, hi): (usize, usize),
        zmap: &mut [&mut [f64]],
    ) -> Result<(), OpError> {
        let mut samples: Vec<u32> = Vec::with_capacity(BLOCK);
        let mut cells: Vec<(u32, u32, f64)> = Vec::with_capacity(BLOCK);
        let mut w = vec![0.0f64; 3 * BLOCK];
        for &(oi, di) in order {
            let o = &self.obs[oi];
            let d = &o.dets[di];
            for (v, iv) in o.intervals.iter().enumerate() {
                let (first, last) = (iv.first as usize, iv.last as usize);
                // Spans of one value source: each amplitude's samples for
                // `F a`, the whole view for a timestream.
                let step = if d.signal.is_some() {
                    last - first
                } else {
                    o.step
                };
                let mut s0 = first;
                while s0 < last {
                    let s1 = s0.saturating_add(step.max(1)).min(last);
                    let amp = match d.signal {
                        Some(_) => 0.0,
                        None => self.value(d, v, (s0 - first) / o.step),
                    };
                    if d.signal.is_none() && amp == 0.0 && d.zero_skips {
                        // Every sample adds ±0 (see `DetPass::zero_skips`);
                        // their pixels were checked by the right-hand
                        // side's pass, which reads the same samples.
                        s0 = s1;
                        continue;
                    }
                    let mut b0 = s0;
                    while b0 < s1 {
                        let b1 = (b0 + BLOCK).min(s1);
                        samples.clear();
                        cells.clear();
                        for s in b0..b1 {
                            if let Some(f) = d.bin_flags {
                                if f[s] & self.bin_mask != 0 {
                                    continue;
                                }
                            }
                            if let Some((f, m)) = o.shared_cut {
                                if f[s] & m != 0 {
                                    continue;
                                }
                            }
                            let p = d.pix[s];
                            if p < 0 {
                                continue;
                            }
                            let (l, sub) = self.locate(o, d, s, p)?;
                            if sub < lo || sub >= hi {
                                continue;
                            }
                            let x = match d.signal {
                                Some(sig) => sig[s],
                                None => amp,
                            };
                            if x == 0.0 && d.zero_skips {
                                // Adds ±0 to the map: nothing (see
                                // `DetPass::zero_skips`).
                                continue;
                            }
                            samples.push(s as u32);
                            cells.push((l as u32, (sub - lo) as u32, x));
                        }
                        o.src.weights_at(&d.params, &samples, &mut w);
                        for (j, &(l, c, x)) in cells.iter().enumerate() {
                            let scaled = x * d.scale;
                            let z = &mut zmap[l as usize][3 * c as usize..3 * c as usize + 3];
                            for i in 0..3 {
                                z[i] += scaled * w[3 * j + i];
                            }
                        }
                        b0 = b1;
                    }
                    s0 = s1;
                }
            }
        }
        Ok(())
    }

    /// The projection of amplitudes `[lo, hi)` of view `v` of detector `di`
    /// of observation `oi` (see the module documentation), in order.
    fn project(
        &self,
        map: &PixelData<f64>,
        (oi, di, v): (usize, usize, usize),
        (lo, hi): (usize, usize),
    ) -> Result<Vec<f64>, OpError> {
        let o = &self.obs[oi];
        let d = &o.dets[di];
        let (Some(va), Some(flags)) = (&d.view_amp, d.proj_flags) else {
            return Ok(Vec::new());
        };
        let nps = self.nps as usize;
        let m = map.data();
        let iv = o.intervals[v];
        let (first, last) = (iv.first as usize, iv.last as usize);
        let mut w = vec![0.0f64; 3 * BLOCK];
        let mut out = Vec::with_capacity(hi - lo);
        for k in lo..hi {
            let a = va[v] + k;
            let mut acc = 0.0;
            if self.amp_flags[a] == 0 {
                let x = match d.signal {
                    Some(_) => 0.0,
                    None => self.value(d, v, k),
                };
                let s0 = first + k * o.step;
                let s1 = s0.saturating_add(o.step).min(last);
                let mut b0 = s0;
                while b0 < s1 {
                    let b1 = (b0 + BLOCK).min(s1);
                    let w = &mut w[..3 * (b1 - b0)];
                    o.src.weights(&d.params, b0, w);
                    for (s, wi) in (b0..b1).zip(w.chunks_exact(3)) {
                        // The work timestream: a copy of the signal, or
                        // `F a`.
                        let mut t = match d.signal {
                            Some(sig) => sig[s],
                            None => x,
                        };
                        let p = d.pix[s];
                        if p >= 0 {
                            let (l, sub) = self.locate(o, d, s, p)?;
                            let off = 3 * (l * nps + sub);
                            let mut val = 0.0;
                            for i in 0..3 {
                                val += wi[i] * m[off + i];
                            }
                            t -= val;
                        }
                        t *= d.scale;
                        acc += if flags[s] == 0 { t } else { 0.0 };
                    }
                    b0 = b1;
                }
            }
            out.push(acc);
        }
        Ok(out)
    }
}

/// What a fused pass reads per sample besides the pointing.
#[derive(Clone, Copy)]
pub(super) enum Input<'k> {
    /// `F a` of the amplitudes at this global key (the left-hand side).
    Amplitudes(&'k str),
    /// The timestream field (the right-hand side, the final maps).
    Timestream(&'k str),
}

impl MapMaker {
    /// Whether the fused passes apply to this run (see the module
    /// documentation); with a template, whether its views are the
    /// pointing's.
    pub(super) fn fused_applies(
        &self,
        data: &Data,
        tmpl: Option<&OffsetTemplate>,
    ) -> Result<bool, OpError> {
        let Some(c) = &self.solve_pointing.compact else {
            return Ok(false);
        };
        if !self.fused
            || !self.transient
            || self.final_pointing.is_some()
            || c.weights.mode != StokesMode::IQU
        {
            return Ok(false);
        }
        let view = self.solve_pointing.view();
        if let Some(tmpl) = tmpl {
            for (i, ob) in data.obs.iter().enumerate() {
                let lay = tmpl.obs_amplitudes(ob, i)?;
                if view_intervals(ob, view)? != lay.intervals {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The compact pointing's expansion settings (the fused passes rebuild
    /// the weights as it does).
    fn compact_ops(&self) -> Result<&crate::ops::ExpandCompactPointing, OpError> {
        self.solve_pointing
            .compact
            .as_ref()
            .ok_or_else(|| OpError::State {
                what: format!(
                    "{}: the fused passes need compact pointing",
                    self.setup.name
                ),
            })
    }

    /// Find, once per run, which detectors' rebuilt weights are all finite
    /// over the pointing's view (see `DetPass::zero_skips`): one pass over
    /// the samples, in parallel over detectors.
    pub(super) fn ensure_weights_finite(&mut self, data: &Data) -> Result<(), OpError> {
        if self.weights_finite.is_some() {
            return Ok(());
        }
        let c = self.compact_ops()?;
        let view = self.solve_pointing.view();
        let mut per_obs = Vec::with_capacity(data.obs.len());
        for ob in &data.obs {
            let src = CompactSource::of(&ob.shared, &c.det_pointing, &c.weights)?;
            per_obs.push((ob, src, view_intervals(ob, view)?));
        }
        let mut tasks = Vec::new();
        for (ob, src, intervals) in &per_obs {
            for d in ob.local_detectors() {
                tasks.push((ob.name(), d.as_str(), DetParams::of(ob, d)?, intervals, src));
            }
        }
        let finite: HashMap<(String, String), bool> = tasks
            .par_iter()
            .map(|(ob, d, p, intervals, src)| {
                let mut w = vec![0.0f64; 3 * BLOCK];
                let all = intervals.iter().all(|iv| {
                    let (first, last) = (iv.first as usize, iv.last as usize);
                    (first..last).step_by(BLOCK).all(|b0| {
                        let w = &mut w[..3 * (BLOCK.min(last - b0))];
                        src.weights(p, b0, w);
                        w.iter().all(|x| x.is_finite())
                    })
                });
                ((ob.to_string(), d.to_string()), all)
            })
            .collect();
        tracing::debug!(
            "{}: fused passes: {} of {} detectors' rebuilt weights are finite",
            self.setup.name,
            finite.values().filter(|&&f| f).count(),
            finite.len()
        );
        self.weights_finite = Some(finite);
        Ok(())
    }

    /// `q = A d` (TOAST's `SolverLHS`) with the fused passes: `F d` binned
    /// into the solver's map, then `Fᵀ N⁻¹ (F d - P m)` into `keys.lhs_out`.
    pub(super) fn lhs_fused(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let input = Input::Amplitudes(&keys.lhs_in);
        self.solver_fused(data, ctx, tmpl, keys, (&keys.temp, input), &keys.lhs_out)
    }

    /// The right-hand side `b = Fᵀ N⁻¹ (d - P m)` (TOAST's `SolverRHS`)
    /// with the fused passes: `d` binned into the solver's map, then the
    /// projection into `keys.rhs`.
    pub(super) fn rhs_fused(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let det_data = self.setup.mapmaker.det_data.clone();
        let input = Input::Timestream(&det_data);
        self.solver_fused(data, ctx, tmpl, keys, (&det_data, input), &keys.rhs)
    }

    /// One solver application: `input` (the pass's timestream name and
    /// source) binned into the solver's map, then projected into `output`.
    fn solver_fused(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
        (det_data, input): (&str, Input<'_>),
        output: &str,
    ) -> Result<(), OpError> {
        self.ensure_weights_finite(data)?;
        let binner = self.setup.binner.clone();
        let pass = self.solver_pass(&binner, keys, det_data);
        timed(data, ctx, "solver_binning", |data, ctx| {
            self.bin_fused(data, ctx, &pass, Some(tmpl), input, keys)
        })?;
        timed(data, ctx, "fused_projection", |data, ctx| {
            self.project_fused(data, ctx, &pass, tmpl, input, keys, output)
        })
    }

    /// The solver's binning pass of `det_data`.
    fn solver_pass<'p>(
        &self,
        binner: &'p crate::ops::BinnerConfig,
        keys: &'p Keys,
        det_data: &'p str,
    ) -> BinPass<'p> {
        BinPass {
            name: "solver_binning",
            config: binner,
            covariance: &keys.solve_cov,
            binned: &keys.solve_bin,
            det_data,
            flags: self.solver_selection(keys, 0),
            noiseweighted: None,
            covariance_on_device: true,
        }
    }

    /// One binning pass with the fused accumulation: the map reset, `input`
    /// accumulated (see [`Plan::accumulate`]), then summed over the job
    /// and multiplied by the covariance as in [`crate::ops::binning`].
    pub(super) fn bin_fused(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        pass: &BinPass<'_>,
        tmpl: Option<&OffsetTemplate>,
        input: Input<'_>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        // The last unfused pass's batch pointing and work timestream are
        // not read here.
        self.drop_pointing(data)?;
        data.remove_detdata(&[&keys.temp])?;
        let (dist, nnz) = prepare_bin_map(data, pass)?;
        if nnz != 3 {
            return Err(OpError::Global {
                key: pass.covariance.to_string(),
                problem: format!("a covariance of {nnz} Stokes values, not IQU"),
            });
        }
        let sets = self.pointing_sets(data);
        let mut zmap = crate::pixels::take_map(data, pass.binned)?;
        zmap.reset();
        let r = self.fused_accumulate(data, ctx, tmpl, input, keys, pass, &sets, &dist, &mut zmap);
        data.meta.set_object(pass.binned.to_string(), *zmap);
        r?;
        finish_bin_map(data, ctx, pass)
    }

    /// The projection `Fᵀ N⁻¹ (t - P m)` of the work timestream `t`
    /// (`input`) into the amplitudes `output` (zeroed first), with the
    /// solver's map `m` of `pass`.
    #[allow(clippy::too_many_arguments)]
    fn project_fused(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        pass: &BinPass<'_>,
        tmpl: &OffsetTemplate,
        input: Input<'_>,
        keys: &Keys,
        output: &str,
    ) -> Result<(), OpError> {
        let results = {
            let plan = self.fused_plan(data, ctx, Some(tmpl), input, keys, pass)?;
            let map = data.meta.object::<PixelData<f64>>(pass.binned)?;
            let mut tasks = Vec::new();
            for (oi, o) in plan.obs.iter().enumerate() {
                let per = (PROJECT_TASK / o.step).max(1);
                for (di, d) in o.dets.iter().enumerate() {
                    let Some(va) = &d.view_amp else { continue };
                    for (v, iv) in o.intervals.iter().enumerate() {
                        let n = ((iv.last - iv.first) as usize).div_ceil(o.step);
                        let mut lo = 0;
                        while lo < n {
                            let hi = (lo + per).min(n);
                            tasks.push(((oi, di, v), (lo, hi), va[v] + lo));
                            lo = hi;
                        }
                    }
                }
            }
            tasks
                .par_iter()
                .map(|&(at, range, a0)| plan.project(map, at, range).map(|v| (a0, v)))
                .collect::<Result<Vec<_>, OpError>>()?
        };
        let out = &mut data.meta.object_mut::<HostArray<f64>>(output)?.values;
        out.iter_mut().for_each(|x| *x = 0.0);
        for (a0, v) in results {
            out[a0..a0 + v.len()].copy_from_slice(&v);
        }
        Ok(())
    }

    /// The binning half: split the map's sub-pixels between the tasks and
    /// accumulate.
    #[allow(clippy::too_many_arguments)]
    fn fused_accumulate(
        &self,
        data: &Data,
        ctx: &ExecContext,
        tmpl: Option<&OffsetTemplate>,
        input: Input<'_>,
        keys: &Keys,
        pass: &BinPass<'_>,
        sets: &DetectorSets,
        dist: &PixelDistribution,
        zmap: &mut PixelData<f64>,
    ) -> Result<(), OpError> {
        let plan = self.fused_plan(data, ctx, tmpl, input, keys, pass)?;
        // The unfused order: per detector set, every observation's
        // detectors of the set in the observation's order.
        let mut order = Vec::new();
        let all = [None];
        let set_list: Vec<Option<&Vec<String>>> = match sets {
            DetectorSets::Sets(s) => s.iter().map(Some).collect(),
            _ => all.to_vec(),
        };
        for set in set_list {
            for (oi, o) in plan.obs.iter().enumerate() {
                for (di, d) in o.dets.iter().enumerate() {
                    if set.is_none_or(|s| s.iter().any(|x| x == d.name)) {
                        order.push((oi, di));
                    }
                }
            }
        }
        let nps = dist.n_pix_submap() as usize;
        let parts = rayon::current_num_threads().clamp(1, nps.max(1));
        let bounds: Vec<usize> = (0..=parts).map(|t| t * nps / parts).collect();
        let mut pieces: Vec<Vec<&mut [f64]>> = (0..parts).map(|_| Vec::new()).collect();
        for sub in zmap.data_mut().chunks_mut(3 * nps) {
            let mut rest = sub;
            for t in 0..parts {
                let (a, b) = rest.split_at_mut(3 * (bounds[t + 1] - bounds[t]));
                pieces[t].push(a);
                rest = b;
            }
        }
        pieces
            .into_par_iter()
            .enumerate()
            .map(|(t, mut z)| plan.accumulate(&order, (bounds[t], bounds[t + 1]), &mut z))
            .collect()
    }

    /// What the fused passes read, observation by observation.
    fn fused_plan<'a>(
        &self,
        data: &'a Data,
        ctx: &ExecContext,
        tmpl: Option<&'a OffsetTemplate>,
        input: Input<'_>,
        keys: &Keys,
        pass: &BinPass<'_>,
    ) -> Result<Plan<'a>, OpError> {
        let c = self.compact_ops()?;
        let view = self.solve_pointing.view();
        let bin_flags = pass.flags.det();
        let mut obs = Vec::with_capacity(data.obs.len());
        for (i, ob) in data.obs.iter().enumerate() {
            let lay = match tmpl {
                Some(t) => Some(t.obs_amplitudes(ob, i)?),
                None => None,
            };
            let dets = select_detectors(ctx, ob, pass.flags.det_mask);
            let scales = if dets.is_empty() {
                Vec::new()
            } else {
                detector_weights(ob, &pass.config.noise_model, &dets)?
            };
            let comp = ob.detdata.get(&c.compact)?;
            let bin_field = match bin_flags {
                Some((f, _)) => Some(ob.detdata.get(f)?),
                None => None,
            };
            let proj_field = match tmpl {
                Some(_) => Some(ob.detdata.get(&keys.solve_flags)?),
                None => None,
            };
            let signal = match input {
                Input::Timestream(f) => Some(ob.detdata.get(f)?),
                Input::Amplitudes(_) => None,
            };
            let mut dp = Vec::with_capacity(dets.len());
            for (d, &scale) in dets.iter().zip(&scales) {
                let name = ob
                    .local_detectors()
                    .iter()
                    .find(|x| *x == d)
                    .map(String::as_str)
                    .unwrap_or_default();
                let view_amp = lay.and_then(|lay| lay.offset(d)).map(|a0| {
                    let mut starts = Vec::new();
                    let mut a = a0;
                    for &n in lay.map_or(&[][..], |l| l.n_amp_views) {
                        starts.push(a);
                        a += n as usize;
                    }
                    starts
                });
                dp.push(DetPass {
                    name,
                    params: DetParams::of(ob, d)?,
                    pix: comp.row_of::<i32>(d)?,
                    bin_flags: bin_field.map(|f| f.row_of::<u8>(d)).transpose()?,
                    proj_flags: proj_field.map(|f| f.row_of::<u8>(d)).transpose()?,
                    signal: signal.map(|f| f.row_of::<f64>(d)).transpose()?,
                    scale,
                    view_amp,
                    zero_skips: scale.is_finite()
                        && self
                            .weights_finite
                            .as_ref()
                            .and_then(|m| m.get(&(ob.name().to_string(), d.clone())))
                            .copied()
                            .unwrap_or(false),
                });
            }
            let shared_cut = match pass.flags.shared() {
                Some((f, m)) => Some((ob.shared.data::<u8>(f)?, m)),
                None => None,
            };
            obs.push(ObsPass {
                name: ob.name(),
                src: CompactSource::of(&ob.shared, &c.det_pointing, &c.weights)?,
                intervals: view_intervals(ob, view)?,
                step: lay.map_or(1, |l| l.step_length),
                shared_cut,
                dets: dp,
            });
        }
        let dist = data
            .meta
            .object::<PixelData<f64>>(pass.covariance)?
            .distribution()
            .as_ref();
        let nps = dist.n_pix_submap();
        let (amps, amp_flags): (&[f64], &[u8]) = match (input, tmpl) {
            (Input::Amplitudes(k), Some(t)) => (
                &data.meta.object::<HostArray<f64>>(k)?.values,
                &data.meta.object::<HostArray<u8>>(&t.flags_key())?.values,
            ),
            (_, Some(t)) => (
                &[],
                &data.meta.object::<HostArray<u8>>(&t.flags_key())?.values,
            ),
            _ => (&[], &[]),
        };
        Ok(Plan {
            obs,
            n_pix: dist.n_pix(),
            nps,
            shift: (nps > 0 && (nps as u64).is_power_of_two()).then(|| nps.trailing_zeros()),
            g2l: dist.global2local(),
            amps,
            amp_flags,
            bin_mask: bin_flags.map_or(0, |(_, m)| m),
        })
    }
}
