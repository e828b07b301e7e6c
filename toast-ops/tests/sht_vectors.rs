//! Compares `toast_ops::math::sht` synthesis with `healpy.alm2map` values sampled by
//! `tests/data/make_sht_vectors.py` (deterministic a_lm formula mirrored here).

use std::path::PathBuf;

use toast_ops::math::sht::{alm2map, Alm, Complex64};

/// The a_lm formula of make_sht_vectors.py.
fn alm_formula(lmax: usize, which: char) -> Alm {
    let mut alm = Alm::zeros(lmax);
    for m in 0..=lmax {
        for l in m..=lmax {
            let (lf, mf) = (l as f64, m as f64);
            let damp = 1.0 / (1.0 + 0.01 * lf);
            let (re, im) = match which {
                'T' => (
                    (1.7 * lf + 2.3 * mf + 0.3).sin(),
                    (0.9 * lf - 1.1 * mf + 0.2).cos(),
                ),
                'E' => (
                    (1.3 * lf + 0.5 * mf).cos(),
                    (2.1 * lf + 0.7 * mf + 1.0).sin(),
                ),
                _ => (
                    (0.6 * lf - 1.9 * mf + 0.4).sin(),
                    (1.1 * lf + 0.3 * mf).cos(),
                ),
            };
            let mut a = Complex64::new(re * damp, im * damp);
            if m == 0 {
                a.im = 0.0;
            }
            if which != 'T' && l < 2 {
                a = Complex64::new(0.0, 0.0);
            }
            alm.set(l, m, a);
        }
    }
    alm
}

struct Case {
    nside: u64,
    lmax_t: usize,
    lmax_p: usize,
    maxabs: [f64; 3],
    rows: Vec<(usize, [f64; 3])>,
}

fn load(name: &str) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.lines();
    let h: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let mx: Vec<f64> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .skip(2)
        .map(|s| s.parse().unwrap())
        .collect();
    let rows = lines
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            (
                v[0].parse().unwrap(),
                [
                    v[1].parse().unwrap(),
                    v[2].parse().unwrap(),
                    v[3].parse().unwrap(),
                ],
            )
        })
        .collect();
    Case {
        nside: h[2].parse().unwrap(),
        lmax_t: h[4].parse().unwrap(),
        lmax_p: h[6].parse().unwrap(),
        maxabs: [mx[0], mx[1], mx[2]],
        rows,
    }
}

fn check(name: &str) {
    let c = load(name);
    let t = alm_formula(c.lmax_t, 'T');
    let e = alm_formula(c.lmax_p, 'E');
    let b = alm_formula(c.lmax_p, 'B');
    let maps = alm2map(c.nside, Some(&t), Some((&e, &b))).unwrap();
    let got = [maps.t.unwrap(), maps.q.unwrap(), maps.u.unwrap()];
    let mut worst = [0.0f64; 3];
    for (p, vals) in &c.rows {
        for i in 0..3 {
            let d = (got[i][*p] - vals[i]).abs() / c.maxabs[i];
            worst[i] = worst[i].max(d);
        }
    }
    println!(
        "{name}: max |diff| / max|map|: T {:.2e} Q {:.2e} U {:.2e}",
        worst[0], worst[1], worst[2]
    );
    for (i, w) in worst.iter().enumerate() {
        assert!(
            *w < 1e-11,
            "{name}: component {i} relative difference {w:e}"
        );
    }
}

#[test]
fn matches_healpy_nside64() {
    check("sht_n64.txt");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "~40 s unoptimised (0.3 s with --release); run with --release"
)]
fn matches_healpy_nside256() {
    check("sht_n256.txt");
}

#[test]
fn matches_healpy_aliased_lmax_and_distinct_t_lmax() {
    check("sht_n32_alias.txt");
}

/// With `TOAST_OPS_SHT_OUT=DIR`, writes full RING float64 maps of the formula
/// a_lm (nside 64 and 256) for `tests/data/check_sht_with_healpy.py`, which
/// compares every pixel with healpy.alm2map. Without it, does nothing.
#[test]
fn write_full_maps_for_healpy_check() {
    use toast_ops::io::fits::{write_iqu_map, MapPrecision, Ordering};
    let Some(dir) = std::env::var_os("TOAST_OPS_SHT_OUT") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (nside, lmax) in [(64u64, 191usize), (256, 767)] {
        let t = alm_formula(lmax, 'T');
        let e = alm_formula(lmax, 'E');
        let b = alm_formula(lmax, 'B');
        let m = alm2map(nside, Some(&t), Some((&e, &b))).unwrap();
        let (t, q, u) = (m.t.unwrap(), m.q.unwrap(), m.u.unwrap());
        let path = dir.join(format!("rs_alm2map_n{nside}_l{lmax}.fits"));
        write_iqu_map(
            &path,
            Ordering::Ring,
            [&t, &q, &u],
            "K",
            MapPrecision::F64,
            &[],
        )
        .unwrap();
    }
}
