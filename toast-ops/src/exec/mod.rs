//! The layer between operators and backends.
//!
//! * [`kernels`]: one safe function per TOAST kernel, which runs it for a
//!   set of detectors of an observation on the backend the dispatcher
//!   resolves (kernel > operator > pipeline > run > cpu), timed under the
//!   resolved timer name, with host addresses for host-addressable backends
//!   and the device handles of staged fields otherwise.
//! * [`pipeline`]: TOAST's `Pipeline` (detector sets, a pipeline-level
//!   backend) with data staging: data moves to a non-host-addressable
//!   device once per staging scope, following toast-core's staging plan.
//! * [`bus`]: bytes copied between host and device, summed over the loaded
//!   backends, for the per-phase transfer accounting of a run.
//! * [`global_data`]: which `Data`-level objects (maps, distributions,
//!   amplitudes) have a device form, and how they are staged.

pub mod bus;
pub mod global_data;
pub mod kernels;
pub mod pipeline;
