//! The generic plugin end to end, through the C table that
//! `export_plugin!` emits, on a fake driver whose "device" is host memory
//! and which runs one kernel (`toast_noise_weight`) on the host: device
//! selection and options, the memory entry points and pool, the launch
//! planning of a per-sample kernel and the cache of small arguments. Needs
//! no GPU.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::Mutex;
use toast_accel::abi::{self, BackendTable, HostApi, NoiseWeightArgs, SampleRange, SampleRanges};
use toast_accel::device_source::Target;
use toast_accel::plugin_support::PluginError;
use toast_accel::rtc::{CompileError, Compiled};
use toast_gpu::{AllocError, Context, DeviceMemoryKind, Driver, Grid, Param};

/// One recorded launch.
#[derive(Debug, Clone)]
struct Launch {
    name: String,
    grid: Grid,
}

/// A device made of host memory: buffers are ids into a table of byte
/// vectors.
#[derive(Debug, Default)]
struct Fake {
    buffers: Mutex<(u64, HashMap<u64, Vec<u8>>)>,
    launches: Mutex<Vec<Launch>>,
    /// Uploads made (calls of `upload`).
    uploads: Mutex<u64>,
    /// Every driver call, by kind.
    counts: Mutex<Counts>,
    /// Whether `synchronize` fails (a device fault surfacing there).
    fail_sync: Mutex<bool>,
    /// Whether a launch after the first of a call is refused (a launch
    /// failing for its own reason, an earlier one still queued).
    fail_second_launch: Mutex<bool>,
    /// Launches queued since the last `synchronize`, and the most a
    /// `synchronize` has found queued.
    queued: Mutex<(u64, u64)>,
}

/// Driver calls of each kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    alloc: u64,
    free: u64,
    upload: u64,
    download: u64,
    zero: u64,
    launch: u64,
    sync: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, o: Counts) -> Counts {
        Counts {
            alloc: self.alloc - o.alloc,
            free: self.free - o.free,
            upload: self.upload - o.upload,
            download: self.download - o.download,
            zero: self.zero - o.zero,
            launch: self.launch - o.launch,
            sync: self.sync - o.sync,
        }
    }
}

const LIMIT: u64 = 1 << 30;

impl Fake {
    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap());
    }

    fn with<R>(&self, buf: u64, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let mut g = self.buffers.lock().unwrap();
        f(g.1.get_mut(&buf).expect("a live fake buffer"))
    }

    /// The elements of a buffer (none for an absent one).
    fn read<T: bytemuck::Pod>(&self, buf: Option<u64>) -> Vec<T> {
        buf.map_or_else(Vec::new, |b| self.with(b, |v| pods(v)))
    }
}

/// `bytes` as elements of `T` (whatever their alignment).
fn pods<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(std::mem::size_of::<T>())
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

impl Driver for Fake {
    const NAME: &'static str = "fake";
    const HANDLE_TAG: u64 = 0xFA4E_u64 << 48;
    const TARGET: Target = Target::Cuda;
    const DEVICE_ENV: &'static str = "TOAST_FAKE_DEVICE";
    const COMPILER: &'static str = "fakecc";

    type DeviceId = i32;
    type Buffer = u64;
    type Kernel = usize;

    fn parse_device(text: &str, what: &str) -> Result<i32, PluginError> {
        toast_gpu::parse_ordinal(text, what)
    }

    fn open(choice: toast_gpu::DeviceChoice<i32>) -> Result<Self, PluginError> {
        let device = toast_gpu::ordinal_of(&choice, 1);
        if device != 0 {
            return Err(PluginError::invalid(format!(
                "fake: device {device} does not exist (1 device(s))"
            )));
        }
        Ok(Fake::default())
    }

    fn summary(&self) -> String {
        "fake backend: host memory".to_string()
    }

    fn bind(&self) -> Result<(), PluginError> {
        Ok(())
    }

    fn device_name(&self) -> &str {
        "Fake device"
    }

    fn arch(&self) -> &str {
        "fake1"
    }

    fn total_memory(&self) -> u64 {
        LIMIT
    }

    fn mem_info(&self) -> (u64, u64) {
        let used: u64 = self
            .buffers
            .lock()
            .unwrap()
            .1
            .values()
            .map(|v| v.len() as u64)
            .sum();
        (LIMIT - used, LIMIT)
    }

    fn compute_units(&self) -> u32 {
        4
    }

    fn memory_kind(&self) -> DeviceMemoryKind {
        // Its buffers are host vectors.
        DeviceMemoryKind::Host
    }

    fn uuid(&self) -> Option<[u8; 16]> {
        Some(*b"fake device 0000")
    }

    fn alloc(&self, bytes: u64) -> Result<u64, AllocError> {
        if bytes > LIMIT {
            return Err(AllocError::OutOfMemory("fake: out of memory".into()));
        }
        self.count(|c| c.alloc += 1);
        let mut g = self.buffers.lock().unwrap();
        g.0 += 1;
        let id = g.0;
        // Not zeroed: the pool must zero it.
        g.1.insert(id, vec![0xAB; bytes as usize]);
        Ok(id)
    }

    unsafe fn free(&self, buf: u64) {
        self.count(|c| c.free += 1);
        assert!(self.buffers.lock().unwrap().1.remove(&buf).is_some());
    }

    unsafe fn upload(&self, buf: u64, offset: u64, src: &[u8]) -> Result<(), PluginError> {
        *self.uploads.lock().unwrap() += 1;
        self.count(|c| c.upload += 1);
        let o = offset as usize;
        self.with(buf, |v| v[o..o + src.len()].copy_from_slice(src));
        Ok(())
    }

    unsafe fn download(&self, buf: u64, offset: u64, dst: &mut [u8]) -> Result<(), PluginError> {
        self.count(|c| c.download += 1);
        let o = offset as usize;
        self.with(buf, |v| dst.copy_from_slice(&v[o..o + dst.len()]));
        Ok(())
    }

    unsafe fn zero(&self, buf: u64, offset: u64, bytes: u64) -> Result<(), PluginError> {
        self.count(|c| c.zero += 1);
        let (o, n) = (offset as usize, bytes as usize);
        self.with(buf, |v| v[o..o + n].fill(0));
        Ok(())
    }

    fn synchronize(&self) -> Result<(), PluginError> {
        self.count(|c| c.sync += 1);
        {
            let mut q = self.queued.lock().unwrap();
            q.1 = q.1.max(q.0);
            q.0 = 0;
        }
        if *self.fail_sync.lock().unwrap() {
            return Err(PluginError::new(
                abi::ERR_DEVICE,
                "fake: cuStreamSynchronize: an illegal memory access was encountered",
            ));
        }
        Ok(())
    }

    fn cache_key(&self, _source_hash: &str) -> Option<toast_accel::rtc::CacheKey> {
        None
    }

    fn compile(&self, source: &str) -> Result<Compiled, CompileError> {
        Ok(Compiled {
            code: source.as_bytes().to_vec(),
            kind: "source",
            log: String::new(),
        })
    }

    fn load_module(&self, image: &[u8], names: &[&'static str]) -> Result<Vec<usize>, PluginError> {
        let source = String::from_utf8_lossy(image);
        assert!(names.iter().all(|n| source.contains(n)));
        Ok((0..names.len()).collect())
    }

    unsafe fn launch(
        &self,
        name: &str,
        _kernel: usize,
        grid: Grid,
        params: &[Param<u64>],
    ) -> Result<(), PluginError> {
        self.count(|c| c.launch += 1);
        self.queued.lock().unwrap().0 += 1;
        if *self.fail_second_launch.lock().unwrap()
            && self.counts.lock().unwrap().launch.is_multiple_of(2)
        {
            return Err(PluginError::new(
                abi::ERR_DEVICE,
                "fake: cuLaunchKernel: too many resources requested for launch",
            ));
        }
        self.launches.lock().unwrap().push(Launch {
            name: name.to_string(),
            grid,
        });
        // scan_map's launch computes nothing here: its test counts the
        // driver calls around it.
        if name.starts_with("toast_scan_map") {
            return Ok(());
        }
        if name != "toast_noise_weight" {
            return Err(PluginError::unsupported(format!(
                "fake: {name} does not run here"
            )));
        }
        let int = |i: usize| match params[i] {
            Param::I64(v) => v,
            p => panic!("parameter {i} is {p:?}"),
        };
        let buf = |i: usize| match params[i] {
            Param::Buffer(b) => b,
            p => panic!("parameter {i} is {p:?}"),
        };
        let (d0, d1, i0, i1, n_samp) = (int(0), int(1), int(2), int(3), int(4));
        assert_eq!(grid.blocks.1 as i64, i1 - i0, "grid dimension 1: intervals");
        assert_eq!(grid.blocks.2 as i64, d1 - d0, "grid dimension 2: detectors");
        let iv: Vec<i64> = self.read(buf(5));
        let di: Vec<i32> = self.read(buf(6));
        let w: Vec<f64> = self.read(buf(7));
        let threads = u64::from(grid.blocks.0) * u64::from(grid.threads);
        self.with(buf(8).expect("det_data"), |v| {
            let mut data: Vec<f64> = pods(v);
            for det in d0..d1 {
                for k in i0..i1 {
                    let (first, last) = (iv[2 * k as usize], iv[2 * k as usize + 1]);
                    assert!((last - first).max(0) as u64 <= threads);
                    for s in first..last {
                        data[(di[det as usize] as i64 * n_samp + s) as usize] *= w[det as usize];
                    }
                }
            }
            v.copy_from_slice(bytemuck::cast_slice(&data));
        });
        Ok(())
    }
}

toast_gpu::export_plugin!(
    driver = Fake,
    name = "fake",
    description = "fake backend for the tests of toast-gpu",
);

fn table() -> &'static BackendTable {
    // SAFETY: the entry returns a pointer to a static header whose table is static.
    unsafe { &*(*toast_backend_entry()).table }
}

fn last_error() -> String {
    // SAFETY: last_error returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(table().last_error.unwrap()()) }
        .to_string_lossy()
        .into_owned()
}

unsafe extern "C" fn collect_log(user: *mut c_void, _level: i32, msg: *const c_char, len: usize) {
    // SAFETY: `user` is the `Mutex<Vec<String>>` of `init_with` and `msg`
    // holds `len` bytes.
    let (log, msg) = unsafe {
        (
            &*(user as *const Mutex<Vec<String>>),
            std::slice::from_raw_parts(msg as *const u8, len),
        )
    };
    log.lock()
        .unwrap()
        .push(String::from_utf8_lossy(msg).into_owned());
}

/// `init` with `options`, collecting the log into `log`.
fn init_with(options: &CStr, log: &'static Mutex<Vec<String>>) -> (abi::Status, *mut c_void) {
    init_from_host(options, log, abi::ABI_MINOR)
}

/// `init` with `options` from a host of ABI minor `host_minor`.
fn init_from_host(
    options: &CStr,
    log: &'static Mutex<Vec<String>>,
    host_minor: u32,
) -> (abi::Status, *mut c_void) {
    let host = HostApi {
        size: std::mem::size_of::<HostApi>() as u32,
        abi_minor: host_minor,
        log: Some(collect_log),
        log_user: log as *const Mutex<Vec<String>> as *mut c_void,
        options: options.as_ptr(),
    };
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a complete host API that outlives the call; valid out pointer.
    let st = unsafe { table().init.unwrap()(&host, &mut ctx) };
    (st, ctx)
}

/// The log of the contexts whose log no test reads.
static UNREAD_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn init() -> *mut c_void {
    let (st, ctx) = init_with(c"", &UNREAD_LOG);
    assert_eq!(st, abi::OK, "init: {}", last_error());
    ctx
}

fn fake<'a>(ctx: *mut c_void) -> &'a Fake {
    // SAFETY: `init` of this table hands out a boxed `Context<Fake>`, alive
    // until `shutdown` (each test shuts its context down last).
    unsafe { &*(ctx as *const Context<Fake>) }.driver()
}

#[test]
fn header_and_probe() {
    // SAFETY: static header.
    let h = unsafe { &*toast_backend_entry() };
    assert_eq!(h.magic, abi::MAGIC);
    assert_eq!(h.flags & abi::FLAG_HOST_ADDRESSABLE, 0);
    // SAFETY: static NUL-terminated strings.
    let (name, version) = unsafe { (CStr::from_ptr(h.name), CStr::from_ptr(h.version)) };
    assert_eq!(name.to_str().unwrap(), "fake");
    assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    assert!(table().template_offset_apply_diag_precond.is_some());
    assert_eq!(unavailable_reason(), None);
}

/// `device_info` (ABI minors 9 and 10 grew the struct) writes the memory
/// kind for a host of minor 9, the device's identity for a host of minor
/// 10, and no byte past the struct of an older host.
#[test]
fn device_info_writes_only_the_struct_of_the_hosts_minor() {
    let canary = [0xAA; 16];
    for (minor, kind, reserved, uuid) in [
        (
            abi::ABI_MINOR,
            abi::DEVICE_MEMORY_HOST,
            0,
            *b"fake device 0000",
        ),
        (9, abi::DEVICE_MEMORY_HOST, 0, canary),
        (8, 0xAAAA_AAAA, 0xAAAA_AAAA, canary),
    ] {
        let (st, ctx) = init_from_host(c"", &UNREAD_LOG, minor);
        assert_eq!(st, abi::OK, "init: {}", last_error());
        let mut info = abi::DeviceInfo {
            memory_kind: 0xAAAA_AAAA,
            reserved: 0xAAAA_AAAA,
            uuid: canary,
            ..abi::DeviceInfo::ZERO
        };
        // SAFETY: live context, shut down once; a whole struct.
        unsafe {
            assert_eq!(table().device_info.unwrap()(ctx, 0, &mut info), abi::OK);
            table().shutdown.unwrap()(ctx);
        }
        assert_eq!(
            (
                info.memory_kind,
                info.reserved,
                info.uuid,
                info.compute_units
            ),
            (kind, reserved, uuid, 4),
            "host of minor {minor}"
        );
        // The host reads the identity only from a plugin of minor 10.
        assert_eq!(info.identity(9), None);
    }
    assert_eq!(abi::DeviceInfo::size_for_host(8), 152);
    assert_eq!(abi::DeviceInfo::size_for_host(9), 160);
    assert_eq!(abi::DeviceInfo::size_for_host(abi::ABI_MINOR), 176);
}

#[test]
fn options_select_the_device_and_unknown_ones_are_refused() {
    static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let (st, _) = init_with(c"colour=blue; device=0", &UNREAD_LOG);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "fake backend: unknown option `colour` (known: device, memory, sync, workspace, workspace_bytes)"
    );
    // An empty selection names no device: refused, not taken as a named
    // default (which would stop MPI ranks spreading over the devices).
    for empty in [c"device=", c"device", c"device= ; memory=1"] {
        let (st, _) = init_with(empty, &UNREAD_LOG);
        assert_eq!(st, abi::ERR_INVALID_ARGUMENT, "{empty:?}");
        assert!(
            last_error().contains("option device: an empty value names no device"),
            "{}",
            last_error()
        );
    }
    let (st, ctx) = init_with(c" device=0 ", &LOG);
    assert_eq!(st, abi::OK, "init: {}", last_error());
    let log = LOG.lock().unwrap().clone();
    assert!(
        log.iter()
            .any(|m| m.starts_with("fake backend: host memory")
                && m.contains("device memory budget 0.900 GiB = 966367638 bytes (the default")),
        "{log:?}"
    );
    let mut info = std::mem::MaybeUninit::<abi::DeviceInfo>::uninit();
    // SAFETY: live context; valid out pointer.
    unsafe {
        assert_eq!(
            table().device_info.unwrap()(ctx, 0, info.as_mut_ptr()),
            abi::OK
        );
        assert_eq!(
            table().device_info.unwrap()(ctx, 1, info.as_mut_ptr()),
            abi::ERR_INVALID_ARGUMENT
        );
    }
    // SAFETY: written by the successful call.
    let info = unsafe { info.assume_init() };
    // SAFETY: NUL-terminated by device_info.
    let name = unsafe { CStr::from_ptr(info.name.as_ptr()) };
    assert_eq!(name.to_str().unwrap(), "Fake device (fake1)");
    assert_eq!((info.compute_units, info.total_memory), (4, LIMIT));
    // The allocator's peak (ABI minor 7): nothing yet; then the size class
    // of one buffer, in MiB rounded up, the same after it is freed and its
    // cached block is reused by a request of the same size.
    assert_eq!(info.peak_held_mib, 0);
    let peak_after = |bytes: u64| {
        let mut h = 0u64;
        let mut info = std::mem::MaybeUninit::<abi::DeviceInfo>::uninit();
        // SAFETY: live context; valid out pointers; the buffer is freed once.
        unsafe {
            assert_eq!(
                table().alloc.unwrap()(ctx, bytes, c"buf".as_ptr(), &mut h),
                abi::OK
            );
            assert_eq!(table().free.unwrap()(ctx, h), abi::OK);
            assert_eq!(
                table().device_info.unwrap()(ctx, 0, info.as_mut_ptr()),
                abi::OK
            );
            info.assume_init().peak_held_mib
        }
    };
    let class = toast_gpu::memory::size_class(3 << 20 | 1);
    assert!(class > 3 << 20);
    assert_eq!(peak_after(3 << 20 | 1), class.div_ceil(1 << 20) as u32);
    assert_eq!(peak_after(3 << 20 | 1), class.div_ceil(1 << 20) as u32);
    // SAFETY: a live context, shut down once.
    unsafe { table().shutdown.unwrap()(ctx) };

    let (st, _) = init_with(c"device=1", &UNREAD_LOG);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "fake: device 1 does not exist (1 device(s))");
    let (st, _) = init_with(c"device=x", &UNREAD_LOG);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "option device: `x` is not a device index (a non-negative integer)"
    );
    let (st, _) = init_with(c"workspace=diagonal", &UNREAD_LOG);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "option workspace: `diagonal` is not `contiguous` or `interleaved`"
    );
    for (opt, bad) in [(c"workspace_bytes=0", "0"), (c"workspace_bytes=1e6", "1e6")] {
        let (st, _) = init_with(opt, &UNREAD_LOG);
        assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
        assert_eq!(
            last_error(),
            format!("option workspace_bytes: `{bad}` is not a positive number of bytes")
        );
    }
    for opt in [
        c"workspace=interleaved",
        c"workspace = contiguous; device=0",
        c"workspace_bytes=4096;workspace=interleaved",
    ] {
        let (st, ctx) = init_with(opt, &UNREAD_LOG);
        assert_eq!(st, abi::OK, "{opt:?}: {}", last_error());
        // SAFETY: a live context, shut down once.
        unsafe { table().shutdown.unwrap()(ctx) };
    }
}

#[test]
fn memory_entry_points_and_pool() {
    let ctx = init();
    let t = table();
    let mut h = 0u64;
    // SAFETY: live context, valid out pointers, host slices of the lengths
    // given, each call on its own.
    unsafe {
        assert_eq!(t.alloc.unwrap()(ctx, 64, c"buf".as_ptr(), &mut h), abi::OK);
        assert_eq!(h >> 48, 0xFA4E, "handles carry the driver's tag");
        let mut out = [0xFFu8; 64];
        assert_eq!(
            t.copy_to_host.unwrap()(ctx, h, 0, out.as_mut_ptr() as *mut c_void, 64),
            abi::OK
        );
        assert_eq!(out, [0u8; 64], "buffers are zeroed on allocation");
        let src: Vec<u8> = (1..=16).collect();
        assert_eq!(
            t.copy_to_device.unwrap()(ctx, h, 8, src.as_ptr() as *const c_void, 16),
            abi::OK
        );
        assert_eq!(t.reset.unwrap()(ctx, h, 10, 4), abi::OK);
        assert_eq!(
            t.copy_to_host.unwrap()(ctx, h, 8, out.as_mut_ptr() as *mut c_void, 16),
            abi::OK
        );
        assert_eq!(
            out[..16],
            [1, 2, 0, 0, 0, 0, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
        );
        assert_eq!(
            t.copy_to_host.unwrap()(ctx, h, 60, out.as_mut_ptr() as *mut c_void, 8),
            abi::ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            last_error(),
            format!(
                "copy_to_host: range of 8 bytes at offset 60 is outside buffer `buf` (0x{h:x}) of 64 bytes"
            )
        );
        let blocks = fake(ctx).buffers.lock().unwrap().1.len();
        assert_eq!(t.free.unwrap()(ctx, h), abi::OK);
        assert_eq!(
            fake(ctx).buffers.lock().unwrap().1.len(),
            blocks,
            "a freed block stays in the pool"
        );
        assert_eq!(t.free.unwrap()(ctx, h), abi::ERR_INVALID_HANDLE);
        assert_eq!(
            last_error(),
            format!("buffer handle 0x{h:x} is not a live buffer of the fake backend (never allocated here, or already freed)")
        );
        let mut big = 0u64;
        assert_eq!(
            t.alloc.unwrap()(ctx, LIMIT + 1, c"huge".as_ptr(), &mut big),
            abi::ERR_OUT_OF_MEMORY
        );
        // Past the budget (by default 90% of the free memory): refused
        // before the driver is asked.
        assert!(
            last_error().starts_with(&format!(
                "fake: cannot allocate {} bytes for buffer `huge`: out of the device memory \
                 budget of 0.900 GiB = 966367638 bytes (the default",
                LIMIT + 1
            )),
            "{}",
            last_error()
        );
        t.shutdown.unwrap()(ctx);
    }
    // A budget above the device's reported memory stands on a device in
    // the host's memory (this one: an APU may report only its carve-out),
    // and an allocation past the device then meets the driver's own
    // refusal. (A device with its own memory refuses such a budget at init:
    // toast-cli's emulated_gpu tests.)
    let (st, ctx) = init_with(c"memory=4", &UNREAD_LOG);
    assert_eq!(st, abi::OK, "init: {}", last_error());
    let mut big = 0u64;
    // SAFETY: live context, valid out pointer; shut down once.
    unsafe {
        assert_eq!(
            t.alloc.unwrap()(ctx, LIMIT + 1, c"huge".as_ptr(), &mut big),
            abi::ERR_OUT_OF_MEMORY
        );
        assert!(last_error().starts_with(&format!(
            "fake: cannot allocate {} bytes for buffer `huge`: fake: out of memory",
            LIMIT + 1
        )));
        t.shutdown.unwrap()(ctx);
    }
}

/// A buffer of context `ctx` holding `data`; its handle.
fn det_data_on_device(ctx: *mut c_void, data: &[f64]) -> u64 {
    on_device(ctx, data)
}

/// A new device buffer holding `data`.
fn on_device<T: bytemuck::Pod>(ctx: *mut c_void, data: &[T]) -> u64 {
    let t = table();
    let bytes = std::mem::size_of_val(data) as u64;
    let mut h = 0u64;
    // SAFETY: a live context, a valid out pointer, `data` of `bytes` bytes.
    unsafe {
        assert_eq!(
            t.alloc.unwrap()(ctx, bytes, c"det_data".as_ptr(), &mut h),
            abi::OK
        );
        assert_eq!(
            t.copy_to_device.unwrap()(ctx, h, 0, data.as_ptr() as *const c_void, bytes),
            abi::OK
        );
    }
    h
}

/// The arguments of `noise_weight` over `det_data` = (buffer, rows) of
/// `n_samp` samples, one detector per entry of `data_index`.
fn noise_weight_args(
    n_samp: u64,
    data_index: &[i32],
    weights: &[f64],
    iv: &[SampleRange],
    det_data: (u64, u64),
) -> NoiseWeightArgs {
    NoiseWeightArgs {
        n_det: data_index.len() as u64,
        n_samp,
        data_index: data_index.as_ptr(),
        detector_weights: weights.as_ptr(),
        intervals: SampleRanges {
            ptr: iv.as_ptr(),
            len: iv.len() as u64,
        },
        det_data: abi::Array {
            ptr: det_data.0,
            len: det_data.1 * n_samp,
        },
    }
}

/// `noise_weight` on 3 detectors of 10 samples with `data_index` and
/// intervals; the launches it made and the weighted data.
fn noise_weight(data_index: &[i32], iv: &[SampleRange]) -> (Vec<Launch>, Vec<f64>) {
    let n_samp = 10u64;
    let n_rows = 3u64;
    let ctx = init();
    let t = table();
    let data: Vec<f64> = (0..n_rows * n_samp).map(|i| i as f64 + 1.0).collect();
    let weights = [2.0, 3.0, 5.0];
    let bytes = n_rows * n_samp * 8;
    let mut out = vec![0f64; data.len()];
    let h = det_data_on_device(ctx, &data);
    // SAFETY: live context, valid out pointers and host arrays of the
    // lengths given.
    unsafe {
        let args = noise_weight_args(n_samp, data_index, &weights, iv, (h, n_rows));
        assert_eq!(
            t.noise_weight.unwrap()(ctx, &args),
            abi::OK,
            "{}",
            last_error()
        );
        assert_eq!(
            t.copy_to_host.unwrap()(ctx, h, 0, out.as_mut_ptr() as *mut c_void, bytes),
            abi::OK
        );
    }
    let launches = fake(ctx).launches.lock().unwrap().clone();
    // SAFETY: a live context, shut down once.
    unsafe { t.shutdown.unwrap()(ctx) };
    // The reference: the CPU's loop.
    let mut want = data;
    for (det, &row) in data_index.iter().enumerate() {
        for i in iv {
            for s in i.first..i.last {
                want[row as usize * n_samp as usize + s as usize] *= weights[det];
            }
        }
    }
    assert_eq!(out, want);
    (launches, out)
}

#[test]
fn launch_planning() {
    let iv = |first, last| SampleRange { first, last };
    let grids =
        |l: &[Launch]| -> Vec<(u32, u32, u32)> { l.iter().map(|l| l.grid.blocks).collect() };
    // Distinct rows, disjoint intervals: one launch over everything.
    let (l, _) = noise_weight(&[0, 1, 2], &[iv(0, 4), iv(6, 10)]);
    assert!(l
        .iter()
        .all(|l| l.name == "toast_noise_weight" && l.grid.threads == 128));
    assert_eq!(grids(&l), vec![(1, 2, 3)]);
    // Two detectors share a row: one detector per launch.
    let (l, _) = noise_weight(&[0, 1, 0], &[iv(0, 4), iv(6, 10)]);
    assert_eq!(grids(&l), vec![(1, 2, 1); 3]);
    // Overlapping intervals: one interval per launch.
    let (l, _) = noise_weight(&[2, 1, 0], &[iv(0, 6), iv(4, 10), iv(7, 7)]);
    assert_eq!(
        grids(&l),
        vec![(1, 1, 3), (1, 1, 3)],
        "empty intervals launch nothing"
    );
}

#[test]
fn repeated_small_arguments_are_uploaded_once() {
    let (n_det, n_samp) = (3u64, 10u64);
    let ctx = init();
    let t = table();
    let data: Vec<f64> = (0..n_det * n_samp).map(|i| i as f64 + 1.0).collect();
    let bytes = n_det * n_samp * 8;
    let data_index = [0i32, 1, 2];
    let iv = [SampleRange { first: 0, last: 10 }];
    let h = det_data_on_device(ctx, &data);
    let uploads = || *fake(ctx).uploads.lock().unwrap();
    // noise_weight with these weights; the uploads it made.
    let call = |weights: &[f64; 3]| -> u64 {
        let before = uploads();
        let args = noise_weight_args(n_samp, &data_index, weights, &iv, (h, n_det));
        // SAFETY: live context; the arrays have the lengths given.
        let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
        assert_eq!(status, abi::OK, "{}", last_error());
        uploads() - before
    };
    // intervals, data_index and the weights, then nothing, then the new
    // weights only.
    assert_eq!(call(&[2.0, 3.0, 5.0]), 3);
    assert_eq!(call(&[2.0, 3.0, 5.0]), 0);
    assert_eq!(call(&[1.0, 0.5, 2.0]), 1);
    let mut out = vec![0f64; data.len()];
    // SAFETY: live context and buffer; `out` holds `bytes`.
    unsafe {
        assert_eq!(
            t.copy_to_host.unwrap()(ctx, h, 0, out.as_mut_ptr() as *mut c_void, bytes),
            abi::OK
        );
        t.shutdown.unwrap()(ctx);
    }
    // Each row scaled by all three calls' weights.
    let scale = [2.0 * 2.0, 3.0 * 3.0 * 0.5, 5.0 * 5.0 * 2.0];
    let want: Vec<f64> = data
        .iter()
        .enumerate()
        .map(|(i, v)| v * scale[i / n_samp as usize])
        .collect();
    assert_eq!(out, want);
}

#[test]
fn a_call_synchronizes_once_and_repeated_calls_allocate_and_upload_nothing() {
    let (n_rows, n_samp) = (3u64, 10u64);
    let ctx = init();
    let t = table();
    let data: Vec<f64> = (0..n_rows * n_samp).map(|i| i as f64 + 1.0).collect();
    let h = det_data_on_device(ctx, &data);
    let counts = || *fake(ctx).counts.lock().unwrap();
    let iv = [
        SampleRange { first: 0, last: 4 },
        SampleRange { first: 6, last: 10 },
    ];
    let weights = [2.0, 3.0, 5.0];
    // One noise_weight call over `data_index`; the driver calls it made.
    let call = |data_index: &[i32]| -> Counts {
        let before = counts();
        let args = noise_weight_args(n_samp, data_index, &weights, &iv, (h, n_rows));
        // SAFETY: live context; the arrays have the lengths given.
        let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
        assert_eq!(status, abi::OK, "{}", last_error());
        counts() - before
    };
    // Two detectors share a row: three launches, one synchronize.
    let first = call(&[0, 1, 0]);
    assert_eq!((first.launch, first.sync), (3, 1), "{first:?}");
    assert_eq!(
        call(&[0, 1, 0]),
        Counts {
            launch: 3,
            sync: 1,
            ..Counts::default()
        }
    );
    // TOAST's pattern: one call per detector, again and again. After the
    // first round, each call is one launch and one synchronize: no
    // allocation, fill, upload, download or free.
    for d in 0..3 {
        call(&[d]);
    }
    for _ in 0..2 {
        for d in 0..3 {
            assert_eq!(
                call(&[d]),
                Counts {
                    launch: 1,
                    sync: 1,
                    ..Counts::default()
                }
            );
        }
    }
    // A device fault surfacing at the call's synchronize names the kernel.
    *fake(ctx).fail_sync.lock().unwrap() = true;
    let args = noise_weight_args(n_samp, &[0, 1, 0], &weights, &iv, (h, n_rows));
    // SAFETY: live context; the arrays have the lengths given.
    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
    assert_eq!(status, abi::ERR_DEVICE);
    let e = last_error();
    assert!(
        e.contains(
            "kernel toast_noise_weight: fake: cuStreamSynchronize: an illegal memory access"
        ),
        "{e}"
    );
    *fake(ctx).fail_sync.lock().unwrap() = false;
    // SAFETY: a live context, shut down once.
    unsafe { t.shutdown.unwrap()(ctx) };
}

/// With the option `sync=launch` every launch is waited for at once, so
/// that a device fault names its own launch's kernel; a bad value is
/// refused.
#[test]
fn sync_launch_waits_after_every_launch() {
    let (st, _) = init_with(c"sync=sometimes", &UNREAD_LOG);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert_eq!(
        last_error(),
        "option sync: `sometimes` is not `call` (wait once per kernel call, the default) or \
         `launch` (wait after every launch)"
    );
    let (st, ctx) = init_with(c"sync=launch", &UNREAD_LOG);
    assert_eq!(st, abi::OK, "init: {}", last_error());
    let t = table();
    let (n_rows, n_samp) = (3u64, 10u64);
    let data: Vec<f64> = (0..n_rows * n_samp).map(|i| i as f64 + 1.0).collect();
    let h = det_data_on_device(ctx, &data);
    let counts = || *fake(ctx).counts.lock().unwrap();
    let iv = [SampleRange { first: 0, last: 10 }];
    let weights = [2.0, 3.0, 5.0];
    // Two detectors share a row: three launches, each waited for.
    let args = noise_weight_args(n_samp, &[0, 1, 0], &weights, &iv, (h, n_rows));
    let before = counts();
    // SAFETY: live context; the arrays have the lengths given.
    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
    assert_eq!(status, abi::OK, "{}", last_error());
    let made = counts() - before;
    assert_eq!((made.launch, made.sync), (3, 3), "{made:?}");
    // A fault is reported at the first launch's wait, naming its kernel.
    *fake(ctx).fail_sync.lock().unwrap() = true;
    let before = counts();
    // SAFETY: as above.
    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
    assert_eq!(status, abi::ERR_DEVICE);
    let made = counts() - before;
    assert_eq!((made.launch, made.sync), (1, 1), "{made:?}");
    let e = last_error();
    assert!(
        e.starts_with("kernel toast_noise_weight: fake: cuStreamSynchronize"),
        "{e}"
    );
    *fake(ctx).fail_sync.lock().unwrap() = false;
    // SAFETY: a live context, shut down once.
    unsafe { t.shutdown.unwrap()(ctx) };
}

/// A call whose second launch fails for its own reason reports that; a
/// device fault of its first launch, seen when the call waits before
/// returning its buffers, goes to the host's log naming the kernel.
#[test]
fn a_fault_behind_a_failed_launch_is_logged() {
    static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let (st, ctx) = init_with(c"", &LOG);
    assert_eq!(st, abi::OK, "init: {}", last_error());
    let t = table();
    let (n_rows, n_samp) = (3u64, 10u64);
    let data: Vec<f64> = (0..n_rows * n_samp).map(|i| i as f64 + 1.0).collect();
    let h = det_data_on_device(ctx, &data);
    let iv = [SampleRange { first: 0, last: 10 }];
    let weights = [2.0, 3.0, 5.0];
    // Two detectors share a row: one launch per detector.
    let args = noise_weight_args(n_samp, &[0, 1, 0], &weights, &iv, (h, n_rows));
    let launched = fake(ctx).counts.lock().unwrap().launch;
    assert!(
        launched.is_multiple_of(2),
        "the call's first launch is an odd one"
    );
    *fake(ctx).fail_second_launch.lock().unwrap() = true;
    *fake(ctx).fail_sync.lock().unwrap() = true;
    // SAFETY: live context; the arrays have the lengths given.
    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
    *fake(ctx).fail_second_launch.lock().unwrap() = false;
    *fake(ctx).fail_sync.lock().unwrap() = false;
    assert_eq!(status, abi::ERR_DEVICE);
    let e = last_error();
    assert!(
        e.starts_with(
            "kernel toast_noise_weight: fake: cuLaunchKernel: too many resources requested"
        ),
        "{e}"
    );
    let log = LOG.lock().unwrap().clone();
    assert!(
        log.iter().any(|m| m
            == "noise_weight: a device fault after the call had failed: kernel \
                toast_noise_weight: fake: cuStreamSynchronize: an illegal memory access was \
                encountered"),
        "{log:?}"
    );
    // SAFETY: a live context, shut down once.
    unsafe { t.shutdown.unwrap()(ctx) };
}

/// Calls from several threads on one context run one at a time: each
/// call's wait finds only its own launches queued (three here), so a fault
/// would be reported by the call that launched it; every result is right.
#[test]
fn calls_from_several_threads_run_one_at_a_time() {
    let ctx = init();
    let t = table();
    let (n_rows, n_samp) = (3u64, 10u64);
    let iv = [SampleRange { first: 0, last: 10 }];
    let weights = [2.0, 3.0, 5.0];
    let threads = 4;
    let rounds = 200;
    // A buffer per thread, each thread weighting its own.
    let data: Vec<f64> = (0..n_rows * n_samp).map(|i| i as f64 + 1.0).collect();
    let buffers: Vec<u64> = (0..threads)
        .map(|_| det_data_on_device(ctx, &data))
        .collect();
    let addr = ctx as usize;
    std::thread::scope(|s| {
        for &h in &buffers {
            s.spawn(move || {
                let ctx = addr as *mut c_void;
                // Two detectors share a row: three launches a call.
                let args = noise_weight_args(n_samp, &[0, 1, 0], &weights, &iv, (h, n_rows));
                for _ in 0..rounds {
                    // SAFETY: live context; the arrays have the lengths given.
                    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
                    assert_eq!(status, abi::OK, "{}", last_error());
                }
            });
        }
    });
    let (_, most) = *fake(ctx).queued.lock().unwrap();
    assert_eq!(most, 3, "a wait found another call's launches queued");
    // Every round: row 0 weighted by 2 (detector 0) then 5 (detector 2),
    // row 1 by 3, in the order of the launches.
    let mut want = data.clone();
    for _ in 0..rounds {
        for (det, row) in [(0, 0), (1, 1), (2, 0)] {
            for v in &mut want[row * n_samp as usize..(row + 1) * n_samp as usize] {
                *v *= weights[det];
            }
        }
    }
    for h in buffers {
        let mut out = vec![0f64; data.len()];
        // SAFETY: live context and buffer; `out` holds the buffer's bytes.
        let status = unsafe {
            t.copy_to_host.unwrap()(
                ctx,
                h,
                0,
                out.as_mut_ptr() as *mut c_void,
                n_rows * n_samp * 8,
            )
        };
        assert_eq!(status, abi::OK);
        assert_eq!(out, want);
    }
    // SAFETY: a live context, shut down once.
    unsafe { t.shutdown.unwrap()(ctx) };
}

/// The map kernels check the global-to-local table they index the map with
/// on the host; it is read back once per buffer until the buffer is
/// written (a copy to it here), and a call with fewer local submaps checks
/// the copy it has again, without reading it back.
#[test]
fn a_global_to_local_table_is_read_back_once_until_written() {
    let ctx = init();
    let t = table();
    let counts = || *fake(ctx).counts.lock().unwrap();
    // 4 global submaps of 2 pixels, 2 of them local; one detector, 4
    // samples in submaps 0 and 2.
    let g2l = [0i64, -1, 1, -1];
    let g2l_h = on_device(ctx, &g2l);
    let map = on_device(ctx, &[1.0f64, 2.0, 3.0, 4.0]);
    let pixels = on_device(ctx, &[0i64, 1, 4, 5]);
    let weights = on_device(ctx, &[1.0f64; 4]);
    let det_data = on_device(ctx, &[0.0f64; 4]);
    let index = [0i32];
    let iv = [SampleRange { first: 0, last: 4 }];
    let array = |ptr, len| abi::Array { ptr, len };
    let call = |map_len: u64| -> (abi::Status, Counts) {
        let before = counts();
        let args = abi::ScanMapArgs {
            n_det: 1,
            n_samp: 4,
            nnz: 1,
            pixel_index: index.as_ptr(),
            weight_index: index.as_ptr(),
            data_index: index.as_ptr(),
            intervals: SampleRanges {
                ptr: iv.as_ptr(),
                len: 1,
            },
            global2local: array(g2l_h, 4),
            n_pix_submap: 2,
            map_dtype: abi::DTYPE_F64,
            reserved0: 0,
            mapdata: array(map, map_len),
            pixels: array(pixels, 4),
            weights: array(weights, 4),
            det_data: array(det_data, 4),
            data_scale: 1.0,
            should_zero: 0,
            should_subtract: 0,
            should_scale: 0,
            reserved: [0; 5],
        };
        // SAFETY: live context; the host arrays have the lengths given.
        let status = unsafe { t.scan_map.unwrap()(ctx, &args) };
        (status, counts() - before)
    };
    // The first call reads the table back (and the error word after its
    // launch); the next ones only the error word.
    let (status, first) = call(4);
    assert_eq!(status, abi::OK, "{}", last_error());
    let (status, again) = call(4);
    assert_eq!(status, abi::OK, "{}", last_error());
    assert_eq!(first.download, again.download + 1, "{first:?} {again:?}");
    assert_eq!(call(4).1.download, again.download);
    // A map of one local submap: entry 2's local submap 1 is past it. The
    // copy is checked again, not read back.
    let (status, fewer) = call(2);
    assert_eq!(status, abi::ERR_INVALID_ARGUMENT);
    let msg = last_error();
    assert!(msg.contains("global2local[2] = 1"), "{msg}");
    assert_eq!((fewer.download, fewer.launch), (0, 0), "{fewer:?}");
    // Written: read back again.
    let g2l_moved = [1i64, -1, 0, -1];
    // SAFETY: live context and buffer of 32 bytes; the source holds them.
    let status = unsafe {
        t.copy_to_device.unwrap()(ctx, g2l_h, 0, g2l_moved.as_ptr() as *const c_void, 32)
    };
    assert_eq!(status, abi::OK);
    let (status, written) = call(4);
    assert_eq!(status, abi::OK, "{}", last_error());
    assert_eq!(written.download, first.download, "{written:?}");
    assert_eq!(call(4).1.download, again.download);
    // A kernel that has the buffer as its output (noise_weight scaling it
    // by 1, as 4 doubles: the bits stay): read back again.
    let args = noise_weight_args(4, &[0], &[1.0], &iv, (g2l_h, 1));
    // SAFETY: live context; the arrays have the lengths given.
    let status = unsafe { t.noise_weight.unwrap()(ctx, &args) };
    assert_eq!(status, abi::OK, "{}", last_error());
    let (status, output) = call(4);
    assert_eq!(status, abi::OK, "{}", last_error());
    assert_eq!(output.download, first.download, "{output:?}");
    // SAFETY: live context.
    unsafe { t.shutdown.unwrap()(ctx) };
}
