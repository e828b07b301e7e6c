//! Comparing the map files of two runs.

use std::path::Path;
use toast_ops::io::fits::read_healpix_map;

/// Largest |a - b| over the largest |b|, per field of two map files (same
/// resolution and fields); 0 for every field when they are identical.
pub fn compare_maps(a: &Path, b: &Path) -> Vec<f64> {
    let ma = read_healpix_map(a, None).unwrap();
    let mb = read_healpix_map(b, None).unwrap();
    assert_eq!(ma.nside, mb.nside, "{} vs {}", a.display(), b.display());
    assert_eq!(ma.fields.len(), mb.fields.len());
    ma.fields
        .iter()
        .zip(&mb.fields)
        .map(|(fa, fb)| {
            assert_eq!(fa.data.len(), fb.data.len());
            let scale = fb.data.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            let diff = fa
                .data
                .iter()
                .zip(&fb.data)
                .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
            if scale > 0.0 {
                diff / scale
            } else {
                diff
            }
        })
        .collect()
}
