//! The map-maker's execution plan: how a run holds and reads the pointing,
//! chosen once, before any work, in one place ([`Plan::choose`]).
//!
//! Every pass of the map-maker reads the pointing (the pixel and the Stokes
//! weights of each sample). Where it comes from decides the memory of a
//! run and which passes run fused; it used to be decided by flags set in
//! several files. Now one value says it:
//!
//! | plan | pointing | solver passes | bytes a detector sample |
//! |---|---|---|---|
//! | [`ExecutionPlan::HostKept`] | expanded once by the kernels, kept (i64 pixel, 3 f64 weights) | fused on the kept fields | 32 |
//! | [`ExecutionPlan::HostCompact`] | the pixel kept as i32; weights rebuilt from the boresight | fused, weights rebuilt block by block in cache | 4 |
//! | [`ExecutionPlan::HostBatched`] | recomputed by the kernels in every pass, `batch` detectors at a time (TOAST's way) | unfused, per batch | about 0 kept, 64 per batch sample |
//! | [`ExecutionPlan::DeviceKept`] | expanded on the device from the boresight and kept there | fused on the device fields, one device scope | 32 on the device |
//! | [`ExecutionPlan::DeviceCompact`] | the pixel kept on the device as i32 (the kernel writes it so); weights rebuilt from the boresight | fused on the device, weights rebuilt inside the kernels, one device scope | 4 on the device, 32 per batch sample of the unfused passes |
//! | [`ExecutionPlan::DeviceRecomputed`] | recomputed on the device in every pass, `batch` detectors at a time | fused on each batch's device fields, one device scope | 64 per batch sample on the device (all detectors' with `batch = 0`) |
//!
//! `device-recomputed` may also stream the detector data
//! ([`DetectorData::Streamed`], `binner.stream_detector_data`): the host
//! holds the timestream and flags whole and each pass stages its batch's
//! rows ([`crate::exec::movement::window`]), so the device holds the maps,
//! the boresight and one batch whatever the length of the timestream, for
//! a bus cost of each batch's rows in every pass that reads them (the
//! solver flags in every iteration, 1 byte a sample per pass). Every pass
//! then runs per batch, the solver flags, the template's set-up and the
//! cleaning included.
//!
//! On a device the fused passes are pipeline steps (`fused::AccumulateStep`,
//! `fused::ProjectStep`) staged like the other kernels: the right-hand side
//! reads the timestream's rows and the left-hand side rebuilds `F a` from
//! the amplitudes inside the kernels, so no work timestream exists on the
//! device (8 bytes a detector sample) and each pass is one kernel call per
//! observation (and batch) instead of four to six. Unfused (a plugin
//! without the fused kernels, or the blockers below), they run the kernels
//! one after the other on a work timestream, per batch with a batch.
//!
//! The inputs are what the configuration asks for (`binner.full_pointing`,
//! `binner.compact_pointing`, `binner.pointing_batch`), what the backend is
//! (host-addressable or a device), what its kernels can do ([`KernelFacts`]:
//! the fused kernels, `pixels_healpix` writing i32 pixels) and facts of the
//! case (the pixelization fits an i32, IQU weights, a separate final
//! pixelization, pointing fields handed over by the caller). Compact
//! pointing means the same on the host and on a device: the
//! `pixels_healpix` kernel writes each pixel once as an i32 (ABI minor 8),
//! kept to the end of the run, and every later pass rebuilds the weights
//! from the boresight (inside the fused kernels, or per batch by
//! `compact_expand_pointing` for the passes that read fields). [`Plan::choose`] is a pure function of them,
//! so `toast-cli run --dry-run` shows the plan a run will take (the
//! workflow calls it with the configuration's facts) and the map-maker
//! takes the same decision at the start of its run; `stats.json` records
//! the plan the run took, with the reasons.
//!
//! What may still send a pass of a fused plan through the unfused kernels
//! is a property of the data, checked where the pass starts: an offset
//! template whose views differ from the pointing's, or kept fields missing
//! from some observation (`fused_applies`). The satellite workflow never
//! meets either.

use serde::Serialize;
use std::fmt;

use super::MapMakerSetup;
use crate::ops::{BinnerConfig, StokesMode};
use toast_accel::abi::Kernel;
use toast_accel::host::{AccelError, DispatchPolicy, Registry};

/// How the solver's right- and left-hand sides (and, with compact
/// pointing, the final binning) run on a host plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Passes {
    /// Fused: each sample's pointing read or rebuilt inside the
    /// accumulation and projection loops, no work timestream.
    Fused,
    /// The kernels one after the other on a work timestream (per detector
    /// batch on the host).
    Unfused,
}

/// Where a device plan's detector data (timestream and flags) live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DetectorData {
    /// Whole on the device for the whole scope.
    Resident,
    /// On the host, each batch's rows staged for the passes over it
    /// ([`crate::exec::movement::window`], `binner.stream_detector_data`).
    Streamed,
}

/// Where the map-maker's pointing lives during a run (see the module
/// documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "name", rename_all = "kebab-case")]
pub enum ExecutionPlan {
    /// On the host, the pointing expanded once for all detectors and kept.
    HostKept {
        /// The solver passes.
        passes: Passes,
    },
    /// On the host, the pixels kept in compact form (i32) and the weights
    /// rebuilt from the boresight.
    HostCompact {
        /// The solver and final binning passes.
        passes: Passes,
    },
    /// On the host, the pointing recomputed by the kernels in every pass.
    HostBatched,
    /// On a device (a backend that is not host-addressable): one staging
    /// scope for the run, the pointing expanded there and kept. No pass
    /// reads pointing on the host (the pixel distribution is built from
    /// the device's hit submaps, the solver flags are a kernel).
    DeviceKept {
        /// The solver passes.
        passes: Passes,
    },
    /// On a device: one device scope, the pointing recomputed there in
    /// every pass, per batch of [`Plan::batch`] detectors (all at once
    /// with 0): the device holds one batch's pointing (and, unfused, its
    /// work timestream), so its resident set is the timestream, the flags,
    /// the boresight, the maps and the amplitudes, plus one batch (what a
    /// small device memory budget asks for: the satellite workflow chooses
    /// it then).
    DeviceRecomputed {
        /// The solver passes.
        passes: Passes,
        /// Where the detector data live.
        data: DetectorData,
    },
    /// On a device: one device scope, the pixels kept there in compact
    /// form (i32, written so by `pixels_healpix`) and the weights rebuilt
    /// from the boresight: inside the fused kernels, or per batch of
    /// [`Plan::batch`] detectors by `compact_expand_pointing` for the
    /// passes that read pointing fields (the covariance, the solver flags,
    /// the template's set-up). The resident set is the detector data, the
    /// boresight, the maps, the amplitudes and 4 bytes a detector sample.
    DeviceCompact {
        /// The solver passes.
        passes: Passes,
    },
}

/// What the kernels of the map-maker can do where dispatch sends them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelFacts {
    /// The fused kernels run where the unfused ones do
    /// ([`PlanFacts::fused_kernels_run_with_unfused`]): else a plugin lacks
    /// them, or a dispatch setting sends them elsewhere.
    pub fused: bool,
    /// The solver's `pixels_healpix` (operator [`PIXELS_OPERATOR`]) runs on
    /// a plugin that writes i32 pixels (ABI minor 8,
    /// `Backend::writes_i32_pixels`): what compact pointing needs.
    pub i32_pixels: bool,
}

/// The name of the map-maker's solver pixel operator (dispatch settings
/// for its `pixels_healpix` name it).
pub const PIXELS_OPERATOR: &str = "pixels";

/// A plan's note: compact pointing asked for beside full pointing.
const COMPACT_UNDER_FULL: &str =
    "binner.compact_pointing does not apply: binner.full_pointing = true keeps the full pointing";

/// A plan's note: streamed detector data asked for where the pointing is
/// not recomputed on the device.
const STREAM_NEEDS_RECOMPUTED: &str = "binner.stream_detector_data applies to recomputed \
     pointing only: the detector data stay on the device";

impl KernelFacts {
    /// The facts of the map-maker `operator`'s kernels in `registry` under
    /// `policy`.
    pub fn of(
        registry: &Registry,
        policy: &DispatchPolicy,
        operator: &str,
    ) -> Result<KernelFacts, AccelError> {
        let pixels = policy.resolve(registry, Kernel::PixelsHealpix, Some(PIXELS_OPERATOR))?;
        Ok(KernelFacts {
            fused: PlanFacts::fused_kernels_run_with_unfused(registry, policy, operator)?,
            i32_pixels: pixels.backend.writes_i32_pixels(),
        })
    }
}

/// The facts of a run that decide its plan besides the configuration
/// (the default: no backend, nothing known, so no fused passes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanFacts {
    /// The backend that runs the map-maker's pipeline, and whether it
    /// addresses host memory (`None`: no backend resolved, the host).
    pub backend: Option<(String, bool)>,
    /// Pixels of the solver's pixelization (`12 nside²`).
    pub npix: u64,
    /// The weights are IQU (the fused passes need three).
    pub iqu: bool,
    /// The final maps have their own pixelization (`pixels_final`).
    pub final_pixelization: bool,
    /// Some pointing field existed before the run (handed over by the
    /// caller): it is used as it is, so no compact form is made.
    pub pointing_given: bool,
    /// The caller allows fused passes ([`super::MapMaker::fused_passes`],
    /// on by default).
    pub fused_allowed: bool,
    /// What the kernels can do where dispatch sends them.
    pub kernels: KernelFacts,
}

impl PlanFacts {
    /// The facts of a map-maker of `setup` run on `backend` (name, and
    /// whether it addresses host memory; `None`: the host), with pointing
    /// fields handed over or not, and fused passes allowed or not.
    pub fn of_setup(
        setup: &MapMakerSetup,
        backend: Option<(String, bool)>,
        pointing_given: bool,
        fused_allowed: bool,
        kernels: KernelFacts,
    ) -> PlanFacts {
        PlanFacts {
            backend,
            npix: setup.pixels.nside.npix(),
            iqu: setup.weights.mode == StokesMode::IQU,
            final_pixelization: setup.pixels_final.as_ref().is_some_and(|p| p.enabled),
            pointing_given,
            fused_allowed,
            kernels,
        }
    }

    /// Whether the fused kernels (`fused_accumulate`, `fused_project`,
    /// `compact_expand_pointing`) resolve, for the operator `operator`
    /// under `policy`, to the backend of the kernel they replace
    /// (`build_noise_weighted`): a plugin that lacks them is passed over
    /// by dispatch, and then the unfused passes run on it instead.
    pub fn fused_kernels_run_with_unfused(
        registry: &Registry,
        policy: &DispatchPolicy,
        operator: &str,
    ) -> Result<bool, AccelError> {
        let backend = |k: Kernel| -> Result<String, AccelError> {
            let r = policy.resolve(registry, k, Some(operator))?;
            Ok(r.backend_name().to_string())
        };
        let unfused = backend(Kernel::BuildNoiseWeighted)?;
        for k in [
            Kernel::FusedAccumulate,
            Kernel::FusedProject,
            Kernel::CompactExpandPointing,
        ] {
            if backend(k)? != unfused {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// An [`ExecutionPlan`] with its batch size and the reasons it was chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The plan.
    #[serde(flatten)]
    pub plan: ExecutionPlan,
    /// Detectors per host pass that expands pointing or fills the solver's
    /// work timestream (`binner.pointing_batch`; 0: all at once).
    pub batch: usize,
    /// Why, one reason per deciding fact, in the order they decided.
    pub why: Vec<String>,
}

impl Plan {
    /// The plan for a run of `binner` with `facts` (see the module
    /// documentation).
    pub fn choose(binner: &BinnerConfig, facts: &PlanFacts) -> Plan {
        let mut why = Vec::new();
        let passes = |why: &mut Vec<String>| {
            let blocker = if !facts.fused_allowed {
                Some("fused passes turned off by the caller")
            } else if !facts.iqu {
                Some("the fused passes need IQU weights")
            } else if facts.final_pixelization {
                Some("the final maps have their own pixelization")
            } else if !facts.kernels.fused {
                Some(
                    "the fused kernels do not run where the unfused ones do (a plugin without \
                     them, or a dispatch setting)",
                )
            } else {
                None
            };
            match blocker {
                Some(b) => {
                    why.push(format!("unfused passes: {b}"));
                    Passes::Unfused
                }
                None => Passes::Fused,
            }
        };
        // Compact pointing applies where the pixels fit an i32, the run
        // makes its own pointing, and the kernel writes i32 pixels.
        let compact_blocker = if facts.npix > i32::MAX as u64 {
            Some(format!("{} pixels do not fit an i32", facts.npix))
        } else if facts.pointing_given {
            Some("pointing fields were handed over and are used as they are".to_string())
        } else if !facts.kernels.i32_pixels {
            Some(
                "the pixels_healpix kernel runs on a plugin that does not write i32 pixels \
                 (before ABI minor 8)"
                    .to_string(),
            )
        } else {
            None
        };
        if let Some((name, false)) = &facts.backend {
            why.push(format!(
                "backend {name} is a device (not host-addressable): one device scope for the run"
            ));
            let plan = if binner.full_pointing {
                why.push(
                    "binner.full_pointing = true: the pointing expanded on the device from the \
                     boresight and kept there"
                        .into(),
                );
                if binner.compact_pointing {
                    why.push(COMPACT_UNDER_FULL.into());
                }
                if binner.stream_detector_data {
                    why.push(STREAM_NEEDS_RECOMPUTED.into());
                }
                ExecutionPlan::DeviceKept {
                    passes: passes(&mut why),
                }
            } else if let (true, Some(b)) = (binner.compact_pointing, &compact_blocker) {
                // As before compact pointing ran on a device: the full
                // pointing kept (the budget's fitter may still turn it into
                // batches).
                why.push(format!(
                    "binner.compact_pointing does not apply ({b}): the pointing expanded on the \
                     device from the boresight and kept there"
                ));
                if binner.stream_detector_data {
                    why.push(STREAM_NEEDS_RECOMPUTED.into());
                }
                ExecutionPlan::DeviceKept {
                    passes: passes(&mut why),
                }
            } else if binner.compact_pointing {
                why.push(
                    "binner.compact_pointing = true: pixels kept on the device as i32, weights \
                     rebuilt from the boresight"
                        .into(),
                );
                if binner.stream_detector_data {
                    why.push(STREAM_NEEDS_RECOMPUTED.into());
                }
                ExecutionPlan::DeviceCompact {
                    passes: passes(&mut why),
                }
            } else {
                why.push(match binner.pointing_batch {
                    0 => "binner.full_pointing and binner.compact_pointing are false: the \
                          pointing recomputed on the device in every pass, all detectors at once"
                        .to_string(),
                    n => format!(
                        "binner.full_pointing and binner.compact_pointing are false: the \
                         pointing recomputed on the device in every pass, {n} detectors at a \
                         time (binner.pointing_batch)"
                    ),
                });
                let data = match (binner.stream_detector_data, binner.pointing_batch) {
                    (false, _) => DetectorData::Resident,
                    (true, 0) => {
                        why.push(
                            "binner.stream_detector_data does not apply to all detectors at once \
                             (binner.pointing_batch = 0): the detector data stay on the device"
                                .into(),
                        );
                        DetectorData::Resident
                    }
                    (true, _) => {
                        why.push(
                            "binner.stream_detector_data = true: the host holds the detector \
                             data, each pass stages its batch's rows on the device"
                                .into(),
                        );
                        DetectorData::Streamed
                    }
                };
                ExecutionPlan::DeviceRecomputed {
                    passes: passes(&mut why),
                    data,
                }
            };
            return Plan {
                plan,
                batch: binner.pointing_batch,
                why,
            };
        }
        let host = match &facts.backend {
            Some((name, _)) => format!("backend {name} addresses host memory"),
            None => "no device backend".to_string(),
        };
        why.push(host);
        if binner.stream_detector_data {
            why.push(
                "binner.stream_detector_data does not apply: it streams detector data through \
                 a device"
                    .into(),
            );
        }
        let plan = if binner.full_pointing {
            why.push("binner.full_pointing = true: pointing expanded once and kept".into());
            if binner.compact_pointing {
                why.push(COMPACT_UNDER_FULL.into());
            }
            ExecutionPlan::HostKept {
                passes: passes(&mut why),
            }
        } else if binner.compact_pointing {
            match compact_blocker {
                Some(b) => {
                    why.push(format!(
                        "binner.compact_pointing does not apply ({b}): pointing recomputed in \
                         every pass"
                    ));
                    ExecutionPlan::HostBatched
                }
                None => {
                    why.push(
                        "binner.compact_pointing = true: pixels kept as i32, weights rebuilt \
                         from the boresight"
                            .into(),
                    );
                    ExecutionPlan::HostCompact {
                        passes: passes(&mut why),
                    }
                }
            }
        } else {
            why.push(
                "binner.full_pointing and binner.compact_pointing are false: pointing \
                 recomputed in every pass (TOAST's way)"
                    .into(),
            );
            ExecutionPlan::HostBatched
        };
        Plan {
            plan,
            batch: binner.pointing_batch,
            why,
        }
    }

    /// The run is on the host (no device scope).
    pub fn host(&self) -> bool {
        !matches!(
            self.plan,
            ExecutionPlan::DeviceKept { .. }
                | ExecutionPlan::DeviceRecomputed { .. }
                | ExecutionPlan::DeviceCompact { .. }
        )
    }

    /// The solver's pointing is expanded once and kept (on the host, or on
    /// the device).
    pub fn keeps_pointing(&self) -> bool {
        matches!(
            self.plan,
            ExecutionPlan::HostKept { .. } | ExecutionPlan::DeviceKept { .. }
        )
    }

    /// The host keeps a full copy of the solver's pointing for the map-maker
    /// (the sky scan keeps its own for it): a host run's kept pointing. A
    /// device run reads none on the host.
    pub fn host_pointing_kept(&self) -> bool {
        matches!(self.plan, ExecutionPlan::HostKept { .. })
    }

    /// The detector data are streamed through the device one batch at a
    /// time ([`DetectorData::Streamed`]).
    pub fn streams_detector_data(&self) -> bool {
        matches!(
            self.plan,
            ExecutionPlan::DeviceRecomputed {
                data: DetectorData::Streamed,
                ..
            }
        )
    }

    /// The pixels are kept in compact form (on the host or the device).
    pub fn compact(&self) -> bool {
        matches!(
            self.plan,
            ExecutionPlan::HostCompact { .. } | ExecutionPlan::DeviceCompact { .. }
        )
    }

    /// Passes recompute (or rebuild) the pointing per detector batch, each
    /// batch's fields replacing the previous one's (on a device, their
    /// device copies too).
    pub fn transient_pointing(&self) -> bool {
        match self.plan {
            ExecutionPlan::HostCompact { .. } | ExecutionPlan::HostBatched => true,
            ExecutionPlan::DeviceRecomputed { .. } | ExecutionPlan::DeviceCompact { .. } => {
                self.batch > 0
            }
            ExecutionPlan::HostKept { .. } | ExecutionPlan::DeviceKept { .. } => false,
        }
    }

    /// The unfused solver passes' work timestream exists for one detector
    /// batch at a time (made from the amplitudes in the left-hand side, and
    /// on the host a copy of the timestream in the right-hand side; a
    /// device copies the whole timestream once, as the copy kernel has no
    /// row selection).
    pub fn work_batches(&self) -> bool {
        self.batch > 0
            && matches!(
                self.plan,
                ExecutionPlan::HostKept { .. }
                    | ExecutionPlan::HostCompact { .. }
                    | ExecutionPlan::HostBatched
                    | ExecutionPlan::DeviceRecomputed { .. }
                    | ExecutionPlan::DeviceCompact { .. }
            )
    }

    /// The solver's passes are the fused kernels as device pipeline steps
    /// (`fused::AccumulateStep`, `fused::ProjectStep`): no work timestream
    /// on the device.
    pub fn device_fused(&self) -> bool {
        matches!(
            self.plan,
            ExecutionPlan::DeviceKept {
                passes: Passes::Fused
            } | ExecutionPlan::DeviceRecomputed {
                passes: Passes::Fused,
                ..
            } | ExecutionPlan::DeviceCompact {
                passes: Passes::Fused
            }
        )
    }

    /// The pointing the fused device steps read: the compact form (the
    /// compact pixels and the boresight) or the pointing fields (kept, or
    /// the batch's just recomputed).
    pub fn device_fused_form(&self) -> FusedForm {
        match self.plan {
            ExecutionPlan::DeviceCompact { .. } => FusedForm::Compact,
            _ => FusedForm::Kept,
        }
    }

    /// The fused passes run, and on which pointing.
    pub fn fused(&self) -> Option<FusedForm> {
        match self.plan {
            ExecutionPlan::HostKept {
                passes: Passes::Fused,
            } => Some(FusedForm::Kept),
            ExecutionPlan::HostCompact {
                passes: Passes::Fused,
            } => Some(FusedForm::Compact),
            _ => None,
        }
    }
}

/// The pointing a fused pass reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FusedForm {
    /// Compact pointing: the weights rebuilt from the boresight.
    Compact,
    /// Kept pointing: the kept fields read in place.
    Kept,
}

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let passes = |p: &Passes| match p {
            Passes::Fused => "fused",
            Passes::Unfused => "unfused",
        };
        match self {
            ExecutionPlan::HostKept { passes: p } => write!(f, "host-kept-{}", passes(p)),
            ExecutionPlan::HostCompact { passes: p } => write!(f, "host-compact-{}", passes(p)),
            ExecutionPlan::HostBatched => f.write_str("host-batched"),
            ExecutionPlan::DeviceKept { passes: p } => write!(f, "device-kept-{}", passes(p)),
            ExecutionPlan::DeviceRecomputed { passes: p, .. } => {
                write!(f, "device-recomputed-{}", passes(p))
            }
            ExecutionPlan::DeviceCompact { passes: p } => {
                write!(f, "device-compact-{}", passes(p))
            }
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.plan)?;
        let batched = match self.plan {
            ExecutionPlan::HostKept { .. } | ExecutionPlan::DeviceKept { .. } => false,
            ExecutionPlan::DeviceRecomputed { .. } | ExecutionPlan::DeviceCompact { .. } => true,
            _ => self.host(),
        };
        if batched {
            let streamed = if self.streams_detector_data() {
                ", detector data streamed"
            } else {
                ""
            };
            match self.batch {
                0 => write!(f, " (all detectors at once{streamed})")?,
                n => write!(f, " ({n} detectors a batch{streamed})")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(backend: Option<(&str, bool)>) -> PlanFacts {
        PlanFacts {
            backend: backend.map(|(n, h)| (n.to_string(), h)),
            npix: 12 << 20,
            iqu: true,
            final_pixelization: false,
            pointing_given: false,
            fused_allowed: true,
            kernels: KernelFacts {
                fused: true,
                i32_pixels: true,
            },
        }
    }

    fn binner(full: bool, compact: bool) -> BinnerConfig {
        BinnerConfig {
            full_pointing: full,
            compact_pointing: compact,
            ..BinnerConfig::default()
        }
    }

    #[test]
    fn each_configuration_gets_its_plan() {
        let cpu = facts(Some(("cpu", true)));
        let p = Plan::choose(&binner(true, false), &cpu);
        assert_eq!(p.to_string(), "host-kept-fused");
        assert_eq!(p.fused(), Some(FusedForm::Kept));
        assert!(p.keeps_pointing() && p.host_pointing_kept() && !p.transient_pointing());
        let p = Plan::choose(&binner(false, true), &cpu);
        assert_eq!(p.to_string(), "host-compact-fused (8 detectors a batch)");
        assert_eq!(p.fused(), Some(FusedForm::Compact));
        assert!(p.compact() && p.transient_pointing() && p.work_batches());
        let p = Plan::choose(&binner(false, false), &cpu);
        assert_eq!(p.plan, ExecutionPlan::HostBatched);
        assert_eq!(p.fused(), None);
        // A device: each configuration has its device form.
        let dev = facts(Some(("opencl", false)));
        let fused = Passes::Fused;
        for (full, compact) in [(true, false), (false, true), (false, false)] {
            let p = Plan::choose(&binner(full, compact), &dev);
            let want = match (full, compact) {
                (false, false) => ExecutionPlan::DeviceRecomputed {
                    passes: fused,
                    data: DetectorData::Resident,
                },
                (false, true) => ExecutionPlan::DeviceCompact { passes: fused },
                _ => ExecutionPlan::DeviceKept { passes: fused },
            };
            assert_eq!(p.plan, want);
            assert_eq!(p.keeps_pointing(), full);
            assert_eq!(p.compact(), compact);
            assert!(!p.host_pointing_kept() && !p.host());
            // Recomputed (or rebuilt) pointing is per batch
            // (`pointing_batch` = 8 by default); the fused device passes
            // make no work timestream.
            assert_eq!(p.transient_pointing(), !full);
            assert_eq!(p.work_batches(), !full);
            assert!(p.device_fused());
            assert_eq!(p.fused(), None);
            let form = if compact {
                FusedForm::Compact
            } else {
                FusedForm::Kept
            };
            assert_eq!(p.device_fused_form(), form);
        }
        let p = Plan::choose(&binner(false, true), &dev);
        assert_eq!(p.to_string(), "device-compact-fused (8 detectors a batch)");
        // Where the kernel cannot write i32 pixels (a plugin before ABI
        // minor 8), compact pointing does not apply: kept on a device (as
        // before device-compact existed), TOAST's way on the host.
        let mut old = dev.clone();
        old.kernels.i32_pixels = false;
        let p = Plan::choose(&binner(false, true), &old);
        assert_eq!(p.plan, ExecutionPlan::DeviceKept { passes: fused });
        assert!(p.why.iter().any(|w| w.contains("ABI minor 8")), "{p:?}");
        let mut old = facts(Some(("cpu", true)));
        old.kernels.i32_pixels = false;
        let p = Plan::choose(&binner(false, true), &old);
        assert_eq!(p.plan, ExecutionPlan::HostBatched);
        assert!(p.why.iter().any(|w| w.contains("ABI minor 8")), "{p:?}");
        let all = BinnerConfig {
            pointing_batch: 0,
            ..binner(false, false)
        };
        let p = Plan::choose(&all, &dev);
        assert_eq!(
            p.plan,
            ExecutionPlan::DeviceRecomputed {
                passes: fused,
                data: DetectorData::Resident
            }
        );
        assert!(!p.transient_pointing() && !p.work_batches());
        assert_eq!(
            p.to_string(),
            "device-recomputed-fused (all detectors at once)"
        );
        let p = Plan::choose(&binner(false, false), &dev);
        assert_eq!(
            p.to_string(),
            "device-recomputed-fused (8 detectors a batch)"
        );
        assert!(
            p.why.iter().any(|w| w.contains("8 detectors at a time")),
            "{p:?}"
        );
        // The detector data streamed: batches only.
        let streamed = BinnerConfig {
            stream_detector_data: true,
            pointing_batch: 3,
            ..binner(false, false)
        };
        let p = Plan::choose(&streamed, &dev);
        assert_eq!(
            p.plan,
            ExecutionPlan::DeviceRecomputed {
                passes: fused,
                data: DetectorData::Streamed
            }
        );
        assert!(p.streams_detector_data() && p.transient_pointing());
        assert_eq!(
            p.to_string(),
            "device-recomputed-fused (3 detectors a batch, detector data streamed)"
        );
        let json = serde_json::to_value(&p).expect("a plan serializes");
        assert_eq!(json["data"], "streamed");
        let p = Plan::choose(
            &BinnerConfig {
                pointing_batch: 0,
                ..streamed.clone()
            },
            &dev,
        );
        assert!(!p.streams_detector_data());
        assert!(p.why.iter().any(|w| w.contains("does not apply")), "{p:?}");
        // Kept pointing, or the host: nothing to stream.
        for (b, f) in [
            (binner(true, false), &dev),
            (binner(false, false), &facts(Some(("cpu", true)))),
        ] {
            let b = BinnerConfig {
                stream_detector_data: true,
                ..b
            };
            assert!(!Plan::choose(&b, f).streams_detector_data());
        }
        // A device plugin without the fused kernels: the unfused passes,
        // with their work timestream.
        let mut f = dev.clone();
        f.kernels.fused = false;
        let p = Plan::choose(&binner(true, false), &f);
        assert_eq!(p.to_string(), "device-kept-unfused");
        assert!(!p.device_fused() && !p.work_batches());
        assert!(p.why.iter().any(|w| w.contains("fused kernels")), "{p:?}");
    }

    #[test]
    fn blockers_are_named() {
        let mut f = facts(None);
        f.npix = 1 << 40;
        let p = Plan::choose(&binner(false, true), &f);
        assert_eq!(p.plan, ExecutionPlan::HostBatched);
        assert!(
            p.why.iter().any(|w| w.contains("do not fit an i32")),
            "{p:?}"
        );
        let mut f = facts(None);
        f.final_pixelization = true;
        let p = Plan::choose(&binner(true, false), &f);
        assert_eq!(
            p.plan,
            ExecutionPlan::HostKept {
                passes: Passes::Unfused
            }
        );
        assert!(
            p.why.iter().any(|w| w.contains("own pixelization")),
            "{p:?}"
        );
        let mut f = facts(None);
        f.kernels.fused = false;
        let p = Plan::choose(&binner(false, true), &f);
        assert_eq!(
            p.plan,
            ExecutionPlan::HostCompact {
                passes: Passes::Unfused
            }
        );
        assert!(p.why.iter().any(|w| w.contains("fused kernels")), "{p:?}");
        let mut f = facts(None);
        f.pointing_given = true;
        let p = Plan::choose(&binner(false, true), &f);
        assert_eq!(p.plan, ExecutionPlan::HostBatched);
        let json = serde_json::to_value(Plan::choose(&binner(false, true), &facts(None)))
            .expect("a plan serializes");
        assert_eq!(json["name"], "host-compact");
        assert_eq!(json["passes"], "fused");
    }

    /// A setting the chosen plan does not use is named in its reasons,
    /// never dropped unsaid.
    #[test]
    fn settings_a_plan_does_not_use_are_named() {
        let mut b = binner(true, true);
        b.stream_detector_data = true;
        for backend in [Some(("cpu", true)), None, Some(("cuda", false))] {
            let p = Plan::choose(&b, &facts(backend));
            assert!(p.keeps_pointing(), "{p:?}");
            for setting in [
                "binner.compact_pointing does not apply",
                "binner.stream_detector_data",
            ] {
                assert!(
                    p.why.iter().any(|w| w.starts_with(setting)),
                    "{backend:?}: {p:?}"
                );
            }
        }
        // Compact on a device keeps its data there.
        b.full_pointing = false;
        let p = Plan::choose(&b, &facts(Some(("cuda", false))));
        assert!(p.why.iter().any(|w| w == STREAM_NEEDS_RECOMPUTED), "{p:?}");
        // Nothing is said of a setting left at its default.
        let p = Plan::choose(&binner(true, false), &facts(None));
        assert!(
            !p.why
                .iter()
                .any(|w| w.contains("does not apply") || w.contains("applies to")),
            "{p:?}"
        );
    }
}
