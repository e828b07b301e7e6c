//! Barycentric position and velocity of the Earth in the ICRS (equatorial)
//! frame, from published analytic series.
//!
//! TOAST's `SpaceSite` places the satellite at the Earth's position relative
//! to the solar-system barycentre, `astropy.coordinates.get_body_barycentric_posvel
//! ("earth", t)` (astropy's builtin ephemeris, ERFA `epv00`), in km and km/s;
//! `SimSatellite` then uses the unit vector of that position as the precession
//! axis (the "anti-sun" direction, pointing from the barycentre to the Earth).
//! This module reproduces that vector to well below the 10″ required for the
//! scan: over 2027 the direction agrees with astropy to 0.31″ (about 300 km),
//! see `toast-ops/scripts/check_ephemeris.py` and the test below.
//!
//! # Model
//!
//! 1. **Time scales.** Unix time (UTC) → TT with the IERS leap-second table
//!    (TAI − UTC, 10 s in 1972 to 37 s since 2017-01-01; later dates keep 37 s,
//!    as astropy does without a newer table) and TT = TAI + 32.184 s. TDB − TT
//!    is the 1.7 ms annual term (Astronomical Almanac), negligible here but
//!    included.
//! 2. **Heliocentric Earth.** VSOP87D (Bretagnon & Francou 1988, *A&A* 202,
//!    309), heliocentric spherical coordinates L, B, R of the Earth referred to
//!    the mean dynamical ecliptic and equinox of date, truncated as in Meeus,
//!    *Astronomical Algorithms* (2nd ed., 1998), Appendix III (the same
//!    truncation is Table A4.2 of Reda & Andreas 2004, NREL SPA). VSOP87D's
//!    "Earth" already contains the Earth's motion about the Earth–Moon
//!    barycentre (the 29.5-day term of amplitude 6.5″), so no separate lunar
//!    term is needed. The small VSOP → FK5 correction of Meeus eq. (32.3) is
//!    applied.
//! 3. **Frame.** Ecliptic of date → mean equator of date with the IAU 1976 mean
//!    obliquity (Lieske et al. 1977; Meeus eq. 22.2), then precessed back to
//!    the J2000 mean equator with the IAU 1976 precession angles ζ, z, θ
//!    (Meeus eq. 21.3). The ~20 mas frame bias between J2000 and ICRS is
//!    ignored.
//! 4. **Barycentric offset of the Sun.** `r_sun = −Σ m_i r_i / (M_sun + Σ m_i)`
//!    over the eight planetary systems, with heliocentric positions from the
//!    Keplerian mean elements of Standish, "Keplerian Elements for Approximate
//!    Positions of the Major Planets" (JPL Solar System Dynamics, Table 1,
//!    valid 1800–2050, J2000 ecliptic) and the DE405/IAU 1976 reciprocal
//!    masses. The offset reaches ~10⁶ km (1400″ of direction) and is modelled
//!    to ~150 km here.
//! 5. **Velocity** is the central difference of the position over ±120 s
//!    (truncation error ~1e-8 km/s).
//!
//! Positions are in km, velocities in km/s, both in the ICRS/J2000 equatorial
//! frame. The series are meant for the years ~1900–2100 (Standish's table and
//! the truncated VSOP87 both degrade slowly outside).

use std::f64::consts::PI;

/// Astronomical unit in km (IAU 2012).
pub const AU_KM: f64 = 149_597_870.7;

const ARCSEC: f64 = PI / (180.0 * 3600.0);

/// Unix time of J2000.0 minus the TT−UTC offset: J2000.0 is JD 2451545.0 TT,
/// i.e. 10957.5 days after the Unix epoch on the TT scale.
const J2000_DAYS_AFTER_UNIX_EPOCH: f64 = 10957.5;

/// IERS leap seconds: (year, month, TAI − UTC from the first day of the month).
const LEAP_SECONDS: &[(i64, i64, f64)] = &[
    (1972, 1, 10.0),
    (1972, 7, 11.0),
    (1973, 1, 12.0),
    (1974, 1, 13.0),
    (1975, 1, 14.0),
    (1976, 1, 15.0),
    (1977, 1, 16.0),
    (1978, 1, 17.0),
    (1979, 1, 18.0),
    (1980, 1, 19.0),
    (1981, 7, 20.0),
    (1982, 7, 21.0),
    (1983, 7, 22.0),
    (1985, 7, 23.0),
    (1988, 1, 24.0),
    (1990, 1, 25.0),
    (1991, 1, 26.0),
    (1992, 7, 27.0),
    (1993, 7, 28.0),
    (1994, 7, 29.0),
    (1996, 1, 30.0),
    (1997, 7, 31.0),
    (1999, 1, 32.0),
    (2006, 1, 33.0),
    (2009, 1, 34.0),
    (2012, 7, 35.0),
    (2015, 7, 36.0),
    (2017, 1, 37.0),
];

/// Days from 1970-01-01 to the given proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// TAI − UTC in seconds at a Unix time. Dates before 1972 return 10 s (the
/// pre-1972 "rubber second" offsets are not modelled); dates after the last
/// tabulated leap second return 37 s.
pub fn tai_minus_utc(unix: f64) -> f64 {
    let mut dat = LEAP_SECONDS[0].2;
    for &(y, m, v) in LEAP_SECONDS {
        if unix >= (days_from_civil(y, m, 1) * 86_400) as f64 {
            dat = v;
        } else {
            break;
        }
    }
    dat
}

/// Days of TDB since J2000.0 (JD 2451545.0 TDB) at a Unix (UTC) time.
pub fn tdb_days_since_j2000(unix: f64) -> f64 {
    let tt_days = (unix + tai_minus_utc(unix) + 32.184) / 86_400.0 - J2000_DAYS_AFTER_UNIX_EPOCH;
    // TDB - TT (seconds), Astronomical Almanac low-precision formula.
    let g = (357.53 + 0.985_600_28 * tt_days).to_radians();
    let tdb_tt = 0.001_657 * g.sin() + 0.000_014 * (2.0 * g).sin();
    tt_days + tdb_tt / 86_400.0
}

// VSOP87D Earth, truncated as in Meeus (1998) Appendix III. Each row is
// (amplitude in 1e-8 rad or 1e-8 AU, phase in rad, frequency in rad per
// Julian millennium); the series in tau^k are summed as Σ_k tau^k Σ A cos(B + C tau).
const EARTH_L0: &[[f64; 3]] = &[
    [175347046.0, 0.0, 0.0],
    [3341656.0, 4.6692568, 6283.07585],
    [34894.0, 4.6261, 12566.1517],
    [3497.0, 2.7441, 5753.3849],
    [3418.0, 2.8289, 3.5231],
    [3136.0, 3.6277, 77713.7715],
    [2676.0, 4.4181, 7860.4194],
    [2343.0, 6.1352, 3930.2097],
    [1324.0, 0.7425, 11506.7698],
    [1273.0, 2.0371, 529.691],
    [1199.0, 1.1096, 1577.3435],
    [990.0, 5.233, 5884.927],
    [902.0, 2.045, 26.298],
    [857.0, 3.508, 398.149],
    [780.0, 1.179, 5223.694],
    [753.0, 2.533, 5507.553],
    [505.0, 4.583, 18849.228],
    [492.0, 4.205, 775.523],
    [357.0, 2.92, 0.067],
    [317.0, 5.849, 11790.629],
    [284.0, 1.899, 796.298],
    [271.0, 0.315, 10977.079],
    [243.0, 0.345, 5486.778],
    [206.0, 4.806, 2544.314],
    [205.0, 1.869, 5573.143],
    [202.0, 2.458, 6069.777],
    [156.0, 0.833, 213.299],
    [132.0, 3.411, 2942.463],
    [126.0, 1.083, 20.775],
    [115.0, 0.645, 0.98],
    [103.0, 0.636, 4694.003],
    [102.0, 0.976, 15720.839],
    [102.0, 4.267, 7.114],
    [99.0, 6.21, 2146.17],
    [98.0, 0.68, 155.42],
    [86.0, 5.98, 161000.69],
    [85.0, 1.3, 6275.96],
    [85.0, 3.67, 71430.7],
    [80.0, 1.81, 17260.15],
    [79.0, 3.04, 12036.46],
    [75.0, 1.76, 5088.63],
    [74.0, 3.5, 3154.69],
    [74.0, 4.68, 801.82],
    [70.0, 0.83, 9437.76],
    [62.0, 3.98, 8827.39],
    [61.0, 1.82, 7084.9],
    [57.0, 2.78, 6286.6],
    [56.0, 4.39, 14143.5],
    [56.0, 3.47, 6279.55],
    [52.0, 0.19, 12139.55],
    [52.0, 1.33, 1748.02],
    [51.0, 0.28, 5856.48],
    [49.0, 0.49, 1194.45],
    [41.0, 5.37, 8429.24],
    [41.0, 2.4, 19651.05],
    [39.0, 6.17, 10447.39],
    [37.0, 6.04, 10213.29],
    [37.0, 2.57, 1059.38],
    [36.0, 1.71, 2352.87],
    [36.0, 1.78, 6812.77],
    [33.0, 0.59, 17789.85],
    [30.0, 0.44, 83996.85],
    [30.0, 2.74, 1349.87],
    [25.0, 3.16, 4690.48],
];
const EARTH_L1: &[[f64; 3]] = &[
    [628331966747.0, 0.0, 0.0],
    [206059.0, 2.678235, 6283.07585],
    [4303.0, 2.6351, 12566.1517],
    [425.0, 1.59, 3.523],
    [119.0, 5.796, 26.298],
    [109.0, 2.966, 1577.344],
    [93.0, 2.59, 18849.23],
    [72.0, 1.14, 529.69],
    [68.0, 1.87, 398.15],
    [67.0, 4.41, 5507.55],
    [59.0, 2.89, 5223.69],
    [56.0, 2.17, 155.42],
    [45.0, 0.4, 796.3],
    [36.0, 0.47, 775.52],
    [29.0, 2.65, 7.11],
    [21.0, 5.34, 0.98],
    [19.0, 1.85, 5486.78],
    [19.0, 4.97, 213.3],
    [17.0, 2.99, 6275.96],
    [16.0, 0.03, 2544.31],
    [16.0, 1.43, 2146.17],
    [15.0, 1.21, 10977.08],
    [12.0, 2.83, 1748.02],
    [12.0, 3.26, 5088.63],
    [12.0, 5.27, 1194.45],
    [12.0, 2.08, 4694.0],
    [11.0, 0.77, 553.57],
    [10.0, 1.3, 6286.6],
    [10.0, 4.24, 1349.87],
    [9.0, 2.7, 242.73],
    [9.0, 5.64, 951.72],
    [8.0, 5.3, 2352.87],
    [6.0, 2.65, 9437.76],
    [6.0, 4.67, 4690.48],
];
const EARTH_L2: &[[f64; 3]] = &[
    [52919.0, 0.0, 0.0],
    [8720.0, 1.0721, 6283.0758],
    [309.0, 0.867, 12566.152],
    [27.0, 0.05, 3.52],
    [16.0, 5.19, 26.3],
    [16.0, 3.68, 155.42],
    [10.0, 0.76, 18849.23],
    [9.0, 2.06, 77713.77],
    [7.0, 0.83, 775.52],
    [5.0, 4.66, 1577.34],
    [4.0, 1.03, 7.11],
    [4.0, 3.44, 5573.14],
    [3.0, 5.14, 796.3],
    [3.0, 6.05, 5507.55],
    [3.0, 1.19, 242.73],
    [3.0, 6.12, 529.69],
    [3.0, 0.31, 398.15],
    [3.0, 2.28, 553.57],
    [2.0, 4.38, 5223.69],
    [2.0, 3.75, 0.98],
];
const EARTH_L3: &[[f64; 3]] = &[
    [289.0, 5.844, 6283.076],
    [35.0, 0.0, 0.0],
    [17.0, 5.49, 12566.15],
    [3.0, 5.2, 155.42],
    [1.0, 4.72, 3.52],
    [1.0, 5.3, 18849.23],
    [1.0, 5.97, 242.73],
];
#[allow(clippy::approx_constant)] // published phase values, not pi
const EARTH_L4: &[[f64; 3]] = &[
    [114.0, 3.142, 0.0],
    [8.0, 4.13, 6283.08],
    [1.0, 3.84, 12566.15],
];
#[allow(clippy::approx_constant)] // published phase values, not pi
const EARTH_L5: &[[f64; 3]] = &[[1.0, 3.14, 0.0]];
const EARTH_B0: &[[f64; 3]] = &[
    [280.0, 3.199, 84334.662],
    [102.0, 5.422, 5507.553],
    [80.0, 3.88, 5223.69],
    [44.0, 3.7, 2352.87],
    [32.0, 4.0, 1577.34],
];
const EARTH_B1: &[[f64; 3]] = &[[9.0, 3.9, 5507.55], [6.0, 1.73, 5223.69]];
const EARTH_R0: &[[f64; 3]] = &[
    [100013989.0, 0.0, 0.0],
    [1670700.0, 3.0984635, 6283.07585],
    [13956.0, 3.05525, 12566.1517],
    [3084.0, 5.1985, 77713.7715],
    [1628.0, 1.1739, 5753.3849],
    [1576.0, 2.8469, 7860.4194],
    [925.0, 5.453, 11506.77],
    [542.0, 4.564, 3930.21],
    [472.0, 3.661, 5884.927],
    [346.0, 0.964, 5507.553],
    [329.0, 5.9, 5223.694],
    [307.0, 0.299, 5573.143],
    [243.0, 4.273, 11790.629],
    [212.0, 5.847, 1577.344],
    [186.0, 5.022, 10977.079],
    [175.0, 3.012, 18849.228],
    [110.0, 5.055, 5486.778],
    [98.0, 0.89, 6069.78],
    [86.0, 5.69, 15720.84],
    [86.0, 1.27, 161000.69],
    [65.0, 0.27, 17260.15],
    [63.0, 0.92, 529.69],
    [57.0, 2.01, 83996.85],
    [56.0, 5.24, 71430.7],
    [49.0, 3.25, 2544.31],
    [47.0, 2.58, 775.52],
    [45.0, 5.54, 9437.76],
    [43.0, 6.01, 6275.96],
    [39.0, 5.36, 4694.0],
    [38.0, 2.39, 8827.39],
    [37.0, 0.83, 19651.05],
    [37.0, 4.9, 12139.55],
    [36.0, 1.67, 12036.46],
    [35.0, 1.84, 2942.46],
    [33.0, 0.24, 7084.9],
    [32.0, 0.18, 5088.63],
    [32.0, 1.78, 398.15],
    [28.0, 1.21, 6286.6],
    [28.0, 1.9, 6279.55],
    [26.0, 4.59, 10447.39],
];
#[allow(clippy::approx_constant)] // published phase values, not pi
const EARTH_R1: &[[f64; 3]] = &[
    [103019.0, 1.10749, 6283.07585],
    [1721.0, 1.0644, 12566.1517],
    [702.0, 3.142, 0.0],
    [32.0, 1.02, 18849.23],
    [31.0, 2.84, 5507.55],
    [25.0, 1.32, 5223.69],
    [18.0, 1.42, 1577.34],
    [10.0, 5.91, 10977.08],
    [9.0, 1.42, 6275.96],
    [9.0, 0.27, 5486.78],
];
#[allow(clippy::approx_constant)] // published phase values, not pi
const EARTH_R2: &[[f64; 3]] = &[
    [4359.0, 5.7846, 6283.0758],
    [124.0, 5.579, 12566.152],
    [12.0, 3.14, 0.0],
    [9.0, 3.63, 77713.77],
    [6.0, 1.87, 5573.14],
    [3.0, 5.47, 18849.23],
];
const EARTH_R3: &[[f64; 3]] = &[[145.0, 4.273, 6283.076], [7.0, 3.92, 12566.15]];
const EARTH_R4: &[[f64; 3]] = &[[4.0, 2.56, 6283.08]];

/// Standish (JPL SSD) Table 1 mean elements at J2000 and rates per Julian
/// century (a [AU], e, I [deg], L [deg], long. of perihelion [deg], long. of
/// ascending node [deg]), followed by the reciprocal mass Sun/planet-system.
#[rustfmt::skip]
const PLANETS: &[([f64; 6], [f64; 6], f64)] = &[
    // Mercury
    ([0.38709927, 0.20563593, 7.00497902, 252.25032350, 77.45779628, 48.33076593],
     [0.00000037, 0.00001906, -0.00594749, 149472.67411175, 0.16047689, -0.12534081],
     6023600.0),
    // Venus
    ([0.72333566, 0.00677672, 3.39467605, 181.97909950, 131.60246718, 76.67984255],
     [0.00000390, -0.00004107, -0.00078890, 58517.81538729, 0.00268329, -0.27769418],
     408523.71),
    // Earth-Moon barycentre
    ([1.00000261, 0.01671123, -0.00001531, 100.46457166, 102.93768193, 0.0],
     [0.00000562, -0.00004392, -0.01294668, 35999.37244981, 0.32327364, 0.0],
     328900.56),
    // Mars
    ([1.52371034, 0.09339410, 1.84969142, -4.55343205, -23.94362959, 49.55953891],
     [0.00001847, 0.00007882, -0.00813131, 19140.30268499, 0.44441088, -0.29257343],
     3098708.0),
    // Jupiter
    ([5.20288700, 0.04838624, 1.30439695, 34.39644051, 14.72847983, 100.47390909],
     [-0.00011607, -0.00013253, -0.00183714, 3034.74612775, 0.21252668, 0.20469106],
     1047.3486),
    // Saturn
    ([9.53667594, 0.05386179, 2.48599187, 49.95424423, 92.59887831, 113.66242448],
     [-0.00125060, -0.00050991, 0.00193609, 1222.49362201, -0.41897216, -0.28867794],
     3497.898),
    // Uranus
    ([19.18916464, 0.04725744, 0.77263783, 313.23810451, 170.95427630, 74.01692503],
     [-0.00196176, -0.00004397, -0.00242939, 428.48202785, 0.40805281, 0.04240589],
     22902.98),
    // Neptune
    ([30.06992276, 0.00859048, 1.77004347, -55.12002969, 44.96476227, 131.78422574],
     [0.00026291, 0.00005105, 0.00035372, 218.45945325, -0.32241464, -0.00508664],
     19412.24),
];

/// IAU 1976 mean obliquity of the ecliptic at J2000 (84381.448″).
const OBLIQUITY_J2000: f64 = 84_381.448 * ARCSEC;

fn series(terms: &[&[[f64; 3]]], tau: f64) -> f64 {
    let mut total = 0.0;
    let mut power = 1.0;
    for rows in terms {
        let s: f64 = rows.iter().map(|r| r[0] * (r[1] + r[2] * tau).cos()).sum();
        total += s * power;
        power *= tau;
    }
    total * 1.0e-8
}

/// Frame rotation about X by `a` (rotates the coordinate axes, R1 of the IAU
/// notation).
fn r1(a: f64, v: [f64; 3]) -> [f64; 3] {
    let (s, c) = a.sin_cos();
    [v[0], c * v[1] + s * v[2], -s * v[1] + c * v[2]]
}

/// Frame rotation about Y by `a` (R2).
fn r2(a: f64, v: [f64; 3]) -> [f64; 3] {
    let (s, c) = a.sin_cos();
    [c * v[0] - s * v[2], v[1], s * v[0] + c * v[2]]
}

/// Frame rotation about Z by `a` (R3).
fn r3(a: f64, v: [f64; 3]) -> [f64; 3] {
    let (s, c) = a.sin_cos();
    [c * v[0] + s * v[1], -s * v[0] + c * v[1], v[2]]
}

/// Heliocentric position of the Earth (AU), J2000 mean equator and equinox,
/// at `days` of TDB since J2000.0.
pub fn earth_heliocentric_au(days: f64) -> [f64; 3] {
    let tau = days / 365_250.0;
    let t = tau * 10.0;
    let mut l = series(
        &[EARTH_L0, EARTH_L1, EARTH_L2, EARTH_L3, EARTH_L4, EARTH_L5],
        tau,
    );
    let mut b = series(&[EARTH_B0, EARTH_B1], tau);
    let r = series(&[EARTH_R0, EARTH_R1, EARTH_R2, EARTH_R3, EARTH_R4], tau);
    // VSOP87 dynamical ecliptic -> FK5 (Meeus eq. 32.3).
    let lp = l - (1.397 * t + 0.00031 * t * t).to_radians();
    let (slp, clp) = lp.sin_cos();
    l += (-0.09033 + 0.03916 * (clp + slp) * b.tan()) * ARCSEC;
    b += 0.03916 * (clp - slp) * ARCSEC;
    let (sl, cl) = l.sin_cos();
    let (sb, cb) = b.sin_cos();
    let ecl_date = [r * cb * cl, r * cb * sl, r * sb];
    // Ecliptic of date -> mean equator of date.
    let eps = (84_381.448 - 46.8150 * t - 0.00059 * t * t + 0.001813 * t * t * t) * ARCSEC;
    let equ_date = r1(-eps, ecl_date);
    // Mean equator of date -> J2000 with the transpose of the IAU 1976
    // precession matrix P = R3(-z) R2(theta) R3(-zeta).
    let zeta = (2306.2181 * t + 0.30188 * t * t + 0.017998 * t * t * t) * ARCSEC;
    let z = (2306.2181 * t + 1.09468 * t * t + 0.018203 * t * t * t) * ARCSEC;
    let theta = (2004.3109 * t - 0.42665 * t * t - 0.041833 * t * t * t) * ARCSEC;
    r3(zeta, r2(-theta, r3(z, equ_date)))
}

/// Heliocentric J2000 ecliptic position (AU) of a planet from Keplerian
/// mean elements, `t` in Julian centuries of TDB since J2000.
fn kepler_position(el: &[f64; 6], rate: &[f64; 6], t: f64) -> [f64; 3] {
    let a = el[0] + rate[0] * t;
    let e = el[1] + rate[1] * t;
    let inc = (el[2] + rate[2] * t).to_radians();
    let mean_lon = (el[3] + rate[3] * t).to_radians();
    let peri = (el[4] + rate[4] * t).to_radians();
    let node = (el[5] + rate[5] * t).to_radians();
    let omega = peri - node;
    let m = (mean_lon - peri + PI).rem_euclid(2.0 * PI) - PI;
    let mut ecc_anom = m + e * m.sin();
    for _ in 0..30 {
        let delta = (ecc_anom - e * ecc_anom.sin() - m) / (1.0 - e * ecc_anom.cos());
        ecc_anom -= delta;
        if delta.abs() < 1e-15 {
            break;
        }
    }
    let xp = a * (ecc_anom.cos() - e);
    let yp = a * (1.0 - e * e).sqrt() * ecc_anom.sin();
    let (so, co) = omega.sin_cos();
    let (sn, cn) = node.sin_cos();
    let (si, ci) = inc.sin_cos();
    [
        (co * cn - so * sn * ci) * xp + (-so * cn - co * sn * ci) * yp,
        (co * sn + so * cn * ci) * xp + (-so * sn + co * cn * ci) * yp,
        (so * si) * xp + (co * si) * yp,
    ]
}

/// Position of the Sun relative to the solar-system barycentre (AU), J2000
/// equatorial, at `days` of TDB since J2000.0.
pub fn sun_barycentric_au(days: f64) -> [f64; 3] {
    let t = days / 36_525.0;
    let mut sum = [0.0; 3];
    let mut total = 1.0;
    for (el, rate, inv_mass) in PLANETS {
        let m = 1.0 / inv_mass;
        let p = kepler_position(el, rate, t);
        for k in 0..3 {
            sum[k] += m * p[k];
        }
        total += m;
    }
    let ecl = [-sum[0] / total, -sum[1] / total, -sum[2] / total];
    r1(-OBLIQUITY_J2000, ecl)
}

/// Barycentric position of the Earth (km, ICRS/J2000 equatorial) at `days`
/// of TDB since J2000.0.
pub fn earth_barycentric_km_tdb(days: f64) -> [f64; 3] {
    let h = earth_heliocentric_au(days);
    let s = sun_barycentric_au(days);
    [
        (h[0] + s[0]) * AU_KM,
        (h[1] + s[1]) * AU_KM,
        (h[2] + s[2]) * AU_KM,
    ]
}

/// Barycentric position of the Earth (km, ICRS) at a Unix (UTC) time.
pub fn earth_barycentric_position(unix: f64) -> [f64; 3] {
    earth_barycentric_km_tdb(tdb_days_since_j2000(unix))
}

/// Barycentric position (km) and velocity (km/s) of the Earth in the ICRS at
/// a Unix (UTC) time, as astropy's `get_body_barycentric_posvel("earth", t)`.
pub fn earth_barycentric_posvel(unix: f64) -> ([f64; 3], [f64; 3]) {
    const STEP_S: f64 = 120.0;
    let days = tdb_days_since_j2000(unix);
    let step = STEP_S / 86_400.0;
    let p = earth_barycentric_km_tdb(days);
    let pp = earth_barycentric_km_tdb(days + step);
    let pm = earth_barycentric_km_tdb(days - step);
    let v = [
        (pp[0] - pm[0]) / (2.0 * STEP_S),
        (pp[1] - pm[1]) / (2.0 * STEP_S),
        (pp[2] - pm[2]) / (2.0 * STEP_S),
    ];
    (p, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn angle_arcsec(a: &[f64; 3], b: &[f64; 3]) -> f64 {
        crate::math::qarray::angle_between(a, b) / ARCSEC
    }

    #[test]
    fn leap_seconds_and_calendar() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 1, 1), 10_957);
        assert_eq!(days_from_civil(2027, 1, 1) * 86_400, 1_798_761_600);
        assert_eq!(tai_minus_utc(1_798_761_600.0), 37.0);
        assert_eq!(
            tai_minus_utc((days_from_civil(2016, 12, 31) * 86_400) as f64),
            36.0
        );
        assert_eq!(
            tai_minus_utc((days_from_civil(1972, 6, 30) * 86_400) as f64),
            10.0
        );
        assert_eq!(
            tai_minus_utc((days_from_civil(1999, 1, 1) * 86_400) as f64),
            32.0
        );
        // J2000.0 TT = 2000-01-01 11:58:55.816 UTC
        let unix_j2000 = 946_727_935.816;
        assert!(tdb_days_since_j2000(unix_j2000).abs() * 86_400.0 < 2e-3);
    }

    /// Compare with astropy's builtin ephemeris over 2027 (vectors written by
    /// toast-ops/scripts/check_ephemeris.py).
    #[test]
    fn matches_astropy_over_2027() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/satsim/ephemeris_astropy.txt"
        );
        let text = std::fs::read_to_string(path).expect("read ephemeris test vectors");
        let mut max_ang: f64 = 0.0;
        let mut max_dist: f64 = 0.0;
        let mut max_dv: f64 = 0.0;
        let mut n = 0;
        let mut first: f64 = f64::INFINITY;
        let mut last: f64 = -f64::INFINITY;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v: Vec<f64> = line
                .split_whitespace()
                .map(|x| x.parse().expect("float"))
                .collect();
            let (p, vel) = earth_barycentric_posvel(v[0]);
            let want_p = [v[1], v[2], v[3]];
            let want_v = [v[4], v[5], v[6]];
            max_ang = max_ang.max(angle_arcsec(&p, &want_p));
            let d = ((p[0] - want_p[0]).powi(2)
                + (p[1] - want_p[1]).powi(2)
                + (p[2] - want_p[2]).powi(2))
            .sqrt();
            max_dist = max_dist.max(d);
            let dv = ((vel[0] - want_v[0]).powi(2)
                + (vel[1] - want_v[1]).powi(2)
                + (vel[2] - want_v[2]).powi(2))
            .sqrt();
            max_dv = max_dv.max(dv);
            first = first.min(v[0]);
            last = last.max(v[0]);
            n += 1;
        }
        eprintln!(
            "ephemeris vs astropy: {n} epochs, max direction error {max_ang:.3}\", \
             max position error {max_dist:.1} km, max velocity error {:.2} m/s",
            max_dv * 1e3
        );
        assert!(n > 700, "too few ephemeris vectors ({n})");
        // The vectors must cover all of 2027.
        assert!(first <= 1_798_761_600.0 && last >= 1_830_297_600.0 - 86_400.0);
        assert!(max_ang < 10.0, "direction error {max_ang}\" exceeds 10\"");
        assert!(
            max_ang < 1.0,
            "direction error {max_ang}\" regressed above 1\""
        );
        assert!(max_dv < 1e-3, "velocity error {max_dv} km/s");
    }
}
