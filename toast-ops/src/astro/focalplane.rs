//! TOAST's fake hexagonal focal plane (`fake_hexagon_focalplane`) and the
//! benchmark's truncation of it (`make_focalplane`).
//!
//! # Layout (`toast.instrument_sim.hex_layout`)
//!
//! `n_pix = 1 + 3 R (R + 1)` pixel positions are packed in `R` rings around a
//! central pixel. Pixel 0 is the centre; ring `r ≥ 1` holds `6 r` pixels,
//! numbered counter-clockwise in six 60° sectors of `r` steps each. For the
//! `s`-th step of sector `k` in ring `r`:
//!
//! ```text
//! relang = atan2(s − r/2, r √3/2)
//! angle  = k·60° + 30° + relang
//! dist   = (√3/2) d r / cos(relang),   d = width / (2 n_rings − 2)
//! ξ = sin(dist) cos(angle),   η = sin(dist) sin(angle)
//! ```
//!
//! where `width` is the vertex-to-vertex width of the hexagon and `n_rings =
//! R + 1` counts the centre as a ring. Each pixel holds two orthogonal
//! detectors: `A` with polarisation angle γ = 0° or 45° (alternating with
//! the parity of the pixel's hex *column*, `hex_gamma_angles_qu`) and `B`
//! with γ + 90°. The detector quaternion is `xieta_to_quat(ξ, η, γ)`:
//! `θ = asin(√(ξ² + η²))`, `φ = atan2(−ξ, −η)`, `ψ = γ − φ`,
//! `q = from_iso_angles(θ, φ, ψ)` (see [`crate::math::qarray`]).
//!
//! Detectors are named `D{pixel:0N}{A|B}-150` (N = number of decimal digits
//! of `n_pix`), sorted by name (so A/B pairs are adjacent and pixels run
//! from the centre outwards), and grouped by `pixel = D{pixel:0N}` (the
//! benchmark's detector-set key). `psi_pol` is 0 for A and π/2 for B, and
//! `pol_angle = atan2(2 w z, w² − z²) mod π` is derived from the quaternion
//! as `Focalplane._get_pol_angles` does. UIDs are `name_UID(name)`.
//!
//! # Benchmark focal plane (`make_focalplane`)
//!
//! For `n_det` detectors, `R = ceil(sqrt((n_det − 2)/6))` rings,
//! `n_pix = 1 + 3R(R+1)`, width 10°, 100 Hz, NET 50 µK√s, f_min 1e-5 Hz,
//! f_knee 0.05 Hz, α 1, FWHM 10′, band 150 ± 10 GHz, ε 0; the table is then
//! truncated to its first `n_det` rows (the innermost pixels), keeping the
//! field of view `1.1 (width + 2 FWHM)` of the full hexagon. The layout
//! agrees with TOAST 3.0.6 to 1e-15 for the tiny (12) and xsmall (138)
//! cases (`tests::matches_toast`).

use crate::math::qarray::{self, Quat};
use std::f64::consts::PI;
use toast_core::uid::name_uid;

/// Errors from focal-plane construction.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FocalplaneError {
    /// `n_pix` is not `1 + 3R(R+1)`.
    #[error("{n_pix} is not a valid number of pixels for a hexagonal layout (1, 7, 19, 37, ...)")]
    NotHexagonal {
        /// The requested number of pixels.
        n_pix: usize,
    },
    /// A pixel index beyond the layout.
    #[error("hex position {pos} out of range for {n_pos} positions")]
    PositionOutOfRange {
        /// Requested position.
        pos: usize,
        /// Number of positions.
        n_pos: usize,
    },
    /// An invalid scalar parameter.
    #[error("invalid focalplane parameter {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name.
        name: &'static str,
        /// Offending value.
        value: f64,
        /// Why.
        reason: &'static str,
    },
}

/// One detector of the focal plane (one row of TOAST's detector table).
#[derive(Debug, Clone, PartialEq)]
pub struct Detector {
    /// Detector name, e.g. `D03B-150`.
    pub name: String,
    /// `name_UID(name)`.
    pub uid: u32,
    /// Pixel name (the detector-set key), e.g. `D03`.
    pub pixel: String,
    /// Index of the pixel in the hexagon (0 = centre).
    pub pixel_index: usize,
    /// Rotation from the focal-plane frame to the detector frame.
    pub quat: Quat,
    /// Polarisation angle γ in the ξ/η/γ system (rad).
    pub gamma: f64,
    /// Rotation from the beam frame to the polarisation direction (rad).
    pub psi_pol: f64,
    /// Polarisation angle derived from the quaternion (rad, in `[0, π)`).
    pub pol_angle: f64,
    /// Cross-polar leakage ε.
    pub pol_leakage: f64,
    /// Polarisation efficiency `(1 − ε)/(1 + ε)`.
    pub pol_efficiency: f64,
    /// Beam FWHM (arcmin).
    pub fwhm_arcmin: f64,
    /// Band centre (GHz).
    pub bandcenter_ghz: f64,
    /// Band width (GHz).
    pub bandwidth_ghz: f64,
    /// Noise-equivalent temperature (K √s).
    pub psd_net: f64,
    /// Knee frequency (Hz).
    pub psd_fknee: f64,
    /// Spectral slope α (positive).
    pub psd_alpha: f64,
    /// Low-frequency roll-off (Hz).
    pub psd_fmin: f64,
}

/// A focal plane: detectors (sorted by name), sample rate and field of view.
#[derive(Debug, Clone, PartialEq)]
pub struct Focalplane {
    /// Detectors in table order.
    pub detectors: Vec<Detector>,
    /// Nominal sample rate (Hz).
    pub sample_rate: f64,
    /// Angular diameter of the field of view (rad).
    pub field_of_view: f64,
}

impl Focalplane {
    /// Detector sets keyed by pixel (`detset_key="pixel"`): pixel names in
    /// order of first appearance, each with the indices of its detectors.
    pub fn detector_sets_by_pixel(&self) -> Vec<(String, Vec<usize>)> {
        let mut sets: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, d) in self.detectors.iter().enumerate() {
            match sets.iter_mut().find(|(p, _)| *p == d.pixel) {
                Some((_, v)) => v.push(i),
                None => sets.push((d.pixel.clone(), vec![i])),
            }
        }
        sets
    }

    /// Detector names in table order.
    pub fn names(&self) -> Vec<&str> {
        self.detectors.iter().map(|d| d.name.as_str()).collect()
    }
}

/// Parameters of [`fake_hexagon_focalplane`] (TOAST's defaults via
/// [`Default`], except where the benchmark overrides them).
#[derive(Debug, Clone, PartialEq)]
pub struct HexFocalplaneParams {
    /// Number of pixels, `1 + 3R(R+1)`.
    pub n_pix: usize,
    /// Vertex-to-vertex width of the hexagon of pixel centres (rad).
    pub width: f64,
    /// Sample rate (Hz).
    pub sample_rate: f64,
    /// Cross-polar leakage.
    pub epsilon: f64,
    /// Beam FWHM (arcmin).
    pub fwhm_arcmin: f64,
    /// Band centre (GHz).
    pub bandcenter_ghz: f64,
    /// Band width (GHz).
    pub bandwidth_ghz: f64,
    /// NET (K √s).
    pub psd_net: f64,
    /// f_min (Hz).
    pub psd_fmin: f64,
    /// α.
    pub psd_alpha: f64,
    /// f_knee (Hz).
    pub psd_fknee: f64,
}

impl Default for HexFocalplaneParams {
    fn default() -> Self {
        Self {
            n_pix: 7,
            width: 5f64.to_radians(),
            sample_rate: 1.0,
            epsilon: 0.0,
            fwhm_arcmin: 10.0,
            bandcenter_ghz: 150.0,
            bandwidth_ghz: 20.0,
            psd_net: 0.1,
            psd_fmin: 0.0,
            psd_alpha: 1.0,
            psd_fknee: 0.05,
        }
    }
}

/// Number of rings of a hexagon of `n_pix` positions, counting the centre
/// as the first ring (TOAST's `hex_nring`).
pub fn hex_nring(n_pix: usize) -> Result<usize, FocalplaneError> {
    if n_pix == 0 {
        return Err(FocalplaneError::NotHexagonal { n_pix });
    }
    let mut test = n_pix - 1;
    let mut nrings = 1;
    while test >= 6 * nrings {
        test -= 6 * nrings;
        nrings += 1;
    }
    if test != 0 {
        return Err(FocalplaneError::NotHexagonal { n_pix });
    }
    Ok(nrings)
}

/// Ring, sector and step within the sector of a non-central position.
fn ring_sector_step(pos: usize) -> (usize, usize, usize) {
    let mut test = pos - 1;
    let mut ring = 1;
    while test >= 6 * ring {
        test -= 6 * ring;
        ring += 1;
    }
    (ring, test / ring, test % ring)
}

/// (row, column) of a hex position (TOAST's `hex_xieta_row_col`): row 0 is
/// the vertex-to-vertex line, columns count from the left in the ξ/η plane.
pub fn hex_xieta_row_col(n_pos: usize, pos: usize) -> Result<(i64, i64), FocalplaneError> {
    if pos >= n_pos {
        return Err(FocalplaneError::PositionOutOfRange { pos, n_pos });
    }
    let nrings = hex_nring(n_pos)? as i64;
    if pos == 0 {
        return Ok((0, nrings - 1));
    }
    let (ring, sector, steps) = ring_sector_step(pos);
    let (ring, steps) = (ring as i64, steps as i64);
    let coloff = nrings - ring - 1;
    Ok(match sector {
        0 => (steps, coloff + 2 * ring - steps),
        1 => (ring, coloff + ring - steps),
        2 => (ring - steps, coloff),
        3 => (-steps, coloff),
        4 => (-ring, coloff + steps),
        _ => (-ring + steps, coloff + ring + steps),
    })
}

/// Polarisation angles (degrees) alternating 0/45 (+ `offset_deg`) with the
/// parity of the hex column (TOAST's `hex_gamma_angles_qu`).
pub fn hex_gamma_angles_qu(n_pix: usize, offset_deg: f64) -> Result<Vec<f64>, FocalplaneError> {
    (0..n_pix)
        .map(|p| {
            let (_, col) = hex_xieta_row_col(n_pix, p)?;
            Ok(if col % 2 == 0 { 0.0 } else { 45.0 } + offset_deg)
        })
        .collect()
}

/// TOAST's `xieta_to_quat` (scalar version).
pub fn xieta_to_quat(xi: f64, eta: f64, gamma: f64) -> Quat {
    const EPS: f64 = 1.0e-12;
    let mut theta = (xi * xi + eta * eta).sqrt().asin();
    let phi;
    if theta < EPS {
        theta = 0.0;
        phi = 0.0;
    } else if PI - theta < EPS {
        theta = PI;
        phi = 0.0;
    } else {
        phi = (-xi).atan2(-eta);
    }
    qarray::from_iso_angles(theta, phi, gamma - phi)
}

/// ξ, η offsets (rad) of every position of a hexagon of width `width` (rad).
pub fn hex_xieta(n_pos: usize, width: f64) -> Result<Vec<(f64, f64)>, FocalplaneError> {
    let nrings = hex_nring(n_pos)?;
    let half_rt3 = 0.5 * 3f64.sqrt();
    let pixdiam = if nrings > 1 {
        width / (2 * nrings - 2) as f64
    } else {
        0.0
    };
    let sixty = PI / 3.0;
    let thirty = PI / 6.0;
    Ok((0..n_pos)
        .map(|pix| {
            if pix == 0 {
                return (0.0, 0.0);
            }
            let (ring, sector, steps) = ring_sector_step(pix);
            let midline = half_rt3 * ring as f64;
            let edgedist = steps as f64 - 0.5 * ring as f64;
            let relang = edgedist.atan2(midline);
            let pixang = sector as f64 * sixty + thirty + relang;
            let pixdist = half_rt3 * pixdiam * ring as f64 / relang.cos();
            (pixdist.sin() * pixang.cos(), pixdist.sin() * pixang.sin())
        })
        .collect())
}

/// TOAST's `fake_hexagon_focalplane`: two orthogonal detectors per pixel.
pub fn fake_hexagon_focalplane(p: &HexFocalplaneParams) -> Result<Focalplane, FocalplaneError> {
    for (name, value) in [
        ("width", p.width),
        ("sample_rate", p.sample_rate),
        ("psd_net", p.psd_net),
    ] {
        if !(value > 0.0 && value.is_finite()) {
            return Err(FocalplaneError::InvalidParameter {
                name,
                value,
                reason: "must be positive and finite",
            });
        }
    }
    if p.psd_alpha.is_nan() || p.psd_alpha < 0.0 {
        return Err(FocalplaneError::InvalidParameter {
            name: "psd_alpha",
            value: p.psd_alpha,
            reason: "alpha must be non-negative",
        });
    }
    let xieta = hex_xieta(p.n_pix, p.width)?;
    let pol_a = hex_gamma_angles_qu(p.n_pix, 0.0)?;
    let ndigit = p.n_pix.to_string().len();
    let freq = format!("{}", p.bandcenter_ghz.trunc() as i64);
    let mut dets: Vec<Detector> = Vec::with_capacity(2 * p.n_pix);
    for (pix, &(xi, eta)) in xieta.iter().enumerate() {
        for (suffix, offset_deg, psi_pol) in [("A", 0.0, 0.0), ("B", 90.0, 0.5 * PI)] {
            let gamma = (pol_a[pix] + offset_deg).to_radians();
            let quat = xieta_to_quat(xi, eta, gamma);
            let (a, d) = (quat[3], quat[2]);
            let pol_angle = (2.0 * a * d).atan2(a * a - d * d).rem_euclid(PI);
            let pixel = format!("D{pix:0ndigit$}");
            dets.push(Detector {
                name: format!("{pixel}{suffix}-{freq}"),
                uid: 0,
                pixel,
                pixel_index: pix,
                quat,
                gamma,
                psi_pol,
                pol_angle,
                pol_leakage: p.epsilon,
                pol_efficiency: (1.0 - p.epsilon) / (1.0 + p.epsilon),
                fwhm_arcmin: p.fwhm_arcmin,
                bandcenter_ghz: p.bandcenter_ghz,
                bandwidth_ghz: p.bandwidth_ghz,
                psd_net: p.psd_net,
                psd_fknee: p.psd_fknee,
                psd_alpha: p.psd_alpha,
                psd_fmin: p.psd_fmin,
            });
        }
    }
    // TOAST sorts on the name without the frequency suffix ("D00A", ...).
    dets.sort_by(|a, b| {
        let ka = a.name.split('-').next().unwrap_or("");
        let kb = b.name.split('-').next().unwrap_or("");
        ka.cmp(kb)
    });
    for d in &mut dets {
        d.uid = name_uid(&d.name);
    }
    let fov = 1.1 * (p.width + 2.0 * (p.fwhm_arcmin / 60.0).to_radians());
    Ok(Focalplane {
        detectors: dets,
        sample_rate: p.sample_rate,
        field_of_view: fov,
    })
}

/// Number of hex rings (excluding the centre) the benchmark uses for
/// `n_det` detectors: `ceil(sqrt((n_det − 2)/6))`, 0 for `n_det ≤ 2`.
pub fn benchmark_rings(n_det: usize) -> usize {
    if n_det <= 2 {
        return 0;
    }
    let x = (n_det - 2) as f64 / 6.0;
    x.sqrt().ceil() as usize
}

/// The benchmark focal plane (`make_focalplane`) for `n_det` detectors.
pub fn benchmark_focalplane(n_det: usize) -> Result<Focalplane, FocalplaneError> {
    let ring = benchmark_rings(n_det);
    let n_pix = 1 + 3 * ring * (ring + 1);
    if n_det == 0 || n_det > 2 * n_pix {
        return Err(FocalplaneError::InvalidParameter {
            name: "n_det",
            value: n_det as f64,
            reason: "need between 1 and 2 n_pix detectors",
        });
    }
    let params = HexFocalplaneParams {
        n_pix,
        width: 10f64.to_radians(),
        sample_rate: 100.0,
        psd_net: 50.0e-6,
        psd_fmin: 1.0e-5,
        ..HexFocalplaneParams::default()
    };
    let mut fp = fake_hexagon_focalplane(&params)?;
    fp.detectors.truncate(n_det);
    Ok(fp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_helpers() {
        assert_eq!(hex_nring(1), Ok(1));
        assert_eq!(hex_nring(19), Ok(3));
        assert_eq!(hex_nring(1141), Ok(20));
        assert_eq!(
            hex_nring(20),
            Err(FocalplaneError::NotHexagonal { n_pix: 20 })
        );
        // The (row, col) table of the hex_xieta_row_col docstring (npos = 19).
        assert_eq!(hex_xieta_row_col(19, 0), Ok((0, 2)));
        let cols: Vec<i64> = (0..19)
            .map(|p| hex_xieta_row_col(19, p).unwrap().1)
            .collect();
        let rows: Vec<i64> = (0..19)
            .map(|p| hex_xieta_row_col(19, p).unwrap().0)
            .collect();
        // Every row of the docstring diagram is present with the right width.
        for (row, width) in [(-2, 3), (-1, 4), (0, 5), (1, 4), (2, 3)] {
            let mut c: Vec<i64> = rows
                .iter()
                .zip(&cols)
                .filter(|(r, _)| **r == row)
                .map(|(_, c)| *c)
                .collect();
            c.sort();
            assert_eq!(c, (0..width).collect::<Vec<i64>>(), "row {row}");
        }
        assert!(hex_xieta_row_col(19, 19).is_err());
        assert_eq!(benchmark_rings(12), 2);
        assert_eq!(benchmark_rings(138), 5);
        assert_eq!(benchmark_rings(2054), 19);
        let fp = benchmark_focalplane(2054).unwrap();
        assert_eq!(fp.detectors.len(), 2054);
        assert_eq!(fp.detectors[0].name, "D0000A-150");
        assert_eq!(fp.detector_sets_by_pixel().len(), 1027);
        assert!(benchmark_focalplane(0).is_err());
    }

    fn check_against(file: &str, n_det: usize) -> f64 {
        let path = format!("{}/tests/data/satsim/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("read focalplane vectors");
        let fp = benchmark_focalplane(n_det).unwrap();
        let mut max_err: f64 = 0.0;
        let mut n = 0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# field_of_view_deg ") {
                let fov: f64 = rest.trim().parse().unwrap();
                assert!((fp.field_of_view.to_degrees() - fov).abs() < 1e-12);
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split_whitespace().collect();
            let d = &fp.detectors[n];
            assert_eq!(d.name, f[0]);
            assert_eq!(d.uid, f[1].parse::<u32>().unwrap());
            assert_eq!(d.pixel, f[2]);
            let v: Vec<f64> = f[3..].iter().map(|x| x.parse().unwrap()).collect();
            for (q, want) in d.quat.iter().zip(&v[..4]) {
                max_err = max_err.max((q - want).abs());
            }
            max_err = max_err.max((d.gamma - v[4]).abs());
            max_err = max_err.max((d.psi_pol - v[5]).abs());
            max_err = max_err.max((d.pol_angle - v[6]).abs());
            n += 1;
        }
        assert_eq!(n, n_det, "{file}: detector count");
        assert_eq!(fp.detectors.len(), n_det);
        max_err
    }

    /// Names, UIDs, pixels and quaternions of the tiny (12) and xsmall (138)
    /// focal planes against TOAST 3.0.6 (satsim_satellite_vectors.py).
    #[test]
    fn matches_toast() {
        let e_tiny = check_against("focalplane_tiny.txt", 12);
        let e_xsmall = check_against("focalplane_xsmall.txt", 138);
        eprintln!("focalplane vs TOAST: max |diff| tiny {e_tiny:e}, xsmall {e_xsmall:e}");
        assert!(e_tiny < 1e-12 && e_xsmall < 1e-12);
    }
}
