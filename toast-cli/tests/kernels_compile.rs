//! `toast-cli kernels compile` on this machine: the shared device source must
//! compile for CUDA (NVRTC) and HIP (hiprtc) wherever the compiler is
//! installed (exit 0, every entry point reported); where it is not, the
//! command exits 3 and the test prints `SKIPPED: <reason>` (or fails, with
//! `TOAST_REQUIRE_GPU_COMPILERS=1`, as CI sets). A compiler error (exit 1)
//! always fails.

use std::process::Command;

fn compile(target: &str, arch: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_toast-cli"))
        .args(["kernels", "compile", "--target", target, "--arch", arch])
        .output()
        .expect("run toast-cli");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => {
            assert!(stdout.contains(&format!("for {target} {arch}")), "{stdout}");
            for k in toast_accel::device_source::KERNEL_NAMES {
                assert!(stdout.contains(k), "{k} not reported:\n{stdout}");
            }
            println!("{}", stdout.lines().next().unwrap_or_default());
        }
        Some(3) => {
            assert!(
                !std::env::var("TOAST_REQUIRE_GPU_COMPILERS").is_ok_and(|v| v == "1"),
                "TOAST_REQUIRE_GPU_COMPILERS=1 but the {target} compiler is missing: {stderr}"
            );
            println!("SKIPPED: {target} {arch}: {}", stderr.trim());
        }
        other => panic!(
            "kernels compile --target {target} --arch {arch} exited {other:?}:\n{stdout}\n{stderr}"
        ),
    }
}

#[test]
fn cuda_sm80_compiles_or_nvrtc_is_absent() {
    compile("cuda", "sm_80");
}

#[test]
fn hip_gfx90a_compiles_or_hiprtc_is_absent() {
    compile("hip", "gfx90a");
}

#[test]
fn a_wrong_architecture_is_a_compile_failure_not_a_crash() {
    let out = Command::new(env!("CARGO_BIN_EXE_toast-cli"))
        .args(["kernels", "compile", "--target", "cuda", "--arch", "gfx90a"])
        .output()
        .expect("run toast-cli");
    // 1 (not an NVIDIA architecture) when NVRTC is present, 3 when it is not.
    assert!(matches!(out.status.code(), Some(1) | Some(3)), "{out:?}");
    // OpenCL compiles for its runtime's device: an --arch would be ignored.
    let out = Command::new(env!("CARGO_BIN_EXE_toast-cli"))
        .args([
            "kernels", "compile", "--target", "opencl", "--arch", "gfx900",
        ])
        .output()
        .expect("run toast-cli");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--arch does not apply to --target opencl")
    );
    // An AMD target the installed hiprtc does not know, or a feature its
    // processor lacks: Debian's comgr aborted the process on them
    // (`munmap_chunk(): invalid pointer`, signal 6); now checked first.
    for (arch, says) in [
        (
            "gfx9999",
            "gfx9999 is not a processor this hiprtc can target",
        ),
        ("gfx1030:xnack+", "gfx1030 has no xnack feature"),
        ("gfx90a:bogus+", "`bogus+` is not a target feature"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_toast-cli"))
            .args(["kernels", "compile", "--target", "hip", "--arch", arch])
            .output()
            .expect("run toast-cli");
        let stderr = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(1) => assert!(stderr.contains(says), "{arch}: {stderr}"),
            Some(3) => println!("SKIPPED: hip {arch}: {}", stderr.trim()),
            other => panic!("{arch}: exited {other:?}: {stderr}"),
        }
    }
}
