//! Every shipped TOAST reference case must pass bit for bit on the CPU
//! plugin, loaded as a real plugin (the cdylib, through the ABI), with one
//! thread and with two.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use toast_accel::host::conformance::{run_dir, CaseOutcome};
use toast_accel::host::Plugin;
use toast_testkit::plugins::load;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/toast-kernels/cases")
}

fn run_with(options: &str) {
    let plugin = Arc::new(load("cpu"));
    let backend = plugin.init(options).expect("init the cpu backend");
    let results = run_dir(&backend, &cases_dir());
    let mut passed = 0;
    let mut failures = Vec::new();
    for (path, r) in &results {
        match r {
            Ok(CaseOutcome::Pass) => passed += 1,
            Ok(other) => failures.push(format!("{}: {other}", path.display())),
            Err(e) => failures.push(e.to_string()),
        }
    }
    assert!(
        failures.is_empty(),
        "[{options}] failures:\n{}",
        failures.join("\n")
    );
    assert_eq!(
        passed,
        toast_tests::SHIPPED_CASES,
        "[{options}] expected every shipped case"
    );
}

#[test]
fn all_cases_pass_with_one_thread() {
    run_with("threads=1");
}

#[test]
fn all_cases_pass_with_two_threads() {
    run_with("threads=2");
}

#[test]
fn all_cases_pass_with_many_threads() {
    // More threads than cores: a stress on the decomposition, not on speed.
    run_with("threads=5");
}

#[test]
fn all_cases_pass_through_staged_buffers() {
    // The cpu plugin, presented as a backend that is not host-addressable:
    // the runner then stages every kernel array through alloc / copy /
    // free. The cpu plugin's handles are host addresses, so its kernels
    // still run, and the staging path of the runner is exercised for real.
    let loaded = load("cpu");
    let staged = Plugin {
        flags: loaded.flags & !toast_accel::abi::FLAG_HOST_ADDRESSABLE,
        ..loaded
    };
    let backend = Arc::new(staged).init("threads=2").expect("init");
    assert!(!backend.host_addressable());
    let results = run_dir(&backend, &cases_dir());
    let failures: Vec<String> = results
        .iter()
        .filter_map(|(p, r)| match r {
            Ok(CaseOutcome::Pass) => None,
            Ok(o) => Some(format!("{}: {o}", p.display())),
            Err(e) => Some(e.to_string()),
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(results.len(), toast_tests::SHIPPED_CASES);
    let st = backend.stats().snapshot();
    assert!(st.h2d_calls > 0 && st.d2h_calls > 0, "{st:?}");
    assert_eq!(st.allocs, st.frees, "every staged buffer is freed: {st:?}");
}
