//! The correctly rounded functions of the shared device source
//! (`toast-accel/device/kernels.h`): `toast_atan2`, which `pixels_healpix`
//! and `stokes_weights_IQU` use, and `toast_sin` / `toast_cos`, which
//! `stokes_weights_IQU` uses, run on OpenCL (PoCL on CI) and compared with
//! this platform's libm, which is what TOAST and the CPU backend call (glibc
//! on the machines the reference cases come from).
//!
//! glibc's `atan2` is correctly rounded for all but a few inputs in ten
//! thousand (measured on glibc 2.36: 38 of 60,000 random inputs are one ulp
//! off, by at most 0.5006 ulp), so the test wants: zeros, infinities, NaNs
//! and the cap/belt input that PoCL's own `atan2` gets wrong bit for bit;
//! random inputs within one ulp, and equal for all but 1 in 500. A
//! double-double slip in `toast_atan2` would break both.
//!
//! glibc's `sin` and `cos` are off by more than half an ulp more often (on
//! glibc 2.36, 0.14% of random arguments in [-7, 7], by at most 0.51 ulp),
//! so `toast_sin` / `toast_cos` are wanted: bit for bit on the special
//! arguments (zeros, multiples of pi/4 and pi/8, tiny and large arguments)
//! where glibc is correctly rounded; the correctly rounded value (from a
//! 250-bit evaluation, mpmath) at arguments where glibc is not, e.g. cos one
//! ulp above pi/2; random arguments within one ulp of glibc and equal for
//! all but 1 in 250.
//!
//! Without OpenCL the tests print `SKIPPED: <reason>` and pass, unless
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

/// One probe kernel per function: `out[i] = FN(a[i], b[i])` (sin and cos
/// ignore `b`).
const PROBES: &str = "
KERNEL void probe_atan2(i64 n, GLOBAL const double *a, GLOBAL const double *b,
                        GLOBAL double *out) {
    const i64 i = GID0;
    if (i < n) {
        out[i] = toast_atan2(a[i], b[i]);
    }
}
KERNEL void probe_sin(i64 n, GLOBAL const double *a, GLOBAL const double *b,
                      GLOBAL double *out) {
    const i64 i = GID0;
    if (i < n) {
        out[i] = toast_sin(a[i]);
    }
}
KERNEL void probe_cos(i64 n, GLOBAL const double *a, GLOBAL const double *b,
                      GLOBAL double *out) {
    const i64 i = GID0;
    if (i < n) {
        out[i] = toast_cos(a[i]);
    }
}
";

/// `FN(a[i], b[i])` on the device, FN one of `atan2`, `sin`, `cos`.
fn device_eval(dev: &Device, function: &str, a: &[f64], b: &[f64]) -> Vec<f64> {
    assert_eq!(a.len(), b.len());
    let context = Context::from_device(dev).expect("context");
    // SAFETY: dev.id() is a device of this context; no queue properties.
    let queue = unsafe { CommandQueue::create(&context, dev.id(), 0) }.expect("queue");
    let src = format!("{}\n{PROBES}", source(Target::OpenCl));
    let program = Program::create_and_build_from_source(&context, &src, "")
        .unwrap_or_else(|log| panic!("the device source does not build: {log}"));
    let kernel = Kernel::create(&program, &format!("probe_{function}")).expect("kernel");
    let n = a.len();
    // SAFETY: COPY_HOST_PTR reads n doubles from a and b during the call.
    let (ba, bb, out) = unsafe {
        (
            Buffer::<cl_double>::create(
                &context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                n,
                a.as_ptr() as *mut std::ffi::c_void,
            ),
            Buffer::<cl_double>::create(
                &context,
                CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                n,
                b.as_ptr() as *mut std::ffi::c_void,
            ),
            Buffer::<cl_double>::create(&context, CL_MEM_WRITE_ONLY, n, std::ptr::null_mut()),
        )
    };
    let (ba, bb, out) = (ba.expect("a"), bb.expect("b"), out.expect("out"));
    let n_arg = n as cl_long;
    // SAFETY: the arguments follow the probe kernels' signature.
    unsafe {
        ExecuteKernel::new(&kernel)
            .set_arg(&n_arg)
            .set_arg(&ba)
            .set_arg(&bb)
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
    let Some((_one, dev)) = opencl_device::device_for_test() else {
        return;
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
    let got = device_eval(&dev, "atan2", &y, &x);
    let want: Vec<f64> = y.iter().zip(&x).map(|(&yy, &xx)| yy.atan2(xx)).collect();
    let what = |i: usize| format!("toast_atan2({:e}, {:e})", y[i], x[i]);
    exactly_libm(&what, &got[..n_exact], &want[..n_exact]);
    near_libm(&what, &got[n_exact..], &want[n_exact..], n_exact, 500);
}

/// Equal bits, or both NaN.
fn same_bits(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// `got` (inputs `0..` of `what`) bit for bit libm's `want`.
fn exactly_libm(what: &dyn Fn(usize) -> String, got: &[f64], want: &[f64]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(same_bits(g, w), "{} = {g:e}, libm gives {w:e}", what(i));
    }
}

/// `got` (inputs `first..` of `what`) within one ulp of libm's `want`
/// everywhere and equal to it for all but one in `one_in`.
fn near_libm(
    what: &dyn Fn(usize) -> String,
    got: &[f64],
    want: &[f64],
    first: usize,
    one_in: usize,
) {
    let mut differ = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !same_bits(g, w) {
            differ += 1;
            assert!(
                ulps_apart(g, w) <= 1,
                "{} = {g:e}, more than one ulp from libm's {w:e}",
                what(first + i)
            );
        }
    }
    let n = got.len();
    let name = what(first);
    let name = name.split('(').next().unwrap_or_default();
    assert!(
        differ * one_in <= n,
        "{name} differs from libm's on {differ} of {n} inputs"
    );
    eprintln!("{name} differs from libm's (by one ulp) on {differ} of {n} random inputs");
}

#[test]
fn toast_sin_and_cos_are_correctly_rounded_on_opencl() {
    let Some((_one, dev)) = opencl_device::device_for_test() else {
        return;
    };
    use std::f64::consts::PI;
    // Bit for bit with libm: zeros, tiny and large arguments, the multiples
    // of pi/8 up to 16 pi (where glibc 2.36 is correctly rounded), the
    // thresholds of the tiny-argument shortcuts, the last argument of the
    // double-double path and the first of the fallback.
    let mut x = vec![
        0.0,
        -0.0,
        5e-324,
        1e-300,
        -1e-20,
        1.4901161193847656e-08,
        1.49e-08,
        7.450580596923828e-09,
        7.45e-09,
        1e-8,
        0.5,
        1.0,
        22.0,
        355.0,
        103993.0,
        1073741823.0,
        1073741824.0,
        -3.0e9,
    ];
    for k in -128..=128 {
        x.push(f64::from(k) * PI / 8.0);
    }
    let n_exact = x.len();
    // Where glibc errs above half an ulp: (argument, correctly rounded sin,
    // correctly rounded cos), from mpmath at 250 bits.
    let rounded: [(f64, f64, f64); 2] = [
        (1.5707963267948968, 1.0, -1.6081226496766366e-16),
        (-16.49336143134641, 0.7071067811865451, -0.7071067811865499),
    ];
    for &(a, _, _) in &rounded {
        x.push(a);
    }
    let n_fixed = x.len();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..200_000 {
        x.push(match i % 4 {
            0 | 1 => (rng.u01() - 0.5) * 14.0,
            2 => (rng.u01() - 0.5) * 2e4,
            _ => rng.normal() * 2f64.powi((rng.u01() * 40.0) as i32 - 30),
        });
    }
    let zeros = vec![0.0; x.len()];
    for (function, host, column) in [
        ("sin", f64::sin as fn(f64) -> f64, 1),
        ("cos", f64::cos as fn(f64) -> f64, 2),
    ] {
        let got = device_eval(&dev, function, &x, &zeros);
        let want: Vec<f64> = x.iter().map(|&a| host(a)).collect();
        let what = |i: usize| format!("toast_{function}({:e})", x[i]);
        exactly_libm(&what, &got[..n_exact], &want[..n_exact]);
        for (i, &(_, s, c)) in rounded.iter().enumerate() {
            let cr = if column == 1 { s } else { c };
            let g = got[n_exact + i];
            assert_eq!(
                g.to_bits(),
                cr.to_bits(),
                "{} = {g:e}, the correctly rounded value is {cr:e} (libm {:e})",
                what(n_exact + i),
                want[n_exact + i]
            );
        }
        near_libm(&what, &got[n_fixed..], &want[n_fixed..], n_fixed, 250);
    }
}
