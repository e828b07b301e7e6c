//! `toast-cli compare DIR_A DIR_B`: do two runs' maps agree?
//!
//! The maps of a directory are those its run lists: where it holds a
//! `stats.json` of `toast-cli run`, the `*.fits` among its `outputs` (in the
//! maps directory, `mapmaker.output_dir`, wherever that is), not a map a
//! previous run left beside them (a line says how many were left out);
//! elsewhere (TOAST's outputs, any directory) every `*.fits` in it, not
//! recursive. Each is read with the project's own reader
//! ([`toast_ops::io::fits`]) and compared with the map of the same name of
//! the other directory, column by column:
//!
//! * a hits map (a file whose name contains `hits`) must be identical:
//!   the line gives both totals and the number of pixels that differ; its
//!   columns must be integers (FITS `B`, `I`, `J` or `K`: hits are counts),
//!   a float column there is a difference whatever its values;
//! * any other column is within tolerance when its largest difference
//!   relative to its largest value, `max|a-b| / max|a|`, is at most
//!   `--max-rel`, and its RMS difference relative to its RMS,
//!   `rms(a-b) / rms(a)`, at most `--rms-rel`. The `UNSEEN` pixels must
//!   sit in the same pixels of both; they are left out of both ratios. A
//!   non-finite value (NaN, infinite) on either side is a difference
//!   wherever it is: a map that holds one is no result, and two runs that
//!   both failed do not agree. A column that is zero in A is within
//!   tolerance only when it is zero in B too; the line says when no pixel
//!   of a column has a value on either side (all `UNSEEN`).
//!
//! A file present on one side only, a different resolution or a different
//! set of columns is a difference. One line per column, then the verdict.
//! Exit status: 0 when everything agrees, 1 when something differs (the
//! lines marked `DIFFER` say what), 2 when the comparison cannot be made
//! (a directory that cannot be read, a file that is not a HEALPix map, no
//! FITS file on either side, a tolerance that is not a non-negative
//! number).

use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use toast_ops::io::fits::{read_healpix_map, HealpixMap, UNSEEN};

/// Arguments of `toast-cli compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The first run's output directory (the reference of the ratios).
    pub dir_a: PathBuf,
    /// The second run's output directory.
    pub dir_b: PathBuf,
    /// Largest allowed `max|a-b| / max|a|` of a map column.
    #[arg(long = "max-rel", default_value_t = 1e-4, value_name = "X")]
    pub max_rel: f64,
    /// Largest allowed `rms(a-b) / rms(a)` of a map column.
    #[arg(long = "rms-rel", default_value_t = 1e-5, value_name = "X")]
    pub rms_rel: f64,
}

/// The tolerances of a comparison (hits are always compared exactly).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerances {
    /// Largest allowed `max|a-b| / max|a|`.
    pub max_rel: f64,
    /// Largest allowed `rms(a-b) / rms(a)`.
    pub rms_rel: f64,
}

impl CompareArgs {
    fn tolerances(&self) -> Result<Tolerances> {
        for (name, v) in [("--max-rel", self.max_rel), ("--rms-rel", self.rms_rel)] {
            if !(v.is_finite() && v >= 0.0) {
                bail!("{name} {v}: expected a finite number >= 0");
            }
        }
        Ok(Tolerances {
            max_rel: self.max_rel,
            rms_rel: self.rms_rel,
        })
    }
}

/// How one column of B differs from the same column of A.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ColumnDiff {
    /// Hits: the totals of both and the pixels whose counts differ.
    Hits {
        /// Sum of A.
        total_a: f64,
        /// Sum of B.
        total_b: f64,
        /// Pixels whose values differ.
        differing: usize,
    },
    /// A map column: the two ratios over the pixels both have a value in,
    /// the pixels where only one side is `UNSEEN`, and those non-finite on
    /// either side.
    Map {
        /// `max|a-b| / max|a|` (0 when both are zero, infinite when only
        /// A is).
        max_rel: f64,
        /// `rms(a-b) / rms(a)` (likewise).
        rms_rel: f64,
        /// Pixels `UNSEEN` on one side only.
        mismatched_unseen: usize,
        /// Pixels NaN or infinite on either side (each is a difference).
        non_finite: usize,
        /// Pixels with a value on both sides: those the ratios cover.
        compared: usize,
    },
}

impl ColumnDiff {
    /// Whether the difference is within `tol`.
    pub fn within(&self, tol: Tolerances) -> bool {
        match *self {
            ColumnDiff::Hits { differing, .. } => differing == 0,
            ColumnDiff::Map {
                max_rel,
                rms_rel,
                mismatched_unseen,
                non_finite,
                ..
            } => {
                mismatched_unseen == 0
                    && non_finite == 0
                    && max_rel <= tol.max_rel
                    && rms_rel <= tol.rms_rel
            }
        }
    }
}

/// Compare hit counts: exact.
pub fn compare_hits(a: &[f64], b: &[f64]) -> ColumnDiff {
    ColumnDiff::Hits {
        total_a: a.iter().sum(),
        total_b: b.iter().sum(),
        differing: a.iter().zip(b).filter(|(x, y)| x != y).count(),
    }
}

/// Compare a map column of B with the same column of A (same length).
pub fn compare_map(a: &[f64], b: &[f64]) -> ColumnDiff {
    // Half of each difference, |x/2 - y/2|, which no two finite values
    // overflow (x - y does: 1e308 and -1e308); the ratios double it.
    let half = |x: f64, y: f64| (0.5 * x - 0.5 * y).abs();
    let (mut max_a, mut max_h) = (0.0f64, 0.0f64);
    let (mut mismatched_unseen, mut non_finite, mut compared) = (0, 0, 0);
    for (&x, &y) in a.iter().zip(b) {
        if !(x.is_finite() && y.is_finite()) {
            non_finite += 1;
            continue;
        }
        match (x == UNSEEN, y == UNSEEN) {
            (false, false) => {
                max_a = max_a.max(x.abs());
                max_h = max_h.max(half(x, y));
                compared += 1;
            }
            (true, true) => {}
            _ => mismatched_unseen += 1,
        }
    }
    // sqrt(sum v^2) / max, over the pixels with a value on both sides: the
    // squares scaled by their maximum, which maps of 1e300 would overflow.
    let scaled_norm = |max: f64, v: &dyn Fn(f64, f64) -> f64| -> f64 {
        if max == 0.0 {
            return 0.0;
        }
        let both = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.is_finite() && y.is_finite() && **x != UNSEEN && **y != UNSEEN);
        both.map(|(&x, &y)| (v(x, y) / max).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let ratio = |d: f64, r: f64| match (d == 0.0, r == 0.0) {
        (true, _) => 0.0,
        (false, true) => f64::INFINITY,
        (false, false) => d / r,
    };
    // max|a-b| / max|a| = 2 max_h / max_a; rms(a-b) / rms(a) = 2 (max_h
    // |h/max_h|) / (max_a |a/max_a|), the norms scaled as above.
    let norm_h = scaled_norm(max_h, &half);
    let norm_a = scaled_norm(max_a, &|x, _| x.abs());
    ColumnDiff::Map {
        max_rel: 2.0 * ratio(max_h, max_a),
        rms_rel: 2.0 * ratio(max_h, max_a) * ratio(norm_h, norm_a),
        mismatched_unseen,
        non_finite,
        compared,
    }
}

/// The outcome of comparing one file.
#[derive(Debug)]
struct FileReport {
    lines: Vec<String>,
    differs: bool,
}

/// The `*.fits` files in `dir`, by name; one that is not a regular file (a
/// directory, a FIFO, a dangling link) is refused, not taken for a file
/// missing on that side.
fn fits_in(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut maps = BTreeMap::new();
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read directory {}", dir.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("cannot read directory {}", dir.display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".fits") {
            continue;
        }
        if !e.path().is_file() {
            bail!("{}: not a regular file", e.path().display());
        }
        maps.insert(name, e.path());
    }
    Ok(maps)
}

/// The maps of the run in `dir`, by name, and how many `*.fits` in `dir`
/// were left out as not the run's (see the module docs). `stats.json`
/// names its files under the output directory as the run was given it
/// (its own entry, `GIVEN/stats.json`, says how): a path under it is read
/// under `dir`, an absolute one (an absolute maps directory) as it is.
fn run_maps(dir: &Path) -> Result<(BTreeMap<String, PathBuf>, usize)> {
    let in_dir = fits_in(dir)?;
    let stats = dir.join("stats.json");
    if !stats.is_file() {
        return Ok((in_dir, 0));
    }
    let files = crate::output::listed_outputs(dir, &stats)
        .map_err(|why| anyhow::anyhow!("{}: {why}", stats.display()))?;
    let mut maps = BTreeMap::new();
    for path in files
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "fits"))
    {
        if !path.is_file() {
            bail!(
                "{}: lists {}, which is not a regular file",
                stats.display(),
                path.display()
            );
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        maps.insert(name.unwrap_or_default(), path);
    }
    // The same file may be spelled two ways (an absolute maps directory
    // that is the run's own): compared as canonical paths.
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let listed: Vec<PathBuf> = maps.values().map(|p| canonical(p)).collect();
    let stale = in_dir
        .values()
        .filter(|p| !listed.contains(&canonical(p)))
        .count();
    Ok((maps, stale))
}

fn compare_file(name: &str, a: &HealpixMap, b: &HealpixMap, tol: Tolerances) -> FileReport {
    if a.nside != b.nside {
        return FileReport {
            lines: vec![format!("{name}: NSIDE {} vs {}  DIFFER", a.nside, b.nside)],
            differs: true,
        };
    }
    let names = |m: &HealpixMap| m.fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
    if names(a) != names(b) {
        return FileReport {
            lines: vec![format!(
                "{name}: columns {:?} vs {:?}  DIFFER",
                names(a),
                names(b)
            )],
            differs: true,
        };
    }
    let hits = name.contains("hits");
    let mut report = FileReport {
        lines: Vec::new(),
        differs: false,
    };
    // Both are read into NESTED order, so the pixels compared are the same
    // sky pixels; a file whose ORDERING keyword is wrong for its data then
    // differs everywhere, and this names the likely cause.
    if a.file_ordering != b.file_ordering {
        let word = |m: &HealpixMap| format!("{:?}", m.file_ordering).to_uppercase();
        report.lines.push(format!(
            "{name}: ORDERING {} vs {} (both compared in NESTED order)",
            word(a),
            word(b)
        ));
    }
    for (fa, fb) in a.fields.iter().zip(&b.fields) {
        // Hits are counts: a column of another type (a float `E`) is not a
        // hits map, whatever its values.
        let floats: Vec<String> = [a, b]
            .iter()
            .filter_map(|m| column_type(m, &fa.name))
            .filter(|t| hits && !matches!(t, 'B' | 'I' | 'J' | 'K'))
            .map(String::from)
            .collect();
        if !floats.is_empty() {
            report.differs = true;
            report.lines.push(format!(
                "{name} {}: column type {} in a hits map (hits are counts: an integer column \
                 B, I, J or K)  DIFFER",
                fa.name,
                floats.join(" and ")
            ));
            continue;
        }
        let diff = if hits {
            compare_hits(&fa.data, &fb.data)
        } else {
            compare_map(&fa.data, &fb.data)
        };
        let ok = diff.within(tol);
        report.differs |= !ok;
        let what = match diff {
            ColumnDiff::Hits {
                total_a,
                total_b,
                differing,
            } => format!(
                "hits {} / {}, {differing} pixels differ",
                count(total_a),
                count(total_b)
            ),
            ColumnDiff::Map {
                max_rel,
                rms_rel,
                mismatched_unseen,
                non_finite,
                compared,
            } => {
                let mut s = format!("max rel {max_rel:.2e}, rms rel {rms_rel:.2e}");
                if mismatched_unseen > 0 {
                    s.push_str(&format!(", {mismatched_unseen} pixels UNSEEN on one side"));
                }
                if non_finite > 0 {
                    s.push_str(&format!(", {non_finite} pixels NaN or infinite"));
                }
                if compared == 0 && non_finite == 0 && mismatched_unseen == 0 {
                    s.push_str(", no pixel has a value on either side (all UNSEEN)");
                }
                s
            }
        };
        report.lines.push(format!(
            "{name} {}: {what}  {}",
            fa.name,
            if ok { "ok" } else { "DIFFER" }
        ));
    }
    report
}

/// The data type letter of column `name` of `map` (`E` of `TFORMn =
/// '1024E'`), from the header; `None` where the header does not say.
fn column_type(map: &HealpixMap, name: &str) -> Option<char> {
    let n = (1..=999).find(|n| {
        map.header
            .get(&format!("TTYPE{n}"))
            .and_then(|v| v.as_str())
            .is_some_and(|t| t.trim() == name)
    })?;
    let tform = map.header.get(&format!("TFORM{n}"))?.as_str()?;
    tform.trim().chars().find(|c| c.is_ascii_alphabetic())
}

/// A sum of hits: as an integer where it is one that an f64 holds exactly,
/// else in scientific notation (never dozens of digits).
fn count(total: f64) -> String {
    if total.fract() == 0.0 && total.abs() < 9.0e15 {
        format!("{}", total as i64)
    } else {
        format!("{total:e}")
    }
}

/// Run the comparison, printing one line per column and the verdict.
/// Returns the exit code (0 agree, 1 differ); errors are status 2.
pub fn run(args: &CompareArgs) -> Result<i32> {
    let tol = args.tolerances()?;
    let (in_a, stale_a) = run_maps(&args.dir_a)?;
    let (in_b, stale_b) = run_maps(&args.dir_b)?;
    let all: BTreeSet<&String> = in_a.keys().chain(in_b.keys()).collect();
    if all.is_empty() {
        bail!(
            "no FITS file (*.fits) in {} or {}: nothing to compare",
            args.dir_a.display(),
            args.dir_b.display()
        );
    }
    crate::outln!(
        "compare {} {} (map columns: max rel <= {:e}, rms rel <= {:e}; hits exact)",
        args.dir_a.display(),
        args.dir_b.display(),
        tol.max_rel,
        tol.rms_rel
    )?;
    for (dir, stale) in [(&args.dir_a, stale_a), (&args.dir_b, stale_b)] {
        if stale > 0 {
            crate::outln!(
                "{}: {stale} *.fits not among its stats.json's outputs (an earlier run's) left out",
                dir.display()
            )?;
        }
    }
    let (mut files, mut columns, mut differing) = (0usize, 0usize, Vec::new());
    for name in all {
        files += 1;
        let report = match (in_a.get(name), in_b.get(name)) {
            (Some(pa), Some(pb)) => {
                let read = |p: &PathBuf| {
                    read_healpix_map(p, None).with_context(|| format!("comparing {name}"))
                };
                let a = read(pa)?;
                let b = read(pb)?;
                columns += a.fields.len();
                compare_file(name, &a, &b, tol)
            }
            (a_has, _) => FileReport {
                lines: vec![format!(
                    "{name}: only in {}  DIFFER",
                    if a_has.is_some() {
                        &args.dir_a
                    } else {
                        &args.dir_b
                    }
                    .display()
                )],
                differs: true,
            },
        };
        for line in &report.lines {
            crate::outln!("{line}")?;
        }
        if report.differs {
            differing.push(name.clone());
        }
    }
    if differing.is_empty() {
        crate::outln!("MAPS MATCH: {files} files, {columns} columns")?;
        Ok(0)
    } else {
        crate::outln!(
            "MAPS DIFFER: {} of {files} files ({})",
            differing.len(),
            differing.join(", ")
        )?;
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: Tolerances = Tolerances {
        max_rel: 1e-4,
        rms_rel: 1e-5,
    };

    #[test]
    fn hits_are_exact() {
        assert!(compare_hits(&[1.0, 2.0], &[1.0, 2.0]).within(TOL));
        let d = compare_hits(&[1.0, 2.0, 3.0], &[1.0, 3.0, 2.0]);
        assert_eq!(
            d,
            ColumnDiff::Hits {
                total_a: 6.0,
                total_b: 6.0,
                differing: 2
            }
        );
        assert!(!d.within(TOL));
    }

    #[test]
    fn map_ratios_are_relative_to_a() {
        let a = [2.0, -4.0, 0.0, 1.0];
        let b = [2.0, -4.0004, 0.0, 1.0];
        let ColumnDiff::Map {
            max_rel, rms_rel, ..
        } = compare_map(&a, &b)
        else {
            panic!("a map column")
        };
        assert!((max_rel - 1e-4).abs() < 1e-12, "{max_rel}");
        assert!((rms_rel - 4e-4 / 21f64.sqrt()).abs() < 1e-12, "{rms_rel}");
        // 1e-4 max is at the tolerance, but the RMS ratio is beyond 1e-5.
        assert!(!compare_map(&a, &b).within(TOL));
        assert!(compare_map(&a, &a).within(TOL));
    }

    #[test]
    fn unseen_must_match_and_stays_out_of_the_ratios() {
        let a = [UNSEEN, 1.0, 2.0];
        let d = compare_map(&a, &[UNSEEN, 1.0, 2.0]);
        assert_eq!(
            d,
            ColumnDiff::Map {
                max_rel: 0.0,
                rms_rel: 0.0,
                mismatched_unseen: 0,
                non_finite: 0,
                compared: 2,
            }
        );
        assert!(d.within(TOL));
        let d = compare_map(&a, &[0.0, 1.0, UNSEEN]);
        assert!(matches!(
            d,
            ColumnDiff::Map {
                mismatched_unseen: 2,
                compared: 1,
                ..
            }
        ));
        assert!(!d.within(TOL));
        // Two empty maps agree, with nothing compared.
        let d = compare_map(&[UNSEEN; 3], &[UNSEEN; 3]);
        assert!(matches!(d, ColumnDiff::Map { compared: 0, .. }) && d.within(TOL));
    }

    /// A NaN or an infinity is a difference wherever it is, even in the
    /// same pixel of both maps: two all-NaN maps (two failed runs) differ.
    #[test]
    fn non_finite_values_always_differ() {
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let d = compare_map(&[v, 1.0], &[v, 1.0]);
            assert!(
                matches!(
                    d,
                    ColumnDiff::Map {
                        non_finite: 1,
                        compared: 1,
                        ..
                    }
                ) && !d.within(TOL),
                "{v}: {d:?}"
            );
        }
        let d = compare_map(&[f64::NAN; 4], &[f64::NAN; 4]);
        assert!(matches!(d, ColumnDiff::Map { non_finite: 4, .. }) && !d.within(TOL));
        assert!(!compare_map(&[1.0], &[f64::NAN]).within(TOL));
    }

    /// Differences and squares of values near the largest f64 neither
    /// overflow nor turn the ratios into NaN.
    #[test]
    fn extreme_values_give_finite_ratios() {
        match compare_map(&[1e308, 1.0], &[-1e308, 1.0]) {
            ColumnDiff::Map {
                max_rel, rms_rel, ..
            } => {
                assert_eq!(max_rel, 2.0);
                assert!((rms_rel - 2.0).abs() < 1e-12, "{rms_rel}");
            }
            other => panic!("{other:?}"),
        }
        match compare_map(&[1e300; 3], &[1e300 * (1.0 + 1e-6); 3]) {
            ColumnDiff::Map {
                max_rel, rms_rel, ..
            } => {
                assert!((max_rel - 1e-6).abs() < 1e-15, "{max_rel}");
                assert!((rms_rel - 1e-6).abs() < 1e-15, "{rms_rel}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_zero_reference_is_matched_only_by_zero() {
        assert!(compare_map(&[0.0, 0.0], &[0.0, 0.0]).within(TOL));
        let d = compare_map(&[0.0, 0.0], &[0.0, 1e-30]);
        assert!(matches!(d, ColumnDiff::Map { max_rel, .. } if max_rel.is_infinite()));
        assert!(!d.within(TOL));
    }

    #[test]
    fn tolerances_must_be_non_negative_numbers() {
        let args = |max_rel, rms_rel| CompareArgs {
            dir_a: PathBuf::new(),
            dir_b: PathBuf::new(),
            max_rel,
            rms_rel,
        };
        assert!(args(1e-4, 0.0).tolerances().is_ok());
        assert!(args(-1.0, 1e-5).tolerances().is_err());
        assert!(args(1e-4, f64::NAN).tolerances().is_err());
    }
}
