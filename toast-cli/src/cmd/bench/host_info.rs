//! A description of the machine the bench ran on (Linux `/proc`; best
//! effort): CPU model, logical CPUs, memory and load average.

/// The 1-minute load average (Linux /proc/loadavg).
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// CPU model, logical CPUs and memory of this machine (Linux /proc; best effort).
pub fn machine_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    match toast_ops::workflow::presets::mem_total() {
        Some(bytes) => format!(
            "{cpu}, {ncpu} logical CPUs, {:.1} GiB RAM",
            bytes / (1u64 << 30) as f64
        ),
        None => format!("{cpu}, {ncpu} logical CPUs"),
    }
}
