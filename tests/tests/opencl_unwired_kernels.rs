//! The device source's four kernels that are not yet in the plugin table
//! (`toast-accel/device/kernels.h`, 11-14: `toast_cov_accum_diag_hits`,
//! `toast_cov_accum_diag_invnpp`, `toast_filter_polynomial`,
//! `toast_filter_poly2d`), launched directly on OpenCL (PoCL on CI) on
//! TOAST 3.0.6's reference cases in `tests/data/toast-kernels/cases/unwired/`
//! (FORMAT.md, sections 11-14), until the plugins launch them.
//!
//! Hits must be exact. The inverse covariance is summed with atomics in an
//! unspecified order, so it is compared to a relative 1e-13. The two
//! polynomial filters are compared with the tolerances of the CPU's unit
//! tests (TOAST solves with LAPACK's dgelss, the device with the same
//! Jacobi pseudo-inverse as the CPU): filter_polynomial to 2e-14 of the
//! largest input, filter_poly2D to 1e-10 relative per (sample, group), with
//! exact zeros where TOAST writes zeros and samples TOAST leaves alone
//! untouched bit for bit. The data errors (a pixel beyond the map, a fit
//! with more templates than a device thread holds) come back as error keys.
//!
//! Without OpenCL the test prints `SKIPPED: <reason>` and passes, unless
//! `TOAST_REQUIRE_OPENCL` is set (CI), as in `conformance_opencl.rs`.

mod opencl_device;

use ndarray::ArrayD;
use ndarray_npy::NpzReader;
use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::kernel::{ExecuteKernel, Kernel};
use opencl3::memory::{Buffer, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE};
use opencl3::program::Program;
use opencl3::types::{cl_double, cl_long, CL_BLOCKING};
use std::fs::File;
use std::path::PathBuf;
use toast_accel::device_source::{source, Target, NO_ERROR};
use toast_testkit::plugins::skip_unless_required;

/// A context, queue and the built device source.
struct Cl {
    context: Context,
    queue: CommandQueue,
    program: Program,
}

impl Cl {
    fn new(dev: &Device) -> Self {
        let context = Context::from_device(dev).expect("context");
        // SAFETY: dev.id() is a device of this context; no queue properties.
        let queue = unsafe { CommandQueue::create(&context, dev.id(), 0) }.expect("queue");
        let program = Program::create_and_build_from_source(&context, &source(Target::OpenCl), "")
            .unwrap_or_else(|log| panic!("the device source does not build: {log}"));
        Cl {
            context,
            queue,
            program,
        }
    }

    fn kernel(&self, name: &str) -> Kernel {
        Kernel::create(&self.program, name).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// A device copy of `data` (one element of `fill` when empty: OpenCL
    /// has no empty buffers).
    fn buf<T: Copy>(&self, data: &[T], fill: T) -> Buffer<T> {
        let one = [fill];
        let d = if data.is_empty() { &one[..] } else { data };
        // SAFETY: COPY_HOST_PTR reads d.len() elements of d during the call.
        unsafe {
            Buffer::<T>::create(
                &self.context,
                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                d.len(),
                d.as_ptr() as *mut std::ffi::c_void,
            )
        }
        .unwrap_or_else(|e| {
            panic!(
                "buffer of {} x {} bytes: {e}",
                d.len(),
                std::mem::size_of::<T>()
            )
        })
    }

    fn read<T: Copy>(&self, b: &Buffer<T>, like: &[T]) -> Vec<T> {
        let mut out = like.to_vec();
        if !out.is_empty() {
            // SAFETY: out holds as many elements as the buffer; the read blocks.
            unsafe {
                self.queue
                    .enqueue_read_buffer(b, CL_BLOCKING, 0, &mut out, &[])
            }
            .expect("read");
        }
        out
    }

    fn error_buffer(&self) -> Buffer<u64> {
        self.buf(&[NO_ERROR], NO_ERROR)
    }

    fn check_no_error(&self, err: &Buffer<u64>, what: &str) {
        let e = self.read(err, &[0u64]);
        assert_eq!(
            e[0], NO_ERROR,
            "{what}: the kernel reported error key {:x}",
            e[0]
        );
    }
}

/// One reference case.
struct Case {
    name: String,
    npz: NpzReader<File>,
}

impl Case {
    fn open(name: &str) -> Self {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/toast-kernels/cases");
        let wired = dir.join(format!("{name}.npz"));
        let p = if wired.exists() {
            wired
        } else {
            dir.join("unwired").join(format!("{name}.npz"))
        };
        let f = File::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        Case {
            name: name.to_string(),
            npz: NpzReader::new(f).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
        }
    }

    fn shaped<T: ndarray_npy::ReadableElement + Clone>(&mut self, f: &str) -> (Vec<T>, Vec<usize>) {
        let a: ArrayD<T> = self
            .npz
            .by_name(f)
            .unwrap_or_else(|e| panic!("{}: {f}: {e}", self.name));
        (a.iter().cloned().collect(), a.shape().to_vec())
    }

    fn get<T: ndarray_npy::ReadableElement + Clone>(&mut self, f: &str) -> Vec<T> {
        self.shaped(f).0
    }

    fn scalar<T: ndarray_npy::ReadableElement + Clone>(&mut self, f: &str) -> T {
        self.get::<T>(f)[0].clone()
    }
}

fn max_abs(x: &[f64]) -> f64 {
    x.iter().fold(0.0f64, |m, v| m.max(v.abs()))
}

fn cov_hits(cl: &Cl, name: &str) {
    let mut c = Case::open(name);
    let (nsub, nsubpix) = (c.scalar::<i64>("nsub"), c.scalar::<i64>("nsubpix"));
    let (submap, subpix) = (c.get::<i64>("submap"), c.get::<i64>("subpix"));
    let (hits_in, want) = (c.get::<i64>("hits_in"), c.get::<i64>("hits_out"));
    let (bsm, bpx, bhits, err) = (
        cl.buf(&submap, 0),
        cl.buf(&subpix, 0),
        cl.buf(&hits_in, 0),
        cl.error_buffer(),
    );
    let n = submap.len() as cl_long;
    // SAFETY: the arguments follow toast_cov_accum_diag_hits's signature.
    unsafe {
        ExecuteKernel::new(&cl.kernel("toast_cov_accum_diag_hits"))
            .set_arg(&n)
            .set_arg(&(nsub as cl_long))
            .set_arg(&(nsubpix as cl_long))
            .set_arg(&bsm)
            .set_arg(&bpx)
            .set_arg(&bhits)
            .set_arg(&err)
            .set_global_work_size(submap.len().max(1))
            .enqueue_nd_range(&cl.queue)
            .expect("launch");
    }
    cl.check_no_error(&err, name);
    assert_eq!(cl.read(&bhits, &hits_in), want, "{name}");
}

fn cov_invnpp(cl: &Cl, name: &str) {
    let mut c = Case::open(name);
    let (nsub, nsubpix, nnz) = (
        c.scalar::<i64>("nsub"),
        c.scalar::<i64>("nsubpix"),
        c.scalar::<i64>("nnz"),
    );
    let (submap, subpix) = (c.get::<i64>("submap"), c.get::<i64>("subpix"));
    let weights = c.get::<f64>("weights");
    let scale = c.scalar::<f64>("scale");
    let (inv_in, want) = (c.get::<f64>("invnpp_in"), c.get::<f64>("invnpp_out"));
    let (bsm, bpx, bw, binv, err) = (
        cl.buf(&submap, 0),
        cl.buf(&subpix, 0),
        cl.buf(&weights, 0.0),
        cl.buf(&inv_in, 0.0),
        cl.error_buffer(),
    );
    // SAFETY: the arguments follow toast_cov_accum_diag_invnpp's signature.
    unsafe {
        ExecuteKernel::new(&cl.kernel("toast_cov_accum_diag_invnpp"))
            .set_arg(&(submap.len() as cl_long))
            .set_arg(&(nsub as cl_long))
            .set_arg(&(nsubpix as cl_long))
            .set_arg(&(nnz as cl_long))
            .set_arg(&bsm)
            .set_arg(&bpx)
            .set_arg(&bw)
            .set_arg(&(scale as cl_double))
            .set_arg(&binv)
            .set_arg(&err)
            .set_global_work_size(submap.len().max(1))
            .enqueue_nd_range(&cl.queue)
            .expect("launch");
    }
    cl.check_no_error(&err, name);
    let got = cl.read(&binv, &inv_in);
    let scale_ref = max_abs(&want).max(1.0);
    let mut exact = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.to_bits() == w.to_bits() {
            exact += 1;
        }
        assert!(
            (g - w).abs() <= 1e-13 * scale_ref,
            "{name}: element {i}: {g:e} vs TOAST's {w:e}"
        );
    }
    eprintln!(
        "{name}: {exact} of {} elements bit-identical to TOAST (atomic order)",
        got.len()
    );
}

fn filter_polynomial(cl: &Cl, name: &str) {
    let mut c = Case::open(name);
    let order = c.scalar::<i64>("order");
    let flags = c.get::<u8>("flags");
    let (sig_in, shape) = c.shaped::<f64>("signals_in");
    let want = c.get::<f64>("signals_out");
    let (starts, stops) = (c.get::<i64>("starts"), c.get::<i64>("stops"));
    let (n_signal, n_samp) = (shape[0], shape[1]);
    let scans: Vec<i64> = starts
        .iter()
        .zip(&stops)
        .flat_map(|(&a, &b)| [a, b])
        .collect();
    let index: Vec<i32> = (0..n_signal as i32).collect();
    let (bscans, bflags, bindex, bsig, err) = (
        cl.buf(&scans, 0),
        cl.buf(&flags, 0),
        cl.buf(&index, 0),
        cl.buf(&sig_in, 0.0),
        cl.error_buffer(),
    );
    let kernel = cl.kernel("toast_filter_polynomial");
    // The cases' scans may overlap: one launch per scan, in order.
    for iv in 0..starts.len() {
        // SAFETY: the arguments follow toast_filter_polynomial's signature.
        unsafe {
            ExecuteKernel::new(&kernel)
                .set_arg(&(iv as cl_long))
                .set_arg(&(iv as cl_long + 1))
                .set_arg(&(n_signal as cl_long))
                .set_arg(&(n_samp as cl_long))
                .set_arg(&(order as cl_long))
                .set_arg(&bscans)
                .set_arg(&bflags)
                .set_arg(&bindex)
                .set_arg(&bsig)
                .set_arg(&err)
                .set_global_work_sizes(&[n_signal, 1])
                .enqueue_nd_range(&cl.queue)
                .expect("launch");
        }
    }
    cl.check_no_error(&err, name);
    let got = cl.read(&bsig, &sig_in);
    for (i, ((g, w), x)) in got.iter().zip(&want).zip(&sig_in).enumerate() {
        if w.to_bits() == x.to_bits() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}: untouched element {i}");
        }
    }
    let e = got
        .iter()
        .zip(&want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()))
        / max_abs(&sig_in);
    eprintln!("{name}: largest error / largest input {e:e}");
    assert!(e < 2e-14, "{name}: relative error {e:e}");
}

fn filter_poly2d(cl: &Cl, name: &str) {
    let mut c = Case::open(name);
    let det_groups = c.get::<i32>("det_groups");
    let (templates, tshape) = c.shaped::<f64>("templates");
    let (signals, sshape) = c.shaped::<f64>("signals");
    let masks = c.get::<u8>("masks");
    let (coeff_in, cshape) = c.shaped::<f64>("coeff_in");
    let want = c.get::<f64>("coeff_out");
    let (n_samp, n_det, n_group, n_mode) = (sshape[0], sshape[1], cshape[1], tshape[1]);
    let (bg, bt, bs, bm, bc, err) = (
        cl.buf(&det_groups, 0),
        cl.buf(&templates, 0.0),
        cl.buf(&signals, 0.0),
        cl.buf(&masks, 0),
        cl.buf(&coeff_in, 0.0),
        cl.error_buffer(),
    );
    // SAFETY: the arguments follow toast_filter_poly2d's signature.
    unsafe {
        ExecuteKernel::new(&cl.kernel("toast_filter_poly2d"))
            .set_arg(&(n_samp as cl_long))
            .set_arg(&(n_det as cl_long))
            .set_arg(&(n_group as cl_long))
            .set_arg(&(n_mode as cl_long))
            .set_arg(&bg)
            .set_arg(&bt)
            .set_arg(&bs)
            .set_arg(&bm)
            .set_arg(&bc)
            .set_arg(&err)
            .set_global_work_sizes(&[n_samp, n_group])
            .enqueue_nd_range(&cl.queue)
            .expect("launch");
    }
    cl.check_no_error(&err, name);
    let got = cl.read(&bc, &coeff_in);
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.chunks(n_mode).zip(want.chunks(n_mode)).enumerate() {
        if w.iter().all(|&x| x == 0.0) {
            assert!(g.iter().all(|&x| x == 0.0), "{name}: block {i}: {g:?}");
        }
        let d = g
            .iter()
            .zip(w)
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(d / max_abs(w).max(1.0));
    }
    eprintln!("{name}: largest relative error per block {worst:e}");
    assert!(worst < 1e-10, "{name}: relative error {worst:e}");
}

#[test]
fn unwired_kernels_match_toast_and_report_errors_on_opencl() {
    let dev = match opencl_device::fp64_device() {
        Ok(d) => d,
        Err(why) => {
            skip_unless_required("TOAST_REQUIRE_OPENCL", why);
            return;
        }
    };
    let cl = Cl::new(&dev);
    for name in ["cov_accum_diag_hits_basic", "cov_accum_diag_hits_nsub0"] {
        cov_hits(&cl, name);
    }
    for name in [
        "cov_accum_diag_invnpp_nnz3",
        "cov_accum_diag_invnpp_nnz1_zero_start",
    ] {
        cov_invnpp(&cl, name);
    }
    for name in [
        "filter_polynomial_order0",
        "filter_polynomial_order1",
        "filter_polynomial_order2",
        "filter_polynomial_order5",
        "filter_polynomial_order10",
        "filter_polynomial_order3_overlap_clamp",
    ] {
        filter_polynomial(&cl, name);
    }
    for name in [
        "filter_poly2D_groups3_order2",
        "filter_poly2D_onegroup_order0",
        "filter_poly2D_groups2_order3",
    ] {
        filter_poly2d(&cl, name);
    }
    // In the same test: PoCL 3.1 refuses buffers (CL_INVALID_BUFFER_SIZE) when
    // two test threads make contexts at once.
    data_errors(&cl);
}

/// The data errors: a pixel beyond the local map (hits), a fit with more
/// templates than a device thread holds (filter_polynomial), each as the
/// smallest error key, with nothing written for the faulty sample or scan.
fn data_errors(cl: &Cl) {
    // hits: 2 submaps x 4 pixels; samples 3 (submap 2) and 5 (pixel 4) are
    // beyond the map, sample 1 is skipped (-1).
    let submap = [0i64, -1, 1, 2, 0, 1];
    let subpix = [1i64, 0, 3, 0, 2, 4];
    let (bsm, bpx, bhits, err) = (
        cl.buf(&submap, 0),
        cl.buf(&subpix, 0),
        cl.buf(&[0i64; 8], 0),
        cl.error_buffer(),
    );
    // SAFETY: the arguments follow toast_cov_accum_diag_hits's signature.
    unsafe {
        ExecuteKernel::new(&cl.kernel("toast_cov_accum_diag_hits"))
            .set_arg(&(submap.len() as cl_long))
            .set_arg(&(2 as cl_long))
            .set_arg(&(4 as cl_long))
            .set_arg(&bsm)
            .set_arg(&bpx)
            .set_arg(&bhits)
            .set_arg(&err)
            .set_global_work_size(submap.len())
            .enqueue_nd_range(&cl.queue)
            .expect("launch");
    }
    assert_eq!(cl.read(&err, &[0u64])[0], 3, "the smallest faulty sample");
    assert_eq!(cl.read(&bhits, &[0i64; 8]), [0, 1, 1, 0, 0, 0, 0, 1]);
    // filter_polynomial: order 40 on a scan of 50 good samples needs 41
    // templates; a scan of 20 good samples needs 20 and runs.
    let n = 80usize;
    let sig: Vec<f64> = (0..n).map(|i| 1.0 + i as f64).collect();
    let scans = [0i64, 20, 30, 80];
    let (bscans, bflags, bindex, bsig, err) = (
        cl.buf(&scans, 0),
        cl.buf(&vec![0u8; n], 0),
        cl.buf(&[0i32], 0),
        cl.buf(&sig, 0.0),
        cl.error_buffer(),
    );
    // SAFETY: the arguments follow toast_filter_polynomial's signature.
    unsafe {
        ExecuteKernel::new(&cl.kernel("toast_filter_polynomial"))
            .set_arg(&(0 as cl_long))
            .set_arg(&(2 as cl_long))
            .set_arg(&(1 as cl_long))
            .set_arg(&(n as cl_long))
            .set_arg(&(40 as cl_long))
            .set_arg(&bscans)
            .set_arg(&bflags)
            .set_arg(&bindex)
            .set_arg(&bsig)
            .set_arg(&err)
            .set_global_work_sizes(&[1, 2])
            .enqueue_nd_range(&cl.queue)
            .expect("launch");
    }
    assert_eq!(
        cl.read(&err, &[0u64])[0],
        30,
        "key (signal 0, scan start 30)"
    );
    let got = cl.read(&bsig, &sig);
    // 20 templates interpolate the first scan's 20 samples: ~0 left.
    assert!(got[..20].iter().all(|v| v.abs() < 1e-9), "{:?}", &got[..20]);
    assert_eq!(
        got[20..],
        sig[20..],
        "the faulty scan and the rest untouched"
    );
}
