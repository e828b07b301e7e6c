//! toast-core: the data model, intervals, operator interface, device buffer
//! lifecycle and timers of toast-rs, a Rust re-implementation of TOAST 3.
//!
//! Nothing here is backend specific and there is no FFI: `toast-accel`
//! implements [`device::DeviceMemory`] for a loaded plugin, and `toast-ops`
//! builds operators and pipelines on these types.
//!
//! # Data model and memory layout
//!
//! A [`Data`] holds the [`Observation`]s of this process and a metadata
//! dictionary ([`meta::Meta`]) for data-level ("global") objects such as
//! maps. An observation has a name and a uid, a [`Telescope`] whose
//! [`Focalplane`] (shared through an `Arc`: thousands of observations use
//! one) lists typed [`Detector`]s, a number of samples, and four stores:
//!
//! * [`Observation::shared`]: per-sample fields common to all detectors
//!   (`times`, `boresight_radec` ×4, `flags`, `position`/`velocity` ×3,
//!   `hwp_angle`), each one contiguous `[n_samples, ...shape]` block;
//! * [`Observation::detdata`]: per-detector fields of any [`DType`] (f64,
//!   f32, i64, i32, u8) and per-sample shape, each **one contiguous
//!   row-major block `[n_det, n_samples, ...shape]`**;
//! * [`Observation::intervals`]: named [`IntervalList`]s;
//! * [`Observation::meta`]: metadata (the noise model, ...).
//!
//! Why one block per detector field: the kernels of TOAST (and ours) take a
//! whole field plus a `data_index` array of rows, so a field is a single
//! argument whose rows are addressed by index; and a device mirror of it is
//! one allocation copied in one transfer. TOAST's `DetectorData` has the same
//! layout for the same reasons.
//!
//! Types are a small closed set ([`DType`], a [`dtype::Column`] enum of typed
//! `Vec`s) rather than generics threaded through every container. Typed
//! access goes through the sealed [`dtype::Element`] trait
//! (`field.row::<f64>(i)?`) and returns a [`DataError`] naming the
//! observation, field and expected/actual type or shape on a mismatch,
//! never a panic. `create` is idempotent for an identical field and an error
//! for a conflicting one. The data stores are public fields of
//! [`Observation`] so that one can be read while another is written;
//! [`detdata::DetDataManager::get_disjoint_mut`] gives several detdata
//! fields mutably at once.
//!
//! Observation and detector uids are TOAST's `name_UID` (MD5 of the name,
//! low 31 bits, see [`uid`]), so anything keyed on them, like the noise
//! simulation's random streams, can match TOAST.
//!
//! # Intervals
//!
//! [`Interval`] has the exact layout of TOAST's `interval_dtype` and an
//! exclusive `last`. An [`IntervalList`] built here is canonical (sorted,
//! disjoint, non-empty, in range), supports complement, intersection and
//! union, and is built from sample ranges, time spans, or runs of unflagged
//! samples; see [`intervals`] for the two documented differences from TOAST.
//!
//! # Operators and requirement categories
//!
//! An [`Operator`] declares what it reads and writes as [`Requirements`] in
//! TOAST's five categories ([`Category`]): `global` (data metadata),
//! `meta` (observation metadata), `detdata`, `shared` and `intervals`.
//! [`check_requirements`] reports the first missing item by observation,
//! category and name. `exec` gets an [`ExecContext`] with the [`Timers`],
//! an optional detector selection, the accel flag and a type-keyed
//! extension map through which higher crates pass their own objects (the
//! dispatcher) without this crate knowing their types and without making
//! `dyn Operator` generic.
//!
//! # Staging plan
//!
//! A pipeline moves data to the device once. [`staging`] computes, from the
//! requirements and accel flags alone, what to create, upload and zero
//! before each accelerated step, what to copy back before each host-only
//! step, which device copies a host step makes stale, what to copy back at
//! the end and what to free. The simulation tracks where the newest copy
//! of each item lives (host, both, device); the outputs copied back are
//! TOAST's pipeline provides (walk forward, dropping what a later step
//! requires) and the inputs its pipeline requires (walk in reverse,
//! dropping what a step provides). Intermediates such as detector
//! quaternions, pixels and weights thus never cross the bus.
//!
//! # Device buffer state machine
//!
//! [`device_buffers::DeviceBuffers`] is the one place where device buffers change
//! state, keyed by (observation, category, field). `create` → `update_device`
//! → (kernels: `mark_device_modified`) → `update_host` → `reset` → `delete`,
//! through the states Absent / Allocated / InSync / DeviceNewer / HostNewer /
//! Deleted. Each public method checks the state first and returns a typed
//! [`device_buffers::AccelStateError`] naming the buffer (NotCreated, AlreadyCreated,
//! DeletedTwice, SizeMismatch, InvalidTransition, Device) before it calls the
//! backend hook, as TOAST's `AcceleratorObject` does; transitions that would
//! silently lose data (uploading over newer device results, downloading over
//! newer host changes) are refused. Every transfer is counted per buffer
//! name (calls, bytes, seconds per direction) in a [`device_buffers::TransferReport`].
//!
//! # Timing
//!
//! [`Timers`] are named accumulating timers with a frame stack that builds
//! TOAST's hierarchical names (`(function) A|B`), and [`timing::write_csv`]
//! writes TOAST's `timing.csv` byte for byte (header, quoting, `\r\n`, Python
//! number formatting), so TOAST's tools read our output.

pub mod comm;
pub mod detdata;
pub mod device;
pub mod device_buffers;
pub mod dtype;
pub mod error;
pub mod input;
pub mod instrument;
pub mod intervals;
pub mod mem;
pub mod meta;
pub mod num;
pub mod observation;
pub mod operator;
pub mod shared;
pub mod staging;
pub mod timing;
pub mod uid;

pub use comm::{comm_of, Comm, CommError, CommHandle, ProcessLayout, ReduceOp, SerialComm};
pub use detdata::{Created, DetData, DetDataManager};
pub use device::{DeviceError, DeviceMemory};
pub use device_buffers::{
    AccelStateError, BufferKey, BufferState, DeviceBuffers, DeviceFieldError, DeviceView,
    TransferCounts, TransferReport,
};
pub use dtype::{Column, DType, Element};
pub use error::{Category, DataError};
pub use instrument::{Detector, Focalplane, Telescope};
pub use intervals::{Interval, IntervalError, IntervalList};
pub use meta::{Meta, MetaItem, Value};
pub use observation::{defaults, Data, IntervalsManager, Observation};
pub use operator::{
    check_requirements, ExecContext, Extensions, Item, OpError, Operator, PixelOutOfRange,
    RequirementError, Requirements,
};
pub use shared::{SharedData, SharedField};
pub use staging::{
    pipeline_provides, pipeline_requires, plan_staging, FinalStaging, Residence, Stager,
    StagingPlan, StepSpec, StepStaging,
};
pub use timing::{TimerError, TimerStats, Timers};
pub use uid::{name_uid, name_uid64};

#[cfg(test)]
mod tests {
    /// Operators in toast-ops may process observations in parallel and keep
    /// device buffers in the execution context.
    #[test]
    fn thread_safety_of_the_main_types() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<crate::Data>();
        send_sync::<crate::Observation>();
        send_sync::<crate::DeviceBuffers>();
        send_sync::<crate::Timers>();
        send_sync::<crate::AccelStateError>();
        send::<crate::ExecContext>();
        send::<crate::OpError>();
    }
}
