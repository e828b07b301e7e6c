//! Numbers as messages show them.
//!
//! `{}` of an `f64` writes every digit of its integer part: a user's `1e300`
//! echoed in an error came out as 301 digits. Every value a message echoes
//! goes through [`Compact`] (or [`compact`]): ordinary magnitudes print as
//! `{}` does (`60`, `0.5`, `1e-6` as `0.000001`), others in the shortest
//! exponent form that reads back to the same number (`1e300`, `1.5e-12`).

use std::fmt;

/// Magnitudes from this one on print in exponent form.
const LARGE: f64 = 1e15;
/// Nonzero magnitudes below this one print in exponent form.
const SMALL: f64 = 1e-6;

/// An `f64` shown compactly (see the module's description).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Compact(pub f64);

impl fmt::Display for Compact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = self.0;
        let a = x.abs();
        if a.is_finite() && (a >= LARGE || (a != 0.0 && a < SMALL)) {
            write!(f, "{x:e}")
        } else {
            write!(f, "{x}")
        }
    }
}

/// `x` shown compactly, as a `String`.
pub fn compact(x: f64) -> String {
    Compact(x).to_string()
}

/// `text` with every rendering of `x` that `{}` (or serde's, which adds
/// `.0` to a whole number) would write replaced by [`compact`]'s, for
/// messages made by code that formats the value itself (a deserialiser's
/// "invalid type: floating point `1000…0.0`").
pub fn compact_in(text: &str, x: f64) -> String {
    let long = format!("{x}");
    let short = compact(x);
    if long == short {
        return text.to_string();
    }
    let serde = if long.contains(['.', 'e', 'N', 'i']) {
        None
    } else {
        Some(format!("{long}.0"))
    };
    let text = match serde {
        Some(s) => text.replace(&s, &short),
        None => text.to_string(),
    };
    text.replace(&long, &short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_numbers_print_as_display_and_extremes_in_exponent_form() {
        for (x, s) in [
            (60.0, "60"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (0.0, "0"),
            (1e-6, "0.000001"),
            (123456789012345.0, "123456789012345"),
            (1e15, "1e15"),
            (1e300, "1e300"),
            (-1.5e-300, "-1.5e-300"),
            (f64::MAX, "1.7976931348623157e308"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(compact(x), s, "{x:?}");
            if x.is_finite() {
                assert_eq!(s.parse::<f64>().unwrap(), x, "{s} reads back");
            }
        }
    }

    #[test]
    fn a_message_made_elsewhere_is_shortened() {
        let msg = format!("invalid type: floating point `{}.0`, expected i64", 1e300);
        assert_eq!(
            compact_in(&msg, 1e300),
            "invalid type: floating point `1e300`, expected i64"
        );
        let msg = format!("step {} too small", 1e-300);
        assert_eq!(compact_in(&msg, 1e-300), "step 1e-300 too small");
        assert_eq!(compact_in("value 60", 60.0), "value 60");
    }
}
