//! `toast_atan2`, the correctly rounded atan2 of the shared device source
//! (`toast-accel/device/kernels.h`) that `pixels_healpix` uses, run on
//! OpenCL (PoCL on CI) and compared with this platform's libm `atan2`, which
//! is what TOAST and the CPU backend call (glibc on the machines the
//! reference cases come from).
//!
//! glibc's `atan2` is correctly rounded for all but a few inputs in ten
//! thousand (measured on glibc 2.36: 38 of 60,000 random inputs are one ulp
//! off, by at most 0.5006 ulp), so the test wants: zeros, infinities, NaNs
//! and the cap/belt input that PoCL's own `atan2` gets wrong bit for bit;
//! random inputs within one ulp, and equal for all but 1 in 500. A
//! double-double slip in `toast_atan2` would break both.
//!
//! Without OpenCL the test prints `SKIPPED: <reason>` and passes, unless
//! `TOAST_REQUIRE_OPENCL` is set (CI), as in `conformance_opencl.rs`.

mod opencl_device;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::Device;
use opencl3::kernel::{ExecuteKernel, Kernel};
use opencl3::memory::{Buffer, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_ONLY, CL_MEM_WRITE_ONLY};
use opencl3::program::Program;
use opencl3::types::{cl_double, cl_long, CL_BLOCKING};
use toast_accel::device_source::{source, Target};
use toast_testkit::plugins::skip_unless_required;

const PROBE: &str = "
KERNEL void toast_atan2_probe(i64 n, GLOBAL const double *y, GLOBAL const double *x,
                              GLOBAL double *out) {
    const i64 i = GID0;
    if (i < n) {
        out[i] = toast_atan2(y[i], x[i]);
    }
}
";

/// toast_atan2(y[i], x[i]) on the device.
fn device_atan2(dev: &Device, y: &[f64], x: &[f64]) -> Vec<f64> {
    let context = Context::from_device(dev).expect("context");
    // SAFETY: dev.id() is a device of this context; no queue properties.
    let queue = unsafe { CommandQueue::create(&context, dev.id(), 0) }.expect("queue");
    let src = format!("{}\n{PROBE}", source(Target::OpenCl));
    let program = Program::create_and_build_from_source(&context, &src, "")
        .unwrap_or_else(|log| panic!("the device source does not build: {log}"));
    let kernel = Kernel::create(&program, "toast_atan2_probe").expect("kernel");
    let n = y.len();
    // SAFETY: COPY_HOST_PTR reads n doubles from y and x during the call.
    let (by, bx, out) = unsafe {
        (
            Buffer::<cl_double>::create(
                &context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                n,
                y.as_ptr() as *mut std::ffi::c_void,
            ),
            Buffer::<cl_double>::create(
                &context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                n,
                x.as_ptr() as *mut std::ffi::c_void,
            ),
            Buffer::<cl_double>::create(&context, CL_MEM_WRITE_ONLY, n, std::ptr::null_mut()),
        )
    };
    let (by, bx, out) = (by.expect("y"), bx.expect("x"), out.expect("out"));
    let n_arg = n as cl_long;
    // SAFETY: the arguments follow toast_atan2_probe's signature.
    unsafe {
        ExecuteKernel::new(&kernel)
            .set_arg(&n_arg)
            .set_arg(&by)
            .set_arg(&bx)
            .set_arg(&out)
            .set_global_work_size(n)
            .enqueue_nd_range(&queue)
            .expect("launch");
    }
    let mut got = vec![0.0f64; n];
    // SAFETY: got holds n doubles; the read blocks until done.
    unsafe { queue.enqueue_read_buffer(&out, CL_BLOCKING, 0, &mut got, &[]) }.expect("read");
    got
}

/// xorshift64 and a cheap normal deviate: reproducible inputs.
struct Rng(u64);
impl Rng {
    fn u01(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    fn normal(&mut self) -> f64 {
        let u = self.u01() + 1e-300;
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.u01()).cos()
    }
}

fn ulps_apart(a: f64, b: f64) -> u64 {
    let key = |v: f64| {
        let i = v.to_bits() as i64;
        if i < 0 {
            i64::MIN - i
        } else {
            i
        }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn toast_atan2_matches_libm_atan2_on_opencl() {
    let dev = match opencl_device::fp64_device() {
        Ok(d) => d,
        Err(why) => {
            skip_unless_required("TOAST_REQUIRE_OPENCL", why);
            return;
        }
    };
    // Bit for bit: special values, and the direction at z = 2/3, phi one ulp
    // below 3pi/4 of the pixels_healpix_boundary cases (PoCL's atan2 gives
    // fl(3pi/4) there, glibc the double below).
    let special = [
        0.0,
        -0.0,
        1.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
        5e-324,
        f64::MAX,
    ];
    let (mut y, mut x) = (Vec::new(), Vec::new());
    for &a in &special {
        for &b in &special {
            y.push(a);
            x.push(b);
        }
    }
    y.push(0.5270462766947301);
    x.push(-0.5270462766947298);
    let n_exact = y.len();
    // Within one ulp: random directions, near-diagonals, wide exponents.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..200_000 {
        let (a, b) = (rng.normal(), rng.normal());
        let (yy, xx) = match i % 4 {
            0 => (a, b),
            1 => (a, -a * (1.0 + (rng.u01() - 0.5) * 1e-14)),
            2 => (a * 1e-9, b),
            _ => (a * 2f64.powi((rng.u01() * 400.0) as i32 - 200), b),
        };
        y.push(yy);
        x.push(xx);
    }
    let got = device_atan2(&dev, &y, &x);
    let mut differ = 0;
    for (i, ((&yy, &xx), &g)) in y.iter().zip(&x).zip(&got).enumerate() {
        let want = yy.atan2(xx);
        let same = g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan());
        if i < n_exact {
            assert!(
                same,
                "toast_atan2({yy:e}, {xx:e}) = {g:e}, libm gives {want:e}"
            );
        } else if !same {
            differ += 1;
            assert!(
                ulps_apart(g, want) <= 1,
                "toast_atan2({yy:e}, {xx:e}) = {g:e}, more than one ulp from libm's {want:e}"
            );
        }
    }
    let n_random = y.len() - n_exact;
    assert!(
        differ * 500 <= n_random,
        "toast_atan2 differs from libm's atan2 on {differ} of {n_random} inputs"
    );
    eprintln!("toast_atan2 differs from libm's atan2 (by one ulp) on {differ} of {n_random} random inputs");
}
