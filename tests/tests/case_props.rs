//! Property tests of the conformance kit's case reader (`load_case`, the
//! `.npz` files `toast-cli verify` reads; issue #13): on random bytes, on
//! shipped cases mutated ([`toast_testkit::hostile`]) as files and with one
//! array's `.npy` mutated inside a valid zip, it answers `Ok` or a
//! typed [`CaseError`](toast_accel::host::conformance::CaseError), never
//! panics, and allocates no more than a small multiple of the file (plus
//! the zip reader's fixed buffers).
//!
//! Each property runs proptest's default 256 cases; `PROPTEST_CASES=N`
//! runs more.

use proptest::prelude::*;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use toast_accel::host::conformance::load_case;
use toast_testkit::hostile::{largest_allocation, mutation, CountingAlloc, Mutation};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Fixed buffers (the zip reader's, a `BufReader`'s) and small tables.
const FIXED: usize = 1 << 20;

/// Small shipped cases of several kernels and dtypes.
const SEEDS: [&str; 5] = [
    "noise_weight_basic.npz",
    "template_offset_apply_diag_precond_basic.npz",
    "template_offset_apply_diag_precond_empty.npz",
    "stokes_weights_I_basic.npz",
    "pixels_healpix_nest_nside64.npz",
];

use toast_tests::cases_dir;

fn seed(i: usize) -> (String, Vec<u8>) {
    let name = SEEDS[i % SEEDS.len()];
    (
        name.to_string(),
        std::fs::read(cases_dir().join(name)).unwrap(),
    )
}

/// Load `bytes` as the case file `name` (the name picks the kernel): `Ok`
/// or an error, with allocations within the bound.
fn check(name: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir()
        .join(format!("toast-case-props-{}", std::process::id()))
        .join(N.fetch_add(1, Ordering::Relaxed).to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let (r, largest) = largest_allocation(|| load_case(&p));
    std::fs::remove_dir_all(&dir).unwrap();
    prop_assert!(
        largest <= 16 * bytes.len() + FIXED,
        "largest allocation {largest} bytes for a {}-byte case ({:?})",
        bytes.len(),
        r.err()
    );
    Ok(())
}

/// `npz` with the `.npy` of entry `k` (modulo the count) changed by `ms`,
/// written again as a valid zip (stored, checksums right): the mutation
/// reaches the `.npy` reader instead of the zip's checksum.
fn with_entry_mutated(npz: &[u8], k: usize, ms: &[Mutation]) -> Vec<u8> {
    let mut zin = zip::ZipArchive::new(std::io::Cursor::new(npz)).unwrap();
    let k = k % zin.len();
    let mut zout = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..zin.len() {
        let mut e = zin.by_index(i).unwrap();
        let name = e.name().to_string();
        let mut bytes = Vec::new();
        e.read_to_end(&mut bytes).unwrap();
        if i == k {
            bytes = ms.iter().fold(bytes, |b, m| m.apply(&b));
        }
        zout.start_file(name, opts).unwrap();
        zout.write_all(&bytes).unwrap();
    }
    zout.finish().unwrap().into_inner()
}

#[test]
fn seeds_load() {
    for i in 0..SEEDS.len() {
        let (name, _) = seed(i);
        load_case(&cases_dir().join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

proptest! {
    #[test]
    fn random_bytes(i in 0..SEEDS.len(), bytes in prop::collection::vec(any::<u8>(), 0..4000), zip in any::<bool>()) {
        // Half start as a zip local header does, to get past the first check.
        let mut b = bytes;
        if zip {
            let mut head = b"PK\x03\x04".to_vec();
            head.extend(b);
            b = head;
        }
        check(&seed(i).0, &b)?;
    }

    #[test]
    fn mutated_arrays(i in 0..SEEDS.len(), k in any::<usize>(), ms in prop::collection::vec(mutation(), 1..4)) {
        let (name, bytes) = seed(i);
        check(&name, &with_entry_mutated(&bytes, k, &ms))?;
    }

    #[test]
    fn mutated(i in 0..SEEDS.len(), ms in prop::collection::vec(mutation(), 1..4)) {
        let (name, bytes) = seed(i);
        let b = ms.iter().fold(bytes, |b, m| m.apply(&b));
        check(&name, &b)?;
    }
}
