//! hiprtc compilation of the shared device source, and the on-disk cache of
//! compiled code objects (the same scheme as the CUDA backend's).

use crate::ffi::Hiprtc;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;

type RtcProgram = *mut c_void;
type RtcResult = c_int;

/// Code hiprtc produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// A code object (an offload bundle hipModuleLoadData accepts).
    pub code: Vec<u8>,
    /// Always `"code object"`.
    pub kind: &'static str,
    /// The compiler log (warnings), possibly empty.
    pub log: String,
}

/// A failed compilation: the hiprtc status and its log.
#[derive(Debug, Clone)]
pub struct CompileError {
    pub message: String,
    pub log: String,
}

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.log.trim().is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(
                f,
                "{}\n--- hiprtc log ---\n{}",
                self.message,
                self.log.trim_end()
            )
        }
    }
}

impl std::error::Error for CompileError {}

impl Hiprtc {
    fn error_string(&self, r: RtcResult) -> String {
        match self.sym::<unsafe extern "C" fn(RtcResult) -> *const c_char>("hiprtcGetErrorString") {
            // SAFETY: returns a static NUL-terminated string (or null).
            Ok(f) => unsafe {
                let p = f(r);
                if p.is_null() {
                    format!("status {r}")
                } else {
                    format!("{} ({r})", CStr::from_ptr(p).to_string_lossy())
                }
            },
            Err(_) => format!("status {r}"),
        }
    }

    /// Compile `source` (named `name` in diagnostics) for `arch`: `gfxNNN`
    /// into a code object. `-ffp-contract=off` keeps the results those of
    /// the CPU reference (no contraction into fused multiply-adds).
    pub fn compile(&self, source: &str, name: &str, arch: &str) -> Result<Compiled, CompileError> {
        let fail = |message: String| CompileError {
            message,
            log: String::new(),
        };
        if !arch.starts_with("gfx") {
            return Err(fail(format!(
                "architecture `{arch}` is not an AMD one (gfxNNN, e.g. gfx90a)"
            )));
        }
        type Create = unsafe extern "C" fn(
            *mut RtcProgram,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> RtcResult;
        type CompileFn = unsafe extern "C" fn(RtcProgram, c_int, *const *const c_char) -> RtcResult;
        type Size = unsafe extern "C" fn(RtcProgram, *mut usize) -> RtcResult;
        type Get = unsafe extern "C" fn(RtcProgram, *mut c_char) -> RtcResult;
        type Destroy = unsafe extern "C" fn(*mut RtcProgram) -> RtcResult;
        let create: Create = self.sym("hiprtcCreateProgram").map_err(fail)?;
        let compile: CompileFn = self.sym("hiprtcCompileProgram").map_err(fail)?;
        let log_size: Size = self.sym("hiprtcGetProgramLogSize").map_err(fail)?;
        let get_log: Get = self.sym("hiprtcGetProgramLog").map_err(fail)?;
        let code_size: Size = self.sym("hiprtcGetCodeSize").map_err(fail)?;
        let get_code: Get = self.sym("hiprtcGetCode").map_err(fail)?;
        let destroy: Destroy = self.sym("hiprtcDestroyProgram").map_err(fail)?;

        let src =
            CString::new(source).map_err(|_| fail("device source contains a NUL byte".into()))?;
        let cname =
            CString::new(name).map_err(|_| fail("program name contains a NUL byte".into()))?;
        let opts: Vec<CString> = [
            format!("--offload-arch={arch}"),
            "-O3".to_string(),
            "-ffp-contract=off".to_string(),
        ]
        .into_iter()
        .map(|o| CString::new(o).expect("no NUL in options"))
        .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

        let mut prog: RtcProgram = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings; no headers.
        let r = unsafe {
            create(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(fail(format!(
                "hiprtcCreateProgram for {name}: {}",
                self.error_string(r)
            )));
        }
        // SAFETY: `prog` is a live program; option pointers outlive the call.
        let r = unsafe { compile(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        let log = {
            let mut n = 0usize;
            // SAFETY: live program, out pointer to a usize.
            if unsafe { log_size(prog, &mut n) } == 0 && n > 1 {
                let mut buf = vec![0u8; n];
                // SAFETY: `buf` holds the `n` bytes hiprtc said it needs.
                unsafe { get_log(prog, buf.as_mut_ptr() as *mut c_char) };
                String::from_utf8_lossy(&buf[..n - 1]).into_owned()
            } else {
                String::new()
            }
        };
        let result = if r != 0 {
            Err(CompileError {
                message: format!(
                    "hiprtc {}.{} failed to compile {name} for {arch}: {}",
                    self.version.0,
                    self.version.1,
                    self.error_string(r)
                ),
                log,
            })
        } else {
            let mut n = 0usize;
            // SAFETY: live, compiled program; out pointer to a usize.
            let r = unsafe { code_size(prog, &mut n) };
            if r != 0 || n == 0 {
                Err(CompileError {
                    message: format!(
                        "hiprtc produced no {} for {name} ({arch}): {}",
                        "code object",
                        self.error_string(r)
                    ),
                    log,
                })
            } else {
                let mut code = vec![0u8; n];
                // SAFETY: `code` holds the `n` bytes hiprtc reported.
                let r = unsafe { get_code(prog, code.as_mut_ptr() as *mut c_char) };
                if r != 0 {
                    Err(CompileError {
                        message: format!(
                            "hiprtc could not return the code of {name}: {}",
                            self.error_string(r)
                        ),
                        log,
                    })
                } else {
                    Ok(Compiled {
                        code,
                        kind: "code object",
                        log,
                    })
                }
            }
        };
        // SAFETY: `prog` is live and destroyed once.
        unsafe { destroy(&mut prog) };
        result
    }
}

/// The directory compiled modules are cached in:
/// `$XDG_CACHE_HOME/toast-rs` or `~/.cache/toast-rs`; `None` when neither
/// variable is set or `TOAST_KERNEL_CACHE=0`.
pub fn cache_dir() -> Option<PathBuf> {
    if std::env::var("TOAST_KERNEL_CACHE").is_ok_and(|v| v == "0") {
        return None;
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
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
/// definition at or before the error's line of `kernels.h` (logs read
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
        if let Some(rest) = l.trim_start().strip_prefix("KERNEL void ") {
            name = rest.split('(').next().map(|n| n.trim().to_string());
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
