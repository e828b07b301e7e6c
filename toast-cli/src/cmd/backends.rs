//! `toast-cli backends`: every backend plugin found, what it offers, and
//! every plugin file that could not be used, with why.
//!
//! For each plugin: name, version and description, its file and where it
//! was found (explicit, env, exe-dir, system), its ABI version, whether its
//! kernels take host addresses, its status (available, or unavailable with
//! the plugin's reason), its devices and the kernels it implements and
//! lacks. Then the plugins shadowed by an earlier one of the same name, the
//! files that failed to load, and the locations searched.

use anyhow::Context;
use std::io::{self, Write};
use toast_accel::abi::{DeviceMemoryKind, Kernel};
use toast_accel::host::registry::PluginEntry;
use toast_accel::host::Registry;

/// Print the listing to standard output. Returns the exit code: 0 when at
/// least one backend is available, 1 otherwise (nothing found, nothing that
/// initialises); an error when standard output fails.
pub fn run(registry: &Registry) -> anyhow::Result<i32> {
    let mut out = crate::console::Stdout;
    render(registry, &mut out)
        .and_then(|code| out.flush().map(|_| code))
        .context("cannot write the listing")
}

/// Write the listing to `out`; returns the exit code as [`run`] does.
/// Initialises every backend (to learn its status and devices).
pub fn render(registry: &Registry, out: &mut dyn Write) -> io::Result<i32> {
    registry.init_all();
    let entries = registry.entries();
    let available = entries.iter().filter(|e| e.backend().is_ok()).count();
    writeln!(
        out,
        "Backend plugins: {} found, {} available",
        entries.len(),
        available
    )?;
    for e in entries {
        writeln!(out)?;
        entry(e, out)?;
    }

    if !registry.shadowed().is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "Shadowed by an earlier plugin of the same name ({}):",
            registry.shadowed().len()
        )?;
        for s in registry.shadowed() {
            writeln!(
                out,
                "  {} [{}]: `{}` {}, shadowed by {} [{}]",
                s.path.display(),
                s.source,
                s.name,
                s.version,
                s.winner.display(),
                s.winner_source
            )?;
        }
    }

    if !registry.failures().is_empty() {
        writeln!(out)?;
        writeln!(out, "Failed to load ({}):", registry.failures().len())?;
        for f in registry.failures() {
            writeln!(out, "  [{}] {}", f.source, f.error)?;
        }
    }

    if !registry.searched().is_empty() {
        writeln!(out)?;
        writeln!(out, "Searched, in order:")?;
        for l in registry.searched() {
            writeln!(out, "  {l}")?;
        }
    }

    if available == 0 {
        writeln!(out)?;
        writeln!(
            out,
            "No backend is available. Build the CPU plugin (`cargo build`) or point \
             --backend-path or {} at a directory holding {}.",
            toast_accel::host::discovery::ENV_VAR,
            toast_accel::host::discovery::plugin_file_name("<name>")
        )?;
        return Ok(1);
    }
    Ok(0)
}

fn entry(e: &PluginEntry, out: &mut dyn Write) -> io::Result<()> {
    let p = e.plugin();
    write!(out, "{} {}", p.name, p.version)?;
    if !p.description.is_empty() {
        write!(out, " - {}", p.description)?;
    }
    writeln!(out)?;
    writeln!(out, "  path:      {}", p.path.display())?;
    if e.location() == p.path {
        writeln!(out, "  found:     {}", e.source())?;
    } else {
        writeln!(
            out,
            "  found:     {} ({})",
            e.source(),
            e.location().display()
        )?;
    }
    writeln!(out, "  ABI:       {}.{}", p.abi_major, p.abi_minor)?;
    writeln!(
        out,
        "  memory:    {}",
        if p.host_addressable() {
            "host-addressable (kernels take host arrays)"
        } else {
            "device buffers (the host stages arrays)"
        }
    )?;
    if !e.options().is_empty() {
        writeln!(out, "  options:   {}", e.options())?;
    }
    match e.backend() {
        Ok(b) => {
            writeln!(out, "  status:    available")?;
            match b.device_count() {
                Ok(n) => {
                    writeln!(out, "  devices:   {n}")?;
                    for i in 0..n {
                        match b.device_info(i) {
                            Ok(d) => writeln!(
                                out,
                                "    [{i}] {}: memory {} total, {} free{}; {} compute unit(s){}",
                                d.name,
                                bytes(d.total_memory),
                                bytes(d.free_memory),
                                match d.memory_kind {
                                    DeviceMemoryKind::Unknown => String::new(),
                                    kind => format!(" ({kind} memory)"),
                                },
                                d.compute_units,
                                d.identity
                                    .map_or(String::new(), |u| format!("; UUID {}", uuid(&u)))
                            )?,
                            Err(err) => writeln!(out, "    [{i}] cannot describe: {err}")?,
                        }
                    }
                }
                Err(err) => writeln!(out, "  devices:   cannot count: {err}")?,
            }
        }
        Err(reason) => writeln!(out, "  status:    unavailable: {reason}")?,
    }
    let (have, lack): (Vec<Kernel>, Vec<Kernel>) =
        Kernel::ALL.into_iter().partition(|k| k.in_table(&p.table));
    writeln!(
        out,
        "  kernels:   {} of {}{}",
        have.len(),
        Kernel::ALL.len(),
        list(&have)
    )?;
    if !lack.is_empty() {
        writeln!(
            out,
            "  missing:   {} (dispatch falls back){}",
            lack.len(),
            list(&lack)
        )?;
    }
    Ok(())
}

fn list(kernels: &[Kernel]) -> String {
    if kernels.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = kernels.iter().map(|k| k.name()).collect();
    format!(": {}", names.join(", "))
}

/// A device UUID in the 8-4-4-4-12 hex digits of RFC 4122 (as `nvidia-smi
/// -L` writes it after its `GPU-`).
fn uuid(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// A byte count for people: `unknown` for 0, else in KiB/MiB/GiB.
fn bytes(n: u64) -> String {
    if n == 0 {
        return "unknown".into();
    }
    human_bytes(n)
}

/// A byte count for people: `N B` below 1 KiB, else in KiB/MiB/GiB/TiB.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{c_char, c_void};
    use std::path::PathBuf;
    use toast_accel::abi::{self, BackendTable, DeviceInfo, NoiseWeightArgs, Status};
    use toast_accel::host::{DiscoveryOptions, Plugin, Source};

    unsafe extern "C" fn init_ok(_h: *const abi::HostApi, ctx: *mut *mut c_void) -> Status {
        // SAFETY: the host passes a valid out pointer.
        unsafe { *ctx = std::ptr::null_mut() };
        abi::OK
    }
    unsafe extern "C" fn init_down(_h: *const abi::HostApi, _c: *mut *mut c_void) -> Status {
        abi::ERR_UNAVAILABLE
    }
    unsafe extern "C" fn last_error() -> *const c_char {
        c"no GPU in this test".as_ptr()
    }
    unsafe extern "C" fn count(_c: *mut c_void, n: *mut u32) -> Status {
        // SAFETY: the host passes a valid out pointer.
        unsafe { *n = 1 };
        abi::OK
    }
    unsafe extern "C" fn info(_c: *mut c_void, _i: u32, d: *mut DeviceInfo) -> Status {
        let mut name = [0 as c_char; 128];
        for (dst, src) in name.iter_mut().zip(b"Test Device") {
            *dst = *src as c_char;
        }
        // SAFETY: the host passes a valid out pointer.
        unsafe {
            *d = DeviceInfo {
                name,
                total_memory: 3 << 30,
                free_memory: 0,
                compute_units: 7,
                peak_held_mib: 0,
                memory_kind: abi::DEVICE_MEMORY_OWN,
                reserved: 0,
                uuid: [0; 16],
            }
        };
        abi::OK
    }
    unsafe extern "C" fn nw(_c: *mut c_void, _a: *const NoiseWeightArgs) -> Status {
        abi::OK
    }

    fn plugin(name: &str, available: bool, flags: u32) -> Plugin {
        Plugin {
            path: PathBuf::from(format!("/plugins/libtoast_backend_{name}.so")),
            name: name.into(),
            version: "9.8.7".into(),
            description: format!("{name} for tests"),
            abi_major: abi::ABI_MAJOR,
            abi_minor: abi::ABI_MINOR,
            flags,
            table: BackendTable {
                init: Some(if available { init_ok } else { init_down }),
                last_error: Some(last_error),
                device_count: Some(count),
                device_info: Some(info),
                noise_weight: Some(nw),
                ..BackendTable::default()
            },
        }
    }

    fn listing(reg: &Registry) -> (String, i32) {
        let mut buf = Vec::new();
        let code = render(reg, &mut buf).unwrap();
        (String::from_utf8(buf).unwrap(), code)
    }

    #[test]
    fn lists_plugins_status_devices_kernels_and_failures() {
        let missing = std::env::temp_dir().join("toast-cli-no-such-plugin.so");
        let mut reg = Registry::discover(&DiscoveryOptions::only([missing.clone()]));
        assert!(reg.register(
            plugin("tcpu", true, abi::FLAG_HOST_ADDRESSABLE),
            Source::Builtin,
            "threads=2"
        ));
        assert!(reg.register(plugin("tgpu", false, 0), Source::Builtin, ""));
        assert!(!reg.register(
            plugin("tcpu", true, abi::FLAG_HOST_ADDRESSABLE),
            Source::System,
            ""
        ));
        let (text, code) = listing(&reg);
        assert_eq!(code, 0, "{text}");
        let n = abi::Kernel::ALL.len();
        let abi_line = format!("  ABI:       {}.{}", abi::ABI_MAJOR, abi::ABI_MINOR);
        let kernels_line = format!("  kernels:   1 of {n}: noise_weight");
        let missing_line = format!(
            "  missing:   {} (dispatch falls back): pointing_detector, pixels_healpix",
            n - 1
        );
        for needle in [
            "Backend plugins: 2 found, 1 available",
            "tcpu 9.8.7 - tcpu for tests",
            "  path:      /plugins/libtoast_backend_tcpu.so",
            "  found:     builtin",
            abi_line.as_str(),
            "  memory:    host-addressable",
            "  options:   threads=2",
            "  status:    available",
            "  devices:   1",
            "    [0] Test Device: memory 3.0 GiB total, unknown free (its own memory); 7 compute \
             unit(s)",
            kernels_line.as_str(),
            missing_line.as_str(),
            "  memory:    device buffers",
            "  status:    unavailable: no GPU in this test",
            "Shadowed by an earlier plugin of the same name (1):",
            "[system]: `tcpu` 9.8.7, shadowed by /plugins/libtoast_backend_tcpu.so [builtin]",
            "Failed to load (1):",
            "Searched, in order:",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(
            text.contains(&format!("  [explicit] {}: no such file", missing.display())),
            "{text}"
        );
        // The unavailable backend lists no devices.
        let gpu = &text[text.find("tgpu 9.8.7").unwrap()..];
        let gpu = &gpu[..gpu.find("\n\n").unwrap_or(gpu.len())];
        assert!(!gpu.contains("devices"), "{gpu}");
    }

    #[test]
    fn nothing_available_is_exit_code_1() {
        let mut reg = Registry::new();
        let (text, code) = listing(&reg);
        assert_eq!(code, 1);
        assert!(
            text.contains("Backend plugins: 0 found, 0 available"),
            "{text}"
        );
        assert!(text.contains("No backend is available"), "{text}");
        reg.register(plugin("tgpu", false, 0), Source::Builtin, "");
        assert_eq!(listing(&reg).1, 1);
    }

    #[test]
    fn byte_counts() {
        assert_eq!(bytes(0), "unknown");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(80 << 30), "80.0 GiB");
    }
}
