//! The layer between operators and backends.
//!
//! * [`kernels`]: one safe function per TOAST kernel, which runs it for a
//!   set of detectors of an observation on the backend the dispatcher
//!   resolves (kernel > operator > pipeline > run > cpu), timed under the
//!   resolved timer name, with host addresses for host-addressable backends
//!   and the device handles of staged fields otherwise.
//! * [`pipeline`]: TOAST's `Pipeline` (detector sets, a pipeline-level
//!   backend), each step staged by the movement owner.
//! * [`movement`]: the one owner of data movement: device scopes, the
//!   staging of each step (toast-core's plan applied to the device copies'
//!   state machine), the kernel calls' view of the copies, and the ledger of
//!   what moved ([`movement::bus`]: bytes per phase of a run).
//! * [`global_data`]: which `Data`-level objects (maps, distributions,
//!   amplitudes) have a device form, and how they are staged.

pub mod global_data;
pub mod kernels;
pub mod movement;
pub mod pipeline;
