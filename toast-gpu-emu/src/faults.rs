//! Injected device faults and call counts (`TOAST_EMU_FAIL`,
//! `TOAST_EMU_COUNTS`; see the crate's documentation): every entry point
//! goes through [`crate::call`], which asks [`before_call`] first.

use crate::EmuError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The kinds of driver call a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// Device allocations.
    Alloc,
    /// Copies and fills.
    Copy,
    /// Kernel launches.
    Launch,
    /// Stream synchronizations.
    Sync,
}

impl CallKind {
    /// Every kind, in the order of the counts file.
    pub const ALL: [CallKind; 4] = [
        CallKind::Alloc,
        CallKind::Copy,
        CallKind::Launch,
        CallKind::Sync,
    ];

    /// The name in `TOAST_EMU_FAIL` and the counts file.
    pub fn name(self) -> &'static str {
        match self {
            CallKind::Alloc => "alloc",
            CallKind::Copy => "copy",
            CallKind::Launch => "launch",
            CallKind::Sync => "sync",
        }
    }

    /// The kind of the entry point `name`, if it is one that is counted.
    pub fn of_call(name: &str) -> Option<CallKind> {
        Some(match name {
            "cuMemAlloc_v2" | "hipMalloc" => CallKind::Alloc,
            "cuMemcpyHtoDAsync_v2"
            | "cuMemcpyDtoHAsync_v2"
            | "cuMemcpyDtoDAsync_v2"
            | "cuMemsetD8Async"
            | "hipMemcpyAsync"
            | "hipMemsetAsync" => CallKind::Copy,
            "cuLaunchKernel" | "hipModuleLaunchKernel" => CallKind::Launch,
            "cuStreamSynchronize" | "hipStreamSynchronize" => CallKind::Sync,
            _ => return None,
        })
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The call `TOAST_EMU_FAIL` makes fail: its kind and 1-based number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The kind of call.
    pub kind: CallKind,
    /// Which call of that kind (1 is the first).
    pub nth: u64,
    /// Whether every later call of the kind fails too (`KIND:N+`): a
    /// device whose memory is exhausted stays so, where a single failed
    /// allocation is absorbed by the memory pool's retry.
    pub and_later: bool,
}

impl Fault {
    /// `KIND:N` (`alloc:3`) or `KIND:N+` (`alloc:3+`), or why not.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let (k, n) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}` is not KIND:N"))?;
        let (n, and_later) = match n.trim().strip_suffix('+') {
            Some(n) => (n, true),
            None => (n, false),
        };
        let kind = CallKind::ALL
            .into_iter()
            .find(|c| c.name() == k.trim())
            .ok_or_else(|| format!("unknown call kind `{k}` (alloc, copy, launch, sync)"))?;
        let nth = n
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| format!("`{n}` is not a call number (1, 2, ...)"))?;
        Ok(Fault {
            kind,
            nth,
            and_later,
        })
    }
}

/// A malformed variable, reported once and ignored.
fn warn_bad(var: &str, why: &str) {
    eprintln!("toast-gpu-emu: {var} ignored: {why}");
}

fn fault() -> Option<Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let v = std::env::var("TOAST_EMU_FAIL").ok()?;
        if v.trim().is_empty() {
            return None;
        }
        Fault::parse(&v)
            .map_err(|why| warn_bad("TOAST_EMU_FAIL", &why))
            .ok()
    })
}

/// A byte count from the environment variable `var`: digits, optionally
/// followed by `K`, `M` or `G` (powers of 1024); `None` when unset, and
/// when malformed (reported).
pub fn env_bytes(var: &str) -> Option<u64> {
    let v = std::env::var(var).ok()?;
    let t = v.trim();
    let (digits, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n = digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift));
    if n.is_none() {
        warn_bad(var, &format!("`{v}` is not a byte count"));
    }
    n
}

static COUNTS: [AtomicU64; 4] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

/// Count the call `name` and fail it if it is the one `TOAST_EMU_FAIL`
/// names; with `TOAST_EMU_COUNTS`, write the counts after each counted
/// call.
pub fn before_call(name: &str) -> Result<(), EmuError> {
    let Some(kind) = CallKind::of_call(name) else {
        return Ok(());
    };
    let n = COUNTS[kind.index()].fetch_add(1, Ordering::Relaxed) + 1;
    if let Some(path) = std::env::var_os("TOAST_EMU_COUNTS").filter(|p| !p.is_empty()) {
        let text: String = CallKind::ALL
            .iter()
            .map(|k| {
                format!(
                    "{} {}\n",
                    k.name(),
                    COUNTS[k.index()].load(Ordering::Relaxed)
                )
            })
            .collect();
        let _ = std::fs::write(path, text);
    }
    match fault() {
        Some(f) if f.kind == kind && (f.nth == n || (f.and_later && n > f.nth)) => {
            let msg = format!("{name}: {} call #{n} failed (TOAST_EMU_FAIL)", kind.name());
            Err(match kind {
                CallKind::Alloc => EmuError::OutOfMemory(msg),
                _ => EmuError::Injected(msg),
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_name_their_errors() {
        assert_eq!(
            Fault::parse("launch:3"),
            Ok(Fault {
                kind: CallKind::Launch,
                nth: 3,
                and_later: false
            })
        );
        assert!(Fault::parse("alloc:2+").unwrap().and_later);
        assert!(Fault::parse("launch:0")
            .unwrap_err()
            .contains("call number"));
        assert!(Fault::parse("boot:1")
            .unwrap_err()
            .contains("unknown call kind"));
        assert!(Fault::parse("3").unwrap_err().contains("KIND:N"));
        assert_eq!(CallKind::of_call("hipMalloc"), Some(CallKind::Alloc));
        assert_eq!(CallKind::of_call("cuMemsetD8Async"), Some(CallKind::Copy));
        assert_eq!(CallKind::of_call("cuInit"), None);
    }
}
