//! TOAST's `name_UID`: stable integer identifiers derived from names.
//!
//! TOAST (`toast.utils.name_UID`) hashes the UTF-8 bytes of a name with MD5,
//! reads the 16-byte digest as a little-endian integer and keeps the low 31
//! bits (or 63 bits for the 64-bit variant). Detector, observation, session
//! and telescope UIDs are all built this way, and they key the random streams
//! of the noise simulation, so they must match TOAST exactly.
//!
//! MD5 follows RFC 1321 (R. Rivest, 1992); it is used here only as a
//! deterministic hash, not for security.

/// MD5 digest of a byte string (RFC 1321).
pub fn md5(data: &[u8]) -> [u8; 16] {
    const S: [u32; 64] = [
        7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5,
        9, 14, 20, 5, 9, 14, 20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10,
        15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
    ];
    // K[i] = floor(2^32 |sin(i + 1)|), computed once (exact in f64).
    let k: [u32; 64] =
        std::array::from_fn(|i| ((i as f64 + 1.0).sin().abs() * 4_294_967_296.0) as u32);

    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_le_bytes());

    let mut h: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    for chunk in msg.chunks_exact(64) {
        let m: [u32; 16] = std::array::from_fn(|i| {
            u32::from_le_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ])
        });
        let [mut a, mut b, mut c, mut d] = h;
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let rotated = a
                .wrapping_add(f)
                .wrapping_add(k[i])
                .wrapping_add(m[g])
                .rotate_left(S[i]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(rotated);
        }
        h[0] = h[0].wrapping_add(a);
        h[1] = h[1].wrapping_add(b);
        h[2] = h[2].wrapping_add(c);
        h[3] = h[3].wrapping_add(d);
    }
    let mut out = [0u8; 16];
    for (i, w) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// TOAST's `name_UID(name)`: the low 31 bits of the little-endian MD5 digest.
pub fn name_uid(name: &str) -> u32 {
    let d = md5(name.as_bytes());
    u32::from_le_bytes([d[0], d[1], d[2], d[3]]) & 0x7FFF_FFFF
}

/// TOAST's `name_UID(name, int64=True)`: the low 63 bits of the digest.
pub fn name_uid64(name: &str) -> u64 {
    let d = md5(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b) & 0x7FFF_FFFF_FFFF_FFFF
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &[u8]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn rfc1321_test_suite() {
        let cases = [
            ("", "d41d8cd98f00b204e9800998ecf8427e"),
            ("a", "0cc175b9c0f1b6a831c399e269772661"),
            ("abc", "900150983cd24fb0d6963f7d28e17f72"),
            ("message digest", "f96b697d7cb7938d525a2f31aaf161d0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "c3fcd3d76192e4007dfb496cca67e13b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "d174ab98d277d9f5a5611c2c9f419d9f",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "57edf4a22be3c955ac49da2e2107b67a",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(hex(&md5(input.as_bytes())), want, "md5({input:?})");
        }
    }

    /// UIDs computed by TOAST 3.0.6 (`toast.utils.name_UID`), recorded by
    /// toast-ops/scripts/satsim_qarray_vectors.py.
    #[test]
    fn matches_toast_name_uid() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/satsim/qarray_vectors.txt"
        );
        let text = std::fs::read_to_string(path).expect("read test vectors");
        let mut n = 0;
        for line in text.lines().filter(|l| l.starts_with("name_uid ")) {
            let (inp, out) = line["name_uid ".len()..]
                .split_once(" | ")
                .expect("separator");
            let name = inp.trim().trim_matches('\'');
            let want: u32 = out.trim().parse().expect("uid");
            assert_eq!(name_uid(name), want, "name_uid({name:?})");
            n += 1;
        }
        assert!(n >= 5);
        assert!(name_uid64("satellite") & 0x7FFF_FFFF == u64::from(name_uid("satellite")));
    }
}
