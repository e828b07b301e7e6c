//! The temperature units of a map column (`TUNITn`), as TOAST, healpy and
//! the Planck products spell them, and their scale to kelvin.
//!
//! A unit is an SI prefix (none, `m`, `u`, `µ`/`μ`) on `K`, optionally
//! followed by the temperature convention: `_CMB`, `_RJ` (also without the
//! underscore, or with a space; any case), e.g. `K_CMB`, `uK_CMB`, `mK_RJ`,
//! `Kcmb`. The convention is kept as it is: converting between CMB
//! (thermodynamic) and Rayleigh-Jeans temperature needs the frequency,
//! which a map does not carry, and the run, like TOAST, scans the values in
//! the map's own convention. Only the prefix is converted.
//!
//! **An absent or blank `TUNITn` means K**: TOAST writes its maps in K, and
//! healpy writes no unit unless asked to. Any other unit (`Jy/sr`,
//! `MJy/sr`, a typo) is refused, since scanning it as K would put a wrong
//! factor in every output.

/// The factor that turns a value in `unit` into kelvin, or `None` when
/// `unit` is not a temperature unit this module knows (see the module's
/// documentation); `None` as `unit` (no `TUNITn`) is K.
pub fn kelvin_per_unit(unit: Option<&str>) -> Option<f64> {
    let u = unit.unwrap_or("").trim();
    if u.is_empty() {
        return Some(1.0);
    }
    let (prefix, rest) = u.split_once('K')?;
    let scale = match prefix {
        "" => 1.0,
        "m" => 1e-3,
        "u" | "µ" | "μ" => 1e-6,
        _ => return None,
    };
    let convention = rest
        .trim_start_matches(['_', ' ', '-'])
        .to_ascii_uppercase();
    matches!(convention.as_str(), "" | "CMB" | "RJ").then_some(scale)
}

/// The units [`kelvin_per_unit`] knows, for error messages.
pub const KNOWN_UNITS: &str = "K, mK or uK (optionally _CMB or _RJ), or none (K)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_units_scale_to_kelvin() {
        for (u, s) in [
            (None, 1.0),
            (Some(""), 1.0),
            (Some("  "), 1.0),
            (Some("K"), 1.0),
            (Some("K_CMB"), 1.0),
            (Some("K_RJ"), 1.0),
            (Some("Kcmb"), 1.0),
            (Some("mK"), 1e-3),
            (Some("mK_RJ"), 1e-3),
            (Some("mK_CMB"), 1e-3),
            (Some("uK"), 1e-6),
            (Some("uK_CMB"), 1e-6),
            (Some("µK_CMB"), 1e-6),
            (Some("μK"), 1e-6),
            (Some("uK_cmb "), 1e-6),
        ] {
            assert_eq!(kelvin_per_unit(u), Some(s), "{u:?}");
        }
        for u in [
            "Jy/sr", "MJy/sr", "MK", "kK", "K_CMBX", "nK", "uK_RJCMB", "Kelvin", "k",
        ] {
            assert_eq!(kelvin_per_unit(Some(u)), None, "{u}");
        }
    }
}
