//! The machine's memory as Linux reports it (`/proc`): what every layer
//! that sizes an allocation from input checks it against.

/// `MemAvailable` of /proc/meminfo in bytes, if readable.
pub fn mem_available() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo_kb(&text, "MemAvailable:").map(|kb| kb * 1024.0)
}

/// What bounds the memory this process can still take, and how much.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryBound {
    /// Bytes this process can still allocate under that bound.
    pub bytes: f64,
    /// The bound, in words: `MemAvailable`, `RLIMIT_AS (ulimit -v)`,
    /// `RLIMIT_DATA (ulimit -d)` or the cgroup's `memory.max` /
    /// `memory.limit_in_bytes` with its directory.
    pub source: String,
    /// Whether it bounds this process alone (an rlimit, or a share:
    /// [`process_share`]) rather than every process of the node (its
    /// `MemAvailable`) or of a cgroup (its limit), which they share.
    pub per_process: bool,
}

/// The tightest bound on the memory this process can still take: the
/// smallest of the node's `MemAvailable`, what is left under the
/// address-space and data rlimits (`RLIMIT_AS` less the address space in
/// use, `VmSize`; `RLIMIT_DATA` less `VmData`), and what is left under the
/// memory limit of this process's cgroup and of each cgroup above it
/// (v2 `memory.max` less `memory.current`; v1 `memory.limit_in_bytes`
/// less `memory.usage_in_bytes`). Batch systems bound jobs by rlimits and
/// cgroups, not by what the node has free. `None` when none can be read.
pub fn memory_bound() -> Option<MemoryBound> {
    memory_bounds()
        .into_iter()
        .min_by(|a, b| a.bytes.total_cmp(&b.bytes))
}

/// This process's share of the memory where `processes` processes of the
/// node share it (a job's ranks on the node, a task farm's runs): each
/// bound of `bounds` that the processes share (`MemAvailable`, a
/// cgroup's limit) divided among them, each that bounds a process alone
/// (an rlimit) whole; the tightest, `per_process`. `None` without bounds.
pub fn process_share(bounds: &[MemoryBound], processes: usize) -> Option<MemoryBound> {
    let n = processes.max(1);
    bounds
        .iter()
        .map(|b| match (b.per_process, n) {
            (true, _) | (false, 1) => MemoryBound {
                per_process: true,
                ..b.clone()
            },
            (false, n) => MemoryBound {
                bytes: b.bytes / n as f64,
                source: format!("{}, shared by {n} processes", b.source),
                per_process: true,
            },
        })
        .min_by(|a, b| a.bytes.total_cmp(&b.bytes))
}

/// Every bound [`memory_bound`] takes the tightest of.
pub fn memory_bounds() -> Vec<MemoryBound> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mut bounds = Vec::new();
    if let Some(a) = mem_available() {
        bounds.push(MemoryBound {
            bytes: a,
            source: "MemAvailable".into(),
            per_process: false,
        });
    }
    if let (Some(limits), Some(status)) = (read("/proc/self/limits"), read("/proc/self/status")) {
        bounds.extend(rlimit_bounds(&limits, &status));
    }
    if let Some(cgroups) = read("/proc/self/cgroup") {
        bounds.extend(cgroup_bounds(
            &cgroups,
            std::path::Path::new("/sys/fs/cgroup"),
        ));
    }
    bounds
}

/// The soft limit of the `/proc/self/limits` line starting `name`, in
/// bytes (`None`: unlimited or absent).
fn soft_limit(limits: &str, name: &str) -> Option<f64> {
    let rest = limits.lines().find_map(|l| l.strip_prefix(name))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// What is left under `RLIMIT_AS` and `RLIMIT_DATA`, from the texts of
/// `/proc/self/limits` and `/proc/self/status`.
fn rlimit_bounds(limits: &str, status: &str) -> Vec<MemoryBound> {
    let mut out = Vec::new();
    for (name, used, source) in [
        ("Max address space", "VmSize:", "RLIMIT_AS (ulimit -v)"),
        ("Max data size", "VmData:", "RLIMIT_DATA (ulimit -d)"),
    ] {
        if let Some(limit) = soft_limit(limits, name) {
            let used = parse_meminfo_kb(status, used).map_or(0.0, |kb| kb * 1024.0);
            out.push(MemoryBound {
                bytes: (limit - used).max(0.0),
                source: format!("{source} of {limit:.0} bytes, {used:.0} in use"),
                per_process: true,
            });
        }
    }
    out
}

/// A cgroup limit file's value in bytes (`None`: `max`, or v1's
/// "unlimited", a value near `i64::MAX`).
fn cgroup_limit(text: &str) -> Option<f64> {
    let v: f64 = text.trim().parse().ok()?;
    (v < 2f64.powi(62)).then_some(v)
}

/// What is left under the memory limits of the cgroups in
/// `/proc/self/cgroup` (`cgroups`, its text) and their ancestors, the
/// hierarchies mounted under `root` (v2 at `root`, v1 at `root/memory`).
fn cgroup_bounds(cgroups: &str, root: &std::path::Path) -> Vec<MemoryBound> {
    let mut out = Vec::new();
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, limit_file, usage_file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                root.join("memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        // The cgroup and every one above it (a namespaced path may not
        // exist under the mount: its ancestors, up to the mount, are read).
        let mut dir = std::path::PathBuf::from(path.trim_start_matches('/'));
        loop {
            let d = base.join(&dir);
            let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
            if let Some(limit) = read(limit_file).as_deref().and_then(cgroup_limit) {
                let used = read(usage_file)
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .unwrap_or(0.0);
                out.push(MemoryBound {
                    bytes: (limit - used).max(0.0),
                    source: format!(
                        "the cgroup's {limit_file} ({}) of {limit:.0} bytes, {used:.0} in use",
                        d.display()
                    ),
                    per_process: false,
                });
            }
            if !dir.pop() {
                break;
            }
        }
    }
    out
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
    fn rlimits_bound_what_is_left() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max data size             unlimited            unlimited            bytes\n\
                      Max address space         12000000000          unlimited            bytes\n";
        let status = "VmSize:\t 1000000 kB\nVmData:\t  500000 kB\n";
        let b = rlimit_bounds(limits, status);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].bytes, 12e9 - 1024e6);
        assert!(b[0].source.starts_with("RLIMIT_AS"), "{}", b[0].source);
    }

    #[test]
    fn cgroup_limits_of_v1_and_v2_and_ancestors() {
        let root = std::env::temp_dir().join(format!("toast-cgroup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let job = root.join("batch/job7");
        std::fs::create_dir_all(&job).unwrap();
        std::fs::write(root.join("batch/memory.max"), "8000\n").unwrap();
        std::fs::write(root.join("batch/memory.current"), "1000\n").unwrap();
        std::fs::write(job.join("memory.max"), "max\n").unwrap();
        std::fs::write(job.join("memory.current"), "900\n").unwrap();
        let v1 = root.join("memory/slurm");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "5000\n").unwrap();
        std::fs::write(v1.join("memory.usage_in_bytes"), "4000\n").unwrap();
        std::fs::write(
            root.join("memory/memory.limit_in_bytes"),
            "9223372036854771712",
        )
        .unwrap();
        let b = cgroup_bounds("0::/batch/job7\n", &root);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].bytes, 7000.0);
        assert!(b[0].source.contains("memory.max"), "{}", b[0].source);
        let b = cgroup_bounds("4:memory:/slurm\n1:cpu:/\n", &root);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(b[0].bytes, 1000.0);
        assert!(b[0].source.contains("memory.limit_in_bytes"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_share_divides_the_shared_bounds_only() {
        let bound = |bytes: f64, source: &str, per_process| MemoryBound {
            bytes,
            source: source.into(),
            per_process,
        };
        let bounds = [
            bound(8e9, "MemAvailable", false),
            bound(3e9, "RLIMIT_AS (ulimit -v)", true),
        ];
        // One process: the tightest as it is.
        let one = process_share(&bounds, 1).unwrap();
        assert_eq!(
            (one.bytes, one.source.as_str()),
            (3e9, "RLIMIT_AS (ulimit -v)")
        );
        // Four: the node's memory a quarter each, under the rlimit.
        let four = process_share(&bounds, 4).unwrap();
        assert_eq!(
            (four.bytes, four.source.as_str(), four.per_process),
            (2e9, "MemAvailable, shared by 4 processes", true)
        );
        // Two: the rlimit, which each process has whole, is the tighter.
        assert_eq!(process_share(&bounds, 2).unwrap().bytes, 3e9);
        assert_eq!(process_share(&[], 2), None);
    }

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
