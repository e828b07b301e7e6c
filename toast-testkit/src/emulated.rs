//! The emulated GPU drivers of `toast-gpu-emu` for tests: the CUDA and HIP
//! plugins run for real on a machine without a GPU when the emulator's
//! library is found first under the vendor's name, which only a process
//! started with `LD_LIBRARY_PATH` set can arrange (the dynamic loader reads
//! it once, at start). A test therefore runs the work in a child process:
//! another toast-cli, or itself again ([`rerun_self`]).
//!
//! `scripts/emulated-gpu.sh` does the same for the command line.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Set (non-empty) where the emulated backends must run: a missing
/// emulator library or compiler (NVRTC, hiprtc) is then a failure, not a
/// skip. `.ci/run` and the CI jobs set it, as `TOAST_REQUIRE_OPENCL` for
/// OpenCL.
pub const REQUIRE: &str = "TOAST_REQUIRE_EMULATED_GPU";

/// Set in the child process of [`rerun_self`] to the backend it runs on.
pub const CHILD: &str = "TOAST_EMULATED_CHILD";

/// The emulator library of `backend` and the names the plugin loads it by.
fn library(backend: &str) -> Result<(&'static str, &'static [&'static str]), String> {
    match backend {
        "cuda" => Ok(("libtoast_emu_cuda.so", &["libcuda.so.1", "libcuda.so"])),
        "hip" => Ok(("libtoast_emu_hip.so", &["libamdhip64.so"])),
        other => Err(format!("no emulated driver for backend `{other}`")),
    }
}

/// The emulator library of `backend`, built by cargo next to the test
/// executable (the crate under test has `toast-emu-<backend>` as a
/// dev-dependency), or why not.
pub fn library_path(backend: &str) -> Result<PathBuf, String> {
    let (file, _) = library(backend)?;
    let exe = std::env::current_exe().map_err(|e| format!("test executable: {e}"))?;
    exe.ancestors()
        .skip(1)
        .take_while(|d| d.file_name().is_some_and(|n| n != "target"))
        .map(|d| d.join(file))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "the emulated {backend} driver ({file}) is not built next to {}",
                exe.display()
            )
        })
}

/// A directory holding the emulator of `backend` under the vendor's names
/// (symbolic links, in a scratch directory of this process), or why not.
/// Safe to call from concurrent tests: made once per process and backend
/// (a link already pointing at the emulator is kept, never replaced while
/// another test's process may be loading it).
pub fn library_dir(backend: &str) -> Result<PathBuf, String> {
    static MADE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    let lib = library_path(backend)?;
    let (_, names) = library(backend)?;
    let dir = std::env::temp_dir().join(format!(
        "toast-emulated-gpu-{}-{backend}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for n in names {
        let link = dir.join(n);
        if std::fs::read_link(&link).is_ok_and(|t| t == lib) {
            continue;
        }
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&lib, &link).map_err(|e| format!("{}: {e}", link.display()))?;
    }
    Ok(dir)
}

/// `LD_LIBRARY_PATH` with `dir` first.
pub fn ld_library_path(dir: &Path) -> OsString {
    let mut v = OsString::from(dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Run the test `test` of this executable again, alone, in a child process
/// on the emulated `backend` (with [`CHILD`] set to it), and return its
/// output; `Err(why)` when the emulator library is missing.
pub fn rerun_self(test: &str, backend: &str, limit: Duration) -> Result<Output, String> {
    let dir = library_dir(backend)?;
    let exe = std::env::current_exe().map_err(|e| format!("test executable: {e}"))?;
    let mut c = Command::new(exe);
    c.args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, backend)
        .env("LD_LIBRARY_PATH", ld_library_path(&dir));
    Ok(crate::process::run_with_deadline(
        c,
        limit,
        &format!("{test} on the emulated {backend} driver"),
    ))
}
