//! The map-maker's fused kernels: `fused_accumulate` (a timestream or `F
//! a` binned into the noise-weighted map) and `fused_project` (`Fᵀ N⁻¹ (t
//! - P m)` into offset amplitudes), each reading a detector's pixel and IQU
//! weights either rebuilt from the compact i32 pixel and the boresight
//! ([`Rebuilt`], block by block into a per-task buffer that stays in
//! cache; see [`super::compact`]) or kept ([`Kept`]).
//!
//! The unfused sequence fills a work timestream (`F a`, or a copy of the
//! signal) per detector batch and hands it to the kernels one after the
//! other (accumulate; then scan and subtract, noise weight, project), each
//! reading and writing it again, with the pointing expanded into fields of
//! the batch's length. These read only what is kept and consume each sample
//! at once.
//!
//! Every value is the unfused sequence's, operation for operation: the work
//! timestream `0 + a` (the zeroed timestream plus the amplitude, `0` under
//! a flagged amplitude) or the signal, the accumulation's `(t · w_det) ·
//! w_i`, the scan's `0 + Σ w_i m_i` in component order, the noise weight,
//! the projection's sum in sample order. The one shortcut is exact: a
//! sample of value ±0 is left out of the accumulation where the host
//! promises the detector's weights are finite (`finite`) and its noise
//! weight is finite, since it adds `(±0 · w_det) · w_i = ±0` to a map value
//! that cannot be `-0` (it starts at `+0`, and a sum is `-0` only when both
//! terms are).
//!
//! * **Accumulation**: the sub-pixel axis of the map is split into one
//!   range per task, as `build_noise_weighted` does; every task walks the
//!   detectors, views and samples in order, keeps the samples whose pixel
//!   falls in its range, rebuilds their weights (each sample's once in
//!   all, by the task that owns its pixel) or reads the kept ones, and
//!   accumulates them. Each map element is summed by one task in call
//!   order, so the map is bit-identical to the unfused sequence's for any
//!   thread count.
//! * **Projection**: tasks over (view, amplitude range of about
//!   [`PROJECT_TASK`] samples, group of detectors), the detectors split
//!   into as many groups as it takes to give every thread a task; each task
//!   walks its amplitudes' samples in blocks of [`BLOCK`], every detector's
//!   block in turn (detectors on the same pixels, as a focal-plane pixel's A
//!   and B, read the map while it is in cache), and sums each amplitude's
//!   good samples in sample order. `out[a] += Σ`: with `out` zeroed, the
//!   unfused `template_offset_project_signal`'s bits.

use super::compact::{DetParams, Source};
use super::{locate, SubmapDiv};
use crate::arrays::{self, Arg};
use crate::par::{first_fault, SampleFault, SharedMut, TaskResult};
use rayon::prelude::*;
use toast_accel::abi::{FusedAccumulateArgs, FusedProjectArgs, SampleRange};
use toast_accel::check::{self, Fused};
use toast_accel::plugin_support::PluginError;

/// Samples per block of rebuilt weights (24 KiB of weights per block).
const BLOCK: usize = 1024;

/// Samples of work per projection task.
const PROJECT_TASK: usize = 16384;

/// Where a fused kernel reads one detector's pixel and IQU weights of each
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

/// Compact pointing: a detector's row of i32 pixels, its weights rebuilt.
struct Rebuilt<'a> {
    pix: &'a [i32],
    src: Source<'a>,
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

/// Kept pointing: a detector's rows of i64 pixels and IQU weights.
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

/// One detector of a call.
struct DetPass<'a, P> {
    /// Its pixels and weights.
    pt: P,
    /// Its flags row (a sample is cut where `flags & flag_mask != 0`).
    flags: Option<&'a [u8]>,
    /// Its timestream row, when the call reads one (else `F a`).
    signal: Option<&'a [f64]>,
    /// The noise weight.
    scale: f64,
    /// The first amplitude of each view, if the detector has amplitudes.
    view_amp: Option<Vec<usize>>,
    /// Whether a sample whose value is ±0 may be left out of the
    /// accumulation (see the module documentation).
    zero_skips: bool,
}

/// What both kernels read: one observation's detectors, the map's layout,
/// the amplitudes.
struct Plan<'a, P> {
    dets: Vec<DetPass<'a, P>>,
    intervals: &'a [SampleRange],
    /// Samples per amplitude.
    step: usize,
    flag_mask: u8,
    /// Shared flags that cut a sample in the accumulation, if any.
    shared_cut: Option<(&'a [u8], u8)>,
    g2l: &'a [i64],
    div: SubmapDiv,
    nps: usize,
    /// The input amplitudes (`F a`) and the amplitude flags.
    amps: &'a [f64],
    amp_flags: &'a [u8],
}

/// The arrays of a call, as host slices.
struct Inputs<'a> {
    compact: &'a [i32],
    pixels: &'a [i64],
    weights: &'a [f64],
    det_data: &'a [f64],
    det_flags: &'a [u8],
    src: Option<Source<'a>>,
}

/// Build the plan of a call, with the pointing form `P` made by `pt`.
fn plan<'a, P>(
    v: &'a Fused<'a>,
    x: &Inputs<'a>,
    (g2l, amps, amp_flags): (&'a [i64], &'a [f64], &'a [u8]),
    (flag_mask, shared_cut): (u8, Option<(&'a [u8], u8)>),
    pt: impl Fn(usize) -> P,
) -> Plan<'a, P> {
    let n = v.n_samp;
    let dets = (0..v.n_det)
        .map(|d| {
            let row = |idx: &[i32]| idx.get(d).copied().filter(|&r| r >= 0);
            let view_amp = v
                .values
                .amp_offset
                .get(d)
                .filter(|&&a0| a0 >= 0)
                .map(|&a0| {
                    v.values
                        .view_offset
                        .iter()
                        .map(|&o| (a0 + o) as usize)
                        .collect()
                });
            DetPass {
                pt: pt(d),
                flags: row(v.flag_index)
                    .map(|r| &x.det_flags[r as usize * n..(r as usize + 1) * n]),
                signal: row(v.values.data_index)
                    .map(|r| &x.det_data[r as usize * n..(r as usize + 1) * n]),
                scale: v.det_scale[d],
                view_amp,
                zero_skips: v.det_scale[d].is_finite() && v.finite.get(d).is_some_and(|&f| f != 0),
            }
        })
        .collect();
    Plan {
        dets,
        intervals: v.intervals,
        step: v.values.step_length as usize,
        flag_mask,
        shared_cut,
        g2l,
        div: SubmapDiv::new(v.n_pix_submap),
        nps: v.n_pix_submap as usize,
        amps,
        amp_flags,
    }
}

/// `f` with the plan of the call's pointing form.
fn with_plan<'a, R>(
    v: &'a Fused<'a>,
    x: &Inputs<'a>,
    arrays: (&'a [i64], &'a [f64], &'a [u8]),
    flags: (u8, Option<(&'a [u8], u8)>),
    f: impl FnOnce(Plan<'a, Rebuilt<'a>>) -> R,
    g: impl FnOnce(Plan<'a, Kept<'a>>) -> R,
) -> R {
    let n = v.n_samp;
    let p = &v.pointing;
    match x.src {
        Some(src) => f(plan(v, x, arrays, flags, |d| {
            let r = p.pixel_index[d] as usize;
            Rebuilt {
                pix: &x.compact[r * n..(r + 1) * n],
                src,
                params: DetParams::of_pointing(p, d),
            }
        })),
        None => g(plan(v, x, arrays, flags, |d| {
            let (r, w) = (p.pixel_index[d] as usize, p.weight_index[d] as usize);
            Kept {
                pix: &x.pixels[r * n..(r + 1) * n],
                weights: &x.weights[3 * w * n..3 * (w + 1) * n],
            }
        })),
    }
}

impl<P: DetPointing> Plan<'_, P> {
    /// The local submap and sub-pixel of pixel `p >= 0` of sample `s` of
    /// detector `d` in view `view`, or the fault naming it.
    #[inline(always)]
    fn locate(
        &self,
        d: usize,
        view: usize,
        s: usize,
        p: i64,
    ) -> Result<(usize, usize), SampleFault> {
        locate(&self.div, self.g2l, p).map_err(|m| SampleFault::new(d, view, s, m))
    }

    /// The work timestream's value `F a` under amplitude `k` of view `v`:
    /// the zeroed timestream plus the amplitude (`0 + a`), `0` under a
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

    /// Accumulate the samples whose sub-pixel lies in `[lo, hi)` into the
    /// map (only this task writes those cells).
    fn accumulate(&self, (lo, hi): (usize, usize), zmap: &SharedMut<f64>) -> TaskResult {
        let nps = self.nps;
        // Rebuilt weights: the block's samples to rebuild and accumulate
        // (map offset, value).
        let cap = if P::REBUILT { BLOCK } else { 0 };
        let mut samples: Vec<u32> = Vec::with_capacity(cap);
        let mut cells: Vec<(usize, f64)> = Vec::with_capacity(cap);
        let mut w = weights_buffer::<P>();
        let add = |off: usize, scaled: f64, wj: &[f64]| {
            // SAFETY: `slice_mut` checks the bounds; only the task owning
            // sub-pixels [lo, hi) touches these elements.
            let z = unsafe { zmap.slice_mut(off, 3) };
            add_weighted(z, scaled, wj);
        };
        for (di, d) in self.dets.iter().enumerate() {
            // Kept weights: read in place, sample by sample.
            let kept = if P::REBUILT {
                &[][..]
            } else {
                d.pt.picked(&[], &mut [])
            };
            for (v, iv) in self.intervals.iter().enumerate() {
                let (first, last) = (iv.first as usize, iv.last as usize);
                // Spans of one value source: each amplitude's samples for
                // `F a`, the whole view for a timestream.
                let step = if d.signal.is_some() {
                    last - first
                } else {
                    self.step
                };
                let mut s0 = first;
                while s0 < last {
                    let s1 = s0.saturating_add(step.max(1)).min(last);
                    let amp = match d.signal {
                        Some(_) => 0.0,
                        None => self.value(d, v, (s0 - first) / self.step),
                    };
                    if d.signal.is_none() && amp == 0.0 && d.zero_skips {
                        // Every sample adds ±0 (see the module
                        // documentation).
                        s0 = s1;
                        continue;
                    }
                    let mut b0 = s0;
                    while b0 < s1 {
                        let b1 = (b0 + BLOCK).min(s1);
                        samples.clear();
                        cells.clear();
                        for s in b0..b1 {
                            if let Some(f) = d.flags {
                                if f[s] & self.flag_mask != 0 {
                                    continue;
                                }
                            }
                            if let Some((f, m)) = self.shared_cut {
                                if f[s] & m != 0 {
                                    continue;
                                }
                            }
                            let p = d.pt.pixel(s);
                            if p < 0 {
                                continue;
                            }
                            let (l, sub) = self.locate(di, v, s, p)?;
                            if sub < lo || sub >= hi {
                                continue;
                            }
                            let x = match d.signal {
                                Some(sig) => sig[s],
                                None => amp,
                            };
                            if x == 0.0 && d.zero_skips {
                                // Adds ±0 to the map: nothing.
                                continue;
                            }
                            let off = 3 * (l * nps + sub);
                            if P::REBUILT {
                                samples.push(s as u32);
                                cells.push((off, x));
                            } else {
                                add(off, x * d.scale, &kept[3 * s..3 * s + 3]);
                            }
                        }
                        if P::REBUILT {
                            let ws = d.pt.picked(&samples, &mut w);
                            for (&(off, x), wj) in cells.iter().zip(ws.chunks_exact(3)) {
                                add(off, x * d.scale, wj);
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

    /// The projection of amplitudes `[lo, hi)` of view `v` of the detectors
    /// `dets`: for each detector with amplitudes, its first amplitude's
    /// index and the sums.
    fn project(
        &self,
        map: &[f64],
        v: usize,
        dets: std::ops::Range<usize>,
        (lo, hi): (usize, usize),
    ) -> Result<Vec<(usize, Vec<f64>)>, SampleFault> {
        let group: Vec<(usize, &DetPass<'_, P>, usize)> = self.dets[dets.clone()]
            .iter()
            .zip(dets)
            .filter_map(|(d, di)| d.view_amp.as_ref().map(|va| (di, d, va[v])))
            .collect();
        let iv = self.intervals[v];
        let (first, last) = (iv.first as usize, iv.last as usize);
        let mut w = weights_buffer::<P>();
        let mut out: Vec<(usize, Vec<f64>)> = group
            .iter()
            .map(|&(_, _, a0)| (a0 + lo, Vec::with_capacity(hi - lo)))
            .collect();
        // Per detector: the work timestream's value under the amplitude
        // (`None` under a flagged one) and the sum.
        let mut accs: Vec<(Option<f64>, f64)> = vec![(None, 0.0); group.len()];
        for k in lo..hi {
            for ((_, d, a0), acc) in group.iter().zip(accs.iter_mut()) {
                let x = match d.signal {
                    Some(_) => 0.0,
                    None => self.value(d, v, k),
                };
                *acc = ((self.amp_flags[a0 + k] == 0).then_some(x), 0.0);
            }
            let s0 = first + k * self.step;
            let s1 = s0.saturating_add(self.step).min(last);
            let mut b0 = s0;
            while b0 < s1 {
                let b1 = (b0 + BLOCK).min(s1);
                for (&(di, d, _), acc) in group.iter().zip(accs.iter_mut()) {
                    if let (Some(x), sum) = acc {
                        let ws = d.pt.span(b0, b1, &mut w);
                        self.project_block((di, v, d), (b0, b1), ws, *x, map, sum)?;
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
    /// samples `b0..b1` of detector `d` whose flags are clear (`t`: the
    /// signal, or `x`; `ws`: their weights).
    #[inline(always)]
    fn project_block(
        &self,
        (di, v, d): (usize, usize, &DetPass<'_, P>),
        (b0, b1): (usize, usize),
        ws: &[f64],
        x: f64,
        m: &[f64],
        acc: &mut f64,
    ) -> TaskResult {
        let nps = self.nps;
        for (s, wi) in (b0..b1).zip(ws.chunks_exact(3)) {
            // The work timestream: a copy of the signal, or `F a`.
            let mut t = match d.signal {
                Some(sig) => sig[s],
                None => x,
            };
            let p = d.pt.pixel(s);
            if p >= 0 {
                let (l, sub) = self.locate(di, v, s, p)?;
                let off = 3 * (l * nps + sub);
                let mut val = 0.0;
                for i in 0..3 {
                    val += wi[i] * m[off + i];
                }
                t -= val;
            }
            t *= d.scale;
            let good = d.flags.is_none_or(|f| f[s] & self.flag_mask == 0);
            *acc += if good { t } else { 0.0 };
        }
        Ok(())
    }
}

/// The input arrays both passes' structs have (same field names), for
/// `arrays::check_disjoint`.
macro_rules! shared_inputs {
    ($a:expr) => {
        vec![
            Arg::new::<i64>("global2local", $a.global2local),
            Arg::new::<i32>("compact", $a.compact),
            Arg::new::<f64>("boresight", $a.boresight),
            Arg::new::<u8>("pointing_flags", $a.pointing_flags),
            Arg::new::<f64>("hwp", $a.hwp),
            Arg::new::<i64>("pixels", $a.pixels),
            Arg::new::<f64>("weights", $a.weights),
            Arg::new::<f64>("det_data", $a.det_data),
            Arg::new::<u8>("det_flags", $a.det_flags),
            Arg::new::<f64>("amplitudes", $a.amplitudes),
            Arg::new::<u8>("amplitude_flags", $a.amplitude_flags),
        ]
    };
}

/// The call's pointing and timestream arrays as host slices.
///
/// # Safety
/// The arrays are host memory of their validated lengths, not written
/// during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn inputs<'a>(
    k: &'static str,
    v: &Fused<'_>,
    (compact, boresight, pointing_flags, hwp): (
        toast_accel::abi::Array,
        toast_accel::abi::Array,
        toast_accel::abi::Array,
        toast_accel::abi::Array,
    ),
    (pixels, weights, det_data, det_flags): (
        toast_accel::abi::Array,
        toast_accel::abi::Array,
        toast_accel::abi::Array,
        toast_accel::abi::Array,
    ),
    (pointing_flag_mask, iau): (u8, u8),
) -> Result<Inputs<'a>, PluginError> {
    // SAFETY: the caller's contract.
    unsafe {
        Ok(Inputs {
            compact: arrays::input::<i32>(k, "compact", compact)?,
            pixels: arrays::input::<i64>(k, "pixels", pixels)?,
            weights: arrays::input::<f64>(k, "weights", weights)?,
            det_data: arrays::input::<f64>(k, "det_data", det_data)?,
            det_flags: arrays::input::<u8>(k, "det_flags", det_flags)?,
            src: if v.pointing.compact {
                Some(Source::of(
                    k,
                    boresight,
                    (pointing_flags, pointing_flag_mask),
                    hwp,
                    iau,
                )?)
            } else {
                None
            },
        })
    }
}

/// `fused_accumulate`.
///
/// # Safety
/// `a` has passed `check_fused_accumulate` (giving `v`) and its arrays
/// are host memory of the stated lengths.
pub(crate) unsafe fn run_accumulate(
    v: &Fused<'_>,
    a: &FusedAccumulateArgs,
) -> Result<(), PluginError> {
    const K: &str = "fused_accumulate";
    let mut read = shared_inputs!(a);
    read.push(Arg::new::<u8>("shared_flags", a.shared_flags));
    arrays::check_disjoint(K, &[Arg::new::<f64>("zmap", a.zmap)], &read)?;
    // SAFETY: host arrays of the validated lengths; `zmap` overlaps nothing.
    let (x, g2l, shared, amps, amp_flags, zmap) = unsafe {
        (
            inputs(
                K,
                v,
                (a.compact, a.boresight, a.pointing_flags, a.hwp),
                (a.pixels, a.weights, a.det_data, a.det_flags),
                (a.pointing_flag_mask, a.iau),
            )?,
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::input::<f64>(K, "amplitudes", a.amplitudes)?,
            arrays::input::<u8>(K, "amplitude_flags", a.amplitude_flags)?,
            SharedMut::new(arrays::output::<f64>(K, "zmap", a.zmap)?),
        )
    };
    check::global2local(K, g2l, v.n_local_submap as u64)?;
    let shared_cut =
        (v.use_shared_flags && a.shared_flag_mask != 0).then_some((shared, a.shared_flag_mask));
    let nps = v.n_pix_submap as usize;
    let parts = rayon::current_num_threads().clamp(1, nps.max(1));
    let run = |t: usize, acc: &dyn Fn((usize, usize)) -> TaskResult| {
        acc((t * nps / parts, (t + 1) * nps / parts))
    };
    let flags = (a.det_flag_mask, shared_cut);
    let r = with_plan(
        v,
        &x,
        (g2l, amps, amp_flags),
        flags,
        |p| {
            (0..parts)
                .into_par_iter()
                .map(|t| run(t, &|r| p.accumulate(r, &zmap)))
                .reduce(|| Ok(()), first_fault)
        },
        |p| {
            (0..parts)
                .into_par_iter()
                .map(|t| run(t, &|r| p.accumulate(r, &zmap)))
                .reduce(|| Ok(()), first_fault)
        },
    );
    r.map_err(|f| super::fault_error(K, f))
}

/// `fused_project`.
///
/// # Safety
/// `a` has passed `check_fused_project` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run_project(v: &Fused<'_>, a: &FusedProjectArgs) -> Result<(), PluginError> {
    const K: &str = "fused_project";
    let mut read = shared_inputs!(a);
    read.push(Arg::new::<f64>("mapdata", a.mapdata));
    arrays::check_disjoint(
        K,
        &[Arg::new::<f64>("amplitudes_out", a.amplitudes_out)],
        &read,
    )?;
    // SAFETY: host arrays of the validated lengths; `amplitudes_out`
    // overlaps nothing.
    let (x, g2l, map, amps, amp_flags, out) = unsafe {
        (
            inputs(
                K,
                v,
                (a.compact, a.boresight, a.pointing_flags, a.hwp),
                (a.pixels, a.weights, a.det_data, a.det_flags),
                (a.pointing_flag_mask, a.iau),
            )?,
            arrays::input::<i64>(K, "global2local", a.global2local)?,
            arrays::input::<f64>(K, "mapdata", a.mapdata)?,
            arrays::input::<f64>(K, "amplitudes", a.amplitudes)?,
            arrays::input::<u8>(K, "amplitude_flags", a.amplitude_flags)?,
            arrays::output::<f64>(K, "amplitudes_out", a.amplitudes_out)?,
        )
    };
    check::global2local(K, g2l, v.n_local_submap as u64)?;
    // Units of about PROJECT_TASK samples: (view, amplitude range).
    let step = v.values.step_length as usize;
    let per = (PROJECT_TASK / step).max(1);
    let mut units = Vec::new();
    for (view, iv) in v.intervals.iter().enumerate() {
        let n = ((iv.last - iv.first) as usize).div_ceil(step);
        let mut lo = 0;
        while lo < n {
            let hi = (lo + per).min(n);
            units.push((view, (lo, hi)));
            lo = hi;
        }
    }
    // Each unit's detectors in as many groups as it takes to give every
    // thread a task (one group when the units do).
    let groups = rayon::current_num_threads().div_ceil(units.len().max(1));
    let n = v.n_det;
    let g = groups.clamp(1, n.max(1));
    let tasks: Vec<_> = units
        .into_iter()
        .flat_map(|(view, range)| (0..g).map(move |t| (view, t * n / g..(t + 1) * n / g, range)))
        .collect();
    let flags = (a.det_flag_mask, None);
    let sums = with_plan(
        v,
        &x,
        (g2l, amps, amp_flags),
        flags,
        |p| {
            tasks
                .par_iter()
                .map(|(view, dets, range)| p.project(map, *view, dets.clone(), *range))
                .collect::<Result<Vec<_>, _>>()
        },
        |p| {
            tasks
                .par_iter()
                .map(|(view, dets, range)| p.project(map, *view, dets.clone(), *range))
                .collect::<Result<Vec<_>, _>>()
        },
    )
    .map_err(|f| super::fault_error(K, f))?;
    for (a0, s) in sums.into_iter().flatten() {
        for (o, s) in out[a0..a0 + s.len()].iter_mut().zip(s) {
            *o += s;
        }
    }
    Ok(())
}
