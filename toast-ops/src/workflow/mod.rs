//! TOAST's satellite benchmark (`toast_benchmark_satellite`) as a library
//! call: a configuration in, the map-maker's products, timers and
//! statistics out. `toast-cli run` is a thin front-end over it; a Python
//! caller or another front-end uses the same calls.
//!
//! * [`config`]: the [`SatelliteConfig`], one TOML section per operator
//!   named as TOAST names its operator instances, the case defaults
//!   (TOAST's benchmark settings), `section.key=value` overrides, and the
//!   effective configuration written back as TOML.
//! * [`presets`]: the case sizes (`tiny` … `heroic`, TOAST's
//!   `select_distribution`) and the memory model behind `auto` and
//!   `--dry-run`.
//! * [`satellite`]: the [`SatelliteJob`]: checked before any long work,
//!   planned over processes without running, then run phase by phase with
//!   a front-end's [`Phases`] observer and [`ProductSink`].
//!
//! ```no_run
//! # use toast_ops::workflow::*;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut table = config::workflow_defaults("tiny");
//! config::apply_set(&mut table, "baselines.step_time=60")?;
//! let job = SatelliteJob::new("tiny", config::build(table)?, SizeOverrides::default())?;
//! let mut sim = job.simulation()?;
//! job.plan(&mut sim, 1, 1, None)?;
//! let registry = toast_accel::host::Registry::discover(&Default::default());
//! let comm: std::sync::Arc<dyn toast_core::Comm> = std::sync::Arc::new(toast_core::SerialComm);
//! struct Keep(Option<usize>);
//! impl ProductSink for Keep {
//!     fn store(&mut self, _: &SatelliteJob, p: &MapProducts) -> Result<(), FrontEndError> {
//!         self.0 = Some(p.map.n_local_pix());
//!         Ok(())
//!     }
//! }
//! let run = job.run(sim, registry, comm, "example", &mut Silent, &mut Keep(None))?;
//! let stats = run.expect("one process is rank 0").stats;
//! println!("{} hits", stats.maps.map_or(0, |m| m.totalhits));
//! # Ok(())
//! # }
//! ```

pub mod config;
pub mod presets;
pub mod satellite;

pub use config::{ConfigError, SatelliteConfig};
pub use presets::Sizing;
pub use satellite::{
    FrontEndError, MapProducts, MapSummary, Phases, ProductSink, RunStats, SatelliteJob,
    SatelliteRun, Silent, SizeOverrides, TransferPhases, WorkflowError, PHASES,
};
