//! HEALPix pixelisation: resolution checks, NEST/RING indexing and conversion,
//! angle/vector ↔ pixel, and the ring geometry used by spherical-harmonic
//! transforms.
//!
//! # Conventions
//!
//! The sphere is divided into 12 base faces, each split into `nside × nside`
//! pixels of equal area, `npix = 12 nside²` in total (Górski et al. 2005,
//! ApJ 622, 759). `nside` must be a power of two between 1 and 2²⁹ (the limit of
//! 64-bit NEST indices), as in healpy.
//!
//! * **NEST** ordering numbers the pixels face by face; inside a face the index
//!   interleaves the bits of the in-face coordinates `(ix, iy)`
//!   (`ipix = face·nside² + Σ_b ix_b 2^{2b} + iy_b 2^{2b+1}`).
//! * **RING** ordering numbers pixels along the `4 nside − 1` iso-latitude
//!   rings from the north pole (ring 1) to the south pole, each ring in order
//!   of increasing longitude φ.
//!
//! Angles follow healpy: `theta` is the colatitude in radians, `0` at the north
//! pole and `π` at the south pole; `phi` is the longitude in radians (any real
//! value, reduced modulo 2π). Unit vectors are `(sinθ cosφ, sinθ sinφ, cosθ)`;
//! vectors passed to [`Healpix::vec2pix_nest`] need not be normalised.
//!
//! The algorithms are those of the HEALPix C++ library (`healpix_base.cc`),
//! including its switch to `sinθ`-based formulas within 0.01 rad of the poles,
//! so that the results agree with healpy bit-for-bit in the pixel index and to
//! rounding in the angles.
//!
//! # Ring geometry
//!
//! Rings are numbered `1..=4 nside − 1`. Ring `i` in the north polar cap
//! (`i < nside`) has `4i` pixels, equatorial rings have `4 nside`; the south
//! is the mirror image. [`Healpix::ring_info`] returns the ring's `z = cosθ`,
//! `θ`, first RING index, pixel count and the longitude `φ₀` of its first pixel
//! (`π / npix_ring` for "shifted" rings, `0` otherwise); pixel `j` of the ring
//! lies at `φ₀ + 2πj / npix_ring`.

use std::f64::consts::{FRAC_PI_2, PI};

/// Largest supported `nside` (2²⁹), as in HEALPix C++ and healpy: the
/// limit every kernel's argument check applies
/// ([`toast_accel::check::MAX_NSIDE`]), so one number bounds it everywhere.
pub const NSIDE_MAX: u64 = toast_accel::check::MAX_NSIDE as u64;

/// A HEALPix resolution: a power of two in `1..=2^29`, checked once, when
/// the value is made ([`Nside::new`], or deserialised from a configuration:
/// a TOML `nside = 1000` is refused where it is read, naming the value).
/// Everything that holds an `Nside` can rely on it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "i64", into = "i64")]
pub struct Nside(u32);

impl Nside {
    /// `nside`, if it is a power of two in `1..=2^29`.
    pub fn new(nside: u64) -> Result<Self, HealpixError> {
        if nside == 0 || nside > NSIDE_MAX || !nside.is_power_of_two() {
            Err(HealpixError::BadNside(nside.try_into().unwrap_or(i64::MAX)))
        } else {
            Ok(Nside(nside as u32))
        }
    }

    /// The resolution parameter.
    pub const fn get(self) -> u64 {
        self.0 as u64
    }

    /// The number of pixels, `12 nside²`.
    pub const fn npix(self) -> u64 {
        12 * self.get() * self.get()
    }

    /// `log2(nside)`.
    pub const fn order(self) -> u32 {
        self.0.trailing_zeros()
    }
}

impl TryFrom<i64> for Nside {
    type Error = HealpixError;
    fn try_from(n: i64) -> Result<Self, HealpixError> {
        u64::try_from(n)
            .map_err(|_| HealpixError::BadNside(n))
            .and_then(Nside::new)
    }
}

impl From<Nside> for i64 {
    fn from(n: Nside) -> i64 {
        n.get() as i64
    }
}

impl From<Nside> for u64 {
    fn from(n: Nside) -> u64 {
        n.get()
    }
}

impl std::fmt::Display for Nside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Base-face row index (`jrll`) of the HEALPix C++ library.
const JRLL: [i64; 12] = [2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4];
/// Base-face column index (`jpll`) of the HEALPix C++ library.
const JPLL: [i64; 12] = [1, 3, 5, 7, 0, 2, 4, 6, 1, 3, 5, 7];

/// Errors of the HEALPix module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealpixError {
    /// `nside` is not a power of two in `1..=2^29`.
    #[error("invalid HEALPix nside {0}: must be a power of two between 1 and 2^29")]
    BadNside(i64),
    /// A pixel count is not `12 nside²` for a valid `nside`.
    #[error("invalid HEALPix pixel count {0}: not 12*nside^2 for a power-of-two nside")]
    BadNpix(u64),
    /// A pixel index is outside `0..npix`.
    #[error("HEALPix pixel index {pix} out of range for nside {nside} (npix {npix})")]
    BadPixel {
        /// The offending index.
        pix: u64,
        /// The map resolution.
        nside: u64,
        /// Number of pixels at this resolution.
        npix: u64,
    },
    /// A ring number is outside `1..=4 nside - 1`.
    #[error("HEALPix ring {ring} out of range for nside {nside} (rings 1..={})", 4 * nside - 1)]
    BadRing {
        /// The offending ring.
        ring: u64,
        /// The map resolution.
        nside: u64,
    },
}

/// Number of pixels `12 nside²` of a valid `nside`.
pub fn nside2npix(nside: u64) -> Result<u64, HealpixError> {
    Nside::new(nside).map(Nside::npix)
}

/// The `nside` of a map with `npix` pixels (`npix = 12 nside²`, `nside` a power of two).
pub fn npix2nside(npix: u64) -> Result<u64, HealpixError> {
    if npix == 0 || !npix.is_multiple_of(12) {
        return Err(HealpixError::BadNpix(npix));
    }
    let n2 = npix / 12;
    let nside = isqrt(n2);
    if nside * nside != n2 || Nside::new(nside).is_err() {
        return Err(HealpixError::BadNpix(npix));
    }
    Ok(nside)
}

/// Exact integer square root (floor).
fn isqrt(v: u64) -> u64 {
    let mut r = (v as f64).sqrt() as u64;
    while r * r > v {
        r -= 1;
    }
    while (r + 1) * (r + 1) <= v {
        r += 1;
    }
    r
}

/// Spreads the low 32 bits of `v` to the even bit positions of a u64.
fn spread_bits(v: u64) -> u64 {
    let mut x = v & 0xffff_ffff;
    x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    x = (x | (x << 2)) & 0x3333_3333_3333_3333;
    x = (x | (x << 1)) & 0x5555_5555_5555_5555;
    x
}

/// Inverse of [`spread_bits`]: gathers the even bits of `v` into the low 32 bits.
fn compress_bits(v: u64) -> u64 {
    let mut x = v & 0x5555_5555_5555_5555;
    x = (x | (x >> 1)) & 0x3333_3333_3333_3333;
    x = (x | (x >> 2)) & 0x0f0f_0f0f_0f0f_0f0f;
    x = (x | (x >> 4)) & 0x00ff_00ff_00ff_00ff;
    x = (x | (x >> 8)) & 0x0000_ffff_0000_ffff;
    x = (x | (x >> 16)) & 0x0000_0000_ffff_ffff;
    x
}

/// Geometry of one iso-latitude ring (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RingInfo {
    /// Ring number, `1..=4 nside - 1`, counted from the north pole.
    pub ring: u64,
    /// `cos θ` of the ring.
    pub z: f64,
    /// Colatitude θ of the ring in radians.
    pub theta: f64,
    /// `sin θ` of the ring (computed accurately near the poles).
    pub sin_theta: f64,
    /// RING index of the ring's first pixel.
    pub first_pixel: u64,
    /// Number of pixels in the ring.
    pub npix: u64,
    /// Longitude of the first pixel in radians.
    pub phi0: f64,
    /// Whether the ring is shifted by half a pixel (`phi0 != 0`).
    pub shifted: bool,
}

/// A position on the sphere as computed by the HEALPix C++ `pix2loc`:
/// `z = cos θ`, `phi`, and `sin θ` where it is needed for accuracy.
#[derive(Debug, Clone, Copy)]
struct Loc {
    z: f64,
    phi: f64,
    sth: Option<f64>,
}

impl Loc {
    fn theta(&self) -> f64 {
        match self.sth {
            Some(s) => s.atan2(self.z),
            None => self.z.acos(),
        }
    }

    fn vec(&self) -> [f64; 3] {
        let st = match self.sth {
            Some(s) => s,
            None => ((1.0 - self.z) * (1.0 + self.z)).sqrt(),
        };
        [st * self.phi.cos(), st * self.phi.sin(), self.z]
    }
}

/// A HEALPix resolution with its derived constants. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Healpix {
    nside: u64,
    order: u32,
    npface: u64,
    ncap: u64,
    npix: u64,
}

impl Healpix {
    /// A HEALPix grid of resolution `nside` (a power of two in `1..=2^29`).
    pub fn new(nside: u64) -> Result<Self, HealpixError> {
        Nside::new(nside).map(Self::of)
    }

    /// The HEALPix grid of a checked resolution.
    pub fn of(nside: Nside) -> Self {
        let n = nside.get();
        Self {
            nside: n,
            order: nside.order(),
            npface: n * n,
            ncap: 2 * n * (n - 1),
            npix: nside.npix(),
        }
    }

    /// The resolution parameter.
    pub fn nside(&self) -> u64 {
        self.nside
    }

    /// `log2(nside)`.
    pub fn order(&self) -> u32 {
        self.order
    }

    /// Number of pixels, `12 nside²`.
    pub fn npix(&self) -> u64 {
        self.npix
    }

    /// Number of iso-latitude rings, `4 nside - 1`.
    pub fn nrings(&self) -> u64 {
        4 * self.nside - 1
    }

    /// Number of pixels in the north polar cap, `2 nside (nside - 1)`.
    pub fn ncap(&self) -> u64 {
        self.ncap
    }

    fn fact2(&self) -> f64 {
        4.0 / self.npix as f64
    }

    fn fact1(&self) -> f64 {
        (2 * self.nside) as f64 * self.fact2()
    }

    /// Checks that `pix` is a valid pixel index.
    pub fn check_pixel(&self, pix: u64) -> Result<(), HealpixError> {
        if pix >= self.npix {
            Err(HealpixError::BadPixel {
                pix,
                nside: self.nside,
                npix: self.npix,
            })
        } else {
            Ok(())
        }
    }

    // ---------------------------------------------------------------- xyf

    fn xyf2nest(&self, ix: u64, iy: u64, face: u64) -> u64 {
        (face << (2 * self.order)) + spread_bits(ix) + (spread_bits(iy) << 1)
    }

    fn nest2xyf(&self, pix: u64) -> (u64, u64, u64) {
        let face = pix >> (2 * self.order);
        let p = pix & (self.npface - 1);
        (compress_bits(p), compress_bits(p >> 1), face)
    }

    fn xyf2ring(&self, ix: u64, iy: u64, face: u64) -> u64 {
        let nside = self.nside as i64;
        let nl4 = 4 * nside;
        let (ix, iy, face) = (ix as i64, iy as i64, face as usize);
        let jr = JRLL[face] * nside - ix - iy - 1;
        let (nr, n_before, kshift) = if jr < nside {
            (jr, 2 * jr * (jr - 1), 0)
        } else if jr > 3 * nside {
            let nr = nl4 - jr;
            (nr, self.npix as i64 - 2 * (nr + 1) * nr, 0)
        } else {
            (
                nside,
                self.ncap as i64 + (jr - nside) * nl4,
                (jr - nside) & 1,
            )
        };
        let mut jp = (JPLL[face] * nr + ix - iy + 1 + kshift) / 2;
        if jp > nl4 {
            jp -= nl4;
        } else if jp < 1 {
            jp += nl4;
        }
        (n_before + jp - 1) as u64
    }

    fn ring2xyf(&self, pix: u64) -> (u64, u64, u64) {
        let nside = self.nside as i64;
        let nl2 = 2 * nside;
        let npix = self.npix as i64;
        let ncap = self.ncap as i64;
        let pix = pix as i64;
        let (iring, iphi, kshift, nr, face);
        if pix < ncap {
            let ir = (1 + isqrt((1 + 2 * pix) as u64) as i64) >> 1;
            iphi = (pix + 1) - 2 * ir * (ir - 1);
            kshift = 0;
            nr = ir;
            iring = ir;
            face = (iphi - 1) / nr;
        } else if pix < npix - ncap {
            let ip = pix - ncap;
            let tmp = ip >> (self.order + 2);
            iring = tmp + nside;
            iphi = ip - tmp * 4 * nside + 1;
            kshift = (iring + nside) & 1;
            nr = nside;
            let ire = tmp + 1;
            let irm = nl2 + 1 - tmp;
            let ifm = (iphi - (ire >> 1) + nside - 1) >> self.order;
            let ifp = (iphi - (irm >> 1) + nside - 1) >> self.order;
            face = if ifp == ifm {
                ifp | 4
            } else if ifp < ifm {
                ifp
            } else {
                ifm + 8
            };
        } else {
            let ip = npix - pix;
            let ir = (1 + isqrt((2 * ip - 1) as u64) as i64) >> 1;
            iphi = 4 * ir + 1 - (ip - 2 * ir * (ir - 1));
            kshift = 0;
            nr = ir;
            iring = 2 * nl2 - ir;
            face = 8 + (iphi - 1) / nr;
        }
        let irt = iring - (2 + (face >> 2)) * nside + 1;
        let mut ipt = 2 * iphi - JPLL[face as usize] * nr - kshift - 1;
        if ipt >= nl2 {
            ipt -= 8 * nside;
        }
        let ix = (ipt - irt) >> 1;
        let iy = (-ipt - irt) >> 1;
        (ix as u64, iy as u64, face as u64)
    }

    // ----------------------------------------------------- nest <-> ring

    /// Converts a NEST index to the RING index of the same pixel.
    ///
    /// # Panics
    /// Panics (in debug builds) if `pix >= npix`; use [`Healpix::check_pixel`]
    /// for untrusted input.
    pub fn nest2ring(&self, pix: u64) -> u64 {
        debug_assert!(pix < self.npix, "NEST pixel {pix} out of range");
        let (ix, iy, f) = self.nest2xyf(pix);
        self.xyf2ring(ix, iy, f)
    }

    /// Converts a RING index to the NEST index of the same pixel.
    ///
    /// # Panics
    /// Panics (in debug builds) if `pix >= npix`.
    pub fn ring2nest(&self, pix: u64) -> u64 {
        debug_assert!(pix < self.npix, "RING pixel {pix} out of range");
        let (ix, iy, f) = self.ring2xyf(pix);
        self.xyf2nest(ix, iy, f)
    }

    // ------------------------------------------------------- loc -> pix

    /// `phi` reduced to `tt = phi / (π/2)` in `[0, 4)`.
    fn reduce_phi(phi: f64) -> f64 {
        let v = phi * (1.0 / FRAC_PI_2);
        let tt = if v >= 0.0 {
            if v < 4.0 {
                v
            } else {
                v % 4.0
            }
        } else {
            v % 4.0 + 4.0
        };
        // A tiny negative phi rounds to exactly 4.0: that is phi = 0.
        if tt >= 4.0 {
            0.0
        } else {
            tt
        }
    }

    fn loc2pix_nest(&self, z: f64, phi: f64, sth: Option<f64>) -> u64 {
        let nside = self.nside as i64;
        let za = z.abs();
        let tt = Self::reduce_phi(phi);
        let (ix, iy, face);
        if za <= 2.0 / 3.0 {
            let temp1 = self.nside as f64 * (0.5 + tt);
            let temp2 = self.nside as f64 * (z * 0.75);
            let jp = (temp1 - temp2) as i64;
            let jm = (temp1 + temp2) as i64;
            let ifp = jp >> self.order;
            let ifm = jm >> self.order;
            face = if ifp == ifm {
                ifp | 4
            } else if ifp < ifm {
                ifp
            } else {
                ifm + 8
            };
            ix = jm & (nside - 1);
            iy = nside - (jp & (nside - 1)) - 1;
        } else {
            let ntt = (tt as i64).min(3);
            let tp = tt - ntt as f64;
            let tmp = match sth {
                Some(s) if za >= 0.99 => self.nside as f64 * s / ((1.0 + za) / 3.0).sqrt(),
                _ => self.nside as f64 * (3.0 * (1.0 - za)).sqrt(),
            };
            let jp = ((tp * tmp) as i64).min(nside - 1);
            let jm = (((1.0 - tp) * tmp) as i64).min(nside - 1);
            if z >= 0.0 {
                face = ntt;
                ix = nside - jm - 1;
                iy = nside - jp - 1;
            } else {
                face = ntt + 8;
                ix = jp;
                iy = jm;
            }
        }
        self.xyf2nest(ix as u64, iy as u64, face as u64)
    }

    fn loc2pix_ring(&self, z: f64, phi: f64, sth: Option<f64>) -> u64 {
        let nside = self.nside as i64;
        let nl4 = 4 * nside;
        let za = z.abs();
        let tt = Self::reduce_phi(phi);
        if za <= 2.0 / 3.0 {
            let temp1 = self.nside as f64 * (0.5 + tt);
            let temp2 = self.nside as f64 * z * 0.75;
            let jp = (temp1 - temp2) as i64;
            let jm = (temp1 + temp2) as i64;
            let ir = nside + 1 + jp - jm;
            let kshift = 1 - (ir & 1);
            let t1 = jp + jm - nside + kshift + 1 + nl4 + nl4;
            let ip = (t1 >> 1) & (nl4 - 1);
            (self.ncap as i64 + (ir - 1) * nl4 + ip) as u64
        } else {
            let tp = tt - (tt as i64) as f64;
            let tmp = match sth {
                Some(s) if za >= 0.99 => self.nside as f64 * s / ((1.0 + za) / 3.0).sqrt(),
                _ => self.nside as f64 * (3.0 * (1.0 - za)).sqrt(),
            };
            let jp = (tp * tmp) as i64;
            let jm = ((1.0 - tp) * tmp) as i64;
            let ir = jp + jm + 1;
            let mut ip = (tt * ir as f64) as i64;
            if ip >= 4 * ir {
                ip -= 4 * ir;
            }
            if z > 0.0 {
                (2 * ir * (ir - 1) + ip) as u64
            } else {
                (self.npix as i64 - 2 * ir * (ir + 1) + ip) as u64
            }
        }
    }

    fn ang_loc(theta: f64, phi: f64) -> (f64, f64, Option<f64>) {
        if !(0.01..=PI - 0.01).contains(&theta) {
            (theta.cos(), phi, Some(theta.sin()))
        } else {
            (theta.cos(), phi, None)
        }
    }

    fn vec_loc(v: [f64; 3]) -> (f64, f64, Option<f64>) {
        let xl = 1.0 / (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
        let phi = if v[0] == 0.0 && v[1] == 0.0 {
            0.0
        } else {
            v[1].atan2(v[0])
        };
        let nz = v[2] * xl;
        if nz.abs() > 0.99 {
            (nz, phi, Some((v[0] * v[0] + v[1] * v[1]).sqrt() * xl))
        } else {
            (nz, phi, None)
        }
    }

    /// NEST pixel containing the direction (colatitude `theta` in `[0, π]`, longitude `phi`).
    ///
    /// `theta` outside `[0, π]` gives an unspecified (but in-range) pixel; callers
    /// handling untrusted input should validate it.
    pub fn ang2pix_nest(&self, theta: f64, phi: f64) -> u64 {
        let (z, phi, sth) = Self::ang_loc(theta, phi);
        self.loc2pix_nest(z, phi, sth)
    }

    /// RING pixel containing the direction (colatitude `theta`, longitude `phi`).
    pub fn ang2pix_ring(&self, theta: f64, phi: f64) -> u64 {
        let (z, phi, sth) = Self::ang_loc(theta, phi);
        self.loc2pix_ring(z, phi, sth)
    }

    /// NEST pixel containing the direction of the (not necessarily unit) vector `v`.
    pub fn vec2pix_nest(&self, v: [f64; 3]) -> u64 {
        let (z, phi, sth) = Self::vec_loc(v);
        self.loc2pix_nest(z, phi, sth)
    }

    /// RING pixel containing the direction of the (not necessarily unit) vector `v`.
    pub fn vec2pix_ring(&self, v: [f64; 3]) -> u64 {
        let (z, phi, sth) = Self::vec_loc(v);
        self.loc2pix_ring(z, phi, sth)
    }

    // ------------------------------------------------------- pix -> loc

    fn pix2loc_nest(&self, pix: u64) -> Loc {
        let nside = self.nside as i64;
        let nl4 = 4 * nside;
        let (ix, iy, face) = self.nest2xyf(pix);
        let (ix, iy, face) = (ix as i64, iy as i64, face as usize);
        let jr = (JRLL[face] << self.order) - ix - iy - 1;
        let (nr, z, sth);
        if jr < nside {
            nr = jr;
            let tmp = (nr * nr) as f64 * self.fact2();
            z = 1.0 - tmp;
            sth = (z > 0.99).then(|| (tmp * (2.0 - tmp)).sqrt());
        } else if jr > 3 * nside {
            nr = nl4 - jr;
            let tmp = (nr * nr) as f64 * self.fact2();
            z = tmp - 1.0;
            sth = (z < -0.99).then(|| (tmp * (2.0 - tmp)).sqrt());
        } else {
            nr = nside;
            z = (2 * nside - jr) as f64 * self.fact1();
            sth = None;
        }
        let mut tmp = JPLL[face] * nr + ix - iy;
        if tmp < 0 {
            tmp += 8 * nr;
        }
        let phi = if nr == nside {
            0.75 * FRAC_PI_2 * tmp as f64 * self.fact1()
        } else {
            (0.5 * FRAC_PI_2 * tmp as f64) / nr as f64
        };
        Loc { z, phi, sth }
    }

    fn pix2loc_ring(&self, pix: u64) -> Loc {
        let nside = self.nside as i64;
        let npix = self.npix as i64;
        let ncap = self.ncap as i64;
        let pix = pix as i64;
        if pix < ncap {
            let iring = (1 + isqrt((1 + 2 * pix) as u64) as i64) >> 1;
            let iphi = (pix + 1) - 2 * iring * (iring - 1);
            let tmp = (iring * iring) as f64 * self.fact2();
            let z = 1.0 - tmp;
            let sth = (z > 0.99).then(|| (tmp * (2.0 - tmp)).sqrt());
            let phi = (iphi as f64 - 0.5) * FRAC_PI_2 / iring as f64;
            Loc { z, phi, sth }
        } else if pix < npix - ncap {
            let nl4 = 4 * nside;
            let ip = pix - ncap;
            let tmp = ip >> (self.order + 2);
            let iring = tmp + nside;
            let iphi = ip - nl4 * tmp + 1;
            let fodd = if ((iring + nside) & 1) != 0 { 1.0 } else { 0.5 };
            let z = (2 * nside - iring) as f64 * self.fact1();
            let phi = (iphi as f64 - fodd) * PI * 0.75 * self.fact1();
            Loc { z, phi, sth: None }
        } else {
            let ip = npix - pix;
            let iring = (1 + isqrt((2 * ip - 1) as u64) as i64) >> 1;
            let iphi = 4 * iring + 1 - (ip - 2 * iring * (iring - 1));
            let tmp = (iring * iring) as f64 * self.fact2();
            let z = tmp - 1.0;
            let sth = (z < -0.99).then(|| (tmp * (2.0 - tmp)).sqrt());
            let phi = (iphi as f64 - 0.5) * FRAC_PI_2 / iring as f64;
            Loc { z, phi, sth }
        }
    }

    /// Centre `(theta, phi)` of NEST pixel `pix`, `phi` in `[0, 2π)`.
    pub fn pix2ang_nest(&self, pix: u64) -> (f64, f64) {
        let l = self.pix2loc_nest(pix);
        (l.theta(), l.phi)
    }

    /// Centre `(theta, phi)` of RING pixel `pix`, `phi` in `[0, 2π)`.
    pub fn pix2ang_ring(&self, pix: u64) -> (f64, f64) {
        let l = self.pix2loc_ring(pix);
        (l.theta(), l.phi)
    }

    /// Unit vector of the centre of NEST pixel `pix`.
    pub fn pix2vec_nest(&self, pix: u64) -> [f64; 3] {
        self.pix2loc_nest(pix).vec()
    }

    /// Unit vector of the centre of RING pixel `pix`.
    pub fn pix2vec_ring(&self, pix: u64) -> [f64; 3] {
        self.pix2loc_ring(pix).vec()
    }

    // ----------------------------------------------------- ring geometry

    /// Geometry of ring `ring` (`1..=4 nside - 1`), see [`RingInfo`].
    pub fn ring_info(&self, ring: u64) -> Result<RingInfo, HealpixError> {
        if ring == 0 || ring > self.nrings() {
            return Err(HealpixError::BadRing {
                ring,
                nside: self.nside,
            });
        }
        let nside = self.nside;
        let northring = if ring > 2 * nside {
            4 * nside - ring
        } else {
            ring
        };
        let (mut z, mut theta, sin_theta, ringpix, shifted, mut startpix);
        if northring < nside {
            let tmp = (northring * northring) as f64 * self.fact2();
            z = 1.0 - tmp;
            sin_theta = (tmp * (2.0 - tmp)).sqrt();
            theta = sin_theta.atan2(z);
            ringpix = 4 * northring;
            shifted = true;
            startpix = 2 * northring * (northring - 1);
        } else {
            z = (2 * nside - northring) as f64 * self.fact1();
            theta = z.acos();
            sin_theta = ((1.0 - z) * (1.0 + z)).sqrt();
            ringpix = 4 * nside;
            shifted = ((northring - nside) & 1) == 0;
            startpix = self.ncap + (northring - nside) * ringpix;
        }
        if northring != ring {
            theta = PI - theta;
            z = -z;
            startpix = self.npix - startpix - ringpix;
        }
        let phi0 = if shifted { PI / ringpix as f64 } else { 0.0 };
        Ok(RingInfo {
            ring,
            z,
            theta,
            sin_theta,
            first_pixel: startpix,
            npix: ringpix,
            phi0,
            shifted,
        })
    }

    /// Geometry of all rings, north to south.
    pub fn rings(&self) -> Vec<RingInfo> {
        (1..=self.nrings())
            .map(|r| self.ring_info(r).expect("ring number in range"))
            .collect()
    }

    /// Ring number (`1..=4 nside - 1`) of RING pixel `pix`.
    pub fn ring_of_ring_pixel(&self, pix: u64) -> u64 {
        let nside = self.nside;
        if pix < self.ncap {
            (1 + isqrt(1 + 2 * pix)) >> 1
        } else if pix < self.npix - self.ncap {
            (pix - self.ncap) / (4 * nside) + nside
        } else {
            let ip = self.npix - pix;
            4 * nside - ((1 + isqrt(2 * ip - 1)) >> 1)
        }
    }
}

/// Reorders a full-sky map from RING to NEST ordering (parallel gather).
///
/// `ring_map.len()` must be `12 nside²` for a valid `nside`.
pub fn ring_to_nest<T: Copy + Send + Sync>(ring_map: &[T]) -> Result<Vec<T>, HealpixError> {
    use rayon::prelude::*;
    let hp = Healpix::new(npix2nside(ring_map.len() as u64)?)?;
    Ok((0..hp.npix())
        .into_par_iter()
        .map(|p| ring_map[hp.nest2ring(p) as usize])
        .collect())
}

/// Reorders a full-sky map from NEST to RING ordering (parallel gather).
///
/// `nest_map.len()` must be `12 nside²` for a valid `nside`.
pub fn nest_to_ring<T: Copy + Send + Sync>(nest_map: &[T]) -> Result<Vec<T>, HealpixError> {
    use rayon::prelude::*;
    let hp = Healpix::new(npix2nside(nest_map.len() as u64)?)?;
    Ok((0..hp.npix())
        .into_par_iter()
        .map(|p| nest_map[hp.ring2nest(p) as usize])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nside_validation() {
        assert!(Nside::new(1).is_ok());
        assert_eq!(Nside::new(1 << 29).map(Nside::order), Ok(29));
        assert_eq!(Nside::new(0), Err(HealpixError::BadNside(0)));
        assert_eq!(Nside::new(3), Err(HealpixError::BadNside(3)));
        assert_eq!(Nside::new(1 << 30), Err(HealpixError::BadNside(1 << 30)));
        assert_eq!(Nside::try_from(-4i64), Err(HealpixError::BadNside(-4)));
        assert_eq!(Nside::try_from(64i64).map(i64::from), Ok(64));
        assert_eq!(Nside::new(1024).map(Nside::npix), Ok(12 * 1024 * 1024));
        assert_eq!(nside2npix(1024), Ok(12 * 1024 * 1024));
        assert_eq!(npix2nside(12 * 1024 * 1024), Ok(1024));
        assert_eq!(npix2nside(12 * 9), Err(HealpixError::BadNpix(108)));
        assert_eq!(npix2nside(13), Err(HealpixError::BadNpix(13)));
        assert!(Healpix::new(6).is_err());
        let msg = HealpixError::BadNside(6).to_string();
        assert!(msg.contains('6') && msg.contains("power of two"), "{msg}");
    }

    #[test]
    fn bits_roundtrip() {
        for v in [0u64, 1, 2, 3, 0x1234_5678, (1 << 29) - 1, 0xffff_ffff] {
            assert_eq!(compress_bits(spread_bits(v)), v);
        }
    }

    #[test]
    fn nest_ring_bijection_small() {
        for nside in [1u64, 2, 4, 8, 16] {
            let hp = Healpix::new(nside).unwrap();
            let mut seen = vec![false; hp.npix() as usize];
            for p in 0..hp.npix() {
                let r = hp.nest2ring(p);
                assert!(r < hp.npix());
                assert!(!seen[r as usize]);
                seen[r as usize] = true;
                assert_eq!(hp.ring2nest(r), p);
                // pixel centres round-trip in both schemes
                let (t, f) = hp.pix2ang_nest(p);
                assert_eq!(hp.ang2pix_nest(t, f), p);
                assert_eq!(hp.ang2pix_ring(t, f), r);
                assert_eq!(hp.vec2pix_nest(hp.pix2vec_nest(p)), p);
                let (tr, fr) = hp.pix2ang_ring(r);
                assert!((tr - t).abs() < 1e-14 && (fr - f).abs() < 1e-13);
            }
        }
    }

    #[test]
    fn rings_tile_the_sphere() {
        for nside in [1u64, 2, 8, 32] {
            let hp = Healpix::new(nside).unwrap();
            let mut next = 0;
            for info in hp.rings() {
                assert_eq!(info.first_pixel, next);
                next += info.npix;
                for j in 0..info.npix {
                    let p = info.first_pixel + j;
                    assert_eq!(hp.ring_of_ring_pixel(p), info.ring);
                    let (t, f) = hp.pix2ang_ring(p);
                    assert!((t - info.theta).abs() < 1e-13);
                    let fexp = info.phi0 + 2.0 * PI * j as f64 / info.npix as f64;
                    assert!((f - fexp).abs() < 1e-12, "ring {} j {j}", info.ring);
                }
            }
            assert_eq!(next, hp.npix());
            assert!(hp.ring_info(0).is_err());
            assert!(hp.ring_info(4 * nside).is_err());
        }
    }

    #[test]
    fn reorder_roundtrip() {
        let hp = Healpix::new(8).unwrap();
        let ring: Vec<u64> = (0..hp.npix()).collect();
        let nest = ring_to_nest(&ring).unwrap();
        for (p, &r) in nest.iter().enumerate() {
            assert_eq!(r, hp.nest2ring(p as u64));
        }
        assert_eq!(nest_to_ring(&nest).unwrap(), ring);
        assert!(ring_to_nest(&[0u8; 7]).is_err());
    }

    #[test]
    fn phi_edge_cases() {
        let hp = Healpix::new(16).unwrap();
        for theta in [0.0, 1e-9, 0.5, FRAC_PI_2, 2.5, PI - 1e-9, PI] {
            for phi in [
                -1e-300,
                -1e-17,
                0.0,
                2.0 * PI,
                2.0 * PI - 1e-16,
                -7.0,
                100.0,
            ] {
                let n = hp.ang2pix_nest(theta, phi);
                let r = hp.ang2pix_ring(theta, phi);
                assert!(n < hp.npix() && r < hp.npix());
                assert_eq!(hp.nest2ring(n), r, "theta {theta} phi {phi}");
            }
        }
    }
}
