//! HEALPix FITS I/O: round trips, healpy-written files (committed, made by
//! `tests/data/make_fits_vectors.py`), and error reporting.

use std::path::{Path, PathBuf};

use toast_ops::io::fits::{
    read_healpix_map, toast_extra_header, write_float_columns, write_float_maps, write_healpix_map,
    write_hits_column, write_hits_map, write_iqu_map, ColumnFormat, ColumnSource, FitsError,
    HeaderCard, HeaderValue, MapPrecision, Ordering, SubmapColumn, WriteColumn, UNSEEN,
};
use toast_ops::math::healpix::Healpix;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A fresh scratch directory for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toast-ops-fits-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Float test values of make_fits_vectors.py, by RING index and field.
fn fval(r: u64, f: usize) -> f64 {
    100.0 * (0.37 * r as f64 + 1.3 * f as f64).sin()
}

/// Integer test values of make_fits_vectors.py, by RING index and field.
fn ival(r: u64, f: usize) -> f64 {
    ((7 * r as i64 + 1000 * f as i64) % 30000 - 15000) as f64
}

fn check_field(nside: u64, got: &[f64], expect: impl Fn(u64) -> f64, tol: f64, what: &str) {
    let hp = Healpix::new(nside).unwrap();
    assert_eq!(got.len() as u64, hp.npix(), "{what}");
    for (p, &v) in got.iter().enumerate() {
        let e = expect(hp.nest2ring(p as u64));
        assert!(
            (v - e).abs() <= tol * e.abs().max(1.0),
            "{what}: nest pixel {p}: got {v}, expected {e}"
        );
    }
}

#[test]
fn reads_healpy_float32_ring_vector_columns() {
    let m = read_healpix_map(&data("hp_iqu_ring_1024E_n16.fits"), None).unwrap();
    assert_eq!(m.nside, 16);
    assert_eq!(m.file_ordering, Ordering::Ring);
    assert!(!m.partial);
    let names: Vec<_> = m.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["TEMPERATURE", "Q_POLARISATION", "U_POLARISATION"]);
    for (f, field) in m.fields.iter().enumerate() {
        check_field(16, &field.data, |r| fval(r, f) as f32 as f64, 0.0, "1024E");
    }
    // field selection like healpy's field=(2, 0)
    let sel = read_healpix_map(&data("hp_iqu_ring_1024E_n16.fits"), Some(&[2, 0])).unwrap();
    assert_eq!(sel.fields[0].name, "U_POLARISATION");
    assert_eq!(sel.fields[1].data, m.fields[0].data);
}

#[test]
fn reads_healpy_float64_nest_with_units_and_extra_cards() {
    let m = read_healpix_map(&data("hp_iqu_nest_D_n8.fits"), None).unwrap();
    assert_eq!((m.nside, m.file_ordering), (8, Ordering::Nested));
    for (f, field) in m.fields.iter().enumerate() {
        assert_eq!(field.unit.as_deref(), Some("K"));
        check_field(8, &field.data, |r| fval(r, f), 0.0, "D nest");
    }
    assert_eq!(m.header.get("TESTKEY"), Some(&HeaderValue::Int(42)));
    assert_eq!(
        m.header.get("COORDSYS"),
        Some(&HeaderValue::Str("G".into()))
    );
}

#[test]
fn reads_healpy_integer_maps() {
    let m = read_healpix_map(&data("hp_i_ring_J_n8.fits"), None).unwrap();
    assert_eq!(m.fields.len(), 1);
    assert_eq!(m.fields[0].name, "T");
    check_field(8, &m.fields[0].data, |r| ival(r, 0), 0.0, "J ring");

    let m = read_healpix_map(&data("hp_i_nest_K_n8.fits"), None).unwrap();
    check_field(8, &m.fields[0].data, |r| ival(r, 0), 0.0, "K nest");

    let m = read_healpix_map(&data("hp_2_ring_I_n8.fits"), None).unwrap();
    assert_eq!(m.fields.len(), 2);
    for (f, field) in m.fields.iter().enumerate() {
        check_field(8, &field.data, |r| ival(r, f), 0.0, "I ring");
    }
}

#[test]
fn reads_healpy_partial_sky() {
    let m = read_healpix_map(&data("hp_iqu_nest_partial_D_n8.fits"), None).unwrap();
    assert!(m.partial);
    assert_eq!(m.fields.len(), 3);
    for (f, field) in m.fields.iter().enumerate() {
        check_field(
            8,
            &field.data,
            |r| if r % 3 == 0 { UNSEEN } else { fval(r, f) },
            0.0,
            "partial",
        );
    }
}

/// Maps with exactly representable values (same formula in check_fits_with_healpy.py).
fn test_maps(nside: u64) -> [Vec<f64>; 3] {
    let n = 12 * nside * nside;
    let mk = |f: usize| {
        (0..n)
            .map(|p| ((7 * p + 1000 * f as u64) % 4099) as f64 * 0.125 - 256.0)
            .collect::<Vec<_>>()
    };
    [mk(0), mk(1), mk(2)]
}

#[test]
fn roundtrip_iqu_and_hits() {
    let dir = scratch("roundtrip");
    let nside = 16;
    let maps = test_maps(nside);
    let hits: Vec<i64> = (0..12 * nside * nside)
        .map(|p| (p * 13 % 1000) as i64)
        .collect();
    let extra = toast_extra_header(1.8e9, 1.8e9 + 3600.0, 12, 12, "3.0.6");

    for (prec, ord) in [
        (MapPrecision::F32, Ordering::Nested),
        (MapPrecision::F64, Ordering::Nested),
        (MapPrecision::F64, Ordering::Ring),
    ] {
        let path = dir.join(format!("map_{prec:?}_{ord:?}.fits"));
        write_iqu_map(
            &path,
            ord,
            [&maps[0], &maps[1], &maps[2]],
            "K",
            prec,
            &extra,
        )
        .unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len % 2880, 0);
        let back = read_healpix_map(&path, None).unwrap();
        assert_eq!(back.nside, nside);
        assert_eq!(back.file_ordering, ord);
        let hp = Healpix::new(nside).unwrap();
        for (f, field) in back.fields.iter().enumerate() {
            assert_eq!(field.unit.as_deref(), Some("K"));
            for (p, &v) in field.data.iter().enumerate() {
                // data were written as given in the file's ordering
                let src = match ord {
                    Ordering::Nested => p,
                    Ordering::Ring => hp.nest2ring(p as u64) as usize,
                };
                let e = maps[f][src];
                let e = if prec == MapPrecision::F32 {
                    e as f32 as f64
                } else {
                    e
                };
                assert_eq!(v, e, "{prec:?} {ord:?} field {f} pixel {p}");
            }
        }
        let h = &back.header;
        assert_eq!(h.get("PIXTYPE"), Some(&HeaderValue::Str("HEALPIX".into())));
        assert_eq!(h.get("NSIDE"), Some(&HeaderValue::Int(16)));
        assert_eq!(h.get("LASTPIX"), Some(&HeaderValue::Int(3071)));
        assert_eq!(
            h.get("INDXSCHM"),
            Some(&HeaderValue::Str("IMPLICIT".into()))
        );
        assert_eq!(h.get("OBJECT"), Some(&HeaderValue::Str("FULLSKY".into())));
        assert_eq!(h.get("START"), Some(&HeaderValue::Float(1.8e9)));
        assert_eq!(h.get("NDET"), Some(&HeaderValue::Int(12)));
        assert_eq!(
            h.get("OPERATOR"),
            Some(&HeaderValue::Str("TOAST MapMaker".into()))
        );
        assert_eq!(h.get("VERSION"), Some(&HeaderValue::Str("3.0.6".into())));
        assert!(h.get("CREATED").and_then(HeaderValue::as_f64).unwrap() > 1.6e9);
        let tform = if prec == MapPrecision::F32 { "E" } else { "D" };
        assert_eq!(h.get("TFORM3"), Some(&HeaderValue::Str(tform.into())));
    }

    let path = dir.join("hits.fits");
    write_hits_map(&path, Ordering::Nested, &hits, &extra).unwrap();
    let back = read_healpix_map(&path, None).unwrap();
    assert_eq!(back.fields.len(), 1);
    assert_eq!(back.fields[0].name, "T");
    assert_eq!(
        back.header.get("TFORM1"),
        Some(&HeaderValue::Str("J".into()))
    );
    assert_eq!(back.fields[0].unit, None);
    for (p, &v) in back.fields[0].data.iter().enumerate() {
        assert_eq!(v, hits[p] as f64);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn write_rejects_bad_input() {
    let dir = scratch("badinput");
    let p = dir.join("x.fits");
    let short = vec![0.0f64; 100];
    let err = write_iqu_map(
        &p,
        Ordering::Nested,
        [&short, &short, &short],
        "K",
        MapPrecision::F32,
        &[],
    )
    .unwrap_err();
    assert!(matches!(err, FitsError::InvalidInput { .. }), "{err}");
    assert!(
        err.to_string().contains("x.fits") && err.to_string().contains("100"),
        "{err}"
    );

    let big = vec![i64::from(i32::MAX) + 1; 12];
    let err = write_hits_map(&p, Ordering::Nested, &big, &[]).unwrap_err();
    assert!(err.to_string().contains("int32"), "{err}");

    let m = vec![1.0f64; 12];
    let err = write_healpix_map(
        &p,
        Ordering::Ring,
        &[WriteColumn {
            name: "A",
            unit: None,
            format: ColumnFormat::I32,
            data: ColumnSource::F64(&m),
        }],
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("float"), "{err}");

    let err = write_iqu_map(
        &p,
        Ordering::Nested,
        [&m, &m, &m],
        "K",
        MapPrecision::F32,
        &[HeaderCard::int("NSIDE", 4, "")],
    )
    .unwrap_err();
    assert!(err.to_string().contains("NSIDE"), "{err}");
    let twice = [
        HeaderCard::int("NDET", 1, ""),
        HeaderCard::int("NDET", 2, ""),
    ];
    let err = write_iqu_map(
        &p,
        Ordering::Nested,
        [&m, &m, &m],
        "K",
        MapPrecision::F32,
        &twice,
    )
    .unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
    // EXTNAME replaces the default.
    let ext = [HeaderCard::string("EXTNAME", "SKY", "")];
    write_iqu_map(
        &p,
        Ordering::Nested,
        [&m, &m, &m],
        "K",
        MapPrecision::F32,
        &ext,
    )
    .unwrap();
    let back = read_healpix_map(&p, None).unwrap();
    assert_eq!(
        back.header.get("EXTNAME"),
        Some(&HeaderValue::Str("SKY".into()))
    );
    assert_eq!(back.header.keys().filter(|k| *k == "EXTNAME").count(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes a valid nside-2 map and returns its bytes.
fn valid_file_bytes(dir: &Path) -> Vec<u8> {
    let p = dir.join("valid.fits");
    let m: Vec<f64> = (0..48).map(|i| i as f64).collect();
    write_iqu_map(
        &p,
        Ordering::Nested,
        [&m, &m, &m],
        "K",
        MapPrecision::F32,
        &[],
    )
    .unwrap();
    std::fs::read(&p).unwrap()
}

/// Replaces the header card starting with `key` (padded to 8) by `card`.
fn replace_card(bytes: &mut [u8], key: &str, card: &str) {
    let k = format!("{key:<8}");
    let at = (0..bytes.len() / 80)
        .map(|i| i * 80)
        .find(|&o| &bytes[o..o + 8] == k.as_bytes())
        .unwrap_or_else(|| panic!("card {key} not found"));
    let c = format!("{card:<80}");
    bytes[at..at + 80].copy_from_slice(c.as_bytes());
}

/// Replaces the card `key` of the table's header (after the primary
/// HDU's one block, where BITPIX and NAXIS come first) by `card`.
fn replace_table_card(bytes: &mut [u8], key: &str, card: &str) {
    replace_card(&mut bytes[2880..], key, card);
}

fn read_err(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let e = read_healpix_map(&p, None).unwrap_err();
    let s = e.to_string();
    assert!(s.contains(name), "error does not name the file: {s}");
    println!("{s}");
    s
}

#[test]
fn read_errors_are_clear() {
    let dir = scratch("errors");
    let good = valid_file_bytes(&dir);

    // missing file
    let e = read_healpix_map(&dir.join("nope.fits"), None).unwrap_err();
    assert!(
        matches!(e, FitsError::Open { .. }) && e.to_string().contains("nope.fits"),
        "{e}"
    );

    // not FITS
    let s = read_err(&dir, "text.fits", b"hello world, I am not a FITS file\n");
    assert!(s.contains("not a FITS file"), "{s}");
    let s = read_err(&dir, "text2.fits", &vec![b'x'; 6000]);
    assert!(s.contains("not a FITS file"), "{s}");

    // no BINTABLE: primary HDU only
    let s = read_err(&dir, "primary.fits", &good[..2880]);
    assert!(s.contains("no BINTABLE"), "{s}");

    // not HEALPix
    let mut b = good.clone();
    replace_card(&mut b, "PIXTYPE", "PIXTYPE = 'CAR     '");
    let s = read_err(&dir, "car.fits", &b);
    assert!(s.contains("not a HEALPix map") && s.contains("CAR"), "{s}");
    let mut b = good.clone();
    replace_card(&mut b, "PIXTYPE", "COMMENT nothing");
    let s = read_err(&dir, "nopixtype.fits", &b);
    assert!(s.contains("PIXTYPE"), "{s}");
    let mut b = good.clone();
    replace_card(&mut b, "ORDERING", "ORDERING= 'SPIRAL'");
    let s = read_err(&dir, "spiral.fits", &b);
    assert!(s.contains("ORDERING") && s.contains("SPIRAL"), "{s}");

    // What the FITS standard fixes for a binary table, and a full-sky
    // map's pixel range.
    for (key, card, want) in [
        (
            "BITPIX",
            "BITPIX  =                   16",
            "BITPIX = 16 in a binary table, which has BITPIX = 8",
        ),
        (
            "GCOUNT",
            "GCOUNT  =                    2",
            "GCOUNT = 2 in a binary table, which has GCOUNT = 1",
        ),
        (
            "PCOUNT",
            "PCOUNT  =                   -1",
            "PCOUNT = -1 in a binary table, which has PCOUNT >= 0",
        ),
        (
            "FIRSTPIX",
            "FIRSTPIX=                    5",
            "FIRSTPIX = 5 but a full-sky map of NSIDE = 2 holds pixels 0 to 47",
        ),
        (
            "LASTPIX",
            "LASTPIX =                    7",
            "LASTPIX = 7 but a full-sky map of NSIDE = 2 holds pixels 0 to 47",
        ),
    ] {
        let mut b = good.clone();
        replace_table_card(&mut b, key, card);
        let s = read_err(&dir, &format!("{key}.fits"), &b);
        assert!(s.contains(want), "{s}");
    }

    // bad NSIDE
    let mut b = good.clone();
    replace_card(&mut b, "NSIDE", "NSIDE   =                    3");
    let s = read_err(&dir, "nside3.fits", &b);
    assert!(s.contains("bad NSIDE 3"), "{s}");

    // wrong row count: NSIDE 4 header on 48 rows
    let mut b = good.clone();
    replace_card(&mut b, "NSIDE", "NSIDE   =                    4");
    let s = read_err(&dir, "rows.fits", &b);
    assert!(
        s.contains("wrong row count") && s.contains("192") && s.contains("48"),
        "{s}"
    );

    // unsupported TFORM
    let mut b = good.clone();
    replace_card(&mut b, "TFORM2", "TFORM2  = '4A      '");
    let s = read_err(&dir, "strcol.fits", &b);
    assert!(s.contains("unsupported TFORM") && s.contains("4A"), "{s}");
    let mut b = good.clone();
    replace_card(&mut b, "TFORM1", "TFORM1  = '1Z      '");
    let s = read_err(&dir, "zcol.fits", &b);
    assert!(s.contains("unsupported TFORM") && s.contains("1Z"), "{s}");

    // truncated data and truncated header
    let s = read_err(&dir, "trunc.fits", &good[..2 * 2880 + 100]);
    assert!(s.contains("truncated") && s.contains("table data"), "{s}");
    let s = read_err(&dir, "trunc_hdr.fits", &good[..2880 + 1000]);
    assert!(
        s.contains("truncated") && s.contains("header of HDU 1"),
        "{s}"
    );
    let s = read_err(&dir, "trunc_primary.fits", &good[..1000]);
    assert!(s.contains("truncated"), "{s}");

    // requesting a field that does not exist
    let p = dir.join("valid.fits");
    let e = read_healpix_map(&p, Some(&[3])).unwrap_err().to_string();
    assert!(e.contains("field 3") && e.contains("3 map column"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Every size a header claims is checked against the file (or for
/// overflow) before anything is allocated or skipped; the errors name the
/// file, the keyword and its value.
#[test]
fn read_checks_claimed_sizes_against_file() {
    let dir = scratch("sizes");
    let good = valid_file_bytes(&dir);

    // A primary data unit larger than the file.
    let mut b = good.clone();
    replace_card(&mut b, "NAXIS", "NAXIS   =                    1");
    replace_card(&mut b, "EXTEND", "NAXIS1  =           1000000000");
    let s = read_err(&dir, "big_primary.fits", &b);
    assert!(
        s.contains("truncated") && s.contains("data of HDU 0") && s.contains("NAXIS1 = 1000000000"),
        "{s}"
    );

    // A primary data unit whose size overflows.
    let mut b: Vec<u8> = [
        "SIMPLE  =                    T",
        "BITPIX  =                    8",
        "NAXIS   =                    2",
        "NAXIS1  =        1099511627776",
        "NAXIS2  =        1099511627776",
        "END",
    ]
    .iter()
    .flat_map(|c| format!("{c:<80}").into_bytes())
    .collect();
    b.resize(2880, b' ');
    b.extend_from_slice(&good[2880..]);
    let s = read_err(&dir, "overflow_primary.fits", &b);
    assert!(
        s.contains("overflows") && s.contains("NAXIS2 = 1099511627776"),
        "{s}"
    );

    // A column repeat count whose width overflows.
    let mut b = good.clone();
    replace_card(&mut b, "TFORM1", "TFORM1  = '9999999999999999999D'");
    let s = read_err(&dir, "repeat.fits", &b);
    assert!(
        s.contains("unsupported TFORM") && s.contains("overflows"),
        "{s}"
    );

    // Table data longer than the file: the keywords are named.
    let s = read_err(&dir, "short_table.fits", &good[..2 * 2880 + 100]);
    assert!(
        s.contains("truncated") && s.contains("NAXIS2 = 48") && s.contains("NAXIS1 = 12"),
        "{s}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes files for `tests/data/check_fits_with_healpy.py` into
/// `$TOAST_OPS_FITS_OUT` (or a scratch directory, then only self-checked).
#[test]
fn write_files_for_healpy_check() {
    let (dir, keep) = match std::env::var_os("TOAST_OPS_FITS_OUT") {
        Some(d) => (PathBuf::from(d), true),
        None => (scratch("healpy"), false),
    };
    std::fs::create_dir_all(&dir).unwrap();
    let nside = 32;
    let maps = test_maps(nside);
    let hits: Vec<i64> = (0..12 * nside * nside)
        .map(|p| (p * 13 % 1000) as i64)
        .collect();
    let extra = toast_extra_header(1.8e9, 1.8e9 + 3600.0, 12, 10, "3.0.6");
    let iqu = [&maps[0][..], &maps[1][..], &maps[2][..]];
    write_iqu_map(
        &dir.join("rs_map_f32_nest.fits"),
        Ordering::Nested,
        iqu,
        "K",
        MapPrecision::F32,
        &extra,
    )
    .unwrap();
    write_iqu_map(
        &dir.join("rs_map_f64_ring.fits"),
        Ordering::Ring,
        iqu,
        "K",
        MapPrecision::F64,
        &extra,
    )
    .unwrap();
    write_hits_map(
        &dir.join("rs_hits_nest.fits"),
        Ordering::Nested,
        &hits,
        &extra,
    )
    .unwrap();
    for f in [
        "rs_map_f32_nest.fits",
        "rs_map_f64_ring.fits",
        "rs_hits_nest.fits",
    ] {
        read_healpix_map(&dir.join(f), None).unwrap();
    }
    if !keep {
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// Reads TOAST's benchmark sky (`fake_input_sky_nside1024.fits`, 151 MB, not
/// committed): run with `TOAST_INPUT_SKY=/path/to/file cargo test --release
/// -p toast-ops --test fits_io -- --ignored`.
#[test]
#[ignore = "needs TOAST_INPUT_SKY pointing to fake_input_sky_nside1024.fits"]
fn reads_toast_benchmark_sky() {
    let path = PathBuf::from(std::env::var_os("TOAST_INPUT_SKY").expect("set TOAST_INPUT_SKY"));
    let t = std::time::Instant::now();
    let m = read_healpix_map(&path, None).unwrap();
    println!(
        "read {} in {:.2} s",
        path.display(),
        t.elapsed().as_secs_f64()
    );
    assert_eq!(m.nside, 1024);
    assert_eq!(m.file_ordering, Ordering::Nested);
    assert_eq!(m.fields.len(), 3);
    for f in &m.fields {
        let n = f.data.len() as f64;
        let mean = f.data.iter().sum::<f64>() / n;
        let rms = (f.data.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        println!(
            "{} [{}]: mean {mean:.6e} std {rms:.6e} pixel0 {:.9e} last {:.9e}",
            f.name,
            f.unit.as_deref().unwrap_or(""),
            f.data[0],
            f.data[f.data.len() - 1]
        );
        assert!(rms > 0.0 && rms.is_finite());
    }
}

/// A map stored by submaps is written byte for byte as its full-sky copy,
/// without making that copy; a layout that does not fit is refused.
#[test]
fn submap_columns_write_as_the_full_sky() {
    let dir = scratch("submaps");
    // NSIDE 4: 192 pixels in 12 submaps of 16; submaps 2, 7 and 11 stored,
    // in the local order 7, 2, 11, three values per pixel.
    let (npix, nps, nv) = (192usize, 16usize, 3usize);
    let mut g2l = vec![-1i64; 12];
    for (loc, sm) in [7usize, 2, 11].into_iter().enumerate() {
        g2l[sm] = loc as i64;
    }
    let data: Vec<f64> = (0..3 * nps * nv)
        .map(|i| (i as f64 * 0.37).sin() * 1e3)
        .collect();
    let hits: Vec<i64> = (0..3 * nps).map(|i| 3 * i as i64 + 1).collect();
    let full = |k: usize| -> Vec<f64> {
        (0..npix)
            .map(|p| match g2l[p / nps] {
                l if l < 0 => 0.0,
                l => data[(l as usize * nps + p % nps) * nv + k],
            })
            .collect()
    };
    let col = |k: usize| SubmapColumn {
        data: &data,
        n_value: nv,
        value: k,
        n_pix_submap: nps,
        global2local: &g2l,
        n_pix: npix,
    };
    let extra = toast_extra_header(1.0, 2.0, 2, 2, "3.0.6");
    let strip = |p: &Path| -> Vec<u8> {
        let mut b = std::fs::read(p).unwrap();
        for card in (0..b.len()).step_by(80) {
            if b[card..].starts_with(b"CREATED ") {
                b[card..card + 80].fill(b' ');
            }
        }
        b
    };
    for prec in [MapPrecision::F32, MapPrecision::F64] {
        let comps: Vec<Vec<f64>> = (0..nv).map(full).collect();
        let slices: Vec<&[f64]> = comps.iter().map(Vec::as_slice).collect();
        let (a, b) = (dir.join("full.fits"), dir.join("submaps.fits"));
        write_float_maps(&a, Ordering::Nested, &slices, Some("K"), prec, &extra).unwrap();
        let cols: Vec<ColumnSource<'_>> =
            (0..nv).map(|k| ColumnSource::SubmapsF64(col(k))).collect();
        write_float_columns(&b, Ordering::Nested, &cols, Some("K"), prec, &extra).unwrap();
        assert_eq!(strip(&a), strip(&b), "{prec:?}");
    }
    let hits_full: Vec<i64> = (0..npix)
        .map(|p| match g2l[p / nps] {
            l if l < 0 => 0,
            l => hits[l as usize * nps + p % nps],
        })
        .collect();
    let hcol = SubmapColumn {
        data: &hits,
        n_value: 1,
        value: 0,
        n_pix_submap: nps,
        global2local: &g2l,
        n_pix: npix,
    };
    let (a, b) = (dir.join("hits_full.fits"), dir.join("hits_submaps.fits"));
    write_hits_map(&a, Ordering::Nested, &hits_full, &extra).unwrap();
    write_hits_column(&b, Ordering::Nested, ColumnSource::SubmapsI64(hcol), &extra).unwrap();
    assert_eq!(strip(&a), strip(&b));
    // Hits too large for int32 are refused as from a full-sky slice.
    let big = vec![i64::from(i32::MAX) + 1; 3 * nps];
    let err = write_hits_column(
        &b,
        Ordering::Nested,
        ColumnSource::SubmapsI64(SubmapColumn { data: &big, ..hcol }),
        &[],
    )
    .unwrap_err();
    assert!(err.to_string().contains("int32"), "{err}");
    // A local index past the stored submaps, or a value past n_value.
    let short = &data[..2 * nps * nv];
    for bad in [
        SubmapColumn {
            data: short,
            ..col(0)
        },
        SubmapColumn { value: 3, ..col(0) },
        SubmapColumn {
            global2local: &g2l[..11],
            ..col(0)
        },
    ] {
        let err = write_float_columns(
            &b,
            Ordering::Nested,
            &[ColumnSource::SubmapsF64(bad)],
            None,
            MapPrecision::F64,
            &[],
        )
        .unwrap_err();
        assert!(matches!(err, FitsError::InvalidInput { .. }), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// An integer column's `TNULLn` values are undefined pixels ([`UNSEEN`]);
/// a `TSCALn`/`TZEROn` that is not a finite number, or a `TNULLn` of an
/// integer column that is not an integer, is refused naming the keyword
/// (each was read as absent: the column used unscaled, nulls as numbers).
#[test]
fn integer_nulls_are_unseen_and_malformed_scaling_is_refused() {
    let dir = scratch("tnull");
    let nside = 2u64;
    let n = (12 * nside * nside) as usize;
    let col: Vec<i32> = (0..n as i32)
        .map(|p| if p % 5 == 0 { -7 } else { p })
        .collect();
    let columns: Vec<WriteColumn<'_>> = ["I", "Q", "U"]
        .iter()
        .map(|name| WriteColumn {
            name,
            unit: Some("K"),
            format: ColumnFormat::I32,
            data: ColumnSource::I32(&col),
        })
        .collect();
    let write = |name: &str, extra: &[HeaderCard]| {
        let path = dir.join(name);
        write_healpix_map(&path, Ordering::Nested, &columns, extra).unwrap();
        path
    };
    // TNULL1 only: column 1's -7s are undefined, column 2's are numbers.
    let path = write(
        "tnull.fits",
        &[
            HeaderCard::int("TNULL1", -7, "undefined value"),
            HeaderCard::float("TSCAL2", 2.0, "scale"),
            HeaderCard::int("TZERO2", 1, "offset"),
        ],
    );
    let m = read_healpix_map(&path, None).unwrap();
    for (p, &c) in col.iter().enumerate() {
        let (v, expect_null) = (m.fields[0].data[p], c == -7);
        assert_eq!(v == UNSEEN, expect_null, "pixel {p}: {v}");
        if !expect_null {
            assert_eq!(v, c as f64);
        }
        assert_eq!(m.fields[1].data[p], 1.0 + 2.0 * c as f64);
        assert_eq!(m.fields[2].data[p], c as f64);
    }
    for (file, card, expect) in [
        (
            "tscal_str.fits",
            HeaderCard::string("TSCAL1", "abc", ""),
            "TSCAL1 = 'abc': not a finite number",
        ),
        (
            "tzero_bool.fits",
            HeaderCard::new("TZERO3", HeaderValue::Bool(true), None),
            "TZERO3 = T: not a finite number",
        ),
        (
            "tnull_str.fits",
            HeaderCard::string("TNULL2", "-7", ""),
            "TNULL2 = '-7': not an integer",
        ),
        (
            "tnull_frac.fits",
            HeaderCard::float("TNULL1", 0.5, ""),
            "TNULL1 = 0.5: not an integer",
        ),
    ] {
        let path = write(file, &[card]);
        let err = read_healpix_map(&path, None).unwrap_err();
        assert!(matches!(err, FitsError::BadHeader { .. }), "{file}: {err}");
        assert!(err.to_string().contains(expect), "{file}: {err}");
        // The reason alone leaves out the path (callers name it).
        assert!(!err.reason().contains(&path.display().to_string()), "{err}");
        assert!(err.reason().contains(expect), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A partial-sky map that lists a pixel twice is refused (one of the two
/// values was kept without a word).
#[test]
fn partial_sky_pixel_listed_twice_is_refused() {
    let dir = scratch("partial-dup");
    let mut bytes = std::fs::read(data("hp_iqu_nest_partial_D_n8.fits")).unwrap();
    // Rows of 26 bytes from the third block: PIXEL (int16) first.
    let (data_start, row) = (2 * 2880, 26);
    let first = [bytes[data_start], bytes[data_start + 1]];
    bytes[data_start + row..data_start + row + 2].copy_from_slice(&first);
    let path = dir.join("dup.fits");
    std::fs::write(&path, &bytes).unwrap();
    let err = read_healpix_map(&path, None).unwrap_err();
    assert!(
        err.to_string().contains("PIXEL entry 1 = ") && err.to_string().contains("repeats"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
