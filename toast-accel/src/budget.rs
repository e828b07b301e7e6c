//! The device memory budget of a GPU plugin, shared by the plugins (which
//! hold their pool within it: `toast-gpu`'s `memory`) and the host (which
//! refuses, before any work, a run whose predicted device peak passes it).
//!
//! One figure, from the first of: the plugin option `memory=GiB`, TOAST's
//! `TOAST_GPU_MEM_GB`, else the default, 90% of the device memory free when
//! the backend starts (of the total where the API cannot tell the free
//! memory, as OpenCL cannot). `TOAST_GPU_MEM_GB` is, as TOAST defines
//! it, the memory of each GPU, and the default is the device's too: where
//! several processes of a node drive the same device (more ranks per node
//! than GPUs; counted by the devices' UUIDs, ABI minor 10), the host plans
//! each within its share of either ([`Budget::shared_by`], as TOAST divides
//! a device's memory by its processes per device), so that together they
//! stay within it: a planning figure, as the plugin's pool holds the whole
//! one (the plugin cannot know the share; its cache of freed blocks is
//! divided by the node's processes instead). The option `memory=` is each
//! process's own and is not divided.
//! For a device in the host's memory (ABI minor
//! 9's `memory_kind`) the host plans within less than that default, what
//! its own peak leaves of a process's share of the node's memory
//! (`toast-ops`' `SatelliteJob::device_budget`): a planning figure, which
//! the plugin's pool does not enforce.

/// The most device memory a backend's pool may hold, and where the figure
/// came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Bytes.
    pub bytes: u64,
    /// Where it came from.
    pub source: BudgetSource,
}

/// Where a [`Budget`] came from: set by the user, or a default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// The plugin option `memory=`.
    Option,
    /// TOAST's `TOAST_GPU_MEM_GB`.
    Environment,
    /// 90% of the device memory free when the backend starts.
    DeviceDefault,
    /// A figure for the whole device, [`BudgetSource::DeviceDefault`] or
    /// [`BudgetSource::Environment`], divided among the processes of the
    /// node that drive the device ([`Budget::shared_by`]).
    DeviceShared {
        /// The processes, this one included (at least 2).
        processes: u32,
        /// The figure was `TOAST_GPU_MEM_GB` (else the default).
        from_environment: bool,
    },
    /// A device in the host's memory without a configured budget: 90% of
    /// what the host's predicted peak leaves of a process's share of the
    /// node's memory (`toast-ops`' `SatelliteJob::device_budget`).
    HostShare,
    /// No limit beyond the device's own.
    Unlimited,
}

impl BudgetSource {
    /// Set by the user (the option or the variable), not a default: the
    /// run is held within it even where that costs host memory, as
    /// streaming the detector data does on a device in the host's memory.
    pub fn is_configured(self) -> bool {
        matches!(
            self,
            BudgetSource::Option
                | BudgetSource::Environment
                | BudgetSource::DeviceShared {
                    from_environment: true,
                    ..
                }
        )
    }
}

impl std::fmt::Display for BudgetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BudgetSource::Option => "option memory=",
            BudgetSource::Environment => "TOAST_GPU_MEM_GB",
            BudgetSource::DeviceDefault => "the default, 90% of the device memory free at start",
            BudgetSource::DeviceShared {
                processes,
                from_environment,
            } => {
                let whole = match from_environment {
                    true => "TOAST_GPU_MEM_GB (the memory of each GPU, as TOAST defines it)",
                    false => "the default, 90% of the device memory free at start",
                };
                return write!(
                    f,
                    "{whole}, divided among the {processes} processes of this node that drive \
                     the device"
                );
            }
            BudgetSource::HostShare => {
                "the default of a device in the host's memory, 90% of what the host's predicted \
                 peak leaves of a process's share of the node's memory"
            }
            BudgetSource::Unlimited => "none",
        })
    }
}

impl Budget {
    /// No limit beyond the device's own.
    pub const UNLIMITED: Budget = Budget {
        bytes: u64::MAX,
        source: BudgetSource::Unlimited,
    };

    /// The default: 90% of `free` device memory (of `total` when the free
    /// memory is unknown, 0).
    pub fn default_for(free: u64, total: u64) -> Budget {
        let base = if free > 0 { free } else { total };
        Budget {
            bytes: base / 10 * 9,
            source: BudgetSource::DeviceDefault,
        }
    }

    /// The largest budget [`Budget::parse_gib`] reads, in GiB (exclusive):
    /// its bytes stay well inside a `u64`.
    pub const MAX_GIB: f64 = 1e9;

    /// A budget for the whole device (the default, `TOAST_GPU_MEM_GB`)
    /// divided among the `processes` of a node that drive it
    /// ([`BudgetSource::DeviceShared`]); unchanged for one process, or for
    /// the option `memory=`, which is each process's own.
    pub fn shared_by(self, processes: usize) -> Budget {
        let from_environment = match self.source {
            BudgetSource::DeviceDefault => false,
            BudgetSource::Environment => true,
            _ => return self,
        };
        if processes <= 1 {
            return self;
        }
        Budget {
            bytes: self.bytes / processes as u64,
            source: BudgetSource::DeviceShared {
                processes: u32::try_from(processes).unwrap_or(u32::MAX),
                from_environment,
            },
        }
    }

    /// `GiB` (a positive number below [`Budget::MAX_GIB`], fractions
    /// allowed) as a budget from `source`.
    pub fn parse_gib(text: &str, source: BudgetSource) -> Result<Budget, String> {
        let gib = text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|g| g.is_finite() && *g > 0.0 && *g < Self::MAX_GIB)
            .ok_or_else(|| {
                format!(
                    "{source}: `{text}` is not a device memory budget in GiB (a positive number \
                     below {:e}, e.g. 16 or 0.25)",
                    Self::MAX_GIB
                )
            })?;
        Ok(Budget {
            bytes: (gib * (1u64 << 30) as f64) as u64,
            source,
        })
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.bytes == u64::MAX {
            return write!(f, "no budget");
        }
        write!(
            f,
            "{:.3} GiB = {} bytes ({})",
            self.bytes as f64 / (1u64 << 30) as f64,
            self.bytes,
            self.source
        )
    }
}

/// The value of the last `key` item of a plugin's `options` (`key=value`
/// pairs separated by `;`; an item without `=` has the value ""), as the
/// plugins read them: the last item of a key wins.
fn option_value<'a>(options: &'a str, key: &str) -> Option<&'a str> {
    options
        .split(';')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| item.split_once('=').unwrap_or((item, "")))
        .rfind(|(k, _)| k.trim() == key)
        .map(|(_, v)| v)
}

/// The most bytes of kernel workspace one launch of a `toast-gpu` plugin
/// allocates (the polynomial filters' fits, the noise simulation's FFT
/// streams): the plugin option `workspace_bytes=N`, else the default. A
/// work item (one fit, one detector's stream) cannot be split: a launch
/// holds at least one, so a configured limit smaller than one item is
/// refused, which the host checks before any work for the noise
/// simulation (`toast-ops`' `SatelliteJob::check_device_workspace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceLimit {
    /// [`WorkspaceLimit::DEFAULT_BYTES`], less on a device whose largest
    /// allocation or an eighth of whose memory is less, but never less than
    /// one work item, where the device's largest allocation holds one (an
    /// hour at 100 Hz needs 16 MiB a detector for the noise, a day 512
    /// MiB).
    Default,
    /// The option `workspace_bytes=N`: at most N bytes (and the device's
    /// largest allocation).
    Option(u64),
}

/// The doubles of one detector's stream in the noise simulation's
/// workspace for an FFT of `fft_len` points (`2 N + 2`: the stages
/// alternate between two halves, `kernels.h`'s "noise simulation"): one
/// work item of a [`WorkspaceLimit`], which cannot be split.
pub const fn noise_stream_doubles(fft_len: u64) -> u64 {
    fft_len.saturating_mul(2).saturating_add(2)
}

impl WorkspaceLimit {
    /// The default limit's bytes, 256 MiB.
    pub const DEFAULT_BYTES: u64 = 256 << 20;

    /// The limit configured by a plugin's `options` (the last
    /// `workspace_bytes` item: a positive number of bytes), else
    /// [`WorkspaceLimit::Default`]: the one reading of the option, by the
    /// plugins and by the host.
    pub fn configured(options: &str) -> Result<WorkspaceLimit, String> {
        let Some(v) = option_value(options, "workspace_bytes") else {
            return Ok(WorkspaceLimit::Default);
        };
        match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok(WorkspaceLimit::Option(n)),
            _ => Err(format!(
                "option workspace_bytes: `{}` is not a positive number of bytes",
                v.trim()
            )),
        }
    }

    /// The most bytes one launch may use for items of `item_bytes` each,
    /// on a device of `max_allocation` bytes' largest allocation and
    /// `total_memory` bytes; `Err(why)` when not even one item fits.
    pub fn launch_bytes(
        self,
        item_bytes: u64,
        max_allocation: u64,
        total_memory: u64,
    ) -> Result<u64, String> {
        let bytes = match self {
            WorkspaceLimit::Option(n) => n.min(max_allocation),
            WorkspaceLimit::Default => WorkspaceLimit::DEFAULT_BYTES
                .min(max_allocation)
                .min(total_memory / 8)
                .max(item_bytes.min(max_allocation)),
        };
        if bytes >= item_bytes {
            return Ok(bytes);
        }
        Err(match self {
            WorkspaceLimit::Option(n) if n < item_bytes => format!(
                "more than the {n} bytes a launch may use (the plugin option workspace_bytes)"
            ),
            _ => format!("more than the device's largest allocation, {max_allocation} bytes"),
        })
    }
}

impl Budget {
    /// The budget configured by a plugin's `options` (`key=value` pairs
    /// separated by `;`: its `memory=`) or the value of `TOAST_GPU_MEM_GB`
    /// (`env`); `None` when neither sets one (the default applies, which
    /// needs the device's memory: [`Budget::default_for`]).
    ///
    /// The one reading of both, by the host (which plans and refuses runs
    /// by it) and by `toast-gpu`'s plugins (whose pool holds it): the last
    /// `memory` item wins, and a `memory` without a value is refused as a
    /// value that is not a number is.
    pub fn configured(options: &str, env: Option<&str>) -> Result<Option<Budget>, String> {
        match (
            option_value(options, "memory"),
            env.filter(|v| !v.trim().is_empty()),
        ) {
            (Some(v), _) => Budget::parse_gib(v, BudgetSource::Option).map(Some),
            (None, Some(v)) => Budget::parse_gib(v, BudgetSource::Environment).map(Some),
            (None, None) => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launch_holds_one_workspace_item_unless_the_option_says_less() {
        assert_eq!(
            WorkspaceLimit::configured("memory=2"),
            Ok(WorkspaceLimit::Default)
        );
        assert_eq!(
            WorkspaceLimit::configured("workspace_bytes=9; workspace_bytes=64"),
            Ok(WorkspaceLimit::Option(64))
        );
        for bad in [
            "workspace_bytes=0",
            "workspace_bytes",
            "workspace_bytes=1e3",
        ] {
            let e = WorkspaceLimit::configured(bad).unwrap_err();
            assert!(e.starts_with("option workspace_bytes: `"), "{e}");
        }
        let (gib, day) = (1u64 << 30, 512u64 << 20 | 16);
        let d = WorkspaceLimit::Default;
        assert_eq!(d.launch_bytes(1000, u64::MAX, 80 * gib), Ok(256 << 20));
        assert_eq!(d.launch_bytes(1000, u64::MAX, gib), Ok(gib / 8));
        // A day's noise stream is one item: more than the default, held.
        assert_eq!(d.launch_bytes(day, u64::MAX, 80 * gib), Ok(day));
        let e = d.launch_bytes(day, 256 << 20, 80 * gib).unwrap_err();
        assert!(e.contains("largest allocation, 268435456 bytes"), "{e}");
        let set = WorkspaceLimit::Option(1 << 20);
        assert_eq!(set.launch_bytes(1000, u64::MAX, 80 * gib), Ok(1 << 20));
        let e = set.launch_bytes(day, u64::MAX, 80 * gib).unwrap_err();
        assert!(
            e.contains("1048576 bytes a launch may use (the plugin option"),
            "{e}"
        );
    }

    #[test]
    fn the_default_is_divided_among_the_processes_that_share_the_device() {
        let default = Budget::default_for(80 << 30, 80 << 30);
        assert_eq!(default.shared_by(1), default);
        let quarter = default.shared_by(4);
        assert_eq!(quarter.bytes, default.bytes / 4);
        assert_eq!(
            quarter.source,
            BudgetSource::DeviceShared {
                processes: 4,
                from_environment: false
            }
        );
        assert!(
            quarter.to_string().contains("the 4 processes of this node"),
            "{quarter}"
        );
        assert!(!quarter.source.is_configured());
        // TOAST_GPU_MEM_GB is each GPU's memory, as TOAST defines it.
        let env = Budget::parse_gib("16", BudgetSource::Environment).unwrap();
        let half = env.shared_by(2);
        assert_eq!(half.bytes, 8 << 30);
        assert!(half.source.is_configured());
        assert!(
            half.to_string().starts_with(
                "8.000 GiB = 8589934592 bytes (TOAST_GPU_MEM_GB (the memory of each GPU"
            ),
            "{half}"
        );
        // The option is each process's own.
        let set = Budget::parse_gib("16", BudgetSource::Option).unwrap();
        assert_eq!(set.shared_by(4), set);
    }

    #[test]
    fn the_option_wins_over_the_environment() {
        let b = Budget::configured("device=1; memory=0.5", Some("8"))
            .unwrap()
            .unwrap();
        assert_eq!((b.bytes, b.source), (1 << 29, BudgetSource::Option));
        let b = Budget::configured("device=1", Some("8")).unwrap().unwrap();
        assert_eq!((b.bytes, b.source), (8 << 30, BudgetSource::Environment));
        use BudgetSource::*;
        for (source, set) in [
            (Option, true),
            (Environment, true),
            (DeviceDefault, false),
            (HostShare, false),
            (Unlimited, false),
        ] {
            assert_eq!(source.is_configured(), set, "{source}");
        }
        assert_eq!(Budget::configured("", None).unwrap(), None);
        assert_eq!(Budget::configured("", Some(" ")).unwrap(), None);
        assert!(Budget::configured("memory=lots", None)
            .unwrap_err()
            .contains("option memory=: `lots` is not a device memory budget in GiB"));
        // A bare `memory`, or an empty value, is refused, not skipped.
        for bare in ["memory", "device=1; memory ;", "memory="] {
            assert!(
                Budget::configured(bare, Some("8"))
                    .unwrap_err()
                    .contains("option memory=: `` is not a device memory budget"),
                "{bare}"
            );
        }
        let b = Budget::configured("memory=1; memory=0.5", None)
            .unwrap()
            .unwrap();
        assert_eq!(b.bytes, 1 << 29, "the last memory= wins");
        assert_eq!(
            Budget::default_for(0, 10 << 30).to_string(),
            "9.000 GiB = 9663676416 bytes (the default, 90% of the device memory free at start)"
        );
    }
}
