//! Every shipped TOAST reference case must pass on the OpenCL plugin (loaded
//! as a real plugin, through the ABI), in the conformance runner's tolerant
//! mode for device backends; and the plugin's error paths (foreign and
//! freed handles, out-of-memory, data-dependent faults) are clean errors.
//!
//! # When there is no OpenCL
//!
//! Without an OpenCL runtime (libOpenCL.so.1) or a suitable device, the
//! plugin is unavailable. The tests then print `SKIPPED: <reason>` and
//! return early, **only when `TOAST_REQUIRE_OPENCL` is unset**. CI installs
//! PoCL (`pocl-opencl-icd`) and sets `TOAST_REQUIRE_OPENCL=1`, so there the
//! absence of OpenCL is a failure, never a silent pass.

use toast_accel::abi::{self, Array, SampleRange, SampleRanges};
use toast_accel::host::Backend;
use toast_tests::{backend_or_skip, conformance_suite};

conformance_suite!(
    all_cases_pass_on_opencl: backend = "opencl", options = "", require = "TOAST_REQUIRE_OPENCL",
    comparison = Tolerant, tolerant = [StokesWeightsIqu, BuildNoiseWeighted, CovAccumDiagInvnpp,
                FilterPolynomial, FilterPoly2d, CovAccumTimestream,
                TemplateOffsetProjectSignal],
);

// The polynomial filters' workspace interleaved, as for a GPU (the default,
// contiguous, is the suite above): the same bits.
conformance_suite!(
    all_cases_pass_on_opencl_interleaved_workspace: backend = "opencl",
    options = "workspace=interleaved", require = "TOAST_REQUIRE_OPENCL",
    comparison = Tolerant, tolerant = [StokesWeightsIqu, BuildNoiseWeighted, CovAccumDiagInvnpp,
                FilterPolynomial, FilterPoly2d, CovAccumTimestream,
                TemplateOffsetProjectSignal],
);

/// `filter_poly2D` on PoCL, launched in chunks of 37 samples (and whole):
/// the CPU's bits where masks change in bursts (the device decomposes only
/// at mask changes and chunk starts), in both workspace layouts.
#[test]
fn poly2d_bursts_match_the_cpu_in_small_chunks() {
    for options in [
        toast_tests::POLY2D_SMALL_CHUNKS.to_string(),
        format!("{};workspace=interleaved", toast_tests::POLY2D_SMALL_CHUNKS),
        String::new(),
    ] {
        let Some(b) = backend_or_skip("opencl", &options, "TOAST_REQUIRE_OPENCL") else {
            return;
        };
        toast_tests::assert_poly2d_bursts_match_cpu(&b);
    }
}

/// A step length past the data (whose amplitude starts overflow an i64)
/// sums each view into its first amplitude, as on the CPU, and reads
/// nothing outside the data.
#[test]
fn a_huge_step_length_matches_the_cpu() {
    let Some(b) = opencl() else { return };
    toast_tests::assert_huge_step_matches_cpu(&b);
}

/// A fault late in the data leaves the host's copies of the outputs the
/// map kernels add into as they were.
#[test]
fn faults_leave_accumulated_outputs_untouched() {
    let Some(b) = opencl() else { return };
    toast_tests::assert_faults_leave_accumulated_outputs(&b);
}

/// The OpenCL backend, or `None` (after printing `SKIPPED: reason`) when it
/// is unavailable and `TOAST_REQUIRE_OPENCL` is unset.
fn opencl() -> Option<Backend> {
    backend_or_skip("opencl", "", "TOAST_REQUIRE_OPENCL")
}

/// Whose memory the device's allocations take (ABI minor 9): a CPU device
/// (PoCL, which CI runs) is in the host's memory; any device answers one
/// of the two queries behind it (its type, `CL_DEVICE_HOST_UNIFIED_MEMORY`).
#[test]
fn the_device_says_whose_memory_it_allocates() {
    let Some(b) = opencl() else { return };
    let dev = b.device_info(0).unwrap();
    let want = match dev.name.contains("Portable Computing Language") {
        true => Some(abi::DeviceMemoryKind::Host),
        false => None,
    };
    assert_ne!(
        dev.memory_kind,
        abi::DeviceMemoryKind::Unknown,
        "{}",
        dev.name
    );
    if let Some(want) = want {
        assert_eq!(dev.memory_kind, want, "{}", dev.name);
    }
}

#[test]
fn foreign_freed_and_huge_buffers_are_refused_cleanly() {
    let Some(b) = opencl() else { return };
    // A handle that was never allocated here (e.g. a host address).
    let x = 7u64;
    let e = b.free(&x as *const u64 as u64).unwrap_err().to_string();
    assert!(e.contains("not a live buffer"), "{e}");
    // Freed twice.
    let h = b.alloc(64, "probe").unwrap();
    b.copy_to_device(h, 0, &[1u8; 64]).unwrap();
    let mut back = [0u8; 64];
    b.copy_to_host(h, 0, &mut back).unwrap();
    assert_eq!(back, [1u8; 64]);
    b.reset(h, 8, 8).unwrap();
    b.copy_to_host(h, 0, &mut back).unwrap();
    assert_eq!(&back[8..16], &[0u8; 8]);
    let e = b
        .copy_to_host(h, 60, &mut back[..8])
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside buffer `probe`"), "{e}");
    b.free(h).unwrap();
    let e = b.free(h).unwrap_err().to_string();
    assert!(e.contains("not a live buffer"), "{e}");
    // Out of memory names the buffer and the size.
    let e = b.alloc(1 << 62, "enormous").unwrap_err().to_string();
    assert!(
        e.contains("enormous") && e.contains(&(1u64 << 62).to_string()),
        "{e}"
    );
}

#[test]
fn a_pixel_beyond_the_map_names_detector_and_sample() {
    let Some(b) = opencl() else { return };
    let n_samp = 16usize;
    let up = |name: &str, bytes: &[u8]| {
        let h = b.alloc(bytes.len() as u64, name).unwrap();
        b.copy_to_device(h, 0, bytes).unwrap();
        h
    };
    let mut pixels = vec![0i64; 2 * n_samp];
    pixels[n_samp + 5] = 1000; // detector 1, sample 5: beyond 2 x 4 pixels
    pixels[n_samp + 9] = 2000;
    let bytes = |v: &[i64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let fbytes = |v: &[f64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let hp = up("pixels", &bytes(&pixels));
    let hw = up("weights", &fbytes(&vec![1.0; 2 * n_samp]));
    let hd = up("det_data", &fbytes(&vec![0.0; 2 * n_samp]));
    let hg = up("global2local", &bytes(&[0, 1]));
    let hm = up("mapdata", &fbytes(&[1.0; 8]));
    let idx = [0i32, 1];
    let iv = [SampleRange {
        first: 0,
        last: n_samp as i64,
    }];
    let arr = |h: u64, len: usize| Array {
        ptr: h,
        len: len as u64,
    };
    let args = abi::ScanMapArgs {
        n_det: 2,
        n_samp: n_samp as u64,
        nnz: 1,
        pixel_index: idx.as_ptr(),
        weight_index: idx.as_ptr(),
        data_index: idx.as_ptr(),
        intervals: SampleRanges {
            ptr: iv.as_ptr(),
            len: 1,
        },
        global2local: arr(hg, 2),
        n_pix_submap: 4,
        map_dtype: abi::DTYPE_F64,
        reserved0: 0,
        mapdata: arr(hm, 8),
        pixels: arr(hp, 2 * n_samp),
        weights: arr(hw, 2 * n_samp),
        det_data: arr(hd, 2 * n_samp),
        data_scale: 1.0,
        should_zero: 0,
        should_subtract: 0,
        should_scale: 0,
        reserved: [0; 5],
    };
    // SAFETY: every handle holds the declared number of elements; the host
    // arrays live across the call.
    let e = unsafe { b.launch(&args) }.unwrap_err().to_string();
    assert!(
        e.contains("detector 1 (interval 0), sample 5")
            && e.contains("pixel 1000 is beyond the map"),
        "{e}"
    );
    for h in [hp, hw, hd, hg, hm] {
        b.free(h).unwrap();
    }
}

#[test]
fn an_output_aliasing_an_input_is_refused_except_in_place_precond() {
    let Some(b) = opencl() else { return };
    let n = 8usize;
    let up = |name: &str, v: &[f64]| {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_ne_bytes()).collect();
        let h = b.alloc(bytes.len() as u64, name).unwrap();
        b.copy_to_device(h, 0, &bytes).unwrap();
        h
    };
    let amps: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let ha = up("amplitudes", &amps);
    let hv = up("offset_var", &[2.0; 8]);
    let hf = b.alloc(n as u64, "amplitude_flags").unwrap();
    let arr = |h: u64| Array {
        ptr: h,
        len: n as u64,
    };
    let args = |var: u64| abi::TemplateOffsetPrecondArgs {
        n_amp: n as u64,
        offset_var: arr(var),
        amplitudes_in: arr(ha),
        amplitude_flags: arr(hf),
        amplitudes_out: arr(ha),
    };
    // SAFETY: every handle holds n elements of its type.
    unsafe { b.launch(&args(hv)) }.unwrap();
    let mut back = vec![0u8; 8 * n];
    b.copy_to_host(ha, 0, &mut back).unwrap();
    let got: Vec<f64> = back
        .chunks_exact(8)
        .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<f64> = amps.iter().map(|a| 2.0 * a).collect();
    assert_eq!(got, want, "in place: out = in * offset_var");
    // SAFETY: `ha` (given for offset_var too) and `hf` are live handles of n elements;
    // the alias of the output with offset_var is refused before the kernel runs.
    let e = unsafe { b.launch(&args(ha)) }.unwrap_err().to_string();
    assert!(
        e.contains("output array `amplitudes_out` is the same buffer as `offset_var`"),
        "{e}"
    );
    for h in [ha, hv, hf] {
        b.free(h).unwrap();
    }
}

/// The data errors of the covariance kernels and the polynomial filter's
/// limits through the plugin: a pixel beyond the local map (hits: the first
/// faulty sample, worded as the CPU's); a fit with more templates than any
/// backend accepts refused before it runs, and one with more than a device
/// thread could hold in private memory (41) run from the workspace.
#[test]
fn cov_and_filter_data_errors_are_reported() {
    let Some(b) = opencl() else { return };
    let up = |name: &str, bytes: Vec<u8>| {
        let h = b.alloc(bytes.len() as u64, name).unwrap();
        b.copy_to_device(h, 0, &bytes).unwrap();
        h
    };
    let ib = |v: &[i64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let fb = |v: &[f64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let arr = |h: u64, len: usize| Array {
        ptr: h,
        len: len as u64,
    };
    // hits: 2 submaps x 4 pixels; samples 3 (submap 2) and 5 (pixel 4) are
    // beyond the map, sample 1 is skipped (-1).
    let (sm, px) = ([0i64, -1, 1, 2, 0, 1], [1i64, 0, 3, 0, 2, 4]);
    let (hs, hp, hh) = (
        up("submap", ib(&sm)),
        up("subpix", ib(&px)),
        up("hits", ib(&[0; 8])),
    );
    let args = abi::CovAccumDiagHitsArgs {
        nsub: 2,
        nsubpix: 4,
        nnz: 1,
        submap: arr(hs, 6),
        subpix: arr(hp, 6),
        hits: arr(hh, 8),
    };
    // SAFETY: every handle holds the declared number of elements.
    let e = unsafe { b.launch(&args) }.unwrap_err().to_string();
    assert!(
        e.contains("sample 3: submap 2, pixel 0 is beyond the local map (2 submaps x 4 pixels)"),
        "{e}"
    );
    let mut hits = vec![0u8; 64];
    b.copy_to_host(hh, 0, &mut hits).unwrap();
    let hits: Vec<i64> = hits
        .chunks(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(hits, [0, 1, 1, 0, 0, 0, 0, 1]);
    // filter_polynomial: order 1024 is refused by the validator (1024
    // templates at most), before anything runs; order 40 on a scan of 50
    // good samples fits 41 templates from the device workspace, the first
    // scan, of 20 good samples, 20.
    let n = 80usize;
    let sig: Vec<f64> = (0..n).map(|i| 1.0 + i as f64).collect();
    let (hf, hsig) = (up("flags", vec![0u8; n]), up("signals", fb(&sig)));
    let (idx, starts, stops) = ([0i32], [0i64, 30], [20i64, 80]);
    let args = |order| abi::FilterPolynomialArgs {
        n_signal: 1,
        n_samp: n as u64,
        n_scan: 2,
        order,
        signal_index: idx.as_ptr(),
        starts: starts.as_ptr(),
        stops: stops.as_ptr(),
        flags: arr(hf, n),
        signals: arr(hsig, n),
    };
    let read = || {
        let mut got = vec![0u8; 8 * n];
        b.copy_to_host(hsig, 0, &mut got).unwrap();
        got.chunks(8)
            .map(|c| f64::from_ne_bytes(c.try_into().unwrap()))
            .collect::<Vec<f64>>()
    };
    // SAFETY: idx (n_signal = 1), starts and stops (n_scan = 2) are host arrays that live
    // across the call; `hf` and `hsig` are live handles of n elements.
    let e = unsafe { b.launch(&args(1024)) }.unwrap_err().to_string();
    assert!(
        e.contains("`order`") && e.contains("more than the 1024 templates"),
        "{e}"
    );
    assert_eq!(read(), sig, "a refused call changes nothing");
    // SAFETY: idx (n_signal = 1), starts and stops (n_scan = 2) live across the call;
    // `hf` and `hsig` are live handles of n elements, `hsig` the only output.
    unsafe { b.launch(&args(40)) }.unwrap();
    let got = read();
    // 20 templates interpolate the first scan's 20 samples, 41 fit the
    // second scan's line: ~0 left; samples [20, 30) are in no scan.
    assert!(got[..20].iter().all(|v| v.abs() < 1e-9), "{:?}", &got[..20]);
    assert_eq!(got[20..30], sig[20..30], "outside the scans: untouched");
    assert!(got[30..].iter().all(|v| v.abs() < 1e-6), "{:?}", &got[30..]);
    for h in [hs, hp, hh, hf, hsig] {
        b.free(h).unwrap();
    }
}

/// `sim_noise` on the device against the CPU plugin at the benchmark's
/// size (an hour at 100 Hz, N = 2^20, three detectors of two models): the
/// deviates are the same bits (Threefry, erfinv; PoCL's `log` may differ by
/// an ulp), the FFTs differ in rounding only. The measured difference is
/// printed (`--nocapture`).
#[test]
fn sim_noise_on_the_device_matches_the_cpu() {
    let Some(dev) = opencl() else { return };
    let cpu = backend_or_skip("cpu", "", "").expect("the cpu plugin");
    let n_samp = 360_000usize;
    let mut fft_len = 2usize;
    while fft_len <= 2 * n_samp {
        fft_len *= 2;
    }
    let n_amp = fft_len / 2 + 1;
    // Two 1/f spectra, A_0 = 0 (TOAST's).
    let amplitudes: Vec<f64> = [(0.05, 1.0), (0.2, 1.5)]
        .iter()
        .flat_map(|&(fknee, alpha): &(f64, f64)| {
            (0..n_amp).map(move |k| {
                let f = 100.0 * k as f64 / fft_len as f64;
                if k == 0 {
                    0.0
                } else {
                    (1.0 + (fknee / f).powf(alpha)).sqrt() * 2000.0
                }
            })
        })
        .collect();
    let data_index = [2i32, 0, 1];
    let filter_index = [0i32, 1, 0];
    let keys = [7u64, 1 << 40, 7, (1 << 40) + 1, 3, 99];
    let input: Vec<f64> = (0..3 * n_samp).map(|i| (i % 17) as f64 * 1e-3).collect();
    let args = |det_data: Array| abi::SimNoiseArgs {
        n_det: 3,
        n_samp: n_samp as u64,
        fft_len: fft_len as u64,
        n_filter: 2,
        counter0: 20,
        data_index: data_index.as_ptr(),
        filter_index: filter_index.as_ptr(),
        keys: keys.as_ptr(),
        amplitudes: amplitudes.as_ptr(),
        det_data,
    };
    let mut on_cpu = input.clone();
    let a = args(Array {
        ptr: on_cpu.as_mut_ptr() as u64,
        len: on_cpu.len() as u64,
    });
    // SAFETY: the CPU plugin is host-addressable; every pointer is a live
    // array of the length the struct gives.
    unsafe { cpu.launch(&a) }.unwrap();
    let bytes = (input.len() * 8) as u64;
    let h = dev.alloc(bytes, "det_data").unwrap();
    let raw: Vec<u8> = input.iter().flat_map(|x| x.to_le_bytes()).collect();
    dev.copy_to_device(h, 0, &raw).unwrap();
    let a = args(Array {
        ptr: h,
        len: input.len() as u64,
    });
    // SAFETY: `h` is a live device buffer of the struct's length; the host
    // arrays are live for the call.
    unsafe { dev.launch(&a) }.unwrap();
    let mut back = vec![0u8; raw.len()];
    dev.copy_to_host(h, 0, &mut back).unwrap();
    dev.free(h).unwrap();
    let on_dev: Vec<f64> = back
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let mut worst = 0.0f64;
    for row in 0..3 {
        let r = row * n_samp..(row + 1) * n_samp;
        let noise: Vec<f64> = on_cpu[r.clone()]
            .iter()
            .zip(&input[r.clone()])
            .map(|(o, i)| o - i)
            .collect();
        let rms = (noise.iter().map(|x| x * x).sum::<f64>() / n_samp as f64).sqrt();
        assert!(rms > 0.1, "row {row}: rms {rms}");
        for (c, d) in on_cpu[r.clone()].iter().zip(&on_dev[r]) {
            worst = worst.max((c - d).abs() / rms);
        }
    }
    println!("sim_noise, device vs cpu, N = {fft_len}: max |diff| / rms = {worst:e}");
    assert!(
        worst < 1e-12,
        "device noise differs from the cpu's by {worst} rms"
    );
}
