//! The bound on a thread count, one rule for the host (`--threads`,
//! `RAYON_NUM_THREADS`) and the CPU plugin (`threads=`): a pool may
//! oversubscribe the cores available to the process at most
//! [`MAX_THREADS_PER_CORE`] times. More only adds scheduling overhead, and
//! ten thousand threads took minutes to start.

/// How many times a pool may oversubscribe the cores.
pub const MAX_THREADS_PER_CORE: usize = 4;

/// The cores available to this process (its affinity mask, cgroup quota;
/// 1 where they cannot be read).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |c| c.get())
}

/// Why a pool of `n` threads is beyond the bound (`at most MAX (4 x the C
/// core(s) available to this process)`), or `None` where it is within.
pub fn beyond_bound(n: usize) -> Option<String> {
    let cores = available_cores();
    let max = MAX_THREADS_PER_CORE * cores;
    (n > max).then(|| {
        format!(
            "at most {max} ({MAX_THREADS_PER_CORE} x the {cores} core(s) available to this process)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_a_multiple_of_the_cores() {
        let max = MAX_THREADS_PER_CORE * available_cores();
        assert_eq!(beyond_bound(1), None);
        assert_eq!(beyond_bound(max), None);
        let why = beyond_bound(max + 1).expect("one more than the bound");
        assert!(why.starts_with(&format!("at most {max} (")), "{why}");
    }
}
