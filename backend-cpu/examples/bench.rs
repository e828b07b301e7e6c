//! Timing of the CPU kernels on the workload of the TOAST reference timings
//! (`timings.md`): 50 detectors x 200,000 samples, 10 intervals covering 95%,
//! a satellite-like scan at 200 Hz, nside 2048 NEST, offset step 200.
//!
//! `cargo run --release -p backend-cpu --example bench -- [threads...]`
//! prints, per kernel and thread count, the best of 5 wall-clock times and
//! the time per detector-sample inside the intervals.

use std::ffi::{c_void, CString};
use std::time::Instant;
use toast_accel::abi::{self, Array, BackendTable, Interval, Intervals};
use toast_backend_cpu::toast_backend_entry;

const N_DET: usize = 50;
const N_SAMP: usize = 200_000;
const NSIDE: i64 = 2048;
const NPS: i64 = 16384;
const STEP: i64 = 200;

fn table() -> &'static BackendTable {
    // SAFETY: static header and table.
    unsafe { &*(*toast_backend_entry()).table }
}

fn arr<T>(v: &[T]) -> Array {
    Array {
        ptr: v.as_ptr() as u64,
        len: v.len() as u64,
    }
}

fn arr_mut<T>(v: &mut [T]) -> Array {
    Array {
        ptr: v.as_mut_ptr() as u64,
        len: v.len() as u64,
    }
}

fn qmul(p: [f64; 4], q: [f64; 4]) -> [f64; 4] {
    [
        p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0],
        -p[0] * q[2] + p[1] * q[3] + p[2] * q[0] + p[3] * q[1],
        p[0] * q[1] - p[1] * q[0] + p[2] * q[3] + p[3] * q[2],
        -p[0] * q[0] - p[1] * q[1] - p[2] * q[2] + p[3] * q[3],
    ]
}

fn rot(axis: usize, a: f64) -> [f64; 4] {
    let mut q = [0.0, 0.0, 0.0, (a / 2.0).cos()];
    q[axis] = (a / 2.0).sin();
    q
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether kernel `name` is selected by the `BENCH_FILTER` environment
/// variable (a substring; all kernels when unset).
fn selected(name: &str) -> bool {
    std::env::var("BENCH_FILTER").map_or(true, |f| name.contains(&f))
}

/// Process CPU time (user + system) in seconds, from /proc/self/stat.
fn cpu_time() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime, in 1/100 s) are the 12th and 13th
    // after the command name.
    let field = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (field(11) + field(12)) / 100.0
}

fn best_of(n: usize, f: &mut dyn FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn check(s: abi::Status) {
    if s != abi::OK {
        // SAFETY: NUL-terminated thread-local message.
        let m = unsafe { std::ffi::CStr::from_ptr(table().last_error.unwrap()()) };
        panic!("kernel failed: {}", m.to_string_lossy());
    }
}

/// Call a kernel entry of the plugin.
///
/// Every argument struct of this benchmark points into live vectors of the
/// lengths it declares, and outputs are taken with `arr_mut`.
fn launch<A>(f: Option<abi::KernelFn<A>>, ctx: *mut c_void, a: &A) {
    // SAFETY: valid context; the arrays of `a` are valid (see above).
    check(unsafe { f.expect("entry")(ctx, a) })
}

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("thread counts"))
        .collect();
    let threads = if threads.is_empty() {
        vec![2, 1]
    } else {
        threads
    };
    let t = table();
    let mut rng = Rng(42);

    // Scan: 1 rpm spin with an 85 degree opening angle, slow precession.
    let rate = 200.0;
    let mut boresight = Vec::with_capacity(4 * N_SAMP);
    for s in 0..N_SAMP {
        let time = s as f64 / rate;
        let spin = 2.0 * std::f64::consts::PI * time / 60.0;
        let prec = 2.0 * std::f64::consts::PI * time / 3600.0;
        let q = qmul(
            qmul(rot(2, prec), rot(1, 0.5)),
            qmul(rot(2, spin), rot(1, 85f64.to_radians())),
        );
        boresight.extend_from_slice(&q);
    }
    let side = (N_DET as f64).sqrt().ceil() as usize;
    let focalplane: Vec<f64> = (0..N_DET)
        .flat_map(|d| {
            let (i, j) = ((d % side) as f64, (d / side) as f64);
            let q = qmul(
                rot(0, (i - 3.0) * 2f64.to_radians()),
                rot(1, (j - 3.0) * 2f64.to_radians()),
            );
            qmul(q, rot(2, d as f64 * 0.3))
        })
        .collect();
    let intervals: Vec<Interval> = (0..10)
        .map(|i| Interval {
            first: i * 20_000,
            last: i * 20_000 + 19_000,
        })
        .collect();
    let n_in: usize = intervals.iter().map(|i| (i.last - i.first) as usize).sum();
    let per = (N_DET * n_in) as f64;
    let ivs = Intervals {
        ptr: intervals.as_ptr(),
        len: intervals.len() as u64,
    };
    let shared_flags: Vec<u8> = (0..N_SAMP).map(|_| (rng.unit() < 0.01) as u8).collect();
    let det_flags: Vec<u8> = (0..N_DET * N_SAMP)
        .map(|_| (rng.unit() < 0.01) as u8 * 2)
        .collect();
    let index: Vec<i32> = (0..N_DET as i32).collect();
    let cal = vec![1.0; N_DET];
    let eps: Vec<f64> = (0..N_DET).map(|d| 0.01 * (d % 3) as f64).collect();
    let gamma: Vec<f64> = (0..N_DET).map(|d| d as f64 * 0.1).collect();
    let hwp: Vec<f64> = (0..N_SAMP).map(|s| s as f64 * 0.01).collect();
    let det_data_src: Vec<f64> = (0..N_DET * N_SAMP).map(|_| rng.unit() - 0.5).collect();

    let mut quats = vec![0.0f64; N_DET * N_SAMP * 4];
    let mut pixels = vec![-1i64; N_DET * N_SAMP];
    let n_submap = (12 * NSIDE * NSIDE / NPS) as usize;
    let mut hits = vec![0u8; n_submap];
    let mut weights = vec![0.0f64; N_DET * N_SAMP * 3];
    let mut weights_i = vec![0.0f64; N_DET * N_SAMP];

    println!(
        "{:<48} {:>7} {:>10} {:>14}",
        "kernel", "threads", "best ms", "ns/sample/det"
    );
    for &th in &threads {
        let opts = CString::new(format!("threads={th}")).unwrap();
        let api = abi::HostApi {
            size: std::mem::size_of::<abi::HostApi>() as u32,
            abi_minor: abi::ABI_MINOR,
            log: None,
            log_user: std::ptr::null_mut(),
            options: opts.as_ptr(),
        };
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid API struct and out pointer.
        check(unsafe { t.init.unwrap()(&api, &mut ctx) });
        let timed = |name: &str, n: f64, f: &mut dyn FnMut()| {
            if !selected(name) {
                // Still run it once: later kernels use its outputs.
                f();
                return;
            }
            let c0 = cpu_time();
            let secs = best_of(5, f);
            let cpu = (cpu_time() - c0) / 5.0;
            println!(
                "{name:<48} {th:>7} {:>10.2} {:>14.3}   (cpu {:.0} ms/call)",
                secs * 1e3,
                secs * 1e9 / n,
                cpu * 1e3
            );
        };
        let report = |name: &str, secs: f64, n: f64| {
            println!(
                "{name:<48} {th:>7} {:>10.2} {:>14.3}",
                secs * 1e3,
                secs * 1e9 / n
            );
        };

        let a = abi::PointingDetectorArgs {
            n_det: N_DET as u64,
            n_samp: N_SAMP as u64,
            quat_index: index.as_ptr(),
            focalplane: focalplane.as_ptr(),
            intervals: ivs,
            boresight: arr(&boresight),
            shared_flags: arr(&shared_flags),
            shared_flag_mask: 1,
            reserved: [0; 7],
            quats: arr_mut(&mut quats),
        };
        timed("pointing_detector", per, &mut || {
            launch(t.pointing_detector, ctx, &a)
        });

        for (nest, name) in [
            (1u8, "pixels_healpix (NEST, nside 2048)"),
            (0, "pixels_healpix (RING, nside 2048)"),
        ] {
            let a = abi::PixelsHealpixArgs {
                n_det: N_DET as u64,
                n_samp: N_SAMP as u64,
                quat_index: index.as_ptr(),
                pixel_index: index.as_ptr(),
                intervals: ivs,
                quats: arr(&quats),
                shared_flags: arr(&shared_flags),
                pixels: arr_mut(&mut pixels),
                hit_submaps: arr_mut(&mut hits),
                nside: NSIDE,
                n_pix_submap: NPS,
                shared_flag_mask: 1,
                nest,
                reserved: [0; 6],
            };
            timed(name, per, &mut || launch(t.pixels_healpix, ctx, &a));
        }
        // Leave NEST pixels for the map kernels.
        let a = abi::PixelsHealpixArgs {
            n_det: N_DET as u64,
            n_samp: N_SAMP as u64,
            quat_index: index.as_ptr(),
            pixel_index: index.as_ptr(),
            intervals: ivs,
            quats: arr(&quats),
            shared_flags: arr(&shared_flags),
            pixels: arr_mut(&mut pixels),
            hit_submaps: arr_mut(&mut hits),
            nside: NSIDE,
            n_pix_submap: NPS,
            shared_flag_mask: 1,
            nest: 1,
            reserved: [0; 6],
        };
        launch(t.pixels_healpix, ctx, &a);

        for (use_hwp, name) in [
            (false, "stokes_weights_IQU (no HWP)"),
            (true, "stokes_weights_IQU (HWP)"),
        ] {
            let a = abi::StokesWeightsIquArgs {
                n_det: N_DET as u64,
                n_samp: N_SAMP as u64,
                quat_index: index.as_ptr(),
                weight_index: index.as_ptr(),
                epsilon: eps.as_ptr(),
                gamma: gamma.as_ptr(),
                cal: cal.as_ptr(),
                intervals: ivs,
                quats: arr(&quats),
                hwp: if use_hwp { arr(&hwp) } else { Array::ABSENT },
                weights: arr_mut(&mut weights),
                iau: 0,
                reserved: [0; 7],
            };
            timed(name, per, &mut || launch(t.stokes_weights_iqu, ctx, &a));
        }
        let a = abi::StokesWeightsIArgs {
            n_det: N_DET as u64,
            n_samp: N_SAMP as u64,
            weight_index: index.as_ptr(),
            cal: cal.as_ptr(),
            intervals: ivs,
            weights: arr_mut(&mut weights_i),
        };
        timed("stokes_weights_I", per, &mut || {
            launch(t.stokes_weights_i, ctx, &a)
        });

        // Maps over the hit submaps.
        let mut g2l = vec![-1i64; n_submap];
        let mut n_local = 0;
        for (g, &h) in hits.iter().enumerate() {
            if h != 0 {
                g2l[g] = n_local;
                n_local += 1;
            }
        }
        let map_len = n_local as usize * NPS as usize * 3;
        let map: Vec<f64> = (0..map_len).map(|i| (i % 1000) as f64 * 1e-3).collect();
        let map32: Vec<f32> = map.iter().map(|&x| x as f32).collect();
        let mut det_data = det_data_src.clone();
        for (dtype, name, m) in [
            (abi::DTYPE_F64, "scan_map (float64, nnz=3, add)", arr(&map)),
            (
                abi::DTYPE_F32,
                "scan_map (float32, nnz=3, add)",
                arr(&map32),
            ),
        ] {
            let a = abi::ScanMapArgs {
                n_det: N_DET as u64,
                n_samp: N_SAMP as u64,
                nnz: 3,
                pixel_index: index.as_ptr(),
                weight_index: index.as_ptr(),
                data_index: index.as_ptr(),
                intervals: ivs,
                global2local: arr(&g2l),
                n_pix_submap: NPS,
                map_dtype: dtype,
                reserved0: 0,
                mapdata: m,
                pixels: arr(&pixels),
                weights: arr(&weights),
                det_data: arr_mut(&mut det_data),
                data_scale: 1.0,
                should_zero: 0,
                should_subtract: 0,
                should_scale: 0,
                reserved: [0; 5],
            };
            timed(
                &format!("{name} [{n_local} local submaps]"),
                per,
                &mut || launch(t.scan_map, ctx, &a),
            );
        }
        drop(map32);
        let mut zmap = vec![0.0f64; map_len];
        let scale = vec![1.0; N_DET];
        let a = abi::BuildNoiseWeightedArgs {
            n_det: N_DET as u64,
            n_samp: N_SAMP as u64,
            nnz: 3,
            pixel_index: index.as_ptr(),
            weight_index: index.as_ptr(),
            data_index: index.as_ptr(),
            flag_index: index.as_ptr(),
            det_scale: scale.as_ptr(),
            intervals: ivs,
            global2local: arr(&g2l),
            n_pix_submap: NPS,
            pixels: arr(&pixels),
            weights: arr(&weights),
            det_data: arr(&det_data_src),
            det_flags: arr(&det_flags),
            shared_flags: arr(&shared_flags),
            zmap: arr_mut(&mut zmap),
            det_flag_mask: 2,
            shared_flag_mask: 1,
            reserved: [0; 6],
        };
        timed(
            "build_noise_weighted (nnz=3, det+shared flags)",
            per,
            &mut || launch(t.build_noise_weighted, ctx, &a),
        );
        drop(zmap);
        drop(map);

        let a = abi::NoiseWeightArgs {
            n_det: N_DET as u64,
            n_samp: N_SAMP as u64,
            data_index: index.as_ptr(),
            detector_weights: cal.as_ptr(),
            intervals: ivs,
            det_data: arr_mut(&mut det_data),
        };
        timed("noise_weight", per, &mut || launch(t.noise_weight, ctx, &a));

        let nav: Vec<i64> = intervals
            .iter()
            .map(|i| (i.last - i.first + STEP - 1) / STEP)
            .collect();
        let block: i64 = nav.iter().sum();
        let offs: Vec<i64> = (0..N_DET as i64).map(|d| d * block).collect();
        let n_amp = (block * N_DET as i64) as usize;
        let mut amps: Vec<f64> = (0..n_amp).map(|i| i as f64 * 1e-4).collect();
        let amp_flags: Vec<u8> = (0..n_amp).map(|i| (i % 50 == 0) as u8).collect();
        let no_flags = [-1i32; N_DET];
        for (per_det, label) in [(false, "1 call"), (true, "50 calls")] {
            let calls: Vec<(usize, usize)> = if per_det {
                (0..N_DET).map(|d| (d, 1)).collect()
            } else {
                vec![(0, N_DET)]
            };
            let secs = best_of(5, &mut || {
                for &(d0, n) in &calls {
                    let a = abi::TemplateOffsetAddArgs {
                        n_det: n as u64,
                        n_samp: N_SAMP as u64,
                        data_index: index[d0..].as_ptr(),
                        layout: abi::OffsetLayout {
                            step_length: STEP,
                            n_amp_views: nav.as_ptr(),
                            amp_offset: offs[d0..].as_ptr(),
                        },
                        intervals: ivs,
                        amplitudes: arr(&amps),
                        amplitude_flags: arr(&amp_flags),
                        det_data: arr_mut(&mut det_data),
                    };
                    launch(t.template_offset_add_to_signal, ctx, &a);
                }
            });
            report(
                &format!("template_offset_add_to_signal (step 200, {label})"),
                secs,
                per,
            );
            let secs = best_of(5, &mut || {
                for &(d0, n) in &calls {
                    let a = abi::TemplateOffsetProjectArgs {
                        n_det: n as u64,
                        n_samp: N_SAMP as u64,
                        data_index: index[d0..].as_ptr(),
                        flag_index: no_flags[d0..].as_ptr(),
                        layout: abi::OffsetLayout {
                            step_length: STEP,
                            n_amp_views: nav.as_ptr(),
                            amp_offset: offs[d0..].as_ptr(),
                        },
                        intervals: ivs,
                        det_data: arr(&det_data),
                        flag_data: Array::ABSENT,
                        amplitudes: arr_mut(&mut amps),
                        amplitude_flags: arr(&amp_flags),
                        flag_mask: 1,
                        reserved: [0; 7],
                    };
                    launch(t.template_offset_project_signal, ctx, &a);
                }
            });
            report(
                &format!("template_offset_project_signal (step 200, {label})"),
                secs,
                per,
            );
        }
        for n in [n_amp, 10_000_000] {
            let var = vec![0.5f64; n];
            let ain = vec![1.5f64; n];
            let fl: Vec<u8> = (0..n).map(|i| (i % 50 == 0) as u8).collect();
            let mut out = vec![0.0f64; n];
            let a = abi::TemplateOffsetPrecondArgs {
                n_amp: n as u64,
                offset_var: arr(&var),
                amplitudes_in: arr(&ain),
                amplitude_flags: arr(&fl),
                amplitudes_out: arr_mut(&mut out),
            };
            let secs = best_of(5, &mut || {
                launch(t.template_offset_apply_diag_precond, ctx, &a)
            });
            report(
                &format!("template_offset_apply_diag_precond (n_amp={n}) /amp"),
                secs,
                n as f64,
            );
        }
        // SAFETY: the context from init, shut down once.
        unsafe { t.shutdown.unwrap()(ctx) };
    }
}
