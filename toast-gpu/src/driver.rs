//! The interface between the generic code of this crate and one GPU API:
//! the [`Driver`] trait and the small types its methods take.

use std::ffi::c_void;
use std::fmt;
pub use toast_accel::abi::DeviceMemoryKind;
use toast_accel::device_source::Target;
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::{CacheKey, CompileError, Compiled};

/// One device opened through one GPU API: what a backend supplies.
///
/// The implementing type is the backend's device context (the driver's
/// handles, the device it opened, its stream or queue, its run-time
/// compiler). [`Context`](crate::context::Context) wraps it with everything
/// that is the same for every API: the host's log callback and options, the
/// buffer pool and handle table, and the compiled module.
///
/// # Errors
///
/// Every fallible method converts the API's own error codes into the
/// ABI's typed error, [`PluginError`] (a status and a message), with the
/// status the ABI documents: `ERR_UNAVAILABLE` from [`open`](Self::open)
/// when the library, the driver or the device is missing, `ERR_COMPILE`
/// when [`load_module`](Self::load_module) rejects the compiled code,
/// `ERR_DEVICE` for a failing driver call, `ERR_INVALID_ARGUMENT` for a bad
/// device selection. Messages start with the backend's [`NAME`](Self::NAME)
/// (`"cuda: cuMemcpyHtoDAsync …"`). Allocation alone returns an
/// [`AllocError`], so that the pool can tell running out of memory (it then
/// releases its cached blocks and retries) from any other failure.
///
/// # Synchronisation
///
/// Every operation is queued in order on the backend context's own stream
/// (queue) on the device. Copies and fills return once they are complete
/// (host memory is only borrowed for the call), and so after every kernel
/// queued before them: a download sees the results of every earlier
/// launch, and its failure may be an earlier launch's. [`launch`](Self::launch) may return
/// as soon as the kernel is queued: the generic code calls
/// [`synchronize`](Self::synchronize) once per kernel call, after its last
/// launch (or reads device data, which waits the same), so that a fault is
/// reported by the call that caused it, naming the kernels it launched
/// since its last wait ([`crate::kernels`], "One synchronisation per
/// call"). A context runs one call at a time (`context::ctx_ref`), so no
/// other call's work is on the stream meanwhile.
pub trait Driver: fmt::Debug + Send + Sync + Sized + 'static {
    /// The backend's name: the plugin's name and the prefix of its messages.
    const NAME: &'static str;
    /// High bits of every buffer handle of this backend (see
    /// [`memory`](crate::memory)); distinct per backend, and above 2^47 so
    /// that no host address (the CPU backend's handles) can match.
    const HANDLE_TAG: u64;
    /// The dialect of the shared device source this backend compiles.
    const TARGET: Target;
    /// The environment variable that selects the device (`TOAST_CUDA_DEVICE`);
    /// the plugin option `device=…` overrides it.
    const DEVICE_ENV: &'static str;
    /// The run-time compiler's name, in messages (`"NVRTC"`).
    const COMPILER: &'static str;
    /// Whether [`alloc`](Self::alloc) returns zeroed memory. The pool zeroes
    /// every block it hands out; when this is `true` it zeroes only the
    /// blocks it reuses, not fresh ones. OpenCL sets it: its allocation is
    /// lazy, so the driver fills a new buffer at once, which both zeroes it
    /// and turns a failed allocation into an out-of-memory error there.
    const ZEROES_ON_ALLOC: bool = false;

    /// How a device is selected: an ordinal on CUDA and HIP. The default is
    /// the device used when neither the environment nor an option names one.
    type DeviceId: Default;
    /// A device allocation: a device address on CUDA and HIP, a memory
    /// object on OpenCL. Offsets into it are passed beside it.
    type Buffer: Copy + Eq + fmt::Debug + Send + Sync;
    /// One kernel of the loaded module, ready to launch.
    type Kernel: Copy + fmt::Debug + Send + Sync;

    /// Parse a device selection; `what` names where it came from (for the
    /// message of an `ERR_INVALID_ARGUMENT`).
    fn parse_device(text: &str, what: &str) -> Result<Self::DeviceId, PluginError>;

    /// Load the API at run time, open the device `choice` names and create
    /// its stream. A [`DeviceChoice::NodeLocal`] rank opens device
    /// `rank % count` of the devices the driver would choose from.
    fn open(choice: DeviceChoice<Self::DeviceId>) -> Result<Self, PluginError>;

    /// The line `init` logs at debug level: version, device, compiler.
    fn summary(&self) -> String;

    /// Make the device current on the calling thread (every entry point
    /// calls this first).
    fn bind(&self) -> Result<(), PluginError>;

    /// The device's name, e.g. `NVIDIA A100-SXM4-40GB`.
    fn device_name(&self) -> &str;
    /// The architecture the source is compiled for, e.g. `sm_80`, `gfx90a`.
    fn arch(&self) -> &str;
    /// Total device memory in bytes (the pool caches at most a quarter).
    fn total_memory(&self) -> u64;
    /// Free and total device memory now, in bytes. An API that cannot tell
    /// the free memory (OpenCL has no query for it) returns 0 for it, which
    /// the ABI's `toast_device_info` reads as "unknown".
    fn mem_info(&self) -> (u64, u64);
    /// The largest single allocation the device allows, in bytes
    /// (`CL_DEVICE_MAX_MEM_ALLOC_SIZE` on OpenCL); the pool never rounds a
    /// request up past it. Default: no limit beyond device memory.
    fn max_allocation(&self) -> u64 {
        u64::MAX
    }
    /// Compute units (SMs, CUs) for `device_info`; 0 when unknown.
    fn compute_units(&self) -> u32;
    /// Whose memory the device's allocations take, for `device_info` (ABI
    /// minor 9): the host counts a device in host memory (a CPU device, an
    /// integrated GPU or APU) in its host memory check.
    fn memory_kind(&self) -> DeviceMemoryKind;
    /// The device's identity for `device_info` (ABI minor 10): its UUID,
    /// the same in every process that drives the device (whatever ordinal
    /// its visible-device list gives it) and different for every other
    /// device; `None` where the API cannot tell. The host counts the
    /// processes of a node that share the device by it, and divides the
    /// default device memory budget among them.
    fn uuid(&self) -> Option<[u8; 16]>;

    /// Allocate `bytes` bytes of device memory (contents unspecified, unless
    /// [`ZEROES_ON_ALLOC`](Self::ZEROES_ON_ALLOC)).
    fn alloc(&self, bytes: u64) -> Result<Self::Buffer, AllocError>;

    /// Release a buffer.
    ///
    /// # Safety
    /// `buf` came from [`alloc`](Self::alloc) on this driver and is released
    /// once; no queued work uses it.
    unsafe fn free(&self, buf: Self::Buffer);

    /// Copy `src` to `buf` at byte `offset`; returns once the copy is done.
    ///
    /// # Safety
    /// `buf` is a live buffer of at least `offset + src.len()` bytes.
    unsafe fn upload(&self, buf: Self::Buffer, offset: u64, src: &[u8]) -> Result<(), PluginError>;

    /// Copy `dst.len()` bytes of `buf` at byte `offset` to `dst`; returns
    /// once the copy is done.
    ///
    /// # Safety
    /// `buf` is a live buffer of at least `offset + dst.len()` bytes.
    unsafe fn download(
        &self,
        buf: Self::Buffer,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), PluginError>;

    /// Set `bytes` bytes of `buf` at byte `offset` to zero; returns once done.
    ///
    /// # Safety
    /// `buf` is a live buffer of at least `offset + bytes` bytes.
    unsafe fn zero(&self, buf: Self::Buffer, offset: u64, bytes: u64) -> Result<(), PluginError>;

    /// Wait for everything this backend context queued (its stream or
    /// queue; another context's work is not waited for).
    fn synchronize(&self) -> Result<(), PluginError>;

    /// Where the compiled code of the source whose hash is `source_hash`
    /// lives in the disk cache (`toast_accel::rtc::cache_read`): a file
    /// name naming everything the code depends on (architecture, compiler
    /// version), and the identity stored in the entry and checked on every
    /// read (compiler and version, device, driver); `None` when this driver
    /// caches nothing.
    fn cache_key(&self, source_hash: &str) -> Option<CacheKey>;

    /// Compile the device source for this device.
    fn compile(&self, source: &str) -> Result<Compiled, CompileError>;

    /// Load compiled code and look up the kernels `names`, in that order.
    fn load_module(
        &self,
        image: &[u8],
        names: &[&'static str],
    ) -> Result<Vec<Self::Kernel>, PluginError>;

    /// Queue `kernel` (called `name`, for messages) on `grid` with
    /// `params`.
    ///
    /// # Safety
    /// `params` match the kernel's parameters in number, order and type,
    /// and every buffer among them is live and large enough for what the
    /// kernel reads and writes on this grid.
    unsafe fn launch(
        &self,
        name: &str,
        kernel: Self::Kernel,
        grid: Grid,
        params: &[Param<Self::Buffer>],
    ) -> Result<(), PluginError>;
}

/// A failed device allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllocError {
    /// The device has not enough free memory; the driver's message.
    OutOfMemory(String),
    /// Any other failure; the driver's message.
    Failed(String),
}

impl AllocError {
    /// The driver's message.
    pub fn message(&self) -> &str {
        match self {
            AllocError::OutOfMemory(m) | AllocError::Failed(m) => m,
        }
    }
}

/// The launch grid: `blocks` along dimensions 0, 1, 2, each of `threads`
/// threads along dimension 0 (one along 1 and 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Blocks (work groups) along each dimension.
    pub blocks: (u32, u32, u32),
    /// Threads per block along dimension 0.
    pub threads: u32,
}

/// One kernel parameter, as `toast-accel/device/kernels.h` declares it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Param<B> {
    /// `int64_t`.
    I64(i64),
    /// `int32_t`.
    I32(i32),
    /// `double`.
    F64(f64),
    /// A pointer to device memory: a whole buffer, or `None` for an absent
    /// array (the kernel never reads it then; passed as a null pointer).
    /// The kernels take whole buffers (no offset parameter): a device
    /// address on CUDA and HIP, the memory object itself on OpenCL.
    Buffer(Option<B>),
}

/// Kernel parameters laid out for `cuLaunchKernel` and
/// `hipModuleLaunchKernel`, for drivers whose [`Driver::Buffer`] is a
/// device address: one 8-byte slot per parameter. An `i32` parameter is read
/// by the driver from the low four bytes of its slot (little-endian targets
/// only, as every CUDA and ROCm platform is); an absent buffer is a null
/// pointer.
#[derive(Debug, Clone)]
pub struct ParamSlots {
    slots: Vec<u64>,
}

impl ParamSlots {
    /// The slots of `params`.
    pub fn new(params: &[Param<u64>]) -> Self {
        let slots = params
            .iter()
            .map(|p| match *p {
                Param::I64(v) => v as u64,
                Param::I32(v) => u64::from(v as u32),
                Param::F64(v) => v.to_bits(),
                Param::Buffer(b) => b.unwrap_or(0),
            })
            .collect();
        ParamSlots { slots }
    }

    /// One pointer per slot, the `kernelParams` array of the launch call;
    /// valid while `self` is alive and not otherwise borrowed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        self.slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect()
    }
}

/// Parse a device ordinal (a non-negative integer), as CUDA and HIP select
/// devices; `what` names where it came from.
/// Which device a process opens, decided once when the context is created
/// ([`crate::context::Context::new`]): the plugin option `device=` wins,
/// then the driver's environment variable (`TOAST_CUDA_DEVICE`, ...), then
/// the node-local rank a process launcher gives this process
/// ([`toast_accel::launcher::node_local_rank`]), so that the ranks of an MPI job on one node spread
/// over its devices as TOAST's `accel_assign_device` spreads them; else
/// the driver's default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChoice<Id> {
    /// The driver's default (device 0; OpenCL's first suitable device).
    Default,
    /// The device the option or the environment variable names.
    Named(Id),
    /// The process's node-local rank: device `rank % count`.
    NodeLocal {
        /// The rank.
        rank: usize,
        /// The environment variable it came from.
        from: &'static str,
    },
}

impl<Id> DeviceChoice<Id> {
    /// The device index among `count` for a [`DeviceChoice::NodeLocal`]
    /// (`None` for the other choices, or when there is no device).
    pub fn node_local_index(&self, count: usize) -> Option<usize> {
        match self {
            DeviceChoice::NodeLocal { rank, .. } if count > 0 => Some(rank % count),
            _ => None,
        }
    }

    /// How the device was chosen, for the driver's summary line.
    pub fn describe(&self) -> String {
        match self {
            DeviceChoice::Default => "the driver's default".into(),
            DeviceChoice::Named(_) => "option device= or the environment variable".into(),
            DeviceChoice::NodeLocal { rank, from } => format!("node-local rank {rank} ({from})"),
        }
    }
}

/// The ordinal to open among `count` devices (CUDA, HIP): the named one,
/// the node-local one, or 0.
pub fn ordinal_of(choice: &DeviceChoice<i32>, count: i32) -> i32 {
    match choice {
        DeviceChoice::Default => 0,
        DeviceChoice::Named(o) => *o,
        DeviceChoice::NodeLocal { .. } => choice
            .node_local_index(count.max(0) as usize)
            .map_or(0, |i| i as i32),
    }
}

pub fn parse_ordinal(text: &str, what: &str) -> Result<i32, PluginError> {
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|&d| d >= 0)
        .ok_or_else(|| {
            PluginError::invalid(format!(
                "{what}: `{text}` is not a device index (a non-negative integer)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_spread_over_the_devices() {
        let local = |rank| DeviceChoice::NodeLocal {
            rank,
            from: "SLURM_LOCALID",
        };
        assert_eq!(ordinal_of(&local(0), 2), 0);
        assert_eq!(ordinal_of(&local(1), 2), 1);
        assert_eq!(ordinal_of(&local(5), 2), 1);
        assert_eq!(ordinal_of(&local(5), 4), 1);
        assert_eq!(
            ordinal_of(&DeviceChoice::Named(3), 2),
            3,
            "checked by the driver"
        );
        assert_eq!(ordinal_of(&DeviceChoice::Default, 4), 0);
    }

    #[test]
    fn slots_and_ordinals() {
        let mut s = ParamSlots::new(&[
            Param::I64(-1),
            Param::I32(-2),
            Param::F64(1.5),
            Param::Buffer(Some(0x1000)),
            Param::Buffer(None),
        ]);
        assert_eq!(
            s.slots,
            vec![u64::MAX, 0xFFFF_FFFE, 1.5f64.to_bits(), 0x1000, 0]
        );
        assert_eq!(s.pointers().len(), 5);
        assert_eq!(parse_ordinal(" 3 ", "x").unwrap(), 3);
        let e = parse_ordinal("-1", "option device").unwrap_err();
        assert_eq!(
            e.message,
            "option device: `-1` is not a device index (a non-negative integer)"
        );
    }
}
