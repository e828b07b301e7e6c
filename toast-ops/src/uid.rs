//! TOAST's `name_UID`, re-exported from `toast-core` (one implementation),
//! with a check against values computed by TOAST itself.

pub use toast_core::uid::{md5, name_uid, name_uid64};

#[cfg(test)]
mod tests {
    use super::*;

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
