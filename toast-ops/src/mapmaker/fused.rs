//! The map-maker's fused passes on the host, with compact or kept pointing.
//!
//! The unfused solver passes fill a work timestream (`F a`, or a copy of
//! the signal) per detector batch and hand it to the kernels one after the
//! other (accumulate; then scan and subtract, noise weight, project), each
//! reading and writing it again; with `binner.compact_pointing` they also
//! rebuild each batch's pixels (i64) and IQU weights (3 f64) into fields of
//! the batch's length: up to about 40 bytes a sample written to memory and
//! read back per pass. The fused passes read only what is kept (the
//! pointing, the flags, the timestream or the amplitudes) and consume each
//! sample at once; no work timestream exists. They run the solver's
//! right-hand side (`SolverRHS`), its left-hand side (`SolverLHS`, twice
//! per CG iteration in the unfused form) and, with compact pointing, the
//! final binned and destriped maps (`BinMap`).
//!
//! The walks are written once, generic over where a sample's pixel and
//! weights come from ([`DetPointing`], its [`PointingForm`] chosen per run
//! by [`MapMaker::fused_applies`] and expanded by `with_form!`):
//!
//! * **compact** ([`Rebuilt`]): the i32 compact pixels, the weights rebuilt
//!   from the boresight for blocks of [`BLOCK`] samples into a per-task
//!   buffer that stays in cache (no per-sample array of a detector's
//!   length);
//! * **kept** ([`Kept`], `binner.full_pointing`): the pointing kernels'
//!   i64 pixels and IQU weights, read in place. The final maps keep the
//!   kernel (`build_noise_weighted` on the kept fields, no work
//!   timestream either), measured as fast as a fused pass on tiny.
//!
//! The two walks:
//!
//! * **Binning** ([`Plan::accumulate`], into the pass's map): the sub-pixel
//!   axis of the map is split into one range per task, as the
//!   `build_noise_weighted` kernel does; every task walks the detectors
//!   (in the unfused pass's order: detector batch, observation, detector),
//!   views and samples in order, keeps the samples whose pixel falls in
//!   its range, rebuilds their weights (each sample's once in all, by the
//!   task that owns its pixel) or reads the kept ones, and accumulates
//!   them. Each map element is summed by one task in the unfused order, so
//!   the map is bit-identical to the unfused pass's for any thread count.
//!   The sum over the job and the covariance follow as in
//!   [`crate::ops::binning`].
//! * **Projection** ([`Plan::project`], the solver's `Fᵀ N⁻¹ (t - P m)`):
//!   tasks over (observation, view, amplitude range of about 16384
//!   samples, group of detectors), the detectors split into as many groups
//!   as it takes to give every thread a task (tiny's one amplitude per
//!   detector and view makes one range, so two groups of six at 2
//!   threads); each task walks its amplitudes' samples in blocks, every
//!   detector's block in turn (detectors on the same pixels, as a
//!   focal-plane pixel's A and B, read the map while it is in cache),
//!   rebuilds or reads the weights, scans the map, subtracts, noise
//!   weights and sums each amplitude's good samples in sample order.
//!
//! Every value is the unfused path's, operation for operation: the work
//! timestream `0 + a` (the zeroed timestream plus the amplitude, `0` under
//! a flagged amplitude) or the copied signal, the accumulation's `(d ·
//! w_det) · w_i`, the scan's `0 + Σ w_i m_i` in component order, the noise
//! weight, the projection's `+ (good ? t : 0)`, and the weights the kept
//! field's or, rebuilt, from the same function as
//! [`crate::ops::ExpandCompactPointing`]'s. The one shortcut is exact: a
//! sample of value ±0 is left out of the accumulation where it adds ±0 to
//! a map value that cannot be `-0` (`DetPass::zero_skips`); on xsmall most
//! amplitudes are flagged, so the left-hand side's binning skips most
//! detectors. So the solution and the maps are byte-identical to the
//! unfused passes' with the same pointing (test
//! `fused_passes_are_the_unfused_ones_bit_for_bit` in
//! `toast-ops/tests/mapmaker.rs`, compact and kept, at 1 and 2 threads,
//! with one and two observations and two batch sizes; and the CLI's tiny
//! and xsmall maps).
//!
//! They apply to host runs with compact or kept pointing, IQU weights, no
//! separate final pixelization and, for the solver, a template whose views
//! are the pointing's (the satellite workflow's); otherwise (a device run,
//! recomputed pointing, [`MapMaker::fused_passes`] off) the unfused passes
//! run.

use super::products::Keys;
use super::{timed, MapMaker};
use crate::accel::global_data::HostArray;
use crate::accel::kernels::view_intervals;
use crate::accel::pipeline::DetectorSets;
use crate::ops::binning::{finish_bin_map, prepare_bin_map, BinPass};
use crate::ops::{detector_weights, select_detectors, CompactSource, DetParams};
use crate::pixels::{PixelData, PixelDistribution};
use crate::templates::OffsetTemplate;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use toast_accel::abi::SampleRange;
use toast_core::{Data, ExecContext, Observation, OpError, PixelOutOfRange};

/// Samples per block of rebuilt weights (24 KiB of weights per block).
const BLOCK: usize = 1024;

/// Samples of work per projection task (the kernel's).
const PROJECT_TASK: usize = 16384;

/// Where a fused pass reads one detector's pixel and IQU weights of each
/// sample: rebuilt from the compact pixels ([`Rebuilt`]) or kept
/// ([`Kept`]). The walks are generic over it, so each form gets its own
/// inner loops, and both run the same code.
trait DetPointing: Sync {
    /// Whether the weights are rebuilt into the caller's buffer (else read
    /// where they are kept, and the buffer is not used).
    const REBUILT: bool;

    /// The pixel of sample `s` (negative: not pointed, skipped).
    fn pixel(&self, s: usize) -> i64;

    /// The weights of samples `b0..b1` (3 per sample, in order), rebuilt
    /// into `buf` (of [`weights_buffer`]) or the kept ones.
    fn span<'w>(&'w self, b0: usize, b1: usize, buf: &'w mut [f64]) -> &'w [f64];

    /// The weights of the `samples` (at most [`BLOCK`]): with
    /// [`DetPointing::REBUILT`], those of `samples[j]` at `3 j..3 j + 3`
    /// of the result (rebuilt into `buf`); else the detector's kept
    /// weights, those of sample `s` at `3 s..3 s + 3` (`samples` unused).
    fn picked<'w>(&'w self, samples: &[u32], buf: &'w mut [f64]) -> &'w [f64];
}

/// `z_i += scaled · w_i` for the three Stokes values (the accumulation's
/// `(d · w_det) · w_i`).
#[inline(always)]
fn add_weighted(z: &mut [f64], scaled: f64, w: &[f64]) {
    for i in 0..3 {
        z[i] += scaled * w[i];
    }
}

/// The per-task buffer of rebuilt weights ([`BLOCK`] samples), empty when
/// the weights are kept.
fn weights_buffer<P: DetPointing>() -> Vec<f64> {
    vec![0.0; if P::REBUILT { 3 * BLOCK } else { 0 }]
}

/// Compact pointing: the i32 pixels, the weights rebuilt from the
/// boresight as [`crate::ops::ExpandCompactPointing`] does.
struct Rebuilt<'a> {
    pix: &'a [i32],
    src: CompactSource<'a>,
    params: DetParams,
}

impl DetPointing for Rebuilt<'_> {
    const REBUILT: bool = true;

    #[inline(always)]
    fn pixel(&self, s: usize) -> i64 {
        i64::from(self.pix[s])
    }

    fn span<'w>(&'w self, b0: usize, b1: usize, buf: &'w mut [f64]) -> &'w [f64] {
        let w = &mut buf[..3 * (b1 - b0)];
        self.src.weights(&self.params, b0, w);
        w
    }

    fn picked<'w>(&'w self, samples: &[u32], buf: &'w mut [f64]) -> &'w [f64] {
        self.src.weights_at(&self.params, samples, buf);
        &buf[..3 * samples.len()]
    }
}

/// Kept pointing (`binner.full_pointing`): the pointing kernels' i64
/// pixels and IQU weights, read in place.
struct Kept<'a> {
    pix: &'a [i64],
    weights: &'a [f64],
}

impl DetPointing for Kept<'_> {
    const REBUILT: bool = false;

    #[inline(always)]
    fn pixel(&self, s: usize) -> i64 {
        self.pix[s]
    }

    #[inline(always)]
    fn span<'w>(&'w self, b0: usize, b1: usize, _: &'w mut [f64]) -> &'w [f64] {
        &self.weights[3 * b0..3 * b1]
    }

    #[inline(always)]
    fn picked<'w>(&'w self, _: &[u32], _: &'w mut [f64]) -> &'w [f64] {
        self.weights
    }
}

/// A form of the pointing the fused passes read: how it is found in an
/// observation.
trait PointingForm {
    type Det<'a>: DetPointing;

    /// The pointing of detectors `dets` of `ob`, in order.
    fn detectors<'a>(
        mm: &MapMaker,
        ob: &'a Observation,
        dets: &[String],
    ) -> Result<Vec<Self::Det<'a>>, OpError>;
}

/// [`PointingForm`] of [`Rebuilt`].
struct CompactForm;

impl PointingForm for CompactForm {
    type Det<'a> = Rebuilt<'a>;

    fn detectors<'a>(
        mm: &MapMaker,
        ob: &'a Observation,
        dets: &[String],
    ) -> Result<Vec<Rebuilt<'a>>, OpError> {
        let c = mm.compact_ops()?;
        let src = CompactSource::of(&ob.shared, &c.det_pointing, &c.weights)?;
        let comp = ob.detdata.get(&c.compact)?;
        dets.iter()
            .map(|d| {
                Ok(Rebuilt {
                    pix: comp.row_of::<i32>(d)?,
                    src,
                    params: DetParams::of(ob, d)?,
                })
            })
            .collect()
    }
}

/// [`PointingForm`] of [`Kept`].
struct KeptForm;

impl PointingForm for KeptForm {
    type Det<'a> = Kept<'a>;

    fn detectors<'a>(
        mm: &MapMaker,
        ob: &'a Observation,
        dets: &[String],
    ) -> Result<Vec<Kept<'a>>, OpError> {
        let pix = ob.detdata.get(mm.solve_pointing.pixels_field())?;
        let wts = ob.detdata.get(mm.solve_pointing.weights_field())?;
        pix.check::<i64>(&[])?;
        wts.check::<f64>(&[3])?;
        dets.iter()
            .map(|d| {
                Ok(Kept {
                    pix: pix.row_of::<i64>(d)?,
                    weights: wts.row_of::<f64>(d)?,
                })
            })
            .collect()
    }
}

/// One detector of one observation, as the fused passes read it.
struct DetPass<'a, P> {
    name: &'a str,
    /// Its pixels and weights.
    pt: P,
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
struct ObsPass<'a, P> {
    name: &'a str,
    intervals: Vec<SampleRange>,
    step: usize,
    /// Shared flags that cut a sample in the binning, if any.
    shared_cut: Option<(&'a [u8], u8)>,
    dets: Vec<DetPass<'a, P>>,
}

/// What both passes read: the observations and the amplitudes.
struct Plan<'a, P> {
    obs: Vec<ObsPass<'a, P>>,
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

impl<P: DetPointing> Plan<'_, P> {
    /// The local submap and sub-pixel of pixel `p >= 0` of sample `s` of
    /// detector `d` of observation `o`, or the error naming it when the
    /// pixel is not stored here (as the kernels' fault).
    #[inline(always)]
    fn locate(
        &self,
        o: &ObsPass<'_, P>,
        d: &DetPass<'_, P>,
        s: usize,
        p: i64,
    ) -> Result<(usize, usize), OpError> {
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
        Err(Self::fault(o, d, s, p))
    }

    /// [`Plan::locate`]'s error (out of the hot loops).
    #[cold]
    #[inline(never)]
    fn fault(o: &ObsPass<'_, P>, d: &DetPass<'_, P>, s: usize, p: i64) -> OpError {
        PixelOutOfRange {
            what: "the map-maker's fused passes".into(),
            observation: o.name.to_string(),
            detector: d.name.to_string(),
            sample: s,
            pixel: p,
            limit: "is not in a local submap of the solver's pixel distribution".into(),
        }
        .into()
    }

    /// The timestream value `F d` under amplitude `k` of view `v`: the
    /// zeroed work timestream plus the amplitude (`0 + a`), `0` under a
    /// flagged amplitude or without amplitudes.
    #[inline(always)]
    fn value(&self, d: &DetPass<'_, P>, v: usize, k: usize) -> f64 {
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
        // Rebuilt weights: the block's samples to rebuild and accumulate
        // (local submap, cell in the range, value).
        let cap = if P::REBUILT { BLOCK } else { 0 };
        let mut samples: Vec<u32> = Vec::with_capacity(cap);
        let mut cells: Vec<(u32, u32, f64)> = Vec::with_capacity(cap);
        let mut w = weights_buffer::<P>();
        for &(oi, di) in order {
            let o = &self.obs[oi];
            let d = &o.dets[di];
            // Kept weights: read in place, sample by sample.
            let kept = if P::REBUILT {
                &[][..]
            } else {
                d.pt.picked(&[], &mut [])
            };
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
                            let p = d.pt.pixel(s);
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
                            if P::REBUILT {
                                samples.push(s as u32);
                                cells.push((l as u32, (sub - lo) as u32, x));
                            } else {
                                let c = sub - lo;
                                let z = &mut zmap[l][3 * c..3 * c + 3];
                                add_weighted(z, x * d.scale, &kept[3 * s..3 * s + 3]);
                            }
                        }
                        if P::REBUILT {
                            let ws = d.pt.picked(&samples, &mut w);
                            for (&(l, c, x), wj) in cells.iter().zip(ws.chunks_exact(3)) {
                                let z = &mut zmap[l as usize][3 * c as usize..3 * c as usize + 3];
                                add_weighted(z, x * d.scale, wj);
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

    /// The projection of amplitudes `[lo, hi)` of view `v` of the
    /// detectors `dets` of observation `oi` (see the module
    /// documentation): for each detector with amplitudes, its first
    /// amplitude's index and the values. Each amplitude's samples are
    /// visited in blocks of [`BLOCK`], every detector's block in turn
    /// (detectors that share pixels read the map while it is in cache),
    /// and summed in sample order.
    fn project(
        &self,
        map: &PixelData<f64>,
        (oi, v): (usize, usize),
        dets: std::ops::Range<usize>,
        (lo, hi): (usize, usize),
    ) -> Result<Vec<(usize, Vec<f64>)>, OpError> {
        let o = &self.obs[oi];
        let group: Vec<(&DetPass<'_, P>, usize, &[u8])> = o.dets[dets]
            .iter()
            .filter_map(|d| match (&d.view_amp, d.proj_flags) {
                (Some(va), Some(flags)) => Some((d, va[v], flags)),
                _ => None,
            })
            .collect();
        let iv = o.intervals[v];
        let (first, last) = (iv.first as usize, iv.last as usize);
        let mut w = weights_buffer::<P>();
        let mut out: Vec<(usize, Vec<f64>)> = group
            .iter()
            .map(|&(_, a0, _)| (a0 + lo, Vec::with_capacity(hi - lo)))
            .collect();
        // Per detector: the work timestream's value under the amplitude
        // (`None` under a flagged one) and the sum.
        let mut accs: Vec<(Option<f64>, f64)> = vec![(None, 0.0); group.len()];
        for k in lo..hi {
            for ((d, a0, _), acc) in group.iter().zip(accs.iter_mut()) {
                let x = match d.signal {
                    Some(_) => 0.0,
                    None => self.value(d, v, k),
                };
                *acc = ((self.amp_flags[a0 + k] == 0).then_some(x), 0.0);
            }
            let s0 = first + k * o.step;
            let s1 = s0.saturating_add(o.step).min(last);
            let mut b0 = s0;
            while b0 < s1 {
                let b1 = (b0 + BLOCK).min(s1);
                for (&(d, _, flags), acc) in group.iter().zip(accs.iter_mut()) {
                    if let (Some(x), sum) = acc {
                        let ws = d.pt.span(b0, b1, &mut w);
                        self.project_block((o, d), (b0, b1), ws, (*x, flags), map, sum)?;
                    }
                }
                b0 = b1;
            }
            for ((_, values), &(_, sum)) in out.iter_mut().zip(&accs) {
                values.push(sum);
            }
        }
        Ok(out)
    }

    /// Add to `acc`, in sample order, the noise-weighted `t - P m` of the
    /// samples `b0..b1` of detector `d` whose projection flags are 0 (`t`:
    /// the signal, or `x`; `ws`: their weights).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn project_block(
        &self,
        (o, d): (&ObsPass<'_, P>, &DetPass<'_, P>),
        (b0, b1): (usize, usize),
        ws: &[f64],
        (x, flags): (f64, &[u8]),
        map: &PixelData<f64>,
        acc: &mut f64,
    ) -> Result<(), OpError> {
        let nps = self.nps as usize;
        let m = map.data();
        for (s, wi) in (b0..b1).zip(ws.chunks_exact(3)) {
            // The work timestream: a copy of the signal, or `F a`.
            let mut t = match d.signal {
                Some(sig) => sig[s],
                None => x,
            };
            let p = d.pt.pixel(s);
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
            *acc += if flags[s] == 0 { t } else { 0.0 };
        }
        Ok(())
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

/// The pointing the fused passes read, as the run's plan says (see
/// [`MapMaker::fused_applies`]): compact ([`Rebuilt`]) or kept ([`Kept`]).
pub(super) use super::plan::FusedPointing as Fused;

/// `$body` with the type `$form` standing for the [`PointingForm`] of
/// `$fused` (one generic body, expanded for each form).
macro_rules! with_form {
    ($fused:expr, $form:ident => $body:expr) => {
        match $fused {
            Fused::Compact => {
                type $form = CompactForm;
                $body
            }
            Fused::Kept => {
                type $form = KeptForm;
                $body
            }
        }
    };
}

impl MapMaker {
    /// Whether the fused passes apply to this pass, and on which pointing:
    /// the run's plan has them ([`super::Plan::fused`]), the pointing they
    /// read is there (the compact form, or the kept fields in every
    /// observation) and, with a template, its views are the pointing's.
    pub(super) fn fused_applies(
        &self,
        data: &Data,
        tmpl: Option<&OffsetTemplate>,
    ) -> Result<Option<Fused>, OpError> {
        // The plan decided the form (host run, IQU weights, no final
        // pixelization); what remains are properties of the data.
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
        if !ready {
            return Ok(None);
        }
        let view = self.solve_pointing.view();
        if let Some(tmpl) = tmpl {
            for (i, ob) in data.obs.iter().enumerate() {
                let lay = tmpl.obs_amplitudes(ob, i)?;
                if view_intervals(ob, view)? != lay.intervals {
                    return Ok(None);
                }
            }
        }
        Ok(Some(form))
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

    /// Find, once per run, which detectors' weights (rebuilt or kept, as
    /// `fused` says) are all finite over the pointing's view (see
    /// `DetPass::zero_skips`): one pass over the samples of the detectors
    /// the binner selects, in parallel over detectors. A detector left out
    /// counts as not finite (its samples are then never skipped).
    pub(super) fn ensure_weights_finite(
        &mut self,
        data: &Data,
        ctx: &ExecContext,
        fused: Fused,
    ) -> Result<(), OpError> {
        if self.weights_finite.is_none() {
            let finite = with_form!(fused, F => self.weights_finite_of::<F>(data, ctx))?;
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

    /// [`MapMaker::ensure_weights_finite`]'s pass, for the pointing form `F`.
    fn weights_finite_of<F: PointingForm>(
        &self,
        data: &Data,
        ctx: &ExecContext,
    ) -> Result<HashMap<(String, String), bool>, OpError> {
        let view = self.solve_pointing.view();
        let mut tasks = Vec::new();
        for ob in &data.obs {
            let dets = select_detectors(ctx, ob, self.setup.binner.det_mask);
            let intervals = Arc::new(view_intervals(ob, view)?);
            let pts = F::detectors(self, ob, &dets)?;
            for (d, pt) in dets.into_iter().zip(pts) {
                tasks.push((ob.name(), d, pt, Arc::clone(&intervals)));
            }
        }
        Ok(tasks
            .par_iter()
            .map(|(ob, d, pt, intervals)| {
                let mut buf = weights_buffer::<F::Det<'_>>();
                let all = intervals.iter().all(|iv| {
                    let (first, last) = (iv.first as usize, iv.last as usize);
                    (first..last).step_by(BLOCK).all(|b0| {
                        let w = pt.span(b0, (b0 + BLOCK).min(last), &mut buf);
                        w.iter().all(|x| x.is_finite())
                    })
                });
                ((ob.to_string(), d.clone()), all)
            })
            .collect())
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
        timed(
            data,
            ctx,
            "fused_projection",
            |data, ctx| with_form!(fused, F => self.project_fused::<F>(data, ctx, &pass, tmpl, input, keys, output)),
        )
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
    /// accumulated (see [`Plan::accumulate`]; the detectors in the order of
    /// the unfused pass over `sets`), then summed over the job and
    /// multiplied by the covariance as in [`crate::ops::binning`].
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
        let (dist, nnz) = prepare_bin_map(data, pass)?;
        if nnz != 3 {
            return Err(OpError::Global {
                key: pass.covariance.to_string(),
                problem: format!("a covariance of {nnz} Stokes values, not IQU"),
            });
        }
        let mut zmap = crate::pixels::take_map(data, pass.binned)?;
        zmap.reset();
        let r = with_form!(fused, F => self.fused_accumulate::<F>(
            data, ctx, tmpl, input, keys, pass, sets, &dist, &mut zmap
        ));
        data.meta.set_object(pass.binned.to_string(), *zmap);
        r?;
        finish_bin_map(data, ctx, pass)
    }

    /// The projection `Fᵀ N⁻¹ (t - P m)` of the work timestream `t`
    /// (`input`) into the amplitudes `output` (zeroed first), with the
    /// solver's map `m` of `pass`.
    #[allow(clippy::too_many_arguments)]
    fn project_fused<F: PointingForm>(
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
            let plan = self.fused_plan::<F>(data, ctx, Some(tmpl), input, keys, pass)?;
            let map = data.meta.object::<PixelData<f64>>(pass.binned)?;
            // Units of about PROJECT_TASK samples: (observation, view,
            // amplitude range).
            let mut units = Vec::new();
            for (oi, o) in plan.obs.iter().enumerate() {
                let per = (PROJECT_TASK / o.step).max(1);
                for (v, iv) in o.intervals.iter().enumerate() {
                    let n = ((iv.last - iv.first) as usize).div_ceil(o.step);
                    let mut lo = 0;
                    while lo < n {
                        let hi = (lo + per).min(n);
                        units.push((oi, v, (lo, hi)));
                        lo = hi;
                    }
                }
            }
            // Each unit's detectors in as many groups as it takes to give
            // every thread a task (one group when the units do).
            let groups = rayon::current_num_threads().div_ceil(units.len().max(1));
            let mut tasks = Vec::new();
            for (oi, v, range) in units {
                let n = plan.obs[oi].dets.len();
                let g = groups.clamp(1, n.max(1));
                for t in 0..g {
                    tasks.push(((oi, v), t * n / g..(t + 1) * n / g, range));
                }
            }
            tasks
                .into_par_iter()
                .map(|(at, dets, range)| plan.project(map, at, dets, range))
                .collect::<Result<Vec<_>, OpError>>()?
        };
        let out = &mut data.meta.object_mut::<HostArray<f64>>(output)?.values;
        out.iter_mut().for_each(|x| *x = 0.0);
        for (a0, v) in results.into_iter().flatten() {
            out[a0..a0 + v.len()].copy_from_slice(&v);
        }
        Ok(())
    }

    /// The binning half: split the map's sub-pixels between the tasks and
    /// accumulate.
    #[allow(clippy::too_many_arguments)]
    fn fused_accumulate<F: PointingForm>(
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
        let plan = self.fused_plan::<F>(data, ctx, tmpl, input, keys, pass)?;
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
    fn fused_plan<'a, F: PointingForm>(
        &self,
        data: &'a Data,
        ctx: &ExecContext,
        tmpl: Option<&'a OffsetTemplate>,
        input: Input<'_>,
        keys: &Keys,
        pass: &BinPass<'_>,
    ) -> Result<Plan<'a, F::Det<'a>>, OpError> {
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
            let pts = F::detectors(self, ob, &dets)?;
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
            for ((d, &scale), pt) in dets.iter().zip(&scales).zip(pts) {
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
                    pt,
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
