//! The OpenCL device: which one (platform and device selection, the
//! fp64 and 64-bit-atomics requirement), its context, and the programs
//! built on it. All of this is made once per device and process and shared
//! by every backend context on that device; each backend context makes its
//! own queue on it (`Device::new_queue`).

use cl3::command_queue as cq;
use opencl3::context::Context;
use opencl3::device::{Device as ClDevice, CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CPU};
use opencl3::error_codes::ClError;
use opencl3::kernel::Kernel;
use opencl3::platform::get_platforms;
use opencl3::program::Program;
use opencl3::types::{cl_command_queue, cl_device_id, cl_kernel};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use toast_accel::abi;
use toast_accel::device_source::fnv1a;
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::CompileError;
use toast_gpu::DeviceMemoryKind;

/// An OpenCL error code as text: its name and number.
pub(crate) fn cl_error(code: i32) -> String {
    format!("{} ({code})", ClError(code))
}

fn unavailable(msg: impl Into<String>) -> PluginError {
    PluginError::new(abi::ERR_UNAVAILABLE, msg)
}

/// Which device to open: the plugin option `device=SEL` or
/// `TOAST_OPENCL_DEVICE=SEL`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Selector {
    /// The first device with `cl_khr_fp64` and `cl_khr_int64_base_atomics`.
    #[default]
    FirstSuitable,
    /// `N`: the N-th (from 0) suitable device, in the order `clinfo -l`
    /// lists them over all platforms: the index CUDA's and HIP's `device=N`
    /// take, and the one a node-local rank picks.
    Ordinal(usize),
    /// `P:D`: platform and device indices, as `clinfo -l` lists them.
    Index(usize, usize),
    /// A case-insensitive substring of the device name.
    Name(String),
}

impl Selector {
    /// Parse `N` (digits: an ordinal, never a name, though device names
    /// hold digits: `1` would match "avx512" or "A100"), `P:D` (two
    /// indices) or a name substring; an empty text is
    /// [`Selector::FirstSuitable`]. Every text is a valid selector (one that
    /// matches no device makes `init` report the devices there are).
    pub fn parse(text: &str) -> Selector {
        let t = text.trim();
        if t.is_empty() {
            return Selector::FirstSuitable;
        }
        if t.bytes().all(|b| b.is_ascii_digit()) {
            // Beyond usize: no such device (init lists those there are).
            return Selector::Ordinal(t.parse().unwrap_or(usize::MAX));
        }
        let index = t.split_once(':').and_then(|(p, d)| {
            Some((
                p.trim().parse::<usize>().ok()?,
                d.trim().parse::<usize>().ok()?,
            ))
        });
        match index {
            Some((p, d)) => Selector::Index(p, d),
            None => Selector::Name(t.to_string()),
        }
    }

    fn matches(&self, platform: usize, device: usize, name: &str) -> bool {
        match self {
            Selector::FirstSuitable | Selector::Ordinal(_) => true,
            Selector::Index(p, d) => (*p, *d) == (platform, device),
            Selector::Name(s) => name.to_lowercase().contains(&s.to_lowercase()),
        }
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Selector::FirstSuitable => f.write_str("(first suitable)"),
            Selector::Ordinal(n) => write!(f, "{n}"),
            Selector::Index(p, d) => write!(f, "{p}:{d}"),
            Selector::Name(s) => f.write_str(s),
        }
    }
}

/// A kernel object of a built program, and the largest work-group size it
/// can be launched with on its device (0 when unknown).
#[derive(Debug, Clone, Copy)]
pub struct ClKernel {
    pub(crate) raw: cl_kernel,
    pub(crate) max_local: usize,
}

// SAFETY: the kernel object is owned by a `Device` in the process-wide
// `OPENED` list, which is never dropped, so the handle stays valid on every
// thread; setting its arguments and enqueueing it (the only non-thread-safe
// use, per the OpenCL specification) happen under `Device::launch`.
unsafe impl Send for ClKernel {}
// SAFETY: see `Send`; the handle itself is never mutated.
unsafe impl Sync for ClKernel {}

/// A command queue, released when dropped. Not opencl3's `CommandQueue`,
/// whose `Drop` panics when `clReleaseCommandQueue` fails (a lost device, a
/// driver shutting down): a backend context is destroyed inside a C call,
/// where a panic is an error at best and an abort while unwinding from
/// another. A release that fails here leaves the queue to the driver.
#[derive(Debug)]
pub(crate) struct Queue(cl_command_queue);

impl Queue {
    /// The queue's handle, for the enqueue calls.
    pub(crate) fn get(&self) -> cl_command_queue {
        self.0
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the queue `Device::new_queue` created, owned by this
        // value alone and released once, here.
        let _ = unsafe { cq::release_command_queue(self.0) };
    }
}

// SAFETY: OpenCL command-queues are thread-safe objects (every OpenCL API
// call but `clSetKernelArg` and `clSetKernelExecInfo` may be made from any
// thread, OpenCL 3.0 appendix A.2); the handle itself is never mutated.
unsafe impl Send for Queue {}
// SAFETY: as for `Send`.
unsafe impl Sync for Queue {}

/// A program built on the device, by the hash of its binary, with the
/// kernel objects created from it so far.
#[derive(Debug)]
struct Built {
    image: u64,
    program: Program,
    kernels: HashMap<&'static str, Kernel>,
}

/// What was compiled and built on the device in this process.
#[derive(Debug, Default)]
struct Programs {
    /// Source hash → the binary its compilation gave.
    compiled: Vec<(u64, Vec<u8>)>,
    built: Vec<Built>,
}

/// The selected device, its context and what was built on it.
#[derive(Debug)]
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) platform: String,
    pub(crate) driver: String,
    /// `"<platform>, driver <version>"`: what the binaries depend on.
    pub(crate) arch: String,
    pub(crate) global_mem: u64,
    pub(crate) max_alloc: u64,
    pub(crate) compute_units: u32,
    /// Whose memory its allocations take: [`memory_kind`].
    pub(crate) memory: DeviceMemoryKind,
    /// Its identity: [`uuid`].
    pub(crate) uuid: Option<[u8; 16]>,
    /// `CL_DEVICE_MAX_WORK_ITEM_SIZES[0]`.
    max_items0: usize,
    id: cl_device_id,
    pub(crate) context: Context,
    programs: Mutex<Programs>,
    /// Serialises setting kernel arguments and enqueueing (kernel objects
    /// are shared by every backend context on the device).
    pub(crate) launch: Mutex<()>,
}

// SAFETY: `id` is a device handle, valid for the life of the process and
// usable from any thread; every other field is an OpenCL object wrapper that
// is Send + Sync, or behind a mutex.
unsafe impl Send for Device {}
// SAFETY: as for `Send`.
unsafe impl Sync for Device {}

/// Every device of every platform: `(platform index, device index,
/// platform name, device)`.
fn all_devices() -> Result<Vec<(usize, usize, String, ClDevice)>, PluginError> {
    let platforms = get_platforms().map_err(|e| {
        unavailable(format!(
            "no OpenCL platform (the ICD loader found none: {})",
            cl_error(e.0)
        ))
    })?;
    let mut out = Vec::new();
    for (pi, p) in platforms.iter().enumerate() {
        let pname = p.name().unwrap_or_else(|_| format!("platform {pi}"));
        // A platform without devices reports CL_DEVICE_NOT_FOUND.
        let ids = p.get_devices(CL_DEVICE_TYPE_ALL).unwrap_or_default();
        for (di, id) in ids.into_iter().enumerate() {
            out.push((pi, di, pname.clone(), ClDevice::new(id)));
        }
    }
    Ok(out)
}

/// Why a device cannot run the kernels, if it cannot.
fn unsuitable(d: &ClDevice) -> Option<String> {
    let ext = d.extensions().unwrap_or_default();
    let missing: Vec<&str> = ["cl_khr_fp64", "cl_khr_int64_base_atomics"]
        .into_iter()
        .filter(|e| !ext.split_whitespace().any(|x| x == *e))
        .collect();
    (!missing.is_empty()).then(|| format!("it lacks {}", missing.join(" and ")))
}

/// Whose memory `d`'s allocations take: the host's for a CPU device (PoCL)
/// and for a device that shares the host's memory
/// (`CL_DEVICE_HOST_UNIFIED_MEMORY`: integrated GPUs; deprecated in OpenCL
/// 2.0 but still answered), its own otherwise; unknown where the device
/// answers neither query.
fn memory_kind(d: &ClDevice) -> DeviceMemoryKind {
    let cpu = d.dev_type().map(|t| t & CL_DEVICE_TYPE_CPU != 0);
    match (cpu, d.host_unified_memory()) {
        (Ok(true), _) | (_, Ok(true)) => DeviceMemoryKind::Host,
        (Ok(false), Ok(false)) => DeviceMemoryKind::Own,
        _ => DeviceMemoryKind::Unknown,
    }
}

/// `d`'s UUID (`CL_DEVICE_UUID_KHR`) where it has `cl_khr_device_uuid`
/// (NVIDIA's, AMD's and Intel's GPU drivers), the same in every process
/// that opens the device; `None` otherwise. It counts the processes of a
/// node that share the device.
fn uuid(d: &ClDevice) -> Option<[u8; 16]> {
    let ext = d.extensions().unwrap_or_default();
    if !ext.split_whitespace().any(|x| x == "cl_khr_device_uuid") {
        return None;
    }
    d.uuid_khr().ok()
}

/// Devices opened so far, by (platform index, device index): the OpenCL
/// context and programs are made once per device and process and shared by
/// every backend context (the lock also serialises opening).
#[allow(clippy::type_complexity)]
static OPENED: Mutex<Vec<((usize, usize), Arc<Device>)>> = Mutex::new(Vec::new());

/// Open the device `selector` names, or return it if this process opened it
/// already; with [`Selector::FirstSuitable`] and a node-local rank, the
/// suitable device `rank % count` instead of the first. A missing runtime,
/// no device, no match or an unsuitable device is `ERR_UNAVAILABLE` with
/// the reason.
pub(crate) fn open(
    selector: &Selector,
    node_local: Option<usize>,
) -> Result<Arc<Device>, PluginError> {
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = cl3::load_library() {
        return Err(unavailable(format!(
            "no OpenCL runtime (libOpenCL.so.1): {e}"
        )));
    }
    let devs = all_devices()?;
    if devs.is_empty() {
        return Err(unavailable(
            "no OpenCL device: the OpenCL platforms list no device (install an ICD such as pocl-opencl-icd)",
        ));
    }
    let listing = || {
        devs.iter()
            .map(|(p, d, pn, dev)| format!("{p}:{d} `{}` ({pn})", dev.name().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let suitable: Vec<_> = devs.iter().filter(|d| unsuitable(&d.3).is_none()).collect();
    let chosen = if let Selector::Ordinal(n) = *selector {
        suitable.get(n).copied().ok_or_else(|| {
            unavailable(format!(
                "no OpenCL device {n} (TOAST_OPENCL_DEVICE or option device=): {} device(s) \
                 have cl_khr_fp64 and cl_khr_int64_base_atomics, numbered from 0; devices: {}",
                suitable.len(),
                listing()
            ))
        })?
    } else if *selector == Selector::FirstSuitable {
        let index = node_local.map_or(0, |rank| rank % suitable.len().max(1));
        suitable.get(index).copied().ok_or_else(|| {
            unavailable(format!(
                "no OpenCL device has cl_khr_fp64 and cl_khr_int64_base_atomics; devices: {}",
                listing()
            ))
        })?
    } else {
        let f = devs
            .iter()
            .find(|(p, d, _, dev)| selector.matches(*p, *d, &dev.name().unwrap_or_default()))
            .ok_or_else(|| {
                unavailable(format!(
                    "no OpenCL device matches `{selector}` (TOAST_OPENCL_DEVICE or option device=); devices: {}",
                    listing()
                ))
            })?;
        if let Some(why) = unsuitable(&f.3) {
            return Err(unavailable(format!(
                "OpenCL device `{}` cannot run the kernels: {why}",
                f.3.name().unwrap_or_default()
            )));
        }
        f
    };
    let (pi, di, pname, d) = chosen;
    if let Some((_, dev)) = opened.iter().find(|(k, _)| *k == (*pi, *di)) {
        return Ok(Arc::clone(dev));
    }
    let name = d.name().unwrap_or_default();
    let failed = |what: &str, e: ClError| {
        PluginError::new(
            abi::ERR_DEVICE,
            format!(
                "opencl: cannot create an OpenCL {what} on `{name}`: {}",
                cl_error(e.0)
            ),
        )
    };
    let context = Context::from_device(d).map_err(|e| failed("context", e))?;
    let driver = d.driver_version().unwrap_or_default();
    let dev = Arc::new(Device {
        arch: format!("{pname}, driver {driver}"),
        name,
        platform: pname.clone(),
        driver,
        global_mem: d.global_mem_size().unwrap_or(0),
        max_alloc: d.max_mem_alloc_size().unwrap_or(u64::MAX),
        compute_units: d.max_compute_units().unwrap_or(0),
        memory: memory_kind(d),
        uuid: uuid(d),
        max_items0: d
            .max_work_item_sizes()
            .ok()
            .and_then(|s| s.first().copied())
            .unwrap_or(0),
        id: d.id(),
        context,
        programs: Mutex::new(Programs::default()),
        launch: Mutex::new(()),
    });
    opened.push(((*pi, *di), Arc::clone(&dev)));
    Ok(dev)
}

impl Device {
    /// A new in-order queue on the device, for one backend context: its
    /// copies, fills and launches, and the `clFinish` that waits for them,
    /// see only that context's commands, so a command that fails is
    /// reported to the context that queued it (as a CUDA or HIP context has
    /// its own stream).
    pub(crate) fn new_queue(&self) -> Result<Queue, PluginError> {
        // SAFETY: `id` is the device of `context`; no queue properties are
        // requested.
        let raw = unsafe { cq::create_command_queue(self.context.get(), self.id, 0) };
        raw.map(Queue).map_err(|e| {
            PluginError::new(
                abi::ERR_DEVICE,
                format!(
                    "opencl: cannot create an OpenCL queue on `{}`: {}",
                    self.name,
                    cl_error(e)
                ),
            )
        })
    }

    fn programs(&self) -> std::sync::MutexGuard<'_, Programs> {
        self.programs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Build `source` for this device and return the program's binary (or
    /// the source itself when the implementation gives no binary) and the
    /// build log. The built program is kept, so loading the binary next
    /// builds nothing, and a second compilation of the same source in this
    /// process returns the same binary.
    pub(crate) fn compile(&self, source: &str) -> Result<(Vec<u8>, String), CompileError> {
        let hash = fnv1a(source.as_bytes());
        let mut progs = self.programs();
        if let Some((_, image)) = progs.compiled.iter().find(|(h, _)| *h == hash) {
            return Ok((image.clone(), String::new()));
        }
        let program =
            Program::create_and_build_from_source(&self.context, source, "").map_err(|log| {
                CompileError {
                    message: format!(
                        "clBuildProgram failed for OpenCL device `{}` (source hash {hash:016x})",
                        self.name
                    ),
                    log,
                }
            })?;
        let log = program.get_build_log(self.id).unwrap_or_default();
        let image = program
            .get_binaries()
            .ok()
            .and_then(|b| b.into_iter().next())
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| source.as_bytes().to_vec());
        progs.built.push(Built {
            image: fnv1a(&image),
            program,
            kernels: HashMap::new(),
        });
        progs.compiled.push((hash, image.clone()));
        Ok((image, log))
    }

    /// The kernels `names` of the program whose binary is `image`: the one
    /// built in this process, else one built from the binary now.
    pub(crate) fn load(
        &self,
        image: &[u8],
        names: &[&'static str],
    ) -> Result<Vec<ClKernel>, PluginError> {
        let hash = fnv1a(image);
        let mut progs = self.programs();
        let at = match progs.built.iter().position(|b| b.image == hash) {
            Some(i) => i,
            None => {
                let program = Program::create_and_build_from_binary(&self.context, &[image], "")
                    .map_err(|e| {
                        PluginError::new(
                            abi::ERR_COMPILE,
                            format!(
                                "opencl: OpenCL device `{}` refused the program binary: {}",
                                self.name,
                                cl_error(e.0)
                            ),
                        )
                    })?;
                progs.built.push(Built {
                    image: hash,
                    program,
                    kernels: HashMap::new(),
                });
                progs.built.len() - 1
            }
        };
        let built = &mut progs.built[at];
        let mut out = Vec::with_capacity(names.len());
        for &k in names {
            let kernel = match built.kernels.entry(k) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let kern = Kernel::create(&built.program, k).map_err(|err| {
                        PluginError::new(
                            abi::ERR_COMPILE,
                            format!(
                                "opencl: kernel {k} not found in the program built for `{}`: {}",
                                self.name,
                                cl_error(err.0)
                            ),
                        )
                    })?;
                    e.insert(kern)
                }
            };
            let wg = kernel.get_work_group_size(self.id).unwrap_or(0);
            out.push(ClKernel {
                raw: kernel.get(),
                max_local: wg.min(self.max_items0),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        assert_eq!(Selector::parse(" "), Selector::FirstSuitable);
        assert_eq!(Selector::parse("0:1"), Selector::Index(0, 1));
        // Digits are an ordinal, not a name fragment ("1" is in "avx512").
        assert_eq!(Selector::parse(" 1 "), Selector::Ordinal(1));
        assert_eq!(Selector::parse("007"), Selector::Ordinal(7));
        assert_eq!(
            Selector::parse("99999999999999999999999"),
            Selector::Ordinal(usize::MAX)
        );
        assert_eq!(Selector::parse("-1"), Selector::Name("-1".into()));
        assert_eq!(Selector::parse(" 2 : 3 "), Selector::Index(2, 3));
        assert_eq!(Selector::parse("pthread"), Selector::Name("pthread".into()));
        assert_eq!(Selector::parse("a:b"), Selector::Name("a:b".into()));
        assert!(Selector::Name("XEON".into()).matches(0, 0, "Intel(R) Xeon(R)"));
        assert!(!Selector::Index(0, 1).matches(0, 0, "x"));
        assert_eq!(Selector::Index(1, 2).to_string(), "1:2");
    }
}
