//! hiprtc, loaded at run time: `TOAST_HIPRTC_LIB` names a file, else
//! `libhiprtc.so` (ROCm 6) or `libamdhip64.so` (ROCm 5.x keeps hiprtc inside
//! the runtime, as Debian's `libamdhip64-dev` does).

use super::{CompileError, Compiled};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;

type RtcProgram = *mut c_void;
type RtcResult = c_int;

fn sym<T: Copy>(lib: &libloading::Library, origin: &str, name: &str) -> Result<T, String> {
    // SAFETY: every caller names T as the C prototype of `name` in hiprtc.h.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{origin} lacks {name}: {e}"))
}

/// The hiprtc library names tried after `TOAST_HIPRTC_LIB`: ROCm 6 ships
/// `libhiprtc.so`; ROCm 5.x keeps hiprtc inside `libamdhip64`.
pub const HIPRTC_NAMES: &[&str] = &[
    "libhiprtc.so",
    "libhiprtc.so.6",
    "libhiprtc.so.5",
    "libamdhip64.so",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// The hiprtc options for `arch`: `--offload-arch`, `-O3`, and the
/// target's flags from `device_source::compile_flags` (`-ffp-contract=off`:
/// no fused multiply-add, as in the CPU reference).
pub fn options(arch: &str) -> Vec<String> {
    let mut o = vec![format!("--offload-arch={arch}"), "-O3".to_string()];
    o.extend(
        crate::device_source::compile_flags(crate::device_source::Target::Hip)
            .iter()
            .map(|f| f.to_string()),
    );
    o
}

/// The AMDGPU target features a target ID may name, each with the
/// processors that have it (LLVM's AMDGPUUsage, "Processors"; the
/// features are the same in every ROCm since 4.0).
const TARGET_FEATURES: &[(&str, &[&str])] = &[
    (
        "sramecc",
        &[
            "gfx906", "gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950",
        ],
    ),
    (
        "xnack",
        &[
            "gfx801", "gfx810", "gfx900", "gfx902", "gfx904", "gfx906", "gfx908", "gfx909",
            "gfx90a", "gfx90c", "gfx940", "gfx941", "gfx942", "gfx950", "gfx1010", "gfx1011",
            "gfx1012", "gfx1013",
        ],
    ),
];

/// The comgr library names (hiprtc's code-object manager): ROCm 6.2 and
/// later ship `.so.3`, earlier `.so.2`.
const COMGR_NAMES: &[&str] = &["libamd_comgr.so.2", "libamd_comgr.so.3", "libamd_comgr.so"];

/// The comgr hiprtc uses: the one already in the process, else the one in
/// hiprtc's own directory (`hiprtc_file`: a path, or a bare name the loader
/// found), else the first the loader finds. Never unloaded: hiprtc loads
/// the same comgr to compile, and a comgr unloaded and loaded again
/// registers LLVM's options twice (LLVM aborts).
fn open_comgr(hiprtc_file: &str) -> Option<&'static libloading::Library> {
    use libloading::os::unix::{Library, RTLD_LAZY};
    // glibc's RTLD_NOLOAD (dlfcn.h; libloading does not export it).
    const RTLD_NOLOAD: std::ffi::c_int = 4;
    let dir = Path::new(hiprtc_file)
        .parent()
        .filter(|d| !d.as_os_str().is_empty());
    let loaded = COMGR_NAMES.iter().find_map(|n| {
        // SAFETY: RTLD_NOLOAD only returns a library already loaded: no
        // initialiser runs.
        unsafe { Library::open(Some(*n), RTLD_LAZY | RTLD_NOLOAD) }.ok()
    });
    let lib = loaded
        .or_else(|| {
            let dir = dir?;
            COMGR_NAMES.iter().find_map(|n| {
                // SAFETY: loading comgr runs its initialisers only, as
                // hiprtc's own load of it does.
                unsafe { Library::open(Some(dir.join(n)), RTLD_LAZY) }.ok()
            })
        })
        .or_else(|| {
            COMGR_NAMES.iter().find_map(|n| {
                // SAFETY: as above.
                unsafe { Library::open(Some(*n), RTLD_LAZY) }.ok()
            })
        })?;
    Some(Box::leak(Box::new(libloading::Library::from(lib))))
}

/// The targets (`gfx90a`, `gfx90a:xnack+`, ...) the installed compiler can
/// target, from comgr's ISA list (`amd_comgr_get_isa_name`:
/// `amdgcn-amd-amdhsa--gfx90a`), without repeats; `None` where comgr cannot
/// be opened or read.
fn comgr_targets(hiprtc_file: &str) -> Option<Vec<String>> {
    type Count = unsafe extern "C" fn(*mut usize) -> c_int;
    type Name = unsafe extern "C" fn(usize, *mut *const c_char) -> c_int;
    let lib = open_comgr(hiprtc_file)?;
    let count: Count = sym(lib, "comgr", "amd_comgr_get_isa_count").ok()?;
    let name: Name = sym(lib, "comgr", "amd_comgr_get_isa_name").ok()?;
    let mut n = 0usize;
    // SAFETY: writes one size_t.
    if unsafe { count(&mut n) } != 0 {
        return None;
    }
    let mut out: Vec<String> = Vec::with_capacity(n);
    for i in 0..n {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `i` is below the count; comgr returns a static string.
        if unsafe { name(i, &mut p) } != 0 || p.is_null() {
            return None;
        }
        // SAFETY: a NUL-terminated string owned by comgr.
        let isa = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        let target = isa.rsplit("--").next().unwrap_or(&isa).to_string();
        if !out.contains(&target) {
            out.push(target);
        }
    }
    Some(out)
}

/// Check target ID `arch` (a processor, then `:sramecc+`/`-`,
/// `:xnack+`/`-`, each at most once) before it reaches hiprtc: the comgr of
/// some ROCm releases (Debian's 5.2) aborts the process on a processor it
/// does not know or a feature the processor lacks (`munmap_chunk(): invalid
/// pointer`) instead of returning an error. `known`: the targets the
/// installed compiler lists (`comgr_targets`; `None`: unknown, the
/// processor is not checked). A processor's features are those its listed
/// targets name where they name any (newer comgr lists `gfx90a:xnack+`),
/// else `TARGET_FEATURES`'.
pub fn check_target(arch: &str, known: Option<&[String]>) -> Result<(), String> {
    let mut parts = arch.split(':');
    let proc = parts.next().unwrap_or("");
    let mut listed_features: Vec<&str> = Vec::new();
    if let Some(known) = known {
        let mut procs: Vec<&str> = Vec::new();
        for t in known {
            let mut it = t.split(':');
            let p = it.next().unwrap_or("");
            if !procs.contains(&p) {
                procs.push(p);
            }
            if p == proc {
                for f in it {
                    let name = feature_name(f).unwrap_or(f);
                    if !listed_features.contains(&name) {
                        listed_features.push(name);
                    }
                }
            }
        }
        if !procs.contains(&proc) {
            return Err(format!(
                "{proc} is not a processor this hiprtc can target (it knows {})",
                procs.join(", ")
            ));
        }
    }
    let mut seen = Vec::new();
    for f in parts {
        let Some(name) = feature_name(f).filter(|n| TARGET_FEATURES.iter().any(|(k, _)| k == n))
        else {
            return Err(format!(
                "`{f}` is not a target feature (sramecc+, sramecc-, xnack+ or xnack-)"
            ));
        };
        if seen.contains(&name) {
            return Err(format!("{name} is named twice"));
        }
        seen.push(name);
        let has = if listed_features.is_empty() {
            TARGET_FEATURES
                .iter()
                .any(|(k, procs)| *k == name && procs.contains(&proc))
        } else {
            listed_features.contains(&name)
        };
        if !has {
            return Err(format!("{proc} has no {name} feature"));
        }
    }
    Ok(())
}

/// The name of target feature `f` with its one setting (`xnack+`,
/// `sramecc-`), or `None` for a name without one: the reading of both the
/// user's target ID and comgr's list (which may also list bare names).
fn feature_name(f: &str) -> Option<&str> {
    f.strip_suffix(['+', '-'])
}

/// A loaded hiprtc.
#[derive(Debug)]
pub struct Hiprtc {
    lib: libloading::Library,
    /// The library opened.
    pub origin: String,
    /// `hiprtcVersion()`, `(0, 0)` when absent.
    pub version: (i32, i32),
}

impl Hiprtc {
    /// Open hiprtc: the file `TOAST_HIPRTC_LIB` names, else the first of
    /// [`HIPRTC_NAMES`] that has `hiprtcCreateProgram`.
    pub fn load() -> Result<Hiprtc, String> {
        let names: Vec<String> = match std::env::var("TOAST_HIPRTC_LIB") {
            Ok(p) if !p.is_empty() => vec![p],
            _ => HIPRTC_NAMES.iter().map(|s| s.to_string()).collect(),
        };
        let mut errs = Vec::new();
        for n in &names {
            if let Err(e) = super::check_library_path(Path::new(n)) {
                errs.push(e);
                continue;
            }
            // SAFETY: as in `open_first`.
            let lib = match unsafe { libloading::Library::new(n.as_str()) } {
                Ok(l) => l,
                Err(e) => {
                    errs.push(super::dl_error(&e));
                    continue;
                }
            };
            if let Err(e) = sym::<unsafe extern "C" fn()>(&lib, n, "hiprtcCreateProgram") {
                errs.push(e);
                continue;
            }
            let mut h = Hiprtc {
                lib,
                origin: n.clone(),
                version: (0, 0),
            };
            if let Ok(f) =
                h.sym::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int>("hiprtcVersion")
            {
                let (mut a, mut b) = (0, 0);
                // SAFETY: writes two ints.
                if unsafe { f(&mut a, &mut b) } == 0 {
                    h.version = (a, b);
                }
            }
            return Ok(h);
        }
        Err(format!(
            "no hiprtc (libhiprtc.so or libamdhip64.so): {} (set TOAST_HIPRTC_LIB to the library file)",
            errs.join("; ")
        ))
    }

    fn sym<T: Copy>(&self, name: &str) -> Result<T, String> {
        sym(&self.lib, &self.origin, name)
    }
}

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
        check_target(arch, comgr_targets(&self.origin).as_deref())
            .map_err(|e| fail(format!("architecture `{arch}`: {e}")))?;
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
        let opts: Vec<CString> = options(arch)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Target IDs are checked before hiprtc sees them: a processor the
    /// installed compiler lacks, or a feature its processor lacks, aborted
    /// the process inside Debian's comgr.
    #[test]
    fn target_ids_are_checked_before_hiprtc() {
        let known: Vec<String> = ["gfx90a", "gfx1030"].map(String::from).to_vec();
        let check = |a: &str| check_target(a, Some(&known));
        for good in [
            "gfx90a",
            "gfx90a:xnack+",
            "gfx90a:sramecc-:xnack+",
            "gfx1030",
        ] {
            check(good).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, says) in [
            (
                "gfx942",
                "gfx942 is not a processor this hiprtc can target (it knows gfx90a, gfx1030)",
            ),
            ("gfx1030:xnack+", "gfx1030 has no xnack feature"),
            ("gfx1030:sramecc-", "gfx1030 has no sramecc feature"),
            ("gfx90a:xnack", "`xnack` is not a target feature"),
            ("gfx90a:bogus+", "`bogus+` is not a target feature"),
            ("gfx90a::", "`` is not a target feature"),
            ("gfx90a:xnack+:xnack-", "xnack is named twice"),
        ] {
            let e = check(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        // Without comgr's list the processor is not checked; features are.
        assert!(check_target("gfx942", None).is_ok());
        assert!(check_target("gfx942:bogus+", None).is_err());
        assert!(check_target("gfx90a:xnacké", None).is_err());
        // A list that names features (newer comgr, generic targets): they
        // decide, and each processor is named once in the message.
        let listed: Vec<String> = ["gfx9-generic", "gfx9-generic:xnack-", "gfx9-generic:xnack+"]
            .map(String::from)
            .to_vec();
        assert!(check_target("gfx9-generic:xnack+", Some(&listed)).is_ok());
        assert!(check_target("gfx9-generic:sramecc+", Some(&listed)).is_err());
        let e = check_target("gfx1", Some(&listed)).unwrap_err();
        assert!(e.ends_with("(it knows gfx9-generic)"), "{e}");
    }
}
