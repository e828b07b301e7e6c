//! The `#[repr(C)]` mirror of `include/toast_backend.h`.
//!
//! Everything here is plain data shared by the host (which loads plugins)
//! and by plugins written in Rust. Field order, sizes and constants must
//! match the C header exactly; `tests/abi_layout.rs` in this crate checks
//! the sizes and offsets against the header compiled by the C compiler.
//!
//! The function table's kernel slots, the [`Kernel`] enum and the
//! `KernelArgs` impls of the argument structs are expanded from the kernel
//! table (`crate::kernels`); the argument structs themselves are written
//! here, as the header writes them.

use std::ffi::{c_char, c_void};

/// The bytes `"TOASTBKD"` read as a little-endian `u64`.
pub const MAGIC: u64 = 0x444B_4254_5341_4F54;
/// ABI major version: the host refuses a plugin with another major.
pub const ABI_MAJOR: u32 = 1;
/// ABI minor version: tables only grow at the end between minors.
pub const ABI_MINOR: u32 = 10;
/// The name of the one symbol a plugin exports.
pub const ENTRY_SYMBOL: &str = "toast_backend_entry";

/// Status code returned by every plugin function.
pub type Status = i32;
pub const OK: Status = 0;
pub const ERR_INVALID_ARGUMENT: Status = 1;
pub const ERR_OUT_OF_MEMORY: Status = 2;
pub const ERR_UNSUPPORTED: Status = 3;
pub const ERR_INVALID_HANDLE: Status = 4;
pub const ERR_DEVICE: Status = 5;
pub const ERR_UNAVAILABLE: Status = 6;
pub const ERR_COMPILE: Status = 7;
pub const ERR_PANIC: Status = 8;
pub const ERR_INTERNAL: Status = 9;

pub const LOG_ERROR: i32 = 1;
pub const LOG_WARN: i32 = 2;
pub const LOG_INFO: i32 = 3;
pub const LOG_DEBUG: i32 = 4;
pub const LOG_TRACE: i32 = 5;

/// Backend capability: kernels take host addresses in [`Array::ptr`].
pub const FLAG_HOST_ADDRESSABLE: u32 = 1;

pub const DTYPE_F64: i32 = 0;
pub const DTYPE_F32: i32 = 1;
pub const DTYPE_I64: i32 = 2;
pub const DTYPE_I32: i32 = 3;

/// Logging callback the host passes to `init`.
pub type LogFn =
    Option<unsafe extern "C" fn(user: *mut c_void, level: i32, msg: *const c_char, len: usize)>;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostApi {
    pub size: u32,
    pub abi_minor: u32,
    pub log: LogFn,
    pub log_user: *mut c_void,
    pub options: *const c_char,
}

/// A kernel array: host address or buffer handle, and a length in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Array {
    pub ptr: u64,
    pub len: u64,
}

impl Array {
    /// The absent array (`len == 0`).
    pub const ABSENT: Array = Array { ptr: 0, len: 0 };
}

/// The samples `first..last` (exclusive) of one interval, as kernels take
/// them (C: `toast_interval`). Not `toast_core::Interval`, which also
/// carries the interval's start and stop times (TOAST's `interval_dtype`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SampleRange {
    pub first: i64,
    /// Exclusive.
    pub last: i64,
}

/// A host array of [`SampleRange`]s (C: `toast_intervals`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SampleRanges {
    pub ptr: *const SampleRange,
    pub len: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceInfo {
    pub name: [c_char; 128],
    pub total_memory: u64,
    pub free_memory: u64,
    pub compute_units: u32,
    /// The most device memory the backend's allocator has held at once
    /// since `init` (its buffers, kernel scratch and caches), in MiB rounded
    /// up; 0 when unknown or not tracked (a host-addressable backend, a
    /// plugin built before ABI minor 7, where this field was `reserved`).
    pub peak_held_mib: u32,
    /// ABI minor 9: whose memory the device's allocations take
    /// (`DEVICE_MEMORY_*`). Present only in a host of minor 9 or later:
    /// a plugin writes it only for such a host
    /// ([`DeviceInfo::write_for_host`]).
    pub memory_kind: u32,
    /// ABI minor 9: 0.
    pub reserved: u32,
    /// ABI minor 10: the device's identity, the same in every process
    /// that drives the device and different for every other device (CUDA's
    /// and HIP's device UUID, OpenCL's `cl_khr_device_uuid`); all zero when
    /// the plugin cannot tell. The host counts the processes of a node that
    /// share a device by it ([`DeviceInfo::identity`]). Present only in a
    /// host of minor 10 or later.
    pub uuid: [u8; 16],
}

/// `memory_kind`: not known (a plugin before minor 9 leaves 0).
pub const DEVICE_MEMORY_UNKNOWN: u32 = 0;
/// `memory_kind`: the device has its own memory; its allocations take none
/// of the host's (a discrete GPU).
pub const DEVICE_MEMORY_OWN: u32 = 1;
/// `memory_kind`: the device's allocations take the host's memory (a CPU
/// device, an integrated GPU or APU).
pub const DEVICE_MEMORY_HOST: u32 = 2;

impl DeviceInfo {
    /// The struct with every field zero (memory kind unknown).
    pub const ZERO: DeviceInfo = DeviceInfo {
        name: [0; 128],
        total_memory: 0,
        free_memory: 0,
        compute_units: 0,
        peak_held_mib: 0,
        memory_kind: DEVICE_MEMORY_UNKNOWN,
        reserved: 0,
        uuid: [0; 16],
    };

    /// The bytes of the `toast_device_info` a host of ABI minor
    /// `host_minor` has (C: `TOAST_DEVICE_INFO_SIZE`): the struct ended at
    /// `peak_held_mib` before minor 9, at `reserved` before minor 10.
    pub const fn size_for_host(host_minor: u32) -> usize {
        if host_minor >= 10 {
            std::mem::size_of::<DeviceInfo>()
        } else if host_minor >= 9 {
            std::mem::offset_of!(DeviceInfo, uuid)
        } else {
            std::mem::offset_of!(DeviceInfo, memory_kind)
        }
    }

    /// The device's identity ([`DeviceInfo::uuid`]) as a plugin of ABI
    /// minor `plugin_minor` tells it: `None` from a plugin before minor 10
    /// (which does not write it) or one that cannot tell (all zero).
    pub fn identity(&self, plugin_minor: u32) -> Option<[u8; 16]> {
        (plugin_minor >= 10 && self.uuid != [0; 16]).then_some(self.uuid)
    }

    /// Write `self` into the host's struct at `dst`: only the bytes a host
    /// of ABI minor `host_minor` has ([`DeviceInfo::size_for_host`]), as a
    /// plugin of a newer minor must under an older host.
    ///
    /// # Safety
    /// `dst` is valid for writes of `DeviceInfo::size_for_host(host_minor)`
    /// bytes (the host's struct) and does not overlap `self`.
    pub unsafe fn write_for_host(&self, dst: *mut DeviceInfo, host_minor: u32) {
        let n = DeviceInfo::size_for_host(host_minor);
        // SAFETY: `self` is a whole struct (n bytes readable); the caller
        // guarantees `n` writable bytes at `dst`, apart from `self`.
        unsafe {
            std::ptr::copy_nonoverlapping(self as *const DeviceInfo as *const u8, dst as *mut u8, n)
        };
    }
}

/// Whose memory a device's allocations take (`toast_device_info`'s
/// `memory_kind`, ABI minor 9): the host counts a device run's device
/// memory in its host memory check where it is the host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceMemoryKind {
    /// Not told (a plugin before minor 9, or one that cannot know):
    /// treated as the device's own.
    #[default]
    Unknown,
    /// The device's own memory (a discrete GPU).
    Own,
    /// The host's memory (a CPU device, an integrated GPU or APU).
    Host,
}

impl DeviceMemoryKind {
    /// The ABI value (`DEVICE_MEMORY_*`).
    pub const fn to_abi(self) -> u32 {
        match self {
            DeviceMemoryKind::Unknown => DEVICE_MEMORY_UNKNOWN,
            DeviceMemoryKind::Own => DEVICE_MEMORY_OWN,
            DeviceMemoryKind::Host => DEVICE_MEMORY_HOST,
        }
    }

    /// The kind of an ABI value; a value this host does not know is
    /// [`DeviceMemoryKind::Unknown`].
    pub const fn from_abi(v: u32) -> DeviceMemoryKind {
        match v {
            DEVICE_MEMORY_OWN => DeviceMemoryKind::Own,
            DEVICE_MEMORY_HOST => DeviceMemoryKind::Host,
            _ => DeviceMemoryKind::Unknown,
        }
    }

    /// Whether the device's allocations take the host's memory.
    pub const fn is_host(self) -> bool {
        matches!(self, DeviceMemoryKind::Host)
    }
}

impl std::fmt::Display for DeviceMemoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceMemoryKind::Unknown => "unknown",
            DeviceMemoryKind::Own => "its own",
            DeviceMemoryKind::Host => "the host's",
        })
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PointingDetectorArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub quat_index: *const i32,
    pub focalplane: *const f64,
    pub intervals: SampleRanges,
    pub boresight: Array,
    pub shared_flags: Array,
    pub shared_flag_mask: u8,
    pub reserved: [u8; 7],
    pub quats: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PixelsHealpixArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub quat_index: *const i32,
    pub pixel_index: *const i32,
    pub intervals: SampleRanges,
    pub quats: Array,
    pub shared_flags: Array,
    pub pixels: Array,
    pub hit_submaps: Array,
    pub nside: i64,
    pub n_pix_submap: i64,
    pub shared_flag_mask: u8,
    pub nest: u8,
    /// ABI minor 8 (before: reserved, 0): 1 when `pixels` is i32 (the
    /// compact pointing); set only for a plugin of minor 8 or later.
    pub pixels_i32: u8,
    pub reserved: [u8; 5],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StokesWeightsIArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub weight_index: *const i32,
    pub cal: *const f64,
    pub intervals: SampleRanges,
    pub weights: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StokesWeightsIquArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub quat_index: *const i32,
    pub weight_index: *const i32,
    pub epsilon: *const f64,
    pub gamma: *const f64,
    pub cal: *const f64,
    pub intervals: SampleRanges,
    pub quats: Array,
    pub hwp: Array,
    pub weights: Array,
    pub iau: u8,
    pub reserved: [u8; 7],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ScanMapArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub nnz: u64,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub data_index: *const i32,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub map_dtype: i32,
    pub reserved0: i32,
    pub mapdata: Array,
    pub pixels: Array,
    pub weights: Array,
    pub det_data: Array,
    pub data_scale: f64,
    pub should_zero: u8,
    pub should_subtract: u8,
    pub should_scale: u8,
    pub reserved: [u8; 5],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BuildNoiseWeightedArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub nnz: u64,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub data_index: *const i32,
    pub flag_index: *const i32,
    pub det_scale: *const f64,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub pixels: Array,
    pub weights: Array,
    pub det_data: Array,
    pub det_flags: Array,
    pub shared_flags: Array,
    pub zmap: Array,
    pub det_flag_mask: u8,
    pub shared_flag_mask: u8,
    pub reserved: [u8; 6],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NoiseWeightArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub data_index: *const i32,
    pub detector_weights: *const f64,
    pub intervals: SampleRanges,
    pub det_data: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct OffsetLayout {
    pub step_length: i64,
    pub n_amp_views: *const i64,
    pub amp_offset: *const i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TemplateOffsetAddArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub data_index: *const i32,
    pub layout: OffsetLayout,
    pub intervals: SampleRanges,
    pub amplitudes: Array,
    pub amplitude_flags: Array,
    pub det_data: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TemplateOffsetProjectArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub data_index: *const i32,
    pub flag_index: *const i32,
    pub layout: OffsetLayout,
    pub intervals: SampleRanges,
    pub det_data: Array,
    pub flag_data: Array,
    pub amplitudes: Array,
    pub amplitude_flags: Array,
    pub flag_mask: u8,
    pub reserved: [u8; 7],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TemplateOffsetPrecondArgs {
    pub n_amp: u64,
    pub offset_var: Array,
    pub amplitudes_in: Array,
    pub amplitude_flags: Array,
    pub amplitudes_out: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CovAccumDiagHitsArgs {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub submap: Array,
    pub subpix: Array,
    pub hits: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CovAccumDiagInvnppArgs {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub submap: Array,
    pub subpix: Array,
    pub weights: Array,
    pub scale: f64,
    pub invnpp: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FilterPolynomialArgs {
    pub n_signal: u64,
    pub n_samp: u64,
    pub n_scan: u64,
    pub order: i64,
    pub signal_index: *const i32,
    pub starts: *const i64,
    pub stops: *const i64,
    pub flags: Array,
    pub signals: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FilterPoly2dArgs {
    pub n_samp: u64,
    pub n_det: u64,
    pub n_group: u64,
    pub n_mode: u64,
    pub det_groups: *const i32,
    pub templates: *const f64,
    pub signals: Array,
    pub masks: Array,
    pub coeff: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CovApplyDiagArgs {
    pub nsub: i64,
    pub nsubpix: i64,
    pub nnz: i64,
    pub mat: Array,
    pub vec: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AmpDotArgs {
    pub n: i64,
    pub nblock: i64,
    pub a: Array,
    pub b: Array,
    pub flags: Array,
    pub partials: Array,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AmpAxpbyArgs {
    pub n: i64,
    pub alpha: f64,
    pub beta: f64,
    pub x: Array,
    pub y: Array,
}

/// `compact_expand_pointing` (ABI minor 4): pixels widened from the compact
/// i32 pixels and IQU weights rebuilt from the boresight.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CompactExpandPointingArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub nnz: u64,
    pub compact_index: *const i32,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub focalplane: *const f64,
    pub epsilon: *const f64,
    pub gamma: *const f64,
    pub cal: *const f64,
    pub intervals: SampleRanges,
    pub compact: Array,
    pub boresight: Array,
    pub pointing_flags: Array,
    pub hwp: Array,
    pub pixels: Array,
    pub weights: Array,
    pub out_first: i64,
    pub out_n_samp: u64,
    pub pointing_flag_mask: u8,
    pub iau: u8,
    pub reserved: [u8; 6],
}

/// `fused_accumulate` (ABI minor 4): a timestream or `F a` binned into the
/// noise-weighted map with compact (rebuilt) or kept pointing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FusedAccumulateArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub focalplane: *const f64,
    pub epsilon: *const f64,
    pub gamma: *const f64,
    pub cal: *const f64,
    pub data_index: *const i32,
    pub flag_index: *const i32,
    pub det_scale: *const f64,
    pub finite: *const u8,
    pub layout: OffsetLayout,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub compact: Array,
    pub boresight: Array,
    pub pointing_flags: Array,
    pub hwp: Array,
    pub pixels: Array,
    pub weights: Array,
    pub det_data: Array,
    pub det_flags: Array,
    pub shared_flags: Array,
    pub amplitudes: Array,
    pub amplitude_flags: Array,
    pub zmap: Array,
    pub det_flag_mask: u8,
    pub shared_flag_mask: u8,
    pub pointing_flag_mask: u8,
    pub iau: u8,
    pub reserved: [u8; 4],
}

/// `fused_project` (ABI minor 4): `Fᵀ N⁻¹ (t - P m)` into amplitudes, with
/// compact (rebuilt) or kept pointing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FusedProjectArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub focalplane: *const f64,
    pub epsilon: *const f64,
    pub gamma: *const f64,
    pub cal: *const f64,
    pub data_index: *const i32,
    pub flag_index: *const i32,
    pub det_scale: *const f64,
    pub layout: OffsetLayout,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub compact: Array,
    pub boresight: Array,
    pub pointing_flags: Array,
    pub hwp: Array,
    pub pixels: Array,
    pub weights: Array,
    pub det_data: Array,
    pub det_flags: Array,
    pub mapdata: Array,
    pub amplitudes: Array,
    pub amplitude_flags: Array,
    pub amplitudes_out: Array,
    pub det_flag_mask: u8,
    pub pointing_flag_mask: u8,
    pub iau: u8,
    pub reserved: [u8; 5],
}

/// `sim_noise` (ABI minor 5): TOAST's `tod_sim_noise_timestream` for a set
/// of detectors, added to their rows of `det_data` (the header documents
/// the stream).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SimNoiseArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub fft_len: u64,
    pub n_filter: u64,
    pub counter0: u64,
    pub data_index: *const i32,
    pub filter_index: *const i32,
    pub keys: *const u64,
    pub amplitudes: *const f64,
    pub det_data: Array,
}

/// `cov_accum_timestream` (ABI minor 5): the hit map and the packed
/// inverse covariance (TOAST's `BuildHitMap` and `BuildInverseCovariance`)
/// accumulated from the timestream's pointing and flags.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CovAccumTimestreamArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub nnz: u64,
    pub pixel_index: *const i32,
    pub weight_index: *const i32,
    pub flag_index: *const i32,
    pub det_scale: *const f64,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub pixels: Array,
    pub weights: Array,
    pub det_flags: Array,
    pub shared_flags: Array,
    pub hits: Array,
    pub invnpp: Array,
    pub det_flag_mask: u8,
    pub shared_flag_mask: u8,
    pub reserved: [u8; 6],
}

/// `solver_flags` (ABI minor 6): the destriping solver's sample flags
/// (TOAST's solver flags of `SolveAmplitudes` and its `ScanMask` of
/// poorly conditioned pixels), OR-ed into `flags`, with the view's cut and
/// total samples added to `counts` (the C header documents the rules).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SolverFlagsArgs {
    pub n_det: u64,
    pub n_samp: u64,
    pub flag_index: *const i32,
    pub pixel_index: *const i32,
    pub out_index: *const i32,
    pub intervals: SampleRanges,
    pub global2local: Array,
    pub n_pix_submap: i64,
    pub det_flags: Array,
    pub shared_flags: Array,
    pub pixels: Array,
    pub pixel_mask: Array,
    pub flags: Array,
    pub counts: Array,
    pub det_flag_mask: u8,
    pub shared_flag_mask: u8,
    pub cut_bit: u8,
    pub mask_bit: u8,
    pub reserved: [u8; 4],
}

pub type InitFn = unsafe extern "C" fn(host: *const HostApi, ctx: *mut *mut c_void) -> Status;
pub type ShutdownFn = unsafe extern "C" fn(ctx: *mut c_void);
pub type LastErrorFn = unsafe extern "C" fn() -> *const c_char;
pub type DeviceCountFn = unsafe extern "C" fn(ctx: *mut c_void, count: *mut u32) -> Status;
pub type DeviceInfoFn =
    unsafe extern "C" fn(ctx: *mut c_void, index: u32, info: *mut DeviceInfo) -> Status;
pub type AllocFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    bytes: u64,
    name: *const c_char,
    handle: *mut u64,
) -> Status;
pub type FreeFn = unsafe extern "C" fn(ctx: *mut c_void, handle: u64) -> Status;
pub type CopyToDeviceFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status;
pub type CopyToHostFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status;
pub type ResetFn =
    unsafe extern "C" fn(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status;
pub type SynchronizeFn = unsafe extern "C" fn(ctx: *mut c_void) -> Status;
/// A kernel entry: `ctx` and a pointer to that kernel's argument struct.
pub type KernelFn<A> = unsafe extern "C" fn(ctx: *mut c_void, args: *const A) -> Status;

/// The callback of the kernel table that declares the ABI's kernel items
/// (see `crate::kernels` for the row grammar).
macro_rules! abi_items {
    (
        []
        $((
            $slot:ident $variant:ident $name:literal $args:ident $c_args:ident
            [$($arr:ident $dir:ident),*] [$($dev:literal),*] $case:ident $check:ident ($valid:ty)
        ))*
    ) => {
        /// The function table (C: `toast_backend_table`). `None` is a NULL
        /// entry ("not supported"). The kernel slots follow the kernel
        /// table, in its order.
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default)]
        pub struct BackendTable {
            pub init: Option<InitFn>,
            pub shutdown: Option<ShutdownFn>,
            pub last_error: Option<LastErrorFn>,
            pub device_count: Option<DeviceCountFn>,
            pub device_info: Option<DeviceInfoFn>,
            pub alloc: Option<AllocFn>,
            pub free: Option<FreeFn>,
            pub copy_to_device: Option<CopyToDeviceFn>,
            pub copy_to_host: Option<CopyToHostFn>,
            pub reset: Option<ResetFn>,
            pub synchronize: Option<SynchronizeFn>,
            $(
                #[doc = concat!("`", $name, "` (C: `const ", stringify!($c_args), " *`).")]
                pub $slot: Option<KernelFn<$args>>,
            )*
        }

        impl BackendTable {
            /// The table with every entry NULL.
            pub const EMPTY: BackendTable = BackendTable {
                init: None,
                shutdown: None,
                last_error: None,
                device_count: None,
                device_info: None,
                alloc: None,
                free: None,
                copy_to_device: None,
                copy_to_host: None,
                reset: None,
                synchronize: None,
                $($slot: None,)*
            };
        }

        /// The kernels, in table order.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kernel {
            $(
                #[doc = concat!("`", $name, "`.")]
                $variant,
            )*
        }

        impl Kernel {
            /// Every kernel, in table order.
            pub const ALL: [Kernel; [$(Kernel::$variant),*].len()] = [$(Kernel::$variant),*];

            /// TOAST's registry name of the kernel.
            pub fn name(self) -> &'static str {
                match self {
                    $(Kernel::$variant => $name,)*
                }
            }

            /// Parse a registry name (as [`Kernel::name`] prints it;
            /// case-insensitive).
            pub fn from_name(name: &str) -> Option<Kernel> {
                Kernel::ALL
                    .into_iter()
                    .find(|k| k.name().eq_ignore_ascii_case(name))
            }

            /// Whether `table` has an entry for this kernel.
            pub fn in_table(self, table: &BackendTable) -> bool {
                match self {
                    $(Kernel::$variant => table.$slot.is_some(),)*
                }
            }

            /// The field of the function table (and of `toast_backend_table`
            /// in the C header) that holds this kernel's entry.
            pub fn slot(self) -> &'static str {
                match self {
                    $(Kernel::$variant => stringify!($slot),)*
                }
            }

            /// The byte offset of this kernel's slot in [`BackendTable`].
            pub fn slot_offset(self) -> usize {
                match self {
                    $(Kernel::$variant => ::std::mem::offset_of!(BackendTable, $slot),)*
                }
            }

            /// The C name of the kernel's argument struct.
            pub fn c_args(self) -> &'static str {
                match self {
                    $(Kernel::$variant => stringify!($c_args),)*
                }
            }
        }

        $(
            impl $crate::kernels::KernelArgs for $args {
                const KERNEL: Kernel = Kernel::$variant;
                type Valid<'a> = $valid;
                fn entry(table: &BackendTable) -> Option<KernelFn<Self>> {
                    table.$slot
                }
                unsafe fn check<'a>(&self) -> Result<Self::Valid<'a>, $crate::check::ArgError> {
                    // SAFETY: the caller's contract is the validator's.
                    unsafe { $crate::check::$check(self) }
                }
                fn arrays(&self) -> Vec<(&'static str, $crate::kernels::ArrayDir, Array)> {
                    vec![$((stringify!($arr), $crate::kernels::ArrayDir::$dir, self.$arr)),*]
                }
                fn arrays_mut(
                    &mut self,
                ) -> Vec<(&'static str, $crate::kernels::ArrayDir, &mut Array)> {
                    vec![$((stringify!($arr), $crate::kernels::ArrayDir::$dir, &mut self.$arr)),*]
                }
            }
        )*

        /// The device kernels' entry points (`device/kernels.h`), in table
        /// order; `scan_map` has one per map dtype.
        pub const DEVICE_KERNEL_NAMES: &[&str] = &[$($($dev,)*)*];
    };
}

// The function table, the kernel enum and the `KernelArgs` impls, from the
// kernel table (`crate::kernels`).
crate::toast_kernels!((abi_items));

#[repr(C)]
#[derive(Debug)]
pub struct BackendHeader {
    pub magic: u64,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub table_size: u32,
    pub flags: u32,
    pub name: *const c_char,
    pub version: *const c_char,
    pub description: *const c_char,
    pub table: *const BackendTable,
}

// SAFETY: a header is immutable static data (pointers to static strings and a
// static table); sharing it between threads only ever reads it.
unsafe impl Sync for BackendHeader {}

/// Signature of the exported entry symbol.
pub type EntryFn = unsafe extern "C" fn() -> *const BackendHeader;

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
