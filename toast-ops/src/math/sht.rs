//! Spherical-harmonic synthesis (a_ℓm → HEALPix maps), spin 0 and spin 2.
//!
//! # Conventions (healpy / HEALPix)
//!
//! Coefficients are stored for `m ≥ 0` only, in healpy's m-major layout
//! (`index = m (2 lmax + 1 − m) / 2 + ℓ`, see [`Alm::index`]); the `m < 0`
//! coefficients of a real field follow from `a_{ℓ,−m} = (−1)^m a*_{ℓm}`
//! (so the imaginary parts of `a_ℓ0` are ignored, as in healpy).
//!
//! Every map is `X(θ, φ) = Σ_{m=−lmax}^{lmax} X_m(θ) e^{imφ}` with
//! `X_{−m} = conj(X_m)`. For `m ≥ 0`:
//!
//! * temperature (spin 0): `T_m = Σ_ℓ a^T_ℓm λ_ℓm(θ)`, where
//!   `λ_ℓm = √((2ℓ+1)/4π · (ℓ−m)!/(ℓ+m)!) P_ℓ^m(cos θ)` are the normalised
//!   associated Legendre functions including the Condon–Shortley phase `(−1)^m`
//!   (`Y_ℓm = λ_ℓm e^{imφ}`);
//! * polarisation (spin ±2, healpy's default "COSMO" convention):
//!   `Q_m = −Σ_ℓ (a^E_ℓm F¹_ℓm − i a^B_ℓm F²_ℓm)`,
//!   `U_m = −Σ_ℓ (a^B_ℓm F¹_ℓm + i a^E_ℓm F²_ℓm)`, with
//!
//! ```text
//! F¹_ℓm = N_ℓ [ −((ℓ − m²)/sin²θ + ℓ(ℓ−1)/2) λ_ℓm + (cosθ/sin²θ) f_ℓm λ_{ℓ−1,m} ]
//! F²_ℓm = N_ℓ (m/sin²θ) [ (ℓ−1) cosθ λ_ℓm − f_ℓm λ_{ℓ−1,m} ]
//! N_ℓ   = 2 √((ℓ−2)!/(ℓ+2)!),   f_ℓm = √((2ℓ+1)/(2ℓ−1) · (ℓ²−m²))
//! ```
//!
//! (Kamionkowski, Kosowsky & Stebbins 1997; Górski et al. 2005). This is what
//! `healpy.alm2map([T, E, B], nside, pol=True)` computes; the test suite
//! compares against healpy directly.
//!
//! # Algorithm
//!
//! Ring-based synthesis: for each iso-latitude ring the Fourier coefficients
//! `f_m(θ) = Σ_ℓ a_ℓm λ_ℓm(θ)` (and the spin-2 equivalents) are computed with the
//! three-term recurrence
//! `λ_ℓm = a_ℓm (cosθ λ_{ℓ−1,m} − λ_{ℓ−2,m} / a_{ℓ−1,m})`,
//! `a_ℓm = √((4ℓ²−1)/(ℓ²−m²))`, started from
//! `λ_mm = (−1)^m √((2m+1)/4π · (2m−1)!!/(2m)!!) sin^m θ`; then each ring is a
//! real inverse FFT over φ of length `npix_ring` (with the `m ≥ npix_ring/2`
//! terms aliased onto the ring's frequencies and the phase shift `e^{imφ₀}`).
//!
//! * North/south symmetry: `λ_ℓm(π−θ) = (−1)^{ℓ+m} λ_ℓm(θ)`, `F¹` has the same
//!   parity and `F²` the opposite, so each ring pair shares one recurrence.
//! * Underflow: `sin^m θ` underflows near the poles for large `m`. The
//!   recurrence runs on scaled values `v · 2^{400 s}` (integer `s ≤ 0`); terms
//!   with `s < 0` are below `2^−400 ≈ 4·10⁻¹²¹` and are dropped. Once a ring's
//!   `λ_ℓm` stays below that threshold for all `ℓ ≤ lmax` at some `m`, it does
//!   so for all larger `m` (deeper in the evanescent region) and the `m` loop
//!   stops for that ring.
//! * Rings are processed in blocks of [`LANES`] adjacent ring pairs: for each
//!   `m`, pass 1 runs the recurrences of all lanes interleaved and stores
//!   `λ_ℓm` per lane; pass 2 accumulates the T/Q/U sums over ℓ, vectorised across
//!   groups of 4 lanes (one 256-bit vector) and split by the parity of `ℓ − m`.
//!   The ℓ,m-dependent recurrence and spin-2 factors are tabulated once.
//!   Blocks run in parallel with rayon. On x86-64 CPUs with AVX2 and FMA
//!   (detected at run time) the block kernel is compiled for those features
//!   and uses fused multiply–adds; elsewhere the same code runs without them.
//!
//! Output maps are in RING order, `f64`; use [`crate::math::healpix::ring_to_nest`]
//! to reorder.

use std::collections::HashMap;
use std::sync::Arc;

use rayon::prelude::*;
/// Complex coefficient type of [`Alm`] (re-exported from `num-complex`).
pub use realfft::num_complex::Complex64;
use realfft::{ComplexToReal, RealFftPlanner};

use crate::math::healpix::{Healpix, HealpixError};

/// Number of ring pairs processed together in one block (the Legendre
/// recurrences of the lanes are interleaved for instruction-level parallelism).
pub const LANES: usize = 8;

/// Exponent step of the scaled Legendre recurrence.
const SCALE_BITS: i32 = 400;

/// Errors of the spherical-harmonic synthesis.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShtError {
    /// Invalid resolution.
    #[error(transparent)]
    Healpix(#[from] HealpixError),
    /// Inconsistent a_ℓm arrays.
    #[error("invalid a_lm: {0}")]
    BadAlm(String),
}

/// Spherical-harmonic coefficients `a_ℓm`, `0 ≤ m ≤ ℓ ≤ lmax`, in healpy's layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Alm {
    lmax: usize,
    data: Vec<Complex64>,
}

impl Alm {
    /// Number of coefficients for `lmax` (= `mmax`): `(lmax+1)(lmax+2)/2`.
    pub fn size(lmax: usize) -> usize {
        (lmax + 1) * (lmax + 2) / 2
    }

    /// healpy's index of `(ℓ, m)` for `lmax` (`Alm.getidx`): `m(2 lmax + 1 − m)/2 + ℓ`.
    pub fn index(lmax: usize, l: usize, m: usize) -> usize {
        debug_assert!(
            m <= l && l <= lmax,
            "(l={l}, m={m}) invalid for lmax {lmax}"
        );
        m * (2 * lmax + 1 - m) / 2 + l
    }

    /// All-zero coefficients up to `lmax`.
    pub fn zeros(lmax: usize) -> Self {
        Self {
            lmax,
            data: vec![Complex64::new(0.0, 0.0); Self::size(lmax)],
        }
    }

    /// Wraps coefficients in healpy's layout; the length must be `size(lmax)`.
    pub fn from_vec(lmax: usize, data: Vec<Complex64>) -> Result<Self, ShtError> {
        if data.len() != Self::size(lmax) {
            return Err(ShtError::BadAlm(format!(
                "{} coefficients given, lmax {lmax} needs {}",
                data.len(),
                Self::size(lmax)
            )));
        }
        Ok(Self { lmax, data })
    }

    /// Maximum multipole.
    pub fn lmax(&self) -> usize {
        self.lmax
    }

    /// The coefficient `a_ℓm`.
    pub fn get(&self, l: usize, m: usize) -> Complex64 {
        self.data[Self::index(self.lmax, l, m)]
    }

    /// Sets `a_ℓm`.
    pub fn set(&mut self, l: usize, m: usize, v: Complex64) {
        let i = Self::index(self.lmax, l, m);
        self.data[i] = v;
    }

    /// The coefficients in healpy's layout.
    pub fn as_slice(&self) -> &[Complex64] {
        &self.data
    }

    /// Mutable coefficients in healpy's layout.
    pub fn as_mut_slice(&mut self) -> &mut [Complex64] {
        &mut self.data
    }

    /// The coefficients `a_ℓm`, `ℓ = m..=lmax`, of one `m` (contiguous).
    fn m_slice(&self, m: usize) -> &[Complex64] {
        let start = Self::index(self.lmax, m, m);
        &self.data[start..start + self.lmax + 1 - m]
    }
}

/// Tabulated ℓ,m-dependent factors shared by all rings.
struct Tables {
    /// Highest ℓ of the recurrence.
    lmax: usize,
    /// Offset of `(ℓ = m, m)` for each m in the flattened per-(ℓ,m) tables.
    offset: Vec<usize>,
    /// Recurrence factor `a_ℓm = √((4ℓ²−1)/(ℓ²−m²))` (unused at ℓ = m).
    rec_a: Vec<f64>,
    /// `a_ℓm / a_{ℓ−1,m}` (0 at ℓ ≤ m+1), so that
    /// `λ_ℓ = (a_ℓ cosθ) λ_{ℓ−1} − (a_ℓ/a_{ℓ−1}) λ_{ℓ−2}`.
    rec_ab: Vec<f64>,
    /// Spin-2 factor `−N_ℓ (ℓ − m²)` (empty without polarisation).
    pol_a: Vec<f64>,
    /// Spin-2 factor `N_ℓ f_ℓm`, `f_ℓm = √((2ℓ+1)/(2ℓ−1)(ℓ²−m²))`.
    pol_l: Vec<f64>,
    /// Spin-2 factor `−N_ℓ ℓ(ℓ−1)/2` (per ℓ).
    pol_h: Vec<f64>,
    /// Spin-2 factor `N_ℓ (ℓ−1)` (per ℓ).
    pol_d: Vec<f64>,
    /// `√((2m+1)/(2m))` for the λ_mm recursion (index m ≥ 1).
    mm_fact: Vec<f64>,
}

impl Tables {
    fn new(lmax: usize, mmax: usize, with_pol: bool) -> Self {
        let mut offset = Vec::with_capacity(mmax + 1);
        let mut n = 0;
        for m in 0..=mmax {
            offset.push(n);
            n += lmax + 1 - m;
        }
        // N_ℓ = 2 √((ℓ−2)!/(ℓ+2)!), 0 for ℓ < 2.
        let norm: Vec<f64> = (0..=lmax)
            .map(|l| {
                if l < 2 {
                    0.0
                } else {
                    let lf = l as f64;
                    2.0 / ((lf - 1.0) * lf * (lf + 1.0) * (lf + 2.0)).sqrt()
                }
            })
            .collect();
        let mut rec_a = vec![0.0; n];
        let mut rec_ab = vec![0.0; n];
        let (mut pol_a, mut pol_l) = if with_pol {
            (vec![0.0; n], vec![0.0; n])
        } else {
            (Vec::new(), Vec::new())
        };
        for m in 0..=mmax {
            let o = offset[m];
            let mf = m as f64;
            for l in m + 1..=lmax {
                let lf = l as f64;
                rec_a[o + l - m] = ((4.0 * lf * lf - 1.0) / ((lf - mf) * (lf + mf))).sqrt();
            }
            for l in m + 2..=lmax {
                rec_ab[o + l - m] = rec_a[o + l - m] / rec_a[o + l - 1 - m];
            }
            if with_pol {
                for l in m.max(2)..=lmax {
                    let lf = l as f64;
                    let f = ((2.0 * lf + 1.0) / (2.0 * lf - 1.0) * (lf - mf) * (lf + mf)).sqrt();
                    pol_a[o + l - m] = -norm[l] * (lf - mf * mf);
                    pol_l[o + l - m] = norm[l] * f;
                }
            }
        }
        let pol_h = (0..=lmax)
            .map(|l| -norm[l] * 0.5 * (l as f64) * (l as f64 - 1.0))
            .collect();
        let pol_d = (0..=lmax).map(|l| norm[l] * (l as f64 - 1.0)).collect();
        let mm_fact = (0..=mmax)
            .map(|m| {
                if m == 0 {
                    0.0
                } else {
                    ((2 * m + 1) as f64 / (2 * m) as f64).sqrt()
                }
            })
            .collect();
        Self {
            lmax,
            offset,
            rec_a,
            rec_ab,
            pol_a,
            pol_l,
            pol_h,
            pol_d,
            mm_fact,
        }
    }
}

/// Maps produced by [`alm2map`], RING order.
#[derive(Debug, Clone, Default)]
pub struct SynthesisMaps {
    /// Temperature / spin-0 map, if requested.
    pub t: Option<Vec<f64>>,
    /// Stokes Q, if polarisation was requested.
    pub q: Option<Vec<f64>>,
    /// Stokes U, if polarisation was requested.
    pub u: Option<Vec<f64>>,
}

/// Synthesises a spin-0 map (RING order) from `alm`, like `healpy.alm2map(alm, nside)`.
pub fn alm2map_spin0(nside: u64, alm: &Alm) -> Result<Vec<f64>, ShtError> {
    Ok(alm2map(nside, Some(alm), None)?
        .t
        .expect("temperature requested"))
}

/// Synthesises I, Q, U maps (RING order) like
/// `healpy.alm2map([t, e, b], nside, pol=True)`.
pub fn alm2map_iqu(nside: u64, t: &Alm, e: &Alm, b: &Alm) -> Result<[Vec<f64>; 3], ShtError> {
    let m = alm2map(nside, Some(t), Some((e, b)))?;
    Ok([
        m.t.expect("requested"),
        m.q.expect("requested"),
        m.u.expect("requested"),
    ])
}

/// General synthesis: an optional spin-0 field `t` and optional spin-2 fields
/// `(E, B)` (which must share `lmax`; `t` may have a different `lmax`).
/// Returns RING-ordered maps.
pub fn alm2map(
    nside: u64,
    t: Option<&Alm>,
    pol: Option<(&Alm, &Alm)>,
) -> Result<SynthesisMaps, ShtError> {
    alm2map_impl(nside, t, pol, detect_avx2_fma(), (0, 1))
}

/// [`alm2map_iqu`] for part `index` of `count` of the rings (ring-pair
/// blocks dealt out cyclically, which balances the cheap polar rings
/// against the equatorial ones); the other rings are left zero. Summing the
/// `count` parts gives [`alm2map_iqu`]'s maps bit for bit (each pixel is
/// written by one part), which is how a distributed run shares the work.
pub fn alm2map_iqu_part(
    nside: u64,
    t: &Alm,
    e: &Alm,
    b: &Alm,
    index: usize,
    count: usize,
) -> Result<[Vec<f64>; 3], ShtError> {
    if count == 0 || index >= count {
        return Err(ShtError::BadAlm(format!(
            "ring part {index} of {count} does not exist"
        )));
    }
    let m = alm2map_impl(
        nside,
        Some(t),
        Some((e, b)),
        detect_avx2_fma(),
        (index, count),
    )?;
    Ok([
        m.t.expect("requested"),
        m.q.expect("requested"),
        m.u.expect("requested"),
    ])
}

/// [`alm2map`] with an explicit kernel choice (`avx2_fma` must only be true
/// when the CPU supports AVX2 and FMA).
fn alm2map_impl(
    nside: u64,
    t: Option<&Alm>,
    pol: Option<(&Alm, &Alm)>,
    avx2_fma: bool,
    part: (usize, usize),
) -> Result<SynthesisMaps, ShtError> {
    let hp = Healpix::new(nside)?;
    if let Some((e, b)) = pol {
        if e.lmax() != b.lmax() {
            return Err(ShtError::BadAlm(format!(
                "E has lmax {} but B has lmax {}",
                e.lmax(),
                b.lmax()
            )));
        }
    }
    if t.is_none() && pol.is_none() {
        return Err(ShtError::BadAlm("nothing to synthesise".into()));
    }
    let lmax_t = t.map(Alm::lmax);
    let lmax_p = pol.map(|(e, _)| e.lmax());
    let lmax = lmax_t.unwrap_or(0).max(lmax_p.unwrap_or(0));
    let tables = Tables::new(lmax, lmax, pol.is_some());

    let npix = hp.npix() as usize;
    let mut tmap = t.map(|_| vec![0.0; npix]);
    let mut qmap = pol.map(|_| vec![0.0; npix]);
    let mut umap = pol.map(|_| vec![0.0; npix]);

    // FFT plans for every ring length.
    let mut planner = RealFftPlanner::<f64>::new();
    let mut plans: HashMap<usize, Arc<dyn ComplexToReal<f64>>> = HashMap::new();
    let rings = hp.rings();
    for r in &rings {
        let n = r.npix as usize;
        plans
            .entry(n)
            .or_insert_with(|| planner.plan_fft_inverse(n));
    }

    // Split the maps into per-ring slices, then group ring pairs into blocks.
    let nside_u = nside as usize;
    let npairs = 2 * nside_u; // north rings 1..=2 nside (ring 2 nside is the equator)
    let mut t_rings = split_rings(tmap.as_mut(), &rings);
    let mut q_rings = split_rings(qmap.as_mut(), &rings);
    let mut u_rings = split_rings(umap.as_mut(), &rings);

    let mut blocks: Vec<Block<'_>> = Vec::new();
    let nrings = rings.len();
    let mut pair = 0;
    while pair < npairs {
        let nlane = LANES.min(npairs - pair);
        let mut lanes = Vec::with_capacity(nlane);
        for k in 0..nlane {
            let north = pair + k; // ring index (0-based) of the northern ring
            let south = nrings - 1 - north;
            lanes.push(Lane {
                north: rings[north],
                south: (south != north).then_some(rings[south]),
                out_n: [None, None, None],
                out_s: [None, None, None],
            });
        }
        blocks.push(Block { lanes });
        pair += nlane;
    }
    // Hand the ring slices to their lanes.
    for block in &mut blocks {
        for lane in &mut block.lanes {
            let n = (lane.north.ring - 1) as usize;
            lane.out_n = [t_rings[n].take(), q_rings[n].take(), u_rings[n].take()];
            if let Some(s) = lane.south {
                let s = (s.ring - 1) as usize;
                lane.out_s = [t_rings[s].take(), q_rings[s].take(), u_rings[s].take()];
            }
        }
    }

    let ctx = SynthesisInputs {
        tables: &tables,
        t,
        pol,
        plans: &plans,
        avx2_fma,
    };
    blocks
        .par_iter_mut()
        .enumerate()
        .filter(|(i, _)| i % part.1 == part.0)
        .for_each(|(_, block)| synthesize_block(&ctx, block));

    Ok(SynthesisMaps {
        t: tmap,
        q: qmap,
        u: umap,
    })
}

/// Splits a RING-ordered map into one mutable slice per ring (all `None` if absent).
fn split_rings<'a>(
    map: Option<&'a mut Vec<f64>>,
    rings: &[crate::math::healpix::RingInfo],
) -> Vec<Option<&'a mut [f64]>> {
    match map {
        None => (0..rings.len()).map(|_| None).collect(),
        Some(m) => {
            let mut out = Vec::with_capacity(rings.len());
            let mut rest: &mut [f64] = m.as_mut_slice();
            for r in rings {
                let (a, b) = rest.split_at_mut(r.npix as usize);
                out.push(Some(a));
                rest = b;
            }
            out
        }
    }
}

/// Run-time check for the AVX2 + FMA kernel.
fn detect_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Shared read-only inputs of the block synthesis.
struct SynthesisInputs<'a> {
    tables: &'a Tables,
    t: Option<&'a Alm>,
    pol: Option<(&'a Alm, &'a Alm)>,
    plans: &'a HashMap<usize, Arc<dyn ComplexToReal<f64>>>,
    /// Whether the CPU supports AVX2 and FMA (x86_64 run-time detection).
    avx2_fma: bool,
}

/// One northern ring, its southern mirror (absent for the equator) and their
/// output slices (T, Q, U).
struct Lane<'a> {
    north: crate::math::healpix::RingInfo,
    south: Option<crate::math::healpix::RingInfo>,
    out_n: [Option<&'a mut [f64]>; 3],
    out_s: [Option<&'a mut [f64]>; 3],
}

/// Up to [`LANES`] ring pairs processed together.
struct Block<'a> {
    lanes: Vec<Lane<'a>>,
}

/// Lanes of a sub-block handled together in the accumulation pass
/// (one 256-bit vector of f64).
const SUB: usize = 4;

type V = [f64; SUB];

/// `a·b + c`, fused when the kernel is compiled for FMA hardware.
#[inline(always)]
fn madd<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Complex accumulator over [`SUB`] lanes: (re, im) arrays.
#[derive(Clone, Copy, Default)]
struct CAcc {
    re: V,
    im: V,
}

impl CAcc {
    /// `self += a · x` lane-wise (complex scalar times real lanes).
    #[inline(always)]
    fn add<const FMA: bool>(&mut self, a: Complex64, x: &V) {
        for ((re, im), &xk) in self.re.iter_mut().zip(self.im.iter_mut()).zip(x) {
            *re = madd::<FMA>(a.re, xk, *re);
            *im = madd::<FMA>(a.im, xk, *im);
        }
    }
}

/// Lane values `[s, s+SUB)` of a λ row.
#[inline(always)]
fn sub_lanes(row: &[f64; LANES], s: usize) -> V {
    std::array::from_fn(|k| row[s + k])
}

/// Synthesises one block of ring pairs, choosing the fastest kernel the CPU supports.
fn synthesize_block(ctx: &SynthesisInputs<'_>, block: &mut Block<'_>) {
    #[cfg(target_arch = "x86_64")]
    if ctx.avx2_fma {
        // SAFETY: `ctx.avx2_fma` is only true when `is_x86_feature_detected!`
        // reported both AVX2 and FMA support on this CPU (see `alm2map`), which
        // is the sole requirement of the `target_feature` function.
        unsafe { synthesize_block_avx2_fma(ctx, block) };
        return;
    }
    synthesize_block_impl::<false>(ctx, block);
}

/// The block kernel compiled with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn synthesize_block_avx2_fma(ctx: &SynthesisInputs<'_>, block: &mut Block<'_>) {
    synthesize_block_impl::<true>(ctx, block);
}

#[inline(always)]
fn synthesize_block_impl<const FMA: bool>(ctx: &SynthesisInputs<'_>, block: &mut Block<'_>) {
    let tb = ctx.tables;
    let lmax = tb.lmax;
    let nl = block.lanes.len();
    // Lane geometry (pad unused lanes with the last ring; their output is dropped).
    let mut cth = [0.0; LANES];
    let mut sth = [0.0; LANES];
    for k in 0..LANES {
        let r = block.lanes[k.min(nl - 1)].north;
        cth[k] = r.z;
        sth[k] = r.sin_theta;
    }
    let is2: [f64; LANES] = std::array::from_fn(|k| 1.0 / (sth[k] * sth[k]));
    let cis2: [f64; LANES] = std::array::from_fn(|k| cth[k] * is2[k]);
    let big = 2f64.powi(SCALE_BITS);
    let small = 2f64.powi(-SCALE_BITS);

    let lmax_t = ctx.t.map(Alm::lmax);
    let lmax_p = ctx.pol.map(|(e, _)| e.lmax());
    // Fourier coefficients per lane and m: [T, Q, U] × [north, south].
    let mmax = lmax;
    let zero = Complex64::new(0.0, 0.0);
    let mut coef: Vec<[[Vec<Complex64>; 2]; 3]> = (0..nl)
        .map(|_| std::array::from_fn(|_| [vec![zero; mmax + 1], vec![zero; mmax + 1]]))
        .collect();

    // λ_mm as scaled (mantissa, scale) per lane.
    let mut mm_v = [(0.25 / std::f64::consts::PI).sqrt(); LANES];
    let mut mm_s = [0i32; LANES];
    let mut dead = [false; LANES];
    for d in dead.iter_mut().skip(nl) {
        *d = true;
    }
    let mut lam: Vec<[f64; LANES]> = vec![[0.0; LANES]; lmax + 2];
    let mut m_end = mmax + 1;

    for m in 0..=mmax {
        if m > 0 {
            for k in 0..LANES {
                mm_v[k] *= -sth[k] * tb.mm_fact[m];
                if mm_v[k].abs() < small {
                    mm_v[k] *= big;
                    mm_s[k] -= 1;
                }
            }
        }
        if dead.iter().all(|&d| d) {
            m_end = m;
            break;
        }
        let need_t = lmax_t.is_some_and(|l| m <= l);
        let need_p = lmax_p.is_some_and(|l| m <= l);
        let lrec = match (need_t, need_p) {
            (true, true) => lmax_t.unwrap_or(0).max(lmax_p.unwrap_or(0)),
            (true, false) => lmax_t.unwrap_or(0),
            (false, true) => lmax_p.unwrap_or(0),
            (false, false) => continue,
        };
        let o = tb.offset[m];
        let jmax = lrec - m;
        let rec_a = &tb.rec_a[o..=o + jmax];
        let rec_ab = &tb.rec_ab[o..=o + jmax];

        // Pass 1: λ_ℓm for ℓ = m..=lrec (row j = ℓ − m), all lanes interleaved;
        // zero where below 2^-400 (scale s < 0). Dead lanes carry zeros.
        let mut prev = [0.0; LANES];
        let mut cur = [0.0; LANES];
        let mut s = [0i32; LANES];
        for k in 0..LANES {
            if !dead[k] {
                cur[k] = mm_v[k];
                s[k] = mm_s[k];
            }
        }
        lam[0] = std::array::from_fn(|k| if s[k] == 0 { cur[k] } else { 0.0 });
        let mut j = 1;
        // Slow steps while some lane is still below the threshold.
        while j <= jmax && s.iter().any(|&x| x < 0) {
            let (a, ab) = (rec_a[j], rec_ab[j]);
            for k in 0..LANES {
                let next = madd::<FMA>(a * cth[k], cur[k], -(ab * prev[k]));
                prev[k] = cur[k];
                cur[k] = next;
                if s[k] < 0 && cur[k].abs() > 1.0 {
                    cur[k] *= small;
                    prev[k] *= small;
                    s[k] += 1;
                }
            }
            lam[j] = std::array::from_fn(|k| if s[k] == 0 { cur[k] } else { 0.0 });
            j += 1;
        }
        // Fast steps: every lane live (or dead, i.e. identically zero).
        while j <= jmax {
            let (a, ab) = (rec_a[j], rec_ab[j]);
            let mut next = [0.0; LANES];
            for k in 0..LANES {
                next[k] = madd::<FMA>(a * cth[k], cur[k], -(ab * prev[k]));
            }
            prev = cur;
            cur = next;
            lam[j] = cur;
            j += 1;
        }
        let mut live = [false; LANES];
        for k in 0..LANES {
            live[k] = !dead[k] && s[k] == 0;
            if !dead[k] && s[k] < 0 {
                // Below 2^-400 for all ℓ ≤ lrec: also for every larger m.
                dead[k] = true;
            }
        }
        if !live.iter().any(|&a| a) {
            continue;
        }

        for sub in (0..nl).step_by(SUB) {
            if !live[sub..(sub + SUB).min(LANES)].iter().any(|&a| a) {
                continue;
            }
            // Pass 2a: temperature, accumulated by parity of j = ℓ − m.
            if let (true, Some(t)) = (need_t, ctx.t) {
                let alm = t.m_slice(m);
                let mut acc = [CAcc::default(); 2];
                for (p, a) in acc.iter_mut().enumerate() {
                    for j in (p..=t.lmax() - m).step_by(2) {
                        a.add::<FMA>(alm[j], &sub_lanes(&lam[j], sub));
                    }
                }
                store(&mut coef, sub, nl, 0, m, &acc);
            }

            // Pass 2b: polarisation. F¹ has the parity of λ_j, F² the opposite.
            if let (true, Some((e, b))) = (need_p, ctx.pol) {
                let ae = e.m_slice(m);
                let ab = b.m_slice(m);
                let pa = &tb.pol_a[o..o + e.lmax() + 1 - m];
                let pl = &tb.pol_l[o..o + e.lmax() + 1 - m];
                let mf = m as f64;
                let is2s: V = sub_lanes(&is2, sub);
                let cis2s: V = sub_lanes(&cis2, sub);
                let mis2: V = std::array::from_fn(|k| mf * is2s[k]);
                let mcis2: V = std::array::from_fn(|k| mf * cis2s[k]);
                let jstart = 2usize.saturating_sub(m);
                // e1/b1[p]: E, B × F¹ of parity p; e2/b2[p]: E, B × F² of parity p.
                let mut e1 = [CAcc::default(); 2];
                let mut b1 = [CAcc::default(); 2];
                let mut e2 = [CAcc::default(); 2];
                let mut b2 = [CAcc::default(); 2];
                for p in 0..2 {
                    let (mut ae1, mut ab1, mut ae2, mut ab2) = (
                        CAcc::default(),
                        CAcc::default(),
                        CAcc::default(),
                        CAcc::default(),
                    );
                    let first = if jstart % 2 == p { jstart } else { jstart + 1 };
                    for j in (first..=e.lmax() - m).step_by(2) {
                        let l = m + j;
                        let lam_l = sub_lanes(&lam[j], sub);
                        let lam_p = if j > 0 {
                            sub_lanes(&lam[j - 1], sub)
                        } else {
                            [0.0; SUB]
                        };
                        let (ca, cl, ch, cd) = (pa[j], pl[j], tb.pol_h[l], tb.pol_d[l]);
                        let mut f1 = [0.0; SUB];
                        let mut f2 = [0.0; SUB];
                        for k in 0..SUB {
                            let t1 = madd::<FMA>(is2s[k], ca, ch);
                            f1[k] = madd::<FMA>(t1, lam_l[k], cis2s[k] * cl * lam_p[k]);
                            f2[k] =
                                madd::<FMA>(mcis2[k] * cd, lam_l[k], -(mis2[k] * cl * lam_p[k]));
                        }
                        ae1.add::<FMA>(ae[j], &f1);
                        ab1.add::<FMA>(ab[j], &f1);
                        ae2.add::<FMA>(ae[j], &f2);
                        ab2.add::<FMA>(ab[j], &f2);
                    }
                    e1[p] = ae1;
                    b1[p] = ab1;
                    e2[p ^ 1] = ae2;
                    b2[p ^ 1] = ab2;
                }
                // Q_m = −(E·F¹ − i B·F²), U_m = −(B·F¹ + i E·F²)
                let mut q = [CAcc::default(); 2];
                let mut u = [CAcc::default(); 2];
                for p in 0..2 {
                    for k in 0..SUB {
                        q[p].re[k] = -(e1[p].re[k] + b2[p].im[k]);
                        q[p].im[k] = -(e1[p].im[k] - b2[p].re[k]);
                        u[p].re[k] = -(b1[p].re[k] - e2[p].im[k]);
                        u[p].im[k] = -(b1[p].im[k] + e2[p].re[k]);
                    }
                }
                store(&mut coef, sub, nl, 1, m, &q);
                store(&mut coef, sub, nl, 2, m, &u);
            }
        }
    }

    // FFT each ring.
    let mut fbuf: Vec<Complex64> = Vec::new();
    let mut phase: Vec<Complex64> = Vec::new();
    let m_used = m_end.min(mmax + 1);
    for (k, lane) in block.lanes.iter_mut().enumerate() {
        for (hemi, ring, outs) in [
            (0usize, Some(lane.north), &mut lane.out_n),
            (1usize, lane.south, &mut lane.out_s),
        ] {
            let Some(ring) = ring else { continue };
            // e^{i m φ₀}, shared by the T, Q, U rings.
            phase.clear();
            phase.extend((0..m_used).map(|m| {
                let (s, c) = (m as f64 * ring.phi0).sin_cos();
                Complex64::new(c, s)
            }));
            for (comp, out) in outs.iter_mut().enumerate() {
                let Some(out) = out.as_deref_mut() else {
                    continue;
                };
                ring_fft(
                    &coef[k][comp][hemi][..m_used],
                    &phase,
                    ctx.plans,
                    &mut fbuf,
                    out,
                );
            }
        }
    }
}

/// Stores, for lanes `sub..sub+SUB` (those below `nl`), the north (even + odd)
/// and south (even − odd) coefficients of component `comp` at `m` from the
/// parity accumulators `acc[0]` (even ℓ−m) and `acc[1]` (odd).
fn store(
    coef: &mut [[[Vec<Complex64>; 2]; 3]],
    sub: usize,
    nl: usize,
    comp: usize,
    m: usize,
    acc: &[CAcc; 2],
) {
    for k in 0..SUB.min(nl - sub) {
        let (e, o) = (&acc[0], &acc[1]);
        let c = &mut coef[sub + k][comp];
        c[0][m] = Complex64::new(e.re[k] + o.re[k], e.im[k] + o.im[k]);
        c[1][m] = Complex64::new(e.re[k] - o.re[k], e.im[k] - o.im[k]);
    }
}

/// Real inverse FFT of one ring: `out[j] = Σ_{m=−M}^{M} f_m e^{im(φ₀ + 2πj/n)}`
/// with `f_{−m} = conj(f_m)`, aliasing `|m| ≥ n/2` onto the ring's frequencies.
/// `phase[m] = e^{imφ₀}`.
fn ring_fft(
    f: &[Complex64],
    phase: &[Complex64],
    plans: &HashMap<usize, Arc<dyn ComplexToReal<f64>>>,
    buf: &mut Vec<Complex64>,
    out: &mut [f64],
) {
    let n = out.len();
    let half = n / 2;
    buf.clear();
    buf.resize(half + 1, Complex64::new(0.0, 0.0));
    for (m, &fm) in f.iter().enumerate() {
        if fm.re == 0.0 && fm.im == 0.0 {
            continue;
        }
        let g = fm * phase[m];
        if m == 0 {
            buf[0].re += g.re;
            continue;
        }
        let k = m % n;
        if k <= half {
            buf[k] += g;
        }
        let kn = (n - k) % n;
        if kn <= half {
            buf[kn] += g.conj();
        }
    }
    buf[0].im = 0.0;
    buf[half].im = 0.0;
    let plan = plans.get(&n).expect("plan for every ring length");
    plan.process(buf, out)
        .expect("buffer lengths match the plan and DC/Nyquist are real");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alm_layout_matches_healpy() {
        // healpy.Alm.getidx(lmax=4, l, m)
        assert_eq!(Alm::index(4, 0, 0), 0);
        assert_eq!(Alm::index(4, 4, 0), 4);
        assert_eq!(Alm::index(4, 1, 1), 5);
        assert_eq!(Alm::index(4, 4, 4), 14);
        assert_eq!(Alm::size(4), 15);
        assert!(Alm::from_vec(4, vec![Complex64::new(0.0, 0.0); 14]).is_err());
    }

    #[test]
    fn portable_kernel_matches_simd_kernel() {
        let lmax = 40;
        let mut alm = [Alm::zeros(lmax), Alm::zeros(lmax), Alm::zeros(lmax)];
        for (f, a) in alm.iter_mut().enumerate() {
            for m in 0..=lmax {
                for l in m.max(2 * (f > 0) as usize)..=lmax {
                    let x = (l * 7 + m * 3 + f) as f64;
                    let im = if m == 0 { 0.0 } else { x.cos() };
                    a.set(l, m, Complex64::new(x.sin(), im));
                }
            }
        }
        let pol = Some((&alm[1], &alm[2]));
        let simd = alm2map_impl(16, Some(&alm[0]), pol, detect_avx2_fma(), (0, 1)).unwrap();
        let portable = alm2map_impl(16, Some(&alm[0]), pol, false, (0, 1)).unwrap();
        for (a, b) in [
            (simd.t.unwrap(), portable.t.unwrap()),
            (simd.q.unwrap(), portable.q.unwrap()),
            (simd.u.unwrap(), portable.u.unwrap()),
        ] {
            let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-13 * scale, "{x} vs {y}");
            }
        }
    }

    #[test]
    fn rejects_bad_input() {
        let a = Alm::zeros(4);
        let b = Alm::zeros(5);
        assert!(alm2map(8, None, Some((&a, &b))).is_err());
        assert!(alm2map(8, None, None).is_err());
        assert!(matches!(
            alm2map(6, Some(&a), None),
            Err(ShtError::Healpix(_))
        ));
    }

    #[test]
    fn monopole_and_dipole() {
        // a_00 = √(4π) → T ≡ 1; a_10 = √(4π/3) → T = cos θ.
        let nside = 4;
        let hp = Healpix::new(nside).unwrap();
        let mut alm = Alm::zeros(3);
        alm.set(
            0,
            0,
            Complex64::new((4.0 * std::f64::consts::PI).sqrt(), 0.0),
        );
        let t = alm2map_spin0(nside, &alm).unwrap();
        assert!(t.iter().all(|&v| (v - 1.0).abs() < 1e-14));
        let mut alm = Alm::zeros(3);
        alm.set(
            1,
            0,
            Complex64::new((4.0 * std::f64::consts::PI / 3.0).sqrt(), 0.0),
        );
        let t = alm2map_spin0(nside, &alm).unwrap();
        for (p, &v) in t.iter().enumerate() {
            let (theta, _) = hp.pix2ang_ring(p as u64);
            assert!((v - theta.cos()).abs() < 1e-14);
        }
        // a_11 = −√(2π/3) → T = sinθ cosφ (Condon–Shortley phase).
        let mut alm = Alm::zeros(3);
        alm.set(
            1,
            1,
            Complex64::new(-(2.0 * std::f64::consts::PI / 3.0).sqrt(), 0.0),
        );
        let t = alm2map_spin0(nside, &alm).unwrap();
        for (p, &v) in t.iter().enumerate() {
            let (theta, phi) = hp.pix2ang_ring(p as u64);
            assert!((v - theta.sin() * phi.cos()).abs() < 1e-14, "{p}");
        }
    }
}
