//! `toast-cli compare DIR_A DIR_B`: the exit status and the lines for maps
//! that agree, maps beyond the tolerances, hits that differ, a file on one
//! side only, and input that cannot be compared.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;
use toast_ops::io::fits::{
    write_healpix_map, write_hits_map, write_iqu_map, ColumnFormat, ColumnSource, MapPrecision,
    Ordering, WriteColumn,
};
use toast_testkit::process::{self, text};

/// `toast-cli compare ARGS`, within a minute.
fn compare(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toast-cli"));
    cmd.arg("compare").args(args);
    process::run_with_deadline(cmd, Duration::from_secs(60), &format!("compare {args:?}"))
}

/// A run's maps at nside 1 (12 pixels): hits and an I/Q/U map, the map
/// scaled by `1 + map_change` in pixel 5 and the hits of pixel 3 raised by
/// `extra_hits`.
fn write_run(dir: &Path, map_change: f64, extra_hits: i64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut hits: Vec<i64> = (0..12).map(|p| 10 + p).collect();
    hits[3] += extra_hits;
    write_hits_map(
        &dir.join("mapmaker_hits.fits"),
        Ordering::Nested,
        &hits,
        &[],
    )
    .unwrap();
    let map = |scale: f64| -> Vec<f64> {
        (0..12)
            .map(|p| {
                let v = scale * (1.0 + p as f64);
                if p == 5 {
                    v * (1.0 + map_change)
                } else {
                    v
                }
            })
            .collect()
    };
    let (i, q, u) = (map(1.0), map(0.1), map(-0.1));
    write_iqu_map(
        &dir.join("mapmaker_map.fits"),
        Ordering::Nested,
        [&i, &q, &u],
        "K",
        MapPrecision::F64,
        &[],
    )
    .unwrap();
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn maps_that_agree_exit_0_and_differences_exit_1() {
    let root = process::scratch("toast-cli-compare", "agree");
    let (a, same, near, far, hits) = (
        root.join("a"),
        root.join("same"),
        root.join("near"),
        root.join("far"),
        root.join("hits"),
    );
    write_run(&a, 0.0, 0);
    write_run(&same, 0.0, 0);
    write_run(&near, 1e-9, 0);
    write_run(&far, 1e-2, 0);
    write_run(&hits, 0.0, 1);

    let o = compare(&[path(&a), path(&same)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("MAPS MATCH: 2 files, 4 columns"),
        "{}",
        text(&o)
    );

    let o = compare(&[path(&a), path(&near)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // Pixel 5 of 12 changed by 1%: max rel 6/12 * 1e-2 = 5e-3 of I.
    let o = compare(&[path(&a), path(&far)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("mapmaker_map.fits TEMPERATURE: max rel 5.00e-3")
            && out.contains("DIFFER")
            && out.contains("MAPS DIFFER: 1 of 2 files (mapmaker_map.fits)"),
        "{out}"
    );
    // The same maps pass with looser tolerances.
    let o = compare(&[
        path(&a),
        path(&far),
        "--max-rel",
        "1e-2",
        "--rms-rel",
        "1e-2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // One hit more: hits are compared exactly.
    let o = compare(&[path(&a), path(&hits), "--max-rel", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("mapmaker_hits.fits T: hits 186 / 187, 1 pixels differ  DIFFER"),
        "{}",
        text(&o)
    );

    // NaN in the same pixel of both runs: two failed runs do not agree.
    let (nan_a, nan_b) = (root.join("nan_a"), root.join("nan_b"));
    write_run(&nan_a, f64::NAN, 0);
    write_run(&nan_b, f64::NAN, 0);
    let o = compare(&[path(&nan_a), path(&nan_b)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("mapmaker_map.fits TEMPERATURE: max rel 0.00e0, rms rel 0.00e0, 1 pixels NaN or infinite  DIFFER")
            && out.contains("MAPS DIFFER: 1 of 2 files (mapmaker_map.fits)"),
        "{out}"
    );

    // A map on one side only.
    std::fs::remove_file(same.join("mapmaker_map.fits")).unwrap();
    let o = compare(&[path(&a), path(&same)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("mapmaker_map.fits: only in"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn input_that_cannot_be_compared_exits_2() {
    let root = process::scratch("toast-cli-compare", "bad");
    let (a, empty, junk) = (root.join("a"), root.join("empty"), root.join("junk"));
    write_run(&a, 0.0, 0);
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("mapmaker_map.fits"), b"not a FITS file").unwrap();
    // A directory under a map's name: not taken for a map missing there.
    let odd = root.join("odd");
    write_run(&odd, 0.0, 0);
    std::fs::remove_file(odd.join("mapmaker_map.fits")).unwrap();
    std::fs::create_dir_all(odd.join("mapmaker_map.fits")).unwrap();

    // A run's stats.json that lists a map which is not there.
    let lost = root.join("lost");
    write_run(&lost, 0.0, 0);
    std::fs::write(
        lost.join("stats.json"),
        r#"{"outputs": ["x/lost/gone/mapmaker_map.fits", "x/lost/stats.json"]}"#,
    )
    .unwrap();

    let missing = root.join("missing");
    for (args, words) in [
        (
            vec![path(&a), path(&missing)],
            vec!["cannot read directory", "missing"],
        ),
        (vec![path(&empty), path(&empty)], vec!["nothing to compare"]),
        (
            vec![path(&a), path(&junk)],
            vec!["comparing mapmaker_map.fits", "not a FITS file"],
        ),
        (
            vec![path(&a), path(&odd)],
            vec!["mapmaker_map.fits: not a regular file"],
        ),
        (
            vec![path(&a), path(&a), "--max-rel=-1"],
            vec!["--max-rel -1"],
        ),
        (
            vec![path(&a), path(&lost)],
            vec![
                "stats.json: lists",
                "gone/mapmaker_map.fits, which is not a regular file",
            ],
        ),
    ] {
        let o = compare(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        for w in words {
            assert!(text(&o).contains(w), "{args:?}: no {w:?} in {}", text(&o));
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A run's directory holds the maps its stats.json lists, wherever its
/// maps directory (`mapmaker.output_dir`) put them; maps an earlier run
/// left beside them are not compared (a line counts them).
#[test]
fn a_runs_maps_are_those_its_stats_list() {
    let root = process::scratch("toast-cli-compare", "stats");
    let (a, b) = (root.join("a"), root.join("b"));
    write_run(&a, 0.0, 0);
    // An earlier run's maps in b, 1% off, and this run's in b/sub, the
    // same as a's; stats.json names them under the directory as the run
    // was given it (here `runs/b`).
    write_run(&b, 1e-2, 0);
    write_run(&b.join("sub"), 0.0, 0);
    std::fs::write(
        b.join("stats.json"),
        r#"{"outputs": ["runs/b/sub/mapmaker_hits.fits", "runs/b/sub/mapmaker_map.fits",
            "runs/b/timing.csv", "runs/b/stats.json"]}"#,
    )
    .unwrap();
    let o = compare(&[path(&a), path(&b)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("2 *.fits not among its stats.json's outputs (an earlier run's) left out")
            && out.contains("MAPS MATCH: 2 files, 4 columns"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A hits map of floats (a map column written where the counts belong) is
/// named as such and differs, whatever its values; the totals of hits are
/// never written with dozens of digits.
#[test]
fn a_hits_map_of_floats_differs_by_its_type() {
    let root = process::scratch("toast-cli-compare", "hits-type");
    let (a, b) = (root.join("a"), root.join("b"));
    write_run(&a, 0.0, 0);
    write_run(&b, 0.0, 0);
    // The same column `T` and the same counts as a_hits, as float32.
    let float_hits = |dir: &Path, value: f32| {
        let counts: Vec<f32> = (0..12).map(|p| value + p as f32).collect();
        write_healpix_map(
            &dir.join("mapmaker_hits.fits"),
            Ordering::Nested,
            &[WriteColumn {
                name: "T",
                unit: None,
                format: ColumnFormat::F32,
                data: ColumnSource::F32(&counts),
            }],
            &[],
        )
        .unwrap();
    };
    float_hits(&b, 10.0);
    let o = compare(&[path(&a), path(&b)]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains(
            "mapmaker_hits.fits T: column type E in a hits map (hits are counts: an integer \
             column B, I, J or K)  DIFFER"
        ),
        "{t}"
    );
    // Both sides floats of 3.4e38: still not hits, and no 39-digit totals.
    float_hits(&a, 3.4e38);
    float_hits(&b, 3.4e38);
    let o = compare(&[path(&a), path(&b)]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("mapmaker_hits.fits T: column type E and E in a hits map"),
        "{t}"
    );
    assert!(!t.contains("000000000000"), "{t}");
}

/// Maps of huge finite values are compared by their ratios, without the
/// squares overflowing: 1e300 against 1e300 (1 + 1e-6) is within 1e-5.
#[test]
fn huge_maps_compare_by_their_ratios() {
    let root = process::scratch("toast-cli-compare", "huge");
    let (a, b) = (root.join("a"), root.join("b"));
    for (dir, scale) in [(&a, 1.0), (&b, 1.0 + 1e-6)] {
        write_run(dir, 0.0, 0);
        let m: Vec<f64> = (0..12).map(|p| scale * 1e300 * (1.0 + p as f64)).collect();
        write_iqu_map(
            &dir.join("mapmaker_map.fits"),
            Ordering::Nested,
            [&m, &m, &m],
            "K",
            MapPrecision::F64,
            &[],
        )
        .unwrap();
    }
    let o = compare(&[path(&a), path(&b)]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("rms rel 1.00e-6"), "{t}");
}
