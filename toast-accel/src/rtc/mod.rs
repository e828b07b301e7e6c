//! Run-time compilation of the shared device source, for the GPU plugins and
//! `toast-cli kernels compile` (feature `rtc`): NVRTC ([`nvrtc`]) and hiprtc
//! ([`hiprtc`]) loaded with `libloading` (a missing library or symbol is an
//! error value, never a panic, and nothing is needed to build), the on-disk
//! cache of compiled modules, and the mapping of a compiler error to the
//! kernel it falls in.
//!
//! These live here rather than in the plugins because a plugin's rlib cannot
//! be linked into another binary next to a second plugin (each exports the
//! same entry symbol), and the command line needs both compilers.

pub mod hiprtc;
pub mod nvrtc;

use std::path::PathBuf;

/// Code a run-time compiler produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// A cubin (`sm_XY`), NUL-terminated PTX (`compute_XY`) or an AMD code
    /// object (`gfxNNN`).
    pub code: Vec<u8>,
    /// `"cubin"`, `"ptx"` or `"code object"`.
    pub kind: &'static str,
    /// The compiler log (warnings), possibly empty.
    pub log: String,
}

/// A failed compilation: the compiler status and its log.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}{}", log_section(.log))]
pub struct CompileError {
    /// The compiler status, as a sentence.
    pub message: String,
    /// The compiler log (possibly empty).
    pub log: String,
}

/// The log of a [`CompileError`] as a section after its message, or nothing
/// when the log is empty.
fn log_section(log: &str) -> String {
    if log.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- compiler log ---\n{}", log.trim_end())
    }
}

/// The message of a library-loading error with its cause (`dlerror()`'s
/// text), e.g. "libcuda.so.1: cannot open shared object file: No such file
/// or directory", rather than libloading's bare "dlopen failed".
pub fn dl_error(e: &libloading::Error) -> String {
    std::error::Error::source(e).map_or_else(|| e.to_string(), |s| s.to_string())
}

/// A library given by path (with a `/`, as `TOAST_NVRTC_LIB` and
/// `TOAST_HIPRTC_LIB` give it) must be a regular file before the dynamic
/// loader opens it: `dlopen` of a FIFO blocks forever
/// (`toast_core::input::open_regular`). A bare name is the loader's search.
pub fn check_library_path(path: &std::path::Path) -> Result<(), String> {
    if path.as_os_str().as_encoded_bytes().contains(&b'/') {
        toast_core::input::open_regular(path).map_err(
            |e| match toast_core::input::not_regular(&e) {
                Some(n) => n.to_string(),
                None => format!("{}: {e}", path.display()),
            },
        )?;
    }
    Ok(())
}

/// Whether the switch in environment variable `var` (`TOAST_KERNEL_CACHE`,
/// `TOAST_OPENCL_CACHE`) turns a cache off: `0`, `off`, `false` or `no`
/// (any case) do; unset, empty, `1`, `on`, `true` or `yes` leave it on.
/// Any other value is an error naming the variable, which the GPU plugins
/// return from `init`; a caller past that check reads an error as off.
pub fn cache_switch_off(var: &str) -> Result<bool, String> {
    let Ok(value) = std::env::var(var) else {
        return Ok(false);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "0" | "off" | "false" | "no" => Ok(true),
        "" | "1" | "on" | "true" | "yes" => Ok(false),
        _ => Err(format!(
            "environment variable {var}: `{value}` is not a switch (0, off, false or no turn the \
             cache off; 1, on, true or yes leave it on)"
        )),
    }
}

/// The directory compiled modules are cached in: `$TOAST_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/toast-rs`, else `~/.cache/toast-rs`; `None` when none
/// of these variables is set or `TOAST_KERNEL_CACHE` turns the cache off
/// ([`cache_switch_off`]).
pub fn cache_dir() -> Option<PathBuf> {
    if cache_switch_off("TOAST_KERNEL_CACHE").unwrap_or(true) {
        return None;
    }
    let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = nonempty("TOAST_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let base = nonempty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| nonempty("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("toast-rs"))
}

/// A compiled module's place in the disk cache and what it was built for.
///
/// # The entry format
///
/// A cache entry is [`CACHE_MAGIC`], then the identity's length (u32, little
/// endian) and bytes, the code's length (u64) and the FNV-1a hash of the
/// identity and the code together (u64), then the code. A file cut short
/// (a disk that filled while it was written), damaged, of an older format or
/// built for another compiler or device (its identity differs from the
/// key's) is refused by [`cache_read`] with the reason, before any driver
/// sees it: a driver handed a truncated program binary may crash (PoCL did,
/// with SIGSEGV, in every later run). Entries are written to a temporary
/// file in the same directory, flushed and renamed, so no reader ever sees a
/// partial one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    /// The file name in [`cache_dir`] (source hash and target in the name).
    pub file: String,
    /// The compiler, its version and the device or driver the code is for,
    /// stored in the entry and compared on every read.
    pub identity: String,
}

/// The first bytes of every cache entry (the format's version in the last).
pub const CACHE_MAGIC: &[u8; 8] = b"TOASTKC\x01";

/// The largest cache entry read (a module is a few MiB).
const MAX_CACHE_ENTRY: u64 = 1 << 30;

/// The entry of `code` built for `identity` (see [`CacheKey`]).
pub fn cache_entry(identity: &str, code: &[u8]) -> Vec<u8> {
    let mut e = Vec::with_capacity(code.len() + identity.len() + 28);
    e.extend_from_slice(CACHE_MAGIC);
    e.extend_from_slice(&(identity.len() as u32).to_le_bytes());
    e.extend_from_slice(identity.as_bytes());
    e.extend_from_slice(&(code.len() as u64).to_le_bytes());
    e.extend_from_slice(&entry_hash(identity, code).to_le_bytes());
    e.extend_from_slice(code);
    e
}

fn entry_hash(identity: &str, code: &[u8]) -> u64 {
    let mut bytes = Vec::with_capacity(identity.len() + 1 + code.len());
    bytes.extend_from_slice(identity.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(code);
    crate::device_source::fnv1a(&bytes)
}

/// The code of `entry` if it is a whole entry built for `identity`, else
/// why not.
pub fn cache_code<'a>(identity: &str, entry: &'a [u8]) -> Result<&'a [u8], String> {
    fn take<'a>(b: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("cut short in its {what}"));
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let mut b = entry;
    if take(&mut b, CACHE_MAGIC.len(), "header")? != CACHE_MAGIC {
        return Err("not a toast-rs cache entry of this version".into());
    }
    let n = u32::from_le_bytes(take(&mut b, 4, "header")?.try_into().expect("4 bytes"));
    let stored = take(&mut b, n as usize, "identity")?;
    if stored != identity.as_bytes() {
        return Err(format!(
            "built for `{}`, not `{identity}`",
            String::from_utf8_lossy(stored)
        ));
    }
    let len = u64_at(take(&mut b, 8, "header")?);
    let hash = u64_at(take(&mut b, 8, "header")?);
    if b.len() as u64 != len {
        return Err(format!(
            "{} bytes of code where its header says {len}",
            b.len()
        ));
    }
    if entry_hash(identity, b) != hash {
        return Err("its checksum does not match its code".into());
    }
    Ok(b)
}

/// The cached code of `key`: `Ok(None)` when there is none (or no cache),
/// `Err` with the reason when the entry is refused (see [`CacheKey`]); a
/// refused entry is removed, so the caller compiles again and rewrites it.
pub fn cache_read(key: &CacheKey) -> Result<Option<Vec<u8>>, String> {
    let Some(dir) = cache_dir() else {
        return Ok(None);
    };
    let path = dir.join(&key.file);
    let entry = match toast_core::input::read_regular(&path, MAX_CACHE_ENTRY) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be read: {e}")),
    };
    match cache_code(&key.identity, &entry) {
        Ok(code) => Ok(Some(code.to_vec())),
        Err(reason) => {
            cache_discard(key);
            Err(reason)
        }
    }
}

/// Remove the entry of `key` (one its driver refused, or a damaged one);
/// only a regular file is removed.
pub fn cache_discard(key: &CacheKey) {
    if let Some(path) = cache_dir().map(|d| d.join(&key.file)) {
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Store a module in the cache (best effort: a read-only or full cache is
/// not an error). Written to a temporary file of this process and thread,
/// flushed to the disk and renamed, so readers see the whole entry or the
/// previous one, never a partial file; the temporary file is removed
/// whatever happens.
pub fn cache_write(key: &CacheKey, code: &[u8]) {
    use std::io::Write;
    let Some(dir) = cache_dir() else { return };
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{}.{}-{seq}.tmp", key.file, std::process::id()));
    let written = std::fs::File::create_new(&tmp).and_then(|mut f| {
        f.write_all(&cache_entry(&key.identity, code))?;
        f.sync_all()
    });
    if written.is_ok() {
        let _ = std::fs::rename(&tmp, dir.join(&key.file));
    }
    let _ = std::fs::remove_file(&tmp);
}

/// The kernel a compiler log's first error falls in: the last `KERNEL`
/// (or `DEVICE_FN` helper) definition at or before the error's line of
/// `kernels.h` (logs read
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
        let l = l.trim_start();
        if let Some(rest) = l.strip_prefix("KERNEL void ") {
            name = rest.split('(').next().map(|n| n.trim().to_string());
        } else if let Some(rest) = l.strip_prefix("DEVICE_FN ") {
            // `DEVICE_FN type name(`: the helper, named as such.
            if let Some(n) = rest
                .split('(')
                .next()
                .and_then(|h| h.split_whitespace().last())
            {
                name = Some(format!("(helper {n})"));
            }
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
    use super::*;

    #[test]
    fn cache_switches_read_the_usual_spellings_and_refuse_others() {
        // A variable of this test's own: tests run in parallel.
        let var = "TOAST_RTC_TEST_CACHE_SWITCH";
        std::env::remove_var(var);
        assert_eq!(cache_switch_off(var), Ok(false));
        for (value, off) in [
            ("0", true),
            ("off", true),
            (" FALSE ", true),
            ("no", true),
            ("", false),
            ("1", false),
            ("On", false),
            ("true", false),
            ("yes", false),
        ] {
            std::env::set_var(var, value);
            assert_eq!(cache_switch_off(var), Ok(off), "{value:?}");
        }
        std::env::set_var(var, "garbage");
        let e = cache_switch_off(var).unwrap_err();
        assert!(
            e.contains(&format!("{var}: `garbage` is not a switch")),
            "{e}"
        );
        std::env::remove_var(var);
    }

    /// Every damage to an entry is refused with its reason, before the
    /// code reaches a driver: each truncation, each flipped byte, another
    /// identity, another format.
    #[test]
    fn damaged_cache_entries_are_refused() {
        use super::{cache_code, cache_entry};
        let code: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let id = "opencl program binary; device X; platform P; driver 1";
        let e = cache_entry(id, &code);
        assert_eq!(cache_code(id, &e).unwrap(), &code[..]);
        for n in 0..e.len() {
            assert!(cache_code(id, &e[..n]).is_err(), "cut to {n} bytes");
        }
        for i in 0..e.len() {
            let mut d = e.clone();
            d[i] ^= 0x10;
            assert!(cache_code(id, &d).is_err(), "byte {i} flipped");
        }
        let r = cache_code("opencl program binary; device Y", &e).unwrap_err();
        assert!(r.contains("built for") && r.contains("device X"), "{r}");
        let r = cache_code(id, &code).unwrap_err();
        assert!(r.contains("not a toast-rs cache entry"), "{r}");
        let mut longer = e.clone();
        longer.push(0);
        assert!(cache_code(id, &longer).unwrap_err().contains("header says"));
    }

    /// A source with an error in one kernel: the compiler's log comes back
    /// and names the line, which maps to that kernel. Runs with whichever
    /// compilers are installed (CI has both).
    #[test]
    fn a_compile_error_gives_the_log_and_the_kernel() {
        use crate::device_source::{Target, PRELUDE_CUDA, PRELUDE_HIP};
        let bad = |prelude: &str| {
            format!(
                "{prelude}\n#line 1 \"kernels.h\"\nKERNEL void toast_ok(i64 n) {{ }}\n\nKERNEL void toast_bad(i64 n) {{\n    no_such_function(n);\n}}\n"
            )
        };
        match super::nvrtc::Nvrtc::load() {
            Ok(nv) => {
                let src = bad(PRELUDE_CUDA);
                let e = nv.compile(&src, "bad.cu", "sm_80").unwrap_err();
                assert!(e.log.contains("no_such_function"), "{e}");
                assert_eq!(super::kernel_at_error(&src, &e.log), "toast_bad", "{e}");
            }
            Err(e) => println!("SKIPPED: {}: {e}", Target::Cuda.name()),
        }
        match super::hiprtc::Hiprtc::load() {
            Ok(h) => {
                let src = bad(PRELUDE_HIP);
                let e = h.compile(&src, "bad.hip", "gfx90a").unwrap_err();
                assert!(e.log.contains("no_such_function"), "{e}");
                assert_eq!(super::kernel_at_error(&src, &e.log), "toast_bad", "{e}");
            }
            Err(e) => println!("SKIPPED: {}: {e}", Target::Hip.name()),
        }
    }

    #[test]
    fn options_carry_the_no_contraction_flags() {
        assert!(super::nvrtc::options("sm_80").contains(&"-fmad=false".to_string()));
        assert!(super::nvrtc::options("sm_80").contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(super::hiprtc::options("gfx90a").contains(&"-ffp-contract=off".to_string()));
        assert!(super::hiprtc::options("gfx90a").contains(&"--offload-arch=gfx90a".to_string()));
    }

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
