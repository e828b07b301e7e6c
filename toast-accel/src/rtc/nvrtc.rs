//! NVRTC, loaded at run time. A caller can name the library file
//! (`TOAST_NVRTC_LIB`), which `toast-cli kernels compile` uses to compile
//! with the NVRTC of the PyPI wheel `nvidia-cuda-nvrtc-cu12` without a GPU.

use super::{CompileError, Compiled};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

type NvrtcProgram = *mut c_void;
type NvrtcResult = c_int;

/// The library names tried, in order, after `TOAST_NVRTC_LIB`.
pub const NVRTC_NAMES: &[&str] = &[
    "libnvrtc.so",
    "libnvrtc.so.13",
    "libnvrtc.so.12",
    "libnvrtc.so.11.2",
];

/// A loaded NVRTC library.
#[derive(Debug)]
pub struct Nvrtc {
    lib: libloading::Library,
    /// What was opened (a path or a library name).
    pub origin: String,
    /// `nvrtcVersion()`.
    pub version: (i32, i32),
}

/// The NVRTC options for `arch`: the architecture, `-default-device`,
/// C++14, and the target's flags from `device_source::compile_flags`
/// (`-fmad=false`: no fused multiply-add, as in the CPU reference).
pub fn options(arch: &str) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "-default-device".to_string(),
        "-std=c++14".to_string(),
    ];
    o.extend(
        crate::device_source::compile_flags(crate::device_source::Target::Cuda)
            .iter()
            .map(|f| f.to_string()),
    );
    o
}

impl Nvrtc {
    /// Open NVRTC: the file named by `TOAST_NVRTC_LIB` if set, otherwise the
    /// first of [`NVRTC_NAMES`] the dynamic loader finds.
    pub fn load() -> Result<Nvrtc, String> {
        if let Some(p) = std::env::var_os("TOAST_NVRTC_LIB").filter(|p| !p.is_empty()) {
            return Self::open(Path::new(&p));
        }
        let mut tried = Vec::new();
        for name in NVRTC_NAMES {
            match Self::open(Path::new(name)) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(e),
            }
        }
        Err(format!(
            "no NVRTC (libnvrtc.so): tried {} (set TOAST_NVRTC_LIB to the library file)",
            NVRTC_NAMES.join(", ")
        ))
    }

    /// Open NVRTC from one file or library name.
    pub fn open(path: &Path) -> Result<Nvrtc, String> {
        super::check_library_path(path).map_err(|e| format!("no NVRTC: {e}"))?;
        // SAFETY: loading NVRTC runs no initialisers with preconditions; the
        // library is kept open as long as this value lives.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("no NVRTC ({}): {}", path.display(), super::dl_error(&e)))?;
        let mut n = Nvrtc {
            lib,
            origin: path.display().to_string(),
            version: (0, 0),
        };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion(int*, int*) writes two ints.
        let r = unsafe {
            n.sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult>("nvrtcVersion")?(
                &mut major, &mut minor,
            )
        };
        if r != 0 {
            return Err(format!("nvrtcVersion failed with status {r}"));
        }
        n.version = (major, minor);
        Ok(n)
    }

    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        // SAFETY: every caller names T as the C prototype of `name` from nvrtc.h.
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("NVRTC at {} lacks {name}: {e}", self.origin))
    }

    fn error_string(&self, r: NvrtcResult) -> String {
        match self.sym::<unsafe extern "C" fn(NvrtcResult) -> *const c_char>("nvrtcGetErrorString")
        {
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

    /// Compile `source` (named `name` in diagnostics) for `arch`: `sm_XY`
    /// gives a cubin, `compute_XY` PTX; the options are [`options`].
    pub fn compile(&self, source: &str, name: &str, arch: &str) -> Result<Compiled, CompileError> {
        let fail = |message: String| CompileError {
            message,
            log: String::new(),
        };
        let cubin = if arch.starts_with("sm_") {
            true
        } else if arch.starts_with("compute_") {
            false
        } else {
            return Err(fail(format!(
                "architecture `{arch}` is not an NVIDIA one (sm_XY or compute_XY, e.g. sm_80)"
            )));
        };
        type Create = unsafe extern "C" fn(
            *mut NvrtcProgram,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> NvrtcResult;
        type CompileFn =
            unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult;
        type Size = unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult;
        type Get = unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult;
        type Destroy = unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult;
        let create: Create = self.sym("nvrtcCreateProgram").map_err(fail)?;
        let compile: CompileFn = self.sym("nvrtcCompileProgram").map_err(fail)?;
        let log_size: Size = self.sym("nvrtcGetProgramLogSize").map_err(fail)?;
        let get_log: Get = self.sym("nvrtcGetProgramLog").map_err(fail)?;
        let (code_size, get_code): (Size, Get) = if cubin {
            (
                self.sym("nvrtcGetCUBINSize").map_err(fail)?,
                self.sym("nvrtcGetCUBIN").map_err(fail)?,
            )
        } else {
            (
                self.sym("nvrtcGetPTXSize").map_err(fail)?,
                self.sym("nvrtcGetPTX").map_err(fail)?,
            )
        };
        let destroy: Destroy = self.sym("nvrtcDestroyProgram").map_err(fail)?;

        let src =
            CString::new(source).map_err(|_| fail("device source contains a NUL byte".into()))?;
        let cname =
            CString::new(name).map_err(|_| fail("program name contains a NUL byte".into()))?;
        let opts: Vec<CString> = options(arch)
            .into_iter()
            .map(|o| CString::new(o).expect("no NUL in options"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

        let mut prog: NvrtcProgram = std::ptr::null_mut();
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
                "nvrtcCreateProgram for {name}: {}",
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
                // SAFETY: `buf` holds the `n` bytes NVRTC said it needs.
                unsafe { get_log(prog, buf.as_mut_ptr() as *mut c_char) };
                String::from_utf8_lossy(&buf[..n - 1]).into_owned()
            } else {
                String::new()
            }
        };
        let result = if r != 0 {
            Err(CompileError {
                message: format!(
                    "NVRTC {}.{} failed to compile {name} for {arch}: {}",
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
                        "NVRTC produced no {} for {name} ({arch}): {}",
                        if cubin { "cubin" } else { "PTX" },
                        self.error_string(r)
                    ),
                    log,
                })
            } else {
                let mut code = vec![0u8; n];
                // SAFETY: `code` holds the `n` bytes NVRTC reported.
                let r = unsafe { get_code(prog, code.as_mut_ptr() as *mut c_char) };
                if r != 0 {
                    Err(CompileError {
                        message: format!(
                            "NVRTC could not return the code of {name}: {}",
                            self.error_string(r)
                        ),
                        log,
                    })
                } else {
                    Ok(Compiled {
                        code,
                        kind: if cubin { "cubin" } else { "ptx" },
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
