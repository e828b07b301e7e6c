//! The offset ("baselines") template: each detector's timestream is modelled
//! as a step function of `step_length = rint(step_time · rate)` samples
//! (TOAST's `templates.Offset`, without the noise prior).
//!
//! # Amplitude layout
//!
//! Amplitudes are stored detector-major, as in TOAST: for each detector in
//! order of first appearance across the observations, for each observation
//! that has it, for each interval of the view, `ceil(len / step_length)`
//! amplitudes (the last step of an interval may be short). A new offset
//! starts at the beginning of each interval. Sample `s` of interval `v`
//! maps to amplitude `block + Σ_{u<v} n_amp_views[u] + (s - first_v) /
//! step_length`; this is exactly the layout of the `template_offset_*`
//! kernels, which take one `amp_offset` per detector.
//!
//! # Flags and preconditioner
//!
//! At initialisation each amplitude counts the good samples of its span
//! (spans lie inside the view): samples whose detector flags have a bit of
//! the flag mask are bad. An amplitude with `n_good / span_length <= good_fraction`
//! is flagged: it is neither projected nor added, and its preconditioner
//! entry is 0. Otherwise its variance is `1 / (w_det · n_good)`, with
//! `w_det` the noise model's detector weight, or 1 without a noise model
//! (TOAST's default, and what its satellite benchmark uses). The diagonal
//! preconditioner applies these variances
//! (`template_offset_apply_diag_precond`). A detector whose noise weight is
//! 0 has all its amplitudes flagged.
//!
//! The flags and variances are kept in the data's metadata as
//! [`HostArray`]s (`{name}_amp_flags`, `{name}_offset_var`), so the kernels
//! can read them from staged device copies like any other global item.

use crate::exec::global_data::HostArray;
use crate::exec::kernels::{self, view_intervals, AmplitudeKeys, KernelCall, OffsetLayout};
use crate::ops::{detector_weights, select_detectors};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use toast_accel::abi;
use toast_core::num::Compact;
use toast_core::observation::defaults;
use toast_core::{Category, Data, ExecContext, Observation, OpError, Operator, Requirements};

/// Configuration of the offset template (TOAST trait names and defaults,
/// loaded from the `baselines` section).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct OffsetConfig {
    /// Whether the template is used.
    pub enabled: bool,
    /// Seconds per baseline step.
    pub step_time: f64,
    /// Shared field of timestamps (for the sample rate).
    pub times: String,
    /// Observation key of the noise model for the amplitude variances
    /// (`None`: weight 1, TOAST's default).
    pub noise_model: Option<String>,
    /// Fraction of good samples an amplitude needs to be kept.
    pub good_fraction: f64,
    /// Noise prior (not implemented: must be false).
    pub use_noise_prior: bool,
    /// Width of the noise-prior preconditioner (unused without a prior).
    pub precond_width: i64,
    /// Interval list that bounds the offsets (`None`: the map-maker's view).
    pub view: Option<String>,
}

impl Default for OffsetConfig {
    fn default() -> Self {
        OffsetConfig {
            enabled: true,
            step_time: 10000.0,
            times: defaults::TIMES.into(),
            noise_model: None,
            good_fraction: 0.5,
            use_noise_prior: false,
            precond_width: 20,
            view: None,
        }
    }
}

impl OffsetConfig {
    /// Check the values.
    pub fn validate(&self) -> Result<(), OpError> {
        let bad = |m: String| Err(OpError::Config(format!("baselines: {m}")));
        if !(self.step_time.is_finite() && self.step_time > 0.0) {
            return bad(format!(
                "step_time = {} must be positive",
                Compact(self.step_time)
            ));
        }
        if !(0.0..=1.0).contains(&self.good_fraction) {
            return bad(format!(
                "good_fraction = {} must lie in [0, 1]",
                Compact(self.good_fraction)
            ));
        }
        if self.precond_width < 1 {
            return bad(format!(
                "precond_width = {} must be >= 1",
                self.precond_width
            ));
        }
        if self.use_noise_prior {
            return bad(
                "use_noise_prior = true is not implemented (the noise prior and its banded \
                 preconditioner); set it to false"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The effective sample rate of `times`: `1 / median(diff(times))`, as
/// TOAST's `rate_from_times`.
pub fn rate_from_times(observation: &str, times: &[f64]) -> Result<f64, OpError> {
    if times.len() < 2 {
        return Err(OpError::InvalidData {
            what: format!(
                "observation '{observation}': {} timestamps are too few for a sample rate",
                times.len()
            ),
        });
    }
    let mut d: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    let n = d.len();
    let mid = n / 2;
    let (_, hi, _) = d.select_nth_unstable_by(mid, f64::total_cmp);
    let hi = *hi;
    let med = if n % 2 == 1 {
        hi
    } else {
        let lo = d[..mid].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo + hi) / 2.0
    };
    if !(med.is_finite() && med > 0.0) {
        return Err(OpError::InvalidData {
            what: format!(
                "observation '{observation}': the median sample spacing {med} is not positive"
            ),
        });
    }
    Ok(1.0 / med)
}

/// The layout of one observation.
#[derive(Debug, Clone)]
struct ObsLayout {
    observation: String,
    step_length: i64,
    n_amp_views: Vec<i64>,
    intervals: Vec<abi::SampleRange>,
    /// Detectors with amplitudes here, in the observation's order.
    dets: Vec<String>,
    /// First amplitude of each of `dets`.
    amp_offset: Vec<i64>,
}

/// One observation's amplitude layout ([`OffsetTemplate::obs_amplitudes`]):
/// amplitude `k` of view `v` of a detector is `offset(det) + Σ_{u < v}
/// n_amp_views[u] + k` and covers samples `intervals[v].first + k ·
/// step_length` up to the next step or the view's end.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ObsAmplitudes<'a> {
    /// Samples per amplitude.
    pub step_length: usize,
    /// The views the amplitudes cover.
    pub intervals: &'a [abi::SampleRange],
    /// Amplitudes per view.
    pub n_amp_views: &'a [i64],
    dets: &'a [String],
    amp_offset: &'a [i64],
}

impl ObsAmplitudes<'_> {
    /// The first amplitude of detector `det`, if it has amplitudes here.
    pub fn offset(&self, det: &str) -> Option<usize> {
        let k = self.dets.iter().position(|d| d == det)?;
        Some(self.amp_offset[k] as usize)
    }
}

/// An initialised offset template: the amplitude layout over the data, the
/// amplitude flags and variances (see the module documentation).
#[derive(Debug, Clone)]
pub struct OffsetTemplate {
    name: String,
    /// The configuration.
    pub config: OffsetConfig,
    view: Option<String>,
    layout: Vec<ObsLayout>,
    all_dets: Vec<String>,
    n_amp: usize,
    n_flagged: usize,
}

/// What the template reads at initialisation.
#[derive(Debug, Clone, Copy)]
pub struct OffsetInit<'a> {
    /// Timestream field (detectors without it are skipped).
    pub det_data: &'a str,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Per-sample flags and the bits that make a sample bad.
    pub det_flags: Option<(&'a str, u8)>,
    /// The view bounding the offsets (the config's view wins).
    pub view: Option<&'a str>,
}

impl OffsetTemplate {
    /// Lay out the amplitudes of the detectors `ctx` selects in every
    /// observation, flag the poorly sampled ones and compute the variances
    /// from the flags on the host; store the flags and variances in
    /// `data.meta`.
    pub fn initialize(
        name: impl Into<String>,
        config: OffsetConfig,
        data: &mut Data,
        ctx: &ExecContext,
        init: OffsetInit<'_>,
    ) -> Result<Self, OpError> {
        let mut t = Self::lay_out(name, config, data, ctx, init)?;
        let good = t.good_samples_on_host(data, init.det_flags)?;
        t.flag_and_weigh(data, &good)?;
        Ok(t)
    }

    /// Lay out the amplitudes of the detectors `ctx` selects in every
    /// observation (none flagged yet: zero flags and variances stored in
    /// `data.meta`); [`OffsetTemplate::flag_and_weigh`] completes it.
    pub fn lay_out(
        name: impl Into<String>,
        config: OffsetConfig,
        data: &mut Data,
        ctx: &ExecContext,
        init: OffsetInit<'_>,
    ) -> Result<Self, OpError> {
        config.validate()?;
        let name = name.into();
        let view = config.view.clone().or(init.view.map(str::to_string));
        let mut layout = Vec::with_capacity(data.obs.len());
        let mut all_dets: Vec<String> = Vec::new();
        for ob in &data.obs {
            let times = ob.shared.data::<f64>(&config.times)?;
            let rate = rate_from_times(ob.name(), times)?;
            let step_length = (config.step_time * rate).round_ties_even();
            if !(step_length >= 1.0 && step_length < i64::MAX as f64) {
                return Err(OpError::Config(format!(
                    "observation '{}': baselines step_time {} s at {rate} Hz gives a step of \
                     {step_length} samples",
                    ob.name(),
                    config.step_time
                )));
            }
            let intervals = view_intervals(ob, view.as_deref())?;
            // A step at least as long as a view gives that view one
            // amplitude (TOAST's `ceil(len / step_length)`); clamping to the
            // longest view keeps that layout and keeps the kernels' sample
            // arithmetic (`first + k · step_length`) far from overflow.
            let longest = intervals
                .iter()
                .map(|iv| iv.last - iv.first)
                .max()
                .unwrap_or(1)
                .max(1);
            let step_length = (step_length as i64).min(longest);
            let n_amp_views: Vec<i64> = intervals
                .iter()
                .map(|iv| {
                    let len = iv.last - iv.first;
                    (len + step_length - 1) / step_length
                })
                .collect();
            let dets: Vec<String> = if intervals.is_empty() || !ob.detdata.contains(init.det_data) {
                Vec::new()
            } else {
                let field = ob.detdata.get(init.det_data)?;
                select_detectors(ctx, ob, init.det_mask)
                    .into_iter()
                    .filter(|d| field.row_index(d).is_some())
                    .collect()
            };
            for d in &dets {
                if !all_dets.contains(d) {
                    all_dets.push(d.clone());
                }
            }
            layout.push(ObsLayout {
                observation: ob.name().to_string(),
                step_length,
                n_amp_views,
                intervals,
                amp_offset: Vec::new(),
                dets,
            });
        }

        // Detector-major offsets.
        let mut offset = 0i64;
        let mut starts: BTreeMap<(usize, String), i64> = BTreeMap::new();
        for d in &all_dets {
            for (i, lay) in layout.iter().enumerate() {
                if lay.dets.contains(d) {
                    starts.insert((i, d.clone()), offset);
                    offset += lay.n_amp_views.iter().sum::<i64>();
                }
            }
        }
        for (i, lay) in layout.iter_mut().enumerate() {
            lay.amp_offset = lay.dets.iter().map(|d| starts[&(i, d.clone())]).collect();
        }
        let n_amp = offset as usize;
        let t = OffsetTemplate {
            name,
            config,
            view,
            layout,
            all_dets,
            n_amp,
            n_flagged: 0,
        };
        data.meta
            .set_object(t.flags_key(), HostArray::<u8>::zeros(n_amp));
        data.meta
            .set_object(t.var_key(), HostArray::<f64>::zeros(n_amp));
        Ok(t)
    }

    /// The number of samples of each amplitude's span, in amplitude order.
    pub fn span_lengths(&self) -> Vec<i64> {
        let mut len = vec![0i64; self.n_amp];
        for lay in &self.layout {
            for &start in &lay.amp_offset {
                let mut amp = start as usize;
                for (iv, &n) in lay.intervals.iter().zip(&lay.n_amp_views) {
                    let view_len = iv.last - iv.first;
                    for k in 0..n {
                        len[amp] = (view_len - k * lay.step_length).min(lay.step_length);
                        amp += 1;
                    }
                }
            }
        }
        len
    }

    /// The good samples of each amplitude's span, in amplitude order,
    /// counted on the host: those whose flags (`(field, mask)`) have no bit
    /// of the mask (all of them without flags).
    pub fn good_samples_on_host(
        &self,
        data: &Data,
        det_flags: Option<(&str, u8)>,
    ) -> Result<Vec<i64>, OpError> {
        let mut good = self.span_lengths();
        let Some((field, mask)) = det_flags else {
            return Ok(good);
        };
        for (lay, ob) in self.layout.iter().zip(&data.obs) {
            for (d, &start) in lay.dets.iter().zip(&lay.amp_offset) {
                let f = ob.detdata.get(field)?.row_of::<u8>(d)?;
                let mut amp = start as usize;
                for (iv, &n) in lay.intervals.iter().zip(&lay.n_amp_views) {
                    for k in 0..n {
                        let first = iv.first + k * lay.step_length;
                        let last = (first + lay.step_length).min(iv.last);
                        let bad = f[first as usize..last as usize]
                            .iter()
                            .filter(|&&x| x & mask != 0)
                            .count();
                        good[amp] -= bad as i64;
                        amp += 1;
                    }
                }
            }
        }
        Ok(good)
    }

    /// Flag the poorly sampled amplitudes and compute the variances from
    /// the good samples of each span (`good`, in amplitude order; see the
    /// module documentation); store them in `data.meta`.
    pub fn flag_and_weigh(&mut self, data: &mut Data, good: &[i64]) -> Result<(), OpError> {
        if good.len() != self.n_amp {
            return Err(OpError::State {
                what: format!(
                    "offset template '{}': {} good-sample counts for {} amplitudes",
                    self.name,
                    good.len(),
                    self.n_amp
                ),
            });
        }
        let span = self.span_lengths();
        let mut flags = vec![0u8; self.n_amp];
        let mut var = vec![0.0f64; self.n_amp];
        for (lay, ob) in self.layout.iter().zip(&data.obs) {
            let weights = match &self.config.noise_model {
                Some(key) => detector_weights(ob, key, &lay.dets)?,
                None => vec![1.0; lay.dets.len()],
            };
            for (&start, &w) in lay.amp_offset.iter().zip(&weights) {
                let n: i64 = lay.n_amp_views.iter().sum();
                for amp in start as usize..(start + n) as usize {
                    let n_good = good[amp];
                    if w <= 0.0 || n_good as f64 / span[amp] as f64 <= self.config.good_fraction {
                        flags[amp] = 1;
                    } else {
                        var[amp] = 1.0 / (w * n_good as f64);
                    }
                }
            }
        }
        self.n_flagged = flags.iter().filter(|&&f| f != 0).count();
        data.meta
            .set_object(self.flags_key(), HostArray { values: flags });
        data.meta
            .set_object(self.var_key(), HostArray { values: var });
        tracing::debug!(
            "offset template '{}': {} amplitudes ({} flagged) for {} detectors",
            self.name,
            self.n_amp,
            self.n_flagged,
            self.all_dets.len()
        );
        Ok(())
    }

    /// Instance name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Number of amplitudes.
    pub fn n_amplitudes(&self) -> usize {
        self.n_amp
    }
    /// Number of flagged amplitudes.
    pub fn n_flagged(&self) -> usize {
        self.n_flagged
    }
    /// Detectors with amplitudes, in layout order.
    pub fn detectors(&self) -> &[String] {
        &self.all_dets
    }
    /// The view bounding the offsets.
    pub fn view(&self) -> Option<&str> {
        self.view.as_deref()
    }
    /// Step length (samples) in observation `i`.
    pub fn step_length(&self, i: usize) -> Option<i64> {
        self.layout.get(i).map(|l| l.step_length)
    }
    /// Global key of the amplitude flags (`HostArray<u8>`).
    pub fn flags_key(&self) -> String {
        format!("{}_amp_flags", self.name)
    }
    /// Global key of the amplitude variances (`HostArray<f64>`).
    pub fn var_key(&self) -> String {
        format!("{}_offset_var", self.name)
    }
    /// A zeroed amplitude vector.
    pub fn zeros(&self) -> HostArray<f64> {
        HostArray::zeros(self.n_amp)
    }

    /// The amplitude index of `(detector, observation index, sample)`, if
    /// that sample belongs to an amplitude.
    pub fn amplitude_of(&self, det: &str, obs: usize, sample: i64) -> Option<usize> {
        let lay = self.layout.get(obs)?;
        let di = lay.dets.iter().position(|d| d == det)?;
        let mut off = lay.amp_offset[di];
        for (iv, &n) in lay.intervals.iter().zip(&lay.n_amp_views) {
            if sample >= iv.first && sample < iv.last {
                return Some((off + (sample - iv.first) / lay.step_length) as usize);
            }
            off += n;
        }
        None
    }

    /// The amplitude layout of observation `i` (`ob`, checked to be the
    /// one the template was initialised on), for the map-maker's fused host
    /// passes, which walk amplitudes themselves instead of calling the
    /// kernels.
    pub(crate) fn obs_amplitudes(
        &self,
        ob: &Observation,
        i: usize,
    ) -> Result<ObsAmplitudes<'_>, OpError> {
        self.check_obs(ob, i)?;
        let lay = &self.layout[i];
        Ok(ObsAmplitudes {
            step_length: lay.step_length as usize,
            intervals: &lay.intervals,
            n_amp_views: &lay.n_amp_views,
            dets: &lay.dets,
            amp_offset: &lay.amp_offset,
        })
    }

    /// The detectors (and their amplitude offsets) of observation `i` that
    /// `ctx` selects.
    fn selected(&self, ctx: &ExecContext, i: usize) -> (Vec<String>, Vec<i64>) {
        let lay = &self.layout[i];
        let sel = ctx.selected_detectors(&lay.dets);
        let offs = sel
            .iter()
            .map(|d| {
                let k = lay.dets.iter().position(|x| x == d).unwrap_or(0);
                lay.amp_offset[k]
            })
            .collect();
        (sel, offs)
    }

    fn check_obs(&self, ob: &Observation, i: usize) -> Result<(), OpError> {
        if self
            .layout
            .get(i)
            .is_none_or(|l| l.observation != ob.name())
        {
            return Err(OpError::State {
                what: format!(
                    "offset template '{}' was initialised on other data (observation '{}' at \
                     position {i})",
                    self.name,
                    ob.name()
                ),
            });
        }
        Ok(())
    }

    /// `det_data += F a` for the selected detectors (unflagged amplitudes).
    pub fn add_to_signal(
        &self,
        ctx: &mut ExecContext,
        operator: &str,
        data: &mut Data,
        amplitudes: &str,
        det_data: &str,
    ) -> Result<(), OpError> {
        if data.obs.len() != self.layout.len() {
            return Err(self.mismatch(data));
        }
        let flags_key = self.flags_key();
        let keys = AmplitudeKeys {
            amplitudes,
            flags: &flags_key,
        };
        let Data { obs, meta } = data;
        for (i, ob) in obs.iter_mut().enumerate() {
            self.check_obs(ob, i)?;
            let (dets, offs) = self.selected(ctx, i);
            if dets.is_empty() {
                continue;
            }
            let lay = &self.layout[i];
            let call = KernelCall {
                operator,
                detectors: &dets,
                intervals: &lay.intervals,
            };
            let layout = OffsetLayout {
                step_length: lay.step_length,
                n_amp_views: &lay.n_amp_views,
                amp_offset: &offs,
            };
            kernels::offset_add_to_signal(ctx, call, ob, meta, layout, keys, det_data)?;
        }
        Ok(())
    }

    /// `a += Fᵀ det_data` over good samples (`flags & mask == 0`) for the
    /// selected detectors (unflagged amplitudes).
    pub fn project_signal(
        &self,
        ctx: &mut ExecContext,
        operator: &str,
        data: &mut Data,
        det_data: &str,
        det_flags: Option<(&str, u8)>,
        amplitudes: &str,
    ) -> Result<(), OpError> {
        if data.obs.len() != self.layout.len() {
            return Err(self.mismatch(data));
        }
        let flags_key = self.flags_key();
        let keys = AmplitudeKeys {
            amplitudes,
            flags: &flags_key,
        };
        let Data { obs, meta } = data;
        for (i, ob) in obs.iter_mut().enumerate() {
            self.check_obs(ob, i)?;
            let (dets, offs) = self.selected(ctx, i);
            if dets.is_empty() {
                continue;
            }
            let lay = &self.layout[i];
            let call = KernelCall {
                operator,
                detectors: &dets,
                intervals: &lay.intervals,
            };
            let layout = OffsetLayout {
                step_length: lay.step_length,
                n_amp_views: &lay.n_amp_views,
                amp_offset: &offs,
            };
            kernels::offset_project_signal(ctx, call, ob, meta, layout, det_data, det_flags, keys)?;
        }
        Ok(())
    }

    /// `output = M input`, the diagonal preconditioner.
    pub fn apply_precond(
        &self,
        ctx: &mut ExecContext,
        operator: &str,
        data: &mut Data,
        input: &str,
        output: &str,
    ) -> Result<(), OpError> {
        if self.n_amp == 0 {
            return Ok(());
        }
        let flags_key = self.flags_key();
        kernels::offset_apply_diag_precond(
            ctx,
            operator,
            &mut data.meta,
            &self.var_key(),
            AmplitudeKeys {
                amplitudes: input,
                flags: &flags_key,
            },
            output,
        )
    }

    fn mismatch(&self, data: &Data) -> OpError {
        OpError::State {
            what: format!(
                "offset template '{}' was initialised on {} observations, the data has {}",
                self.name,
                self.layout.len(),
                data.obs.len()
            ),
        }
    }
}

/// Pipeline step: `det_data += F a` (the template matrix, TOAST's
/// `TemplateMatrix(transpose=False)` for one offset template).
#[derive(Debug, Clone)]
pub struct OffsetAddToSignal {
    /// Instance name.
    pub name: String,
    /// The template.
    pub template: Arc<OffsetTemplate>,
    /// Global key of the amplitudes.
    pub amplitudes: String,
    /// Timestream field (must exist).
    pub det_data: String,
}

impl Operator for OffsetAddToSignal {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(&self.amplitudes)
            .global(self.template.flags_key())
            .detdata(&self.det_data);
        if let Some(v) = self.template.view() {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.det_data)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.template
            .add_to_signal(ctx, &self.name, data, &self.amplitudes, &self.det_data)
    }
}

/// Pipeline step: `a += Fᵀ det_data` (TOAST's
/// `TemplateMatrix(transpose=True)` for one offset template). The amplitude
/// vector is accumulated into; zero it first.
#[derive(Debug, Clone)]
pub struct OffsetProjectSignal {
    /// Instance name.
    pub name: String,
    /// The template.
    pub template: Arc<OffsetTemplate>,
    /// Timestream field.
    pub det_data: String,
    /// Per-sample flags and the bits that exclude a sample.
    pub det_flags: Option<(String, u8)>,
    /// Global key of the output amplitudes.
    pub amplitudes: String,
}

impl Operator for OffsetProjectSignal {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(self.template.flags_key())
            .detdata(&self.det_data);
        if let Some((f, _)) = &self.det_flags {
            r.add(Category::DetData, f);
        }
        if let Some(v) = self.template.view() {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.amplitudes)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let flags = self.det_flags.as_ref().map(|(f, m)| (f.as_str(), *m));
        self.template.project_signal(
            ctx,
            &self.name,
            data,
            &self.det_data,
            flags,
            &self.amplitudes,
        )
    }
}

/// Pipeline step: `output = M input` (the diagonal preconditioner).
#[derive(Debug, Clone)]
pub struct OffsetApplyPrecond {
    /// Instance name.
    pub name: String,
    /// The template.
    pub template: Arc<OffsetTemplate>,
    /// Global key of the input amplitudes.
    pub input: String,
    /// Global key of the output amplitudes (must exist).
    pub output: String,
}

impl Operator for OffsetApplyPrecond {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new()
            .global(&self.input)
            .global(self.template.flags_key())
            .global(self.template.var_key())
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.output)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.template
            .apply_precond(ctx, &self.name, data, &self.input, &self.output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_the_median_spacing() {
        let t: Vec<f64> = (0..11).map(|i| i as f64 * 0.01).collect();
        assert!((rate_from_times("o", &t).unwrap() - 100.0).abs() < 1e-9);
        // An outlier gap does not move the median.
        let mut t2 = t.clone();
        for x in &mut t2[6..] {
            *x += 5.0;
        }
        assert!((rate_from_times("o", &t2).unwrap() - 100.0).abs() < 1e-9);
        // Even number of spacings: the mean of the two middle ones.
        let t3 = [0.0, 1.0, 3.0, 6.0, 10.0];
        assert_eq!(rate_from_times("o", &t3).unwrap(), 1.0 / 2.5);
        assert!(rate_from_times("o", &[1.0]).is_err());
        assert!(rate_from_times("o", &[1.0, 1.0]).is_err());
    }

    #[test]
    fn config_validation() {
        assert!(OffsetConfig::default().validate().is_ok());
        let c = OffsetConfig {
            use_noise_prior: true,
            ..OffsetConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("use_noise_prior"));
        let c = OffsetConfig {
            step_time: 0.0,
            ..OffsetConfig::default()
        };
        assert!(c.validate().is_err());
        let c = OffsetConfig {
            good_fraction: 1.5,
            ..OffsetConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
