//! Backends for tests: a registry with the CPU plugin and `fakedev`, an
//! execution context over it, and the plugin libraries cargo builds next to
//! the test executables.

use std::fmt::Display;
use std::path::PathBuf;
use std::sync::Arc;
use toast_accel::abi::EntryFn;
use toast_accel::host::discovery::plugin_file_name;
use toast_accel::host::{DispatchPolicy, Dispatcher, Plugin, Registry};
use toast_core::ExecContext;

/// A registry with the CPU plugin (`threads` rayon threads), registered from
/// its rlib entry point as `builtin:cpu`, and [`fakedev`](crate::fakedev)
/// (forwarding to a CPU plugin context with the same thread count).
pub fn registry(threads: usize) -> Arc<Registry> {
    registry_with_fake_device(threads, FakeDevice::Current, "")
}

/// A registry with the CPU plugin (`threads` rayon threads) and
/// [`fakedev7`](crate::fakedev::entry_abi_minor_7): the fake device under a
/// header of ABI minor 7, a plugin built before i32 pixels.
pub fn registry_with_fakedev_minor_7(threads: usize) -> Arc<Registry> {
    registry_with_fake_device(threads, FakeDevice::AbiMinor7, "")
}

/// Which header the fake device registers under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeDevice {
    /// `fakedev`, of the host's ABI minor.
    Current,
    /// `fakedev7`, of ABI minor 7.
    AbiMinor7,
}

/// A registry with the CPU plugin (`threads` rayon threads) and the fake
/// `device`, initialised with `threads={threads}` and `options` (e.g.
/// `;memory=0.12`, a device memory budget for the host's fitter).
pub fn registry_with_fake_device(
    threads: usize,
    device: FakeDevice,
    options: &str,
) -> Arc<Registry> {
    let mut r = registry_with_cpu(threads);
    let opts = format!("threads={threads}{options}");
    let (entry, label): (EntryFn, _) = match device {
        FakeDevice::Current => (crate::fakedev::entry, "builtin:fakedev"),
        FakeDevice::AbiMinor7 => (crate::fakedev::entry_abi_minor_7, "builtin:fakedev7"),
    };
    // SAFETY: both fake device entry points return a pointer to a static,
    // complete header, whose table lives for the whole program.
    unsafe { r.register_entry(entry, label, &opts) }
        .unwrap_or_else(|e| panic!("register {label}: {e}"));
    Arc::new(r)
}

/// A registry with the CPU plugin only (`threads` rayon threads), registered
/// from its rlib entry point as `builtin:cpu`; register more (e.g. a plugin
/// from [`load`]) before sharing it.
pub fn registry_with_cpu(threads: usize) -> Registry {
    let mut r = Registry::new();
    let opts = format!("threads={threads}");
    // SAFETY: the CPU plugin's entry point returns a pointer to its static,
    // complete header, whose table lives for the whole program.
    unsafe { r.register_entry(toast_backend_cpu::toast_backend_entry, "builtin:cpu", &opts) }
        .expect("register the cpu plugin");
    r
}

/// A context whose dispatcher over `registry` uses `policy` (e.g.
/// `"run=fakedev"`; `""` for the default, the CPU).
pub fn context(registry: &Arc<Registry>, policy: &str) -> ExecContext {
    let mut ctx = ExecContext::new();
    let p = DispatchPolicy::parse(policy).expect("policy");
    ctx.insert(Dispatcher::new(Arc::clone(registry), p));
    ctx
}

/// The shared library of backend `name` (`libtoast_backend_<name>.so` on
/// Linux), built by cargo next to the test executable: in its directory
/// (`target/<profile>/deps/`) or one above it, up to `target/`. The crate
/// whose tests call this must have the backend's crate as a dev-dependency,
/// so that cargo builds the library. Panics naming every directory searched
/// when the file is in none of them.
pub fn plugin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let file = plugin_file_name(name);
    let mut searched = Vec::new();
    for dir in exe.ancestors().skip(1) {
        let p = dir.join(&file);
        if p.is_file() {
            return p;
        }
        searched.push(dir.display().to_string());
        if dir.file_name().is_some_and(|n| n == "target") {
            break;
        }
    }
    panic!(
        "{file} not found next to the test executable {}; searched: {} \
         (is the backend's crate a dev-dependency of the crate under test?)",
        exe.display(),
        searched.join(", ")
    );
}

/// Load the plugin of backend `name` from [`plugin_path`] (not initialised).
pub fn load(name: &str) -> Plugin {
    let path = plugin_path(name);
    Plugin::load(&path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
}

/// What a test does when the backend it needs is unavailable (`why`): fail
/// when the environment variable `require` (e.g. `TOAST_REQUIRE_OPENCL`) is
/// set and not empty, as CI sets it where the device is installed; otherwise
/// print `SKIPPED: why` for the test to return early.
pub fn skip_unless_required(require: &str, why: impl Display) {
    let required = std::env::var_os(require).is_some_and(|v| !v.is_empty());
    assert!(
        !required,
        "{require} is set but the backend is unavailable: {why}"
    );
    eprintln!("SKIPPED: {why}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_plugin_names_the_file_and_where_it_looked() {
        let exe = std::env::current_exe().unwrap();
        let panic = std::panic::catch_unwind(|| plugin_path("no_such_backend")).unwrap_err();
        let msg = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.contains(&plugin_file_name("no_such_backend")), "{msg}");
        let deps = exe.parent().unwrap().display().to_string();
        assert!(msg.contains(&format!("searched: {deps}")), "{msg}");
    }

    #[test]
    fn the_cpu_plugin_library_is_found_and_loads() {
        // backend-cpu is a dependency of this crate, so cargo builds its
        // cdylib into the same directory as this test executable.
        let p = plugin_path("cpu");
        assert!(p.ends_with(plugin_file_name("cpu")), "{}", p.display());
        assert_eq!(load("cpu").name, "cpu");
    }
}
