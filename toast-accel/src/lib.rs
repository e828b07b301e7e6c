//! toast-accel: the backend plugin ABI, plugin discovery and loading, the
//! backend registry, and kernel dispatch.
//!
//! # Two halves
//!
//! Without the `host` feature this crate is only the ABI part that plugins
//! need: [`abi`] (the `#[repr(C)]` mirror of `include/toast_backend.h`),
//! [`kernels`] (the kernel table, [`toast_kernels!`], from which the
//! function table, the kernel enum, the [`kernels::KernelArgs`] impls and
//! every plugin's table follow), [`check`] (argument validation every Rust
//! backend runs at kernel entry), [`math`] (arithmetic the CPU plugin and
//! the host share) and [`plugin_support`] (last-error,
//! panic-guard and kernel-entry helpers). Backend crates
//! depend on it with `default-features = false` and see nothing else.
//!
//! With `host` (the default) it is also the loader: `host::discovery`,
//! `host::registry`, `host::dispatch`, `host::backend` and `host::stage`.
//!
//! # The ABI
//!
//! A plugin is a shared library exporting one symbol, `toast_backend_entry`,
//! that returns a pointer to a static header: a magic number (`"TOASTBKD"`),
//! the ABI major and minor version, the size of its function table, flags,
//! the backend name, version and description, and the table. The host
//! refuses another magic or another major, copies
//! `min(plugin table size, host table size)` bytes of the table into a zeroed
//! table of its own layout (tables only grow at the end, so older and newer
//! minors interoperate), and treats a null entry as "not supported". Only C
//! types cross: integers, doubles, pointers with lengths, `#[repr(C)]`
//! structs and `i32` status codes; a failed call leaves a thread-local
//! message that `last_error` returns. Device buffers are opaque 64-bit
//! handles owned by the plugin that made them. Logging crosses as a callback
//! handed to `init` and bridged into `tracing` (target `toast_backend`). A
//! third party can write a plugin in C from the header alone; the workspace
//! tests build one (`tests/c_plugin/`), and `tests/abi_layout.rs` checks
//! every size, alignment, offset and constant of [`abi`] against the header
//! as the C compiler sees it.
//!
//! # Discovery
//!
//! As the OpenCL ICD loader does it, in this order: paths the caller gives
//! (files or directories), the `TOAST_BACKEND_PATH` variable (a `PATH`-style
//! list of directories or files), the executable's directory and its
//! `deps/` (where cargo leaves the plugins it builds, so `cargo run` and
//! `cargo test` need no setup), then `/usr/local/lib/toast-backends` and
//! `<prefix>/lib/toast-backends` next to an installed `<prefix>/bin`. A
//! directory contributes the files named `libtoast_backend_<name>.so`
//! (`.dylib` on macOS, `toast_backend_<name>.dll` on Windows). Each plugin
//! records where it came from. The same file reached twice (same canonical
//! path or, on Unix, same inode) counts once.
//!
//! # Registry
//!
//! `host::Registry::discover` loads every file found. A file that does not
//! exist, does not open, lacks the entry symbol, has the wrong magic or
//! another ABI major, or has a malformed header is recorded with its
//! `host::LoadError` and skipped: never fatal. When two different files
//! carry the same backend name the first in search order wins and the other
//! is recorded as shadowed. Backends are initialised lazily, on first use;
//! one whose `init` fails (no device, no driver) stays listed as unavailable
//! with the plugin's reason. `Registry::get(name)` fails only then: with
//! `AccelError::NotFound` (saying where it searched and which files named for
//! that backend failed, and why) or `AccelError::Unavailable` (with the
//! reason). `toast-cli backends` prints all of it.
//!
//! # Dispatch
//!
//! A `host::DispatchPolicy` names backends at four levels, and the backend
//! of a kernel call is the first usable one in the order kernel override >
//! operator override > pipeline setting > run setting > `cpu`. A backend that
//! is missing, unavailable, or has a null entry for the kernel is passed over
//! for the next level down, and the reason is kept in
//! `host::Resolved::fallbacks` and logged at debug level. The resolved
//! backend is part of the timer name (`"{operator}.{kernel}[{backend}]"`),
//! so tests and timing reports show what actually ran. Settings parse from
//! strings such as `run=cuda,kernel.scan_map=cpu`.
//!
//! # Staging
//!
//! A backend with the host-addressable flag (the CPU plugin) takes host
//! addresses in its kernel arrays. For any other backend, array arguments
//! are buffer handles: pipelines stage data once (see toast-core's
//! accelerator buffers, which drive a backend through
//! `toast_core::device::DeviceMemory`), and one-off callers wrap host slices
//! in `host::ArrayArg`, which uploads inputs and downloads outputs around the
//! call. Every allocation and copy is counted in `host::TransferStats`.
//!
//! # Never unloaded
//!
//! Plugins are never unloaded: the library handle is leaked on load, and
//! backends are not shut down at exit. Function pointers, static header
//! strings and buffers handed out by a plugin therefore stay valid for the
//! life of the process, and no drop order or GPU-runtime teardown at exit
//! can crash the program.

pub mod abi;
pub mod budget;
pub mod check;
pub mod device_source;
pub mod kernels;
pub mod launcher;
pub mod math;
pub mod plugin_support;
#[cfg(feature = "rtc")]
pub mod rtc;
pub mod threads;

#[cfg(feature = "host")]
pub mod host;
