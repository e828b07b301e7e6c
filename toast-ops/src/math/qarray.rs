//! Quaternion utilities with TOAST's conventions.
//!
//! # Conventions
//!
//! A quaternion is stored as `[x, y, z, w]`: the vector part first and the
//! scalar part **last**, exactly as in TOAST's `toast.qarray`. A unit
//! quaternion `q` represents the rotation `v -> q v q*`, and products compose
//! like rotation matrices: `mult(p, q)` applied to a vector first rotates by
//! `q`, then by `p` (Hamilton product, `r = p q`).
//!
//! The angle conventions follow TOAST 3 (`toast/qarray.py` and the compiled
//! `qa_*` kernels of libtoast):
//!
//! * [`from_axisangle`] (`qarray.rotation`): `[a sin(θ/2), cos(θ/2)]`.
//! * [`from_iso_angles`]: ZYZ Euler angles, `q = Rz(φ) · Ry(θ) · Rz(ψ)`; the
//!   rotated Z axis points at colatitude `θ`, longitude `φ`, and `ψ` is the
//!   orientation of the rotated X axis about the line of sight, measured from
//!   the local meridian direction pointing *away* from the north pole (the
//!   direction of increasing θ) towards increasing φ.
//! * [`to_iso_angles`] inverts it, returning `θ ∈ [0, π]`, `φ ∈ (-π, π]` and
//!   `ψ ∈ (-π, π]`; at the poles `φ = 0` and all of the rotation goes into `ψ`.
//! * [`from_lonlat_angles`] / [`to_lonlat_angles`]: the same with latitude
//!   `π/2 - θ` and longitude `φ`.
//! * [`from_position`] (deprecated in TOAST but used by older code):
//!   `q = Rz(φ + π/2) · Rx(θ)`; [`to_position`] returns the colatitude and the
//!   longitude in `[0, 2π)` of the rotated Z axis.
//! * [`from_vectors`]: the minimal rotation taking one direction to another.
//! * [`rotate`] normalises the quaternion before rotating, as TOAST does.
//! * [`slerp`]: spherical linear interpolation of a quaternion time series, as
//!   `qarray.slerp` (it does not flip the sign of either end point).
//!
//! All formulas are the standard ones (e.g. Kuipers, *Quaternions and Rotation
//! Sequences*, 1999); the sign and ordering choices were checked against
//! TOAST 3.0.6 with test vectors produced by
//! `toast-ops/scripts/satsim_qarray_vectors.py`.

/// A quaternion `[x, y, z, w]`, scalar last.
pub type Quat = [f64; 4];

/// A Cartesian 3-vector.
pub type Vec3 = [f64; 3];

/// The identity rotation.
pub const NULL_QUAT: Quat = [0.0, 0.0, 0.0, 1.0];

/// Unit vector along X.
pub const XAXIS: Vec3 = [1.0, 0.0, 0.0];
/// Unit vector along Y.
pub const YAXIS: Vec3 = [0.0, 1.0, 0.0];
/// Unit vector along Z.
pub const ZAXIS: Vec3 = [0.0, 0.0, 1.0];

/// Hamilton product `p q` (apply `q` first, then `p`).
#[inline]
pub fn mult(p: &Quat, q: &Quat) -> Quat {
    [
        p[0] * q[3] + p[1] * q[2] - p[2] * q[1] + p[3] * q[0],
        -p[0] * q[2] + p[1] * q[3] + p[2] * q[0] + p[3] * q[1],
        p[0] * q[1] - p[1] * q[0] + p[2] * q[3] + p[3] * q[2],
        -p[0] * q[0] - p[1] * q[1] - p[2] * q[2] + p[3] * q[3],
    ]
}

/// Conjugate `[-x, -y, -z, w]`. This is TOAST's `qarray.inv`, which is the
/// inverse for unit quaternions (TOAST does not divide by the squared norm).
#[inline]
pub fn conj(q: &Quat) -> Quat {
    [-q[0], -q[1], -q[2], q[3]]
}

/// Same as [`conj`]; named after TOAST's `qarray.inv`.
#[inline]
pub fn inv(q: &Quat) -> Quat {
    conj(q)
}

/// Euclidean norm (TOAST's `amplitude`).
#[inline]
pub fn norm(q: &Quat) -> f64 {
    (q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3]).sqrt()
}

/// Scale to unit norm.
#[inline]
pub fn normalize(q: &Quat) -> Quat {
    let s = 1.0 / norm(q);
    [q[0] * s, q[1] * s, q[2] * s, q[3] * s]
}

/// Rotate a vector by a quaternion (normalised first, as TOAST does).
#[inline]
pub fn rotate(q: &Quat, v: &Vec3) -> Vec3 {
    let u = normalize(q);
    rotate_unit(&u, v)
}

/// Rotate a vector by a quaternion that is already of unit norm.
#[inline]
pub fn rotate_unit(u: &Quat, v: &Vec3) -> Vec3 {
    // TOAST's `hpix_qa_rotate`, written once for the CPU plugin and us.
    toast_accel::math::qa_rotate(u, v)
}

/// Rotation by `angle` (radians, right-handed) about the unit vector `axis`
/// (TOAST's `qarray.rotation` / `from_axisangle`).
#[inline]
pub fn from_axisangle(axis: &Vec3, angle: f64) -> Quat {
    let (s, c) = (0.5 * angle).sin_cos();
    [axis[0] * s, axis[1] * s, axis[2] * s, c]
}

/// Axis and angle of a unit quaternion. The angle is in `[0, 2π]`; for
/// angles below 1e-10 the axis is returned as zero, as in TOAST.
pub fn to_axisangle(q: &Quat) -> (Vec3, f64) {
    let half = q[3].clamp(-1.0, 1.0).acos();
    let angle = 2.0 * half;
    if angle < 1.0e-10 {
        ([0.0; 3], angle)
    } else {
        let s = 1.0 / half.sin();
        ([q[0] * s, q[1] * s, q[2] * s], angle)
    }
}

/// Rotation matrix (row-major) of a unit quaternion.
pub fn to_rotmat(q: &Quat) -> [[f64; 3]; 3] {
    let (xx, xy, xz, xw) = (q[0] * q[0], q[0] * q[1], q[0] * q[2], q[0] * q[3]);
    let (yy, yz, yw) = (q[1] * q[1], q[1] * q[2], q[1] * q[3]);
    let (zz, zw) = (q[2] * q[2], q[2] * q[3]);
    [
        [1.0 - 2.0 * (yy + zz), 2.0 * (xy - zw), 2.0 * (xz + yw)],
        [2.0 * (xy + zw), 1.0 - 2.0 * (xx + zz), 2.0 * (yz - xw)],
        [2.0 * (xz - yw), 2.0 * (yz + xw), 1.0 - 2.0 * (xx + yy)],
    ]
}

/// Unit quaternion of a (row-major) rotation matrix, with the same branch
/// choice as TOAST's `qa_from_rotmat` (so that the sign of the result agrees).
pub fn from_rotmat(m: &[[f64; 3]; 3]) -> Quat {
    let tr = m[0][0] + m[1][1] + m[2][2];
    if tr > 0.0 {
        let s = (tr + 1.0).sqrt() * 2.0;
        [
            (m[2][1] - m[1][2]) / s,
            (m[0][2] - m[2][0]) / s,
            (m[1][0] - m[0][1]) / s,
            0.25 * s,
        ]
    } else if m[0][0] > m[1][1] && m[0][0] > m[2][2] {
        let s = (1.0 + m[0][0] - m[1][1] - m[2][2]).sqrt() * 2.0;
        [
            0.25 * s,
            (m[0][1] + m[1][0]) / s,
            (m[0][2] + m[2][0]) / s,
            (m[2][1] - m[1][2]) / s,
        ]
    } else if m[1][1] > m[2][2] {
        let s = (1.0 + m[1][1] - m[0][0] - m[2][2]).sqrt() * 2.0;
        [
            (m[0][1] + m[1][0]) / s,
            0.25 * s,
            (m[1][2] + m[2][1]) / s,
            (m[0][2] - m[2][0]) / s,
        ]
    } else {
        let s = (1.0 + m[2][2] - m[0][0] - m[1][1]).sqrt() * 2.0;
        [
            (m[0][2] + m[2][0]) / s,
            (m[1][2] + m[2][1]) / s,
            0.25 * s,
            (m[1][0] - m[0][1]) / s,
        ]
    }
}

/// The minimal rotation taking direction `v1` to direction `v2` (both unit
/// vectors). Coincident vectors (dot product within 1e-12 of one) give the
/// identity, as in TOAST.
pub fn from_vectors(v1: &Vec3, v2: &Vec3) -> Quat {
    let dot = v1[0] * v2[0] + v1[1] * v2[1] + v1[2] * v2[2];
    if (dot - 1.0).abs() < 1.0e-12 {
        return NULL_QUAT;
    }
    let n1 = v1[0] * v1[0] + v1[1] * v1[1] + v1[2] * v1[2];
    let n2 = v2[0] * v2[0] + v2[1] * v2[1] + v2[2] * v2[2];
    normalize(&[
        v1[1] * v2[2] - v1[2] * v2[1],
        v1[2] * v2[0] - v1[0] * v2[2],
        v1[0] * v2[1] - v1[1] * v2[0],
        (n1 * n2).sqrt() + dot,
    ])
}

/// Quaternion from ISO (ZYZ) angles: `Rz(phi) · Ry(theta) · Rz(psi)`.
pub fn from_iso_angles(theta: f64, phi: f64, psi: f64) -> Quat {
    let (sp, cp) = (0.5 * phi).sin_cos();
    let (st, ct) = (0.5 * theta).sin_cos();
    let (ss, cs) = (0.5 * psi).sin_cos();
    let qphi = [0.0, 0.0, sp, cp];
    let qtheta = [0.0, st, 0.0, ct];
    let qpsi = [0.0, 0.0, ss, cs];
    normalize(&mult(&qphi, &mult(&qtheta, &qpsi)))
}

/// ISO angles `(theta, phi, psi)` of a quaternion (normalised first); see the
/// module documentation for the ranges and the pole convention.
pub fn to_iso_angles(q: &Quat) -> (f64, f64, f64) {
    let u = normalize(q);
    let dir = rotate_unit(&u, &ZAXIS);
    let orient = rotate_unit(&u, &XAXIS);
    let (theta, phi, psi_y, psi_x);
    if (dir[2].abs() - 1.0).abs() < f64::EPSILON {
        phi = 0.0;
        if dir[2] >= 0.0 {
            theta = 0.0;
            psi_y = orient[1];
            psi_x = orient[0];
        } else {
            theta = std::f64::consts::PI;
            psi_y = -orient[1];
            psi_x = -orient[0];
        }
    } else {
        theta = std::f64::consts::FRAC_PI_2 - dir[2].asin();
        phi = dir[1].atan2(dir[0]);
        // Local meridian unit vector pointing away from the north pole.
        let (sphi, cphi) = phi.sin_cos();
        let vm = [
            dir[2] * cphi,
            dir[2] * sphi,
            -(1.0 - dir[2] * dir[2]).sqrt(),
        ];
        psi_y = dir[0] * (vm[1] * orient[2] - vm[2] * orient[1])
            - dir[1] * (vm[0] * orient[2] - vm[2] * orient[0])
            + dir[2] * (vm[0] * orient[1] - vm[1] * orient[0]);
        psi_x = vm[0] * orient[0] + vm[1] * orient[1] + vm[2] * orient[2];
    }
    let mut psi = psi_y.atan2(psi_x);
    if psi > std::f64::consts::PI {
        psi -= 2.0 * std::f64::consts::PI;
    }
    if psi <= -std::f64::consts::PI {
        psi += 2.0 * std::f64::consts::PI;
    }
    (theta, phi, psi)
}

/// Quaternion from longitude, latitude and orientation angle (radians).
pub fn from_lonlat_angles(lon: f64, lat: f64, psi: f64) -> Quat {
    from_iso_angles(std::f64::consts::FRAC_PI_2 - lat, lon, psi)
}

/// `(lon, lat, psi)` of a quaternion; see [`to_iso_angles`].
pub fn to_lonlat_angles(q: &Quat) -> (f64, f64, f64) {
    let (theta, phi, psi) = to_iso_angles(q);
    (phi, std::f64::consts::FRAC_PI_2 - theta, psi)
}

/// TOAST's (deprecated) `from_position`: `Rz(phi + π/2) · Rx(theta)`.
pub fn from_position(theta: f64, phi: f64) -> Quat {
    let (sr, cr) = (0.5 * (phi + std::f64::consts::FRAC_PI_2)).sin_cos();
    let (sd, cd) = (0.5 * theta).sin_cos();
    normalize(&mult(&[0.0, 0.0, sr, cr], &[sd, 0.0, 0.0, cd]))
}

/// TOAST's (deprecated) `to_position`: colatitude and longitude in `[0, 2π)`
/// of the rotated Z axis.
pub fn to_position(q: &Quat) -> (f64, f64) {
    let dir = rotate(q, &ZAXIS);
    let theta = std::f64::consts::FRAC_PI_2 - dir[2].asin();
    let mut phi = dir[1].atan2(dir[0]);
    if phi < 0.0 {
        phi += 2.0 * std::f64::consts::PI;
    }
    (theta, phi)
}

/// Spherical linear interpolation of the series `quats` sampled at the
/// increasing times `times`, evaluated at `targets` (written to `out`).
///
/// Targets outside `[times[0], times[n-1]]` are extrapolated along the first
/// or last segment, like TOAST's `qa_slerp`.
///
/// # Panics
/// If `times` and `quats` differ in length, have fewer than two entries, or
/// `out` and `targets` differ in length.
pub fn slerp(targets: &[f64], times: &[f64], quats: &[Quat], out: &mut [Quat]) {
    assert_eq!(
        times.len(),
        quats.len(),
        "slerp: {} times but {} quaternions",
        times.len(),
        quats.len()
    );
    assert!(
        times.len() >= 2,
        "slerp: need at least two samples, got {}",
        times.len()
    );
    assert_eq!(
        targets.len(),
        out.len(),
        "slerp: {} targets but output of length {}",
        targets.len(),
        out.len()
    );
    let n = times.len();
    let mut off = 0usize;
    for (t, o) in targets.iter().zip(out.iter_mut()) {
        // Targets are usually sorted; restart the scan if one is not.
        if off > 0 && times[off] > *t {
            off = 0;
        }
        while off + 2 < n && times[off + 1] < *t {
            off += 1;
        }
        let frac = (t - times[off]) / (times[off + 1] - times[off]);
        let lo = &quats[off];
        let hi = &quats[off + 1];
        let cos = lo[0] * hi[0] + lo[1] * hi[1] + lo[2] * hi[2] + lo[3] * hi[3];
        let q = if (cos - 1.0).abs() < 1.0e-10 {
            *lo
        } else {
            let theta = cos.clamp(-1.0, 1.0).acos();
            let inv_sin = 1.0 / (1.0 - cos * cos).sqrt();
            let r1 = ((1.0 - frac) * theta).sin() * inv_sin;
            let r2 = (frac * theta).sin() * inv_sin;
            [
                r1 * lo[0] + r2 * hi[0],
                r1 * lo[1] + r2 * hi[1],
                r1 * lo[2] + r2 * hi[2],
                r1 * lo[3] + r2 * hi[3],
            ]
        };
        *o = normalize(&q);
    }
}

/// Angle (radians) between two unit vectors, accurate also for tiny angles.
pub fn angle_between(a: &Vec3, b: &Vec3) -> f64 {
    let cross = [
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    ];
    let s = (cross[0] * cross[0] + cross[1] * cross[1] + cross[2] * cross[2]).sqrt();
    let c = a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
    s.atan2(c)
}

/// Rotation angle (radians, in `[0, π]`) of `conj(p) q`, i.e. the size of the
/// rotation separating two orientations; insensitive to the sign of either
/// quaternion.
pub fn rotation_distance(p: &Quat, q: &Quat) -> f64 {
    let d = mult(&conj(&normalize(p)), &normalize(q));
    let v = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
    2.0 * v.atan2(d[3].abs())
}

/// Rotation from J2000 equatorial (ICRS) to J2000 ecliptic coordinates, as
/// TOAST's `qarray.equ2ecl` (obliquity 23.4392911°).
pub fn equ2ecl() -> Quat {
    let (s, c) = (0.397_777_155_931_914, 0.917_482_062_069_182);
    from_rotmat(&[[1.0, 0.0, 0.0], [0.0, c, s], [0.0, -s, c]])
}

/// Rotation from J2000 equatorial (ICRS) to Galactic coordinates, as TOAST's
/// `qarray.equ2gal`.
pub fn equ2gal() -> Quat {
    from_rotmat(&[
        [-0.054_875_539_726, -0.873_437_108_010, -0.483_834_985_808],
        [0.494_109_453_312, -0.444_829_589_425, 0.746_982_251_810],
        [-0.867_666_135_858, -0.198_076_386_122, 0.455_983_795_705],
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::f64::consts::PI;

    fn parse_floats(s: &str) -> Vec<f64> {
        s.split_whitespace()
            .map(|x| x.parse::<f64>().expect("float in test vector"))
            .collect()
    }

    fn q4(v: &[f64]) -> Quat {
        [v[0], v[1], v[2], v[3]]
    }

    fn v3(v: &[f64]) -> Vec3 {
        [v[0], v[1], v[2]]
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= tol, "{what}: got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn toast_vectors() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/satsim/qarray_vectors.txt"
        );
        let text = std::fs::read_to_string(path).expect("read qarray test vectors");
        let mut counts = std::collections::BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (kind, rest) = line.split_once(' ').expect("kind");
            let (inp, out) = rest.split_once('|').expect("separator");
            *counts.entry(kind.to_string()).or_insert(0) += 1;
            if kind == "name_uid" {
                continue; // checked in astro/scan_strategy.rs
            }
            let i = parse_floats(inp);
            let o = parse_floats(out);
            let tol = 1e-14;
            match kind {
                "mult" => assert_close(&mult(&q4(&i[0..4]), &q4(&i[4..8])), &o, tol, kind),
                "rotate" => assert_close(&rotate(&q4(&i[0..4]), &v3(&i[4..7])), &o, tol, kind),
                "inv" => assert_close(&inv(&q4(&i)), &o, tol, kind),
                "rotation" => assert_close(&from_axisangle(&v3(&i[0..3]), i[3]), &o, tol, kind),
                "from_vectors" => {
                    assert_close(&from_vectors(&v3(&i[0..3]), &v3(&i[3..6])), &o, tol, kind)
                }
                "from_iso" => assert_close(&from_iso_angles(i[0], i[1], i[2]), &o, tol, kind),
                "to_iso" => {
                    let (t, p, s) = to_iso_angles(&q4(&i));
                    assert_close(&[t, p, s], &o, 1e-12, kind)
                }
                "from_position" => assert_close(&from_position(i[0], i[1]), &o, tol, kind),
                "to_position" => {
                    let (t, p) = to_position(&q4(&i));
                    assert_close(&[t, p], &o, 1e-12, kind)
                }
                "slerp" => {
                    let times = [i[0], i[1]];
                    let quats = [q4(&i[2..6]), q4(&i[6..10])];
                    let targets = &i[10..13];
                    let mut res = [[0.0; 4]; 3];
                    slerp(targets, &times, &quats, &mut res);
                    assert_close(res.as_flattened(), &o, 1e-13, kind)
                }
                other => panic!("unknown record kind {other}"),
            }
        }
        for kind in [
            "mult",
            "rotate",
            "inv",
            "rotation",
            "from_vectors",
            "from_iso",
            "to_iso",
            "from_position",
            "to_position",
            "slerp",
        ] {
            assert!(
                counts.get(kind).copied().unwrap_or(0) > 0,
                "no {kind} vectors"
            );
        }
    }

    #[test]
    fn iso_round_trip_and_axes() {
        let q = from_iso_angles(0.7, -2.1, 1.3);
        let (t, p, s) = to_iso_angles(&q);
        assert_close(&[t, p, s], &[0.7, -2.1, 1.3], 1e-13, "round trip");
        // The rotated Z axis points at (theta, phi).
        let d = rotate(&q, &ZAXIS);
        let want = [
            0.7f64.sin() * (-2.1f64).cos(),
            0.7f64.sin() * (-2.1f64).sin(),
            0.7f64.cos(),
        ];
        assert_close(&d, &want, 1e-14, "direction");
        let (lon, lat, psi) = to_lonlat_angles(&from_lonlat_angles(1.0, 0.2, -0.4));
        assert_close(&[lon, lat, psi], &[1.0, 0.2, -0.4], 1e-13, "lonlat");
    }

    #[test]
    fn rotmat_and_composition() {
        let q = normalize(&[0.3, -0.2, 0.5, 0.8]);
        let back = from_rotmat(&to_rotmat(&q));
        assert!(rotation_distance(&q, &back) < 1e-14);
        let p = from_axisangle(&ZAXIS, PI / 2.0);
        let r = from_axisangle(&XAXIS, PI / 2.0);
        // mult(p, r) applies r first: X stays X, then Z rotation takes it to Y.
        assert_close(&rotate(&mult(&p, &r), &XAXIS), &YAXIS, 1e-15, "order");
        assert!((angle_between(&XAXIS, &YAXIS) - PI / 2.0).abs() < 1e-15);
        let e = equ2ecl();
        // The ecliptic pole in equatorial coordinates maps to the Z axis.
        let pole = [0.0, -0.397_777_155_931_914, 0.917_482_062_069_182];
        assert_close(&rotate(&e, &pole), &ZAXIS, 1e-12, "equ2ecl");
        assert!((norm(&equ2gal()) - 1.0).abs() < 1e-9);
        let (ax, ang) = to_axisangle(&from_axisangle(&YAXIS, 1.25));
        assert_close(&ax, &YAXIS, 1e-14, "axis");
        assert!((ang - 1.25).abs() < 1e-14);
    }
}
