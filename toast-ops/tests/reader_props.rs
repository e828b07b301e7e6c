//! Property tests of the readers that take user files (issue #13): the
//! HEALPix FITS reader and the workflow's configuration (TOML text and
//! `--set` overrides), on random bytes and on valid inputs mutated
//! ([`toast_testkit::hostile`]). Each must answer `Ok` or a typed error,
//! never panic, and allocate no more than a small multiple of the input
//! (plus the reader's fixed buffers; a partial-sky map expands to the full
//! sky of its `NSIDE`, which is its format's meaning).
//!
//! Each property runs proptest's default 256 cases; `PROPTEST_CASES=N`
//! runs more (a deeper search, e.g. before a release).

use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use toast_ops::io::fits::read_healpix_map;
use toast_ops::workflow::config::{self, SECTIONS};
use toast_ops::workflow::{SatelliteJob, SizeOverrides};
use toast_testkit::hostile::{largest_allocation, mutation, CountingAlloc, ABSURD_NUMBERS};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The reader's fixed buffers (a 1 MiB `BufReader`) and small tables.
const FIXED: usize = 2 << 20;

/// The healpy-written maps of `tests/data` (full and partial sky, NEST and
/// RING, integer and float columns).
const SEEDS: [&str; 6] = [
    "hp_2_ring_I_n8.fits",
    "hp_i_nest_K_n8.fits",
    "hp_i_ring_J_n8.fits",
    "hp_iqu_nest_D_n8.fits",
    "hp_iqu_nest_partial_D_n8.fits",
    "hp_iqu_ring_1024E_n16.fits",
];

fn seed(i: usize) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(SEEDS[i % SEEDS.len()]);
    std::fs::read(p).unwrap()
}

/// A fresh file of `bytes` in this test's scratch directory.
fn file(bytes: &[u8]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("toast-ops-props-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(format!("{}.fits", N.fetch_add(1, Ordering::Relaxed)));
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Read `bytes` as a HEALPix map: `Ok` or an error, and allocations within
/// the bound.
fn check_fits(bytes: &[u8]) -> Result<(), TestCaseError> {
    let p = file(bytes);
    let (r, largest) = largest_allocation(|| read_healpix_map(&p, None));
    std::fs::remove_file(&p).unwrap();
    // Decoded columns are f64 (8 bytes for a 1-byte value).
    let mut bound = 16 * bytes.len() + FIXED;
    if let Ok(m) = &r {
        if m.partial {
            bound += 16 * 12 * (m.nside * m.nside) as usize;
        }
    }
    prop_assert!(
        largest <= bound,
        "largest allocation {largest} bytes for a {}-byte file ({:?})",
        bytes.len(),
        r.map(|m| m.nside)
    );
    Ok(())
}

/// FITS cards (80 bytes each) whose values decide sizes, with absurd
/// values written in place, the layout kept.
fn with_card(bytes: &[u8], key: &str, value: &str) -> Vec<u8> {
    let mut out = bytes.to_vec();
    let k = format!("{key:<8}= ");
    for card in out.chunks_exact_mut(80) {
        if card.starts_with(k.as_bytes()) {
            let v = format!("{value:>20}");
            let mut text = format!("{k}{v}").into_bytes();
            text.resize(80, b' ');
            card.copy_from_slice(&text);
        }
    }
    out
}

const SIZE_KEYS: [&str; 12] = [
    "NAXIS", "NAXIS1", "NAXIS2", "PCOUNT", "GCOUNT", "TFIELDS", "NSIDE", "TFORM1", "TFORM2",
    "FIRSTPIX", "LASTPIX", "BITPIX",
];

/// Every size-deciding card of every seed set to every absurd number, one
/// at a time (the combinations are the property test's below).
#[test]
fn fits_every_absurd_card() {
    for (i, name) in SEEDS.iter().enumerate() {
        for key in SIZE_KEYS {
            for v in ABSURD_NUMBERS {
                check_fits(&with_card(&seed(i), key, v))
                    .unwrap_or_else(|e| panic!("{name} with {key} = {v}: {e}"));
            }
        }
    }
}

proptest! {

    #[test]
    fn fits_random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..6000), simple in any::<bool>()) {
        // Half start as a FITS file does, to get past the first check.
        let mut b = bytes;
        if simple {
            let mut head = format!("{:<80}", "SIMPLE  =                    T").into_bytes();
            head.extend(b);
            b = head;
        }
        check_fits(&b)?;
    }

    #[test]
    fn fits_mutated(i in 0..SEEDS.len(), ms in prop::collection::vec(mutation(), 1..4)) {
        let b = ms.iter().fold(seed(i), |b, m| m.apply(&b));
        check_fits(&b)?;
    }

    #[test]
    fn fits_absurd_cards(
        i in 0..SEEDS.len(),
        cards in prop::collection::vec(
            (prop::sample::select(&SIZE_KEYS[..]), prop::sample::select(&ABSURD_NUMBERS[..])),
            1..4,
        ),
    ) {
        let b = cards.iter().fold(seed(i), |b, (k, v)| with_card(&b, k, v));
        check_fits(&b)?;
    }
}

/// Build the configuration of `table` and, when it is valid, a job of the
/// tiny case: `Ok` or an error, never a panic, with small allocations.
fn check_config(table: toml::Table, input_len: usize) -> Result<(), TestCaseError> {
    let (_, largest) = largest_allocation(|| {
        if let Ok(cfg) = config::build(table) {
            let _ = SatelliteJob::new("tiny", cfg, SizeOverrides::default());
        }
    });
    prop_assert!(
        largest <= 64 * input_len + FIXED,
        "largest allocation {largest} bytes for a {input_len}-byte configuration"
    );
    Ok(())
}

/// Every (section, key) of the defaults, and a few that do not exist.
fn keys() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = config::workflow_defaults("tiny")
        .iter()
        .flat_map(|(s, t)| {
            t.as_table()
                .into_iter()
                .flat_map(|t| t.keys())
                .map(move |k| (s.clone(), k.clone()))
        })
        .collect();
    v.push(("dispatch".into(), "run".into()));
    v.push(("dispatch".into(), "kernel.scan_map".into()));
    v.push(("mapmaker".into(), "nosuch".into()));
    v.push(("nosuch".into(), "x".into()));
    v.extend(SECTIONS.iter().map(|s| (s.to_string(), String::new())));
    v
}

/// A `--set` value: absurd numbers, other TOML types, or any text.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(&ABSURD_NUMBERS[..]).prop_map(String::from),
        prop::sample::select(
            &[
                "true",
                "\"\"",
                "\"x\"",
                "[1, 2]",
                "{ a = 1 }",
                "1.5",
                "-0.0",
                "inf",
                "1979-05-27"
            ][..]
        )
        .prop_map(String::from),
        prop::collection::vec(any::<char>(), 0..24).prop_map(|c| c.into_iter().collect()),
    ]
}

proptest! {

    #[test]
    fn config_set_overrides(sets in prop::collection::vec((0..keys().len(), value()), 1..6)) {
        let keys = keys();
        let mut table = config::workflow_defaults("tiny");
        let mut len = 0;
        for (k, v) in &sets {
            let (s, key) = &keys[*k];
            let spec = format!("{s}.{key}={v}");
            len += spec.len();
            let _ = config::apply_set(&mut table, &spec);
        }
        check_config(table, len.max(1024))?;
    }

    #[test]
    fn config_mutated_toml(ms in prop::collection::vec(mutation(), 1..4)) {
        let cfg = config::build(config::workflow_defaults("tiny")).unwrap();
        let text = config::to_toml(&cfg).unwrap().into_bytes();
        let b = ms.iter().fold(text, |b, m| m.apply(&b));
        let text = String::from_utf8_lossy(&b);
        if let Ok(over) = text.parse::<toml::Table>() {
            let mut table = config::workflow_defaults("tiny");
            config::merge(&mut table, &over);
            check_config(table, b.len())?;
        }
    }
}
