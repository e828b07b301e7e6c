//! `toast-cli verify`: run TOAST's reference cases on a backend and report
//! one line per case, then a summary line:
//!
//! ```text
//! PASS  noise_weight_basic
//! FAIL  scan_map_f64_nnz3_add: det_data max |diff| = 2.2e-16, n = 3
//! SKIP  pixels_healpix_nest_nside64: backend `x` does not implement kernel `pixels_healpix`
//! 27 passed, 1 failed, 1 skipped
//! ```
//!
//! The first line names the comparison mode (`comparison: exact ...` for
//! the CPU backend, `comparison: tolerant ...` for device backends; see
//! `toast_accel::host::conformance` for the tolerance policy); a case that
//! passes only within the tolerance is reported as
//! `PASS  case (within tolerance: ...)`. With `--transfers`, and always for
//! a backend that is not host-addressable, the backend's transfer counters
//! (allocations, bytes and calls in each direction, resets) are printed
//! before the summary line.
//!
//! A case file that cannot be read (not a zip, truncated, an array missing
//! or of the wrong dtype or rank, a `.npy` header claiming more data than
//! its entry holds) is a `FAIL` line naming the file, the array and the
//! problem, and the run goes on with the other cases; so is a case whose
//! run panics (a bug in the runner or an adapter), with the panic's message. The exit status is 0
//! only when nothing failed and at least one case was checked (a backend
//! that implements none of the kernels skips every case: exit 1).

use anyhow::Context;
use std::io::Write;
use std::path::Path;
use toast_accel::host::conformance::{run_dir_each, CaseOutcome, Comparison};
use toast_accel::host::Backend;

/// Counts of a verify run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

impl Summary {
    /// The closing line: `N passed, N failed` and `, N skipped` when some were.
    pub fn line(&self) -> String {
        let mut s = format!("{} passed, {} failed", self.passed, self.failed);
        if self.skipped > 0 {
            s.push_str(&format!(", {} skipped", self.skipped));
        }
        s
    }

    /// 0 when nothing failed and something was checked, 1 otherwise: a run
    /// in which every case was skipped (a backend that implements none of
    /// the kernels) checked nothing, which is not a pass.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.failed > 0 || self.passed == 0)
    }
}

/// Options of a verify run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// Force a comparison mode (default: the backend's, see
    /// `Comparison::for_backend`).
    pub comparison: Option<Comparison>,
    /// Print the transfer counters (always done for device backends).
    pub transfers: bool,
}

/// Run every case of `cases_dir` on `backend`, writing the report to `out`.
/// Returns the summary, or an error when there is nothing to verify.
#[cfg(test)]
pub fn verify(backend: &Backend, cases_dir: &Path, out: &mut dyn Write) -> anyhow::Result<Summary> {
    verify_with(backend, cases_dir, out, Options::default())
}

/// The transfer counters of `backend` as one line.
pub fn transfers_line(backend: &Backend) -> String {
    let t = backend.stats().snapshot();
    format!(
        "transfers ({}): {} allocs ({} bytes), {} frees, host->device {} calls / {} bytes, device->host {} calls / {} bytes, {} resets",
        backend.name(),
        t.allocs,
        t.alloc_bytes,
        t.frees,
        t.h2d_calls,
        t.h2d_bytes,
        t.d2h_calls,
        t.d2h_bytes,
        t.resets
    )
}

/// Run every case of `cases_dir` on `backend` with `opts`, writing the report to `out`.
pub fn verify_with(
    backend: &Backend,
    cases_dir: &Path,
    out: &mut dyn Write,
    opts: Options,
) -> anyhow::Result<Summary> {
    if !cases_dir.is_dir() {
        return Err(anyhow::anyhow!(
            "cases directory {} does not exist or is not a directory",
            cases_dir.display()
        ));
    }
    let cmp = opts
        .comparison
        .unwrap_or_else(|| Comparison::for_backend(backend));
    let mut sum = Summary::default();
    let w = |out: &mut dyn Write, line: String| {
        writeln!(out, "{line}").context("cannot write the report")
    };
    // Each case's line as soon as it has run (standard output is line
    // buffered), so that the report shows every case before one that took
    // the process down; the header before the first.
    let mut cases = 0usize;
    run_dir_each(backend, cases_dir, cmp, |path, result| {
        if cases == 0 {
            w(out, format!("comparison: {}", cmp.describe()))?;
        }
        cases += 1;
        let case = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let line = match result {
            Ok(CaseOutcome::Pass) => {
                sum.passed += 1;
                format!("PASS  {case}")
            }
            Ok(o @ CaseOutcome::PassTolerant { .. }) => {
                sum.passed += 1;
                format!("PASS  {case} ({o})")
            }
            Ok(CaseOutcome::Fail {
                field,
                max_abs_diff,
                n_diff,
                ..
            }) => {
                sum.failed += 1;
                format!("FAIL  {case}: {field} max |diff| = {max_abs_diff:e}, n = {n_diff}")
            }
            Ok(CaseOutcome::Error { message }) => {
                sum.failed += 1;
                format!("FAIL  {case}: {message}")
            }
            Ok(CaseOutcome::Skipped { reason }) => {
                sum.skipped += 1;
                format!("SKIP  {case}: {reason}")
            }
            Err(e) => {
                sum.failed += 1;
                format!("FAIL  {case}: {e}")
            }
        };
        w(out, line)
    })?;
    if cases == 0 {
        return Err(anyhow::anyhow!("no .npz cases in {}", cases_dir.display()));
    }
    if opts.transfers || !backend.host_addressable() {
        w(out, transfers_line(backend))?;
    }
    if sum.passed == 0 && sum.failed == 0 {
        crate::errln!(
            "toast-cli verify: backend `{}` ran no case (it implements none of their \
             kernels): nothing was checked",
            backend.name()
        );
    }
    w(out, sum.line())?;
    Ok(sum)
}

/// [`verify_with`] to standard output; returns the process exit code.
pub fn run_with(backend: &Backend, cases_dir: &Path, opts: Options) -> anyhow::Result<i32> {
    verify_with(backend, cases_dir, &mut crate::console::Stdout, opts).map(|s| s.exit_code())
}

/// The report for a backend that is unavailable on this machine: every case
/// of `cases_dir` is listed as skipped with the reason, then the summary.
pub fn unavailable(
    backend: &str,
    reason: &str,
    cases_dir: &Path,
    out: &mut dyn Write,
) -> anyhow::Result<Summary> {
    let entries = std::fs::read_dir(cases_dir)
        .map_err(|e| anyhow::anyhow!("cannot read cases directory {}: {e}", cases_dir.display()))?;
    let mut cases: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "npz"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    if cases.is_empty() {
        return Err(anyhow::anyhow!("no .npz cases in {}", cases_dir.display()));
    }
    cases.sort();
    let mut sum = Summary::default();
    for case in cases {
        sum.skipped += 1;
        writeln!(
            out,
            "SKIP  {case}: backend `{backend}` is unavailable: {reason}"
        )
        .context("cannot write the report")?;
    }
    writeln!(out, "{}", sum.line()).context("cannot write the report")?;
    Ok(sum)
}

/// [`unavailable`] to standard output.
pub fn run_unavailable(backend: &str, reason: &str, cases_dir: &Path) -> anyhow::Result<Summary> {
    unavailable(backend, reason, cases_dir, &mut crate::console::Stdout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toast_accel::host::conformance::{load_case, CaseError};
    use toast_accel::host::Plugin;

    fn cpu_backend() -> Backend {
        let exe = std::env::current_exe().unwrap();
        let name = format!(
            "{}toast_backend_cpu{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        );
        let path = exe
            .ancestors()
            .skip(1)
            .take(3)
            .map(|d| d.join(&name))
            .find(|p| p.is_file())
            .expect("the cpu plugin next to the test executable");
        Arc::new(Plugin::load(&path).unwrap())
            .init("threads=2")
            .unwrap()
    }

    use toast_testkit::shipped_cases_dir as shipped;

    #[test]
    fn report_lines_and_exit_code() {
        let dir = std::env::temp_dir().join(format!("toast-verify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["noise_weight_basic.npz", "stokes_weights_I_basic.npz"] {
            std::fs::copy(shipped().join(f), dir.join(f)).unwrap();
        }
        std::fs::write(dir.join("scan_map_broken.npz"), b"not a zip").unwrap();
        let b = cpu_backend();
        let mut out = Vec::new();
        let s = verify(&b, &dir, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("comparison: exact"), "{}", lines[0]);
        assert_eq!(lines[1], "PASS  noise_weight_basic");
        assert!(
            lines[2].starts_with("FAIL  scan_map_broken: "),
            "{}",
            lines[2]
        );
        assert_eq!(lines[3], "PASS  stokes_weights_I_basic");
        assert_eq!(lines[4], "2 passed, 1 failed");
        assert_eq!(s.exit_code(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Copy the npz `src` to `dst` entry by entry, stored, passing each
    /// entry (name without `.npy`, bytes) through `edit` (`None` drops it).
    fn rewrite_npz(src: &Path, dst: &Path, edit: impl Fn(&str, Vec<u8>) -> Option<Vec<u8>>) {
        use std::io::Read;
        let mut zin = zip::ZipArchive::new(std::fs::File::open(src).unwrap()).unwrap();
        let mut zout = zip::ZipWriter::new(std::fs::File::create(dst).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for i in 0..zin.len() {
            let mut e = zin.by_index(i).unwrap();
            let name = e.name().to_string();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            if let Some(b) = edit(name.strip_suffix(".npy").unwrap(), bytes) {
                zout.start_file(name, opts).unwrap();
                zout.write_all(&b).unwrap();
            }
        }
        zout.finish().unwrap();
    }

    /// Replace `from` by `to` in the header of a version 1.0 `.npy`, keeping
    /// the header's length (its padding absorbs the difference).
    fn patch_header(npy: &[u8], from: &str, to: &str) -> Vec<u8> {
        let len = usize::from(u16::from_le_bytes([npy[8], npy[9]]));
        let header = std::str::from_utf8(&npy[10..10 + len]).unwrap();
        assert!(header.contains(from), "{header}");
        let mut h = header.replacen(from, to, 1).trim_end().to_string();
        assert!(h.len() < len, "{h}");
        while h.len() < len - 1 {
            h.push(' ');
        }
        h.push('\n');
        [&npy[..10], h.as_bytes(), &npy[10 + len..]].concat()
    }

    /// A version 1.0 `.npy` of no elements, of type `descr` with `shape`.
    fn npy_empty(descr: &str, shape: &str) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((h.len() as u16).to_le_bytes());
        out.extend(h.as_bytes());
        out
    }

    /// `sim_noise` reads `filter_index`, `keys` and each row of
    /// `amplitudes` through plain pointers, by the detector count and
    /// `fft_len`: a case whose arrays are shorter fails by name (it crashed
    /// the process, reading past them).
    #[test]
    fn sim_noise_arrays_shorter_than_the_detectors_fail_by_name() {
        let dir = std::env::temp_dir().join(format!("toast-verify-noise-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = shipped().join("sim_noise_white_pow2.npz");
        std::fs::copy(&good, dir.join("sim_noise_a_good.npz")).unwrap();
        let replace = |case: &str, array: &'static str, npy: Vec<u8>| {
            rewrite_npz(&good, &dir.join(format!("{case}.npz")), |n, b| {
                Some(if n == array { npy.clone() } else { b })
            })
        };
        replace(
            "sim_noise_filter_index",
            "filter_index",
            npy_empty("<i4", "(0,)"),
        );
        replace("sim_noise_keys", "keys", npy_empty("<i8", "(0, 2)"));
        let mut out = Vec::new();
        let s = verify(&cpu_backend(), &dir, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].starts_with("PASS  sim_noise_a_good"), "{text}");
        assert!(
            lines[2].starts_with("FAIL  sim_noise_filter_index: ")
                && lines[2].contains("field `filter_index`: shape [0], expected 1 elements"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("FAIL  sim_noise_keys: ")
                && lines[3].contains("field `keys`: shape [0, 2], expected 2 elements"),
            "{text}"
        );
        assert_eq!(s.exit_code(), 1);
    }

    #[test]
    fn corrupt_cases_fail_by_name_and_the_run_goes_on() {
        let dir = std::env::temp_dir().join(format!("toast-verify-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["noise_weight_basic.npz", "stokes_weights_I_basic.npz"] {
            std::fs::copy(shipped().join(f), dir.join(f)).unwrap();
        }
        let good = shipped().join("noise_weight_basic.npz");
        let patch = |case: &str, array: &'static str, from: &'static str, to: &'static str| {
            rewrite_npz(&good, &dir.join(format!("{case}.npz")), |n, b| {
                Some(if n == array {
                    patch_header(&b, from, to)
                } else {
                    b
                })
            })
        };
        // 10^12 float64 claimed: 8 TB that must never be allocated.
        patch(
            "noise_weight_huge",
            "det_data_in",
            "(5, 700)",
            "(1000000, 1000000)",
        );
        patch(
            "noise_weight_overflow",
            "det_data_in",
            "(5, 700)",
            "(4294967296, 4294967296, 4294967296)",
        );
        patch("noise_weight_short", "det_data_in", "(5, 700)", "(5, 7)");
        patch("noise_weight_rank", "det_data_in", "(5, 700)", "(3500,)");
        patch("noise_weight_dtype", "data_index", "<i4", "<f4");
        rewrite_npz(&good, &dir.join("noise_weight_missing.npz"), |n, b| {
            (n != "data_index").then_some(b)
        });
        std::fs::write(dir.join("noise_weight_not_zip.npz"), b"not a zip").unwrap();
        let mut bytes = std::fs::read(&good).unwrap();
        std::fs::write(
            dir.join("noise_weight_truncated.npz"),
            &bytes[..bytes.len() / 2],
        )
        .unwrap();
        // One data byte of the first (stored) entry changed: its CRC fails.
        let npy = bytes.windows(6).position(|w| w == b"\x93NUMPY").unwrap();
        bytes[npy + 128 + 100] ^= 0xff;
        std::fs::write(dir.join("noise_weight_crc.npz"), &bytes).unwrap();

        // The typed error of the header that claims too much.
        match load_case(&dir.join("noise_weight_huge.npz")).unwrap_err() {
            CaseError::ClaimedSize {
                field,
                shape,
                claimed,
                actual,
                ..
            } => {
                assert_eq!(field, "det_data_in");
                assert_eq!(shape, [1_000_000, 1_000_000]);
                assert_eq!(claimed, Some(8_000_000_000_000));
                assert_eq!(actual, 28_000);
            }
            other => panic!("{other:?}"),
        }

        let mut out = Vec::new();
        let s = verify(&cpu_backend(), &dir, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let line = |case: &str| {
            let prefix = format!("  {case}");
            text.lines()
                .find(|l| l.ends_with(&prefix) || l.contains(&format!("{prefix}:")))
                .unwrap_or_else(|| panic!("no line for {case}:\n{text}"))
                .to_string()
        };
        assert_eq!(line("noise_weight_basic"), "PASS  noise_weight_basic");
        assert_eq!(
            line("stokes_weights_I_basic"),
            "PASS  stokes_weights_I_basic"
        );
        for (case, words) in [
            (
                "noise_weight_huge",
                &[
                    "`det_data_in`",
                    "[1000000, 1000000]",
                    "8000000000000 bytes",
                    "28000 bytes of data",
                ][..],
            ),
            (
                "noise_weight_overflow",
                &["`det_data_in`", "more bytes than a u64 counts"],
            ),
            (
                "noise_weight_short",
                &["`det_data_in`", "280 bytes", "28000 bytes of data"],
            ),
            ("noise_weight_rank", &["`det_data_in`", "expected 2"]),
            (
                "noise_weight_dtype",
                &["`data_index`", "dtype float32, expected int32"],
            ),
            (
                "noise_weight_missing",
                &["`data_index`", "missing from the file"],
            ),
            ("noise_weight_not_zip", &["not a readable zip archive"]),
            ("noise_weight_truncated", &["not a readable zip archive"]),
            (
                "noise_weight_crc",
                &["`det_data_in`", "cannot read the zip entry"],
            ),
        ] {
            let l = line(case);
            assert!(l.starts_with(&format!("FAIL  {case}: ")), "{l}");
            assert!(l.contains(&format!("{case}.npz")), "{l}");
            for w in words {
                assert!(l.contains(w), "{l} lacks {w}");
            }
        }
        assert_eq!(text.lines().last(), Some("2 passed, 9 failed"), "{text}");
        assert_eq!(s.exit_code(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn all_shipped_cases_pass() {
        let mut out = Vec::new();
        let s = verify(&cpu_backend(), &shipped(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        // 42 kernel cases and 61 boundary-direction cases (FORMAT.md)
        assert_eq!(
            text.lines().last(),
            Some(format!("{} passed, 0 failed", toast_testkit::SHIPPED_CASES).as_str()),
            "{text}"
        );
        assert_eq!(s.exit_code(), 0);
    }

    #[test]
    fn transfers_flag_prints_the_counters() {
        let dir = std::env::temp_dir().join(format!("toast-verify-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            shipped().join("noise_weight_basic.npz"),
            dir.join("noise_weight_basic.npz"),
        )
        .unwrap();
        let mut out = Vec::new();
        let opts = Options {
            comparison: None,
            transfers: true,
        };
        verify_with(&cpu_backend(), &dir, &mut out, opts).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[2].starts_with("transfers (cpu): "), "{text}");
        assert_eq!(lines[3], "1 passed, 0 failed");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn summary_line_mentions_skips_only_when_there_are_some() {
        let s = Summary {
            passed: 3,
            failed: 0,
            skipped: 2,
        };
        assert_eq!(s.line(), "3 passed, 0 failed, 2 skipped");
        assert_eq!(s.exit_code(), 0);
        let nothing = Summary {
            passed: 0,
            failed: 0,
            skipped: 29,
        };
        assert_eq!(nothing.exit_code(), 1, "nothing checked is not a pass");
    }

    #[test]
    fn missing_directory_is_an_error() {
        let e = verify(
            &cpu_backend(),
            Path::new("/nonexistent/cases"),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/cases"), "{e}");
    }
}
