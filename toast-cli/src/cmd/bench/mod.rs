//! `toast-cli bench kernels`: time every kernel of a backend on the workload
//! of TOAST's own CPU timings (`tests/data/toast-kernels/timings.md`) and
//! compare with TOAST 3.0.6's compiled kernels.
//!
//! * `workload.rs`: the inputs, synthesised from a seed ([`BenchOptions`]
//!   says how large);
//! * `runner.rs`: running and timing the kernels in pipeline order
//!   ([`run_kernels`]), and the metric;
//! * `reference.rs`: TOAST's reference timings;
//! * `report.rs`: what was measured, as a table or JSON;
//! * `host_info.rs`: the machine's description (CPU, memory, load);
//! * here: the command line.

use std::path::{Path, PathBuf};

use toast_accel::host::{Backend, DiscoveryOptions};

mod host_info;
mod reference;
mod report;
mod runner;
mod workload;

pub use runner::run_kernels;
pub use workload::BenchOptions;

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
    /// n_amp of the large apply_diag_precond measurement; the bandwidth
    /// reference (amp_axpby, the base of each streaming kernel's achieved
    /// fraction) runs over 4x as many elements.
    #[arg(long, default_value_t = 10_000_000)]
    pub precond_n_amp: usize,
    /// Time and report only these rows (comma-separated keys of the JSON
    /// output, as `time_toast_kernels.py --rows` takes them, or
    /// `stream_reference`, the bandwidth reference, timed with any
    /// streaming row); the other kernels run once, untimed, for the inputs
    /// of the later ones.
    #[arg(long, value_delimiter = ',', value_name = "KEY,...")]
    pub rows: Vec<String>,
    /// Smoke test: the tiny workload (2 det x 2000 samples, nside 64, 1
    /// repeat) instead of the sizes above (which it cannot be given with).
    #[arg(
        long,
        conflicts_with_all = ["n_det", "n_samp", "nside", "precond_n_amp", "repeats"]
    )]
    pub tiny: bool,
}

/// The most timed calls per kernel: each is a full pass over the workload.
pub const MAX_REPEATS: usize = 1000;

impl KernelsArgs {
    /// The workload these arguments describe; `threads` is the thread count
    /// the backend was initialised with (None: its default).
    pub fn options(&self, threads: Option<usize>) -> BenchOptions {
        if self.tiny {
            BenchOptions {
                threads,
                rows: self.rows.clone(),
                ..BenchOptions::tiny()
            }
        } else {
            BenchOptions {
                n_det: self.n_det,
                n_samp: self.n_samp,
                nside: self.nside,
                repeats: self.repeats,
                threads,
                precond_n_amp: self.precond_n_amp,
                rows: self.rows.clone(),
            }
        }
    }

    /// Refuse, before any work, values that are out of range or whose
    /// workload would not fit in memory (exit status 2).
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(n) = self.threads {
            crate::limits::check_threads("--threads", n)?;
        }
        if self.repeats > MAX_REPEATS {
            anyhow::bail!("--repeats {}: at most {MAX_REPEATS}", self.repeats);
        }
        if let Some(p) = &self.json {
            check_json_path(p)?;
        }
        let o = self.options(None);
        o.validate()?;
        let what = format!(
            "bench kernels --n-det {} --n-samp {} --nside {} --precond-n-amp {}",
            o.n_det, o.n_samp, o.nside, o.precond_n_amp
        );
        crate::limits::check_memory(&what, o.host_bytes())
    }
}

/// Where `--json FILE` goes. A regular file, or a new one, is written
/// whole or not at all ([`crate::output::replace_file`]: a temporary beside
/// it, renamed into place; a link to one is followed, so the link stays). A
/// FIFO or a character device (`/dev/stdout`, a pipe) is written as it is.
#[derive(Debug)]
enum JsonTarget {
    /// Replaced through a temporary beside it.
    Replace(PathBuf),
    /// Written directly.
    Stream(PathBuf),
}

impl JsonTarget {
    /// The target of `p`, or why it cannot be one (a directory, a path
    /// that cannot be read).
    fn of(p: &Path) -> anyhow::Result<JsonTarget> {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => anyhow::bail!("--json {}: a directory", p.display()),
            Ok(m) if m.is_file() => Ok(JsonTarget::Replace(
                std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf()),
            )),
            Ok(_) => Ok(JsonTarget::Stream(p.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(JsonTarget::Replace(p.to_path_buf()))
            }
            Err(e) => anyhow::bail!("--json {}: {e}", p.display()),
        }
    }

    /// Write `text` to it.
    fn write(&self, text: &str) -> std::io::Result<()> {
        match self {
            JsonTarget::Stream(p) => std::fs::write(p, text),
            JsonTarget::Replace(p) => crate::output::replace_file(p, text.as_bytes()),
        }
    }
}

/// The `--json` report could not be written: an output failure (exit
/// status 2), not a failed benchmark (1).
#[derive(Debug, thiserror::Error)]
#[error("--json {path}: {source}")]
pub struct JsonWriteError {
    path: String,
    #[source]
    source: std::io::Error,
}

/// `--json FILE`, checked before the benchmark runs (its failure was a
/// benchmark's minutes, then exit status 1): not a directory, and where a
/// file is replaced, in a directory where one can be written.
fn check_json_path(p: &Path) -> anyhow::Result<()> {
    if let JsonTarget::Replace(path) = JsonTarget::of(p)? {
        crate::output::check_replaceable(&path)
            .map_err(|e| anyhow::anyhow!("--json {}: {e}", p.display()))?;
    }
    Ok(())
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
) -> anyhow::Result<()> {
    let opts = args.options(threads);
    let report = run_kernels(backend, &opts)?;
    std::io::Write::write_all(&mut crate::console::Stdout, report.table().as_bytes())?;
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report.to_json())
            .map_err(|e| anyhow::anyhow!("serialising the report: {e}"))?;
        JsonTarget::of(p)?
            .write(&(text + "\n"))
            .map_err(|source| JsonWriteError {
                path: p.display().to_string(),
                source,
            })?;
        crate::outln!("wrote {}", p.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::reference::{JSON_KEYS, STREAMING_BYTES};
    use super::*;
    use std::sync::Arc;
    use toast_accel::host::Registry;

    /// Find backend `name` in the standard places and initialise it, with
    /// `threads=N` in its options when given.
    fn open_backend(name: &str, threads: Option<usize>) -> anyhow::Result<Arc<Backend>> {
        let opts = with_threads(DiscoveryOptions::default(), name, threads);
        Registry::discover(&opts)
            .get(name)
            .map_err(anyhow::Error::from)
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
        let reference = v["metadata"]["stream_reference"]["gb_s"].as_f64();
        assert!(
            reference.is_some_and(|g| g.is_finite() && g > 0.0),
            "{reference:?}"
        );
        for (key, _) in STREAMING_BYTES {
            let f = v["metadata"]["bandwidth_fraction_of_reference"][key].as_f64();
            assert!(f.is_some_and(|f| f.is_finite() && f > 0.0), "{key}: {f:?}");
        }
        let table = report.table();
        assert!(table.contains("achieved memory bandwidth"));
        assert!(table.contains("of the reference") && table.contains("stream_reference"));
        assert!(table.contains("geometric mean"));
        assert!(table.contains("TOAST 1thr"));
    }

    #[test]
    fn rows_limit_what_is_timed() {
        let backend = open_backend("cpu", Some(1)).expect("CPU backend");
        let opts = BenchOptions {
            threads: Some(1),
            rows: vec!["noise_weight".into(), "pixels_healpix_ring".into()],
            ..BenchOptions::tiny()
        };
        let report = run_kernels(&backend, &opts).expect("bench runs");
        let mut keys: Vec<&str> = report.kernels.iter().map(|k| k.key).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["noise_weight", "pixels_healpix_ring"]);
        // noise_weight streams: the bandwidth reference is timed with it.
        assert!(report.stream.is_some());
        assert!(report.to_json()["pointing_detector"].is_null());
    }
}
