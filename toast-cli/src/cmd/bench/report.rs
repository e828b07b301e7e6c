//! What the bench measured, and its two outputs: the human-readable table
//! ([`BenchReport::table`]) and the JSON object ([`BenchReport::to_json`]).

use serde_json::{json, Map, Value};
use toast_accel::host::TransferSnapshot;

use super::reference::{
    toast_reference, JSON_KEYS, PRECOND_LARGE, STREAMING_BYTES, STREAM_BYTES, TOAST_REFERENCE,
};

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

impl KernelTiming {
    /// The timing of one measurement: `best_s` seconds over `units`.
    pub fn new(key: &'static str, best_s: f64, units: u64) -> KernelTiming {
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
    /// call (`multi`) and as n_det single-detector calls (`single`): the
    /// slower of the two, with a note saying which it is.
    pub fn offset(
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
            ..KernelTiming::new(key, best, units)
        }
    }
}

/// The bandwidth reference of the run ([`super::reference::STREAM_KEY`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamReference {
    /// Elements of x and y.
    pub n: usize,
    /// Best wall-clock seconds of one call.
    pub best_s: f64,
    /// Achieved GB/s ([`STREAM_BYTES`] per element).
    pub gb_s: f64,
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
    /// The bandwidth reference, when a streaming row was timed.
    pub stream: Option<StreamReference>,
    /// Staging transfers, for a backend that is not host-addressable.
    pub transfer: Option<TransferSummary>,
}

impl BenchReport {
    /// `gb_s` as a fraction of the run's bandwidth reference, if measured.
    pub fn stream_fraction(&self, gb_s: f64) -> Option<f64> {
        self.stream
            .as_ref()
            .filter(|r| r.gb_s > 0.0 && r.gb_s.is_finite())
            .map(|r| gb_s / r.gb_s)
    }

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
        if n == 0 {
            // No row has a TOAST timing (a selection of our own rows only).
            let _ = writeln!(s, "no row with a TOAST timing: no TOAST/ours ratio");
        } else {
            let _ = write!(
                s,
                "geometric mean of TOAST/ours over {n} rows: {:.2} (vs TOAST 2 threads)",
                self.geomean_ratio(false)
            );
            if one {
                let _ = write!(s, ", {:.2} (vs TOAST 1 thread)", self.geomean_ratio(true));
            }
            let _ = writeln!(s);
        }
        let bw = bandwidths(self);
        if !bw.is_empty() {
            let _ = writeln!(s, "achieved memory bandwidth of the streaming kernels:");
            for (key, bytes, gbs) in bw {
                let _ = write!(s, "    {key:<44} {gbs:>8.2} GB/s ({bytes} B per element)");
                match self.stream_fraction(gbs) {
                    Some(f) => {
                        let _ = writeln!(s, ", {:.0}% of the reference", 100.0 * f);
                    }
                    None => {
                        let _ = writeln!(s);
                    }
                }
            }
        }
        if let Some(r) = &self.stream {
            let _ = writeln!(
                s,
                "    {:<44} {:>8.2} GB/s (reference: amp_axpby over {} elements, {} B per element)",
                "stream_reference", r.gb_s, r.n, STREAM_BYTES
            );
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
        let mut fraction = Map::new();
        for (key, _, gbs) in bandwidths(self) {
            bandwidth.insert(key.into(), json_f64(gbs));
            if let Some(f) = self.stream_fraction(gbs) {
                fraction.insert(key.into(), json_f64(f));
            }
        }
        let mut meta = json!({
            "bandwidth_gb_s": Value::Object(bandwidth),
            "bandwidth_fraction_of_reference": Value::Object(fraction),
            "stream_reference": self.stream.as_ref().map(|r| json!({
                "kernel": "amp_axpby",
                "n": r.n,
                "bytes_per_element": STREAM_BYTES,
                "best_s": json_f64(r.best_s),
                "gb_s": json_f64(r.gb_s),
            })),
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
                "source": "tests/data/toast-kernels/timings.md, third table (TOAST 3.0.6, 2-core Intel Xeon VM, loaded; 2thr: the smaller of its 2- and 1-thread figures)",
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

fn json_f64(x: f64) -> Value {
    // JSON has no NaN: a missing measurement is null.
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
