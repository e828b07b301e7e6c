//! Barycentric position and velocity of the Earth in the ICRS, exactly as
//! TOAST's `SpaceSite` obtains them from astropy.
//!
//! TOAST 3.0.6's `SpaceSite._position_velocity` evaluates, for each (sparse)
//! Unix time `t`,
//!
//! ```python
//! p, v = get_body_barycentric_posvel("earth", Time(t, format="unix"))
//! p.xyz.to_value(u.km), v.xyz.to_value(u.km / u.s)
//! ```
//!
//! with astropy's default ("builtin") ephemeris, i.e. ERFA's `epv00` called
//! on the TDB two-part Julian date. This module repeats every floating-point
//! operation of that chain, so the result is bit-identical to astropy's
//! (test `matches_astropy_bit_for_bit` below, vectors written by
//! `toast-ops/scripts/check_ephemeris.py`):
//!
//! 1. **Unix → UTC Julian date** (`astropy.time.formats.TimeUnix.set_jds`):
//!    `(day, frac) = day_frac(t, 0, divisor = 86400)`, then
//!    `jd1 = 2440588 + day`, `jd2 = −0.5 + frac` (the epoch
//!    1970-01-01 00:00:00 UTC as astropy stores it), and the integer part of
//!    `jd2` (rounded half to even) moved into `jd1`. Unix days are 86 400 s
//!    long; a leap second is absorbed by the next step, as in astropy.
//! 2. **UTC → TAI → TT → TDB** (`astropy.time.Time._set_scale`, the
//!    `utc → tai → tt → tdb` hops): ERFA `utctai` (leap seconds from `dat`,
//!    including the stretched day of a leap second), `taitt` (+32.184 s),
//!    then `tttdb(tt1, tt2, dtr)` with `dtr = dtdb(tt1, tt2, ut, 0, 0, 0)`
//!    (geocentric; `Time._get_delta_tdb_tt`), where
//!    `ut = day_frac(u1 − 0.5, u2).1` and `(u1, u2) = taiutc(tttai(tt))`;
//!    finally `day_frac(tdb1, tdb2)`.
//! 3. **Ephemeris**: ERFA `epv00(tdb1, tdb2)`, barycentric position (au)
//!    and velocity (au/day) of the Earth, BCRS (ICRS-aligned).
//! 4. **Units** (astropy's `Unit.to_value`): km = au × 149 597 870.7 and
//!    km/s = au/day × (149 597 870.7 / 86 400), each a single product.
//!
//! The ERFA routines come from [`sofars`], a pure-Rust port of SOFA whose
//! routines follow the C code operation by operation (SOFA and ERFA share the
//! code). Its leap-second table ends, like ERFA's built-in one, with
//! TAI − UTC = 37 s from 2017-01-01; astropy would also apply a leap second
//! announced later through its IERS data, none has been (astropy-iers-data
//! 0.2026.11, table valid to 2027-06-28). `sofars::eph::epv00` refuses dates
//! more than 100 Julian years from J2000 (ERFA computes them with a warning),
//! which [`earth_barycentric_posvel`] reports as an error.

/// Astronomical unit in km (IAU 2012), astropy's `u.au.to(u.km)`.
pub const AU_KM: f64 = 149_597_870.7;

/// astropy's `(u.au / u.day).to(u.km / u.s)`: the same double as
/// 149 597 870.7 / 86 400.
const AU_PER_DAY_IN_KM_PER_S: f64 = AU_KM / 86_400.0;

/// The Unix epoch 1970-01-01 00:00:00 UTC as astropy's two-part Julian date.
const UNIX_EPOCH_JD: (f64, f64) = (2_440_588.0, -0.5);

/// Errors of the ephemeris.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum EphemerisError {
    /// A time the ERFA routines reject (status code of the routine).
    #[error("Unix time {unix} s is outside the range of ERFA {routine} (status {status})")]
    OutOfRange {
        /// The Unix time (UTC).
        unix: f64,
        /// The routine that refused it.
        routine: &'static str,
        /// Its status code (`sofars` returns no code for `epv00`: 1).
        status: i32,
    },
}

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

/// Exact sum as (rounded sum, error) (Shewchuk; astropy `two_sum`).
fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let x = a + b;
    let mut eb = x - a;
    let mut ea = x - eb;
    eb = b - eb;
    ea = a - ea;
    (x, ea + eb)
}

/// Veltkamp split (astropy `split`).
fn split(a: f64) -> (f64, f64) {
    let c = 134_217_729.0 * a;
    let abig = c - a;
    let ah = c - abig;
    (ah, a - ah)
}

/// Exact product as (rounded product, error) (astropy `two_product`).
fn two_product(a: f64, b: f64) -> (f64, f64) {
    let x = a * b;
    let (ah, al) = split(a);
    let (bh, bl) = split(b);
    let mut y = x - ah * bh;
    y -= al * bh;
    y -= ah * bl;
    (x, al * bl - y)
}

/// numpy's `sign`.
fn np_sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

/// astropy's `day_frac(val1, val2, divisor=divisor)`: `(val1 + val2) /
/// divisor` as an integer day and a fraction in [−0.5, 0.5], operation by
/// operation (numpy rounding is half to even).
fn day_frac(val1: f64, val2: f64, divisor: Option<f64>) -> (f64, f64) {
    let (mut sum12, mut err12) = two_sum(val1, val2);
    if let Some(div) = divisor {
        let q1 = sum12 / div;
        let (p1, p2) = two_product(q1, div);
        let (d1, mut d2) = two_sum(sum12, -p1);
        d2 += err12;
        d2 -= p2;
        let q2 = (d1 + d2) / div;
        (sum12, err12) = two_sum(q1, q2);
    }
    let mut day = sum12.round_ties_even();
    let (frac, check) = two_sum(sum12 - day, err12);
    let excess = if frac * np_sign(check) != 0.5 {
        frac.round_ties_even()
    } else {
        (frac + 2.0 * check).round_ties_even()
    };
    day += excess;
    let mut frac = sum12 - day;
    frac += err12;
    (day, frac)
}

/// astropy's `Time(unix, format="unix")`: the UTC two-part Julian date.
pub fn unix_to_utc_jd(unix: f64) -> (f64, f64) {
    let (day, frac) = day_frac(unix, 0.0, Some(86_400.0));
    let mut jd1 = UNIX_EPOCH_JD.0 + day;
    let mut jd2 = UNIX_EPOCH_JD.1 + frac;
    let extra = jd2.round_ties_even();
    jd1 += extra;
    jd2 -= extra;
    (jd1, jd2)
}

/// astropy's `Time(unix, format="unix").tdb`: the TDB two-part Julian date
/// (`jd1`, `jd2`), through ERFA `utctai`, `taitt` and `tttdb` with the
/// geocentric `dtdb`.
pub fn unix_to_tdb_jd(unix: f64) -> Result<(f64, f64), EphemerisError> {
    let err = |routine: &'static str| {
        move |status: i32| EphemerisError::OutOfRange {
            unix,
            routine,
            status,
        }
    };
    let (utc1, utc2) = unix_to_utc_jd(unix);
    let (tai1, tai2) = sofars::ts::utctai(utc1, utc2).map_err(err("utctai"))?;
    let (tt1, tt2) = sofars::ts::taitt(tai1, tai2).map_err(err("taitt"))?;
    // Time._get_delta_tdb_tt: UT approximated by UTC from TT.
    let (a1, a2) = sofars::ts::tttai(tt1, tt2).map_err(err("tttai"))?;
    let (u1, u2) = sofars::ts::taiutc(a1, a2).map_err(err("taiutc"))?;
    let ut = day_frac(u1 - 0.5, u2, None).1;
    let dtr = sofars::ts::dtdb(tt1, tt2, ut, 0.0, 0.0, 0.0);
    let (tdb1, tdb2) = sofars::ts::tttdb(tt1, tt2, dtr).map_err(err("tttdb"))?;
    Ok(day_frac(tdb1, tdb2, None))
}

/// Barycentric position (km) and velocity (km/s) of the Earth in the ICRS at
/// a Unix (UTC) time, bit for bit as astropy's
/// `get_body_barycentric_posvel("earth", Time(unix, format="unix"))` with
/// the builtin ephemeris.
pub fn earth_barycentric_posvel(unix: f64) -> Result<([f64; 3], [f64; 3]), EphemerisError> {
    let (tdb1, tdb2) = unix_to_tdb_jd(unix)?;
    let (_, pvb) = sofars::eph::epv00(tdb1, tdb2).ok_or(EphemerisError::OutOfRange {
        unix,
        routine: "epv00",
        status: 1,
    })?;
    Ok((
        pvb[0].map(|x| x * AU_KM),
        pvb[1].map(|x| x * AU_PER_DAY_IN_KM_PER_S),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_and_day_frac() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 1, 1), 10_957);
        assert_eq!(days_from_civil(2027, 1, 1) * 86_400, 1_798_761_600);
        // Exact splitting: 1.5 days and a sub-ulp remainder survive.
        assert_eq!(day_frac(1.0, 0.5, None), (2.0, -0.5));
        assert_eq!(day_frac(2.5, 0.0, None), (2.0, 0.5));
        assert_eq!(day_frac(1e9, 1e-9, None), (1e9, 1e-9));
        assert_eq!(day_frac(129_600.0, 0.0, Some(86_400.0)), (2.0, -0.5));
        assert_eq!(unix_to_utc_jd(0.0), (2_440_588.0, -0.5));
        assert_eq!(unix_to_utc_jd(43_200.0), (2_440_588.0, 0.0));
        // J2000.0 (TT) is 2000-01-01 11:58:55.816 UTC: TDB within 2 ms.
        let (a, b) = unix_to_tdb_jd(946_727_935.816).unwrap();
        assert!(((a - 2_451_545.0) + b).abs() * 86_400.0 < 2e-3);
        // Leap second at the end of 2016: TAI − UTC goes from 36 s to 37 s.
        let tt_minus_unix = |t: f64| {
            let (a, b) = unix_to_tdb_jd(t).unwrap();
            ((a - UNIX_EPOCH_JD.0) + (b - UNIX_EPOCH_JD.1)) * 86_400.0 - t
        };
        let before = tt_minus_unix((days_from_civil(2016, 12, 31) * 86_400) as f64);
        let after = tt_minus_unix((days_from_civil(2017, 1, 1) * 86_400 + 1) as f64);
        assert!((before - 68.184).abs() < 2e-3 && (after - 69.184).abs() < 2e-3);
        assert!(earth_barycentric_posvel(-3.0e9).is_err()); // 1874: epv00 range
        assert!(earth_barycentric_posvel(1.8e9).is_ok());
    }

    /// Bit-for-bit comparison with astropy 8 / pyerfa over 2027 and around
    /// the 2016-12-31 leap second (vectors written by
    /// toast-ops/scripts/check_ephemeris.py): the TDB Julian date pair, the
    /// position (km) and the velocity (km/s).
    #[test]
    fn matches_astropy_bit_for_bit() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/satsim/ephemeris_astropy.txt"
        );
        let text = std::fs::read_to_string(path).expect("read ephemeris test vectors");
        let (mut n, mut n_bad) = (0usize, 0usize);
        let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
        let mut max_dp: f64 = 0.0;
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let v: Vec<f64> = line
                .split_whitespace()
                .map(|x| x.parse().expect("float"))
                .collect();
            assert_eq!(v.len(), 9, "line {line:?}");
            let t = v[0];
            let jd = unix_to_tdb_jd(t).unwrap();
            let (p, vel) = earth_barycentric_posvel(t).unwrap();
            let ok = jd == (v[1], v[2]) && p == [v[3], v[4], v[5]] && vel == [v[6], v[7], v[8]];
            if !ok {
                n_bad += 1;
                eprintln!(
                    "mismatch at {t}: tdb {jd:?} vs ({}, {}), p {p:?} vs {:?}, v {vel:?} vs {:?}",
                    v[1],
                    v[2],
                    &v[3..6],
                    &v[6..9]
                );
            }
            for k in 0..3 {
                max_dp = max_dp.max((p[k] - v[3 + k]).abs());
            }
            first = first.min(t);
            last = last.max(t);
            n += 1;
        }
        eprintln!("ephemeris vs astropy: {n} epochs, {n_bad} differ, max |dp| {max_dp:e} km");
        assert!(n > 700, "too few ephemeris vectors ({n})");
        // The vectors cover all of 2027 and the leap second of 2016-12-31.
        assert!(first < 1_483_228_800.0 && last >= 1_830_297_600.0 - 86_400.0);
        assert_eq!(n_bad, 0, "ephemeris differs from astropy");
    }
}
