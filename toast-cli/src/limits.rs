//! Bounds on absurd but well-typed option values, checked before any work:
//! a thread count far beyond the cores (minutes of thread start-up), sizes
//! whose arrays would not fit in memory (an abort or a capacity-overflow
//! panic) or whose product overflows. Each refusal names the option, the
//! value and the bound, and exits with status 2.

use anyhow::{bail, Result};
use toast_ops::workflow::presets::{self, gib};

/// `option N` (a thread count): at least 1, within the bound the CPU
/// plugin applies too ([`toast_accel::threads::beyond_bound`]).
pub fn check_threads(option: &str, n: usize) -> Result<()> {
    if n == 0 {
        bail!("{option} 0: must be at least 1");
    }
    if let Some(why) = toast_accel::threads::beyond_bound(n) {
        bail!("{option} {n}: {why}");
    }
    Ok(())
}

/// `RAYON_NUM_THREADS`, which sizes every thread pool not given a count
/// (the run's without `--threads`, the CPU plugin's without `threads=`),
/// bounded as `--threads` is: rayon reads it as it is, so 100000 hung even
/// a dry run (minutes of thread start-up), and a value that is not a count
/// was silently ignored. Unset, empty or 0: rayon's default, a thread per
/// core.
pub fn check_rayon_threads() -> Result<()> {
    const VAR: &str = "RAYON_NUM_THREADS";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(());
    };
    let text = v.to_string_lossy();
    if text.is_empty() {
        return Ok(());
    }
    // As rayon parses it: no sign, no spaces.
    match text.parse::<usize>() {
        Ok(0) => Ok(()),
        Ok(n) => check_threads(VAR, n),
        Err(_) => bail!(
            "{VAR}={text:?}: not a thread count (a whole number; unset, empty or 0 for one \
             thread per core)"
        ),
    }
}

/// The product of `factors`, or `None` when it overflows a `u128`.
pub fn product(factors: &[u128]) -> Option<u128> {
    factors.iter().try_fold(1u128, |acc, &f| acc.checked_mul(f))
}

/// Refuse `what` (the options, as given) when the `bytes` of memory it
/// needs (`None`: more than a `u128` counts) exceed what is available
/// (the tightest of `MemAvailable`, the rlimits and the cgroup's limit:
/// `presets::memory_bound`; where none can be read, the address space's
/// `isize::MAX`).
pub fn check_memory(what: &str, bytes: Option<u128>) -> Result<()> {
    let (limit, name) = match presets::memory_bound() {
        Some(a) => (a.bytes, format!("available (bounded by {})", a.source)),
        None => (isize::MAX as f64, "addressable".to_string()),
    };
    match bytes {
        None => bail!("{what}: the sizes overflow (their product exceeds 2^128 bytes)"),
        Some(b) if b as f64 > limit => bail!(
            "{what}: needs about {} of memory, more than the {} {name}",
            gib(b as f64),
            gib(limit)
        ),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_name_the_option_and_the_limit() {
        assert!(check_threads("--threads", 1).is_ok());
        let e = check_threads("--threads", 0).unwrap_err().to_string();
        assert_eq!(e, "--threads 0: must be at least 1");
        let e = check_threads("--threads", usize::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most") && e.contains("core(s)"), "{e}");
        assert_eq!(product(&[3, 4, 5]), Some(60));
        assert_eq!(product(&[u128::MAX, 2]), None);
        assert!(check_memory("x", Some(1 << 20)).is_ok());
        let e = check_memory("--n-det 9", None).unwrap_err().to_string();
        assert!(e.starts_with("--n-det 9: the sizes overflow"), "{e}");
        let e = check_memory("--n-det 9", Some(1 << 100))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs about") && e.contains("e"), "{e}");
        assert!(!e.contains("000000000"), "compact: {e}");
    }
}
