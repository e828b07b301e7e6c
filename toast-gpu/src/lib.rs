//! The code the GPU plugins of toast-rs share (`backend-cuda`,
//! `backend-hip`, `backend-opencl`), written once and generic over a
//! [`Driver`].
//!
//! # The design
//!
//! A GPU plugin is two things: what is specific to one API (CUDA's driver
//! API and NVRTC, HIP and hiprtc, OpenCL) and everything else, which is the same
//! for every API. The API-specific part is a type implementing [`Driver`],
//! in the spirit of wgpu-hal's `Api` trait: a few constants (the backend's
//! name, its handle tag, the device-source dialect, the environment
//! variable that picks the device, the compiler's name), three associated
//! types (how a device is selected, a device allocation, a loaded kernel)
//! and the raw operations: open a device and make it current, describe it,
//! allocate, free, upload, download and zero device memory, synchronise,
//! compile the source and load the result, and queue a kernel on a grid
//! with a typed parameter list ([`Param`]). Each method converts the API's
//! own errors into the ABI's typed error (`PluginError`: a status and a
//! message), except allocation, whose [`AllocError`] tells running out of
//! memory from any other failure.
//!
//! Everything else is here, written once over `D: Driver`:
//!
//! - [`context`]: the context `init` returns to the host ([`Context`]): the
//!   host's log callback, the options (`device=N`, else the driver's
//!   environment variable, else the node-local rank a process launcher
//!   gives (`OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`, ...: device
//!   `rank % count`, [`DeviceChoice`]); `memory=GiB`, the device memory
//!   budget, else `TOAST_GPU_MEM_GB`, else 90% of the free memory
//!   ([`Budget`]); `workspace=contiguous|interleaved`, the layout of the
//!   polynomial filters' workspace, and `workspace_bytes=N`, the most of it
//!   one launch uses (`toast_accel::budget::WorkspaceLimit`, the host's
//!   reader too); `sync=call|launch`, a wait per kernel call or per
//!   launch), the driver, the buffer table, the call lock (a context runs
//!   one call at a time), and the module,
//!   compiled on the first kernel call or read from the disk cache.
//! - [`memory`]: the size-class pool and the handle table (handles are
//!   tagged counters, never device addresses), held within the budget.
//! - [`kernels`]: every table kernel's validation (`toast_accel::check`),
//!   argument marshalling and launch planning (how a call is split into
//!   launches so that no two threads of one launch write the same element);
//!   a call's launches are queued and waited for once, at its end or its
//!   first read of device data, and the kernels' error word is one
//!   persistent word per context, read at that point.
//! - `small_cache`: the device copies of recent calls' small read-only
//!   arguments, keyed by their bytes, so that a repeated call neither
//!   allocates nor uploads them.
//! - `checked_tables`: the global-to-local submap tables the map kernels
//!   read back and check, kept by buffer until it is written, so that a
//!   repeated call neither downloads nor checks its table again.
//! - [`plugin`]: the ABI's function table and header, and the lifecycle and
//!   memory entry points (`init`, `shutdown`, `device_info`, `alloc`,
//!   `copy_to_device`, …), which turn results into status codes and never
//!   let a panic cross the C boundary.
//!
//! # What a backend supplies
//!
//! A backend crate (a `cdylib`) implements [`Driver`] for its device
//! context and invokes [`export_plugin!`] once at its root, which emits the
//! static table and header and the exported entry symbol
//! `toast_backend_entry`, plus `unavailable_reason()` for tests and tools
//! (`tests/fake_driver.rs` has a complete driver over host memory):
//!
//! ```text
//! toast_gpu::export_plugin!(
//!     driver = driver::CudaDriver,
//!     name = "cuda",
//!     description = "CUDA backend: the shared device kernels compiled with NVRTC at run time",
//! );
//! ```
//!
//! The entry symbol has to be defined in the plugin itself (it is what the
//! host looks up in the shared library), hence a macro; everything it
//! refers to is generic code of this crate instantiated for the driver.
//!
//! The trait does not assume device addresses: a buffer is an opaque
//! [`Driver::Buffer`] with byte offsets beside it, kernels receive whole
//! buffers, and absent arrays are `None`, so an API with memory objects
//! (OpenCL's `cl_mem`, arguments set one by one) fits as well as one with
//! pointers. Drivers with device addresses lay parameters out with
//! [`ParamSlots`] and select devices with [`parse_ordinal`].
//!
//! Where APIs differ in what the generic code relies on, the trait has a
//! hook with a default rather than a special case by name:
//! [`Driver::ZEROES_ON_ALLOC`] (OpenCL fills new buffers itself, since its
//! allocation is lazy), [`Driver::max_allocation`] (OpenCL's largest single
//! buffer caps the pool's size classes) and the free memory of
//! [`Driver::mem_info`] (0, "unknown", where the API cannot tell).

mod checked_tables;
pub mod context;
pub mod driver;
pub mod kernels;
pub mod memory;
pub mod plugin;
mod small_cache;

pub use context::Context;
pub use driver::{
    ordinal_of, parse_ordinal, AllocError, DeviceChoice, DeviceMemoryKind, Driver, Grid, Param,
    ParamSlots,
};
pub use memory::Budget;
pub use toast_accel::launcher::{node_local_rank, NODE_LOCAL_RANK_VARS};

/// Emit a GPU plugin's ABI surface for a [`Driver`] at the root of the
/// backend crate: the static function table and header (with the crate's
/// version), the exported `toast_backend_entry` that returns the header,
/// and `pub fn unavailable_reason() -> Option<String>` (why no device is
/// usable here, from the same probe as `init`).
///
/// `name` is the plugin's name in the header and must equal the driver's
/// `NAME` (checked at compile time); `description` is the header's
/// one-line description.
#[macro_export]
macro_rules! export_plugin {
    (driver = $driver:ty, name = $name:literal, description = $description:literal $(,)?) => {
        const _: () = ::std::assert!(
            $crate::plugin::same_str($name, <$driver as $crate::Driver>::NAME),
            "export_plugin!: `name` differs from the driver's NAME"
        );

        static TOAST_GPU_TABLE: $crate::plugin::BackendTable = $crate::plugin::table::<$driver>();

        static TOAST_GPU_HEADER: $crate::plugin::BackendHeader = $crate::plugin::header(
            ::std::concat!($name, "\0").as_bytes(),
            ::std::concat!(::std::env!("CARGO_PKG_VERSION"), "\0").as_bytes(),
            ::std::concat!($description, "\0").as_bytes(),
            &TOAST_GPU_TABLE,
        );

        /// The plugin's entry symbol: a pointer to its static header.
        #[no_mangle]
        pub extern "C" fn toast_backend_entry() -> *const $crate::plugin::BackendHeader {
            &TOAST_GPU_HEADER
        }

        /// Why this backend cannot run here, or `None` when a device is
        /// usable. Runs the same probe as `init` (for tests and tools).
        pub fn unavailable_reason() -> ::std::option::Option<::std::string::String> {
            $crate::plugin::unavailable_reason::<$driver>()
        }
    };
}
