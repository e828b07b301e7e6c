//! `toast-cli bench kernels`: time every kernel of a backend on the workload
//! of TOAST's own CPU timings (`tests/data/toast-kernels/timings.md`) and
//! compare with TOAST 3.0.6's compiled kernels.
//!
//! The workload: `n_det` detectors on a ~2° grid, `n_samp` samples of a
//! satellite-like scan at 200 Hz (1 rpm spin, 85° opening angle, 55°
//! precession angle with a 20 min period), 10 intervals covering 95 % of
//! the samples, ~1 % shared flags and ~1 % detector flags (bursts), HEALPix
//! NEST with 3072 submaps (nside_submap 16), offset templates with step 200.
//! Every input is generated with a seeded xoshiro256** generator, and the
//! kernels themselves run in pipeline order (pointing_detector →
//! pixels_healpix → stokes_weights → scan_map → build_noise_weighted → ...)
//! so that pixel locality, hit submaps and amplitudes are those of a real scan.
//!
//! Metric: the best of `repeats` wall-clock times of one call (plus a
//! `synchronize`), divided by `n_det` × samples inside the intervals, or by
//! the number of amplitudes for `template_offset_apply_diag_precond`. Arrays
//! go through [`ArrayArg`], created (uploaded) before the timed region and
//! finished (downloaded) after it; for a non-host-addressable backend that
//! staging time is reported separately, with the transfer counters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use toast_accel::abi::{self, Interval, Intervals};
use toast_accel::host::{
    AccelError, ArrayArg, Backend, DiscoveryOptions, Element, TransferSnapshot,
};

// ---------------------------------------------------------------------------
// TOAST's reference figures

/// One row of TOAST's CPU timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToastReference {
    /// Key of the kernel in the report and the JSON output.
    pub key: &'static str,
    /// The row's label in timings.md.
    pub label: &'static str,
    /// ns per sample per detector (per amplitude for apply_diag_precond),
    /// OMP_NUM_THREADS=2.
    pub ns_2thr: f64,
    /// The same with OMP_NUM_THREADS=1.
    pub ns_1thr: f64,
}

/// TOAST 3.0.6's compiled kernels (PyPI cp311 wheel, `use_accel=False`) on a
/// 2-core AMD EPYC VM, best of 5, from `tests/data/toast-kernels/timings.md`
/// (columns "ns/sample/det (2 thr)" and "ns/sample/det (1 thr)"). The
/// template_offset add/project rows are sums of 50 single-detector calls.
pub const TOAST_REFERENCE: [ToastReference; 14] = [
    ToastReference {
        key: "pointing_detector",
        label: "pointing_detector",
        ns_2thr: 2.677,
        ns_1thr: 3.497,
    },
    ToastReference {
        key: "pixels_healpix_nest",
        label: "pixels_healpix (NEST, nside 2048)",
        ns_2thr: 31.174,
        ns_1thr: 46.176,
    },
    ToastReference {
        key: "pixels_healpix_ring",
        label: "pixels_healpix (RING, nside 2048)",
        ns_2thr: 29.326,
        ns_1thr: 48.863,
    },
    ToastReference {
        key: "stokes_weights_iqu",
        label: "stokes_weights_IQU (no HWP)",
        ns_2thr: 58.215,
        ns_1thr: 96.719,
    },
    ToastReference {
        key: "stokes_weights_iqu_hwp",
        label: "stokes_weights_IQU (HWP)",
        ns_2thr: 58.690,
        ns_1thr: 108.097,
    },
    ToastReference {
        key: "stokes_weights_i",
        label: "stokes_weights_I",
        ns_2thr: 0.367,
        ns_1thr: 0.550,
    },
    ToastReference {
        key: "scan_map_f64",
        label: "scan_map (float64, nnz=3, add)",
        ns_2thr: 22.783,
        ns_1thr: 34.601,
    },
    ToastReference {
        key: "scan_map_f32",
        label: "scan_map (float32, nnz=3, add)",
        ns_2thr: 19.506,
        ns_1thr: 33.051,
    },
    ToastReference {
        key: "build_noise_weighted",
        label: "build_noise_weighted (nnz=3, det+shared flags)",
        ns_2thr: 28.467,
        ns_1thr: 43.545,
    },
    ToastReference {
        key: "noise_weight",
        label: "noise_weight",
        ns_2thr: 0.377,
        ns_1thr: 0.610,
    },
    ToastReference {
        key: "template_offset_add_to_signal",
        label: "template_offset_add_to_signal (step 200)",
        ns_2thr: 2.026,
        ns_1thr: 2.107,
    },
    ToastReference {
        key: "template_offset_project_signal",
        label: "template_offset_project_signal (step 200)",
        ns_2thr: 2.747,
        ns_1thr: 5.048,
    },
    ToastReference {
        key: "template_offset_apply_diag_precond",
        label: "template_offset_apply_diag_precond (n_amp=47500, per amp)",
        ns_2thr: 0.693,
        ns_1thr: 1.180,
    },
    ToastReference {
        key: "template_offset_apply_diag_precond_large",
        label: "template_offset_apply_diag_precond (n_amp=10000000, per amp)",
        ns_2thr: 0.749,
        ns_1thr: 1.185,
    },
];

/// The keys of the JSON output (ns per sample per detector; per amplitude
/// for `template_offset_apply_diag_precond`, measured at the workload's
/// n_amp). The large apply_diag_precond figure is under `metadata`.
pub const JSON_KEYS: [&str; 13] = [
    "pointing_detector",
    "pixels_healpix_nest",
    "pixels_healpix_ring",
    "stokes_weights_iqu",
    "stokes_weights_iqu_hwp",
    "stokes_weights_i",
    "scan_map_f64",
    "scan_map_f32",
    "build_noise_weighted",
    "noise_weight",
    "template_offset_add_to_signal",
    "template_offset_project_signal",
    "template_offset_apply_diag_precond",
];

/// Bytes of main memory a streaming kernel moves per sample per detector
/// (per amplitude for apply_diag_precond): the arrays it must read and
/// write once, at their element sizes. Achieved bandwidth = bytes / time.
/// Gather/scatter kernels (pixels, weights, maps) are not listed: their
/// traffic depends on the scan's locality.
pub const STREAMING_BYTES: [(&str, f64); 5] = [
    // quats written (32 B); boresight (32 B) shared by all detectors, read once per detector.
    ("pointing_detector", 64.0),
    // weights written (8 B).
    ("stokes_weights_i", 8.0),
    // det_data read and written (8 + 8 B).
    ("noise_weight", 16.0),
    // det_data read and written (16 B); the amplitudes stay in cache.
    ("template_offset_add_to_signal", 16.0),
    // offset_var, amplitudes_in, amplitudes_out (8 B each) and the flag (1 B).
    ("template_offset_apply_diag_precond_large", 25.0),
];

/// Achieved bandwidth (GB/s) of each streaming kernel that was timed.
pub fn bandwidths(report: &BenchReport) -> Vec<(&'static str, f64, f64)> {
    STREAMING_BYTES
        .iter()
        .filter_map(|&(key, bytes)| {
            report
                .get(key)
                .filter(|k| k.ns > 0.0 && k.ns.is_finite())
                .map(|k| (key, bytes, bytes / k.ns))
        })
        .collect()
}

/// Key of the large apply_diag_precond row (not one of [`JSON_KEYS`]).
const PRECOND_LARGE: &str = "template_offset_apply_diag_precond_large";

/// TOAST's figures for `key`.
pub fn toast_reference(key: &str) -> Option<&'static ToastReference> {
    TOAST_REFERENCE.iter().find(|r| r.key == key)
}

// ---------------------------------------------------------------------------
// options and report

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BenchOptions {
    /// Number of detectors (TOAST's workload: 50).
    pub n_det: usize,
    /// Samples per detector (200,000); at least 200 (10 intervals of >= 19).
    pub n_samp: usize,
    /// HEALPix nside, a power of two (2048).
    pub nside: i64,
    /// Timed calls per kernel; the best is reported (5).
    pub repeats: usize,
    /// Threads the backend was initialised with (`threads=N`), `None` for the
    /// backend's default. Only recorded and used to pick TOAST's column.
    pub threads: Option<usize>,
    /// n_amp of the second apply_diag_precond measurement (10,000,000).
    pub precond_n_amp: usize,
}

impl Default for BenchOptions {
    /// TOAST's benchmark workload.
    fn default() -> Self {
        BenchOptions {
            n_det: 50,
            n_samp: 200_000,
            nside: 2048,
            repeats: 5,
            threads: None,
            precond_n_amp: 10_000_000,
        }
    }
}

impl BenchOptions {
    /// A workload small enough for a test in a debug build.
    pub fn tiny() -> Self {
        BenchOptions {
            n_det: 2,
            n_samp: 2000,
            nside: 64,
            repeats: 1,
            threads: None,
            precond_n_amp: 1000,
        }
    }

    fn validate(&self) -> Result<(), String> {
        if self.n_det == 0 || self.n_det > i32::MAX as usize {
            return Err(format!("n_det must be in [1, 2^31), got {}", self.n_det));
        }
        if self.n_samp < 200 {
            return Err(format!(
                "n_samp must be at least 200 (10 intervals of 95% of n_samp/10), got {}",
                self.n_samp
            ));
        }
        if self.nside < 1 || self.nside > (1 << 29) || self.nside & (self.nside - 1) != 0 {
            return Err(format!(
                "nside must be a power of two in [1, 2^29], got {}",
                self.nside
            ));
        }
        if self.repeats == 0 {
            return Err("repeats must be at least 1".into());
        }
        if self.precond_n_amp == 0 {
            return Err("precond_n_amp must be at least 1".into());
        }
        Ok(())
    }
}

/// The measurement of one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTiming {
    /// Key (one of [`JSON_KEYS`], or the large apply_diag_precond row).
    pub key: &'static str,
    /// Best wall-clock seconds of the comparable measurement.
    pub best_s: f64,
    /// What the time is divided by: detectors × samples in intervals, or amplitudes.
    pub units: u64,
    /// `best_s / units` in nanoseconds.
    pub ns: f64,
    /// For template_offset add/project: (one n_det-detector call, n_det
    /// single-detector calls) in ns per sample per detector.
    pub variants: Option<(f64, f64)>,
    /// Which measurement `ns` is, where there is a choice.
    pub note: Option<String>,
}

/// Seconds and counters of the staging transfers (outside the timed regions).
#[derive(Debug, Clone, PartialEq)]
pub struct TransferSummary {
    pub seconds: f64,
    pub stats: TransferSnapshot,
}

/// Everything `run_kernels` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    pub backend: String,
    pub backend_version: String,
    pub host_addressable: bool,
    pub device: Option<String>,
    pub threads: Option<usize>,
    pub machine: String,
    /// 1-minute load average before and after the run (Linux), to judge how
    /// shared the machine was.
    pub load_average: Option<(f64, f64)>,
    pub repeats: usize,
    pub n_det: usize,
    pub n_samp: usize,
    pub n_samp_in_intervals: usize,
    pub n_intervals: usize,
    pub nside: i64,
    pub n_submap: usize,
    pub n_pix_submap: i64,
    pub n_local_submap: usize,
    pub step_length: i64,
    pub n_amp: usize,
    pub precond_n_amp: usize,
    /// Seconds spent outside the timed calls and the staging (input generation, checks).
    pub setup_seconds: f64,
    pub kernels: Vec<KernelTiming>,
    /// Staging transfers, for a backend that is not host-addressable.
    pub transfer: Option<TransferSummary>,
}

impl BenchReport {
    /// The measurement of `key`.
    pub fn get(&self, key: &str) -> Option<&KernelTiming> {
        self.kernels.iter().find(|k| k.key == key)
    }

    /// Whether the 1-thread TOAST column is shown (the backend ran 1 thread).
    pub fn one_thread(&self) -> bool {
        self.threads == Some(1)
    }

    /// TOAST/ours for every row, against the 2-thread (or the 1-thread) column.
    pub fn ratios(&self, one_thread: bool) -> Vec<(&'static str, f64)> {
        self.kernels
            .iter()
            .filter_map(|k| {
                let r = toast_reference(k.key)?;
                let t = if one_thread { r.ns_1thr } else { r.ns_2thr };
                Some((k.key, t / k.ns))
            })
            .collect()
    }

    /// Geometric mean of [`BenchReport::ratios`] over every row.
    pub fn geomean_ratio(&self, one_thread: bool) -> f64 {
        let r = self.ratios(one_thread);
        if r.is_empty() {
            return f64::NAN;
        }
        (r.iter().map(|(_, x)| x.ln()).sum::<f64>() / r.len() as f64).exp()
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let one = self.one_thread();
        let mut s = String::new();
        let threads = match self.threads {
            Some(n) => n.to_string(),
            None => "backend default".into(),
        };
        let _ = writeln!(
            s,
            "backend {} {} ({}), threads: {}, best of {}",
            self.backend,
            self.backend_version,
            if self.host_addressable {
                "host-addressable"
            } else {
                "device memory"
            },
            threads,
            self.repeats
        );
        if let (false, Some(d)) = (self.host_addressable, &self.device) {
            let _ = writeln!(s, "device: {d}");
        }
        let _ = write!(s, "machine: {}", self.machine);
        if let Some((a, b)) = self.load_average {
            let _ = write!(s, "; load average {a:.2} before, {b:.2} after");
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "workload: {} det x {} samples, {} intervals ({} samples inside), nside {} \
             ({} submaps x {} pixels, {} local), offset step {} ({} amplitudes)",
            self.n_det,
            self.n_samp,
            self.n_intervals,
            self.n_samp_in_intervals,
            self.nside,
            self.n_submap,
            self.n_pix_submap,
            self.n_local_submap,
            self.step_length,
            self.n_amp
        );
        let _ = writeln!(
            s,
            "unit: ns per sample per detector (apply_diag_precond: ns per amplitude); \
             ratio = TOAST/ours, > 1 means faster than TOAST"
        );
        let _ = writeln!(s);
        let _ = write!(
            s,
            "{:<62} {:>10} {:>10} {:>11} {:>8}",
            "kernel", "best ms", "ours ns", "TOAST 2thr", "ratio"
        );
        if one {
            let _ = write!(s, " {:>11} {:>8}", "TOAST 1thr", "ratio");
        }
        let _ = writeln!(s);
        for k in &self.kernels {
            let r = toast_reference(k.key);
            let label = r.map(|r| r.label).unwrap_or(k.key);
            let _ = write!(s, "{:<62} {:>10.3} {:>10.3}", label, k.best_s * 1e3, k.ns);
            match r {
                Some(r) => {
                    let _ = write!(s, " {:>11.3} {:>8.2}", r.ns_2thr, r.ns_2thr / k.ns);
                    if one {
                        let _ = write!(s, " {:>11.3} {:>8.2}", r.ns_1thr, r.ns_1thr / k.ns);
                    }
                }
                None => {
                    let _ = write!(s, " {:>11} {:>8}", "-", "-");
                }
            }
            let _ = writeln!(s);
            if let Some(note) = &k.note {
                let _ = writeln!(s, "    {note}");
            }
        }
        let _ = writeln!(s);
        let n = self.ratios(false).len();
        let _ = write!(
            s,
            "geometric mean of TOAST/ours over {n} rows: {:.2} (vs TOAST 2 threads)",
            self.geomean_ratio(false)
        );
        if one {
            let _ = write!(s, ", {:.2} (vs TOAST 1 thread)", self.geomean_ratio(true));
        }
        let _ = writeln!(s);
        let bw = bandwidths(self);
        if !bw.is_empty() {
            let _ = writeln!(s, "achieved memory bandwidth of the streaming kernels:");
            for (key, bytes, gbs) in bw {
                let _ = writeln!(s, "    {key:<44} {gbs:>8.2} GB/s ({bytes} B per element)");
            }
        }
        if let Some(t) = &self.transfer {
            let st = &t.stats;
            let _ = writeln!(
                s,
                "staging transfers (not timed): {:.3} s; {} allocs ({:.1} MiB), {} frees, \
                 {} host->device ({:.1} MiB), {} device->host ({:.1} MiB), {} resets",
                t.seconds,
                st.allocs,
                mib(st.alloc_bytes),
                st.frees,
                st.h2d_calls,
                mib(st.h2d_bytes),
                st.d2h_calls,
                mib(st.d2h_bytes),
                st.resets
            );
        }
        s
    }

    /// The JSON object: one number per key of [`JSON_KEYS`], and `metadata`.
    pub fn to_json(&self) -> Value {
        let mut top = Map::new();
        for key in JSON_KEYS {
            let v = self.get(key).map(|k| k.ns).unwrap_or(f64::NAN);
            top.insert(key.into(), json_f64(v));
        }
        let mut ref2 = Map::new();
        let mut ref1 = Map::new();
        for r in &TOAST_REFERENCE {
            ref2.insert(r.key.into(), json!(r.ns_2thr));
            ref1.insert(r.key.into(), json!(r.ns_1thr));
        }
        let ratios = |one: bool| {
            let mut m = Map::new();
            for (k, r) in self.ratios(one) {
                m.insert(k.into(), json_f64(r));
            }
            Value::Object(m)
        };
        let mut variants = Map::new();
        let mut notes = Map::new();
        for k in &self.kernels {
            if let Some((multi, single)) = k.variants {
                variants.insert(
                    k.key.into(),
                    json!({
                        "one_call_all_detectors": json_f64(multi),
                        "single_detector_calls_sum": json_f64(single),
                    }),
                );
            }
            if let Some(n) = &k.note {
                notes.insert(k.key.into(), json!(n));
            }
        }
        let large = self.get(PRECOND_LARGE);
        let mut bandwidth = Map::new();
        for (key, _, gbs) in bandwidths(self) {
            bandwidth.insert(key.into(), json_f64(gbs));
        }
        let mut meta = json!({
            "bandwidth_gb_s": Value::Object(bandwidth),
            "backend": self.backend,
            "backend_version": self.backend_version,
            "host_addressable": self.host_addressable,
            "device": self.device,
            "threads": self.threads,
            "machine": self.machine,
            "load_average_1min": self.load_average.map(|(a, b)| json!({"before": a, "after": b})),
            "repeats": self.repeats,
            "metric": "best wall-clock time of one call (+ synchronize) divided by n_det x samples \
                       inside intervals; template_offset_apply_diag_precond: per amplitude",
            "workload": {
                "n_det": self.n_det,
                "n_samp": self.n_samp,
                "n_intervals": self.n_intervals,
                "n_samp_in_intervals": self.n_samp_in_intervals,
                "nside": self.nside,
                "ordering": "NEST",
                "n_submap": self.n_submap,
                "n_pix_submap": self.n_pix_submap,
                "n_local_submap": self.n_local_submap,
                "step_length": self.step_length,
                "n_amp": self.n_amp,
            },
            "template_offset_apply_diag_precond_large": {
                "n_amp": self.precond_n_amp,
                "ns_per_amplitude": json_f64(large.map(|k| k.ns).unwrap_or(f64::NAN)),
            },
            "template_offset_variants": Value::Object(variants),
            "notes": Value::Object(notes),
            "toast_reference": {
                "source": "tests/data/toast-kernels/timings.md (TOAST 3.0.6, 2-core AMD EPYC VM)",
                "ns_2thr": Value::Object(ref2),
                "ns_1thr": Value::Object(ref1),
            },
            "ratios_toast_over_ours_2thr": ratios(false),
            "geomean_ratio_2thr": json_f64(self.geomean_ratio(false)),
            "setup_seconds": self.setup_seconds,
        });
        if self.one_thread() {
            meta["ratios_toast_over_ours_1thr"] = ratios(true);
            meta["geomean_ratio_1thr"] = json_f64(self.geomean_ratio(true));
        }
        if let Some(t) = &self.transfer {
            let st = &t.stats;
            meta["transfer"] = json!({
                "seconds": t.seconds,
                "allocs": st.allocs,
                "alloc_bytes": st.alloc_bytes,
                "frees": st.frees,
                "h2d_calls": st.h2d_calls,
                "h2d_bytes": st.h2d_bytes,
                "d2h_calls": st.d2h_calls,
                "d2h_bytes": st.d2h_bytes,
                "resets": st.resets,
            });
        }
        top.insert("metadata".into(), meta);
        Value::Object(top)
    }
}

fn json_f64(x: f64) -> Value {
    // JSON has no NaN: a missing measurement is null.
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------------------
// deterministic random numbers

/// xoshiro256** seeded through splitmix64.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut sm = seed;
        let mut next = || {
            sm = sm.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

// ---------------------------------------------------------------------------
// the workload

const SAMPLE_RATE: f64 = 200.0; // Hz
const SPIN_PERIOD: f64 = 60.0; // s (1 rpm)
const OPENING_ANGLE_DEG: f64 = 85.0;
const PRECESSION_ANGLE_DEG: f64 = 55.0;
const PRECESSION_PERIOD: f64 = 1200.0; // s
const HWP_RATE: f64 = 2.0; // Hz
const DET_SPACING_DEG: f64 = 2.0;
const N_INTERVALS: usize = 10;
const STEP_LENGTH: i64 = 200;
const FLAG_FRACTION: f64 = 0.01;
const SEED: u64 = 0x7041_5354_6265_6e63; // fixed: the workload is the same every run

type Quat = [f64; 4];

/// Hamilton product p ⊗ q of [x, y, z, w] quaternions.
fn qmul(p: Quat, q: Quat) -> Quat {
    [
        p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0],
        -p[0] * q[2] + p[1] * q[3] + p[2] * q[0] + p[3] * q[1],
        p[0] * q[1] - p[1] * q[0] + p[2] * q[3] + p[3] * q[2],
        -p[0] * q[0] - p[1] * q[1] - p[2] * q[2] + p[3] * q[3],
    ]
}

/// Rotation by `angle` about coordinate axis `axis` (0 = x, 1 = y, 2 = z).
fn qaxis(axis: usize, angle: f64) -> Quat {
    let (s, c) = (0.5 * angle).sin_cos();
    let mut q = [0.0, 0.0, 0.0, c];
    q[axis] = s;
    q
}

fn normalize(q: Quat) -> Quat {
    let n = (q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]).sqrt();
    [q[0] / n, q[1] / n, q[2] / n, q[3] / n]
}

/// The generated inputs of the pipeline.
struct Workload {
    n_det: usize,
    n_samp: usize,
    nside: i64,
    n_submap: usize,
    n_pix_submap: i64,
    intervals: Vec<Interval>,
    n_in: usize,
    /// 0..n_det: every index array (one row per detector).
    rows: Vec<i32>,
    focalplane: Vec<f64>,
    boresight: Vec<f64>,
    shared_flags: Vec<u8>,
    det_flags: Vec<u8>,
    hwp: Vec<f64>,
    epsilon: Vec<f64>,
    gamma: Vec<f64>,
    cal: Vec<f64>,
    det_scale: Vec<f64>,
    noise_weights: Vec<f64>,
}

impl Workload {
    fn new(o: &BenchOptions, rng: &mut Rng) -> Workload {
        let (n_det, n_samp) = (o.n_det, o.n_samp);
        // 10 intervals, each 95% of a tenth of the samples, centred in it.
        let block = n_samp / N_INTERVALS;
        let gap = block / 20;
        let intervals: Vec<Interval> = (0..N_INTERVALS)
            .map(|k| {
                let first = (k * block + gap / 2) as i64;
                Interval {
                    first,
                    last: first + (block - gap) as i64,
                }
            })
            .collect();
        let n_in = intervals.iter().map(|i| (i.last - i.first) as usize).sum();

        // Boresight: spin axis precessing about the anti-sun direction (x).
        let to_ecliptic = qaxis(1, std::f64::consts::FRAC_PI_2);
        let prec_tilt = qaxis(1, PRECESSION_ANGLE_DEG.to_radians());
        let opening = qaxis(1, OPENING_ANGLE_DEG.to_radians());
        let mut boresight = Vec::with_capacity(n_samp * 4);
        for s in 0..n_samp {
            let t = s as f64 / SAMPLE_RATE;
            let prec = qaxis(2, std::f64::consts::TAU * t / PRECESSION_PERIOD);
            let spin = qaxis(2, std::f64::consts::TAU * t / SPIN_PERIOD);
            let q = qmul(
                qmul(qmul(qmul(to_ecliptic, prec), prec_tilt), spin),
                opening,
            );
            boresight.extend_from_slice(&normalize(q));
        }

        // Detectors on a rectangular grid with ~2 deg spacing, 4 polarisation angles.
        let ncol = ((2.0 * n_det as f64).sqrt().ceil() as usize).max(1);
        let nrow = n_det.div_ceil(ncol);
        let mut focalplane = Vec::with_capacity(n_det * 4);
        let mut gamma = Vec::with_capacity(n_det);
        for d in 0..n_det {
            let x = (d % ncol) as f64 - 0.5 * (ncol - 1) as f64;
            let y = (d / ncol) as f64 - 0.5 * (nrow - 1) as f64;
            let theta = (DET_SPACING_DEG * x.hypot(y)).to_radians();
            let phi = y.atan2(x);
            let psi = (d % 4) as f64 * std::f64::consts::FRAC_PI_4;
            let q = qmul(
                qmul(qmul(qaxis(2, phi), qaxis(1, theta)), qaxis(2, -phi)),
                qaxis(2, psi),
            );
            focalplane.extend_from_slice(&normalize(q));
            gamma.push(psi);
        }

        // ~1% flags in bursts: shared flags 100 samples, detector flags 20.
        let mut shared_flags = vec![0u8; n_samp];
        add_bursts(rng, &mut shared_flags, 100.min(block / 10).max(1), 1);
        let mut det_flags = vec![0u8; n_det * n_samp];
        for row in det_flags.chunks_mut(n_samp) {
            add_bursts(rng, row, 20.min(block / 10).max(1), 1);
        }

        let hwp = (0..n_samp)
            .map(|s| {
                (std::f64::consts::TAU * HWP_RATE * s as f64 / SAMPLE_RATE) % std::f64::consts::TAU
            })
            .collect();
        let epsilon = (0..n_det).map(|_| rng.range(0.0, 0.01)).collect();
        let cal = (0..n_det).map(|_| rng.range(0.95, 1.05)).collect();
        let det_scale = (0..n_det).map(|_| rng.range(0.5, 1.5)).collect();
        // Close to 1 so that repeated in-place calls never overflow or go subnormal.
        let noise_weights = (0..n_det).map(|_| rng.range(0.999, 1.001)).collect();

        let nside_submap = o.nside.min(16);
        let n_submap = (12 * nside_submap * nside_submap) as usize;
        let n_pix_submap = (o.nside / nside_submap) * (o.nside / nside_submap);
        Workload {
            n_det,
            n_samp,
            nside: o.nside,
            n_submap,
            n_pix_submap,
            intervals,
            n_in,
            rows: (0..n_det as i32).collect(),
            focalplane,
            boresight,
            shared_flags,
            det_flags,
            hwp,
            epsilon,
            gamma,
            cal,
            det_scale,
            noise_weights,
        }
    }

    fn iv(&self) -> Intervals {
        Intervals {
            ptr: self.intervals.as_ptr(),
            len: self.intervals.len() as u64,
        }
    }

    /// Detector × in-interval samples: the per-sample normalisation.
    fn units(&self) -> u64 {
        (self.n_det * self.n_in) as u64
    }
}

/// Set `bit` in bursts of `len` samples until about 1% of `flags` is covered.
fn add_bursts(rng: &mut Rng, flags: &mut [u8], len: usize, bit: u8) {
    let n = flags.len();
    let bursts = ((FLAG_FRACTION * n as f64 / len as f64).round() as usize).max(1);
    for _ in 0..bursts {
        let start = rng.below((n - len.min(n) + 1) as u64) as usize;
        for f in &mut flags[start..(start + len).min(n)] {
            *f |= bit;
        }
    }
}

// ---------------------------------------------------------------------------
// staging and timing

struct Timer<'b> {
    backend: &'b Backend,
    repeats: usize,
    /// Staging (upload, download, alloc, free) time, outside the timed calls.
    transfer: Duration,
    /// Total time of all timed calls.
    timed: Duration,
}

fn accel(what: &str) -> impl Fn(AccelError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl<'b> Timer<'b> {
    fn input<'a, T: Element>(&mut self, data: &'a [T], name: &str) -> Result<ArrayArg<'a>, String>
    where
        'b: 'a,
    {
        let t = Instant::now();
        let a = ArrayArg::input(self.backend, data, name).map_err(accel(name))?;
        self.transfer += t.elapsed();
        Ok(a)
    }

    fn output<'a, T: Element>(
        &mut self,
        data: &'a mut [T],
        name: &str,
    ) -> Result<ArrayArg<'a>, String>
    where
        'b: 'a,
    {
        let t = Instant::now();
        let a = ArrayArg::output(self.backend, data, name).map_err(accel(name))?;
        self.transfer += t.elapsed();
        Ok(a)
    }

    fn finish(&mut self, args: Vec<ArrayArg<'_>>) -> Result<(), String> {
        let t = Instant::now();
        for a in args {
            a.finish().map_err(accel("finishing a staged array"))?;
        }
        self.transfer += t.elapsed();
        Ok(())
    }

    /// Best of `repeats` wall-clock seconds of `f` followed by a synchronize.
    fn best(
        &mut self,
        key: &str,
        mut f: impl FnMut() -> Result<(), AccelError>,
    ) -> Result<f64, String> {
        eprintln!("bench: timing {key}");
        let mut best = f64::INFINITY;
        for _ in 0..self.repeats {
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

fn timing(key: &'static str, best_s: f64, units: u64) -> KernelTiming {
    KernelTiming {
        key,
        best_s,
        units,
        ns: best_s * 1e9 / units as f64,
        variants: None,
        note: None,
    }
}

/// The comparable figure of a template_offset kernel timed as one n_det
/// call (`multi`) and as n_det single-detector calls (`single`).
fn offset_timing(
    key: &'static str,
    n_det: usize,
    multi: f64,
    single: f64,
    units: u64,
) -> KernelTiming {
    let ns = |s: f64| s * 1e9 / units as f64;
    let (best, note) = if single >= multi {
        (
            single,
            format!(
                "comparable: {n_det} single-detector calls (TOAST's way); one {n_det}-detector call: {:.3} ns",
                ns(multi)
            ),
        )
    } else {
        (
            multi,
            format!(
                "comparable: one {n_det}-detector call; {n_det} single-detector calls: {:.3} ns (faster)",
                ns(single)
            ),
        )
    };
    KernelTiming {
        variants: Some((ns(multi), ns(single))),
        note: Some(note),
        ..timing(key, best, units)
    }
}

// ---------------------------------------------------------------------------
// the benchmark

/// Time every kernel of `backend` on the workload `opts` describes.
pub fn run_kernels(backend: &Backend, opts: &BenchOptions) -> Result<BenchReport, String> {
    opts.validate()?;
    let missing: Vec<&str> = abi::Kernel::ALL
        .into_iter()
        .filter(|k| !backend.supports(*k))
        .map(|k| k.name())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "backend `{}` does not implement: {}",
            backend.name(),
            missing.join(", ")
        ));
    }
    let setup_start = Instant::now();
    let load_before = load_average();
    let stats_before = backend.stats().snapshot();
    let mut rng = Rng::new(SEED);
    let w = Workload::new(opts, &mut rng);
    let (n_det, n_samp) = (w.n_det, w.n_samp);
    let nd = n_det as u64;
    let ns = n_samp as u64;
    let units = w.units();
    let mut tm = Timer {
        backend,
        repeats: opts.repeats,
        transfer: Duration::ZERO,
        timed: Duration::ZERO,
    };
    let mut out: Vec<KernelTiming> = Vec::new();

    // 1. pointing_detector
    let mut quats = vec![0.0f64; n_det * n_samp * 4];
    {
        let bore = tm.input(&w.boresight, "boresight")?;
        let flags = tm.input(&w.shared_flags, "shared_flags")?;
        let q = tm.output(&mut quats, "quats")?;
        let args = abi::PointingDetectorArgs {
            n_det: nd,
            n_samp: ns,
            quat_index: w.rows.as_ptr(),
            focalplane: w.focalplane.as_ptr(),
            intervals: w.iv(),
            boresight: bore.abi(),
            shared_flags: flags.abi(),
            shared_flag_mask: 1,
            reserved: [0; 7],
            quats: q.abi(),
        };
        // SAFETY: every pointer comes from a live Vec or ArrayArg of the
        // length the arguments declare, and the output is borrowed only here.
        let best = tm.best("pointing_detector", || unsafe { backend.launch(&args) })?;
        out.push(timing("pointing_detector", best, units));
        tm.finish(vec![q, bore, flags])?;
    }

    // 2. pixels_healpix (RING, then NEST, which stays) and stokes_weights_IQU
    let mut pixels = vec![-1i64; n_det * n_samp];
    let mut hits_ring = vec![0u8; w.n_submap];
    let mut hits = vec![0u8; w.n_submap];
    let mut weights = vec![0.0f64; n_det * n_samp * 3];
    {
        let q = tm.input(&quats, "quats")?;
        let flags = tm.input(&w.shared_flags, "shared_flags")?;
        let hwp = tm.input(&w.hwp, "hwp")?;
        let px = tm.output(&mut pixels, "pixels")?;
        let hr = tm.output(&mut hits_ring, "hit_submaps_ring")?;
        let hn = tm.output(&mut hits, "hit_submaps")?;
        let wt = tm.output(&mut weights, "weights")?;
        let mut args = abi::PixelsHealpixArgs {
            n_det: nd,
            n_samp: ns,
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
            reserved: [0; 6],
        };
        // SAFETY: as for pointing_detector; pixels and hit_submaps are outputs of this call only.
        let best = tm.best("pixels_healpix_ring", || unsafe { backend.launch(&args) })?;
        out.push(timing("pixels_healpix_ring", best, units));
        args.nest = 1;
        args.hit_submaps = hn.abi();
        // SAFETY: as above.
        let best = tm.best("pixels_healpix_nest", || unsafe { backend.launch(&args) })?;
        out.push(timing("pixels_healpix_nest", best, units));

        let mut args = abi::StokesWeightsIquArgs {
            n_det: nd,
            n_samp: ns,
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
        // SAFETY: as above; weights is the only output.
        let best = tm.best("stokes_weights_iqu_hwp", || unsafe {
            backend.launch(&args)
        })?;
        out.push(timing("stokes_weights_iqu_hwp", best, units));
        args.hwp = abi::Array::ABSENT;
        // SAFETY: as above (no HWP array).
        let best = tm.best("stokes_weights_iqu", || unsafe { backend.launch(&args) })?;
        out.push(timing("stokes_weights_iqu", best, units));
        tm.finish(vec![px, hr, hn, wt, q, flags, hwp])?;
    }
    drop(quats);
    drop(hits_ring);

    // 3. stokes_weights_I
    {
        let mut weights_i = vec![0.0f64; n_det * n_samp];
        let wi = tm.output(&mut weights_i, "weights_I")?;
        let args = abi::StokesWeightsIArgs {
            n_det: nd,
            n_samp: ns,
            weight_index: w.rows.as_ptr(),
            cal: w.cal.as_ptr(),
            intervals: w.iv(),
            weights: wi.abi(),
        };
        // SAFETY: as above.
        let best = tm.best("stokes_weights_i", || unsafe { backend.launch(&args) })?;
        out.push(timing("stokes_weights_i", best, units));
        tm.finish(vec![wi])?;
    }

    // The local submaps are the hit ones, numbered in global order.
    let mut global2local = vec![-1i64; w.n_submap];
    let mut n_local = 0usize;
    for (g, &h) in hits.iter().enumerate() {
        if h != 0 {
            global2local[g] = n_local as i64;
            n_local += 1;
        }
    }
    if n_local == 0 {
        return Err("pixels_healpix hit no submap: the backend's output is wrong".into());
    }
    let nnz = 3usize;
    let map_len = n_local * w.n_pix_submap as usize * nnz;
    let mut map: Vec<f64> = (0..map_len).map(|_| rng.range(-1.0, 1.0)).collect();
    let mut det_data = vec![0.0f64; n_det * n_samp];

    // 4. scan_map, float64 then float32 maps
    {
        let map32: Vec<f32> = map.iter().map(|&x| x as f32).collect();
        let g2l = tm.input(&global2local, "global2local")?;
        let m64 = tm.input(&map, "mapdata_f64")?;
        let m32 = tm.input(&map32, "mapdata_f32")?;
        let px = tm.input(&pixels, "pixels")?;
        let wt = tm.input(&weights, "weights")?;
        let dd = tm.output(&mut det_data, "det_data")?;
        let mut args = abi::ScanMapArgs {
            n_det: nd,
            n_samp: ns,
            nnz: nnz as u64,
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
        // SAFETY: as above; det_data is the only output.
        let best = tm.best("scan_map_f64", || unsafe { backend.launch(&args) })?;
        out.push(timing("scan_map_f64", best, units));
        args.map_dtype = abi::DTYPE_F32;
        args.mapdata = m32.abi();
        // SAFETY: as above, with the float32 map.
        let best = tm.best("scan_map_f32", || unsafe { backend.launch(&args) })?;
        out.push(timing("scan_map_f32", best, units));
        tm.finish(vec![dd, g2l, m64, m32, px, wt])?;
    }

    // 5. build_noise_weighted into a zeroed map buffer
    map.fill(0.0);
    {
        let g2l = tm.input(&global2local, "global2local")?;
        let px = tm.input(&pixels, "pixels")?;
        let wt = tm.input(&weights, "weights")?;
        let dd = tm.input(&det_data, "det_data")?;
        let df = tm.input(&w.det_flags, "det_flags")?;
        let sf = tm.input(&w.shared_flags, "shared_flags")?;
        let zm = tm.output(&mut map, "zmap")?;
        let args = abi::BuildNoiseWeightedArgs {
            n_det: nd,
            n_samp: ns,
            nnz: nnz as u64,
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
        // SAFETY: as above; zmap is the only output.
        let best = tm.best("build_noise_weighted", || unsafe { backend.launch(&args) })?;
        out.push(timing("build_noise_weighted", best, units));
        tm.finish(vec![zm, g2l, px, wt, dd, df, sf])?;
    }
    drop(map);
    drop(weights);
    drop(pixels);

    // 6. noise_weight
    {
        let dd = tm.output(&mut det_data, "det_data")?;
        let args = abi::NoiseWeightArgs {
            n_det: nd,
            n_samp: ns,
            data_index: w.rows.as_ptr(),
            detector_weights: w.noise_weights.as_ptr(),
            intervals: w.iv(),
            det_data: dd.abi(),
        };
        // SAFETY: as above; det_data is the only output.
        let best = tm.best("noise_weight", || unsafe { backend.launch(&args) })?;
        out.push(timing("noise_weight", best, units));
        tm.finish(vec![dd])?;
    }

    // 7. template_offset: one call for all detectors, and one call per detector
    let n_amp_views: Vec<i64> = w
        .intervals
        .iter()
        .map(|i| (i.last - i.first + STEP_LENGTH - 1) / STEP_LENGTH)
        .collect();
    let per_det: i64 = n_amp_views.iter().sum();
    let amp_offset: Vec<i64> = (0..n_det as i64).map(|d| d * per_det).collect();
    let n_amp = n_det * per_det as usize;
    let mut amplitudes: Vec<f64> = (0..n_amp).map(|_| rng.normal()).collect();
    let amp_flags: Vec<u8> = (0..n_amp)
        .map(|_| u8::from(rng.uniform() < FLAG_FRACTION))
        .collect();
    {
        let am = tm.input(&amplitudes, "amplitudes")?;
        let af = tm.input(&amp_flags, "amplitude_flags")?;
        let dd = tm.output(&mut det_data, "det_data")?;
        let all = abi::TemplateOffsetAddArgs {
            n_det: nd,
            n_samp: ns,
            data_index: w.rows.as_ptr(),
            layout: abi::OffsetLayout {
                step_length: STEP_LENGTH,
                n_amp_views: n_amp_views.as_ptr(),
                amp_offset: amp_offset.as_ptr(),
            },
            intervals: w.iv(),
            amplitudes: am.abi(),
            amplitude_flags: af.abi(),
            det_data: dd.abi(),
        };
        // SAFETY: as above; det_data is the only output.
        let multi = tm.best("template_offset_add_to_signal (one call)", || unsafe {
            backend.launch(&all)
        })?;
        let single = tm.best("template_offset_add_to_signal (per detector)", || {
            for d in 0..n_det {
                let one = abi::TemplateOffsetAddArgs {
                    n_det: 1,
                    data_index: w.rows[d..].as_ptr(),
                    layout: abi::OffsetLayout {
                        amp_offset: amp_offset[d..].as_ptr(),
                        ..all.layout
                    },
                    ..all
                };
                // SAFETY: as above, for detector d only (pointers to element d
                // of the index and offset arrays, one element read from each).
                unsafe { backend.launch(&one) }?;
            }
            Ok(())
        })?;
        let k = offset_timing("template_offset_add_to_signal", n_det, multi, single, units);
        out.push(k);
        tm.finish(vec![dd, am, af])?;
    }
    {
        let dd = tm.input(&det_data, "det_data")?;
        let fl = tm.input(&w.det_flags, "det_flags")?;
        let af = tm.input(&amp_flags, "amplitude_flags")?;
        let am = tm.output(&mut amplitudes, "amplitudes")?;
        let all = abi::TemplateOffsetProjectArgs {
            n_det: nd,
            n_samp: ns,
            data_index: w.rows.as_ptr(),
            flag_index: w.rows.as_ptr(),
            layout: abi::OffsetLayout {
                step_length: STEP_LENGTH,
                n_amp_views: n_amp_views.as_ptr(),
                amp_offset: amp_offset.as_ptr(),
            },
            intervals: w.iv(),
            det_data: dd.abi(),
            flag_data: fl.abi(),
            amplitudes: am.abi(),
            amplitude_flags: af.abi(),
            flag_mask: 1,
            reserved: [0; 7],
        };
        // SAFETY: as above; amplitudes is the only output.
        let multi = tm.best("template_offset_project_signal (one call)", || unsafe {
            backend.launch(&all)
        })?;
        let single = tm.best("template_offset_project_signal (per detector)", || {
            for d in 0..n_det {
                let one = abi::TemplateOffsetProjectArgs {
                    n_det: 1,
                    data_index: w.rows[d..].as_ptr(),
                    flag_index: w.rows[d..].as_ptr(),
                    layout: abi::OffsetLayout {
                        amp_offset: amp_offset[d..].as_ptr(),
                        ..all.layout
                    },
                    ..all
                };
                // SAFETY: as above, for detector d only.
                unsafe { backend.launch(&one) }?;
            }
            Ok(())
        })?;
        let k = offset_timing(
            "template_offset_project_signal",
            n_det,
            multi,
            single,
            units,
        );
        out.push(k);
        tm.finish(vec![am, dd, fl, af])?;
    }
    drop(det_data);

    // 8. apply_diag_precond on the workload's amplitudes, then on a large vector
    {
        let offset_var: Vec<f64> = w
            .det_scale
            .iter()
            .flat_map(|&s| {
                let v = 1.0 / (s * (STEP_LENGTH as f64));
                std::iter::repeat_n(v, per_det as usize)
            })
            .collect();
        let mut amps_out = vec![0.0f64; n_amp];
        let best = precond(
            &mut tm,
            &offset_var,
            &amplitudes,
            &amp_flags,
            &mut amps_out,
            "template_offset_apply_diag_precond",
        )?;
        out.push(timing(
            "template_offset_apply_diag_precond",
            best,
            n_amp as u64,
        ));
    }
    drop(amplitudes);
    {
        let n = opts.precond_n_amp;
        let offset_var: Vec<f64> = (0..n).map(|_| rng.range(1e-3, 1e-2)).collect();
        let amps_in: Vec<f64> = (0..n).map(|_| rng.range(-1.0, 1.0)).collect();
        let flags: Vec<u8> = (0..n)
            .map(|_| u8::from(rng.uniform() < FLAG_FRACTION))
            .collect();
        let mut amps_out = vec![0.0f64; n];
        let best = precond(
            &mut tm,
            &offset_var,
            &amps_in,
            &flags,
            &mut amps_out,
            PRECOND_LARGE,
        )?;
        out.push(timing(PRECOND_LARGE, best, n as u64));
    }

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
        n_det,
        n_samp,
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
        transfer,
    })
}

fn precond(
    tm: &mut Timer<'_>,
    offset_var: &[f64],
    amps_in: &[f64],
    flags: &[u8],
    amps_out: &mut [f64],
    key: &'static str,
) -> Result<f64, String> {
    let backend = tm.backend;
    let n = offset_var.len();
    let ov = tm.input(offset_var, "offset_var")?;
    let ai = tm.input(amps_in, "amplitudes_in")?;
    let af = tm.input(flags, "amplitude_flags")?;
    let ao = tm.output(amps_out, "amplitudes_out")?;
    let args = abi::TemplateOffsetPrecondArgs {
        n_amp: n as u64,
        offset_var: ov.abi(),
        amplitudes_in: ai.abi(),
        amplitude_flags: af.abi(),
        amplitudes_out: ao.abi(),
    };
    // SAFETY: the four arrays are live and have n_amp elements; only
    // amplitudes_out is written.
    let best = tm.best(key, || unsafe { backend.launch(&args) })?;
    tm.finish(vec![ao, ov, ai, af])?;
    Ok(best)
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

/// The 1-minute load average (Linux /proc/loadavg).
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU model, logical CPUs and memory of this machine (Linux /proc; best effort).
pub fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
    });
    match mem {
        Some(kb) => format!(
            "{cpu}, {ncpu} logical CPUs, {:.1} GiB RAM",
            kb / (1024.0 * 1024.0)
        ),
        None => format!("{cpu}, {ncpu} logical CPUs"),
    }
}

// ---------------------------------------------------------------------------
// command line

/// `toast-cli bench kernels` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct KernelsArgs {
    /// Backend to time (a plugin name, as `toast-cli backends` lists them).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Threads for the backend (passed to its init options as threads=N).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Timed calls per kernel (the best is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Write ns per sample per detector (and metadata) to this JSON file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Detectors.
    #[arg(long, default_value_t = 50)]
    pub n_det: usize,
    /// Samples per detector.
    #[arg(long, default_value_t = 200_000)]
    pub n_samp: usize,
    /// HEALPix nside (power of two).
    #[arg(long, default_value_t = 2048)]
    pub nside: i64,
    /// n_amp of the large apply_diag_precond measurement.
    #[arg(long, default_value_t = 10_000_000)]
    pub precond_n_amp: usize,
    /// Smoke test: the tiny workload (2 det x 2000 samples, nside 64, 1
    /// repeat) instead of the sizes above.
    #[arg(long)]
    pub tiny: bool,
}

/// Add `threads=N` to the init options of backend `name`, after any given
/// with `--backend-options` (the last `threads` wins in the plugin's parser).
pub fn with_threads(
    opts: DiscoveryOptions,
    name: &str,
    threads: Option<usize>,
) -> DiscoveryOptions {
    match threads {
        None => opts,
        Some(n) => {
            let given = opts.options_for(name);
            let options = if given.is_empty() {
                format!("threads={n}")
            } else {
                format!("{given};threads={n}")
            };
            opts.with_backend_options(name, &options)
        }
    }
}

/// The thread count an init options string asks for (its last `threads=N`).
pub fn threads_option(options: &str) -> Option<usize> {
    options
        .split(';')
        .filter_map(|item| item.split_once('='))
        .filter(|(k, _)| k.trim() == "threads")
        .filter_map(|(_, v)| v.trim().parse().ok())
        .next_back()
}

/// `toast-cli bench kernels` on an initialised backend; `threads` is the
/// thread count it was initialised with (None: its default).
pub fn cmd_kernels(
    backend: &Backend,
    args: &KernelsArgs,
    threads: Option<usize>,
) -> Result<(), String> {
    let opts = if args.tiny {
        BenchOptions {
            threads,
            ..BenchOptions::tiny()
        }
    } else {
        BenchOptions {
            n_det: args.n_det,
            n_samp: args.n_samp,
            nside: args.nside,
            repeats: args.repeats,
            threads,
            precond_n_amp: args.precond_n_amp,
        }
    };
    let report = run_kernels(backend, &opts)?;
    print!("{}", report.table());
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report.to_json())
            .map_err(|e| format!("serialising the report: {e}"))?;
        std::fs::write(p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toast_accel::host::Registry;

    /// Find backend `name` in the standard places and initialise it, with
    /// `threads=N` in its options when given.
    fn open_backend(name: &str, threads: Option<usize>) -> Result<Arc<Backend>, String> {
        let opts = with_threads(DiscoveryOptions::default(), name, threads);
        Registry::discover(&opts)
            .get(name)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = Rng::new(7);
        for _ in 0..10_000 {
            let u = r.uniform();
            assert!((0.0..1.0).contains(&u));
            assert!(r.below(17) < 17);
            assert!(r.normal().is_finite());
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn reference_table_covers_every_key() {
        for key in JSON_KEYS {
            assert!(toast_reference(key).is_some(), "{key}");
        }
        assert!(toast_reference(PRECOND_LARGE).is_some());
    }

    #[test]
    fn workload_matches_the_timings_description() {
        let o = BenchOptions::default();
        let mut rng = Rng::new(SEED);
        let w = Workload::new(&o, &mut rng);
        assert_eq!(w.intervals.len(), 10);
        assert_eq!(w.n_in, 190_000);
        assert_eq!((w.n_submap, w.n_pix_submap), (3072, 16384));
        let shared = w.shared_flags.iter().filter(|&&f| f != 0).count() as f64;
        assert!((0.005..0.015).contains(&(shared / o.n_samp as f64)));
        let det = w.det_flags.iter().filter(|&&f| f != 0).count() as f64;
        assert!((0.005..0.015).contains(&(det / w.det_flags.len() as f64)));
        for q in w.boresight.chunks(4).chain(w.focalplane.chunks(4)) {
            let n: f64 = q.iter().map(|x| x * x).sum();
            assert!((n - 1.0).abs() < 1e-12);
        }
        assert!(BenchOptions {
            nside: 3,
            ..o.clone()
        }
        .validate()
        .is_err());
        assert!(BenchOptions { n_samp: 100, ..o }.validate().is_err());
    }

    #[test]
    fn thread_options() {
        assert_eq!(threads_option(""), None);
        assert_eq!(threads_option("threads=3"), Some(3));
        assert_eq!(threads_option("a=b; threads = 2 ;threads=4"), Some(4));
        let o = with_threads(DiscoveryOptions::default(), "cpu", None);
        assert_eq!(o.options_for("cpu"), "");
        let o = with_threads(o.with_backend_options("cpu", "x=1"), "cpu", Some(2));
        assert_eq!(o.options_for("cpu"), "x=1;threads=2");
        assert_eq!(threads_option(o.options_for("cpu")), Some(2));
    }

    #[test]
    fn tiny_bench_reports_every_key() {
        // The CPU plugin is built next to the test binary (target/<profile>/deps).
        let backend = open_backend("cpu", Some(1)).expect("CPU backend");
        let opts = BenchOptions {
            threads: Some(1),
            ..BenchOptions::tiny()
        };
        let report = run_kernels(&backend, &opts).expect("bench runs");
        let v = report.to_json();
        for key in JSON_KEYS {
            let x = v[key].as_f64().unwrap_or(f64::NAN);
            assert!(x.is_finite(), "{key}: {:?}", v[key]);
        }
        assert!(
            v["metadata"]["template_offset_apply_diag_precond_large"]["ns_per_amplitude"]
                .as_f64()
                .is_some_and(f64::is_finite)
        );
        assert!(report.n_local_submap > 0);
        assert_eq!(report.n_amp, 2 * 10);
        for (key, _) in STREAMING_BYTES {
            let gbs = v["metadata"]["bandwidth_gb_s"][key].as_f64();
            assert!(
                gbs.is_some_and(|g| g.is_finite() && g > 0.0),
                "{key}: {gbs:?}"
            );
        }
        let table = report.table();
        assert!(table.contains("achieved memory bandwidth"));
        assert!(table.contains("geometric mean"));
        assert!(table.contains("TOAST 1thr"));
    }
}
