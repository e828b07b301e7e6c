//! Run-time compilation of the shared device source, for the GPU plugins and
//! `toast-cli kernels compile` (feature `rtc`): NVRTC ([`nvrtc`]) and hiprtc
//! ([`hiprtc`]) loaded with `libloading` (a missing library or symbol is an
//! error value, never a panic, and nothing is needed to build), the on-disk
//! cache of compiled modules, and the mapping of a compiler error to the
//! kernel it falls in.
//!
//! These live here rather than in the plugins because a plugin's rlib cannot
//! be linked into another binary next to a second plugin (each exports the
//! same entry symbol), and the command line needs both compilers.

pub mod hiprtc;
pub mod nvrtc;

use std::path::PathBuf;

/// Code a run-time compiler produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// A cubin (`sm_XY`), NUL-terminated PTX (`compute_XY`) or an AMD code
    /// object (`gfxNNN`).
    pub code: Vec<u8>,
    /// `"cubin"`, `"ptx"` or `"code object"`.
    pub kind: &'static str,
    /// The compiler log (warnings), possibly empty.
    pub log: String,
}

/// A failed compilation: the compiler status and its log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}{}", log_section(.log))]
pub struct CompileError {
    /// The compiler status, as a sentence.
    pub message: String,
    /// The compiler log (possibly empty).
    pub log: String,
}

/// The log of a [`CompileError`] as a section after its message, or nothing
/// when the log is empty.
fn log_section(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- compiler log ---\n{}", log.trim_end())
    }
}

/// The message of a library-loading error with its cause (`dlerror()`'s
/// text), e.g. "libcuda.so.1: cannot open shared object file: No such file
/// or directory", rather than libloading's bare "dlopen failed".
pub fn dl_error(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// The directory compiled modules are cached in: `$TOAST_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/toast-rs`, else `~/.cache/toast-rs`; `None` when none
/// of these variables is set or `TOAST_KERNEL_CACHE=0`.
pub fn cache_dir() -> Option<PathBuf> {
    if std::env::var("TOAST_KERNEL_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = nonempty("TOAST_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("toast-rs"))
}

/// Read a cached module, if present.
pub fn cache_read(file: &str) -> Option<Vec<u8>> {
    let p = cache_dir()?.join(file);
    std::fs::read(p).ok().filter(|b| !b.is_empty())
}

/// Store a module in the cache (best effort: a read-only cache is not an
/// error). Written to a temporary file and renamed, so concurrent processes
/// never see a partial file.
pub fn cache_write(file: &str, code: &[u8]) {
    let Some(dir) = cache_dir() else { return };
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let tmp = dir.join(format!("{file}.{}.tmp", std::process::id()));
    if std::fs::write(&tmp, code).is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(file));
    }
    let _ = std::fs::remove_file(&tmp);
}

/// The kernel a compiler log's first error falls in: the last `KERNEL`
/// (or `DEVICE_FN` helper) definition at or before the error's line of
/// `kernels.h` (logs read
/// `kernels.h(LINE): error` from NVRTC, `kernels.h:LINE:COL: error` from
/// hiprtc), `"(prelude)"` for an error before the kernels, or
/// `"(device source)"` when the log names no line.
pub fn kernel_at_error(source: &str, log: &str) -> String {
    let Some(line) = first_error_line(log) else {
        return "(device source)".to_string();
    };
    let Some(start) = source.find("#line 1 \"kernels.h\"") else {
        return "(device source)".to_string();
    };
    let kernels = source[start..].split_once('\n').map_or("", |(_, k)| k);
    let mut name = None;
    for l in kernels.lines().take(line) {
        let l = l.trim_start();
        if let Some(rest) = l.strip_prefix("KERNEL void ") {
            name = rest.split('(').next().map(|n| n.trim().to_string());
        } else if let Some(rest) = l.strip_prefix("DEVICE_FN ") {
            // `DEVICE_FN type name(`: the helper, named as such.
            if let Some(n) = rest
                .split('(')
                .next()
                .and_then(|h| h.split_whitespace().last())
            {
                name = Some(format!("(helper {n})"));
            }
        }
    }
    name.unwrap_or_else(|| "(prelude)".to_string())
}

fn first_error_line(log: &str) -> Option<usize> {
    for l in log.lines().filter(|l| l.contains("error")) {
        if let Some(i) = l.find("kernels.h") {
            let rest = &l[i + "kernels.h".len()..];
            let digits: String = rest
                .trim_start_matches(['(', ':'])
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(n) = digits.parse() {
                return Some(n);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    /// A source with an error in one kernel: the compiler's log comes back
    /// and names the line, which maps to that kernel. Runs with whichever
    /// compilers are installed (CI has both).
    #[test]
    fn a_compile_error_gives_the_log_and_the_kernel() {
        use crate::device_source::{Target, PRELUDE_CUDA, PRELUDE_HIP};
        let bad = |prelude: &str| {
            format!(
                "{prelude}\n#line 1 \"kernels.h\"\nKERNEL void toast_ok(i64 n) {{ }}\n\nKERNEL void toast_bad(i64 n) {{\n    no_such_function(n);\n}}\n"
            )
        };
        match super::nvrtc::Nvrtc::load() {
            Ok(nv) => {
                let src = bad(PRELUDE_CUDA);
                let e = nv.compile(&src, "bad.cu", "sm_80").unwrap_err();
                assert!(e.log.contains("no_such_function"), "{e}");
                assert_eq!(super::kernel_at_error(&src, &e.log), "toast_bad", "{e}");
            }
            Err(e) => println!("SKIPPED: {}: {e}", Target::Cuda.name()),
        }
        match super::hiprtc::Hiprtc::load() {
            Ok(h) => {
                let src = bad(PRELUDE_HIP);
                let e = h.compile(&src, "bad.hip", "gfx90a").unwrap_err();
                assert!(e.log.contains("no_such_function"), "{e}");
                assert_eq!(super::kernel_at_error(&src, &e.log), "toast_bad", "{e}");
            }
            Err(e) => println!("SKIPPED: {}: {e}", Target::Hip.name()),
        }
    }

    #[test]
    fn options_carry_the_no_contraction_flags() {
        assert!(super::nvrtc::options("sm_80").contains(&"-fmad=false".to_string()));
        assert!(super::nvrtc::options("sm_80").contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(super::hiprtc::options("gfx90a").contains(&"-ffp-contract=off".to_string()));
        assert!(super::hiprtc::options("gfx90a").contains(&"--offload-arch=gfx90a".to_string()));
    }

    #[test]
    fn error_lines_name_the_kernel() {
        let src = "prelude\n#line 1 \"kernels.h\"\nhelper\nKERNEL void toast_a(int x) {\n  bad;\n}\nKERNEL void toast_b(\n  worse;\n";
        assert_eq!(
            super::kernel_at_error(src, "kernels.h(4): error: bad"),
            "toast_a"
        );
        assert_eq!(
            super::kernel_at_error(src, "kernels.h:7:3: error: worse"),
            "toast_b"
        );
        assert_eq!(
            super::kernel_at_error(src, "kernels.h(1): error: x"),
            "(prelude)"
        );
        assert_eq!(super::kernel_at_error(src, "it broke"), "(device source)");
    }
}
