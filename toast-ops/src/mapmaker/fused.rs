//! The map-maker's fused passes: which detectors, views and maps; the
//! per-sample work is the backends' fused kernels.
//!
//! The unfused solver passes fill a work timestream (`F a`, or a copy of
//! the signal) per detector batch and hand it to the kernels one after the
//! other (accumulate; then scan and subtract, noise weight, project), each
//! reading and writing it again; with `binner.compact_pointing` they also
//! rebuild each batch's pixels (i64) and IQU weights (3 f64) into fields of
//! the batch's length. The fused passes call two kernels of the table
//! instead (`toast_accel::toast_kernels!`, ABI minor 4; the CPU plugin's
//! `kernels/fused.rs` documents the math): `fused_accumulate` (a
//! timestream or `F a` binned into the pass's noise-weighted map) and
//! `fused_project` (`Fᵀ N⁻¹ (t - P m)` into amplitudes), each reading the
//! pointing either rebuilt from the compact i32 pixel and the boresight
//! block by block (**compact**, [`Fused::Compact`]) or kept
//! (**kept**, `binner.full_pointing`, [`Fused::Kept`]). No work timestream
//! exists. They run the solver's right-hand side (`SolverRHS`), its
//! left-hand side (`SolverLHS`, twice per CG iteration in the unfused form)
//! and, with compact pointing, the final binned and destriped maps
//! (`BinMap`).
//!
//! What stays here is orchestration:
//!
//! * **Binning** ([`MapMaker::bin_fused`]): the map reset, then one
//!   `fused_accumulate` call per detector set and observation, in the
//!   unfused pass's order (detector batch, observation, detector), so each
//!   map element is summed in the unfused order (the kernel keeps it within
//!   a call): the map is bit-identical to the unfused pass's for any thread
//!   count. The sum over the job and the covariance follow as in
//!   [`crate::ops::binning`].
//! * **Projection** ([`MapMaker::project_fused`]): the output amplitudes
//!   zeroed, then one `fused_project` call per observation.
//! * **Which weights are finite** ([`MapMaker::ensure_weights_finite`], once
//!   per run): the kernels may leave out a sample of value ±0 of a
//!   detector whose weights are all finite (it adds ±0 to a map value that
//!   cannot be `-0`); on xsmall most amplitudes are flagged, so the
//!   left-hand side's binning skips most detectors. Kept weights are read;
//!   compact ones are rebuilt by `compact_expand_pointing` one detector and
//!   one window of samples at a time (no field of an observation's length).
//!
//! Every value is the unfused path's, operation for operation, so the
//! solution and the maps are byte-identical to the unfused passes' with
//! the same pointing (test `fused_passes_are_the_unfused_ones_bit_for_bit`
//! in `toast-ops/tests/mapmaker.rs`, compact and kept, at 1 and 2 threads,
//! with one and two observations and two batch sizes; and the CLI's tiny
//! and xsmall maps).
//!
//! They apply to host runs with compact or kept pointing, IQU weights, no
//! separate final pixelization, a backend whose fused kernels run where
//! the unfused ones would (a plugin without them: the unfused passes) and,
//! for the solver, a template whose views are the pointing's (the
//! satellite workflow's); otherwise (recomputed host pointing,
//! [`MapMaker::fused_passes`] off) the unfused passes run.
//!
//! On a device (`device-kept-fused`, `device-recomputed-fused`,
//! `device-compact-fused`) the
//! solver's sides run the same two kernels as pipeline steps
//! ([`AccumulateStep`], [`ProjectStep`]), staged like every other kernel:
//! they read the kept pointing, or, per batch, the pointing the pass's
//! steps just recomputed, or the compact pixels and the boresight (the
//! weights rebuilt in the kernels), and the timestream's rows of the pass's
//! detectors (the right-hand side) or `F a` of the amplitudes (the
//! left-hand side). No work timestream exists on the device. No
//! detector's weights count as finite there (they are not on the host),
//! so no sample is skipped: the same sums.

use super::products::Keys;
use super::{timed, MapMaker};
use crate::exec::global_data::HostArray;
use crate::exec::kernels::{
    self, view_intervals, CompactPointing, FusedInput, FusedMap, FusedOffsets, FusedPointing,
    KernelCall, OffsetLayout,
};
use crate::exec::pipeline::DetectorSets;
use crate::ops::binning::{bin_map_with, finish_bin_map, prepare_bin_map, BinPass, PassPointing};
use crate::ops::{detector_weights, select_detectors, FlagSelection};
use crate::pixels::PixelData;
use crate::templates::OffsetTemplate;
use std::collections::HashMap;
use std::sync::Arc;
use toast_accel::abi::{Kernel, SampleRange};
use toast_accel::host::Dispatcher;
use toast_core::{Data, ExecContext, Observation, OpError};

/// Samples per `compact_expand_pointing` call of the finiteness pass (its
/// window: 2 MiB of pixels and weights).
const FINITE_WINDOW: usize = 65536;

/// What a fused pass reads per sample besides the pointing.
#[derive(Clone, Copy)]
pub(super) enum Input<'k> {
    /// `F a` of the amplitudes at this global key (the left-hand side).
    Amplitudes(&'k str),
    /// The timestream field (the right-hand side, the final maps).
    Timestream(&'k str),
}

impl<'k> Input<'k> {
    /// The kernels' form of the value.
    fn fused(self) -> FusedInput<'k> {
        match self {
            Input::Timestream(f) => FusedInput::Timestream(f),
            Input::Amplitudes(k) => FusedInput::Amplitudes(k),
        }
    }
}

/// The pointing the fused passes read, as the run's plan says (see
/// [`MapMaker::fused_applies`]): compact (weights rebuilt) or kept.
pub(super) use super::plan::FusedForm as Fused;

impl MapMaker {
    /// Whether the fused passes apply to this pass, and on which pointing:
    /// the run's plan has them ([`super::Plan::fused`]: a host run, IQU
    /// weights, no separate final pixelization, the fused kernels where the
    /// unfused ones run), the pointing they read is there (the compact form,
    /// or the kept fields in every observation) and, with a template, its
    /// views are the pointing's.
    pub(super) fn fused_applies(
        &self,
        data: &Data,
        tmpl: Option<&OffsetTemplate>,
    ) -> Result<Option<Fused>, OpError> {
        let Some(form) = self.plan.fused() else {
            return Ok(None);
        };
        let ready = match form {
            Fused::Compact => self.solve_pointing.compact.is_some(),
            Fused::Kept => {
                let p = &self.solve_pointing;
                let fields = [p.pixels_field(), p.weights_field()];
                data.obs
                    .iter()
                    .all(|ob| fields.iter().all(|f| ob.detdata.contains(f)))
            }
        };
        if !ready || !self.template_views_match(data, tmpl)? {
            return Ok(None);
        }
        Ok(Some(form))
    }

    /// Whether the fused device steps apply to this solver pass: the
    /// run's plan has them ([`super::Plan::device_fused`]) and the
    /// template's views are the pointing's.
    pub(super) fn device_fused_applies(
        &self,
        data: &Data,
        tmpl: &OffsetTemplate,
    ) -> Result<bool, OpError> {
        Ok(self.plan.device_fused() && self.template_views_match(data, Some(tmpl))?)
    }

    /// The template (if any) has the pointing's view in every observation:
    /// the fused kernels walk one set of intervals for both.
    fn template_views_match(
        &self,
        data: &Data,
        tmpl: Option<&OffsetTemplate>,
    ) -> Result<bool, OpError> {
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

    /// The pointing the fused kernels read in observation `ob`.
    fn fused_pointing<'a>(
        &'a self,
        ob: &Observation,
        fused: Fused,
    ) -> Result<FusedPointing<'a>, OpError> {
        Ok(match fused {
            Fused::Compact => FusedPointing::Compact(compact_pointing(self.compact_ops()?, ob)),
            Fused::Kept => FusedPointing::Kept {
                pixels: self.solve_pointing.pixels_field(),
                weights: self.solve_pointing.weights_field(),
            },
        })
    }

    /// Find, once per run, which detectors' weights (rebuilt or kept, as
    /// `fused` says) are all finite over the pointing's view (see the
    /// module documentation). A detector left out counts as not finite
    /// (its samples are then never skipped).
    pub(super) fn ensure_weights_finite(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        fused: Fused,
    ) -> Result<(), OpError> {
        if self.weights_finite.is_none() {
            let finite = match fused {
                Fused::Kept => self.kept_weights_finite(data, ctx)?,
                Fused::Compact => self.compact_weights_finite(data, ctx)?,
            };
            tracing::debug!(
                "{}: fused passes: {} of {} detectors' weights are finite",
                self.setup.name,
                finite.values().filter(|&&f| f).count(),
                finite.len()
            );
            self.weights_finite = Some(finite);
        }
        Ok(())
    }

    /// [`MapMaker::ensure_weights_finite`] of kept weights: read them.
    fn kept_weights_finite(
        &self,
        data: &Data,
        ctx: &ExecContext,
    ) -> Result<HashMap<(String, String), bool>, OpError> {
        let view = self.solve_pointing.view();
        let mut finite = HashMap::new();
        for ob in &data.obs {
            let intervals = view_intervals(ob, view)?;
            let wts = ob.detdata.get(self.solve_pointing.weights_field())?;
            wts.check::<f64>(&[3])?;
            for d in select_detectors(ctx, ob, self.setup.binner.det_mask) {
                let w = wts.row_of::<f64>(&d)?;
                let all = intervals.iter().all(|iv| {
                    w[3 * iv.first as usize..3 * iv.last as usize]
                        .iter()
                        .all(|x| x.is_finite())
                });
                finite.insert((ob.name().to_string(), d), all);
            }
        }
        Ok(finite)
    }

    /// [`MapMaker::ensure_weights_finite`] of compact weights: rebuilt by
    /// `compact_expand_pointing` into a window of [`FINITE_WINDOW`] samples,
    /// one detector at a time (no field of an observation's length). Where
    /// that kernel does not run on a host-addressable backend no detector
    /// counts as finite (nothing is skipped: slower, the same bits).
    fn compact_weights_finite(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
    ) -> Result<HashMap<(String, String), bool>, OpError> {
        let mut finite = HashMap::new();
        let host = match ctx.extensions.get::<Dispatcher>() {
            Some(d) => d
                .resolve(Kernel::CompactExpandPointing, Some(&self.setup.name))
                .is_ok_and(|r| r.backend.host_addressable()),
            None => false,
        };
        if !host {
            return Ok(finite);
        }
        let view = self.solve_pointing.view();
        let mut pixels = vec![0i64; FINITE_WINDOW];
        let mut weights = vec![0.0f64; 3 * FINITE_WINDOW];
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let intervals = view_intervals(ob, view)?;
            let FusedPointing::Compact(compact) = self.fused_pointing(ob, Fused::Compact)? else {
                continue;
            };
            for d in select_detectors(ctx, ob, self.setup.binner.det_mask) {
                let mut all = true;
                let mut first = 0;
                let n_samp = ob.n_samples();
                while all && first < n_samp {
                    let end = (first + FINITE_WINDOW).min(n_samp);
                    // The view's samples in this window.
                    let window: Vec<_> = intervals
                        .iter()
                        .map(|iv| SampleRange {
                            first: iv.first.clamp(first as i64, end as i64),
                            last: iv.last.clamp(first as i64, end as i64),
                        })
                        .filter(|iv| iv.last > iv.first)
                        .collect();
                    if !window.is_empty() {
                        let dets = std::slice::from_ref(&d);
                        let call = KernelCall {
                            operator: &self.setup.name,
                            detectors: dets,
                            intervals: &window,
                        };
                        let n = end - first;
                        let out = (&mut pixels[..n], &mut weights[..3 * n]);
                        kernels::compact_expand_window(ctx, call, (ob, meta), compact, first, out)?;
                        all = window.iter().all(|iv| {
                            let (a, b) = (iv.first as usize - first, iv.last as usize - first);
                            weights[3 * a..3 * b].iter().all(|x| x.is_finite())
                        });
                    }
                    first = end;
                }
                finite.insert((ob.name().to_string(), d), all);
            }
        }
        Ok(finite)
    }

    /// `q = A d` (TOAST's `SolverLHS`) with the fused passes: `F d` binned
    /// into the solver's map, then `Fᵀ N⁻¹ (F d - P m)` into `keys.lhs_out`.
    pub(super) fn lhs_fused(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        (tmpl, fused): (&Arc<OffsetTemplate>, Fused),
        keys: &Keys,
    ) -> Result<(), OpError> {
        let input = Input::Amplitudes(&keys.lhs_in);
        let tmpl = (tmpl, fused);
        self.solver_fused(data, ctx, tmpl, keys, (&keys.temp, input), &keys.lhs_out)
    }

    /// The right-hand side `b = Fᵀ N⁻¹ (d - P m)` (TOAST's `SolverRHS`)
    /// with the fused passes: `d` binned into the solver's map, then the
    /// projection into `keys.rhs`.
    pub(super) fn rhs_fused(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: (&Arc<OffsetTemplate>, Fused),
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
        (tmpl, fused): (&Arc<OffsetTemplate>, Fused),
        keys: &Keys,
        (det_data, input): (&str, Input<'_>),
        output: &str,
    ) -> Result<(), OpError> {
        self.ensure_weights_finite(data, ctx, fused)?;
        let binner = self.setup.binner.clone();
        let pass = self.solver_pass(&binner, keys, det_data);
        // The unfused solver passes' detector order.
        let sets = self.work_sets(data);
        timed(data, ctx, "solver_binning", |data, ctx| {
            self.bin_fused(data, ctx, (&pass, &sets), (Some(tmpl), fused), input, keys)
        })?;
        timed(data, ctx, "fused_projection", |data, ctx| {
            self.project_fused(data, ctx, (&pass, fused), tmpl, input, keys, output)
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
    /// accumulated by `fused_accumulate` (one call per detector set of
    /// `sets` and observation, in the unfused pass's order), then summed
    /// over the job and multiplied by the covariance as in
    /// [`crate::ops::binning`].
    pub(super) fn bin_fused(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        (pass, sets): (&BinPass<'_>, &DetectorSets),
        (tmpl, fused): (Option<&OffsetTemplate>, Fused),
        input: Input<'_>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        // The last unfused pass's batch pointing (compact) and work
        // timestream are not read here; kept pointing is.
        if fused == Fused::Compact {
            self.drop_pointing(data)?;
        }
        data.remove_detdata(&[&keys.temp])?;
        let (_, nnz) = prepare_bin_map(data, pass)?;
        if nnz != 3 {
            return Err(OpError::Global {
                key: pass.covariance.to_string(),
                problem: format!("a covariance of {nnz} Stokes values, not IQU"),
            });
        }
        data.meta.object_mut::<PixelData<f64>>(pass.binned)?.reset();
        let set_list: Vec<Option<&[String]>> = match sets {
            DetectorSets::Sets(s) => s.iter().map(|s| Some(s.as_slice())).collect(),
            _ => vec![None],
        };
        let accumulation = Accumulation {
            operator: &self.setup.name,
            flags: &pass.flags,
            noise_model: &pass.config.noise_model,
            view: self.solve_pointing.view(),
            template: tmpl,
            input: input.fused(),
            map: FusedMap {
                map: pass.binned,
                pixel_dist: &pass.config.pixel_dist,
            },
        };
        for set in set_list {
            accumulate_observations(
                data,
                ctx,
                (&accumulation, set),
                |ob| self.fused_pointing(ob, fused),
                |ob, dets| self.finite_of(ob, dets),
            )?;
        }
        finish_bin_map(data, ctx, pass)
    }

    /// The projection `Fᵀ N⁻¹ (t - P m)` of the work timestream `t`
    /// (`input`) into the amplitudes `output` (zeroed first), with the
    /// solver's map `m` of `pass`: one `fused_project` call per
    /// observation.
    #[allow(clippy::too_many_arguments)]
    fn project_fused(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        (pass, fused): (&BinPass<'_>, Fused),
        tmpl: &OffsetTemplate,
        input: Input<'_>,
        keys: &Keys,
        output: &str,
    ) -> Result<(), OpError> {
        data.meta
            .object_mut::<HostArray<f64>>(output)?
            .values
            .fill(0.0);
        let projection = Projection {
            operator: &self.setup.name,
            det_mask: pass.flags.det_mask,
            noise_model: &pass.config.noise_model,
            view: self.solve_pointing.view(),
            template: tmpl,
            input: input.fused(),
            solve_flags: &keys.solve_flags,
            map: FusedMap {
                map: pass.binned,
                pixel_dist: &pass.config.pixel_dist,
            },
            output,
        };
        project_observations(data, ctx, &projection, |ob| self.fused_pointing(ob, fused))
    }
}

/// What one fused accumulation pass reads and writes.
struct Accumulation<'a> {
    /// The kernel calls' operator (for dispatch).
    operator: &'a str,
    /// Which detectors and samples to bin.
    flags: &'a FlagSelection,
    /// The noise model of the detector weights.
    noise_model: &'a str,
    /// The pointing's view.
    view: Option<&'a str>,
    /// The offset template, if any (its layout and amplitude flags, for
    /// `F a`).
    template: Option<&'a OffsetTemplate>,
    /// The timestream `t` (or `F a`).
    input: FusedInput<'a>,
    /// The noise-weighted map accumulated into.
    map: FusedMap<'a>,
}

/// `Pᵀ N⁻¹ t` of the selected detectors (of `set` too, when given) into
/// `a.map`: one `fused_accumulate` call per observation, reading
/// `pointing(ob)`, with the detectors' finite-weights flags
/// `finite(ob, dets)`.
fn accumulate_observations<'a>(
    data: &mut Data,
    ctx: &mut ExecContext,
    (a, set): (&Accumulation<'a>, Option<&[String]>),
    pointing: impl Fn(&Observation) -> Result<FusedPointing<'a>, OpError>,
    finite: impl Fn(&Observation, &[String]) -> Vec<u8>,
) -> Result<(), OpError> {
    let flags_key = a.template.map(OffsetTemplate::flags_key);
    let Data { obs, meta } = data;
    for (i, ob) in obs.iter_mut().enumerate() {
        let selection = (a.flags.det_mask, set);
        let pass = (a.noise_model, a.view, a.template);
        let Some(c) = ObservationCall::of(ctx, ob, i, selection, pass)? else {
            continue;
        };
        let finite = finite(ob, &c.dets);
        let pointing = pointing(ob)?;
        kernels::fused_accumulate(
            ctx,
            c.call(a.operator),
            ob,
            meta,
            (&pointing, a.input, c.layout.offsets(flags_key.as_deref())),
            (a.flags.det(), a.flags.shared()),
            (&c.scales, &finite),
            a.map,
        )?;
    }
    Ok(())
}

/// What a fused call of one observation needs besides its pointing and
/// values: the selected detectors, their noise weights, the view's
/// intervals and the offset layout.
struct ObservationCall {
    dets: Vec<String>,
    scales: Vec<f64>,
    intervals: Vec<SampleRange>,
    layout: Option<OffsetPlan>,
}

impl ObservationCall {
    /// The call of observation `i`, `ob`, for the detectors `ctx` selects
    /// minus those `det_mask` cuts (of `set` too, when given), with the
    /// weights of `noise_model`, `view`'s intervals and `template`'s
    /// layout; `None` when no detector is left.
    fn of(
        ctx: &ExecContext,
        ob: &Observation,
        i: usize,
        (det_mask, set): (u8, Option<&[String]>),
        (noise_model, view, template): (&str, Option<&str>, Option<&OffsetTemplate>),
    ) -> Result<Option<Self>, OpError> {
        let dets: Vec<String> = select_detectors(ctx, ob, det_mask)
            .into_iter()
            .filter(|d| set.is_none_or(|s| s.contains(d)))
            .collect();
        if dets.is_empty() {
            return Ok(None);
        }
        Ok(Some(ObservationCall {
            scales: detector_weights(ob, noise_model, &dets)?,
            intervals: view_intervals(ob, view)?,
            layout: OffsetPlan::of(template, ob, i, &dets)?,
            dets,
        }))
    }

    /// The kernel call of `operator`.
    fn call<'c>(&'c self, operator: &'c str) -> KernelCall<'c> {
        KernelCall {
            operator,
            detectors: &self.dets,
            intervals: &self.intervals,
        }
    }
}

/// What one fused projection pass reads and writes.
struct Projection<'a> {
    /// The kernel calls' operator (for dispatch).
    operator: &'a str,
    /// Detector flag bits that exclude a detector.
    det_mask: u8,
    /// The noise model of the detector weights.
    noise_model: &'a str,
    /// The pointing's view.
    view: Option<&'a str>,
    /// The offset template.
    template: &'a OffsetTemplate,
    /// The timestream `t` (or `F a`).
    input: FusedInput<'a>,
    /// The solver flags (every bit cuts).
    solve_flags: &'a str,
    /// The solver's map `m`.
    map: FusedMap<'a>,
    /// The amplitudes written.
    output: &'a str,
}

/// `Fᵀ N⁻¹ (t - P m)` of the selected detectors into `p.output`: one
/// `fused_project` call per observation, reading `pointing(ob)`. The
/// amplitudes of other detectors are left as they are.
fn project_observations<'a>(
    data: &mut Data,
    ctx: &mut ExecContext,
    p: &Projection<'a>,
    pointing: impl Fn(&Observation) -> Result<FusedPointing<'a>, OpError>,
) -> Result<(), OpError> {
    let flags_key = p.template.flags_key();
    let Data { obs, meta } = data;
    for (i, ob) in obs.iter_mut().enumerate() {
        let pass = (p.noise_model, p.view, Some(p.template));
        let Some(c) = ObservationCall::of(ctx, ob, i, (p.det_mask, None), pass)? else {
            continue;
        };
        let Some(offsets) = c.layout.offsets(Some(&flags_key)) else {
            continue;
        };
        let pointing = pointing(ob)?;
        kernels::fused_project(
            ctx,
            c.call(p.operator),
            ob,
            meta,
            (&pointing, p.input, offsets),
            Some((p.solve_flags, u8::MAX)),
            &c.scales,
            p.map,
            p.output,
        )?;
    }
    Ok(())
}

impl MapMaker {
    /// Per detector of `ob`, whether its weights are finite (see
    /// [`MapMaker::ensure_weights_finite`]).
    fn finite_of(&self, ob: &Observation, dets: &[String]) -> Vec<u8> {
        dets.iter()
            .map(|d| {
                u8::from(
                    self.weights_finite
                        .as_ref()
                        .and_then(|m| m.get(&(ob.name().to_string(), d.clone())))
                        .copied()
                        .unwrap_or(false),
                )
            })
            .collect()
    }
}

/// One observation's offset layout for the fused kernels: each detector's
/// first amplitude (`-1`: none) and the amplitudes per view.
struct OffsetPlan {
    step_length: i64,
    n_amp_views: Vec<i64>,
    amp_offset: Vec<i64>,
}

impl OffsetPlan {
    fn of(
        tmpl: Option<&OffsetTemplate>,
        ob: &Observation,
        i: usize,
        dets: &[String],
    ) -> Result<Option<Self>, OpError> {
        let Some(t) = tmpl else {
            return Ok(None);
        };
        let lay = t.obs_amplitudes(ob, i)?;
        Ok(Some(OffsetPlan {
            step_length: lay.step_length as i64,
            n_amp_views: lay.n_amp_views.to_vec(),
            amp_offset: dets
                .iter()
                .map(|d| lay.offset(d).map_or(-1, |a| a as i64))
                .collect(),
        }))
    }
}

trait Offsets {
    fn offsets<'a>(&'a self, flags: Option<&'a str>) -> Option<FusedOffsets<'a>>;
}

impl Offsets for Option<OffsetPlan> {
    fn offsets<'a>(&'a self, flags: Option<&'a str>) -> Option<FusedOffsets<'a>> {
        let (p, flags) = (self.as_ref()?, flags?);
        Some(FusedOffsets {
            layout: OffsetLayout {
                step_length: p.step_length,
                n_amp_views: &p.n_amp_views,
                amp_offset: &p.amp_offset,
            },
            flags,
        })
    }
}

/// What a fused device step reads per sample besides the pointing (the
/// owned form of [`Input`]).
#[derive(Debug, Clone)]
pub(super) enum StepInput {
    /// The timestream field (the right-hand side).
    Timestream(String),
    /// `F a` of the amplitudes at this global key (the left-hand side).
    Amplitudes(String),
}

impl StepInput {
    fn fused(&self) -> FusedInput<'_> {
        match self {
            StepInput::Timestream(f) => FusedInput::Timestream(f),
            StepInput::Amplitudes(k) => FusedInput::Amplitudes(k),
        }
    }

    fn require(&self, r: toast_core::Requirements) -> toast_core::Requirements {
        match self {
            StepInput::Timestream(f) => r.detdata(f),
            StepInput::Amplitudes(k) => r.global(k),
        }
    }
}

/// What both fused device steps of a solver pass read: the kept (or this
/// batch's transient) pointing, the solver's map, the detector weights and
/// the offset template.
#[derive(Debug, Clone)]
pub(super) struct DevicePass {
    /// The map-maker's name (the kernel calls' operator, for dispatch).
    pub operator: String,
    /// With compact pointing (`device-compact`), its expansion settings:
    /// the kernels read the compact pixels and rebuild the weights from
    /// the boresight (`pixels` and `weights` are then not read).
    pub compact: Option<crate::ops::ExpandCompactPointing>,
    /// The pass's pixels and IQU weights.
    pub pixels: String,
    /// See `pixels`.
    pub weights: String,
    /// The solver's map and its pixel distribution.
    pub map: String,
    /// See `map`.
    pub pixel_dist: String,
    /// The noise model of the detector weights.
    pub noise_model: String,
    /// The pointing's view.
    pub view: Option<String>,
    /// The offset template.
    pub template: Arc<OffsetTemplate>,
}

impl DevicePass {
    fn requires(&self) -> toast_core::Requirements {
        let pointing = match &self.compact {
            Some(c) => toast_core::Operator::requires(c),
            None => toast_core::Requirements::new()
                .detdata(&self.pixels)
                .detdata(&self.weights),
        };
        pointing
            .global(&self.map)
            .global(&self.pixel_dist)
            .global(self.template.flags_key())
    }

    fn map(&self) -> FusedMap<'_> {
        FusedMap {
            map: &self.map,
            pixel_dist: &self.pixel_dist,
        }
    }

    /// The pointing the kernels read in `ob`.
    fn pointing(&self, ob: &Observation) -> FusedPointing<'_> {
        match &self.compact {
            Some(c) => FusedPointing::Compact(compact_pointing(c, ob)),
            None => FusedPointing::Kept {
                pixels: &self.pixels,
                weights: &self.weights,
            },
        }
    }
}

/// The compact pointing of `c` as the fused kernels read it in `ob` (its
/// HWP angle where the observation has one).
fn compact_pointing<'a>(
    c: &'a crate::ops::ExpandCompactPointing,
    ob: &Observation,
) -> CompactPointing<'a> {
    let dp = &c.det_pointing;
    CompactPointing {
        compact: &c.compact,
        boresight: &dp.boresight,
        shared_flags: dp.shared_flags_in_use(),
        hwp: c
            .weights
            .hwp_angle
            .as_deref()
            .filter(|h| ob.shared.contains(h)),
        iau: c.weights.iau,
    }
}

impl MapMaker {
    /// The solver's fused device pass (see [`DevicePass`]).
    pub(super) fn device_pass(&self, tmpl: &Arc<OffsetTemplate>, keys: &Keys) -> DevicePass {
        let binner = &self.setup.binner;
        let compact = match self.plan.device_fused_form() {
            Fused::Compact => self.solve_pointing.compact.clone(),
            Fused::Kept => None,
        };
        DevicePass {
            operator: self.setup.name.clone(),
            compact,
            pixels: self.solve_pointing.pixels_field().to_string(),
            weights: self.solve_pointing.weights_field().to_string(),
            map: keys.solve_bin.clone(),
            pixel_dist: binner.pixel_dist.clone(),
            noise_model: binner.noise_model.clone(),
            view: self.solve_pointing.view().map(str::to_string),
            template: Arc::clone(tmpl),
        }
    }

    /// `q = A d` (TOAST's `SolverLHS`) on a device with the fused kernels
    /// as pipeline steps: `F d` rebuilt from the amplitudes and binned
    /// into the solver's map ([`AccumulateStep`], after the pass's pointing
    /// when it is recomputed), the sum over the job and the covariance,
    /// then `Fᵀ N⁻¹ (F d - P m)` into `keys.lhs_out` ([`ProjectStep`]). No
    /// work timestream exists; per batch, the pointing and one kernel call
    /// per observation in each half.
    pub(super) fn lhs_device(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        tmpl: &Arc<OffsetTemplate>,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let binner = self.setup.binner.clone();
        let device = self.device_pass(tmpl, keys);
        let pass = self.solver_pass(&binner, keys, &keys.temp);
        let mut accumulate = AccumulateStep {
            pass: device.clone(),
            input: StepInput::Amplitudes(keys.lhs_in.clone()),
            flags: pass.flags.clone(),
        };
        // Kept pointing, or compact (rebuilt inside the kernels): no
        // pointing step, and with compact pointing nothing is made per
        // batch, so one kernel call per observation for all detectors;
        // else the batch's pointing, recomputed before the step.
        let compact = self.plan.device_fused_form() == Fused::Compact;
        let sets = if compact {
            DetectorSets::All
        } else {
            self.work_sets(data)
        };
        let kept = self.plan.keeps_pointing() || compact;
        let pointing = PassPointing::of(&mut self.solve_pointing, kept);
        bin_map_with(
            data,
            ctx,
            pass,
            pointing,
            Vec::new(),
            &sets,
            Some(&mut accumulate),
        )?;
        let input = StepInput::Amplitudes(keys.lhs_in.clone());
        let output = ("reset_lhs_out", keys.lhs_out.as_str());
        self.project_device(
            data,
            ctx,
            (device, keys),
            ("SolverLHS", input, output),
            false,
        )
    }

    /// The projection `Fᵀ N⁻¹ (t - P m)` of `input` into the amplitudes
    /// `output` on a device, as the pipeline `name`: the amplitudes' reset
    /// (operator `output.0`), then per pass (or batch) the pointing when it
    /// is recomputed (or `expand`) and a [`ProjectStep`].
    pub(super) fn project_device(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        (pass, keys): (DevicePass, &Keys),
        (name, input, output): (&str, StepInput, (&str, &str)),
        expand: bool,
    ) -> Result<(), OpError> {
        let project = ProjectStep {
            pass,
            input,
            solve_flags: keys.solve_flags.clone(),
            det_mask: self.setup.binner.det_mask,
            amplitudes: output.1.to_string(),
        };
        let mut tail: Vec<Box<dyn toast_core::Operator>> = vec![
            Box::new(super::solve::amplitude_reset(output.0, output.1)),
            Box::new(project),
        ];
        let rebuilt = self.plan.device_fused_form() == Fused::Compact;
        self.run_projection(data, ctx, name, Vec::new(), (expand, rebuilt), &mut tail)
    }
}

/// A solver pass's accumulation `Pᵀ N⁻¹ t` into the solver's map as a
/// pipeline step (`fused_accumulate` with kept pointing, one call per
/// observation for the pass's detectors): on a device, `t` is `F a`
/// rebuilt from the amplitudes inside the kernel (the left-hand side), so
/// no work timestream exists. The map is reset before the first batch by
/// the caller ([`crate::ops::binning::bin_map_with`]). No detector's
/// weights count as finite (they are on the device): no sample is
/// skipped, the same sums.
pub(super) struct AccumulateStep {
    /// The pass.
    pub pass: DevicePass,
    /// The samples' values.
    pub input: StepInput,
    /// Which samples to bin.
    pub flags: FlagSelection,
}

impl toast_core::Operator for AccumulateStep {
    fn name(&self) -> &str {
        "fused_accumulate"
    }
    fn requires(&self) -> toast_core::Requirements {
        let mut r = self.input.require(self.pass.requires());
        if let Some((f, _)) = self.flags.det() {
            r = r.detdata(f);
        }
        if let Some((f, _)) = self.flags.shared() {
            r = r.shared(f);
        }
        r
    }
    fn provides(&self) -> toast_core::Requirements {
        toast_core::Requirements::new().global(&self.pass.map)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let p = &self.pass;
        let accumulation = Accumulation {
            operator: &p.operator,
            flags: &self.flags,
            noise_model: &p.noise_model,
            view: p.view.as_deref(),
            template: Some(&p.template),
            input: self.input.fused(),
            map: p.map(),
        };
        let finite = |_: &Observation, dets: &[String]| vec![0u8; dets.len()];
        accumulate_observations(
            data,
            ctx,
            (&accumulation, None),
            |ob| Ok(p.pointing(ob)),
            finite,
        )
    }
}

/// A solver pass's projection `Fᵀ N⁻¹ (t - P m)` as a pipeline step
/// (`fused_project` with kept pointing, one call per observation for the
/// pass's detectors): on a device, `t` is the timestream's rows of the
/// pass's detectors (the right-hand side, through the kernel's row index)
/// or `F a` rebuilt from the amplitudes (the left-hand side), with the
/// kept pointing or the batch's transient one, so no work timestream
/// exists (8 bytes a detector sample of device memory saved). The
/// amplitudes it writes are the pass's detectors' (reset once, before the
/// batches, by the caller).
pub(super) struct ProjectStep {
    /// The pass.
    pub pass: DevicePass,
    /// The samples' values `t`.
    pub input: StepInput,
    /// The solver flags (every bit cuts).
    pub solve_flags: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// The output amplitudes.
    pub amplitudes: String,
}

impl toast_core::Operator for ProjectStep {
    fn name(&self) -> &str {
        "fused_projection"
    }
    fn requires(&self) -> toast_core::Requirements {
        self.input
            .require(self.pass.requires())
            .detdata(&self.solve_flags)
            .global(&self.amplitudes)
    }
    fn provides(&self) -> toast_core::Requirements {
        toast_core::Requirements::new().global(&self.amplitudes)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let p = &self.pass;
        let projection = Projection {
            operator: &p.operator,
            det_mask: self.det_mask,
            noise_model: &p.noise_model,
            view: p.view.as_deref(),
            template: &p.template,
            input: self.input.fused(),
            solve_flags: &self.solve_flags,
            map: p.map(),
            output: &self.amplitudes,
        };
        project_observations(data, ctx, &projection, |ob| Ok(p.pointing(ob)))
    }
}
