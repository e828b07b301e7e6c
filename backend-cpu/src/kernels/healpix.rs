//! pixels_healpix: HEALPix pixel of each detector direction, as TOAST 3.0.6
//! computes it (`ops_pixels_healpix.cpp`), operation for operation.
//!
//! C's `(int64_t)x` of a NaN or out-of-range double gives `INT64_MIN` on
//! x86-64 (`cvttsd2si`), and the integer arithmetic after it wraps; [`c_i64`]
//! and wrapping operations reproduce that, so even degenerate directions
//! (`dir.z` rounding below -1 near the south pole, where `rtz` is NaN) give
//! TOAST's pixel. A quaternion whose direction is not finite (NaN or
//! infinite components), where TOAST computes a meaningless pixel, is an
//! error, and so is any result outside `[0, 12 nside^2)`, which is never
//! used to index `hit_submaps`.
//!
//! Speed: the kernel is bound by the latency of its arithmetic (an `atan2`
//! call, a division, conversions) and of its quaternion stream, read at
//! 32 B per sample, which the hardware prefetchers leave to stall: each
//! stretch of samples is done in blocks of [`BLOCK`] (the rotations, then
//! the `atan2` calls, then the pixels), asking for the quaternions'
//! cache lines [`PREFETCH_AHEAD`] elements ahead. On the bench's workload
//! (`toast-cli bench kernels`) this took a quarter off the time per sample
//! (NEST 32.5 -> 24 ns, RING 27.6 -> 20 ns on a loaded machine); the
//! blocks alone gave nothing measurable. The results are the same bits.

use super::mapmaker_utils::prefetch;
use crate::arrays::{self, Arg};
use crate::par::{for_each_chunk, SampleFault, SharedMut};
use std::f64::consts::{FRAC_2_PI, PI};
use std::sync::atomic::{AtomicU8, Ordering};
use toast_accel::abi::PixelsHealpixArgs;
use toast_accel::check::PixelsHealpix;
use toast_accel::plugin_support::PluginError;

const K: &str = "pixels_healpix";
/// TOAST's `0.66666666666666666667`, which rounds to the same double as 2/3
/// (checked in the tests).
const TWOTHIRDS: f64 = 2.0 / 3.0;

/// `(int64_t)x` as x86-64 computes it: truncation, and `i64::MIN` for NaN
/// or a value out of range. On x86-64 this is the one instruction C
/// compiles the cast to (`cvttsd2si`), which has exactly these semantics;
/// elsewhere Rust's saturating cast with the out-of-range case made
/// explicit.
#[inline(always)]
pub(crate) fn c_i64(x: f64) -> i64 {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        use std::arch::x86_64::{_mm_cvttsd_si64, _mm_set_sd};
        // SAFETY: the two intrinsics only need SSE2, which this code is
        // compiled for (the cfg above; it is part of the x86-64 baseline).
        unsafe { _mm_cvttsd_si64(_mm_set_sd(x)) }
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x) {
            x as i64
        } else {
            i64::MIN
        }
    }
}

/// The bit-spreading table of `hpix_init_utab` (the tests check
/// [`xy2pix`] against TOAST's lookups in it).
#[cfg(test)]
const fn make_utab() -> [i64; 256] {
    let mut t = [0i64; 256];
    let mut m = 0i64;
    while m < 256 {
        t[m as usize] = (m & 0x1)
            | ((m & 0x2) << 1)
            | ((m & 0x4) << 2)
            | ((m & 0x8) << 3)
            | ((m & 0x10) << 4)
            | ((m & 0x20) << 5)
            | ((m & 0x40) << 6)
            | ((m & 0x80) << 7);
        m += 1;
    }
    t
}

/// The low 32 bits of `x` spread to the even bits of the result (bit i to
/// bit 2i): what `hpix_xy2pix`'s four `utab` lookups of one coordinate
/// compute (they read bits 0-31 only), in shifts and masks.
#[inline(always)]
fn spread_bits(x: i64) -> i64 {
    let mut v = (x as u64) & 0xffff_ffff;
    v = (v | (v << 16)) & 0x0000_ffff_0000_ffff;
    v = (v | (v << 8)) & 0x00ff_00ff_00ff_00ff;
    v = (v | (v << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    v = (v | (v << 2)) & 0x3333_3333_3333_3333;
    v = (v | (v << 1)) & 0x5555_5555_5555_5555;
    v as i64
}

/// `hpix_xy2pix`: the bits of `x` and `y` interleaved (x even, y odd).
#[inline(always)]
fn xy2pix(x: i64, y: i64) -> i64 {
    spread_bits(x) | (spread_bits(y) << 1)
}

/// Samples per block of [`Hpix::pixel_block`].
const BLOCK: usize = 4;

/// How far ahead (in f64 elements of the quaternions) a block asks for
/// the cache lines of the quaternions it will read.
const PREFETCH_AHEAD: usize = 512;

/// `hpix_qa_rotate(q, v)`: written once in toast-accel (shared with
/// toast-ops' compact pointing).
pub(crate) use toast_accel::math::qa_rotate;

/// Per-nside constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hpix {
    nside: i64,
    factor: u32,
    dnside: f64,
    halfnside: f64,
    tqnside: f64,
    nsm1: i64,
    ncap: i64,
    npix: i64,
    fournside: i64,
    fournside_pow2: bool,
}

impl Hpix {
    pub(crate) fn new(nside: i64, factor: u32) -> Self {
        let dnside = nside as f64;
        Hpix {
            nside,
            factor,
            dnside,
            halfnside: 0.5 * dnside,
            tqnside: 0.75 * dnside,
            nsm1: nside - 1,
            ncap: 2 * (nside * nside - nside),
            npix: 12 * nside * nside,
            fournside: 4 * nside,
            fournside_pow2: nside > 0 && (nside as u64).is_power_of_two(),
        }
    }

    /// `(region, z, rtz)` of `hpix_vec2zphi` (its `phi` is `atan2(y, x)`,
    /// which [`Hpix::pixel_block`] computes apart).
    #[inline(always)]
    fn zregion(v: &[f64; 3]) -> (i32, f64, f64) {
        let z = v[2];
        let za = z.abs();
        let itemp = if z > 0.0 { 1 } else { -1 };
        let region = if za <= TWOTHIRDS {
            itemp
        } else {
            itemp + itemp
        };
        let rtz = (3.0 * (1.0 - za)).sqrt();
        (region, z, rtz)
    }

    /// `tt` from `phi` as both `zphi2*` functions compute it.
    #[inline(always)]
    fn tt(phi: f64) -> f64 {
        let tol = 10.0 * f64::EPSILON;
        let m = 2.0 * PI;
        let div = phi / m;
        // `hpix_fmod`: m * (div - (int64_t)div). For |div| < 1 (every phi
        // atan2 returns) the truncation is 0 and `div - 0.0` is `div`
        // exactly (signed zeros included), so the conversions are skipped.
        let mut phi_mod = if div.abs() < 1.0 {
            m * div
        } else {
            m * (div - c_i64(div) as f64)
        };
        if phi_mod < tol && phi_mod > -tol {
            phi_mod = 0.0;
        }
        if phi_mod >= 0.0 {
            phi_mod * FRAC_2_PI
        } else {
            phi_mod * FRAC_2_PI + 4.0
        }
    }

    #[inline(always)]
    fn zphi2nest(&self, phi: f64, region: i32, z: f64, rtz: f64) -> i64 {
        let tt = Self::tt(phi);
        let nsm1 = self.nsm1;
        let (face, x, y);
        if region == 1 || region == -1 {
            let temp1 = self.halfnside + self.dnside * tt;
            let temp2 = self.tqnside * z;
            let jp = c_i64(temp1 - temp2);
            let jm = c_i64(temp1 + temp2);
            let ifp = jp >> self.factor;
            let ifm = jm >> self.factor;
            face = if ifp == ifm {
                if ifp == 4 {
                    4
                } else {
                    ifp.wrapping_add(4)
                }
            } else if ifp < ifm {
                ifp
            } else {
                ifm.wrapping_add(8)
            };
            x = jm & nsm1;
            y = nsm1.wrapping_sub(jp & nsm1);
        } else {
            let ntt = c_i64(tt);
            let tp = tt - ntt as f64;
            let temp1 = self.dnside * rtz;
            let mut jp = c_i64(tp * temp1);
            let mut jm = c_i64((1.0 - tp) * temp1);
            if jp >= self.nside {
                jp = nsm1;
            }
            if jm >= self.nside {
                jm = nsm1;
            }
            if z >= 0.0 {
                face = ntt;
                x = nsm1.wrapping_sub(jm);
                y = nsm1.wrapping_sub(jp);
            } else {
                face = ntt.wrapping_add(8);
                x = jp;
                y = jm;
            }
        }
        xy2pix(x, y).wrapping_add(face.wrapping_shl(2 * self.factor))
    }

    #[inline(always)]
    fn zphi2ring(&self, phi: f64, region: i32, z: f64, rtz: f64) -> i64 {
        let tt = Self::tt(phi);
        if region == 1 || region == -1 {
            let temp1 = self.halfnside + self.dnside * tt;
            let temp2 = self.tqnside * z;
            let jp = c_i64(temp1 - temp2);
            let jm = c_i64(temp1 + temp2);
            let ir = (self.nside + 1).wrapping_add(jp).wrapping_sub(jm);
            let kshift = 1 - (ir & 1);
            let ip = jp
                .wrapping_add(jm)
                .wrapping_sub(self.nside)
                .wrapping_add(kshift + 1)
                >> 1;
            // `ip % (4 nside)`: a mask when that is a power of two and ip is
            // not negative (then the two agree), else the remainder.
            let ip = if ip >= 0 && self.fournside_pow2 {
                ip & (self.fournside - 1)
            } else {
                ip.wrapping_rem(self.fournside)
            };
            self.ncap.wrapping_add(
                ir.wrapping_sub(1)
                    .wrapping_mul(self.fournside)
                    .wrapping_add(ip),
            )
        } else {
            // `tt - floor(tt)`; for tt >= 0 (every tt but a NaN, or one
            // rounding below 0) floor is the truncation, one instruction
            // where `floor` is a call on baseline x86-64. tp may then be
            // +0.0 where floor gives -0.0 (tt = -0.0), which changes no
            // product's truncation below.
            let tp = tt
                - if tt >= 0.0 {
                    c_i64(tt) as f64
                } else {
                    tt.floor()
                };
            let temp1 = self.dnside * rtz;
            let jp = c_i64(tp * temp1);
            let jm = c_i64((1.0 - tp) * temp1);
            let ir = jp.wrapping_add(jm).wrapping_add(1);
            let mut ip = c_i64(tt * ir as f64);
            let d = ir.wrapping_mul(4);
            if d == 0 {
                // C divides by zero here; only reachable from non-finite input.
                return i64::MIN;
            }
            // `ip - ip / d`: the quotient is 0 for 0 <= ip < d (the usual
            // case, tt < 4), so the division is skipped there.
            if !(0..d).contains(&ip) {
                ip = ip.wrapping_sub(ip.wrapping_div(d));
            }
            self.polar_ring_pixel(region, ir, ip)
        }
    }

    /// The RING pixel of ring `ir`, position `ip` of a polar cap (north for
    /// `region > 0`).
    #[inline(always)]
    fn polar_ring_pixel(&self, region: i32, ir: i64, ip: i64) -> i64 {
        if region > 0 {
            ir.wrapping_mul(2)
                .wrapping_mul(ir.wrapping_sub(1))
                .wrapping_add(ip)
        } else {
            self.npix
                .wrapping_sub(ir.wrapping_mul(2).wrapping_mul(ir.wrapping_add(1)))
                .wrapping_add(ip)
        }
    }

    /// The NESTED or RING pixels of the directions of the quaternions `q`
    /// (4 values each, 1 to [`BLOCK`] of them) into `pix`, and whether each
    /// direction is finite into `finite` (where it is not, the pixel is
    /// meaningless, as TOAST's). Each pixel takes TOAST's operations
    /// (`hpix_qa_rotate`, `hpix_vec2zphi`, then `hpix_zphi2nest` or
    /// `hpix_zphi2ring`); the work is only regrouped: the rotations of the
    /// block, then its `atan2` calls, then its pixels, so that each stage
    /// is a loop of independent samples.
    #[inline(always)]
    fn pixel_block(
        &self,
        q: &[f64],
        nest: bool,
        pix: &mut [i64; BLOCK],
        finite: &mut [bool; BLOCK],
    ) {
        let n = q.len() / 4;
        debug_assert!((1..=BLOCK).contains(&n));
        let mut dir = [[0.0f64; 3]; BLOCK];
        for (l, d) in dir.iter_mut().enumerate() {
            // A short block repeats its last quaternion.
            let k = 4 * l.min(n - 1);
            *d = qa_rotate(&q[k..k + 4], &[0.0, 0.0, 1.0]);
        }
        let mut phi = [0.0f64; BLOCK];
        for (p, d) in phi.iter_mut().zip(&dir).take(n) {
            *p = d[1].atan2(d[0]);
        }
        for l in 0..BLOCK {
            let d = &dir[l];
            finite[l] = d[0].is_finite() && d[1].is_finite() && d[2].is_finite();
            let (region, z, rtz) = Self::zregion(d);
            pix[l] = if nest {
                self.zphi2nest(phi[l], region, z, rtz)
            } else {
                self.zphi2ring(phi[l], region, z, rtz)
            };
        }
    }

    /// The NESTED or RING pixel of quaternion `q`'s direction, or `None`
    /// when the direction is not finite: [`Hpix::pixel_block`] of one.
    #[cfg(test)]
    pub(crate) fn pixel(&self, q: &[f64], nest: bool) -> Option<i64> {
        let mut pix = [0i64; BLOCK];
        let mut finite = [false; BLOCK];
        self.pixel_block(&q[..4], nest, &mut pix, &mut finite);
        finite[0].then_some(pix[0])
    }
}

/// # Safety
/// `a` has passed `check_pixels_healpix` (giving `v`) and its arrays are
/// host memory of the stated lengths.
pub(crate) unsafe fn run(v: &PixelsHealpix<'_>, a: &PixelsHealpixArgs) -> Result<(), PluginError> {
    if v.pixels_i32 {
        // SAFETY: the caller's contract, with `pixels` of i32 (checked flag).
        unsafe { run_into::<i32>(v, a) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { run_into::<i64>(v, a) }
    }
}

/// An element type of the `pixels` output: i64 (TOAST's), or i32 (the
/// compact pointing, `pixels_i32`; the validator checked that every pixel
/// of the nside fits).
trait PixelOut: Copy + Send + Sync + 'static {
    /// A valid pixel in `[-1, 12 nside²)`.
    fn of(p: i64) -> Self;
}

impl PixelOut for i64 {
    #[inline(always)]
    fn of(p: i64) -> Self {
        p
    }
}

impl PixelOut for i32 {
    #[inline(always)]
    fn of(p: i64) -> Self {
        // In range: 12 nside² <= i32::MAX (checked), and p < 12 nside².
        p as i32
    }
}

/// [`run`] with pixels of `P`.
///
/// # Safety
/// As [`run`], with `a.pixels` an array of `P`.
unsafe fn run_into<P: PixelOut>(
    v: &PixelsHealpix<'_>,
    a: &PixelsHealpixArgs,
) -> Result<(), PluginError> {
    arrays::check_disjoint(
        K,
        &[
            Arg::new::<P>("pixels", a.pixels),
            Arg::new::<u8>("hit_submaps", a.hit_submaps),
        ],
        &[
            Arg::new::<f64>("quats", a.quats),
            Arg::new::<u8>("shared_flags", a.shared_flags),
        ],
    )?;
    // SAFETY: host arrays of the validated lengths; outputs overlap nothing.
    let (quats, flags, pixels, hits) = unsafe {
        (
            arrays::input::<f64>(K, "quats", a.quats)?,
            arrays::input::<u8>(K, "shared_flags", a.shared_flags)?,
            arrays::output::<P>(K, "pixels", a.pixels)?,
            arrays::output::<u8>(K, "hit_submaps", a.hit_submaps)?,
        )
    };
    // The submaps hit are marked here first, and in `hits` only once every
    // pixel is valid: a fault leaves the caller's marks as they were (see
    // the kernels module).
    let marks: Vec<AtomicU8> = (0..hits.len()).map(|_| AtomicU8::new(0)).collect();
    let pixels = SharedMut::new(pixels);
    let hp = Hpix::new(a.nside, v.factor);
    let nest = a.nest != 0;
    let n_samp = v.n_samp;
    let nps = a.n_pix_submap;
    let mask = a.shared_flag_mask;
    let use_flags = v.use_flags;
    // The submap of a pixel: a shift when n_pix_submap is a power of two
    // (pixels are non-negative here, so it equals the division), else the
    // division TOAST does.
    let nps_shift = (nps > 0 && (nps as u64).is_power_of_two()).then(|| nps.trailing_zeros());
    let stretch = Stretch {
        hp: &hp,
        nest,
        use_flags,
        mask,
        nps,
        nps_shift,
        hits: &marks,
    };
    let r = for_each_chunk(n_samp, v.intervals, |segs| {
        for det in 0..v.n_det {
            let qrow = v.quat_index[det] as usize;
            let prow = v.pixel_index[det] as usize;
            for seg in segs {
                let q = &quats[4 * (qrow * n_samp + seg.first)..4 * (qrow * n_samp + seg.last)];
                let fl = &flags[if use_flags { seg.first..seg.last } else { 0..0 }];
                // SAFETY: this task owns samples [seg.first, seg.last) of every row.
                let out = unsafe { pixels.slice_mut(prow * n_samp + seg.first, seg.len()) };
                if let Err((k, got)) = stretch.run(q, fl, out) {
                    let qq = &q[4 * k..4 * k + 4];
                    return Err(bad_pixel(det, seg.view, seg.first + k, qq, got));
                }
            }
        }
        Ok(())
    });
    r.map_err(|f| super::fault_error(K, f))?;
    for (h, m) in hits.iter_mut().zip(&marks) {
        if m.load(Ordering::Relaxed) != 0 {
            *h = 1;
        }
    }
    Ok(())
}

/// What the pixels of one stretch of samples (one detector, one piece of
/// an interval) are computed with.
struct Stretch<'a> {
    hp: &'a Hpix,
    nest: bool,
    use_flags: bool,
    mask: u8,
    nps: i64,
    /// `log2(nps)` when `nps` is a power of two.
    nps_shift: Option<u32>,
    hits: &'a [AtomicU8],
}

impl Stretch<'_> {
    /// The pixels of the quaternions `q` (4 values per sample) into `out`,
    /// -1 where `flags & mask` is set (`flags` is empty when the flags are
    /// not used), and their submaps marked hit; on a sample whose pixel is
    /// invalid, its index and what was computed (`None`: a direction that
    /// is not finite). Computed [`BLOCK`] samples at a time.
    fn run<P: PixelOut>(
        &self,
        q: &[f64],
        flags: &[u8],
        out: &mut [P],
    ) -> Result<(), (usize, Option<i64>)> {
        let mut pix = [0i64; BLOCK];
        let mut finite = [false; BLOCK];
        for (b, (ob, qb)) in out.chunks_mut(BLOCK).zip(q.chunks(4 * BLOCK)).enumerate() {
            // The quaternions arrive faster this way than by the hardware's
            // own prefetching (see the module's docs); a prefetch changes no
            // result.
            let ahead = qb.as_ptr().wrapping_add(PREFETCH_AHEAD);
            for line in 0..4 * BLOCK / 8 {
                prefetch(ahead.wrapping_add(8 * line));
            }
            // Flagged samples are computed too (and dropped below): a pixel
            // has no side effect, and its wrapping arithmetic cannot panic.
            self.hp.pixel_block(qb, self.nest, &mut pix, &mut finite);
            for (l, p) in ob.iter_mut().enumerate() {
                let k = b * BLOCK + l;
                if self.use_flags && flags[k] & self.mask != 0 {
                    *p = P::of(-1);
                    continue;
                }
                let px = pix[l];
                if !(finite[l] && (0..self.hp.npix).contains(&px)) {
                    return Err((k, finite[l].then_some(px)));
                }
                *p = P::of(px);
                let sub = match self.nps_shift {
                    Some(sh) => px >> sh,
                    None => px / self.nps,
                };
                // In bounds: hit_submaps covers 12 nside^2 pixels (checked).
                let h = &self.hits[sub as usize];
                if h.load(Ordering::Relaxed) == 0 {
                    h.store(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
}

/// The fault of a sample whose quaternion gives no valid pixel (`got`:
/// None when its direction is not finite, else the pixel computed).
#[cold]
#[inline(never)]
fn bad_pixel(det: usize, view: usize, samp: usize, q: &[f64], got: Option<i64>) -> SampleFault {
    SampleFault::new(
        det,
        view,
        samp,
        format!(
            "quaternion {q:?} gives no valid pixel: {}",
            match got {
                None => "its direction is not finite".to_string(),
                Some(p) => format!("got {p}"),
            }
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_toast() {
        assert_eq!("0.66666666666666666667".parse::<f64>().unwrap(), TWOTHIRDS);
        assert_eq!("0.63661977236758134308".parse::<f64>().unwrap(), FRAC_2_PI);
    }

    #[test]
    fn c_conversion_matches_cvttsd2si() {
        assert_eq!(c_i64(f64::NAN), i64::MIN);
        assert_eq!(c_i64(1e300), i64::MIN);
        assert_eq!(c_i64(-1e300), i64::MIN);
        assert_eq!(c_i64(-2.7), -2);
        assert_eq!(c_i64(9.2e18), 9_200_000_000_000_000_000);
        assert_eq!(c_i64(-9_223_372_036_854_775_808.0), i64::MIN);
        assert_eq!(c_i64(9_223_372_036_854_775_808.0), i64::MIN);
        assert_eq!(c_i64(f64::INFINITY), i64::MIN);
        assert_eq!(c_i64(f64::NEG_INFINITY), i64::MIN);
        assert_eq!(c_i64(-0.9), 0);
        assert_eq!(c_i64(4095.999), 4095);
    }

    /// `hpix_xy2pix` as TOAST computes it, with its lookup table.
    fn xy2pix_table(x: i64, y: i64) -> i64 {
        let utab = make_utab();
        let ut = |v: i64, shift: u32| utab[(v.wrapping_shr(shift) & 0xff) as usize];
        ut(x, 0)
            | ut(x, 8).wrapping_shl(16)
            | ut(x, 16).wrapping_shl(32)
            | ut(x, 24).wrapping_shl(48)
            | ut(y, 0).wrapping_shl(1)
            | ut(y, 8).wrapping_shl(17)
            | ut(y, 16).wrapping_shl(33)
            | ut(y, 24).wrapping_shl(49)
    }

    #[test]
    fn xy2pix_matches_toast_table() {
        let mut vals = vec![
            0i64,
            1,
            2,
            255,
            256,
            4095,
            8191,
            1 << 29,
            (1 << 30) - 1,
            -1,
            -2,
        ];
        vals.extend([i64::MIN, i64::MAX, 0x1234_5678_9abc_def0, -0x1234_5678]);
        let mut r = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            vals.push(r as i64);
            vals.push((r >> 35) as i64);
        }
        for w in vals.windows(2) {
            assert_eq!(xy2pix(w[0], w[1]), xy2pix_table(w[0], w[1]), "{w:?}");
        }
    }

    #[test]
    fn tt_matches_hpix_fmod() {
        // TOAST's formula, with the conversions always done.
        let reference = |phi: f64| {
            let m = 2.0 * PI;
            let div = phi / m;
            let mut phi_mod = m * (div - c_i64(div) as f64);
            if phi_mod < 10.0 * f64::EPSILON && phi_mod > -10.0 * f64::EPSILON {
                phi_mod = 0.0;
            }
            if phi_mod >= 0.0 {
                phi_mod * FRAC_2_PI
            } else {
                phi_mod * FRAC_2_PI + 4.0
            }
        };
        let mut phis = vec![
            0.0, -0.0, PI, -PI, 1e-300, -1e-300, 7.0, -7.0, 1e300, -1e300,
        ];
        phis.extend((-2000..=2000).map(|k| k as f64 * PI / 1000.0));
        phis.extend((0..1000).map(|k| (k as f64 * 0.6180339887).sin() * 3.5));
        for phi in phis {
            assert_eq!(Hpix::tt(phi).to_bits(), reference(phi).to_bits(), "{phi}");
        }
        assert!(Hpix::tt(f64::NAN).is_nan());
    }

    /// The polar branch of `hpix_zphi2ring` as TOAST writes it (`floor`, and
    /// the division always done), against [`Hpix::zphi2ring`]'s shortcuts.
    #[test]
    fn ring_polar_shortcuts_match_toast() {
        let reference = |hp: &Hpix, phi: f64, region: i32, rtz: f64| {
            let tt = Hpix::tt(phi);
            let tp = tt - tt.floor();
            let temp1 = hp.dnside * rtz;
            let jp = c_i64(tp * temp1);
            let jm = c_i64((1.0 - tp) * temp1);
            let ir = jp.wrapping_add(jm).wrapping_add(1);
            let mut ip = c_i64(tt * ir as f64);
            ip = ip.wrapping_sub(ip.wrapping_div(ir.wrapping_mul(4)));
            hp.polar_ring_pixel(region, ir, ip)
        };
        let mut r = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut phis = vec![0.0, -0.0, PI, -PI, 1e-300, -1e-300, 2.0 * PI, -2.0 * PI];
        phis.extend((-400..=400).map(|k| k as f64 * PI / 200.0));
        phis.extend(
            (-4..=4).map(|k: i64| f64::from_bits((2.0 * PI).to_bits().wrapping_add(k as u64))),
        );
        phis.extend(
            (-4..=4).map(|k: i64| f64::from_bits((-2.0 * PI).to_bits().wrapping_add(k as u64))),
        );
        for (nside, factor) in [(1, 0), (4, 2), (2048, 11), (8192, 13)] {
            let hp = Hpix::new(nside, factor);
            let mut cases: Vec<(f64, f64)> = phis.iter().map(|&p| (p, 0.9)).collect();
            cases.extend((0..20_000).map(|_| ((next() - 0.5) * 2.0 * PI, next())));
            cases.extend((0..200).map(|_| (next() * PI, 1.0 - next() * 1e-12)));
            for (phi, za) in cases {
                for z in [za, -za] {
                    let za = z.abs();
                    if za <= TWOTHIRDS {
                        continue;
                    }
                    let region = if z > 0.0 { 2 } else { -2 };
                    let rtz = (3.0 * (1.0 - za)).sqrt();
                    assert_eq!(
                        hp.zphi2ring(phi, region, z, rtz),
                        reference(&hp, phi, region, rtz),
                        "nside {nside}, phi {phi}, z {z}"
                    );
                }
            }
        }
    }

    /// A stretch done in blocks (every length up to three blocks, flags
    /// on some samples) gives each sample the pixel it has alone, and marks
    /// exactly the submaps of the unflagged ones.
    #[test]
    fn blocks_give_each_sample_its_own_pixel() {
        let mut r = 0x1234_5678_9abc_def1u64;
        let mut next = move || {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            (r >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let n_max = 3 * BLOCK + 1;
        let mut quats = Vec::with_capacity(4 * n_max);
        for k in 0..n_max {
            let mut q = [next(), next(), next(), next()];
            if k % 5 == 0 {
                // Near a pole: the polar branches.
                q = [1e-3 * q[0], 1e-3 * q[1], q[2], 1.0];
            }
            let n = q.iter().map(|x| x * x).sum::<f64>().sqrt();
            quats.extend(q.map(|x| x / n));
        }
        let flags: Vec<u8> = (0..n_max).map(|k| u8::from(k % 7 == 3)).collect();
        let hp = Hpix::new(64, 6);
        for nest in [false, true] {
            for n in 1..=n_max {
                let hits: Vec<AtomicU8> = (0..12 * 4).map(|_| AtomicU8::new(0)).collect();
                let stretch = Stretch {
                    hp: &hp,
                    nest,
                    use_flags: true,
                    mask: 1,
                    nps: 1024,
                    nps_shift: Some(10),
                    hits: &hits,
                };
                let mut out = vec![0i64; n];
                stretch.run(&quats[..4 * n], &flags[..n], &mut out).unwrap();
                let mut want_hits = vec![0u8; 12 * 4];
                for k in 0..n {
                    if flags[k] != 0 {
                        assert_eq!(out[k], -1);
                        continue;
                    }
                    let p = hp.pixel(&quats[4 * k..4 * k + 4], nest).unwrap();
                    assert_eq!(out[k], p, "nest {nest}, n {n}, sample {k}");
                    want_hits[(p >> 10) as usize] = 1;
                }
                let got_hits: Vec<u8> = hits.iter().map(|h| h.load(Ordering::Relaxed)).collect();
                assert_eq!(got_hits, want_hits);
            }
        }
    }

    #[test]
    fn poles_and_equator() {
        let hp = Hpix::new(4, 2);
        // Identity: north pole, first pixel of the first ring / face 0 corner.
        assert_eq!(hp.pixel(&[0.0, 0.0, 0.0, 1.0], false), Some(0));
        assert_eq!(hp.pixel(&[0.0, 0.0, 0.0, 1.0], true), Some(15));
        // (1,0,0,0): south pole.
        assert_eq!(hp.pixel(&[1.0, 0.0, 0.0, 0.0], false), Some(188));
        assert_eq!(hp.pixel(&[1.0, 0.0, 0.0, 0.0], true), Some(128));
    }
}
