//! TOAST's noise generator, Threefry-2x64-20 (Random123's `Threefry2x64`),
//! with Random123's `u01` and TOAST's Gaussian transform
//! `sqrt(2) erfinv(2u - 1)` (M. Giles' double-precision erfinv): the CPU
//! plugin's `sim_noise` kernel and the host (toast-ops' `math::rng`, the
//! kernel benchmark's workloads) both call these, and the device source
//! (`device/kernels.h`, `toast_threefry2x64`, `toast_erfinv`) spells out the
//! same operations in the same order.
//!
//! Written from Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as
//! easy as 1, 2, 3" (SC'11) and checked against Random123's published
//! known-answer vectors; hand-written rather than taken from a crate because
//! TOAST's exact streams (its `u01` conversion, its key and counter layout,
//! its erfinv) must be reproduced bit for bit. (Moved here from
//! `toast_ops::math::rng`, which re-exports them.)

// ---------------------------------------------------------------------------
// Threefry-2x64
// ---------------------------------------------------------------------------

/// Rotation constants of Threefry-2x64 (Salmon et al. 2011, Table 4).
const THREEFRY2X64_ROT: [u32; 8] = [16, 42, 12, 31, 16, 32, 24, 21];
/// Skein key-schedule parity constant.
const SKEIN_PARITY: u64 = 0x1BD1_1BDA_A9FC_1A22;

/// Threefry-2x64 with `rounds` rounds (Random123 uses 20 by default; 13 is
/// the "fast" variant). Returns both output words.
pub fn threefry2x64_rounds(rounds: usize, ctr: [u64; 2], key: [u64; 2]) -> [u64; 2] {
    let ks = [key[0], key[1], SKEIN_PARITY ^ key[0] ^ key[1]];
    let mut x0 = ctr[0].wrapping_add(ks[0]);
    let mut x1 = ctr[1].wrapping_add(ks[1]);
    for r in 0..rounds {
        x0 = x0.wrapping_add(x1);
        x1 = x1.rotate_left(THREEFRY2X64_ROT[r % 8]);
        x1 ^= x0;
        if r % 4 == 3 {
            let s = (r + 1) / 4;
            x0 = x0.wrapping_add(ks[s % 3]);
            x1 = x1.wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u64);
        }
    }
    [x0, x1]
}

/// Threefry-2x64-20 (Random123's `Threefry2x64`, used by TOAST).
#[inline]
pub fn threefry2x64(ctr: [u64; 2], key: [u64; 2]) -> [u64; 2] {
    threefry2x64_rounds(20, ctr, key)
}

/// Random123's `u01<double>`: maps a 64-bit word to `(0, 1)` as
/// `w 2⁻⁶⁴ + 2⁻⁶⁵` (the conversion of `w` rounds to nearest).
#[inline]
pub fn u01(w: u64) -> f64 {
    const FACTOR: f64 = 1.0 / 18_446_744_073_709_551_616.0; // 2^-64
    (w as f64) * FACTOR + 0.5 * FACTOR
}

/// Fill `out` with TOAST's `uniform_uint64` stream: word 0 of
/// Threefry-2x64-20 at counters `(counter[0], counter[1] + j)`.
pub fn uniform_u64(key: [u64; 2], counter: [u64; 2], out: &mut [u64]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = threefry2x64([counter[0], counter[1].wrapping_add(j as u64)], key)[0];
    }
}

/// Fill `out` with TOAST's `uniform_01` stream.
pub fn uniform_01(key: [u64; 2], counter: [u64; 2], out: &mut [f64]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = u01(threefry2x64([counter[0], counter[1].wrapping_add(j as u64)], key)[0]);
    }
}

/// Deviates of [`gaussian`] evaluated together.
const GAUSS_LANES: usize = 8;

/// Fill `out` with TOAST's `gaussian` stream: `√2 erfinv(2u − 1)`.
///
/// The deviates are made eight (`GAUSS_LANES`) at a time: the Threefry words of
/// the lanes are independent, and when every lane falls in the central
/// branch of [`erfinv`] (all but ~0.2% of the samples) its polynomial is
/// evaluated for all lanes together, one coefficient at a time, so the
/// lanes' Horner chains overlap instead of running one after another
/// (the CPU is latency-bound on one chain). Each lane goes through exactly
/// the operations of the scalar [`erfinv`] (the same `ln`, unfused
/// multiply and add in the same order), so the stream is bit for bit the
/// one-at-a-time stream; a block with any other lane takes the scalar path.
pub fn gaussian(key: [u64; 2], counter: [u64; 2], out: &mut [f64]) {
    let deviate = |j: usize| -> f64 {
        let u = u01(threefry2x64([counter[0], counter[1].wrapping_add(j as u64)], key)[0]);
        2.0 * u - 1.0
    };
    let done = out.len() - out.len() % GAUSS_LANES;
    let mut blocks = out.chunks_exact_mut(GAUSS_LANES);
    for (b, o) in (&mut blocks).enumerate() {
        let x: [f64; GAUSS_LANES] = std::array::from_fn(|k| deviate(b * GAUSS_LANES + k));
        let w: [f64; GAUSS_LANES] = std::array::from_fn(|k| {
            let ab = x[k].abs();
            -((1.0 - ab) * (1.0 + ab)).ln()
        });
        // `ab < 1` (finite w) and the central branch in every lane; a NaN
        // fails the comparison too.
        if x.iter().zip(&w).all(|(x, &w)| x.abs() < 1.0 && w < 6.25) {
            let t: [f64; GAUSS_LANES] = std::array::from_fn(|k| w[k] - 3.125);
            let mut p = [0.0; GAUSS_LANES];
            for &c in &ERFINV_C1 {
                for k in 0..GAUSS_LANES {
                    p[k] = p[k] * t[k] + c;
                }
            }
            for k in 0..GAUSS_LANES {
                o[k] = std::f64::consts::SQRT_2 * (p[k] * x[k]);
            }
        } else {
            for k in 0..GAUSS_LANES {
                o[k] = std::f64::consts::SQRT_2 * erfinv(x[k]);
            }
        }
    }
    for (j, o) in blocks.into_remainder().iter_mut().enumerate() {
        *o = std::f64::consts::SQRT_2 * erfinv(deviate(done + j));
    }
}

/// Horner evaluation, highest-degree coefficient first.
#[inline]
fn horner(c: &[f64], w: f64) -> f64 {
    c.iter().fold(0.0, |p, &k| p * w + k)
}

/// Giles' central-branch coefficients (`w < 6.25`, in `w − 3.125`).
#[allow(clippy::excessive_precision)] // Giles' published coefficients, verbatim
#[rustfmt::skip]
const ERFINV_C1: [f64; 23] = [
    -3.6444120640178197e-21,
    -1.6850591381820166e-19,
    1.2858480715256400e-18,
    1.1157877678025181e-17,
    -1.3331716628546209e-16,
    2.0972767875968562e-17,
    6.6376381343583238e-15,
    -4.0545662729752069e-14,
    -8.1519341976054722e-14,
    2.6335093153082323e-12,
    -1.2975133253453532e-11,
    -5.415412054294628e-11,
    1.0512122733215323e-9,
    -4.1126339803469837e-9,
    -2.9070369957882005e-8,
    4.2347877827932404e-7,
    -1.3654692000834679e-6,
    -1.3882523362786469e-5,
    1.8673420803405714e-4,
    -7.4070253416626698e-4,
    -6.033670871430149e-3,
    0.2401581824255896,
    1.6536545626831027,
];

/// Inverse error function, M. Giles' double-precision approximation
/// (relative error ~1e-16 in the central region). Returns ±∞ at ±1 and NaN
/// outside `[-1, 1]`.
#[allow(clippy::excessive_precision)] // Giles' published coefficients, verbatim
pub fn erfinv(x: f64) -> f64 {
    // Giles (2011), double precision: three branches in w = -ln(1 - x^2).
    #[rustfmt::skip]
    const C2: [f64; 19] = [
        2.2137376921775787e-9,
        9.075656193888539e-8,
        -2.7517406297064545e-7,
        1.8239629214389228e-8,
        1.5027403968909828e-6,
        -4.013867526981546e-6,
        2.9234449089955446e-6,
        1.2475304481671779e-5,
        -4.7318229009055734e-5,
        6.8284851459573175e-5,
        2.4031110387097894e-5,
        -3.5503752036284748e-4,
        9.532893797373805e-4,
        -1.6882755560235047e-3,
        2.491442096107851e-3,
        -3.7512085075692412e-3,
        5.3709145535900636e-3,
        1.0052589676941592,
        3.0838856104922208,
    ];
    #[rustfmt::skip]
    const C3: [f64; 17] = [
        -2.7109920616438573e-11,
        -2.5556418169965252e-10,
        1.5076572693500548e-9,
        -3.789465440126737e-9,
        7.6157012080783394e-9,
        -1.496002662714924e-8,
        2.914795345090108e-8,
        -6.771199775845234e-8,
        2.2900482228026655e-7,
        -9.9298272942317e-7,
        4.5260625972231537e-6,
        -1.968177810553167e-5,
        7.599527703001776e-5,
        -2.1503011930044477e-4,
        -1.3871931833623122e-4,
        1.0103004648645344,
        4.8499064014085844,
    ];
    if x.is_nan() || x.abs() > 1.0 {
        return f64::NAN;
    }
    if x.abs() == 1.0 {
        return x * f64::INFINITY;
    }
    let ab = x.abs();
    let w = -((1.0 - ab) * (1.0 + ab)).ln();
    let p = if w < 6.25 {
        horner(&ERFINV_C1, w - 3.125)
    } else if w < 16.0 {
        horner(&C2, w.sqrt() - 3.25)
    } else {
        horner(&C3, w.sqrt() - 5.0)
    };
    p * x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threefry_known_answers() {
        // Random123 kat_vectors, threefry2x64 at 13, 20 and 32 rounds.
        let pi_ctr = [0x243f_6a88_85a3_08d3, 0x1319_8a2e_0370_7344];
        let pi_key = [0xa409_3822_299f_31d0, 0x082e_fa98_ec4e_6c89];
        let ones = [u64::MAX; 2];
        type Kat = (usize, [u64; 2], [u64; 2], [u64; 2]);
        let cases: [Kat; 9] = [
            (
                13,
                [0; 2],
                [0; 2],
                [0xf167_b032_c3b4_80bd, 0xe91f_9fee_4b7a_6fb5],
            ),
            (
                13,
                ones,
                ones,
                [0xccde_c5c9_17a8_74b1, 0x4df5_3abc_a26c_eb01],
            ),
            (
                13,
                pi_ctr,
                pi_key,
                [0xc3aa_c715_6104_2993, 0x3fe7_ae88_01af_f316],
            ),
            (
                20,
                [0; 2],
                [0; 2],
                [0xc2b6_e3a8_c2c6_9865, 0x6f81_ed42_f350_084d],
            ),
            (
                20,
                ones,
                ones,
                [0xe02c_b7c4_d95d_277a, 0xd066_33d0_893b_8b68],
            ),
            (
                20,
                pi_ctr,
                pi_key,
                [0x263c_7d30_bb0f_0af1, 0x56be_8361_d331_1526],
            ),
            (
                32,
                [0; 2],
                [0; 2],
                [0x38ba_854d_7f13_cfb3, 0xd02f_ca72_9d54_fadc],
            ),
            (
                32,
                ones,
                ones,
                [0x6b53_2f4f_6e28_8646, 0x0388_f1ec_135e_e18e],
            ),
            (
                32,
                pi_ctr,
                pi_key,
                [0xdad4_92f3_2efb_d0c4, 0xb6d7_d0cd_1f19_3e84],
            ),
        ];
        for (rounds, ctr, key, want) in cases {
            assert_eq!(
                threefry2x64_rounds(rounds, ctr, key),
                want,
                "threefry2x64-{rounds} ctr {ctr:x?} key {key:x?}"
            );
        }
        assert_eq!(
            threefry2x64(pi_ctr, pi_key),
            threefry2x64_rounds(20, pi_ctr, pi_key)
        );
    }

    #[test]
    fn blocked_gaussian_is_the_scalar_stream_bit_for_bit() {
        // 200k deviates: ~400 of them beyond the central branch, so both the
        // blocked and the scalar paths run, and a tail of 5 (not a whole
        // block) at the end.
        let key = [0x1234_5678_9abc_def0, 42];
        let counter = [7, 1 << 40];
        let n = 200_005;
        let mut out = vec![0.0; n];
        gaussian(key, counter, &mut out);
        let mut tails = 0;
        for (j, &g) in out.iter().enumerate() {
            let u = u01(threefry2x64([counter[0], counter[1] + j as u64], key)[0]);
            let want = std::f64::consts::SQRT_2 * erfinv(2.0 * u - 1.0);
            assert_eq!(g.to_bits(), want.to_bits(), "deviate {j}: {g} vs {want}");
            tails += usize::from(g.abs() > 2.9);
        }
        assert!(tails > 100, "{tails} deviates beyond the central branch");
    }

    #[test]
    fn erfinv_accuracy() {
        // Reference values from scipy.special.erfinv (Boost), covering the
        // three branches of Giles' approximation.
        let known = [
            (0.5, 0.476_936_276_204_469_9),
            (-0.9, -1.163_087_153_676_674_3),
            (0.001, 0.000_886_227_157_466_552),
            (0.999, 2.326_753_765_513_524),
            (0.999_999, 3.458_910_737_275_499),
            (0.999_999_9, 3.766_562_581_638_471),
            (1.0 - 2f64.powi(-40), 5.051_254_085_249_39),
            (0.0, 0.0),
        ];
        for (x, want) in known {
            let got = erfinv(x);
            assert!(
                (got - want).abs() <= 1e-15 * want.abs(),
                "erfinv({x}) = {got}, want {want}"
            );
            assert_eq!(erfinv(-x), -got);
        }
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert!(erfinv(1.5).is_nan());
    }
}
