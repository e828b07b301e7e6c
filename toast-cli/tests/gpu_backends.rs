//! The GPU backends end to end through `toast-cli`, on whatever machine the
//! tests run: without the hardware (CI), `verify --backend cuda|hip` must
//! print the reason, skip every case and exit with status 3, and `backends`
//! must list the plugin as found but unavailable with the same reason; with
//! the hardware, every reference case must pass.

use std::process::Command;

fn toast_cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toast-cli"))
        .args(args)
        .output()
        .expect("run toast-cli");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn check(backend: &str) {
    let (code, stdout, stderr) = toast_cli(&["verify", "--backend", backend]);
    match code {
        3 => {
            let prefix = format!("backend `{backend}` is unavailable: ");
            let reason = stderr
                .lines()
                .find_map(|l| l.split_once(&prefix).map(|(_, r)| r.to_string()))
                .unwrap_or_else(|| panic!("no reason printed:\n{stderr}"));
            assert!(!reason.trim().is_empty());
            let last = stdout.lines().last().unwrap_or_default();
            assert!(
                last.starts_with("0 passed, 0 failed, ") && last.ends_with(" skipped"),
                "every case skipped: {last}"
            );
            assert!(
                stdout
                    .lines()
                    .filter(|l| !l.is_empty())
                    .take_while(|l| l.starts_with("SKIP"))
                    .count()
                    > 0
            );
            assert!(!stdout.contains("PASS") && !stdout.contains("FAIL"));
            let (code, list, _) = toast_cli(&["backends"]);
            assert_eq!(code, 0);
            let block: String = list
                .split("\n\n")
                .find(|b| b.starts_with(&format!("{backend} ")))
                .unwrap_or_else(|| panic!("`{backend}` is not listed:\n{list}"))
                .to_string();
            assert!(
                block.contains(&format!("status:    unavailable: {reason}")),
                "{block}"
            );
            println!("SKIPPED: {backend} unavailable: {reason}");
        }
        0 => {
            let last = stdout.lines().last().unwrap_or_default();
            assert!(last.ends_with(" passed, 0 failed"), "{stdout}");
            println!("{backend}: {last}");
        }
        _ => panic!("verify --backend {backend} exited {code}:\n{stdout}\n{stderr}"),
    }
}

#[test]
fn cuda_is_cleanly_unavailable_or_passes() {
    check("cuda");
}

#[test]
fn hip_is_cleanly_unavailable_or_passes() {
    check("hip");
}
