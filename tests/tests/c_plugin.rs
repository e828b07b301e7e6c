//! A backend plugin written in plain C from `toast_backend.h` alone
//! (`tests/c_plugin/toast_test_plugin.c`), compiled here with the system C
//! compiler and driven through the host: discovery, the registry, kernel
//! launches with staged and unstaged arrays, dispatch fallback, and the
//! refusal of broken plugins.
//!
//! A C compiler is required: without one (`$CC`, else `cc`) these tests fail
//! with a message saying so; they never pass silently.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use toast_accel::abi::{self, DeviceMemoryKind, Kernel};
use toast_accel::host::discovery::plugin_file_name;
use toast_accel::host::{
    AccelError, ArrayArg, Backend, DiscoveryOptions, DispatchLevel, DispatchPolicy, Dispatcher,
    LoadError, Plugin, Registry, Source, StatusKind,
};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/c_plugin/toast_test_plugin.c");
const INCLUDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../toast-accel/include");

/// The C compiler: `$CC` (which may carry arguments), else `cc`.
fn compiler() -> (OsString, Vec<OsString>) {
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cc".to_string());
    let mut words = cc.split_whitespace().map(OsString::from);
    let program = words.next().expect("non-empty compiler command");
    (program, words.collect())
}

/// Compile `tests/c_plugin/toast_test_plugin.c` with `defines` into
/// `<target tmp>/c_plugin/<variant>/<file_name>`, once per test process.
fn build(variant: &str, file_name: &str, defines: &[&str]) -> PathBuf {
    static BUILT: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(p) = built.get(variant) {
        return p.clone();
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_plugin")
        .join(variant);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(file_name);
    let (cc, cc_args) = compiler();
    let mut cmd = Command::new(&cc);
    cmd.args(&cc_args)
        .args(["-shared", "-fPIC", "-std=c99", "-Wall", "-Werror", "-O1"])
        .arg("-I")
        .arg(INCLUDE)
        .args(defines)
        .arg("-o")
        .arg(&out)
        .arg(SOURCE);
    let output = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run the C compiler {cc:?} ({e}); these tests need one: install gcc or clang, \
             or set CC"
        )
    });
    assert!(
        output.status.success(),
        "compiling the C test plugin ({variant}) failed: {cmd:?}\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(variant.to_string(), out.clone());
    out
}

/// The full plugin: backend `ctest`, host-addressable, noise_weight and
/// stokes_weights_I.
fn good() -> PathBuf {
    build("good", &plugin_file_name("ctest"), &[])
}
/// Backend `ctest_partial`: stokes_weights_I only.
fn partial() -> PathBuf {
    build(
        "partial",
        &plugin_file_name("ctest_partial"),
        &[
            "-DTOAST_TEST_NAME=\"ctest_partial\"",
            "-DTOAST_TEST_NO_NOISE_WEIGHT",
        ],
    )
}
/// Backend `cdown`, whose init reports no device.
fn down() -> PathBuf {
    build(
        "down",
        &plugin_file_name("cdown"),
        &["-DTOAST_TEST_NAME=\"cdown\"", "-DTOAST_TEST_UNAVAILABLE"],
    )
}
/// Backend `cdev`, not host-addressable: kernels take buffer handles.
fn device() -> PathBuf {
    build(
        "device",
        &plugin_file_name("cdev"),
        &["-DTOAST_TEST_NAME=\"cdev\"", "-DTOAST_TEST_DEVICE_MEMORY"],
    )
}
/// Backend `cold`, built against ABI minor 3: its table ends before the
/// fused kernels of minor 4.
fn minor_3() -> PathBuf {
    build(
        "minor_3",
        &plugin_file_name("cold"),
        &["-DTOAST_TEST_NAME=\"cold\"", "-DTOAST_TEST_ABI_MINOR_3"],
    )
}
fn bad_magic() -> PathBuf {
    build(
        "bad_magic",
        &plugin_file_name("cbadmagic"),
        &["-DTOAST_TEST_NAME=\"cbadmagic\"", "-DTOAST_TEST_BAD_MAGIC"],
    )
}
fn bad_major() -> PathBuf {
    build(
        "bad_major",
        &plugin_file_name("cbadmajor"),
        &["-DTOAST_TEST_NAME=\"cbadmajor\"", "-DTOAST_TEST_BAD_MAJOR"],
    )
}
fn no_entry() -> PathBuf {
    build(
        "no_entry",
        &plugin_file_name("cnoentry"),
        &["-DTOAST_TEST_NAME=\"cnoentry\"", "-DTOAST_TEST_NO_ENTRY"],
    )
}

fn dir_of(p: &Path) -> PathBuf {
    p.parent().unwrap().to_path_buf()
}

/// The noise_weight case: 3 rows of 8 samples, detectors on rows 2 and 0.
struct NoiseWeightCase {
    n_samp: usize,
    data_index: Vec<i32>,
    weights: Vec<f64>,
    intervals: Vec<abi::SampleRange>,
    det_data: Vec<f64>,
}

impl NoiseWeightCase {
    fn new() -> Self {
        let n_samp = 8;
        NoiseWeightCase {
            n_samp,
            data_index: vec![2, 0],
            weights: vec![2.0, -0.5],
            intervals: vec![
                abi::SampleRange { first: 1, last: 3 },
                abi::SampleRange { first: 5, last: 8 },
            ],
            det_data: (0..3 * n_samp)
                .map(|k| (k / n_samp) as f64 * 100.0 + (k % n_samp) as f64 + 0.25)
                .collect(),
        }
    }

    fn expected(&self) -> Vec<f64> {
        let mut want = self.det_data.clone();
        for (d, &row) in self.data_index.iter().enumerate() {
            for iv in &self.intervals {
                for s in iv.first as usize..iv.last as usize {
                    want[row as usize * self.n_samp + s] *= self.weights[d];
                }
            }
        }
        want
    }

    /// Run noise_weight on `backend`, staging through [`ArrayArg`].
    fn run(&mut self, backend: &Backend) -> Result<(), AccelError> {
        let det = ArrayArg::output(backend, &mut self.det_data, "det_data")?;
        let args = abi::NoiseWeightArgs {
            n_det: self.data_index.len() as u64,
            n_samp: self.n_samp as u64,
            data_index: self.data_index.as_ptr(),
            detector_weights: self.weights.as_ptr(),
            intervals: abi::SampleRanges {
                ptr: self.intervals.as_ptr(),
                len: self.intervals.len() as u64,
            },
            det_data: det.abi(),
        };
        // SAFETY: the host arrays live in `self` for the call and are as long
        // as the arguments say; `det` is this backend's view of `det_data`.
        unsafe { backend.launch(&args) }?;
        det.finish()
    }
}

#[test]
fn c_plugin_is_discovered_and_describes_itself() {
    let path = good();
    let reg = Registry::discover(&DiscoveryOptions::only([dir_of(&path)]));
    assert!(reg.failures().is_empty(), "{:?}", reg.failures());
    assert_eq!(reg.names(), vec!["ctest"]);
    let entry = reg.entry("ctest").unwrap();
    assert_eq!(entry.source(), Source::Explicit);
    assert_eq!(entry.path(), path);
    let p = entry.plugin();
    assert_eq!(p.version, "1.2.3");
    assert!(
        p.description.contains("plain C test plugin"),
        "{}",
        p.description
    );
    assert_eq!((p.abi_major, p.abi_minor), (abi::ABI_MAJOR, abi::ABI_MINOR));
    assert!(p.host_addressable());
    assert_eq!(
        p.kernels(),
        vec![Kernel::StokesWeightsI, Kernel::NoiseWeight]
    );

    let b = reg.get("ctest").unwrap();
    assert_eq!(b.name(), "ctest");
    assert_eq!(b.device_count().unwrap(), 1);
    let dev = b.device_info(0).unwrap();
    assert_eq!(dev.name, "ctest test device (host memory)");
    assert_eq!(dev.total_memory, 1 << 30);
    assert_eq!(dev.compute_units, 1);
    assert_eq!(dev.memory_kind, DeviceMemoryKind::Host);
    // From a host of minor 8 (whose struct ends before the memory kind of
    // minor 9), the plugin writes nothing past that host's struct.
    let init = p.table.init.unwrap();
    let info = p.table.device_info.unwrap();
    let old_host = abi::HostApi {
        size: std::mem::size_of::<abi::HostApi>() as u32,
        abi_minor: 8,
        log: None,
        log_user: std::ptr::null_mut(),
        options: std::ptr::null(),
    };
    let mut ctx = std::ptr::null_mut();
    let mut canary = abi::DeviceInfo {
        memory_kind: 0xAAAA_AAAA,
        reserved: 0xAAAA_AAAA,
        uuid: [0xAA; 16],
        ..abi::DeviceInfo::ZERO
    };
    // SAFETY: a complete host API and valid out pointers; the context is
    // the plugin's own (freed by `shutdown`, called once).
    unsafe {
        assert_eq!(init(&old_host, &mut ctx), abi::OK);
        assert_eq!(info(ctx, 0, &mut canary), abi::OK);
        p.table.shutdown.unwrap()(ctx);
    }
    assert_eq!(
        (
            canary.compute_units,
            canary.memory_kind,
            canary.reserved,
            canary.uuid
        ),
        (1, 0xAAAA_AAAA, 0xAAAA_AAAA, [0xAA; 16])
    );
    // The plugin's own error, with its message, for a bad device index.
    match b.device_info(3) {
        Err(AccelError::Memory { kind, message, .. }) => {
            assert_eq!(kind, StatusKind::InvalidArgument);
            assert!(message.contains("index 3"), "{message}");
        }
        other => panic!("expected an error for device 3, got {other:?}"),
    }
    // The same file loaded directly gives the same plugin.
    let direct = Plugin::load(&path).unwrap();
    assert_eq!(direct.name, "ctest");
}

#[test]
fn noise_weight_runs_through_launch() {
    let reg = Registry::discover(&DiscoveryOptions::only([good()]));
    let b = reg.get("ctest").unwrap();
    let mut case = NoiseWeightCase::new();
    let want = case.expected();
    assert_ne!(want, case.det_data, "the case must change something");
    case.run(&b).unwrap();
    assert_eq!(case.det_data, want);
    // Host-addressable: nothing was copied.
    let stats = b.stats().snapshot();
    assert_eq!((stats.h2d_calls, stats.d2h_calls, stats.allocs), (0, 0, 0));
}

#[test]
fn stokes_weights_i_runs_through_launch() {
    let reg = Registry::discover(&DiscoveryOptions::only([good()]));
    let b = reg.get("ctest").unwrap();
    let n_samp = 5usize;
    let weight_index = [1i32, 0];
    let cal = [0.5f64, 3.0];
    let intervals = [
        abi::SampleRange { first: 0, last: 2 },
        abi::SampleRange { first: 3, last: 5 },
    ];
    let mut weights = vec![-1.0f64; 2 * n_samp];
    let w = ArrayArg::output(&b, &mut weights, "weights").unwrap();
    let args = abi::StokesWeightsIArgs {
        n_det: 2,
        n_samp: n_samp as u64,
        weight_index: weight_index.as_ptr(),
        cal: cal.as_ptr(),
        intervals: abi::SampleRanges {
            ptr: intervals.as_ptr(),
            len: 2,
        },
        weights: w.abi(),
    };
    // SAFETY: every array lives to the end of the call with the lengths given.
    unsafe { b.launch(&args) }.unwrap();
    w.finish().unwrap();
    assert_eq!(
        weights,
        vec![3.0, 3.0, -1.0, 3.0, 3.0, 0.5, 0.5, -1.0, 0.5, 0.5]
    );
}

#[test]
fn kernel_errors_carry_the_plugin_message() {
    let reg = Registry::discover(&DiscoveryOptions::only([good()]));
    let b = reg.get("ctest").unwrap();

    let mut case = NoiseWeightCase::new();
    case.data_index = vec![3, 0];
    match case.run(&b) {
        Err(AccelError::Kernel {
            backend,
            kernel,
            kind,
            message,
        }) => {
            assert_eq!(backend, "ctest");
            assert_eq!(kernel, Kernel::NoiseWeight);
            assert_eq!(kind, StatusKind::InvalidArgument);
            assert!(message.contains("data_index[0] = 3"), "{message}");
        }
        other => panic!("expected a kernel error, got {other:?}"),
    }

    let mut case = NoiseWeightCase::new();
    case.intervals.push(abi::SampleRange { first: 4, last: 9 });
    let e = case.run(&b).unwrap_err().to_string();
    assert!(e.contains("backend `ctest`, kernel `noise_weight`"), "{e}");
    assert!(e.contains("interval 2 is [4, 9)"), "{e}");
}

#[test]
fn missing_kernels_report_unsupported() {
    let reg = Registry::discover(&DiscoveryOptions::only([good(), partial()]));
    let b = reg.get("ctest").unwrap();
    for k in Kernel::ALL {
        let want = matches!(k, Kernel::NoiseWeight | Kernel::StokesWeightsI);
        assert_eq!(b.supports(k), want, "{k}");
    }
    let args = abi::TemplateOffsetPrecondArgs {
        n_amp: 0,
        offset_var: abi::Array::ABSENT,
        amplitudes_in: abi::Array::ABSENT,
        amplitude_flags: abi::Array::ABSENT,
        amplitudes_out: abi::Array::ABSENT,
    };
    // SAFETY: the entry is NULL, so nothing reads the (empty) arguments.
    let e = unsafe { b.launch(&args) }.unwrap_err();
    assert_eq!(
        e,
        AccelError::Unsupported {
            backend: "ctest".into(),
            kernel: Kernel::TemplateOffsetApplyDiagPrecond
        }
    );
    assert_eq!(
        e.to_string(),
        "backend `ctest` does not implement kernel `template_offset_apply_diag_precond`"
    );

    let partial = reg.get("ctest_partial").unwrap();
    assert_eq!(partial.plugin().kernels(), vec![Kernel::StokesWeightsI]);
    let mut case = NoiseWeightCase::new();
    let before = case.det_data.clone();
    let e = case.run(&partial).unwrap_err();
    assert!(
        matches!(&e, AccelError::Unsupported { backend, kernel: Kernel::NoiseWeight } if backend == "ctest_partial"),
        "{e:?}"
    );
    assert_eq!(case.det_data, before);
}

#[test]
fn dispatch_falls_back_from_c_plugins() {
    let reg = Arc::new(Registry::discover(&DiscoveryOptions::only([
        partial(),
        down(),
        good(),
    ])));
    assert_eq!(reg.names(), vec!["ctest_partial", "cdown", "ctest"]);

    // The kernel override names a backend without the kernel: fall back to
    // the run setting.
    let policy = DispatchPolicy::parse("kernel.noise_weight=ctest_partial, run=ctest").unwrap();
    let d = Dispatcher::new(Arc::clone(&reg), policy);
    let r = d.resolve(Kernel::NoiseWeight, Some("NoiseWeight")).unwrap();
    assert_eq!(r.backend_name(), "ctest");
    assert_eq!(r.requested, "ctest_partial");
    assert_eq!(r.level, DispatchLevel::Run);
    assert_eq!(r.fallbacks.len(), 1);
    assert_eq!(r.fallbacks[0].0, "ctest_partial");
    assert!(
        r.fallbacks[0]
            .1
            .contains("does not implement kernel `noise_weight`"),
        "{:?}",
        r.fallbacks
    );
    assert_eq!(r.timer_name(), "NoiseWeight.noise_weight[ctest]");
    // And the resolved backend runs it.
    let mut case = NoiseWeightCase::new();
    let want = case.expected();
    case.run(&r.backend).unwrap();
    assert_eq!(case.det_data, want);

    // stokes_weights_I exists in ctest_partial: no fallback.
    let r = d
        .resolve(Kernel::StokesWeightsI, Some("StokesWeights"))
        .unwrap();
    assert_eq!(r.backend_name(), "ctest");
    let d2 = Dispatcher::new(
        Arc::clone(&reg),
        DispatchPolicy::parse("operator.StokesWeights=ctest_partial,run=ctest").unwrap(),
    );
    let r = d2
        .resolve(Kernel::StokesWeightsI, Some("StokesWeights"))
        .unwrap();
    assert_eq!(r.backend_name(), "ctest_partial");
    assert_eq!(r.level, DispatchLevel::Operator);
    assert!(r.fallbacks.is_empty());

    // An unavailable backend is passed over with its reason.
    let r = DispatchPolicy::parse("pipeline=cdown,run=ctest")
        .unwrap()
        .resolve(&reg, Kernel::NoiseWeight, None)
        .unwrap();
    assert_eq!(r.backend_name(), "ctest");
    assert_eq!(r.fallbacks[0].0, "cdown");
    assert!(
        r.fallbacks[0].1.contains("no test device"),
        "{:?}",
        r.fallbacks
    );

    // Nothing here implements scan_map, and there is no cpu backend.
    let e = d.resolve(Kernel::ScanMap, Some("Scan")).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, AccelError::NoBackend { .. }), "{e:?}");
    assert!(
        msg.contains("`ctest` does not implement kernel `scan_map`"),
        "{msg}"
    );
    assert!(msg.contains("`cpu` no such backend was found"), "{msg}");
}

/// A plugin built against ABI minor 3 (before the map-maker's fused
/// kernels) still loads and runs its kernels; dispatch passes it over for
/// the fused kernels, naming why, to the next backend of the chain (the CPU
/// plugin in a run: there the map-maker compares where the fused kernels
/// and `build_noise_weighted` resolve, `MapMaker::fused_kernels_resolve`,
/// and runs the unfused passes when they differ; `toast-cli run --backend
/// cold` gives the CPU's maps).
#[test]
fn a_minor_3_plugin_has_no_fused_kernels_and_dispatch_falls_back() {
    let reg = Arc::new(Registry::discover(&DiscoveryOptions::only([
        minor_3(),
        good(),
    ])));
    assert!(reg.failures().is_empty(), "{:?}", reg.failures());
    let p = reg.entry("cold").unwrap().plugin();
    assert_eq!((p.abi_major, p.abi_minor), (abi::ABI_MAJOR, 3));
    assert_eq!(
        p.kernels(),
        vec![Kernel::StokesWeightsI, Kernel::NoiseWeight]
    );
    let fused = [
        Kernel::CompactExpandPointing,
        Kernel::FusedAccumulate,
        Kernel::FusedProject,
    ];
    assert!(fused.iter().all(|k| reg
        .entry("ctest")
        .unwrap()
        .plugin()
        .kernels()
        .iter()
        .all(|x| x != k)));
    // Its own kernels run on it.
    let d = Dispatcher::new(Arc::clone(&reg), DispatchPolicy::parse("run=cold").unwrap());
    let r = d.resolve(Kernel::NoiseWeight, Some("MapMaker")).unwrap();
    assert_eq!(r.backend_name(), "cold");
    let mut case = NoiseWeightCase::new();
    let want = case.expected();
    case.run(&r.backend).unwrap();
    assert_eq!(case.det_data, want);
    // Before minor 7 device_info's last field was `reserved`: the host
    // does not read an allocator peak from it (this plugin writes one).
    let h = r.backend.alloc(16, "scratch").unwrap();
    assert_eq!(r.backend.device_info(0).unwrap().peak_held_bytes, None);
    // Nor a memory kind (ABI minor 9): this build writes none, so this
    // shows only that the host's zeroed struct reads as unknown; the
    // host's gate on the minor (it ignores what an older plugin left
    // there) is tested with `fakedev7`, which writes one
    // (toast-ops/tests/mapmaker.rs).
    assert_eq!(
        r.backend.device_info(0).unwrap().memory_kind,
        DeviceMemoryKind::Unknown
    );
    r.backend.free(h).unwrap();
    // The fused kernels fall back along the chain: to ctest here (which
    // lacks them too), then to `cpu`, which this registry does not have.
    let d = Dispatcher::new(
        Arc::clone(&reg),
        DispatchPolicy::parse("run=cold,pipeline=ctest").unwrap(),
    );
    for k in fused {
        let e = d.resolve(k, Some("MapMaker")).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, AccelError::NoBackend { .. }), "{e:?}");
        assert!(
            msg.contains(&format!("`cold` does not implement kernel `{}`", k.name())),
            "{msg}"
        );
        assert!(msg.contains("`cpu` no such backend was found"), "{msg}");
    }
}

#[test]
fn unavailable_backend_is_listed_with_its_reason() {
    let reg = Registry::discover(&DiscoveryOptions::only([down()]));
    assert_eq!(reg.names(), vec!["cdown"]);
    let entry = reg.entry("cdown").unwrap();
    assert!(!entry.is_initialised());
    let reason = entry.backend().unwrap_err();
    assert_eq!(
        reason,
        "cdown: no test device (this build defines TOAST_TEST_UNAVAILABLE)"
    );
    match reg.get("cdown") {
        Err(AccelError::Unavailable { backend, reason }) => {
            assert_eq!(backend, "cdown");
            assert!(reason.contains("no test device"), "{reason}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn device_memory_plugin_is_staged() {
    let reg = Registry::discover(&DiscoveryOptions::only([device()]));
    let b = reg.get("cdev").unwrap();
    assert!(!b.host_addressable());
    let mut case = NoiseWeightCase::new();
    let want = case.expected();
    let bytes = (case.det_data.len() * 8) as u64;
    case.run(&b).unwrap();
    assert_eq!(case.det_data, want);
    let s = b.stats().snapshot();
    assert_eq!((s.allocs, s.frees), (1, 1));
    assert_eq!((s.h2d_calls, s.h2d_bytes), (1, bytes));
    assert_eq!((s.d2h_calls, s.d2h_bytes), (1, bytes));
    // The plugin's allocator peak (ABI minor 7): the one buffer, in MiB
    // rounded up.
    assert_eq!(b.device_info(0).unwrap().peak_held_bytes, Some(1 << 20));

    // Handles are checked: foreign, freed and out-of-range uses are errors.
    let h = b.alloc(16, "scratch").unwrap();
    let mut out = [1u8; 16];
    b.reset(h, 0, 16).unwrap();
    b.copy_to_device(h, 8, &[7u8; 8]).unwrap();
    b.copy_to_host(h, 0, &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 0, 0, 0, 0, 0, 7, 7, 7, 7, 7, 7, 7, 7]);
    match b.copy_to_host(h, 8, &mut out) {
        Err(AccelError::Memory {
            op, kind, message, ..
        }) => {
            assert_eq!(op, "copy_to_host");
            assert_eq!(kind, StatusKind::InvalidArgument);
            assert!(
                message.contains("outside the buffer of 16 bytes"),
                "{message}"
            );
        }
        other => panic!("expected a range error, got {other:?}"),
    }
    b.free(h).unwrap();
    for (what, handle) in [("freed", h), ("foreign", 0xdead_beef_u64)] {
        match b.free(handle) {
            Err(AccelError::Memory { kind, .. }) => {
                assert_eq!(kind, StatusKind::InvalidHandle, "{what}")
            }
            other => panic!("{what} handle: expected InvalidHandle, got {other:?}"),
        }
    }

    // A host address where a handle is due is refused, not dereferenced.
    let mut det = vec![1.0f64; 8];
    let (data_index, weights) = ([0i32], [2.0f64]);
    let intervals = [abi::SampleRange { first: 0, last: 8 }];
    let args = abi::NoiseWeightArgs {
        n_det: 1,
        n_samp: 8,
        data_index: data_index.as_ptr(),
        detector_weights: weights.as_ptr(),
        intervals: abi::SampleRanges {
            ptr: intervals.as_ptr(),
            len: 1,
        },
        det_data: abi::Array {
            ptr: det.as_mut_ptr() as u64,
            len: 8,
        },
    };
    // SAFETY: the plugin must treat `det_data.ptr` as a handle and refuse it;
    // the host arrays are valid for the call either way.
    match unsafe { b.launch(&args) } {
        Err(AccelError::Kernel { kind, message, .. }) => {
            assert_eq!(kind, StatusKind::InvalidHandle);
            assert!(message.contains("det_data"), "{message}");
        }
        other => panic!("expected InvalidHandle, got {other:?}"),
    }
    assert_eq!(det, vec![1.0; 8]);
}

#[test]
fn broken_plugins_are_refused_with_the_reason() {
    let magic = bad_magic();
    match Plugin::load(&magic) {
        Err(e @ LoadError::BadMagic { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("wrong magic 0x0123456789abcdef"), "{msg}");
            assert!(msg.contains(&magic.display().to_string()), "{msg}");
        }
        other => panic!("expected BadMagic, got {other:?}"),
    }
    let major = bad_major();
    match Plugin::load(&major) {
        Err(
            e @ LoadError::AbiMajor {
                plugin: 2, host: 1, ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("plugin ABI major 2 differs from the host's ABI major 1"),
                "{msg}"
            );
        }
        other => panic!("expected AbiMajor, got {other:?}"),
    }
    let entry = no_entry();
    match Plugin::load(&entry) {
        Err(e @ LoadError::MissingSymbol { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("missing entry symbol `toast_backend_entry`"),
                "{msg}"
            );
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }

    // In a registry they are skipped, not fatal; the good one still loads.
    let reg = Registry::discover(&DiscoveryOptions::only([
        dir_of(&magic),
        dir_of(&major),
        dir_of(&entry),
        dir_of(&good()),
    ]));
    assert_eq!(reg.names(), vec!["ctest"]);
    let kinds: Vec<&str> = reg
        .failures()
        .iter()
        .map(|f| match f.error {
            LoadError::BadMagic { .. } => "magic",
            LoadError::AbiMajor { .. } => "major",
            LoadError::MissingSymbol { .. } => "symbol",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, vec!["magic", "major", "symbol"]);
    assert!(reg.failures().iter().all(|f| f.source == Source::Explicit));
    // Asking for one by name says why it is not there.
    let msg = reg.get("cbadmajor").unwrap_err().to_string();
    assert!(msg.contains("no backend named `cbadmajor`"), "{msg}");
    assert!(msg.contains("ABI major 2 differs"), "{msg}");
    assert!(!msg.contains("wrong magic"), "{msg}");
    assert!(
        msg.contains("2 other plugin file(s) failed to load"),
        "{msg}"
    );
}

#[test]
fn later_file_with_the_same_name_is_shadowed() {
    let first = good();
    let shadow_dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_plugin")
        .join("shadow");
    std::fs::create_dir_all(&shadow_dir).unwrap();
    let copy = shadow_dir.join(plugin_file_name("ctest"));
    // A distinct file (a copy, not a link) that claims the same name.
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(&first, &copy).unwrap();

    // Explicit first, then the variable: the variable's copy loses; the
    // original directory reached again through the variable is the same
    // file and is dropped without being reported.
    let opts = DiscoveryOptions::only([dir_of(&first)])
        .with_env_path(std::env::join_paths([shadow_dir.clone(), dir_of(&first)]).unwrap());
    let reg = Registry::discover(&opts);
    assert_eq!(reg.names(), vec!["ctest"]);
    assert_eq!(reg.entry("ctest").unwrap().path(), first);
    assert!(reg.failures().is_empty(), "{:?}", reg.failures());
    assert_eq!(reg.shadowed().len(), 1, "{:?}", reg.shadowed());
    let s = &reg.shadowed()[0];
    assert_eq!(s.name, "ctest");
    assert_eq!(s.path, copy);
    assert_eq!(s.source, Source::Env);
    assert_eq!(s.winner, first);
    assert_eq!(s.winner_source, Source::Explicit);

    // The other order: the copy, named first, wins.
    let reg = Registry::discover(&DiscoveryOptions::only([copy.clone(), first.clone()]));
    assert_eq!(reg.entry("ctest").unwrap().path(), copy);
    assert_eq!(reg.shadowed()[0].path, first);
}

#[test]
fn backend_options_reach_init() {
    // The plugin logs its options through the host's callback; here we check
    // that init still succeeds with options set, and that the registry keeps
    // them per backend.
    let opts = DiscoveryOptions::only([good()]).with_backend_options("ctest", "device=0;x=y");
    let reg = Registry::discover(&opts);
    assert_eq!(reg.entry("ctest").unwrap().options(), "device=0;x=y");
    assert!(reg.get("ctest").is_ok());
}

/// A scratch directory under the test target directory, emptied.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("c_plugin")
        .join("hostile")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The load error of the one failure in `reg` about `path`.
fn failure_for<'a>(reg: &'a Registry, path: &Path) -> &'a LoadError {
    let hits: Vec<_> = reg.failures().iter().filter(|f| f.path == path).collect();
    assert_eq!(hits.len(), 1, "{path:?} in {:?}", reg.failures());
    &hits[0].error
}

#[test]
fn truncated_and_foreign_files_are_refused_before_loading() {
    let cpu = toast_testkit::plugins::plugin_path("cpu");
    let whole = std::fs::read(&cpu).unwrap();
    assert!(whole.len() > 200_000, "{} bytes", whole.len());
    let dir = scratch("truncated");
    // Cut where dlopen used to map segments past the end (SIGBUS), one
    // byte short (only the section table at the end is cut), and inside
    // the ELF header.
    let cuts = [200_000, whole.len() - 1, 40];
    let mut files = Vec::new();
    for (i, &n) in cuts.iter().enumerate() {
        let f = dir.join(plugin_file_name(&format!("cut{i}")));
        std::fs::write(&f, &whole[..n]).unwrap();
        files.push(f);
    }
    let text = dir.join(plugin_file_name("text"));
    std::fs::write(&text, b"#!/bin/sh\necho not a library\n").unwrap();
    let empty = dir.join(plugin_file_name("empty"));
    std::fs::write(&empty, b"").unwrap();

    // The directory through the variable, as `TOAST_BACKEND_PATH` would
    // give it, then a good plugin: discovery finishes, the good one loads.
    let opts = DiscoveryOptions::only([good()])
        .with_env_path(std::env::join_paths([dir.clone()]).unwrap());
    let reg = Registry::discover(&opts);
    assert_eq!(reg.names(), vec!["ctest"]);
    assert_eq!(reg.failures().len(), 5, "{:?}", reg.failures());
    for f in &files {
        match failure_for(&reg, f) {
            e @ LoadError::NotLibrary { reason, .. } => {
                assert!(reason.starts_with("truncated: "), "{e}");
                let msg = e.to_string();
                assert!(msg.contains(&f.display().to_string()), "{msg}");
                assert!(msg.contains("not a loadable shared library"), "{msg}");
            }
            other => panic!("{f:?}: expected NotLibrary, got {other:?}"),
        }
    }
    // The 200 000-byte copy: its segments run past the end of the file.
    let msg = failure_for(&reg, &files[0]).to_string();
    assert!(msg.contains("of the file, which has 200000 bytes"), "{msg}");
    assert!(msg.contains("truncated: segment "), "{msg}");
    for f in [&text, &empty] {
        match failure_for(&reg, f) {
            LoadError::NotLibrary { reason, .. } => {
                assert!(reason.starts_with("not an ELF file"), "{reason}")
            }
            other => panic!("{f:?}: expected NotLibrary, got {other:?}"),
        }
    }
    assert!(reg.failures().iter().all(|f| f.source == Source::Env));
    // Asked for by name, the reason is given.
    let msg = reg.get("cut0").unwrap_err().to_string();
    assert!(msg.contains("truncated"), "{msg}");
    // Loaded directly, the same refusal.
    assert!(matches!(
        Plugin::load(&files[0]),
        Err(LoadError::NotLibrary { .. })
    ));
    // The untouched plugin still passes the check.
    let copy = dir.join("whole").join(plugin_file_name("cpu"));
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::write(&copy, &whole).unwrap();
    assert_eq!(Plugin::load(&copy).unwrap().name, "cpu");
}

/// When the dynamic loader refuses a well-formed file, its own message is
/// the reason: here a plugin needs a library that has since gone.
#[cfg(target_os = "linux")]
#[test]
fn loader_errors_carry_the_loader_message() {
    let dep_dir = scratch("gone-dep");
    let dep_src = dep_dir.join("tt_gone.c");
    std::fs::write(&dep_src, "int tt_gone_value(void) { return 7; }\n").unwrap();
    let dep = dep_dir.join("libtt_gone.so");
    let (cc, cc_args) = compiler();
    let status = Command::new(&cc)
        .args(&cc_args)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&dep)
        .arg(&dep_src)
        .status()
        .expect("run the C compiler");
    assert!(status.success());
    let lib_dir = format!("-L{}", dep_dir.display());
    let plugin = build(
        "needs_gone",
        &plugin_file_name("cneedsgone"),
        &[
            "-DTOAST_TEST_NAME=\"cneedsgone\"",
            "-Wl,--no-as-needed",
            &lib_dir,
            "-ltt_gone",
        ],
    );
    std::fs::remove_file(&dep).unwrap();
    match Plugin::load(&plugin) {
        Err(e @ LoadError::Open { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("cannot open shared library"), "{msg}");
            // dlerror's text: the missing library and the system's reason.
            assert!(msg.contains("libtt_gone.so"), "{msg}");
            assert!(msg.contains("No such file or directory"), "{msg}");
        }
        other => panic!("expected Open, got {other:?}"),
    }
}

#[test]
fn hostile_header_values_are_refused_with_the_reason() {
    let cases: [(&str, &[&str], &str); 5] = [
        (
            "unterminated_name",
            &["-DTOAST_TEST_UNTERMINATED_NAME"],
            "the name string has no terminating NUL within 4096 bytes",
        ),
        (
            "long_name",
            &["-DTOAST_TEST_LONG_NAME"],
            "the backend name has 100 bytes, more than 64",
        ),
        (
            "table_size_odd",
            &["-DTOAST_TEST_TABLE_SIZE=4"],
            "table_size 4 is not a whole number of 8-byte entries",
        ),
        (
            "table_size_huge",
            &["-DTOAST_TEST_TABLE_SIZE=0xFFFFFFF8u"],
            "table_size 4294967288 is not a whole number",
        ),
        (
            "table_size_zero",
            &["-DTOAST_TEST_TABLE_SIZE=0"],
            "the table has no `init` or no `last_error`",
        ),
    ];
    let mut paths = Vec::new();
    for (variant, defines, want) in cases {
        let name = format!("chostile_{variant}");
        let def = format!("-DTOAST_TEST_NAME=\"{name}\"");
        let mut all = vec![def.as_str()];
        all.extend_from_slice(defines);
        let path = build(variant, &plugin_file_name(&name), &all);
        match Plugin::load(&path) {
            Err(e @ LoadError::Malformed { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(want), "{variant}: {msg}");
                assert!(msg.len() < 1024, "{variant}: {} bytes", msg.len());
            }
            other => panic!("{variant}: expected Malformed, got {other:?}"),
        }
        paths.push(path);
    }
    paths.push(good());
    let reg = Registry::discover(&DiscoveryOptions::only(paths));
    assert_eq!(reg.names(), vec!["ctest"]);
    assert_eq!(reg.failures().len(), 5, "{:?}", reg.failures());
}

#[test]
fn hostile_runtime_values_are_bounded() {
    // An absurd device count is an error, not a loop over 4 billion devices.
    let many = build(
        "many_devices",
        &plugin_file_name("cmany"),
        &[
            "-DTOAST_TEST_NAME=\"cmany\"",
            "-DTOAST_TEST_DEVICE_COUNT=0xFFFFFFFFu",
        ],
    );
    // The most the host accepts is fine.
    let most = build(
        "most_devices",
        &plugin_file_name("cmost"),
        &[
            "-DTOAST_TEST_NAME=\"cmost\"",
            "-DTOAST_TEST_DEVICE_COUNT=1024",
            "-DTOAST_TEST_FULL_DEVICE_NAME",
        ],
    );
    let unterminated = build(
        "unterminated_error",
        &plugin_file_name("cnonul"),
        &[
            "-DTOAST_TEST_NAME=\"cnonul\"",
            "-DTOAST_TEST_UNAVAILABLE",
            "-DTOAST_TEST_UNTERMINATED_ERROR",
        ],
    );
    let reg = Registry::discover(&DiscoveryOptions::only([many, most, unterminated]));
    assert_eq!(reg.names(), vec!["cmany", "cmost", "cnonul"]);

    match reg.get("cmany").unwrap().device_count() {
        Err(e @ AccelError::Memory { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("device_count"), "{msg}");
            assert!(
                msg.contains("4294967295 devices, more than the 1024 the host accepts"),
                "{msg}"
            );
        }
        other => panic!("expected an error, got {other:?}"),
    }

    let b = reg.get("cmost").unwrap();
    assert_eq!(b.device_count().unwrap(), 1024);
    // A device name filling its array without a NUL is read to the array's
    // end and no further.
    assert_eq!(b.device_info(0).unwrap().name, "d".repeat(128));

    // A last_error with no NUL is cut at 4 KiB, saying so.
    match reg.get("cnonul") {
        Err(AccelError::Unavailable { reason, .. }) => {
            assert!(reason.starts_with(&"e".repeat(4096)), "{reason}");
            assert!(
                reason.ends_with("[cut: the plugin's message has no NUL within 4096 bytes]"),
                "{}",
                &reason[4096..]
            );
            assert!(!reason.contains(&"e".repeat(4097)));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}
