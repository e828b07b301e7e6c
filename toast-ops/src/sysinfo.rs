//! The machine's memory as Linux reports it (`/proc`): what every layer
//! that sizes an allocation from input checks it against.

/// `MemAvailable` of /proc/meminfo in bytes, if readable.
pub fn mem_available() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_kb(&text, "MemAvailable:").map(|kb| kb * 1024.0)
}

/// `MemTotal` of /proc/meminfo in bytes, if readable.
pub fn mem_total() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_kb(&text, "MemTotal:").map(|kb| kb * 1024.0)
}

fn parse_meminfo_kb(text: &str, key: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Peak resident memory of this process (VmHWM) in bytes, if readable.
pub fn peak_rss() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_meminfo_kb(&text, "VmHWM:").map(|kb| kb * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_in_bytes() {
        assert_eq!(
            parse_meminfo_kb(
                "MemTotal: 10 kB\nMemAvailable:   2048 kB\n",
                "MemAvailable:"
            ),
            Some(2048.0)
        );
        assert_eq!(parse_meminfo_kb("MemTotal: x kB\n", "MemTotal:"), None);
    }
}
