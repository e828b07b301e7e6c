//! `toast-cli kernels compile`: compile the shared device-kernel source
//! (`toast_accel::device_source`) for one target and architecture, with no
//! GPU present, and report what was built:
//!
//! ```text
//! toast-cli kernels compile --target cuda --arch sm_80
//! toast-cli kernels compile --target hip --arch gfx90a
//! toast-cli kernels compile --target opencl
//! ```
//!
//! * `cuda`: NVRTC, found as `TOAST_NVRTC_LIB` (a file), else by the dynamic
//!   loader (`libnvrtc.so*` on `LD_LIBRARY_PATH`), else in the PyPI wheel
//!   `nvidia-cuda-nvrtc-cu12` (asking `python3` where `nvidia.cuda_nvrtc`
//!   is installed); `--arch sm_XY` gives a cubin, `compute_XY` PTX.
//! * `hip`: hiprtc (`TOAST_HIPRTC_LIB`, `libhiprtc.so`, or `libamdhip64.so`
//!   as in ROCm 5 and Debian's `libamdhip64-dev`); `--arch gfxNNN`.
//! * `opencl`: the OpenCL runtime's compiler (e.g. PoCL) through the ICD
//!   loader `libOpenCL.so.1`, for every device of the first platform that has
//!   one (`--arch` is refused: the runtime compiles for its own device).
//!
//! The command uses exactly the compile paths of the CUDA and HIP plugins
//! (same options), checks that every kernel entry point is in the result,
//! and exits 1 on any compiler error, printing the compiler log; it exits 3
//! when the compiler itself is not installed (nothing was compiled).

use std::ffi::{c_char, c_void, CString};
use std::path::PathBuf;
use toast_accel::device_source::{self as ds, Target};

/// Arguments of `kernels compile`.
#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// cuda, hip or opencl.
    #[arg(long)]
    pub target: String,
    /// The architecture: sm_XY / compute_XY (cuda), gfxNNN (hip).
    #[arg(long)]
    pub arch: Option<String>,
    /// Also write the compiled code to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// Outcome of a compile command.
#[derive(Debug)]
pub enum Outcome {
    /// Compiled: the report to print.
    Compiled(String),
    /// The compiler failed: message and log.
    Failed(String),
    /// The compiler is not installed.
    Unavailable(String),
}

/// The longest `--arch` accepted (real ones are under 30 characters).
const MAX_ARCH_LEN: usize = 64;

/// `--arch` for `target`: at most [`MAX_ARCH_LEN`] characters of those
/// architecture names use (`sm_80`, `compute_90`, `gfx90a:xnack-`),
/// checked before it reaches a compiler or a message (which one names it
/// is the compiler's to say: a wrong one is a compile failure).
fn check_arch(target: Target, arch: &str) -> anyhow::Result<()> {
    let expected = match target {
        Target::Cuda => "sm_XY or compute_XY, e.g. sm_80",
        Target::Hip => "gfxNNN, e.g. gfx90a",
        Target::OpenCl => return Ok(()),
    };
    let ok = !arch.is_empty()
        && arch.len() <= MAX_ARCH_LEN
        && arch
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_:+-".contains(&b));
    if ok {
        return Ok(());
    }
    let shown: String = arch.chars().take(MAX_ARCH_LEN).collect();
    let more = if shown.len() < arch.len() {
        format!("... ({} bytes)", arch.len())
    } else {
        String::new()
    };
    anyhow::bail!("--arch {shown:?}{more}: expected {expected}")
}

/// Run `kernels compile`.
pub fn compile(args: &CompileArgs) -> anyhow::Result<Outcome> {
    let target = match args.target.as_str() {
        "cuda" => Target::Cuda,
        "hip" => Target::Hip,
        "opencl" => Target::OpenCl,
        other => {
            return Err(anyhow::anyhow!(
                "--target {other}: expected cuda, hip or opencl"
            ))
        }
    };
    if target == Target::OpenCl && args.output.is_some() {
        return Err(anyhow::anyhow!("--output is not supported for --target opencl (the runtime's binary is device-specific)"));
    }
    if target == Target::OpenCl && args.arch.is_some() {
        return Err(anyhow::anyhow!(
            "--arch does not apply to --target opencl (the OpenCL runtime compiles for its own \
             device; TOAST_OPENCL_DEVICE picks it)"
        ));
    }
    let source = ds::source(target);
    let hash = ds::source_hash(target);
    let arch = || {
        let arch = args
            .arch
            .clone()
            .ok_or_else(|| anyhow::anyhow!("--target {}: --arch is required", target.name()))?;
        check_arch(target, &arch)?;
        Ok::<_, anyhow::Error>(arch)
    };
    let (code, compiler, arch, kind, log) = match target {
        Target::Cuda => {
            let arch = arch()?;
            let nvrtc = match find_nvrtc() {
                Ok(n) => n,
                Err(e) => return Ok(Outcome::Unavailable(e)),
            };
            match nvrtc.compile(&source, "toast_kernels.cu", &arch) {
                Ok(c) => (
                    c.code,
                    format!(
                        "NVRTC {}.{} ({})",
                        nvrtc.version.0, nvrtc.version.1, nvrtc.origin
                    ),
                    arch,
                    c.kind,
                    c.log,
                ),
                Err(e) => {
                    let k = toast_accel::rtc::kernel_at_error(&source, &e.log);
                    return Ok(Outcome::Failed(format!("kernel {k}: {e}")));
                }
            }
        }
        Target::Hip => {
            let arch = arch()?;
            let rtc = match toast_accel::rtc::hiprtc::Hiprtc::load() {
                Ok(r) => r,
                Err(e) => return Ok(Outcome::Unavailable(e)),
            };
            match rtc.compile(&source, "toast_kernels.hip", &arch) {
                Ok(c) => (
                    c.code,
                    format!(
                        "hiprtc {}.{} ({})",
                        rtc.version.0, rtc.version.1, rtc.origin
                    ),
                    arch,
                    c.kind,
                    c.log,
                ),
                Err(e) => {
                    let k = toast_accel::rtc::kernel_at_error(&source, &e.log);
                    return Ok(Outcome::Failed(format!("kernel {k}: {e}")));
                }
            }
        }
        Target::OpenCl => match opencl::compile(&source) {
            Ok(r) => r,
            Err(opencl::Error::Unavailable(e)) => return Ok(Outcome::Unavailable(e)),
            Err(opencl::Error::Failed(e)) => return Ok(Outcome::Failed(e)),
        },
    };
    // Every entry point must be in the binary (as a symbol name).
    let missing: Vec<&str> = ds::KERNEL_NAMES
        .iter()
        .copied()
        .filter(|k| !contains(&code, k.as_bytes()))
        .collect();
    if !missing.is_empty() && target != Target::OpenCl {
        return Ok(Outcome::Failed(format!(
            "{compiler} compiled the source for {arch}, but the code lacks the kernels {}",
            missing.join(", ")
        )));
    }
    if let Some(p) = &args.output {
        std::fs::write(p, &code)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", p.display()))?;
    }
    let mut out = format!(
        "compiled the device source (hash {hash:016x}) for {} {arch} with {compiler}: {} bytes of {kind}\n",
        target.name(),
        code.len()
    );
    out.push_str(&format!("kernels ({}):", ds::KERNEL_NAMES.len()));
    for k in ds::KERNEL_NAMES {
        out.push_str(&format!(" {k}"));
    }
    out.push('\n');
    if !log.trim().is_empty() {
        out.push_str(&format!("compiler log:\n{}\n", log.trim_end()));
    }
    Ok(Outcome::Compiled(out))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// NVRTC from `TOAST_NVRTC_LIB`, the dynamic loader's path, or the PyPI
/// wheel `nvidia-cuda-nvrtc-cu12` that `python3` can import.
fn find_nvrtc() -> Result<toast_accel::rtc::nvrtc::Nvrtc, String> {
    use toast_accel::rtc::nvrtc::Nvrtc;
    let first = match Nvrtc::load() {
        Ok(n) => return Ok(n),
        Err(e) => e,
    };
    if std::env::var_os("TOAST_NVRTC_LIB").is_some() {
        return Err(first);
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import nvidia.cuda_nvrtc as m; print(list(m.__path__)[0])",
        ])
        .output();
    let dir = match out {
        Ok(o) if o.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib")
        }
        _ => {
            return Err(format!(
            "{first}; nor does python3 find the PyPI package nvidia-cuda-nvrtc-cu12 (pip install \
                 nvidia-cuda-nvrtc-cu12)"
        ))
        }
    };
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{first}; {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .collect();
    libs.sort();
    let lib = libs
        .first()
        .ok_or_else(|| format!("{first}; no libnvrtc.so* in {}", dir.display()))?;
    Nvrtc::open(lib)
}

/// A minimal OpenCL loader: enough to build a program and read its log.
mod opencl {
    use super::*;

    pub(super) enum Error {
        Unavailable(String),
        Failed(String),
    }

    type Id = *mut c_void;
    const CL_DEVICE_TYPE_ALL: u64 = 0xFFFF_FFFF;
    const CL_DEVICE_NAME: u32 = 0x102B;
    const CL_PLATFORM_NAME: u32 = 0x0902;
    const CL_PROGRAM_BUILD_LOG: u32 = 0x1183;
    const CL_PROGRAM_BINARY_SIZES: u32 = 0x1165;

    type Compiled = (Vec<u8>, String, String, &'static str, String);

    pub(super) fn compile(source: &str) -> Result<Compiled, Error> {
        // SAFETY: the ICD loader's initialisers have no preconditions; the
        // library is leaked (kept for the process), as plugins are.
        let lib = unsafe { libloading::Library::new("libOpenCL.so.1") }
            .map_err(|e| Error::Unavailable(format!("no OpenCL runtime (libOpenCL.so.1): {e}")))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        macro_rules! sym {
            ($name:literal, $t:ty) => {
                // SAFETY: `$t` is the prototype of `$name` in CL/cl.h.
                *unsafe { lib.get::<$t>($name) }
                    .map_err(|e| Error::Unavailable(format!("libOpenCL.so.1: {e}")))?
            };
        }
        let get_platforms = sym!(
            b"clGetPlatformIDs",
            unsafe extern "C" fn(u32, *mut Id, *mut u32) -> i32
        );
        let platform_info = sym!(
            b"clGetPlatformInfo",
            unsafe extern "C" fn(Id, u32, usize, *mut c_void, *mut usize) -> i32
        );
        let get_devices = sym!(
            b"clGetDeviceIDs",
            unsafe extern "C" fn(Id, u64, u32, *mut Id, *mut u32) -> i32
        );
        let device_info = sym!(
            b"clGetDeviceInfo",
            unsafe extern "C" fn(Id, u32, usize, *mut c_void, *mut usize) -> i32
        );
        let create_context = sym!(
            b"clCreateContext",
            unsafe extern "C" fn(
                *const isize,
                u32,
                *const Id,
                *const c_void,
                *mut c_void,
                *mut i32,
            ) -> Id
        );
        let create_program = sym!(
            b"clCreateProgramWithSource",
            unsafe extern "C" fn(Id, u32, *const *const c_char, *const usize, *mut i32) -> Id
        );
        let build = sym!(
            b"clBuildProgram",
            unsafe extern "C" fn(
                Id,
                u32,
                *const Id,
                *const c_char,
                *const c_void,
                *mut c_void,
            ) -> i32
        );
        let build_info = sym!(
            b"clGetProgramBuildInfo",
            unsafe extern "C" fn(Id, Id, u32, usize, *mut c_void, *mut usize) -> i32
        );
        let program_info = sym!(
            b"clGetProgramInfo",
            unsafe extern "C" fn(Id, u32, usize, *mut c_void, *mut usize) -> i32
        );

        let string = |f: &dyn Fn(usize, *mut c_void, *mut usize) -> i32| -> String {
            let mut n = 0usize;
            if f(0, std::ptr::null_mut(), &mut n) != 0 || n == 0 {
                return String::new();
            }
            let mut b = vec![0u8; n];
            f(n, b.as_mut_ptr() as *mut c_void, std::ptr::null_mut());
            String::from_utf8_lossy(&b[..n.saturating_sub(1)]).into_owned()
        };

        let mut np = 0u32;
        // SAFETY: query the count only.
        let r = unsafe { get_platforms(0, std::ptr::null_mut(), &mut np) };
        if r != 0 || np == 0 {
            return Err(Error::Unavailable(format!(
                "no OpenCL platform (clGetPlatformIDs returned {r}, {np} platforms; install an ICD such as pocl-opencl-icd)"
            )));
        }
        let mut platforms = vec![std::ptr::null_mut(); np as usize];
        // SAFETY: room for `np` ids.
        unsafe { get_platforms(np, platforms.as_mut_ptr(), std::ptr::null_mut()) };
        for p in platforms {
            let mut nd = 0u32;
            // SAFETY: count query on a platform id from the runtime.
            if unsafe { get_devices(p, CL_DEVICE_TYPE_ALL, 0, std::ptr::null_mut(), &mut nd) } != 0
                || nd == 0
            {
                continue;
            }
            let mut dev: Id = std::ptr::null_mut();
            // SAFETY: room for one id.
            unsafe { get_devices(p, CL_DEVICE_TYPE_ALL, 1, &mut dev, std::ptr::null_mut()) };
            let pname = string(&|n, b, s| {
                // SAFETY: a size query, then a read into a buffer of that size.
                unsafe { platform_info(p, CL_PLATFORM_NAME, n, b, s) }
            });
            let dname = string(&|n, b, s| {
                // SAFETY: `dev` is the id get_devices gave for platform `p`; `string`
                // queries the size, then passes a buffer of exactly that many bytes.
                unsafe { device_info(dev, CL_DEVICE_NAME, n, b, s) }
            });
            let mut err = 0i32;
            // SAFETY: one valid device; no properties or callback.
            let ctx = unsafe {
                create_context(
                    std::ptr::null(),
                    1,
                    &dev,
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    &mut err,
                )
            };
            if ctx.is_null() {
                return Err(Error::Failed(format!(
                    "clCreateContext on {dname} failed: {err}"
                )));
            }
            let src =
                CString::new(source).map_err(|_| Error::Failed("NUL in the source".into()))?;
            let ptr = src.as_ptr();
            // SAFETY: one NUL-terminated string (null lengths).
            let prog = unsafe { create_program(ctx, 1, &ptr, std::ptr::null(), &mut err) };
            if prog.is_null() {
                return Err(Error::Failed(format!(
                    "clCreateProgramWithSource failed: {err}"
                )));
            }
            // The options of the OpenCL plugin (none: the prelude turns contraction off).
            let opts = CString::new("").expect("no NUL");
            // SAFETY: valid program and device; synchronous build.
            let r = unsafe {
                build(
                    prog,
                    1,
                    &dev,
                    opts.as_ptr(),
                    std::ptr::null(),
                    std::ptr::null_mut(),
                )
            };
            // SAFETY: size query then read.
            let log =
                string(&|n, b, s| unsafe { build_info(prog, dev, CL_PROGRAM_BUILD_LOG, n, b, s) });
            if r != 0 {
                let k = toast_accel::rtc::kernel_at_error(source, &log);
                return Err(Error::Failed(format!(
                    "kernel {k}: the OpenCL compiler of {pname} ({dname}) failed with status {r}\n--- build log ---\n{}",
                    log.trim_end()
                )));
            }
            let mut size = 0usize;
            // SAFETY: one device, so one size.
            unsafe {
                program_info(
                    prog,
                    CL_PROGRAM_BINARY_SIZES,
                    std::mem::size_of::<usize>(),
                    &mut size as *mut usize as *mut c_void,
                    std::ptr::null_mut(),
                )
            };
            return Ok((
                vec![0u8; size],
                format!("the OpenCL compiler of {pname}"),
                dname,
                "device binary (size only)",
                log,
            ));
        }
        Err(Error::Unavailable(
            "no OpenCL device on any platform".into(),
        ))
    }
}
