//! The map-maker against TOAST 3.0.6's own `MapMaker` on identical inputs.
//!
//! The inputs (a synthetic scan with a sky, many baselines, white noise and
//! flags) are made here; `export_inputs_for_toast` writes them, and
//! `toast-ops/scripts/mapmaker_vs_toast.py` runs TOAST's `MapMaker` (with
//! `BinMap`, an `Offset` template and `PixelsHealpix`/`StokesWeights`) on
//! them and writes its products into `tests/data/mapmaker_toast/`, which is
//! committed. `agrees_with_toast` rebuilds the same inputs, runs ours, and
//! compares. To regenerate:
//!
//! ```text
//! TOAST_REF_DIR=/tmp/mm cargo test -p toast-ops --test toast_reference -- --ignored export
//! env/bin/python toast-ops/scripts/mapmaker_vs_toast.py /tmp/mm toast-ops/tests/data/mapmaker_toast
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use toast_core::observation::defaults;
use toast_core::Data;
use toast_ops::exec::global_data::HostArray;
use toast_ops::ops::{PixelsHealpixConfig, StokesMode, StokesWeightsConfig, WhiteNoiseWeights};
use toast_ops::templates::OffsetConfig;
use toast_ops::{MapMaker, MapMakerSetup, PixelData};
use toast_testkit::plugins::{context, registry};
use toast_testkit::scan::{add_offsets, hash01, make_data, make_sky, scan_sky, Scan};

const NSIDE: i64 = 16;
const NSIDE_SUBMAP: i64 = 4;
const STEP_TIME: f64 = 25.0;
const RCOND: f64 = 1e-3;

fn scan() -> Scan {
    Scan::default()
}

/// The inputs: sky + offsets + white noise, with detector and shared flags.
fn inputs() -> Data {
    let scan = scan();
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = make_data(&scan);
    make_sky(&mut data, NSIDE, NSIDE_SUBMAP);
    scan_sky(&mut data, &mut ctx, NSIDE, NSIDE_SUBMAP);
    data.meta.remove("sky");
    data.meta.remove("sky_dist");
    add_offsets(&mut data, 250, 2.0);
    for (o, ob) in data.obs.iter_mut().enumerate() {
        let n = ob.n_samples();
        let sig = ob.detdata.get_mut(defaults::DET_DATA).unwrap();
        for (i, x) in sig.data_mut::<f64>().unwrap().iter_mut().enumerate() {
            *x += 0.05 * hash01(500 + o as u64, i as u64);
        }
        // Shared: a short invalid stretch and a flag outside the masks.
        let shared: Vec<u8> = (0..n)
            .map(|s| match s {
                1000..=1049 => defaults::SHARED_MASK_INVALID,
                s if s % 97 == 0 => 64,
                _ => 0,
            })
            .collect();
        ob.shared.set(defaults::SHARED_FLAGS, &[], &shared).unwrap();
        // Detector flags: one detector with a long cut (more than half of a
        // baseline, so that amplitude is flagged), scattered cuts elsewhere.
        let dets = ob.local_detectors().to_vec();
        let f = ob.detdata.get_mut(defaults::DET_FLAGS).unwrap();
        for (d, name) in dets.iter().enumerate() {
            for (s, x) in f.row_of_mut::<u8>(name).unwrap().iter_mut().enumerate() {
                if (d == 1 && (2000..2200).contains(&s)) || hash01(900 + d as u64, s as u64) > 0.97
                {
                    *x = defaults::DET_MASK_INVALID;
                }
            }
        }
    }
    data
}

fn setup() -> MapMakerSetup {
    let mut s = MapMakerSetup {
        pixels: PixelsHealpixConfig {
            nside: toast_ops::math::healpix::Nside::try_from(NSIDE).unwrap(),
            nside_submap: toast_ops::math::healpix::Nside::try_from(NSIDE_SUBMAP).unwrap(),
            ..PixelsHealpixConfig::default()
        },
        weights: StokesWeightsConfig {
            mode: StokesMode::IQU,
            ..StokesWeightsConfig::default()
        },
        baselines: OffsetConfig {
            step_time: STEP_TIME,
            ..OffsetConfig::default()
        },
        ..MapMakerSetup::default()
    };
    s.binner.pixel_dist = "pix_dist".into();
    s.mapmaker.solve_rcond_threshold = RCOND;
    s.mapmaker.map_rcond_threshold = RCOND;
    s.mapmaker.keep_solver_products = true;
    s
}

fn write_raw<T: bytemuck::Pod>(dir: &Path, name: &str, v: &[T]) {
    std::fs::write(dir.join(format!("{name}.bin")), bytemuck::cast_slice(v)).unwrap();
}

#[test]
#[ignore = "writes the inputs for scripts/mapmaker_vs_toast.py"]
fn export_inputs_for_toast() {
    let dir = PathBuf::from(std::env::var("TOAST_REF_DIR").expect("set TOAST_REF_DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let data = inputs();
    let ob0 = &data.obs[0];
    let dets = ob0.local_detectors().to_vec();
    let quats: Vec<f64> = dets
        .iter()
        .flat_map(|d| ob0.detector(d).unwrap().quat)
        .collect();
    let w = WhiteNoiseWeights::from_net(ob0).unwrap();
    let weights: Vec<f64> = dets.iter().map(|d| w.weights[d]).collect();
    write_raw(&dir, "fp_quats", &quats);
    write_raw(&dir, "fp_weights", &weights);
    let mut obs = Vec::new();
    for ob in &data.obs {
        let n = ob.name();
        write_raw(
            &dir,
            &format!("{n}_times"),
            ob.shared.data::<f64>("times").unwrap(),
        );
        write_raw(
            &dir,
            &format!("{n}_boresight"),
            ob.shared.data::<f64>("boresight_radec").unwrap(),
        );
        write_raw(
            &dir,
            &format!("{n}_shared_flags"),
            ob.shared.data::<u8>("flags").unwrap(),
        );
        write_raw(
            &dir,
            &format!("{n}_signal"),
            ob.detdata.get("signal").unwrap().data::<f64>().unwrap(),
        );
        write_raw(
            &dir,
            &format!("{n}_det_flags"),
            ob.detdata.get("flags").unwrap().data::<u8>().unwrap(),
        );
        obs.push(format!("\"{n}\""));
    }
    let names: Vec<String> = dets.iter().map(|d| format!("\"{d}\"")).collect();
    let manifest = format!(
        "{{\"detectors\": [{}], \"observations\": [{}], \"n_samples\": {}, \"rate\": {}, \
         \"nside\": {NSIDE}, \"nside_submap\": {NSIDE_SUBMAP}, \"step_time\": {STEP_TIME}, \
         \"rcond\": {RCOND}}}",
        names.join(", "),
        obs.join(", "),
        ob0.n_samples(),
        ob0.sample_rate()
    );
    let mut f = std::fs::File::create(dir.join("manifest.json")).unwrap();
    f.write_all(manifest.as_bytes()).unwrap();
}

fn read_raw<T: bytemuck::Pod + Default + Clone>(path: &Path) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut v = vec![T::default(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut(&mut v).copy_from_slice(&bytes);
    v
}

fn reference(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/mapmaker_toast")
        .join(name)
}

#[test]
fn agrees_with_toast() {
    let reg = registry(2);
    let mut ctx = context(&reg, "");
    let mut data = inputs();
    let mut mm = MapMaker::new(setup()).unwrap();
    let res = mm.run(&mut data, &mut ctx).unwrap();
    let info = std::fs::read_to_string(reference("info.json")).unwrap();
    eprintln!("TOAST: {info}");
    eprintln!(
        "ours: {} iterations, {} amplitudes, {} flagged, residuals {:?}",
        res.iterations, res.n_amplitudes, res.n_flagged_amplitudes, res.residuals
    );
    let field = |key: &str| -> i64 {
        let k = format!("\"{key}\": ");
        let i = info
            .find(&k)
            .unwrap_or_else(|| panic!("{key} not in info.json"))
            + k.len();
        info[i..]
            .split(|c: char| !(c.is_ascii_digit() || c == '-'))
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(res.n_amplitudes as i64, field("n_amplitudes"));
    assert_eq!(res.n_flagged_amplitudes as i64, field("n_flagged"));
    assert!(
        res.n_flagged_amplitudes > 0,
        "the test flags at least one amplitude"
    );
    assert_eq!(res.solver_cut_samples as i64, field("solver_cut"));

    let full = |key: &str| {
        data.meta
            .object::<PixelData<f64>>(key)
            .unwrap()
            .to_full_sky()
    };
    // Hits: exactly.
    let hits = data
        .meta
        .object::<PixelData<i64>>(&res.hits)
        .unwrap()
        .to_full_sky();
    assert_eq!(hits, read_raw::<i64>(&reference("hits.bin")), "hits");
    // rcond and covariance: to rounding.
    let close = |name: &str, ours: &[f64], theirs: &[f64], rtol: f64, atol: f64| {
        assert_eq!(ours.len(), theirs.len(), "{name}: length");
        let mut worst = 0.0f64;
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            let e = (a - b).abs();
            worst = worst.max(e);
            assert!(
                e <= atol + rtol * b.abs(),
                "{name}[{i}]: ours {a}, TOAST {b}"
            );
        }
        eprintln!("{name}: worst absolute difference {worst:e}");
    };
    close(
        "rcond",
        &full(&res.rcond),
        &read_raw(&reference("rcond.bin")),
        1e-9,
        1e-12,
    );
    close(
        "cov",
        &full(&res.cov),
        &read_raw(&reference("cov.bin")),
        1e-9,
        1e-12,
    );
    close(
        "binmap",
        &full(res.binmap.as_ref().unwrap()),
        &read_raw(&reference("binmap.bin")),
        1e-10,
        1e-10,
    );
    // The solve: both converge to 1e-12 in ‖r‖²; the amplitudes and map
    // agree to the solution's accuracy.
    let amps = &data
        .meta
        .object::<HostArray<f64>>(res.amplitudes.as_ref().unwrap())
        .unwrap()
        .values;
    close(
        "amplitudes",
        amps,
        &read_raw(&reference("amplitudes.bin")),
        0.0,
        1e-5,
    );
    close(
        "map",
        &full(&res.map),
        &read_raw(&reference("map.bin")),
        0.0,
        1e-5,
    );
    let toast_iters = field("iterations");
    assert!(
        (res.iterations as i64 - toast_iters).abs() <= 1,
        "ours {} iterations, TOAST {toast_iters}",
        res.iterations
    );
}
