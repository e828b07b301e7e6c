//! Workspace-level integration tests live in `tests/tests/`; this library
//! holds what several of them share: the conformance suite, written once and
//! instantiated per backend ([`conformance_suite!`]).

use std::sync::Arc;
use toast_accel::abi::{self, Kernel, SampleRange, SampleRanges};
use toast_accel::host::conformance::{kernel_of, run_dir, CaseOutcome, Comparison};
use toast_accel::host::{AccelError, Backend};
use toast_testkit::plugins::{load, skip_unless_required};

pub use toast_testkit::{shipped_cases_dir as cases_dir, SHIPPED_CASES};

/// The plugin `name` (loaded from its shared library, through the ABI),
/// initialised with `options`; or `None`, after printing `SKIPPED: reason`,
/// when it is unavailable here and the environment variable `require` is
/// unset (CI sets it, so there an absent backend fails); an empty `require`
/// means the backend is always required (the CPU). Any other failure to
/// initialise fails the test.
pub fn backend_or_skip(name: &str, options: &str, require: &str) -> Option<Backend> {
    match Arc::new(load(name)).init(options) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                !require.is_empty(),
                "the {name} backend must be available: {e}"
            );
            skip_unless_required(require, &e);
            assert!(
                matches!(e, AccelError::Unavailable { .. }),
                "an absent {name} backend must be `unavailable`, got: {e}"
            );
            None
        }
    }
}

/// The map-maker's fused kernels (ABI minor 4): their compact-form cases
/// pass within `FUSED_COMPACT_RTOL` on every backend (the rebuilt weights
/// are a few ulp from TOAST's), so every suite lists them as tolerant.
pub const FUSED_KERNELS: [Kernel; 3] = [
    Kernel::CompactExpandPointing,
    Kernel::FusedAccumulate,
    Kernel::FusedProject,
];

/// `sim_noise` (ABI minor 5): TOAST's inverse FFT is FFTW's, ours another
/// (realfft on the CPU, a Stockham FFT on a device), so its cases pass
/// within `NOISE_RTOL` on every backend, and every suite lists it as
/// tolerant.
pub const NOISE_KERNELS: [Kernel; 1] = [Kernel::SimNoise];

/// Every shipped case passes on `b`, in the comparison the runner uses for
/// it (`expected`: exact for host backends, tolerant for devices), only the
/// kernels in `tolerant` needing the tolerance; a device backend's staged
/// buffers are all freed.
pub fn assert_all_cases_pass(b: &Backend, expected: Comparison, tolerant: &[Kernel]) {
    assert_eq!(Comparison::for_backend(b), expected, "{}", b.name());
    let results = run_dir(b, &cases_dir());
    assert_eq!(results.len(), SHIPPED_CASES);
    let mut failures = Vec::new();
    for (path, r) in &results {
        match r {
            Ok(CaseOutcome::Pass) => {}
            Ok(o @ CaseOutcome::PassTolerant { .. }) => {
                let n = path.file_stem().unwrap_or_default().to_string_lossy();
                if !kernel_of(&n).is_some_and(|k| {
                    tolerant.contains(&k)
                        || FUSED_KERNELS.contains(&k)
                        || NOISE_KERNELS.contains(&k)
                }) {
                    failures.push(format!("{}: needed the tolerance: {o}", path.display()));
                }
            }
            Ok(o) => failures.push(format!("{}: {o}", path.display())),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "[{}] failures:\n{}",
        b.name(),
        failures.join("\n")
    );
    if !b.host_addressable() {
        let st = b.stats().snapshot();
        assert!(st.h2d_calls > 0 && st.d2h_calls > 0, "{st:?}");
        assert_eq!(st.allocs, st.frees, "every staged buffer is freed: {st:?}");
    }
}

/// One conformance test for one backend: `test_name: backend = "NAME",
/// options = "…", require = "ENV_VAR" (or "" for always),
/// comparison = Exact | Tolerant, tolerant = [Kernel, …]`. The same test for every backend; a backend that
/// is unavailable is skipped with its reason unless `require` is set.
#[macro_export]
macro_rules! conformance_suite {
    ($test:ident: backend = $name:literal, options = $options:literal, require = $require:literal,
     comparison = $cmp:ident, tolerant = [$($kernel:ident),* $(,)?] $(,)?) => {
        #[test]
        fn $test() {
            let Some(b) = $crate::backend_or_skip($name, $options, $require) else {
                return;
            };
            $crate::assert_all_cases_pass(
                &b,
                ::toast_accel::host::conformance::Comparison::$cmp,
                &[$(::toast_accel::abi::Kernel::$kernel),*],
            );
        }
    };
}

/// The `filter_poly2D` workload of [`assert_poly2d_bursts_match_cpu`]:
/// samples, detectors (two groups, one detector in none), modes.
const BURSTS: (usize, usize, usize) = (700, 7, 6);

/// The device option that cuts [`assert_poly2d_bursts_match_cpu`]'s grid
/// into launches of 2 x 37 (sample, group) points: a workspace of 74
/// slices of 2 * 6^2 + 6 + 1 doubles (toast-gpu, kernels.h section 14).
pub const POLY2D_SMALL_CHUNKS: &str = "workspace_bytes=46768";

/// `filter_poly2D` on `device` gives the CPU plugin's bits, on a workload
/// whose masks change in bursts: runs of unchanged masks of every length
/// (some longer than the device's 256-sample runs between forced
/// decompositions, some of one sample), a group that goes fully masked, a
/// NaN signal under a zero mask, and, with `device` initialised with
/// [`POLY2D_SMALL_CHUNKS`], launch chunks that begin inside runs. The
/// device decomposes only where a group's mask changes (and at chunk
/// starts); every other sample reuses its head's decomposition.
pub fn assert_poly2d_bursts_match_cpu(device: &Backend) {
    use toast_accel::host::stage::ArrayArg;
    let (n_samp, n_det, n_mode) = BURSTS;
    let n_group = 2usize;
    let det_groups: Vec<i32> = vec![0, 1, 0, 1, -1, 0, 1];
    // x^i y^j, i + j <= 2, of the detectors' positions.
    let mut templates = Vec::with_capacity(n_det * n_mode);
    for d in 0..n_det {
        let (x, y) = (0.3 * d as f64 - 0.9, 0.17 * (d * d) as f64 - 1.1);
        templates.extend([1.0, x, y, x * x, x * y, y * y]);
    }
    // A mask that changes at the ends of bursts of varying lengths.
    let mut masks = vec![1u8; n_samp * n_det];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut s = 0usize;
    let mut burst = 0usize;
    while s < n_samp {
        let len = match burst % 5 {
            0 => 300,
            1 => 1,
            2 => 37,
            _ => 1 + (next() % 60) as usize,
        };
        let bad = next();
        for i in s..(s + len).min(n_samp) {
            for d in 0..n_det {
                // Burst 3 masks all of group 0; otherwise a few detectors.
                let off = if burst % 5 == 3 {
                    det_groups[d] == 0
                } else {
                    (bad >> d) & 3 == 0
                };
                masks[i * n_det + d] = if off { 0 } else { 1 + ((i / 3 + d) % 2) as u8 };
            }
        }
        s += len;
        burst += 1;
    }
    let mut signals: Vec<f64> = (0..n_samp * n_det)
        .map(|i| ((i * 7919) % 1009) as f64 * 0.013 - 6.0)
        .collect();
    // A NaN under a zero mask, in a group with a good detector there.
    let group_good =
        |i: usize, g: i32| (0..n_det).any(|d| det_groups[d] == g && masks[i * n_det + d] != 0);
    let nan = (0..n_samp * n_det)
        .find(|&k| masks[k] == 0 && det_groups[k % n_det] == 1 && group_good(k / n_det, 1))
        .expect("a masked detector beside a good one");
    signals[nan] = f64::NAN;
    let run = |b: &Backend| -> Vec<f64> {
        let mut coeff = vec![-1.0f64; n_samp * n_group * n_mode];
        let sg = ArrayArg::input(b, &signals, "signals").expect("stage signals");
        let mk = ArrayArg::input(b, &masks, "masks").expect("stage masks");
        let cf = ArrayArg::output(b, &mut coeff, "coeff").expect("stage coeff");
        let args = abi::FilterPoly2dArgs {
            n_samp: n_samp as u64,
            n_det: n_det as u64,
            n_group: n_group as u64,
            n_mode: n_mode as u64,
            det_groups: det_groups.as_ptr(),
            templates: templates.as_ptr(),
            signals: sg.abi(),
            masks: mk.abi(),
            coeff: cf.abi(),
        };
        // SAFETY: det_groups has n_det elements, templates n_det * n_mode,
        // signals and masks n_samp * n_det, coeff n_samp * n_group * n_mode;
        // coeff is the only output and no array aliases another.
        unsafe { b.launch(&args) }.unwrap_or_else(|e| panic!("[{}] filter_poly2D: {e}", b.name()));
        for a in [cf, sg, mk] {
            a.finish().expect("finish a staged array");
        }
        coeff
    };
    let cpu = Arc::new(load("cpu")).init("").expect("the cpu backend");
    let want = run(&cpu);
    let got = run(device);
    assert!(
        want.iter().any(|x| x.is_nan()),
        "the NaN signal reaches a fit"
    );
    assert!(want.contains(&0.0), "a fully masked group fits 0");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits(),
            "[{}] coeff[{}, {}, {}] = {g:e}, the cpu's {w:e}",
            device.name(),
            i / (n_group * n_mode),
            i / n_mode % n_group,
            i % n_mode
        );
    }
}

/// `template_offset_project_signal` with a step length far past the data
/// (2^58 samples) and views of more amplitudes than their samples need (64
/// each: TOAST's layout check asks only for at least `ceil(len / step)`):
/// amplitude k of a view starts at `k * step_length`, which overflows an
/// i64 from k = 32. `device` must sum each view's samples into its first
/// amplitude and leave the others, as the CPU plugin does, and read no
/// sample outside the data (the overflowed start would be negative).
pub fn assert_huge_step_matches_cpu(device: &Backend) {
    use toast_accel::host::stage::ArrayArg;
    let (n_det, n_samp, per_view) = (2usize, 500usize, 64i64);
    let step_length = 1i64 << 58;
    let intervals = [
        SampleRange {
            first: 0,
            last: 200,
        },
        SampleRange {
            first: 250,
            last: 500,
        },
    ];
    let n_amp_views = [per_view, per_view];
    let n_amp = 2 * per_view as usize;
    let amp_offset: Vec<i64> = (0..n_det as i64).map(|d| d * n_amp as i64).collect();
    let data_index: Vec<i32> = (0..n_det as i32).collect();
    let flag_index: Vec<i32> = vec![0, -1];
    let det_data: Vec<f64> = (0..n_det * n_samp)
        .map(|i| ((i * 7919) % 1009) as f64 * 0.01 - 5.0)
        .collect();
    let flag_data: Vec<u8> = (0..n_samp).map(|s| u8::from(s % 7 == 0)).collect();
    let amplitude_flags = vec![0u8; n_det * n_amp];
    let run = |b: &Backend| -> Vec<f64> {
        let mut amplitudes = vec![0.5f64; n_det * n_amp];
        let d = ArrayArg::input(b, &det_data, "det_data").expect("stage det_data");
        let f = ArrayArg::input(b, &flag_data, "flag_data").expect("stage flag_data");
        let af = ArrayArg::input(b, &amplitude_flags, "amplitude_flags").expect("stage amp flags");
        let a = ArrayArg::output(b, &mut amplitudes, "amplitudes").expect("stage amplitudes");
        let args = abi::TemplateOffsetProjectArgs {
            n_det: n_det as u64,
            n_samp: n_samp as u64,
            data_index: data_index.as_ptr(),
            flag_index: flag_index.as_ptr(),
            layout: abi::OffsetLayout {
                step_length,
                n_amp_views: n_amp_views.as_ptr(),
                amp_offset: amp_offset.as_ptr(),
            },
            intervals: SampleRanges {
                ptr: intervals.as_ptr(),
                len: intervals.len() as u64,
            },
            det_data: d.abi(),
            flag_data: f.abi(),
            amplitudes: a.abi(),
            amplitude_flags: af.abi(),
            flag_mask: 1,
            reserved: [0; 7],
        };
        // SAFETY: data_index, flag_index and amp_offset have n_det
        // elements, n_amp_views one per interval; the staged arrays carry
        // their lengths (det_data n_det x n_samp, flag_data one row, the
        // amplitudes n_det x n_amp); only the amplitudes are written.
        unsafe { b.launch(&args) }
            .unwrap_or_else(|e| panic!("[{}] template_offset_project_signal: {e}", b.name()));
        for x in [a, d, f, af] {
            x.finish().expect("finish a staged array");
        }
        amplitudes
    };
    let cpu = Arc::new(load("cpu")).init("").expect("the cpu backend");
    let want = run(&cpu);
    let got = run(device);
    // Each view's whole sum is in its first amplitude; the rest keep 0.5.
    for d in 0..n_det {
        for (v, iv) in intervals.iter().enumerate() {
            let a0 = d * n_amp + v * per_view as usize;
            assert!(want[a0] != 0.5, "view {v} of detector {d} summed");
            assert!(want[a0 + 1..a0 + per_view as usize]
                .iter()
                .all(|&x| x == 0.5));
            let n = (iv.last - iv.first) as f64;
            let tol = 1e-15 * n * want[a0].abs().max(1.0) * 8.0;
            assert!(
                (got[a0] - want[a0]).abs() <= tol,
                "[{}] amplitude {a0}: {:e}, the cpu's {:e}",
                device.name(),
                got[a0],
                want[a0]
            );
        }
    }
    let same_rest = got
        .iter()
        .zip(&want)
        .enumerate()
        .filter(|(i, _)| !(i % n_amp).is_multiple_of(per_view as usize))
        .all(|(_, (g, w))| g.to_bits() == w.to_bits());
    assert!(
        same_rest,
        "[{}] an amplitude past its view's data changed",
        device.name()
    );
}

/// A data-dependent fault late in the data (a pixel beyond the map, a
/// quaternion with no direction) leaves every output the kernel adds into
/// as it was: `det_data` of `scan_map`, `zmap` of `build_noise_weighted`,
/// `hits` of `cov_accum_diag_hits` and `hit_submaps` of `pixels_healpix`
/// (the samples before the fault included: a caller that fixes its input
/// and calls again must not count them twice). Each call must fail with the
/// fault named. On a host-addressable backend (the CPU plugin) the kernel
/// writes the host's arrays in place, so this tests the kernels; on a
/// device backend the outputs are copied back only after a successful
/// launch (`launched`), so there it tests the fault's message and that
/// nothing is copied back.
pub fn assert_faults_leave_accumulated_outputs(b: &Backend) {
    use toast_accel::host::stage::ArrayArg;
    let (n_det, n_samp, nps) = (2usize, 4096usize, 12i64);
    let bad = n_samp - 7;
    let row: Vec<i32> = (0..n_det as i32).collect();
    let intervals = [SampleRange {
        first: 0,
        last: n_samp as i64,
    }];
    let ranges = SampleRanges {
        ptr: intervals.as_ptr(),
        len: 1,
    };
    let g2l: Vec<i64> = vec![0, 1];
    // Pixels in the two local submaps; one beyond the map, late in row 1.
    let mut pixels: Vec<i64> = (0..n_det * n_samp).map(|i| (i * 7 % 24) as i64).collect();
    pixels[n_samp + bad] = 2 * nps + 3;
    let weights: Vec<f64> = (0..n_det * n_samp * 3)
        .map(|i| 0.25 + (i % 5) as f64)
        .collect();
    let map: Vec<f64> = (0..2 * nps as usize * 3).map(|i| i as f64 * 0.5).collect();
    // The call failed, naming the bad sample, and left `output` unchanged.
    let expect_fault = |name: &str, r: Result<(), AccelError>, unchanged: bool| {
        let e = r.expect_err(&format!("[{}] {name}: a fault expected", b.name()));
        let what = format!("sample {bad}");
        assert!(
            e.to_string().contains(&what),
            "[{}] {name}: the fault does not name {what:?}: {e}",
            b.name()
        );
        assert!(
            unchanged,
            "[{}] {name}: an output changed by a failed call",
            b.name()
        );
    };

    // scan_map: det_data, which it adds into.
    let before: Vec<f64> = (0..n_det * n_samp).map(|i| i as f64).collect();
    let mut det_data = before.clone();
    let r = {
        let g = ArrayArg::input(b, &g2l, "global2local").expect("stage");
        let m = ArrayArg::input(b, &map, "mapdata").expect("stage");
        let p = ArrayArg::input(b, &pixels, "pixels").expect("stage");
        let w = ArrayArg::input(b, &weights, "weights").expect("stage");
        let d = ArrayArg::output(b, &mut det_data, "det_data").expect("stage");
        let args = abi::ScanMapArgs {
            n_det: n_det as u64,
            n_samp: n_samp as u64,
            nnz: 3,
            pixel_index: row.as_ptr(),
            weight_index: row.as_ptr(),
            data_index: row.as_ptr(),
            intervals: ranges,
            global2local: g.abi(),
            n_pix_submap: nps,
            map_dtype: abi::DTYPE_F64,
            reserved0: 0,
            mapdata: m.abi(),
            pixels: p.abi(),
            weights: w.abi(),
            det_data: d.abi(),
            data_scale: 1.0,
            should_zero: 0,
            should_subtract: 0,
            should_scale: 0,
            reserved: [0; 5],
        };
        // SAFETY: the index arrays have n_det elements naming rows 0..n_det;
        // the staged arrays have the lengths their shapes imply (pixels and
        // det_data n_det x n_samp, weights x 3, the map 2 submaps of nps x
        // 3, global2local 2); only det_data is written.
        unsafe { launched(b, &args, vec![d, g, m, p, w]) }
    };
    expect_fault("scan_map", r, det_data == before);

    // build_noise_weighted: zmap.
    let zbefore: Vec<f64> = (0..2 * nps as usize * 3).map(|i| 1.0 + i as f64).collect();
    let mut zmap = zbefore.clone();
    let scale = vec![1.0f64; n_det];
    let r = {
        let g = ArrayArg::input(b, &g2l, "global2local").expect("stage");
        let p = ArrayArg::input(b, &pixels, "pixels").expect("stage");
        let w = ArrayArg::input(b, &weights, "weights").expect("stage");
        let d = ArrayArg::input(b, &before, "det_data").expect("stage");
        let z = ArrayArg::output(b, &mut zmap, "zmap").expect("stage");
        let args = abi::BuildNoiseWeightedArgs {
            n_det: n_det as u64,
            n_samp: n_samp as u64,
            nnz: 3,
            pixel_index: row.as_ptr(),
            weight_index: row.as_ptr(),
            data_index: row.as_ptr(),
            flag_index: std::ptr::null(),
            det_scale: scale.as_ptr(),
            intervals: ranges,
            global2local: g.abi(),
            n_pix_submap: nps,
            pixels: p.abi(),
            weights: w.abi(),
            det_data: d.abi(),
            det_flags: abi::Array::ABSENT,
            shared_flags: abi::Array::ABSENT,
            zmap: z.abi(),
            det_flag_mask: 0,
            shared_flag_mask: 0,
            reserved: [0; 6],
        };
        // SAFETY: as for scan_map; det_scale has n_det elements, no flags;
        // only zmap is written.
        unsafe { launched(b, &args, vec![z, g, p, w, d]) }
    };
    expect_fault("build_noise_weighted", r, zmap == zbefore);

    // cov_accum_diag_hits: hits.
    let submap: Vec<i64> = (0..n_samp).map(|i| (i % 2) as i64).collect();
    let mut subpix: Vec<i64> = (0..n_samp).map(|i| (i % nps as usize) as i64).collect();
    subpix[bad] = nps;
    let hbefore: Vec<i64> = (0..2 * nps).collect();
    let mut hits = hbefore.clone();
    let r = {
        let sm = ArrayArg::input(b, &submap, "submap").expect("stage");
        let sp = ArrayArg::input(b, &subpix, "subpix").expect("stage");
        let h = ArrayArg::output(b, &mut hits, "hits").expect("stage");
        let args = abi::CovAccumDiagHitsArgs {
            nsub: 2,
            nsubpix: nps,
            nnz: 1,
            submap: sm.abi(),
            subpix: sp.abi(),
            hits: h.abi(),
        };
        // SAFETY: submap and subpix have n_samp elements, hits 2 x nps;
        // only hits is written.
        unsafe { launched(b, &args, vec![h, sm, sp]) }
    };
    expect_fault("cov_accum_diag_hits", r, hits == hbefore);

    // pixels_healpix: hit_submaps (the pixels are only written).
    let nside = 4i64;
    let mut quats: Vec<f64> = (0..n_det * n_samp)
        .flat_map(|i| {
            let a = i as f64 * 1e-3;
            [a.sin() * 0.6, a.cos() * 0.6, 0.2, 0.5]
        })
        .collect();
    quats[4 * (n_samp + bad)] = f64::NAN;
    let n_submap = (12 * nside * nside / nps) as usize;
    let sbefore = vec![0u8; n_submap];
    let mut hit_submaps = sbefore.clone();
    let mut pix_out = vec![0i64; n_det * n_samp];
    let r = {
        let q = ArrayArg::input(b, &quats, "quats").expect("stage");
        let p = ArrayArg::output(b, &mut pix_out, "pixels").expect("stage");
        let h = ArrayArg::output(b, &mut hit_submaps, "hit_submaps").expect("stage");
        let args = abi::PixelsHealpixArgs {
            n_det: n_det as u64,
            n_samp: n_samp as u64,
            quat_index: row.as_ptr(),
            pixel_index: row.as_ptr(),
            intervals: ranges,
            quats: q.abi(),
            shared_flags: abi::Array::ABSENT,
            pixels: p.abi(),
            hit_submaps: h.abi(),
            nside,
            n_pix_submap: nps,
            shared_flag_mask: 0,
            nest: 1,
            pixels_i32: 0,
            reserved: [0; 5],
        };
        // SAFETY: quats n_det x n_samp x 4, pixels n_det x n_samp,
        // hit_submaps one per submap of 12 nside^2 pixels; the index arrays
        // name rows 0..n_det; pixels and hit_submaps are written.
        unsafe { launched(b, &args, vec![p, h, q]) }
    };
    expect_fault("pixels_healpix", r, hit_submaps == sbefore);
}

/// Launch `args` on `b` and finish its staged arrays (copying the outputs
/// back) only when the launch succeeded.
///
/// # Safety
/// As [`Backend::launch`]: `args` name live arrays of the lengths the
/// struct implies, `staged` among them.
unsafe fn launched<A: toast_accel::host::KernelArgs>(
    b: &Backend,
    args: &A,
    staged: Vec<toast_accel::host::stage::ArrayArg<'_>>,
) -> Result<(), AccelError> {
    // SAFETY: the caller's contract.
    unsafe { b.launch(args) }?;
    staged.into_iter().try_for_each(|x| x.finish())
}
