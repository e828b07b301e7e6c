//! The project's random generators: counter-based, so every deviate is a
//! pure function of (key, counter) and results do not depend on how work is
//! split across threads or processes.
//!
//! * **Threefry-2x64-20** ([`threefry2x64`]): Random123's generator, which
//!   TOAST uses for its noise streams; with [`u01`], [`uniform_01`],
//!   [`gaussian`] and Giles' [`erfinv`] it reproduces TOAST's streams
//!   (see [`crate::sim::noise`] for the key layout). This is the general
//!   purpose generator of the project (the kernel benchmark's workloads use
//!   it too).
//! * **Philox4x32-10** ([`philox4x32_10`], [`philox_normal_pair`]): draws
//!   the synthetic sky's a_ℓm ([`crate::sim::sky`]). It stays a separate
//!   generator because the synthetic sky is defined by it: changing it would
//!   change every map the benchmark writes.
//!
//! The Threefry part lives in `toast_accel::math::rng` (the CPU plugin's
//! `sim_noise` kernel calls it too) and is re-exported here. Both are
//! written from Salmon, Moraes, Dror & Shaw, "Parallel random
//! numbers: as easy as 1, 2, 3" (SC'11) and checked against Random123's
//! published known-answer vectors. They are hand-written rather than taken
//! from a crate because TOAST's exact streams (its `u01` conversion, its key
//! and counter layout, its erfinv) must be reproduced bit for bit.

pub use toast_accel::math::rng::{
    erfinv, gaussian, threefry2x64, threefry2x64_rounds, u01, uniform_01, uniform_u64,
};

// =====================================================================
// Philox4x32-10
// =====================================================================

/// The Philox4x32-10 counter-based generator (Salmon et al. 2011, Random123):
/// a keyed bijection of a 128-bit counter.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    const M0: u64 = 0xD251_1F53;
    const M1: u64 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = M0 * c[0] as u64;
        let p1 = M1 * c[2] as u64;
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// Two standard normal deviates from one Philox block (Box–Muller on two
/// 53-bit uniforms in the open interval (0, 1)).
pub fn philox_normal_pair(counter: [u32; 4], key: [u32; 2]) -> (f64, f64) {
    let r = philox4x32_10(counter, key);
    let to_unit = |hi: u32, lo: u32| {
        let bits = ((hi as u64) << 21) | ((lo as u64) >> 11); // 53 bits
        (bits as f64 + 0.5) * (1.0 / 9_007_199_254_740_992.0)
    };
    let u1 = to_unit(r[0], r[1]);
    let u2 = to_unit(r[2], r[3]);
    let rad = (-2.0 * u1.ln()).sqrt();
    let (s, c) = (2.0 * std::f64::consts::PI * u2).sin_cos();
    (rad * c, rad * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answers() {
        // Random123 kat_vectors, philox4x32 with 10 rounds.
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn normals_have_unit_variance() {
        let n = 200_000u32;
        let (mut s1, mut s2, mut c) = (0.0, 0.0, 0.0);
        for i in 0..n {
            let (a, b) = philox_normal_pair([i, 7, 0, 0], [1, 2]);
            s1 += a + b;
            s2 += a * a + b * b;
            c += a * b;
        }
        let m = 2.0 * n as f64;
        assert!((s1 / m).abs() < 0.01, "mean {}", s1 / m);
        assert!((s2 / m - 1.0).abs() < 0.01, "variance {}", s2 / m);
        assert!((c / n as f64).abs() < 0.01, "correlation {}", c / n as f64);
    }
}
