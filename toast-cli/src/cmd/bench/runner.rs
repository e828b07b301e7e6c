//! Running and timing the kernels.
//!
//! [`run_kernels`] makes the [`Workload`] and runs the kernels in pipeline
//! order (pointing_detector → pixels_healpix → stokes_weights → scan_map →
//! build_noise_weighted → cov_accum_diag_{hits,invnpp} → noise_weight →
//! template_offset → filter_polynomial → filter_poly2D), one method of
//! [`Bench`] per stage, so that pixel locality, hit submaps and amplitudes
//! are those of a real scan: each stage takes the outputs of the one before.
//!
//! Metric: the best of `repeats` wall-clock times of one call (plus a
//! `synchronize`), divided by `n_det` × samples inside the intervals, or by
//! the number of amplitudes for `template_offset_apply_diag_precond` (by
//! `n_det` × its samples for `filter_poly2D`). Kernels that TOAST's
//! operators call once per detector (template_offset add/project,
//! cov_accum_diag_*, filter_polynomial) are timed as those calls. Arrays
//! go through [`ArrayArg`], created (uploaded) before the timed region and
//! finished (downloaded) after it; for a non-host-addressable backend that
//! staging time is reported separately, with the transfer counters.
//!
//! With [`BenchOptions::rows`], only those rows are timed and reported; every
//! other kernel still runs, once and untimed, since the later ones take its
//! outputs, so a timed kernel sees the same inputs and the same preceding
//! call as in a full run.

use std::time::{Duration, Instant};
use toast_core::mem::zeroed_large;

use toast_accel::abi;
use toast_accel::host::{AbiElement, AccelError, ArrayArg, Backend, KernelArgs, TransferSnapshot};

use super::host_info::{load_average, machine_description};
use super::reference::{
    PRECOND_LARGE, STREAMING_BYTES, STREAM_BYTES, STREAM_FACTOR, STREAM_KEY, TOAST_REFERENCE,
};
use super::report::{BenchReport, KernelTiming, StreamReference, TransferSummary};
use super::workload::{
    local_submaps, poly2d_templates, BenchOptions, Offsets, Workload, POLY2D_GROUPS,
    POLY2D_SAMPLES, POLY_ORDER, SEED, STEP_LENGTH,
};

/// Time every kernel of `backend` on the workload `opts` describes.
pub fn run_kernels(backend: &Backend, opts: &BenchOptions) -> anyhow::Result<BenchReport> {
    opts.validate()?;
    let missing: Vec<&str> = abi::Kernel::ALL
        .into_iter()
        .filter(|k| !backend.supports(*k))
        .map(|k| k.name())
        .collect();
    if !missing.is_empty() {
        return Err(anyhow::anyhow!(
            "backend `{}` does not implement: {}",
            backend.name(),
            missing.join(", ")
        ));
    }
    let setup_start = Instant::now();
    let load_before = load_average();
    let stats_before = backend.stats().snapshot();
    let w = Workload::new(opts, SEED);
    let mut b = Bench {
        tm: Timer {
            backend,
            opts,
            transfer: Duration::ZERO,
            timed: Duration::ZERO,
        },
        w: &w,
        out: Vec::new(),
        stream: None,
    };

    let quats = b.pointing_detector()?;
    let pointing = b.pixels_and_weights(&quats)?;
    drop(quats);
    b.stokes_weights_i()?;
    let (global2local, n_local) = local_submaps(&pointing.hits);
    if n_local == 0 {
        return Err(anyhow::anyhow!(
            "pixels_healpix hit no submap: the backend's output is wrong"
        ));
    }
    let mut det_data = b.scan_map(&pointing, &global2local, n_local)?;
    b.build_noise_weighted(&pointing, &global2local, n_local, &det_data)?;
    b.cov_accum(&pointing, &global2local, n_local)?;
    drop(pointing);
    b.noise_weight(&mut det_data)?;
    let mut offsets = b.w.offsets();
    b.template_offset_add_to_signal(&offsets, &mut det_data)?;
    b.template_offset_project_signal(&mut offsets, &det_data)?;
    b.filter_polynomial(&mut det_data)?;
    b.filter_poly2d(&det_data)?;
    drop(det_data);
    // On the workload's amplitudes (as projected), then on a large vector.
    let n_amp = offsets.n_amp;
    b.precond(
        "template_offset_apply_diag_precond",
        &offsets.offset_var,
        &offsets.amplitudes,
        &offsets.amplitude_flags,
    )?;
    drop(offsets);
    let large = b.w.precond(opts.precond_n_amp);
    b.precond(
        PRECOND_LARGE,
        &large.offset_var,
        &large.amplitudes,
        &large.amplitude_flags,
    )?;
    drop(large);
    b.stream_reference(opts.precond_n_amp.saturating_mul(STREAM_FACTOR))?;

    let Bench {
        tm,
        mut out,
        stream,
        ..
    } = b;
    // Table order: that of timings.md.
    out.sort_by_key(|k| {
        TOAST_REFERENCE
            .iter()
            .position(|r| r.key == k.key)
            .unwrap_or(usize::MAX)
    });
    let host_addressable = backend.host_addressable();
    let transfer = (!host_addressable).then(|| TransferSummary {
        seconds: tm.transfer.as_secs_f64(),
        stats: diff(backend.stats().snapshot(), stats_before),
    });
    let device = match backend.device_count() {
        Ok(n) if n > 0 => backend.device_info(0).ok().map(|d| d.name),
        _ => None,
    };
    let setup_seconds = setup_start
        .elapsed()
        .saturating_sub(tm.timed + tm.transfer)
        .as_secs_f64();
    Ok(BenchReport {
        backend: backend.name().to_string(),
        backend_version: backend.plugin().version.clone(),
        host_addressable,
        device,
        threads: opts.threads,
        machine: machine_description(),
        load_average: load_before.zip(load_average()),
        repeats: opts.repeats,
        n_det: w.n_det,
        n_samp: w.n_samp,
        n_samp_in_intervals: w.n_in,
        n_intervals: w.intervals.len(),
        nside: w.nside,
        n_submap: w.n_submap,
        n_pix_submap: w.n_pix_submap,
        n_local_submap: n_local,
        step_length: STEP_LENGTH,
        n_amp,
        precond_n_amp: opts.precond_n_amp,
        setup_seconds,
        kernels: out,
        stream,
        transfer,
    })
}

fn diff(a: TransferSnapshot, b: TransferSnapshot) -> TransferSnapshot {
    TransferSnapshot {
        allocs: a.allocs - b.allocs,
        alloc_bytes: a.alloc_bytes - b.alloc_bytes,
        frees: a.frees - b.frees,
        h2d_calls: a.h2d_calls - b.h2d_calls,
        h2d_bytes: a.h2d_bytes - b.h2d_bytes,
        d2h_calls: a.d2h_calls - b.d2h_calls,
        d2h_bytes: a.d2h_bytes - b.d2h_bytes,
        resets: a.resets - b.resets,
    }
}

// ---------------------------------------------------------------------------
// staging and timing

/// Stages arrays and times calls, keeping the two apart.
struct Timer<'b> {
    backend: &'b Backend,
    /// Which rows are timed ([`BenchOptions::times`]).
    opts: &'b BenchOptions,
    /// Staging (upload, download, alloc, free) time, outside the timed calls.
    transfer: Duration,
    /// Total time of all timed calls.
    timed: Duration,
}

fn accel(what: &str) -> impl Fn(AccelError) -> anyhow::Error + '_ {
    move |e| anyhow::anyhow!("{what}: {e}")
}

impl<'b> Timer<'b> {
    fn input<'a, T: AbiElement>(
        &mut self,
        data: &'a [T],
        name: &str,
    ) -> anyhow::Result<ArrayArg<'a>>
    where
        'b: 'a,
    {
        let t = Instant::now();
        let a = ArrayArg::input(self.backend, data, name).map_err(accel(name))?;
        self.transfer += t.elapsed();
        Ok(a)
    }

    fn output<'a, T: AbiElement>(
        &mut self,
        data: &'a mut [T],
        name: &str,
    ) -> anyhow::Result<ArrayArg<'a>>
    where
        'b: 'a,
    {
        let t = Instant::now();
        let a = ArrayArg::output(self.backend, data, name).map_err(accel(name))?;
        self.transfer += t.elapsed();
        Ok(a)
    }

    fn finish(&mut self, args: Vec<ArrayArg<'_>>) -> anyhow::Result<()> {
        let t = Instant::now();
        for a in args {
            a.finish().map_err(accel("finishing a staged array"))?;
        }
        self.transfer += t.elapsed();
        Ok(())
    }

    /// Best of `repeats` wall-clock seconds of `f` followed by a synchronize,
    /// measured under the label `what` for row `key`; `None` (after one
    /// untimed call, for its outputs) when the row is not timed.
    fn best(
        &mut self,
        key: &str,
        what: &str,
        mut f: impl FnMut() -> Result<(), AccelError>,
    ) -> anyhow::Result<Option<f64>> {
        if !self.opts.times(key) {
            crate::errln!("bench: running {what} (untimed)");
            f().map_err(accel(key))?;
            self.backend.synchronize().map_err(accel(key))?;
            return Ok(None);
        }
        self.best_timed(key, what, f).map(Some)
    }

    /// Best of `repeats` wall-clock seconds of `f` followed by a
    /// synchronize, whatever the rows.
    fn best_timed(
        &mut self,
        key: &str,
        what: &str,
        mut f: impl FnMut() -> Result<(), AccelError>,
    ) -> anyhow::Result<f64> {
        crate::errln!("bench: timing {what}");
        let mut best = f64::INFINITY;
        for _ in 0..self.opts.repeats {
            let t = Instant::now();
            f().map_err(accel(key))?;
            self.backend.synchronize().map_err(accel(key))?;
            let dt = t.elapsed();
            self.timed += dt;
            best = best.min(dt.as_secs_f64());
        }
        Ok(best)
    }
}

// ---------------------------------------------------------------------------
// the stages

/// The state of a run: the timer, the workload and the timings so far.
struct Bench<'b, 'w> {
    tm: Timer<'b>,
    w: &'w Workload,
    out: Vec<KernelTiming>,
    stream: Option<StreamReference>,
}

/// The outputs of pixels_healpix (NEST) and stokes_weights_IQU, inputs of
/// the map kernels.
struct Pointing {
    pixels: Vec<i64>,
    hits: Vec<u8>,
    weights: Vec<f64>,
}

/// The number of map components (I, Q, U).
const NNZ: usize = 3;

impl Bench<'_, '_> {
    /// Time one launch of `args` (best of `repeats`) and record it under
    /// `key`, per detector and in-interval sample.
    ///
    /// # Safety
    /// As [`Backend::launch`]: every pointer in `args` is valid for the
    /// lengths it declares, and outputs are not aliased, for every call.
    unsafe fn time<A: KernelArgs>(&mut self, key: &'static str, args: &A) -> anyhow::Result<()> {
        let units = self.w.units();
        // SAFETY: this function's contract is that of `launch`.
        unsafe { self.time_calls(key, std::slice::from_ref(args), units) }
    }

    /// Time the calls `calls` one after the other (best of `repeats`) and
    /// record the total under `key`, over `units`.
    ///
    /// # Safety
    /// As [`Backend::launch`], for every element of `calls`.
    unsafe fn time_calls<A: KernelArgs>(
        &mut self,
        key: &'static str,
        calls: &[A],
        units: u64,
    ) -> anyhow::Result<()> {
        let backend = self.tm.backend;
        let best = self.tm.best(key, key, || {
            for a in calls {
                // SAFETY: this function's contract covers every call.
                unsafe { backend.launch(a) }?;
            }
            Ok(())
        })?;
        if let Some(best) = best {
            self.out.push(KernelTiming::new(key, best, units));
        }
        Ok(())
    }

    /// Time a template_offset kernel as the one call `all` and as n_det
    /// single-detector calls `one(d)`, and record the comparable figure.
    ///
    /// # Safety
    /// As [`Backend::launch`], for `all` and for `one(d)` for every detector d.
    unsafe fn time_offset<A: KernelArgs>(
        &mut self,
        key: &'static str,
        all: &A,
        one: impl Fn(usize) -> A,
    ) -> anyhow::Result<()> {
        let backend = self.tm.backend;
        let n_det = self.w.n_det;
        // SAFETY: this function's contract covers `all`.
        let multi = self.tm.best(key, &format!("{key} (one call)"), || unsafe {
            backend.launch(all)
        })?;
        let single = self.tm.best(key, &format!("{key} (per detector)"), || {
            for d in 0..n_det {
                // SAFETY: this function's contract covers `one(d)`.
                unsafe { backend.launch(&one(d)) }?;
            }
            Ok(())
        })?;
        if let (Some(multi), Some(single)) = (multi, single) {
            let units = self.w.units();
            self.out
                .push(KernelTiming::offset(key, n_det, multi, single, units));
        }
        Ok(())
    }

    /// pointing_detector; returns the detector quaternions.
    fn pointing_detector(&mut self) -> anyhow::Result<Vec<f64>> {
        let w = self.w;
        let mut quats: Vec<f64> = zeroed_large(w.n_det * w.n_samp * 4);
        let bore = self.tm.input(&w.boresight, "boresight")?;
        let flags = self.tm.input(&w.shared_flags, "shared_flags")?;
        let q = self.tm.output(&mut quats, "quats")?;
        let args = abi::PointingDetectorArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            quat_index: w.rows.as_ptr(),
            focalplane: w.focalplane.as_ptr(),
            intervals: w.iv(),
            boresight: bore.abi(),
            shared_flags: flags.abi(),
            shared_flag_mask: 1,
            reserved: [0; 7],
            quats: q.abi(),
        };
        // SAFETY: every pointer comes from a live Vec of the workload or an
        // ArrayArg of the length the arguments declare (n_det rows of
        // n_samp), and the output is borrowed only here.
        unsafe { self.time("pointing_detector", &args)? };
        self.tm.finish(vec![q, bore, flags])?;
        Ok(quats)
    }

    /// pixels_healpix (RING, then NEST, which stays) and stokes_weights_IQU
    /// (with, then without HWP).
    fn pixels_and_weights(&mut self, quats: &[f64]) -> anyhow::Result<Pointing> {
        let w = self.w;
        let mut pixels: Vec<i64> = zeroed_large(w.n_det * w.n_samp);
        pixels.fill(-1);
        let mut p = Pointing {
            pixels,
            hits: vec![0u8; w.n_submap],
            weights: zeroed_large(w.n_det * w.n_samp * NNZ),
        };
        let mut hits_ring = vec![0u8; w.n_submap];
        let q = self.tm.input(quats, "quats")?;
        let flags = self.tm.input(&w.shared_flags, "shared_flags")?;
        let hwp = self.tm.input(&w.hwp, "hwp")?;
        let px = self.tm.output(&mut p.pixels, "pixels")?;
        let hr = self.tm.output(&mut hits_ring, "hit_submaps_ring")?;
        let hn = self.tm.output(&mut p.hits, "hit_submaps")?;
        let wt = self.tm.output(&mut p.weights, "weights")?;
        let mut args = abi::PixelsHealpixArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            quat_index: w.rows.as_ptr(),
            pixel_index: w.rows.as_ptr(),
            intervals: w.iv(),
            quats: q.abi(),
            shared_flags: flags.abi(),
            pixels: px.abi(),
            hit_submaps: hr.abi(),
            nside: w.nside,
            n_pix_submap: w.n_pix_submap,
            shared_flag_mask: 1,
            nest: 0,
            pixels_i32: 0,
            reserved: [0; 5],
        };
        // SAFETY: as for pointing_detector; pixels and hit_submaps are
        // outputs of this call only.
        unsafe { self.time("pixels_healpix_ring", &args)? };
        args.nest = 1;
        args.hit_submaps = hn.abi();
        // SAFETY: host arrays from live workload Vecs (n_det rows, the intervals), kernel arrays
        // ArrayArgs of their declared lengths; `hn` (n_submap elements) and `px` are this
        // call's only outputs.
        unsafe { self.time("pixels_healpix_nest", &args)? };

        let mut args = abi::StokesWeightsIquArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            quat_index: w.rows.as_ptr(),
            weight_index: w.rows.as_ptr(),
            epsilon: w.epsilon.as_ptr(),
            gamma: w.gamma.as_ptr(),
            cal: w.cal.as_ptr(),
            intervals: w.iv(),
            quats: q.abi(),
            hwp: hwp.abi(),
            weights: wt.abi(),
            iau: 0,
            reserved: [0; 7],
        };
        // SAFETY: as for pointing_detector (epsilon, gamma and cal have
        // n_det elements); weights is the only output.
        unsafe { self.time("stokes_weights_iqu_hwp", &args)? };
        args.hwp = abi::Array::ABSENT;
        // SAFETY: host arrays from live Vecs (epsilon, gamma, cal: n_det elements), kernel
        // arrays ArrayArgs of their declared lengths; hwp is absent; weights is the only output.
        unsafe { self.time("stokes_weights_iqu", &args)? };
        self.tm.finish(vec![px, hr, hn, wt, q, flags, hwp])?;
        Ok(p)
    }

    /// stokes_weights_I (its output is not used further).
    fn stokes_weights_i(&mut self) -> anyhow::Result<()> {
        let w = self.w;
        let mut weights_i: Vec<f64> = zeroed_large(w.n_det * w.n_samp);
        let wi = self.tm.output(&mut weights_i, "weights_I")?;
        let args = abi::StokesWeightsIArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            weight_index: w.rows.as_ptr(),
            cal: w.cal.as_ptr(),
            intervals: w.iv(),
            weights: wi.abi(),
        };
        // SAFETY: as for pointing_detector (cal has n_det elements);
        // weights is the only output.
        unsafe { self.time("stokes_weights_i", &args)? };
        self.tm.finish(vec![wi])
    }

    /// scan_map of a random map, float64 then float32; returns det_data.
    fn scan_map(
        &mut self,
        p: &Pointing,
        global2local: &[i64],
        n_local: usize,
    ) -> anyhow::Result<Vec<f64>> {
        let w = self.w;
        let map = w.map(n_local, NNZ);
        let mut map32: Vec<f32> = zeroed_large(map.len());
        for (y, &x) in map32.iter_mut().zip(&map) {
            *y = x as f32;
        }
        let mut det_data: Vec<f64> = zeroed_large(w.n_det * w.n_samp);
        let g2l = self.tm.input(global2local, "global2local")?;
        let m64 = self.tm.input(&map, "mapdata_f64")?;
        let m32 = self.tm.input(&map32, "mapdata_f32")?;
        let px = self.tm.input(&p.pixels, "pixels")?;
        let wt = self.tm.input(&p.weights, "weights")?;
        let dd = self.tm.output(&mut det_data, "det_data")?;
        let mut args = abi::ScanMapArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            nnz: NNZ as u64,
            pixel_index: w.rows.as_ptr(),
            weight_index: w.rows.as_ptr(),
            data_index: w.rows.as_ptr(),
            intervals: w.iv(),
            global2local: g2l.abi(),
            n_pix_submap: w.n_pix_submap,
            map_dtype: abi::DTYPE_F64,
            reserved0: 0,
            mapdata: m64.abi(),
            pixels: px.abi(),
            weights: wt.abi(),
            det_data: dd.abi(),
            data_scale: 1.0,
            should_zero: 0,
            should_subtract: 0,
            should_scale: 0,
            reserved: [0; 5],
        };
        // SAFETY: as for pointing_detector; the map has n_local submaps, the
        // ones global2local numbers; det_data is the only output.
        unsafe { self.time("scan_map_f64", &args)? };
        args.map_dtype = abi::DTYPE_F32;
        args.mapdata = m32.abi();
        // SAFETY: host arrays from live Vecs, kernel arrays ArrayArgs of their declared lengths;
        // `m32` holds the same n_local submaps as float32; det_data is the only output.
        unsafe { self.time("scan_map_f32", &args)? };
        self.tm.finish(vec![dd, g2l, m64, m32, px, wt])?;
        Ok(det_data)
    }

    /// build_noise_weighted into a zeroed map.
    fn build_noise_weighted(
        &mut self,
        p: &Pointing,
        global2local: &[i64],
        n_local: usize,
        det_data: &[f64],
    ) -> anyhow::Result<()> {
        let w = self.w;
        let mut zmap: Vec<f64> = zeroed_large(n_local * w.n_pix_submap as usize * NNZ);
        let g2l = self.tm.input(global2local, "global2local")?;
        let px = self.tm.input(&p.pixels, "pixels")?;
        let wt = self.tm.input(&p.weights, "weights")?;
        let dd = self.tm.input(det_data, "det_data")?;
        let df = self.tm.input(&w.det_flags, "det_flags")?;
        let sf = self.tm.input(&w.shared_flags, "shared_flags")?;
        let zm = self.tm.output(&mut zmap, "zmap")?;
        let args = abi::BuildNoiseWeightedArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            nnz: NNZ as u64,
            pixel_index: w.rows.as_ptr(),
            weight_index: w.rows.as_ptr(),
            data_index: w.rows.as_ptr(),
            flag_index: w.rows.as_ptr(),
            det_scale: w.det_scale.as_ptr(),
            intervals: w.iv(),
            global2local: g2l.abi(),
            n_pix_submap: w.n_pix_submap,
            pixels: px.abi(),
            weights: wt.abi(),
            det_data: dd.abi(),
            det_flags: df.abi(),
            shared_flags: sf.abi(),
            zmap: zm.abi(),
            det_flag_mask: 1,
            shared_flag_mask: 1,
            reserved: [0; 6],
        };
        // SAFETY: as for scan_map (det_scale has n_det elements); zmap is
        // the only output.
        unsafe { self.time("build_noise_weighted", &args)? };
        self.tm.finish(vec![zm, g2l, px, wt, dd, df, sf])
    }

    /// noise_weight, in place on det_data.
    fn noise_weight(&mut self, det_data: &mut [f64]) -> anyhow::Result<()> {
        let w = self.w;
        let dd = self.tm.output(det_data, "det_data")?;
        let args = abi::NoiseWeightArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            data_index: w.rows.as_ptr(),
            detector_weights: w.noise_weights.as_ptr(),
            intervals: w.iv(),
            det_data: dd.abi(),
        };
        // SAFETY: as for pointing_detector (detector_weights has n_det
        // elements); det_data is the only output.
        unsafe { self.time("noise_weight", &args)? };
        self.tm.finish(vec![dd])
    }

    /// The layout of the offset template `o` for all detectors, as one call
    /// takes it.
    fn offset_layout(o: &Offsets) -> abi::OffsetLayout {
        abi::OffsetLayout {
            step_length: STEP_LENGTH,
            n_amp_views: o.n_amp_views.as_ptr(),
            amp_offset: o.amp_offset.as_ptr(),
        }
    }

    /// template_offset_add_to_signal, as one call for all detectors and as
    /// one call per detector.
    fn template_offset_add_to_signal(
        &mut self,
        o: &Offsets,
        det_data: &mut [f64],
    ) -> anyhow::Result<()> {
        let w = self.w;
        let am = self.tm.input(&o.amplitudes, "amplitudes")?;
        let af = self.tm.input(&o.amplitude_flags, "amplitude_flags")?;
        let dd = self.tm.output(det_data, "det_data")?;
        let all = abi::TemplateOffsetAddArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            data_index: w.rows.as_ptr(),
            layout: Self::offset_layout(o),
            intervals: w.iv(),
            amplitudes: am.abi(),
            amplitude_flags: af.abi(),
            det_data: dd.abi(),
        };
        // SAFETY: as for pointing_detector (n_amp_views has one element per
        // interval, amp_offset one per detector); det_data is the only
        // output. `one(d)` points at element d of the index and offset
        // arrays, of which a single-detector call reads one.
        unsafe {
            self.time_offset("template_offset_add_to_signal", &all, |d| {
                abi::TemplateOffsetAddArgs {
                    n_det: 1,
                    data_index: w.rows[d..].as_ptr(),
                    layout: abi::OffsetLayout {
                        amp_offset: o.amp_offset[d..].as_ptr(),
                        ..all.layout
                    },
                    ..all
                }
            })?
        };
        self.tm.finish(vec![dd, am, af])
    }

    /// template_offset_project_signal into `o.amplitudes`, as one call for
    /// all detectors and as one call per detector.
    fn template_offset_project_signal(
        &mut self,
        o: &mut Offsets,
        det_data: &[f64],
    ) -> anyhow::Result<()> {
        let w = self.w;
        let layout = Self::offset_layout(o);
        let dd = self.tm.input(det_data, "det_data")?;
        let fl = self.tm.input(&w.det_flags, "det_flags")?;
        let af = self.tm.input(&o.amplitude_flags, "amplitude_flags")?;
        let am = self.tm.output(&mut o.amplitudes, "amplitudes")?;
        let all = abi::TemplateOffsetProjectArgs {
            n_det: w.n_det as u64,
            n_samp: w.n_samp as u64,
            data_index: w.rows.as_ptr(),
            flag_index: w.rows.as_ptr(),
            layout,
            intervals: w.iv(),
            det_data: dd.abi(),
            flag_data: fl.abi(),
            amplitudes: am.abi(),
            amplitude_flags: af.abi(),
            flag_mask: 1,
            reserved: [0; 7],
        };
        // SAFETY: as for template_offset_add_to_signal (flag_index too
        // points at element d); amplitudes is the only output.
        unsafe {
            self.time_offset("template_offset_project_signal", &all, |d| {
                abi::TemplateOffsetProjectArgs {
                    n_det: 1,
                    data_index: w.rows[d..].as_ptr(),
                    flag_index: w.rows[d..].as_ptr(),
                    layout: abi::OffsetLayout {
                        amp_offset: o.amp_offset[d..].as_ptr(),
                        ..all.layout
                    },
                    ..all
                }
            })?
        };
        self.tm.finish(vec![am, dd, fl, af])
    }

    /// cov_accum_diag_hits and cov_accum_diag_invnpp as CovarianceAndHits
    /// calls them: once per detector, over its in-interval samples, with the
    /// local submap and pixel of its NEST pixels (pixel -1 where a shared or
    /// detector flag is set), the IQU weights and `scale = det_scale`.
    fn cov_accum(
        &mut self,
        p: &Pointing,
        global2local: &[i64],
        n_local: usize,
    ) -> anyhow::Result<()> {
        let w = self.w;
        let nps = w.n_pix_submap;
        let n_in = w.n_in;
        let mut submap = Vec::with_capacity(w.n_det * n_in);
        let mut subpix = Vec::with_capacity(w.n_det * n_in);
        let mut weights = Vec::with_capacity(w.n_det * n_in * NNZ);
        for d in 0..w.n_det {
            for iv in &w.intervals {
                for s in iv.first as usize..iv.last as usize {
                    let pix = p.pixels[d * w.n_samp + s];
                    let flagged = (w.shared_flags[s] | w.det_flags[d * w.n_samp + s]) & 1 != 0;
                    let (sm, px) = if pix < 0 {
                        (-1, -1)
                    } else {
                        (global2local[(pix / nps) as usize], pix % nps)
                    };
                    submap.push(sm);
                    subpix.push(if flagged { -1 } else { px });
                    let k = (d * w.n_samp + s) * NNZ;
                    weights.extend_from_slice(&p.weights[k..k + NNZ]);
                }
            }
        }
        let mut hits: Vec<i64> = zeroed_large(n_local * nps as usize);
        let mut invnpp: Vec<f64> = zeroed_large(n_local * nps as usize * NNZ * (NNZ + 1) / 2);
        let mut staged = Vec::with_capacity(3 * w.n_det + 2);
        let mut inputs = Vec::with_capacity(w.n_det);
        for d in 0..w.n_det {
            let r = d * n_in..(d + 1) * n_in;
            let sm = self.tm.input(&submap[r.clone()], "submap")?;
            let px = self.tm.input(&subpix[r], "subpix")?;
            let wt = self
                .tm
                .input(&weights[d * n_in * NNZ..(d + 1) * n_in * NNZ], "weights")?;
            inputs.push((sm.abi(), px.abi(), wt.abi()));
            staged.extend([sm, px, wt]);
        }
        let h = self.tm.output(&mut hits, "hits")?;
        let inv = self.tm.output(&mut invnpp, "invnpp")?;
        let hit_calls: Vec<_> = inputs
            .iter()
            .map(|&(submap, subpix, _)| abi::CovAccumDiagHitsArgs {
                nsub: n_local as i64,
                nsubpix: nps,
                nnz: NNZ as i64,
                submap,
                subpix,
                hits: h.abi(),
            })
            .collect();
        let inv_calls: Vec<_> = inputs
            .iter()
            .zip(&w.det_scale)
            .map(
                |(&(submap, subpix, weights), &scale)| abi::CovAccumDiagInvnppArgs {
                    nsub: n_local as i64,
                    nsubpix: nps,
                    nnz: NNZ as i64,
                    submap,
                    subpix,
                    weights,
                    scale,
                    invnpp: inv.abi(),
                },
            )
            .collect();
        let units = w.units();
        // SAFETY: every array is an ArrayArg of the length its call declares
        // (n_in samples, n_in * nnz weights, n_local * nps pixels of 1 or 6
        // elements); hits and invnpp are the only outputs.
        unsafe {
            self.time_calls("cov_accum_diag_hits", &hit_calls, units)?;
            self.time_calls("cov_accum_diag_invnpp", &inv_calls, units)?;
        }
        staged.extend([h, inv]);
        self.tm.finish(staged)
    }

    /// filter_polynomial as PolyFilter calls it: once per detector, with its
    /// own flags (shared | detector), the intervals as scans; in place.
    fn filter_polynomial(&mut self, det_data: &mut [f64]) -> anyhow::Result<()> {
        let w = self.w;
        let flags: Vec<u8> = w
            .det_flags
            .chunks(w.n_samp)
            .flat_map(|row| row.iter().zip(&w.shared_flags).map(|(d, s)| (d | s) & 1))
            .collect();
        let starts: Vec<i64> = w.intervals.iter().map(|i| i.first).collect();
        let stops: Vec<i64> = w.intervals.iter().map(|i| i.last).collect();
        let mut staged = Vec::with_capacity(w.n_det + 1);
        for row in flags.chunks(w.n_samp) {
            staged.push(self.tm.input(row, "flags")?);
        }
        let sig = self.tm.output(det_data, "signals")?;
        let calls: Vec<_> = staged
            .iter()
            .enumerate()
            .map(|(d, fl)| abi::FilterPolynomialArgs {
                n_signal: 1,
                n_samp: w.n_samp as u64,
                n_scan: starts.len() as u64,
                order: POLY_ORDER,
                signal_index: w.rows[d..].as_ptr(),
                starts: starts.as_ptr(),
                stops: stops.as_ptr(),
                flags: fl.abi(),
                signals: sig.abi(),
            })
            .collect();
        // SAFETY: signal_index points at one element of rows, starts and
        // stops have n_scan elements, flags n_samp, signals n_det rows of
        // n_samp; signals is the only output.
        unsafe { self.time_calls("filter_polynomial", &calls, w.units())? };
        staged.push(sig);
        self.tm.finish(staged)
    }

    /// filter_poly2D as PolyFilter2D calls it, on the first
    /// [`POLY2D_SAMPLES`] in-interval samples: `[n_samp, n_det]` signals
    /// (zero where masked) and masks (shared and detector flags).
    fn filter_poly2d(&mut self, det_data: &[f64]) -> anyhow::Result<()> {
        let w = self.w;
        let samples: Vec<usize> = w
            .intervals
            .iter()
            .flat_map(|i| i.first as usize..i.last as usize)
            .take(POLY2D_SAMPLES)
            .collect();
        let n = samples.len();
        let mut masks = Vec::with_capacity(n * w.n_det);
        let mut signals = Vec::with_capacity(n * w.n_det);
        for &s in &samples {
            for d in 0..w.n_det {
                let good = (w.shared_flags[s] | w.det_flags[d * w.n_samp + s]) & 1 == 0;
                masks.push(u8::from(good));
                signals.push(if good {
                    det_data[d * w.n_samp + s]
                } else {
                    0.0
                });
            }
        }
        let (templates, det_groups) = poly2d_templates(w.n_det);
        let n_mode = templates.len() / w.n_det;
        let mut coeff = vec![0.0f64; n * POLY2D_GROUPS * n_mode];
        let sg = self.tm.input(&signals, "signals")?;
        let mk = self.tm.input(&masks, "masks")?;
        let cf = self.tm.output(&mut coeff, "coeff")?;
        let args = abi::FilterPoly2dArgs {
            n_samp: n as u64,
            n_det: w.n_det as u64,
            n_group: POLY2D_GROUPS as u64,
            n_mode: n_mode as u64,
            det_groups: det_groups.as_ptr(),
            templates: templates.as_ptr(),
            signals: sg.abi(),
            masks: mk.abi(),
            coeff: cf.abi(),
        };
        let units = (w.n_det * n) as u64;
        // SAFETY: det_groups has n_det elements, templates n_det * n_mode,
        // signals and masks n * n_det, coeff n * n_group * n_mode; coeff is
        // the only output.
        unsafe { self.time_calls("filter_poly2D", &[args], units)? };
        self.tm.finish(vec![cf, sg, mk])
    }

    /// template_offset_apply_diag_precond on `amps_in`, recorded under `key`
    /// per amplitude.
    fn precond(
        &mut self,
        key: &'static str,
        offset_var: &[f64],
        amps_in: &[f64],
        flags: &[u8],
    ) -> anyhow::Result<()> {
        let backend = self.tm.backend;
        let n = offset_var.len();
        let mut amps_out: Vec<f64> = zeroed_large(n);
        let ov = self.tm.input(offset_var, "offset_var")?;
        let ai = self.tm.input(amps_in, "amplitudes_in")?;
        let af = self.tm.input(flags, "amplitude_flags")?;
        let ao = self.tm.output(&mut amps_out, "amplitudes_out")?;
        let args = abi::TemplateOffsetPrecondArgs {
            n_amp: n as u64,
            offset_var: ov.abi(),
            amplitudes_in: ai.abi(),
            amplitude_flags: af.abi(),
            amplitudes_out: ao.abi(),
        };
        // SAFETY: the four arrays are live and have n_amp elements; only
        // amplitudes_out is written.
        let best = self
            .tm
            .best(key, key, || unsafe { backend.launch(&args) })?;
        if let Some(best) = best {
            self.out.push(KernelTiming::new(key, best, n as u64));
        }
        self.tm.finish(vec![ao, ov, ai, af])
    }

    /// The bandwidth reference ([`STREAM_KEY`]): `amp_axpby` over `n`
    /// elements, timed when it or any streaming row is.
    fn stream_reference(&mut self, n: usize) -> anyhow::Result<()> {
        let opts = self.tm.opts;
        if !opts.times(STREAM_KEY) && !STREAMING_BYTES.iter().any(|(k, _)| opts.times(k)) {
            return Ok(());
        }
        let backend = self.tm.backend;
        let mut x: Vec<f64> = zeroed_large(n);
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 1000) as f64 * 1e-3;
        }
        let mut y: Vec<f64> = zeroed_large(n);
        let xa = self.tm.input(&x, "x")?;
        let ya = self.tm.output(&mut y, "y")?;
        let args = abi::AmpAxpbyArgs {
            n: n as i64,
            alpha: 0.5,
            beta: 1.0,
            x: xa.abi(),
            y: ya.abi(),
        };
        // SAFETY: x and y are live and have n elements; only y is written.
        let best = self.tm.best_timed(
            STREAM_KEY,
            "the bandwidth reference (amp_axpby)",
            || unsafe { backend.launch(&args) },
        )?;
        self.stream = Some(StreamReference {
            n,
            best_s: best,
            gb_s: STREAM_BYTES * n as f64 / best / 1e9,
        });
        self.tm.finish(vec![ya, xa])
    }
}
