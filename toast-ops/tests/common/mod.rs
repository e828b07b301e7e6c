//! Test support: backends, a synthetic satellite-like scan, a random sky.
//!
//! * The CPU plugin is registered from its rlib entry point, with an explicit
//!   thread count.
//! * `fakedev` is a backend that is **not** host-addressable: its buffers are
//!   opaque handles into memory it owns, and its kernels translate the
//!   handles and forward to the CPU plugin. It stands in for a GPU: a kernel
//!   given a host address instead of a handle fails ("unknown handle"), so a
//!   test passes only if every array was staged or copied.
//! * The scan: a boresight on great circles about a spin axis that precesses,
//!   so pixels are crossed in many directions; detector pairs A/B at 90°,
//!   pairs at 0°, 45°, 22.5°, ... with small pointing offsets; different
//!   NETs per detector.

#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use toast_accel::abi::{self, Array, BackendHeader, BackendTable, HostApi, Status};
use toast_accel::host::{DispatchPolicy, Dispatcher, Registry};
use toast_core::observation::defaults;
use toast_core::{DType, Data, Detector, ExecContext, Focalplane, Observation, Telescope};
use toast_ops::accel::pipeline::{run_operators, OpRef, RunOptions};
use toast_ops::math::qarray::{self, Quat};
use toast_ops::ops::{
    PixelsHealpix, PixelsHealpixConfig, PointingDetector, PointingDetectorConfig, ScanMap,
    ScanMapConfig, StokesMode, StokesWeights, StokesWeightsConfig, WhiteNoiseWeights,
};
use toast_ops::{PixelData, PixelDistribution};

// ---------------------------------------------------------------------------
// Backends.
// ---------------------------------------------------------------------------

/// A registry with the CPU plugin (`threads` rayon threads) and `fakedev`.
pub fn registry(threads: usize) -> Arc<Registry> {
    let mut r = Registry::new();
    let opts = format!("threads={threads}");
    // SAFETY: the CPU plugin's entry point returns its static, complete header.
    unsafe { r.register_entry(toast_backend_cpu::toast_backend_entry, "builtin:cpu", &opts) }
        .expect("register the cpu plugin");
    // SAFETY: `fakedev_entry` returns a static, complete header (below).
    unsafe { r.register_entry(fakedev_entry, "builtin:fakedev", &opts) }.expect("register fakedev");
    Arc::new(r)
}

/// A context whose dispatcher uses `policy` (e.g. `"run=fakedev"`).
pub fn context(registry: &Arc<Registry>, policy: &str) -> ExecContext {
    let mut ctx = ExecContext::new();
    let p = DispatchPolicy::parse(policy).expect("policy");
    ctx.insert(Dispatcher::new(Arc::clone(registry), p));
    ctx
}

fn cpu_table() -> &'static BackendTable {
    // SAFETY: the CPU plugin's header and table are static.
    unsafe { &*(*toast_backend_cpu::toast_backend_entry()).table }
}

struct FakeCtx {
    cpu: *mut c_void,
    mem: Mutex<HashMap<u64, Vec<u8>>>,
    next: AtomicU64,
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

fn fail(status: Status, msg: String) -> Status {
    LAST.with(|l| *l.borrow_mut() = CString::new(msg.replace('\0', "")).unwrap_or_default());
    status
}

fn clear() {
    LAST.with(|l| *l.borrow_mut() = CString::default());
}

/// # Safety
/// `ctx` is a pointer made by `fake_init`.
unsafe fn fctx<'a>(ctx: *mut c_void) -> &'a FakeCtx {
    // SAFETY: by the caller's contract.
    unsafe { &*(ctx as *const FakeCtx) }
}

unsafe extern "C" fn fake_init(host: *const HostApi, ctx: *mut *mut c_void) -> Status {
    clear();
    let mut cpu = std::ptr::null_mut();
    // SAFETY: forwarding the host's API to the CPU plugin's init.
    let s = unsafe { cpu_table().init.expect("cpu init")(host, &mut cpu) };
    if s != abi::OK {
        return fail(s, "cpu init failed".into());
    }
    let c = Box::new(FakeCtx {
        cpu,
        mem: Mutex::new(HashMap::new()),
        next: AtomicU64::new(0x7000_0000),
    });
    // SAFETY: `ctx` is a valid out pointer.
    unsafe { *ctx = Box::into_raw(c) as *mut c_void };
    abi::OK
}

unsafe extern "C" fn fake_shutdown(ctx: *mut c_void) {
    if !ctx.is_null() {
        // SAFETY: made by `fake_init` with Box::into_raw.
        let c = unsafe { Box::from_raw(ctx as *mut FakeCtx) };
        // SAFETY: the CPU context made in `fake_init`.
        unsafe { cpu_table().shutdown.expect("cpu shutdown")(c.cpu) };
    }
}

unsafe extern "C" fn fake_last_error() -> *const c_char {
    let mine = LAST.with(|l| {
        let b = l.borrow();
        (!b.as_bytes().is_empty()).then(|| b.as_ptr())
    });
    // The CString lives in the thread-local until the next call on this thread.
    match mine {
        Some(p) => p,
        // SAFETY: the CPU plugin's last_error returns a valid string.
        None => unsafe { cpu_table().last_error.expect("cpu last_error")() },
    }
}

unsafe extern "C" fn fake_device_count(_ctx: *mut c_void, count: *mut u32) -> Status {
    // SAFETY: valid out pointer.
    unsafe { *count = 1 };
    abi::OK
}

unsafe extern "C" fn fake_alloc(
    ctx: *mut c_void,
    bytes: u64,
    _name: *const c_char,
    handle: *mut u64,
) -> Status {
    clear();
    // SAFETY: ctx from fake_init.
    let c = unsafe { fctx(ctx) };
    let h = c.next.fetch_add(0x1000, Ordering::Relaxed);
    c.mem.lock().unwrap().insert(h, vec![0u8; bytes as usize]);
    // SAFETY: valid out pointer.
    unsafe { *handle = h };
    abi::OK
}

unsafe extern "C" fn fake_free(ctx: *mut c_void, handle: u64) -> Status {
    clear();
    // SAFETY: ctx from fake_init.
    let c = unsafe { fctx(ctx) };
    match c.mem.lock().unwrap().remove(&handle) {
        Some(_) => abi::OK,
        None => fail(
            abi::ERR_INVALID_HANDLE,
            format!("free: unknown handle {handle:#x}"),
        ),
    }
}

unsafe extern "C" fn fake_to_device(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    src: *const c_void,
    bytes: u64,
) -> Status {
    clear();
    // SAFETY: ctx from fake_init.
    let c = unsafe { fctx(ctx) };
    let mut mem = c.mem.lock().unwrap();
    let Some(b) = mem.get_mut(&handle) else {
        return fail(
            abi::ERR_INVALID_HANDLE,
            format!("copy_to_device: unknown handle {handle:#x}"),
        );
    };
    let (o, n) = (offset as usize, bytes as usize);
    if o + n > b.len() {
        return fail(
            abi::ERR_INVALID_ARGUMENT,
            "copy_to_device: out of range".into(),
        );
    }
    // SAFETY: the host passes `bytes` readable bytes at `src`.
    let s = unsafe { std::slice::from_raw_parts(src as *const u8, n) };
    b[o..o + n].copy_from_slice(s);
    abi::OK
}

unsafe extern "C" fn fake_to_host(
    ctx: *mut c_void,
    handle: u64,
    offset: u64,
    dst: *mut c_void,
    bytes: u64,
) -> Status {
    clear();
    // SAFETY: ctx from fake_init.
    let c = unsafe { fctx(ctx) };
    let mem = c.mem.lock().unwrap();
    let Some(b) = mem.get(&handle) else {
        return fail(
            abi::ERR_INVALID_HANDLE,
            format!("copy_to_host: unknown handle {handle:#x}"),
        );
    };
    let (o, n) = (offset as usize, bytes as usize);
    if o + n > b.len() {
        return fail(
            abi::ERR_INVALID_ARGUMENT,
            "copy_to_host: out of range".into(),
        );
    }
    // SAFETY: the host passes `bytes` writable bytes at `dst`.
    let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
    d.copy_from_slice(&b[o..o + n]);
    abi::OK
}

unsafe extern "C" fn fake_reset(ctx: *mut c_void, handle: u64, offset: u64, bytes: u64) -> Status {
    clear();
    // SAFETY: ctx from fake_init.
    let c = unsafe { fctx(ctx) };
    let mut mem = c.mem.lock().unwrap();
    let Some(b) = mem.get_mut(&handle) else {
        return fail(
            abi::ERR_INVALID_HANDLE,
            format!("reset: unknown handle {handle:#x}"),
        );
    };
    let (o, n) = (offset as usize, bytes as usize);
    if o + n > b.len() {
        return fail(abi::ERR_INVALID_ARGUMENT, "reset: out of range".into());
    }
    b[o..o + n].fill(0);
    abi::OK
}

unsafe extern "C" fn fake_sync(_ctx: *mut c_void) -> Status {
    abi::OK
}

/// A device array (handle) as the host address of the fake device memory.
fn translate(mem: &mut HashMap<u64, Vec<u8>>, a: Array, what: &str) -> Result<Array, String> {
    if a.len == 0 {
        return Ok(a);
    }
    match mem.get_mut(&a.ptr) {
        Some(b) => Ok(Array {
            ptr: b.as_mut_ptr() as u64,
            len: a.len,
        }),
        None => Err(format!(
            "argument `{what}`: {:#x} is not a handle of this device (a host address?)",
            a.ptr
        )),
    }
}

macro_rules! forward {
    ($fname:ident, $args:ty, $entry:ident, [$($field:ident),*]) => {
        unsafe extern "C" fn $fname(ctx: *mut c_void, a: *const $args) -> Status {
            clear();
            // SAFETY: ctx from fake_init; `a` points to a valid argument struct.
            let (c, mut args) = unsafe { (fctx(ctx), *a) };
            let mut mem = c.mem.lock().unwrap();
            $(
                match translate(&mut mem, args.$field, stringify!($field)) {
                    Ok(x) => args.$field = x,
                    Err(e) => return fail(abi::ERR_INVALID_HANDLE, e),
                }
            )*
            // SAFETY: every array now addresses live device memory of its
            // declared length (held locked during the call), and the host
            // arrays are the caller's.
            unsafe { cpu_table().$entry.expect("cpu kernel")(c.cpu, &args) }
        }
    };
}

forward!(
    f_pointing,
    abi::PointingDetectorArgs,
    pointing_detector,
    [boresight, shared_flags, quats]
);
forward!(
    f_pixels,
    abi::PixelsHealpixArgs,
    pixels_healpix,
    [quats, shared_flags, pixels, hit_submaps]
);
forward!(f_sw_i, abi::StokesWeightsIArgs, stokes_weights_i, [weights]);
forward!(
    f_sw_iqu,
    abi::StokesWeightsIquArgs,
    stokes_weights_iqu,
    [quats, hwp, weights]
);
forward!(
    f_scan,
    abi::ScanMapArgs,
    scan_map,
    [global2local, mapdata, pixels, weights, det_data]
);
forward!(
    f_bnw,
    abi::BuildNoiseWeightedArgs,
    build_noise_weighted,
    [
        global2local,
        pixels,
        weights,
        det_data,
        det_flags,
        shared_flags,
        zmap
    ]
);
forward!(f_nw, abi::NoiseWeightArgs, noise_weight, [det_data]);
forward!(
    f_add,
    abi::TemplateOffsetAddArgs,
    template_offset_add_to_signal,
    [amplitudes, amplitude_flags, det_data]
);
forward!(
    f_proj,
    abi::TemplateOffsetProjectArgs,
    template_offset_project_signal,
    [det_data, flag_data, amplitudes, amplitude_flags]
);
forward!(
    f_prec,
    abi::TemplateOffsetPrecondArgs,
    template_offset_apply_diag_precond,
    [offset_var, amplitudes_in, amplitude_flags, amplitudes_out]
);

static FAKE_TABLE: BackendTable = BackendTable {
    init: Some(fake_init),
    shutdown: Some(fake_shutdown),
    last_error: Some(fake_last_error),
    device_count: Some(fake_device_count),
    device_info: None,
    alloc: Some(fake_alloc),
    free: Some(fake_free),
    copy_to_device: Some(fake_to_device),
    copy_to_host: Some(fake_to_host),
    reset: Some(fake_reset),
    synchronize: Some(fake_sync),
    pointing_detector: Some(f_pointing),
    pixels_healpix: Some(f_pixels),
    stokes_weights_i: Some(f_sw_i),
    stokes_weights_iqu: Some(f_sw_iqu),
    scan_map: Some(f_scan),
    build_noise_weighted: Some(f_bnw),
    noise_weight: Some(f_nw),
    template_offset_add_to_signal: Some(f_add),
    template_offset_project_signal: Some(f_proj),
    template_offset_apply_diag_precond: Some(f_prec),
};

static FAKE_HEADER: BackendHeader = BackendHeader {
    magic: abi::MAGIC,
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    table_size: std::mem::size_of::<BackendTable>() as u32,
    flags: 0,
    name: c"fakedev".as_ptr(),
    version: c"0".as_ptr(),
    description: c"test device: handles, CPU kernels".as_ptr(),
    table: &FAKE_TABLE,
};

unsafe extern "C" fn fakedev_entry() -> *const BackendHeader {
    &FAKE_HEADER
}

// ---------------------------------------------------------------------------
// Synthetic data.
// ---------------------------------------------------------------------------

/// The synthetic scan.
#[derive(Debug, Clone)]
pub struct Scan {
    /// Observations.
    pub n_obs: usize,
    /// Samples per observation.
    pub n_samples: usize,
    /// Sample rate (Hz).
    pub rate: f64,
    /// Detector pairs.
    pub n_pairs: usize,
    /// Spin period (s).
    pub spin_period: f64,
    /// Precession period (s).
    pub prec_period: f64,
    /// Opening angle of the spin axis from the precession axis (degrees).
    pub prec_angle: f64,
    /// Angle of the boresight from the spin axis (degrees; 90: great circles).
    pub spin_angle: f64,
    /// Offset of detector pair `p` from the boresight: `p · det_spacing` (degrees).
    pub det_spacing: f64,
}

impl Default for Scan {
    fn default() -> Self {
        Scan {
            n_obs: 2,
            n_samples: 12_000,
            rate: 10.0,
            n_pairs: 3,
            spin_period: 60.0,
            prec_period: 1300.0,
            prec_angle: 50.0,
            spin_angle: 90.0,
            det_spacing: 0.7,
        }
    }
}

/// Detector pairs: A at angle ψ, B at ψ + 90°, pair `i` at ψ = i·45°/… with
/// a small offset from the boresight; NET 1 + 0.2 i (K√s).
pub fn focalplane(scan: &Scan) -> Arc<Focalplane> {
    let angles = [0.0f64, 45.0, 22.5, 67.5, 11.25, 56.25];
    let mut dets = Vec::new();
    for p in 0..scan.n_pairs {
        let psi = angles[p % angles.len()].to_radians();
        let tilt = qarray::mult(
            &qarray::from_axisangle(&qarray::ZAXIS, p as f64 * 1.1),
            &qarray::from_axisangle(&qarray::XAXIS, (scan.det_spacing * p as f64).to_radians()),
        );
        for (k, suffix) in ["A", "B"].iter().enumerate() {
            let mut d = Detector::new(format!("D{p}{suffix}"));
            let pol = qarray::from_axisangle(
                &qarray::ZAXIS,
                psi + k as f64 * std::f64::consts::FRAC_PI_2,
            );
            d.quat = qarray::mult(&tilt, &pol);
            d.net = 1.0 + 0.2 * (2 * p + k) as f64;
            d.pixel = format!("P{p}");
            dets.push(d);
        }
    }
    Arc::new(Focalplane::new(dets, scan.rate).unwrap())
}

/// The boresight at time `t`: on a circle (`spin_angle` from the spin axis;
/// a great circle at 90°) about a spin axis that precesses about the z axis.
pub fn boresight(scan: &Scan, t: f64) -> Quat {
    use std::f64::consts::TAU;
    let prec = qarray::from_axisangle(&qarray::ZAXIS, TAU * t / scan.prec_period);
    let open = qarray::from_axisangle(&qarray::YAXIS, scan.prec_angle.to_radians());
    let spin = qarray::from_axisangle(&qarray::ZAXIS, TAU * t / scan.spin_period);
    let perp = qarray::from_axisangle(&qarray::YAXIS, scan.spin_angle.to_radians());
    qarray::mult(&prec, &qarray::mult(&open, &qarray::mult(&spin, &perp)))
}

/// Observations with `times`, `boresight_radec`, shared `flags`, detdata
/// `signal` and `flags` (zeros), and a white-noise model from the NETs.
pub fn make_data(scan: &Scan) -> Data {
    let fp = focalplane(scan);
    let mut data = Data::new();
    for o in 0..scan.n_obs {
        let tel = Telescope::new("sat", Arc::clone(&fp));
        let mut ob = Observation::new(format!("obs_{o:03}"), tel, scan.n_samples).unwrap();
        let t0 = o as f64 * (scan.n_samples as f64 / scan.rate + 100.0);
        let times: Vec<f64> = (0..scan.n_samples)
            .map(|i| t0 + i as f64 / scan.rate)
            .collect();
        let bore: Vec<f64> = times.iter().flat_map(|&t| boresight(scan, t)).collect();
        ob.shared.set(defaults::TIMES, &[], &times).unwrap();
        ob.shared
            .set(defaults::BORESIGHT_RADEC, &[4], &bore)
            .unwrap();
        ob.shared
            .set::<u8>(defaults::SHARED_FLAGS, &[], &vec![0; scan.n_samples])
            .unwrap();
        ob.detdata
            .create(defaults::DET_DATA, DType::F64, &[], None)
            .unwrap();
        ob.detdata
            .create(defaults::DET_FLAGS, DType::U8, &[], None)
            .unwrap();
        let w = WhiteNoiseWeights::from_net(&ob).unwrap();
        ob.meta.set_object(defaults::NOISE_MODEL, w);
        data.push(ob).unwrap();
    }
    data
}

/// A deterministic pseudo-random value in [-1, 1) for (`seed`, `i`).
pub fn hash01(seed: u64, i: u64) -> f64 {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i.wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// A full-sky IQU map at `nside` (all submaps local): I = 10 + h, Q and U =
/// 0.5 h, with pseudo-random h; stored as `sky` on `sky_dist`.
pub fn make_sky(data: &mut Data, nside: i64, nside_submap: i64) {
    let n_submap = (nside / nside_submap).pow(2);
    let dist = Arc::new(
        PixelDistribution::healpix(nside, nside_submap, true, &vec![1u8; n_submap as usize])
            .unwrap(),
    );
    let mut m = PixelData::<f64>::new(Arc::clone(&dist), 3);
    for (p, v) in m.data_mut().chunks_exact_mut(3).enumerate() {
        let pix = dist.global_pixel(p) as u64;
        v[0] = 10.0 + hash01(1, pix);
        v[1] = 0.5 * hash01(2, pix);
        v[2] = 0.5 * hash01(3, pix);
    }
    data.meta.set_object("sky_dist", dist);
    data.meta.set_object("sky", m);
}

/// Pointing operators at `nside` (IQU weights).
pub fn pointing_ops(
    nside: i64,
    nside_submap: i64,
) -> (PointingDetector, PixelsHealpix, StokesWeights) {
    let dp = PointingDetectorConfig::default();
    let pix = PixelsHealpix::new(
        "pixels",
        PixelsHealpixConfig {
            nside,
            nside_submap,
            ..PixelsHealpixConfig::default()
        },
        dp.clone(),
    )
    .unwrap();
    let w = StokesWeights::new(
        "weights",
        StokesWeightsConfig {
            mode: StokesMode::IQU,
            ..StokesWeightsConfig::default()
        },
        dp.clone(),
    );
    (PointingDetector::new("det_pointing", dp), pix, w)
}

/// Scan the `sky` map into `signal` (adds).
pub fn scan_sky(data: &mut Data, ctx: &mut ExecContext, nside: i64, nside_submap: i64) {
    let (mut a, mut b, mut c) = pointing_ops(nside, nside_submap);
    let mut scan = ScanMap::new(
        "scan_map",
        ScanMapConfig {
            map_key: "sky".into(),
            pixel_dist: "sky_dist".into(),
            ..ScanMapConfig::default()
        },
    )
    .unwrap();
    let mut ops: Vec<OpRef<'_>> = vec![&mut a, &mut b, &mut c, &mut scan];
    run_operators("scan_sky", &mut ops, data, ctx, &RunOptions::default()).unwrap();
    for ob in &mut data.obs {
        for f in ["quats", "pixels", "weights"] {
            ob.detdata.remove(f).unwrap();
        }
    }
}

/// Add offset `amp(det, obs, k)` to samples `[k L, (k+1) L)` of every
/// detector; returns nothing (the offsets are a pure function of the indices).
pub fn add_offsets(data: &mut Data, step: usize, scale: f64) {
    for (o, ob) in data.obs.iter_mut().enumerate() {
        let dets = ob.local_detectors().to_vec();
        let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
        for (d, name) in dets.iter().enumerate() {
            let row = sig.row_of_mut::<f64>(name).unwrap();
            for (k, chunk) in row.chunks_mut(step).enumerate() {
                let a = scale * hash01(100 + o as u64, (d * 100_000 + k) as u64);
                for x in chunk {
                    *x += a;
                }
            }
        }
    }
}
