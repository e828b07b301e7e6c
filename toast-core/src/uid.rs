//! Stable integer identifiers derived from names, as TOAST's `name_UID`.
//!
//! TOAST gives every observation (and every detector of a simulated
//! focalplane) a unique integer computed from its name: the MD5 digest of the
//! UTF-8 name, read as a little-endian 128-bit integer, masked to 31 bits
//! (`uint32`) or to 63 bits (`int64=True`). The noise simulation keys its
//! random streams on these values, so reproducing them exactly is what makes
//! our simulated timestreams comparable with TOAST's. MD5 is used here only
//! as TOAST uses it, as a stable hash, never for security.

/// TOAST's default `name_UID(name)`: the low 31 bits of the little-endian
/// MD5 digest of the UTF-8 name.
///
/// ```
/// assert_eq!(toast_core::uid::name_uid("abc"), 407_896_464);
/// ```
pub fn name_uid(name: &str) -> u32 {
    let d = md5(name.as_bytes());
    let low = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
    low & 0x7FFF_FFFF
}

/// TOAST's `name_UID(name, int64=True)`: the low 63 bits of the little-endian
/// MD5 digest of the UTF-8 name.
pub fn name_uid64(name: &str) -> u64 {
    let d = md5(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_le_bytes(b) & 0x7FFF_FFFF_FFFF_FFFF
}

/// The MD5 digest (RFC 1321) of `data`, from RustCrypto's `md-5`.
fn md5(data: &[u8]) -> [u8; 16] {
    use md5::Digest;
    md5::Md5::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 16]) -> String {
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
            assert_eq!(hex(md5(input.as_bytes())), want, "md5({input:?})");
        }
    }

    #[test]
    fn padding_boundaries() {
        // 55, 56, 63, 64 and 65 bytes straddle the one/two block padding boundary.
        let cases = [
            (55, "04364420e25c512fd958a70738aa8f72"),
            (56, "668a72d5ba17f08e62dabcafad6db14b"),
            (63, "7dc2ca208106a2f703567bdff99d8981"),
            (64, "c1bb4f81d892b2d57947682aeb252456"),
            (65, "1bc932052302d074bdec39795fe00cf6"),
        ];
        for (n, want) in cases {
            assert_eq!(hex(md5(&vec![b'x'; n])), want, "{n} bytes");
        }
    }

    #[test]
    fn matches_toast_name_uid() {
        // Values from TOAST's `toast.utils.name_UID` (Python hashlib).
        let cases: [(&str, u32, u64); 6] = [
            ("", 1502354900, 338333539836370388),
            ("a", 964018444, 2933798017325973772),
            ("science_00000", 1501363988, 60150531003055892),
            ("D0A-150", 965203544, 1825115128988161624),
            ("telescope", 1274491784, 130509407266485128),
            ("h\u{e9}llo", 1206407358, 8309126521837605054),
        ];
        for (name, u32v, u64v) in cases {
            assert_eq!(name_uid(name), u32v, "{name:?}");
            assert_eq!(name_uid64(name), u64v, "{name:?}");
        }
    }
}
