//! The backend context: thread pool, host logging, buffer registry.

use crate::memory::Registry;
use toast_accel::abi::{self, HostApi};
use toast_accel::plugin_support::{HostLog, HostSettings, PluginError};

/// What `init` creates and every call receives as `ctx`.
#[derive(Debug)]
pub(crate) struct CpuContext {
    /// A dedicated pool when a thread count was asked for; otherwise the
    /// rayon global pool is used.
    pool: Option<rayon::ThreadPool>,
    log: HostLog,
    /// The host's ABI minor (0 without a host API): `device_info` writes
    /// only the fields its struct has.
    pub(crate) host_abi_minor: u32,
    pub(crate) registry: Registry,
}

impl CpuContext {
    /// Parse the host API and options and build the context.
    ///
    /// # Safety
    /// `host` is null or points to a `HostApi` of at least `host.size`
    /// bytes whose `options` is null or NUL-terminated.
    pub(crate) unsafe fn new(host: *const HostApi) -> Result<CpuContext, PluginError> {
        // SAFETY: the caller's contract.
        let HostSettings {
            log,
            options,
            abi_minor: host_abi_minor,
        } = unsafe { HostSettings::read(host) };
        let mut threads: Option<usize> = None;
        if let Ok(v) = std::env::var("TOAST_CPU_THREADS") {
            if !v.trim().is_empty() {
                threads = Some(parse_threads(&v, "environment variable TOAST_CPU_THREADS")?);
            }
        }
        for item in options.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            match k.trim() {
                "threads" => threads = Some(parse_threads(v, "option threads")?),
                other => {
                    return Err(PluginError::new(
                        abi::ERR_INVALID_ARGUMENT,
                        format!("unknown option `{other}` (known: threads)"),
                    ))
                }
            }
        }
        let pool = match threads {
            Some(n) if n > 0 => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("toast-cpu-{i}"))
                    .build()
                    .map_err(|e| {
                        PluginError::new(
                            abi::ERR_INTERNAL,
                            format!("cannot start a pool of {n} threads: {e}"),
                        )
                    })?,
            ),
            _ => None,
        };
        let ctx = CpuContext {
            pool,
            host_abi_minor,
            log,
            registry: Registry::default(),
        };
        ctx.log(
            abi::LOG_DEBUG,
            &format!(
                "cpu backend {} initialised: {} threads ({})",
                env!("CARGO_PKG_VERSION"),
                ctx.threads(),
                if ctx.pool.is_some() {
                    "dedicated pool"
                } else {
                    "rayon global pool"
                }
            ),
        );
        Ok(ctx)
    }

    /// Number of threads the kernels run on.
    pub(crate) fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    /// Run `f` on this thread, with this context's pool as the helper of
    /// [`crate::par::split_in_two`] (a short kernel's second half).
    pub(crate) fn inline<R>(&self, f: impl FnOnce() -> R) -> R {
        crate::par::with_helper(self.pool.as_ref(), f)
    }

    /// Run `f` on this context's pool.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Send a message to the host's log callback, if any.
    pub(crate) fn log(&self, level: i32, msg: &str) {
        self.log.log(level, msg);
    }
}

fn parse_threads(v: &str, what: &str) -> Result<usize, PluginError> {
    let n = v.trim().parse::<usize>().map_err(|_| {
        PluginError::invalid(format!(
            "{what}: `{v}` is not a thread count (a non-negative integer; 0 = all cores)"
        ))
    })?;
    if let Some(why) = toast_accel::threads::beyond_bound(n) {
        return Err(PluginError::invalid(format!("{what}: {n} threads; {why}")));
    }
    Ok(n)
}

/// The CPU model name from /proc/cpuinfo, or "cpu".
pub(crate) fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "cpu".to_string())
}

/// Total and available memory in bytes from /proc/meminfo (0 if unknown).
pub(crate) fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb.saturating_mul(1024))
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

#[cfg(test)]
mod tests {
    use super::parse_threads;

    #[test]
    fn thread_counts_are_bounded_by_the_cores() {
        assert_eq!(parse_threads(" 2 ", "option threads").unwrap(), 2);
        assert_eq!(parse_threads("0", "option threads").unwrap(), 0);
        let e = parse_threads("100000", "option threads").unwrap_err();
        assert!(
            e.message
                .contains("option threads: 100000 threads; at most"),
            "{}",
            e.message
        );
        let e = parse_threads("many", "option threads").unwrap_err();
        assert!(
            e.message.contains("`many` is not a thread count"),
            "{}",
            e.message
        );
    }
}
