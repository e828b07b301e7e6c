//! The CPU plugin through its C table: header, lifecycle, memory rules,
//! data-dependent kernel errors, and thread-count independence.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Mutex;
use toast_accel::abi::{self, Array, BackendTable, Kernel, SampleRange, SampleRanges};
use toast_backend_cpu::toast_backend_entry;

fn header() -> &'static abi::BackendHeader {
    // SAFETY: the entry returns a pointer to a static header.
    unsafe { &*toast_backend_entry() }
}

fn table() -> &'static BackendTable {
    // SAFETY: the header's table is static.
    unsafe { &*header().table }
}

fn last_error() -> String {
    // SAFETY: last_error returns a NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(table().last_error.unwrap()()) }
        .to_string_lossy()
        .into_owned()
}

static LOG: Mutex<Vec<(i32, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn log_cb(_user: *mut c_void, level: i32, msg: *const c_char, len: usize) {
    // SAFETY: the plugin passes `len` bytes at `msg`.
    let b = unsafe { std::slice::from_raw_parts(msg as *const u8, len) };
    LOG.lock()
        .unwrap()
        .push((level, String::from_utf8_lossy(b).into_owned()));
}

/// An initialised backend context, shut down on drop.
struct PluginInstance(*mut c_void);

impl PluginInstance {
    fn new(options: &str) -> Result<PluginInstance, (i32, String)> {
        PluginInstance::from_host(options, abi::ABI_MINOR)
    }

    /// `init` from a host of ABI minor `host_minor`.
    fn from_host(options: &str, host_minor: u32) -> Result<PluginInstance, (i32, String)> {
        let opts = CString::new(options).unwrap();
        let api = abi::HostApi {
            size: std::mem::size_of::<abi::HostApi>() as u32,
            abi_minor: host_minor,
            log: Some(log_cb),
            log_user: std::ptr::null_mut(),
            options: opts.as_ptr(),
        };
        let mut ctx = std::ptr::null_mut();
        // SAFETY: valid host API and out pointer.
        let s = unsafe { table().init.unwrap()(&api, &mut ctx) };
        if s == abi::OK {
            Ok(PluginInstance(ctx))
        } else {
            Err((s, last_error()))
        }
    }
}

impl Drop for PluginInstance {
    fn drop(&mut self) {
        // SAFETY: a context from init, shut down once.
        unsafe { table().shutdown.unwrap()(self.0) };
    }
}

fn arr<T>(v: &[T]) -> Array {
    Array {
        ptr: v.as_ptr() as u64,
        len: v.len() as u64,
    }
}

/// An output array: the kernel writes through this pointer.
fn arr_mut<T>(v: &mut [T]) -> Array {
    Array {
        ptr: v.as_mut_ptr() as u64,
        len: v.len() as u64,
    }
}

fn ivs(v: &[SampleRange]) -> SampleRanges {
    SampleRanges {
        ptr: v.as_ptr(),
        len: v.len() as u64,
    }
}

fn iv(first: i64, last: i64) -> SampleRange {
    SampleRange { first, last }
}

/// A small deterministic random generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---------------------------------------------------------------------------
// Header, lifecycle, devices
// ---------------------------------------------------------------------------

#[test]
fn header_is_complete() {
    let h = header();
    assert_eq!(h.magic, abi::MAGIC);
    assert_eq!(h.abi_major, abi::ABI_MAJOR);
    assert_eq!(h.table_size as usize, std::mem::size_of::<BackendTable>());
    assert_eq!(h.flags, abi::FLAG_HOST_ADDRESSABLE);
    // SAFETY: static NUL-terminated strings.
    let name = unsafe { CStr::from_ptr(h.name) }.to_str().unwrap();
    assert_eq!(name, "cpu");
    // SAFETY: `h.version` points at a static NUL-terminated string of the plugin header.
    let version = unsafe { CStr::from_ptr(h.version) }.to_str().unwrap();
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let t = table();
    for k in Kernel::ALL {
        assert!(k.in_table(t), "{k} missing");
    }
    assert!(t.init.is_some() && t.shutdown.is_some() && t.last_error.is_some());
    assert!(t.device_count.is_some() && t.device_info.is_some() && t.synchronize.is_some());
    assert!(t.alloc.is_some() && t.free.is_some() && t.reset.is_some());
    assert!(t.copy_to_device.is_some() && t.copy_to_host.is_some());
}

#[test]
fn init_logs_a_debug_line_with_the_thread_count() {
    let _c = PluginInstance::new("threads=3").unwrap();
    let log = LOG.lock().unwrap();
    assert!(
        log.iter()
            .any(|(l, m)| *l == abi::LOG_DEBUG && m.contains("3 threads")),
        "{log:?}"
    );
}

#[test]
fn init_rejects_a_bad_thread_count() {
    let (s, msg) = PluginInstance::new("threads=many").err().unwrap();
    assert_eq!(s, abi::ERR_INVALID_ARGUMENT);
    assert!(msg.contains("threads") && msg.contains("many"), "{msg}");
}

#[test]
fn device_count_and_info() {
    let c = PluginInstance::new("threads=3").unwrap();
    let t = table();
    let mut n = 0u32;
    // SAFETY: valid ctx and out pointer.
    assert_eq!(unsafe { t.device_count.unwrap()(c.0, &mut n) }, abi::OK);
    assert_eq!(n, 1);
    let mut info = abi::DeviceInfo::ZERO;
    assert_eq!(
        // SAFETY: valid ctx and out pointer.
        unsafe { t.device_info.unwrap()(c.0, 0, &mut info) },
        abi::OK
    );
    assert_eq!(info.compute_units, 3);
    assert_eq!(info.memory_kind, abi::DEVICE_MEMORY_HOST);
    // A host of minor 8 has no memory kind (ABI minor 9): its struct ends
    // before it, and nothing is written there.
    let old = PluginInstance::from_host("threads=2", 8).unwrap();
    let mut canary = abi::DeviceInfo {
        memory_kind: 0xAAAA_AAAA,
        reserved: 0xAAAA_AAAA,
        ..abi::DeviceInfo::ZERO
    };
    assert_eq!(
        // SAFETY: valid ctx and out pointer.
        unsafe { t.device_info.unwrap()(old.0, 0, &mut canary) },
        abi::OK
    );
    assert_eq!(
        (canary.compute_units, canary.memory_kind, canary.reserved),
        (2, 0xAAAA_AAAA, 0xAAAA_AAAA)
    );
    assert!(info.name[0] != 0);
    assert!(info.total_memory > 0 && info.free_memory <= info.total_memory);
    assert_eq!(
        // SAFETY: valid ctx and out pointer (`info`); index 1 is refused by the plugin.
        unsafe { t.device_info.unwrap()(c.0, 1, &mut info) },
        abi::ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("device index 1"));
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

fn alloc(c: &PluginInstance, bytes: u64, name: &str) -> Result<u64, (i32, String)> {
    let n = CString::new(name).unwrap();
    let mut h = 0u64;
    // SAFETY: valid ctx, name and out pointer.
    let s = unsafe { table().alloc.unwrap()(c.0, bytes, n.as_ptr(), &mut h) };
    if s == abi::OK {
        Ok(h)
    } else {
        Err((s, last_error()))
    }
}

#[test]
fn alloc_is_zeroed_aligned_and_copies_round_trip() {
    let c = PluginInstance::new("").unwrap();
    let t = table();
    let h = alloc(&c, 1000, "buf").unwrap();
    assert_eq!(h % 64, 0);
    let mut back = vec![1u8; 1000];
    // SAFETY: valid handle and destination of 1000 bytes.
    let s = unsafe { t.copy_to_host.unwrap()(c.0, h, 0, back.as_mut_ptr() as *mut c_void, 1000) };
    assert_eq!(s, abi::OK);
    assert!(back.iter().all(|&b| b == 0));
    let src: Vec<u8> = (0..100).collect();
    // SAFETY: valid handle and source of 100 bytes.
    let s = unsafe { t.copy_to_device.unwrap()(c.0, h, 900, src.as_ptr() as *const c_void, 100) };
    assert_eq!(s, abi::OK);
    // SAFETY: valid handle.
    assert_eq!(unsafe { t.reset.unwrap()(c.0, h, 900, 10) }, abi::OK);
    let mut back = vec![0u8; 100];
    // SAFETY: valid handle `h` (1000 bytes); bytes [900, 1000) into `back`, 100 bytes.
    let s = unsafe { t.copy_to_host.unwrap()(c.0, h, 900, back.as_mut_ptr() as *mut c_void, 100) };
    assert_eq!(s, abi::OK);
    assert_eq!(&back[..10], &[0; 10]);
    assert_eq!(&back[10..], &src[10..]);
    // SAFETY: valid handle.
    assert_eq!(unsafe { t.free.unwrap()(c.0, h) }, abi::OK);
}

#[test]
fn unknown_handle_is_refused() {
    let c = PluginInstance::new("").unwrap();
    // SAFETY: the plugin validates the handle.
    let s = unsafe { table().free.unwrap()(c.0, 0x3039) };
    assert_eq!(s, abi::ERR_INVALID_HANDLE);
    assert!(last_error().contains("0x3039"), "{}", last_error());
    let mut b = [0u8; 4];
    // SAFETY: the plugin validates the handle before copying; `b` holds the 4 bytes.
    let s =
        unsafe { table().copy_to_host.unwrap()(c.0, 0x3039, 0, b.as_mut_ptr() as *mut c_void, 4) };
    assert_eq!(s, abi::ERR_INVALID_HANDLE);
}

#[test]
fn double_free_is_refused() {
    let c = PluginInstance::new("").unwrap();
    let h = alloc(&c, 16, "twice").unwrap();
    // SAFETY: the plugin validates the handle.
    assert_eq!(unsafe { table().free.unwrap()(c.0, h) }, abi::OK);
    assert_eq!(
        // SAFETY: the plugin validates the handle (already freed) and refuses it.
        unsafe { table().free.unwrap()(c.0, h) },
        abi::ERR_INVALID_HANDLE
    );
    assert!(
        last_error().contains(&format!("0x{h:x}")),
        "{}",
        last_error()
    );
}

#[test]
fn copy_outside_the_buffer_is_refused() {
    let c = PluginInstance::new("").unwrap();
    let h = alloc(&c, 16, "small").unwrap();
    let src = [0u8; 8];
    // SAFETY: the plugin checks the range before copying.
    let s =
        unsafe { table().copy_to_device.unwrap()(c.0, h, 12, src.as_ptr() as *const c_void, 8) };
    assert_eq!(s, abi::ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("offset 12"), "{}", last_error());
    // SAFETY: the plugin checks the range (u64::MAX + 2 overflows) before writing.
    let s = unsafe { table().reset.unwrap()(c.0, h, u64::MAX, 2) };
    assert_eq!(s, abi::ERR_INVALID_ARGUMENT);
}

#[test]
fn out_of_memory_names_the_buffer_and_size() {
    let c = PluginInstance::new("").unwrap();
    let (s, msg) = alloc(&c, 1 << 62, "huge_map").unwrap_err();
    assert_eq!(s, abi::ERR_OUT_OF_MEMORY);
    assert!(
        msg.contains("huge_map") && msg.contains(&(1u64 << 62).to_string()),
        "{msg}"
    );
    let (s, _) = alloc(&c, u64::MAX, "max").unwrap_err();
    assert_eq!(s, abi::ERR_OUT_OF_MEMORY);
}

// ---------------------------------------------------------------------------
// Kernel-level errors
// ---------------------------------------------------------------------------

/// scan_map inputs: nnz 1, 4 global submaps of 8 pixels, submaps 1 and 3 local.
struct ScanMap {
    idx: Vec<i32>,
    iv: Vec<SampleRange>,
    g2l: Vec<i64>,
    map: Vec<f64>,
    pixels: Vec<i64>,
    weights: Vec<f64>,
    data: Vec<f64>,
    n_samp: usize,
}

impl ScanMap {
    fn new(n_det: usize, n_samp: usize) -> Self {
        ScanMap {
            idx: (0..n_det as i32).collect(),
            iv: vec![iv(0, n_samp as i64)],
            g2l: vec![-1, 0, -1, 1],
            map: (0..16).map(|i| i as f64).collect(),
            pixels: vec![9; n_det * n_samp],
            weights: vec![1.0; n_det * n_samp],
            data: vec![0.0; n_det * n_samp],
            n_samp,
        }
    }
    fn run(&mut self, c: &PluginInstance) -> (i32, String) {
        let a = abi::ScanMapArgs {
            n_det: self.idx.len() as u64,
            n_samp: self.n_samp as u64,
            nnz: 1,
            pixel_index: self.idx.as_ptr(),
            weight_index: self.idx.as_ptr(),
            data_index: self.idx.as_ptr(),
            intervals: ivs(&self.iv),
            global2local: arr(&self.g2l),
            n_pix_submap: 8,
            map_dtype: abi::DTYPE_F64,
            reserved0: 0,
            mapdata: arr(&self.map),
            pixels: arr(&self.pixels),
            weights: arr(&self.weights),
            det_data: arr_mut(&mut self.data),
            data_scale: 1.0,
            should_zero: 0,
            should_subtract: 0,
            should_scale: 0,
            reserved: [0; 5],
        };
        // SAFETY: every pointer is a live vector of the declared length.
        let s = unsafe { table().scan_map.unwrap()(c.0, &a) };
        (s, last_error())
    }
}

#[test]
fn scan_map_pixel_beyond_the_map() {
    let c = PluginInstance::new("threads=2").unwrap();
    let mut s = ScanMap::new(2, 100);
    s.pixels[100 + 42] = 32;
    let (st, msg) = s.run(&c);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("detector 1") && msg.contains("sample 42"),
        "{msg}"
    );
    assert!(
        msg.contains("pixel 32") && msg.contains("beyond the map"),
        "{msg}"
    );
}

#[test]
fn scan_map_pixel_in_a_submap_that_is_not_local() {
    let c = PluginInstance::new("threads=2").unwrap();
    let mut s = ScanMap::new(2, 100);
    s.pixels[7] = 3;
    let (st, msg) = s.run(&c);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("detector 0") && msg.contains("sample 7"),
        "{msg}"
    );
    assert!(msg.contains("global2local = -1"), "{msg}");
}

#[test]
fn scan_map_refuses_a_bad_global2local_entry() {
    let c = PluginInstance::new("").unwrap();
    let mut s = ScanMap::new(1, 10);
    s.g2l[2] = 5;
    let (st, msg) = s.run(&c);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("`global2local`") && msg.contains("global2local[2] = 5"),
        "{msg}"
    );
}

#[test]
fn the_first_fault_in_sequential_order_is_reported() {
    // Faults in several chunks: detector 0 comes before detector 1, and within
    // a detector the earlier sample wins, whatever the threads.
    for threads in [1, 2, 7] {
        let c = PluginInstance::new(&format!("threads={threads}")).unwrap();
        let n = 300_000;
        let mut s = ScanMap::new(2, n);
        s.pixels[5_000] = 100;
        s.pixels[n + 250_000] = 100;
        s.pixels[290_000] = 100;
        s.pixels[200_000] = 2;
        let (st, msg) = s.run(&c);
        assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
        assert!(
            msg.contains("detector 0") && msg.contains("sample 5000:"),
            "{threads}: {msg}"
        );
        s.pixels[5_000] = 9;
        let (_, msg) = s.run(&c);
        assert!(
            msg.contains("detector 0") && msg.contains("sample 200000:"),
            "{threads}: {msg}"
        );
    }
}

#[test]
fn an_output_overlapping_an_input_is_refused() {
    let c = PluginInstance::new("").unwrap();
    let mut s = ScanMap::new(1, 16);
    let mut a_weights = std::mem::take(&mut s.weights);
    a_weights.resize(16, 1.0);
    // det_data and weights are the same memory.
    let a = abi::ScanMapArgs {
        n_det: 1,
        n_samp: 16,
        nnz: 1,
        pixel_index: s.idx.as_ptr(),
        weight_index: s.idx.as_ptr(),
        data_index: s.idx.as_ptr(),
        intervals: ivs(&s.iv),
        global2local: arr(&s.g2l),
        n_pix_submap: 8,
        map_dtype: abi::DTYPE_F64,
        reserved0: 0,
        mapdata: arr(&s.map),
        pixels: arr(&s.pixels),
        weights: arr(&a_weights),
        det_data: arr(&a_weights),
        data_scale: 1.0,
        should_zero: 0,
        should_subtract: 0,
        should_scale: 0,
        reserved: [0; 5],
    };
    // SAFETY: every pointer is a live vector of the declared length.
    let st = unsafe { table().scan_map.unwrap()(c.0, &a) };
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("`det_data`") && last_error().contains("overlaps"));
}

#[test]
fn a_misaligned_array_is_refused() {
    let c = PluginInstance::new("").unwrap();
    let raw = [0u64; 11];
    let cal = [1.0f64];
    let idx = [0i32];
    let iv = [iv(0, 10)];
    let a = abi::StokesWeightsIArgs {
        n_det: 1,
        n_samp: 10,
        weight_index: idx.as_ptr(),
        cal: cal.as_ptr(),
        intervals: ivs(&iv),
        weights: Array {
            ptr: raw.as_ptr() as u64 + 1, // 8-byte aligned storage, off by one
            len: 10,
        },
    };
    // SAFETY: the pointer covers 80 readable bytes; alignment is what is checked.
    let st = unsafe { table().stokes_weights_i.unwrap()(c.0, &a) };
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("not aligned"), "{}", last_error());
}

/// build_noise_weighted inputs: nnz 1, same map layout as ScanMap.
fn build_noise_weighted(
    c: &PluginInstance,
    pixels: &[i64],
    det_flags: &[u8],
    n_samp: usize,
    zmap: &mut [f64],
) -> (i32, String) {
    let n_det = pixels.len() / n_samp;
    let idx: Vec<i32> = (0..n_det as i32).collect();
    let scale = vec![2.0; n_det];
    let g2l = [-1i64, 0, -1, 1];
    let w = vec![1.0; pixels.len()];
    let d = vec![1.0; pixels.len()];
    let iv = [iv(0, n_samp as i64)];
    let a = abi::BuildNoiseWeightedArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        nnz: 1,
        pixel_index: idx.as_ptr(),
        weight_index: idx.as_ptr(),
        data_index: idx.as_ptr(),
        flag_index: idx.as_ptr(),
        det_scale: scale.as_ptr(),
        intervals: ivs(&iv),
        global2local: arr(&g2l),
        n_pix_submap: 8,
        pixels: arr(pixels),
        weights: arr(&w),
        det_data: arr(&d),
        det_flags: arr(det_flags),
        shared_flags: Array::ABSENT,
        zmap: arr_mut(zmap),
        det_flag_mask: 1,
        shared_flag_mask: 0,
        reserved: [0; 6],
    };
    // SAFETY: every pointer is a live slice of the declared length.
    let s = unsafe { table().build_noise_weighted.unwrap()(c.0, &a) };
    (s, last_error())
}

#[test]
fn build_noise_weighted_pixel_errors_name_detector_and_sample() {
    let c = PluginInstance::new("threads=2").unwrap();
    let mut zmap = vec![0.0; 16];
    let mut pixels = vec![9i64; 2 * 50];
    pixels[50 + 7] = 17; // submap 2: not local
    let (st, msg) = build_noise_weighted(&c, &pixels, &[], 50, &mut zmap);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("detector 1") && msg.contains("sample 7") && msg.contains("not local"),
        "{msg}"
    );
    pixels[50 + 7] = 9;
    pixels[3] = 1000;
    let (st, msg) = build_noise_weighted(&c, &pixels, &[], 50, &mut zmap);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("detector 0") && msg.contains("sample 3") && msg.contains("beyond the map"),
        "{msg}"
    );
}

#[test]
fn build_noise_weighted_ignores_bad_pixels_of_flagged_samples() {
    let c = PluginInstance::new("threads=2").unwrap();
    let mut zmap = vec![0.0; 16];
    let mut pixels = vec![9i64; 50];
    let mut flags = vec![0u8; 50];
    pixels[3] = 1000;
    flags[3] = 1;
    let (st, msg) = build_noise_weighted(&c, &pixels, &flags, 50, &mut zmap);
    assert_eq!(st, abi::OK, "{msg}");
    assert_eq!(zmap[1], 2.0 * 49.0);
}

#[test]
fn pixels_healpix_non_finite_quaternion_is_an_error() {
    let c = PluginInstance::new("").unwrap();
    let mut quats = [0.0, 0.0, 0.0, 1.0].repeat(10);
    quats[4 * 6] = f64::NAN;
    let mut pixels = vec![0i64; 10];
    let mut hits = vec![0u8; 12];
    let idx = [0i32];
    let iv = [iv(0, 10)];
    let a = abi::PixelsHealpixArgs {
        n_det: 1,
        n_samp: 10,
        quat_index: idx.as_ptr(),
        pixel_index: idx.as_ptr(),
        intervals: ivs(&iv),
        quats: arr(&quats),
        shared_flags: Array::ABSENT,
        pixels: arr_mut(&mut pixels),
        hit_submaps: arr_mut(&mut hits),
        nside: 4,
        n_pix_submap: 16,
        shared_flag_mask: 0,
        nest: 1,
        pixels_i32: 0,
        reserved: [0; 5],
    };
    // SAFETY: every pointer is a live vector of the declared length.
    let st = unsafe { table().pixels_healpix.unwrap()(c.0, &a) };
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    let msg = last_error();
    assert!(
        msg.contains("detector 0") && msg.contains("sample 6") && msg.contains("no valid pixel"),
        "{msg}"
    );
    assert!(pixels[..6].iter().all(|&p| p == 15), "{pixels:?}");
    // Flagged, the same sample is skipped (-1), as TOAST never computes it;
    // the samples around it, in the same block, are computed.
    let mut flags = vec![0u8; 10];
    flags[6] = 2;
    let a = abi::PixelsHealpixArgs {
        shared_flags: arr(&flags),
        shared_flag_mask: 2,
        ..a
    };
    // SAFETY: every pointer is a live vector of the declared length; the flags have
    // n_samp elements.
    let st = unsafe { table().pixels_healpix.unwrap()(c.0, &a) };
    assert_eq!(st, abi::OK, "{}", last_error());
    let mut want = vec![15i64; 10];
    want[6] = -1;
    assert_eq!(pixels, want);
}

#[test]
fn a_kernel_check_failure_reaches_last_error() {
    let c = PluginInstance::new("").unwrap();
    let mut s = ScanMap::new(1, 10);
    s.idx[0] = 4;
    let (st, msg) = s.run(&c);
    assert_eq!(st, abi::ERR_INVALID_ARGUMENT);
    assert!(
        msg.contains("scan_map") && msg.contains("`pixel_index`"),
        "{msg}"
    );
}

// ---------------------------------------------------------------------------
// Results do not depend on the thread count
// ---------------------------------------------------------------------------

/// A random workload with duplicate output rows and overlapping intervals,
/// long enough to be split into many chunks.
struct Workload {
    n_samp: usize,
    rows: Vec<i32>,
    intervals: Vec<SampleRange>,
    pixels: Vec<i64>,
    weights: Vec<f64>,
    data: Vec<f64>,
    quats: Vec<f64>,
    flags: Vec<u8>,
}

const NPS: i64 = 64;
const NSUB: usize = 12;

impl Workload {
    fn new() -> Self {
        let mut r = Rng(0x1234_5678_9abc_def1);
        let n_samp = 70_001;
        let n_rows = 3;
        let pixels = (0..n_rows * n_samp)
            .map(|_| {
                let p = r.below(NSUB as u64 * NPS as u64) as i64;
                if p % 11 == 0 {
                    -1
                } else {
                    p
                }
            })
            .collect();
        let quats = (0..n_rows * n_samp)
            .flat_map(|_| {
                let q = [r.f64(), r.f64(), r.f64(), r.f64()];
                let n = (q.iter().map(|x| x * x).sum::<f64>()).sqrt();
                q.map(|x| x / n)
            })
            .collect();
        Workload {
            n_samp,
            rows: vec![0, 2, 0, 1],
            intervals: vec![
                iv(0, 30_000),
                iv(20_000, 45_000),
                iv(50_000, 50_000),
                iv(49_999, 70_001),
            ],
            pixels,
            weights: (0..n_rows * n_samp * 3).map(|_| r.f64()).collect(),
            data: (0..n_rows * n_samp).map(|_| r.f64()).collect(),
            quats,
            flags: (0..n_rows * n_samp)
                .map(|_| (r.below(10) == 0) as u8)
                .collect(),
        }
    }
}

fn run_all(threads: usize, w: &Workload) -> Vec<Vec<u64>> {
    let c = PluginInstance::new(&format!("threads={threads}")).unwrap();
    let t = table();
    let n = w.n_samp;
    let n_det = w.rows.len();
    let scale: Vec<f64> = (0..n_det).map(|i| 1.0 + i as f64 * 0.25).collect();
    let g2l: Vec<i64> = (0..NSUB as i64).collect();
    let map: Vec<f64> = (0..NSUB * NPS as usize * 3)
        .map(|i| (i as f64).sin())
        .collect();
    let mut out = Vec::new();

    // scan_map, adding into det_data rows shared by detectors 0 and 2.
    let mut det_data = w.data.clone();
    let a = abi::ScanMapArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        nnz: 3,
        pixel_index: w.rows.as_ptr(),
        weight_index: w.rows.as_ptr(),
        data_index: w.rows.as_ptr(),
        intervals: ivs(&w.intervals),
        global2local: arr(&g2l),
        n_pix_submap: NPS,
        map_dtype: abi::DTYPE_F64,
        reserved0: 0,
        mapdata: arr(&map),
        pixels: arr(&w.pixels),
        weights: arr(&w.weights),
        det_data: arr_mut(&mut det_data),
        data_scale: 0.5,
        should_zero: 0,
        should_subtract: 0,
        should_scale: 0,
        reserved: [0; 5],
    };
    assert_eq!(
        // SAFETY: every pointer is a live vector of the declared length.
        unsafe { t.scan_map.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(det_data.iter().map(|x| x.to_bits()).collect());

    // build_noise_weighted with det and shared flags.
    let mut zmap: Vec<f64> = (0..NSUB * NPS as usize * 3)
        .map(|i| i as f64 * 1e-3)
        .collect();
    let a = abi::BuildNoiseWeightedArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        nnz: 3,
        pixel_index: w.rows.as_ptr(),
        weight_index: w.rows.as_ptr(),
        data_index: w.rows.as_ptr(),
        flag_index: w.rows.as_ptr(),
        det_scale: scale.as_ptr(),
        intervals: ivs(&w.intervals),
        global2local: arr(&g2l),
        n_pix_submap: NPS,
        pixels: arr(&w.pixels),
        weights: arr(&w.weights),
        det_data: arr(&w.data),
        det_flags: arr(&w.flags),
        shared_flags: arr(&w.flags[..n]),
        zmap: arr_mut(&mut zmap),
        det_flag_mask: 1,
        shared_flag_mask: 2,
        reserved: [0; 6],
    };
    assert_eq!(
        // SAFETY: `w.rows` and `scale` (n_det = 4) and the intervals are live host arrays;
        // kernel arrays are live vectors of their declared lengths; `zmap`, the only output,
        // is a separate vector.
        unsafe { t.build_noise_weighted.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(zmap.iter().map(|x| x.to_bits()).collect());

    // pixels_healpix (RING) and stokes_weights_IQU with HWP.
    let mut pix = vec![-7i64; 3 * n];
    let mut hits = vec![0u8; 3072];
    let a = abi::PixelsHealpixArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        quat_index: w.rows.as_ptr(),
        pixel_index: w.rows.as_ptr(),
        intervals: ivs(&w.intervals),
        quats: arr(&w.quats),
        shared_flags: arr(&w.flags[..n]),
        pixels: arr_mut(&mut pix),
        hit_submaps: arr_mut(&mut hits),
        nside: 256,
        n_pix_submap: 256,
        shared_flag_mask: 1,
        nest: 0,
        pixels_i32: 0,
        reserved: [0; 5],
    };
    assert_eq!(
        // SAFETY: `w.rows` (n_det = 4) and the intervals are live host arrays; kernel arrays
        // are live vectors of their declared lengths; the outputs `pix` (3 rows x n) and
        // `hits` (12 * 256^2 / 256 = 3072 submaps) are separate vectors.
        unsafe { t.pixels_healpix.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(pix.iter().map(|&x| x as u64).collect());
    out.push(hits.iter().map(|&x| x as u64).collect());

    let mut weights = vec![0.0f64; 3 * n * 3];
    let eps = vec![0.01; n_det];
    let a = abi::StokesWeightsIquArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        quat_index: w.rows.as_ptr(),
        weight_index: w.rows.as_ptr(),
        epsilon: eps.as_ptr(),
        gamma: scale.as_ptr(),
        cal: scale.as_ptr(),
        intervals: ivs(&w.intervals),
        quats: arr(&w.quats),
        hwp: arr(&w.data[..n]),
        weights: arr_mut(&mut weights),
        iau: 1,
        reserved: [0; 7],
    };
    assert_eq!(
        // SAFETY: `w.rows`, `eps` and `scale` (n_det = 4) and the intervals are live host
        // arrays; kernel arrays are live vectors of their declared lengths; `weights`
        // (3 rows x n x 3), the only output, is a separate vector.
        unsafe { t.stokes_weights_iqu.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(weights.iter().map(|x| x.to_bits()).collect());

    // Offset templates: step 37, detector blocks overlapping (0 and 2 share).
    let step = 37i64;
    let nav: Vec<i64> = w
        .intervals
        .iter()
        .map(|i| (i.last - i.first + step - 1) / step)
        .collect();
    let block: i64 = nav.iter().sum();
    let offs = [0, block, 0, 2 * block];
    let n_amp = (3 * block) as usize;
    let amp_flags: Vec<u8> = (0..n_amp).map(|i| (i % 7 == 3) as u8).collect();
    let mut amps: Vec<f64> = (0..n_amp).map(|i| (i as f64 * 0.37).cos()).collect();
    let fidx = [0, -1, 2, 1];
    let layout = abi::OffsetLayout {
        step_length: step,
        n_amp_views: nav.as_ptr(),
        amp_offset: offs.as_ptr(),
    };
    let a = abi::TemplateOffsetProjectArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        data_index: w.rows.as_ptr(),
        flag_index: fidx.as_ptr(),
        layout,
        intervals: ivs(&w.intervals),
        det_data: arr(&w.data),
        flag_data: arr(&w.flags),
        amplitudes: arr_mut(&mut amps),
        amplitude_flags: arr(&amp_flags),
        flag_mask: 1,
        reserved: [0; 7],
    };
    assert_eq!(
        // SAFETY: `w.rows`, `fidx`, `offs` (n_det = 4) and `nav` (n_view = 4) are live host
        // arrays; kernel arrays are live vectors of their declared lengths; `amps` (n_amp),
        // the only output, is a separate vector.
        unsafe { t.template_offset_project_signal.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(amps.iter().map(|x| x.to_bits()).collect());

    let mut det_data = w.data.clone();
    let a = abi::TemplateOffsetAddArgs {
        n_det: n_det as u64,
        n_samp: n as u64,
        data_index: w.rows.as_ptr(),
        layout,
        intervals: ivs(&w.intervals),
        amplitudes: arr(&amps),
        amplitude_flags: arr(&amp_flags),
        det_data: arr_mut(&mut det_data),
    };
    assert_eq!(
        // SAFETY: `w.rows`, `offs` (n_det = 4) and `nav` (n_view = 4) are live host arrays;
        // kernel arrays are live vectors of their declared lengths; `det_data` (a clone of
        // `w.data`), the only output, is a separate vector.
        unsafe { t.template_offset_add_to_signal.unwrap()(c.0, &a) },
        abi::OK,
        "{}",
        last_error()
    );
    out.push(det_data.iter().map(|x| x.to_bits()).collect());
    out
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let w = Workload::new();
    let one = run_all(1, &w);
    for threads in [2, 3, 8] {
        let other = run_all(threads, &w);
        for (k, (a, b)) in one.iter().zip(&other).enumerate() {
            assert!(a == b, "output {k} differs between 1 and {threads} threads");
        }
    }
}
