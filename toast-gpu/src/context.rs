//! What `init` creates and every call receives as `ctx`: the driver, the
//! host's log callback, the buffer table and the compiled module.

use crate::checked_tables::CheckedTables;
use crate::driver::{DeviceChoice, Driver};
use crate::memory::{Budget, Memory};
use crate::small_cache::SmallCache;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;
use toast_accel::abi::{self, HostApi};
use toast_accel::budget::WorkspaceLimit;
use toast_accel::device_source as ds;
use toast_accel::launcher::{node_local_rank, node_local_size};
use toast_accel::plugin_support::{HostLog, HostSettings, PluginError};
use toast_accel::rtc;

/// Where work item `t` of a launch of the polynomial filters keeps element
/// `e` of its workspace slice (`kernels.h`, "small symmetric solves").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkspaceLayout {
    /// Each item's slice in one piece (`t * len + e`): what a CPU's caches
    /// want. The default: on PoCL, `filter_poly2D` at 64 modes ran 8x
    /// slower interleaved.
    #[default]
    Contiguous,
    /// The slices interleaved (`e * items + t`), so that the threads of a
    /// warp read consecutive addresses: for GPUs, where it is unmeasured.
    Interleaved,
}

impl WorkspaceLayout {
    /// The value of the option `workspace=`.
    fn parse(v: &str) -> Result<Self, PluginError> {
        match v.trim() {
            "contiguous" => Ok(WorkspaceLayout::Contiguous),
            "interleaved" => Ok(WorkspaceLayout::Interleaved),
            other => Err(PluginError::new(
                abi::ERR_INVALID_ARGUMENT,
                format!("option workspace: `{other}` is not `contiguous` or `interleaved`"),
            )),
        }
    }
}

/// The value of the option `sync=`: whether every launch is waited for.
fn parse_sync(v: &str) -> Result<bool, PluginError> {
    match v.trim() {
        "call" => Ok(false),
        "launch" => Ok(true),
        other => Err(PluginError::invalid(format!(
            "option sync: `{other}` is not `call` (wait once per kernel call, the default) or \
             `launch` (wait after every launch)"
        ))),
    }
}

/// The backend context of one `init`: a [`Driver`] and what every backend
/// keeps beside it. The `ctx` pointer `init` hands the host is a boxed
/// `Context<D>`; `shutdown` drops it, which releases every buffer.
#[derive(Debug)]
pub struct Context<D: Driver> {
    log: HostLog,
    /// The host's ABI minor (`HostApi::abi_minor`; 0 without a host API):
    /// `device_info` writes only the fields its struct has.
    pub(crate) host_abi_minor: u32,
    pub(crate) driver: D,
    pub(crate) memory: Memory<D::Buffer>,
    /// How the polynomial filters lay out their workspace (option
    /// `workspace=`).
    pub(crate) workspace: WorkspaceLayout,
    /// The most bytes of workspace one kernel launch uses (the polynomial
    /// filters, the noise simulation: option `workspace_bytes=`, read by
    /// [`WorkspaceLimit::configured`]; a smaller value cuts the grid into
    /// more launches, as a device with less memory would: tests use it).
    pub(crate) workspace_bytes: WorkspaceLimit,
    /// Whether every launch is waited for at once (option `sync=launch`),
    /// so that a device fault names its own kernel; else once per call
    /// (`sync=call`, the default; see "One synchronisation per call" in
    /// [`crate::kernels`]).
    pub(crate) sync_each_launch: bool,
    /// The kernels of the compiled module, built on first use.
    module: Mutex<Option<HashMap<&'static str, D::Kernel>>>,
    /// The device copies of recent calls' small read-only arguments.
    small: Mutex<SmallCache>,
    /// The persistent error word of the kernels with data-dependent faults
    /// (`KernelLaunch::error_buffer`), held by one call at a time.
    error_word: Mutex<ErrorWord>,
    /// The `global2local` tables read back and checked (`checked_tables`).
    checked: Mutex<CheckedTables>,
    /// Held by every call for its duration ([`ctx_ref`]): one call at a
    /// time on the device's one stream (queue).
    calls: Mutex<()>,
}

/// The context's persistent error word: an 8-byte pool buffer, allocated by
/// the first call that needs one and kept until shutdown, that the kernels
/// with data-dependent faults record their smallest error key in.
#[derive(Debug, Default)]
pub(crate) struct ErrorWord {
    /// Its pool handle, once allocated.
    pub(crate) handle: Option<u64>,
    /// Whether it may hold something other than `NO_ERROR` (a fresh word,
    /// a key a call read, or a call that launched with it and did not read
    /// it back): the next call resets it before its launch.
    pub(crate) dirty: bool,
}

impl<D: Driver> Context<D> {
    /// Read the host API and the options, open the device and build the
    /// context. The device is the one the option `device=…` names, else
    /// the one `D::DEVICE_ENV` names, else the node-local rank's
    /// ([`crate::driver::DeviceChoice`]), else the driver's default;
    /// `memory=GiB` sets the device memory budget (else `TOAST_GPU_MEM_GB`,
    /// else the default: [`crate::memory::Budget`]);
    /// `workspace=contiguous|interleaved` sets [`WorkspaceLayout`];
    /// `workspace_bytes=N` the workspace limit of one launch;
    /// `sync=call|launch` when launches are waited for (once per call, the
    /// default, or after each launch, for debugging a device fault); any
    /// other option is refused (`ERR_INVALID_ARGUMENT`).
    ///
    /// # Safety
    /// `host` is null or points to a `HostApi` of at least `host.size`
    /// bytes whose `options` is null or NUL-terminated.
    pub unsafe fn new(host: *const HostApi) -> Result<Self, PluginError> {
        // SAFETY: the caller's contract.
        let HostSettings {
            log,
            options,
            abi_minor: host_abi_minor,
        } = unsafe { HostSettings::read(host) };
        let mut named: Option<D::DeviceId> = None;
        let mut workspace = WorkspaceLayout::default();
        // Read with the host's reader, which checks it before a run.
        let workspace_bytes = WorkspaceLimit::configured(&options).map_err(PluginError::invalid)?;
        let mut sync_each_launch = false;
        toast_accel::rtc::cache_switch_off("TOAST_KERNEL_CACHE").map_err(PluginError::invalid)?;
        if let Ok(v) = std::env::var(D::DEVICE_ENV) {
            if !v.trim().is_empty() {
                named = Some(D::parse_device(
                    &v,
                    &format!("environment variable {}", D::DEVICE_ENV),
                )?);
            }
        }
        // The budget is read by the one parser the host plans with
        // (`toast_accel::budget::Budget::configured`), so the plugin holds
        // the figure the host refused or accepted the run by (the host
        // plans within a share of it where processes share the device:
        // `Budget::shared_by`).
        let env = std::env::var("TOAST_GPU_MEM_GB").ok();
        let budget = Budget::configured(&options, env.as_deref()).map_err(PluginError::invalid)?;
        for item in options.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            match k.trim() {
                // Without a value it would name no device and still count
                // as named (MPI ranks would not spread over the devices).
                "device" if v.trim().is_empty() => {
                    return Err(PluginError::invalid(format!(
                        "{} backend: option device: an empty value names no device (leave \
                         the option out for the default device)",
                        D::NAME
                    )))
                }
                "device" => named = Some(D::parse_device(v, "option device")?),
                // Read above, with TOAST_GPU_MEM_GB.
                "memory" => {}
                "workspace" => workspace = WorkspaceLayout::parse(v)?,
                // Read above, by the host's reader.
                "workspace_bytes" => {}
                "sync" => sync_each_launch = parse_sync(v)?,
                other => {
                    return Err(PluginError::new(
                        abi::ERR_INVALID_ARGUMENT,
                        format!(
                            "{} backend: unknown option `{other}` (known: device, memory, sync, \
                         workspace, workspace_bytes)",
                            D::NAME
                        ),
                    ))
                }
            }
        }
        let choice = match (named, node_local_rank()) {
            (Some(id), _) => DeviceChoice::Named(id),
            (None, Some((rank, from))) => DeviceChoice::NodeLocal { rank, from },
            (None, None) => DeviceChoice::Default,
        };
        let how = choice.describe();
        let driver = D::open(choice)?;
        let (free, total) = driver.mem_info();
        let budget = match budget {
            // A figure the device's own memory cannot hold: the host would
            // plan a run within it that fails part way at the driver's
            // out-of-memory. A device in the host's memory (an integrated
            // GPU, an APU, PoCL) may report only a carve-out as its total
            // while it allocates from the host's memory, which the host's
            // memory check bounds: its set budget stands.
            Some(b) if total > 0 && b.bytes > total && !driver.memory_kind().is_host() => {
                return Err(PluginError::invalid(format!(
                    "{} backend: device memory budget {b} is more than the device holds, \
                     {:.3} GiB = {total} bytes: give at most that",
                    D::NAME,
                    total as f64 / (1u64 << 30) as f64
                )))
            }
            Some(b) => b,
            None => Budget::default_for(free, total),
        };
        let ctx = Context {
            log,
            host_abi_minor,
            // Freed blocks kept for reuse: a quarter of the device, shared
            // with the node's other processes, which may drive the same
            // device (the host plans each within its share of the budget,
            // but this pool holds the whole figure: its cache must not
            // take the others' shares).
            memory: Memory::new(
                D::NAME,
                D::HANDLE_TAG,
                driver.total_memory() / 4 / node_local_size().unwrap_or(1) as u64,
                budget,
            ),
            driver,
            workspace,
            workspace_bytes,
            sync_each_launch,
            module: Mutex::new(None),
            small: Mutex::new(SmallCache::default()),
            error_word: Mutex::new(ErrorWord::default()),
            checked: Mutex::new(CheckedTables::default()),
            calls: Mutex::new(()),
        };
        ctx.log(
            abi::LOG_DEBUG,
            &format!(
                "{} (device chosen by {how}; device memory budget {budget})",
                ctx.driver.summary()
            ),
        );
        Ok(ctx)
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The cache of small read-only arguments (`small_cache`), locked.
    pub(crate) fn small_cache(&self) -> std::sync::MutexGuard<'_, SmallCache> {
        // A panic while it was held left no entry half-made (each change is
        // one map operation): the cache is usable.
        self.small
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The `global2local` tables read back and checked, locked.
    pub(crate) fn checked_tables(&self) -> std::sync::MutexGuard<'_, CheckedTables> {
        // Each change is one map operation: nothing is left half-made.
        self.checked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The buffer `handle` may be written (a copy to it, a reset, its
    /// release, a kernel's output): a table read back from it is stale.
    pub(crate) fn written(&self, handle: u64) {
        self.checked_tables().written(handle);
    }

    /// The persistent error word, for one call. Calls are serialised
    /// ([`ctx_ref`]) and a call takes it once, so it is free: the lock does
    /// not wait.
    pub(crate) fn error_word(&self) -> std::sync::MutexGuard<'_, ErrorWord> {
        self.error_word.lock().unwrap_or_else(|p| {
            // A call that panicked while holding it: its state is a handle
            // and a flag; `dirty` makes the next call reset the word.
            let mut g = p.into_inner();
            g.dirty = true;
            g
        })
    }

    /// The kernel `name` of the device module, compiling (or loading from
    /// the disk cache) the shared source on first use.
    pub(crate) fn function(&self, name: &str) -> Result<D::Kernel, PluginError> {
        let mut m = self.module.lock().unwrap_or_else(|e| e.into_inner());
        let module = match &mut *m {
            Some(module) => module,
            empty => empty.insert(self.build_module()?),
        };
        module.get(name).copied().ok_or_else(|| {
            PluginError::new(
                abi::ERR_INTERNAL,
                format!("{}: kernel {name} is not in the device source", D::NAME),
            )
        })
    }

    /// Compile the shared source (or read it from the disk cache) and load
    /// it. A cache entry that is refused (cut short, damaged, built for
    /// another compiler or device: `rtc::cache_read`) or that the driver
    /// refuses to load is logged as a warning, removed, and replaced by a
    /// fresh compilation.
    fn build_module(&self) -> Result<HashMap<&'static str, D::Kernel>, PluginError> {
        let name = D::NAME;
        let source = ds::source(D::TARGET);
        let hash = format!("{:016x}", ds::source_hash(D::TARGET));
        let key = self.driver.cache_key(&hash);
        let cached = key.as_ref().and_then(|k| match rtc::cache_read(k) {
            Ok(code) => code,
            Err(reason) => {
                self.log(
                    abi::LOG_WARN,
                    &format!(
                        "{name}: cached device code ({}) discarded, compiling again: {reason}",
                        k.file
                    ),
                );
                None
            }
        });
        if let (Some(key), Some(code)) = (&key, cached) {
            match self.driver.load_module(&code, ds::KERNEL_NAMES) {
                Ok(kernels) => {
                    self.log(
                        abi::LOG_DEBUG,
                        &format!("{name}: device code from the cache ({})", key.file),
                    );
                    return Ok(ds::KERNEL_NAMES.iter().copied().zip(kernels).collect());
                }
                Err(e) => {
                    rtc::cache_discard(key);
                    self.log(
                        abi::LOG_WARN,
                        &format!(
                            "{name}: cached device code ({}) not loaded, compiling again: {}",
                            key.file, e.message
                        ),
                    )
                }
            }
        }
        let c = self.driver.compile(&source).map_err(|e| {
            let kernel = rtc::kernel_at_error(&source, &e.log);
            PluginError::new(abi::ERR_COMPILE, format!("{name}: kernel {kernel}: {e}"))
        })?;
        if !c.log.trim().is_empty() {
            self.log(
                abi::LOG_WARN,
                &format!(
                    "{name}: {} log for {}:\n{}",
                    D::COMPILER,
                    self.driver.arch(),
                    c.log
                ),
            );
        }
        if let Some(key) = &key {
            rtc::cache_write(key, &c.code);
        }
        let kernels = self.driver.load_module(&c.code, ds::KERNEL_NAMES)?;
        Ok(ds::KERNEL_NAMES.iter().copied().zip(kernels).collect())
    }

    /// Send a message to the host's log callback, if any.
    pub fn log(&self, level: i32, msg: &str) {
        self.log.log(level, msg);
    }
}

impl<D: Driver> Drop for Context<D> {
    fn drop(&mut self) {
        if self.driver.bind().is_ok() {
            let _ = self.driver.synchronize();
            self.memory.release_all(&self.driver);
        }
    }
}

/// The context of a call, held for the call ([`InCall`]): `ctx` as the
/// `Context<D>` that `init` made, its device bound to the calling thread,
/// and the context's call lock taken.
///
/// Every entry point goes through here once, so a context runs one call
/// at a time, whatever threads the host calls from. All of a context's
/// work goes to one stream (queue), where a device fault is seen by the
/// next wait on it: with two calls interleaved, one call's wait would see
/// (and report as its own) the other's fault, and a copy would wait for
/// the other's kernels. Serialised, a fault is reported by the call that
/// launched it (see "One synchronisation per call" in
/// [`crate::kernels`]); the device ran the calls one after another on its
/// one stream anyway.
///
/// # Safety
/// `ctx` is null or a live context of this plugin (made by its `init`, not
/// yet shut down).
pub(crate) unsafe fn ctx_ref<'a, D: Driver>(
    ctx: *mut c_void,
) -> Result<InCall<'a, D>, PluginError> {
    if ctx.is_null() {
        return Err(PluginError::invalid("null backend context"));
    }
    // SAFETY: by the caller's contract, a live `Context<D>` made by `init`
    // (the table hands each plugin's contexts only to its own entries).
    let c = unsafe { &*(ctx as *const Context<D>) };
    // A call that panicked while holding it (`guard` turned the panic into
    // an error) left nothing half-done behind the lock: it guards no data.
    let held = c.calls.lock().unwrap_or_else(|p| p.into_inner());
    c.driver.bind()?;
    Ok(InCall { c, _held: held })
}

/// A context for the duration of one call, its call lock held
/// ([`ctx_ref`]); dereferences to the context.
pub(crate) struct InCall<'a, D: Driver> {
    c: &'a Context<D>,
    _held: std::sync::MutexGuard<'a, ()>,
}

impl<D: Driver> std::ops::Deref for InCall<'_, D> {
    type Target = Context<D>;
    fn deref(&self) -> &Context<D> {
        self.c
    }
}
