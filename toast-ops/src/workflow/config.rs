//! The configuration of the satellite workflow: a TOML table with one
//! section per operator, named as TOAST names its operator instances, and
//! `section.key=value` overrides (`toast-cli run --set`).
//!
//! # Sections
//!
//! | section | operator | struct |
//! |---|---|---|
//! | `sim_satellite` | `SimSatellite` | [`SimSatelliteConfig`] |
//! | `default_model` | `DefaultNoiseModel` | [`DefaultNoiseModelConfig`] |
//! | `scan_map` | `ScanHealpixMap` | [`ScanHealpixMapConfig`] |
//! | `sim_noise` | `SimNoise` | [`SimNoiseConfig`] |
//! | `det_pointing` | `PointingDetector` | [`PointingDetectorConfig`] |
//! | `pixels` | `PixelsHealpix` | [`PixelsHealpixConfig`] |
//! | `weights` | `StokesWeights` | [`StokesWeightsConfig`] |
//! | `binner` | `BinMap` | [`BinnerConfig`] |
//! | `mapmaker` | `MapMaker` | [`MapMakerConfig`] |
//! | `baselines` | `Offset` template | [`OffsetConfig`] |
//! | `dispatch` | backend choice | settings of `DispatchPolicy` |
//!
//! The `dispatch` section holds dispatch settings as keys: `run = "cpu"`,
//! `pipeline = "..."`, `operator.template_matrix = "opencl"`,
//! `kernel.scan_map = "opencl"` (TOML dotted keys); the operators are those
//! of [`DISPATCH_OPERATORS`], another is refused. The dispatcher tries, for each kernel call,
//! the kernel override, the operator override, the pipeline, the run
//! backend (`--backend` sets `run`), then `cpu`, falling back along that
//! chain when a backend lacks the kernel.
//!
//! # Precedence
//!
//! The workflow's defaults (TOAST's benchmark settings for the chosen case,
//! [`workflow_defaults`]) < the `--config` file < `--set section.key=value`
//! (the value is read as a TOML value: `60`, `1e-6`, `true`, `"IQU"`; a
//! bare word that is not valid TOML is taken as a string). Keys not given
//! anywhere take the operator's defaults (TOAST's). Unknown sections, unknown
//! keys and values of the wrong type are errors naming the section and key.
//!
//! Every key has an effect or is refused: an operator trait the workflow
//! sets itself, or whose only effect would be on data the run discards,
//! is accepted only at its default (the keys of `FIXED`, each with its
//! reason), `scan_map.pixel_dist` is `binner.pixel_dist` (given, it must
//! be the same), the synthetic sky's settings (`scan_map.seed`,
//! `fwhm_arcmin`, `toast_ring_as_nest`) are refused with a sky map file, as
//! is a file with `scan_map.enabled = false`, and
//! `weights.mode` must be `IQU`. Some traits change no map of the
//! benchmark and are kept because they are real: the flag masks (the
//! simulation sets no flag), `binner.full_pointing`, `compact_pointing`,
//! `pointing_batch`, `stream_detector_data` and
//! `pixels.nside_submap` (memory and distribution, not values; when not
//! given, TOAST's 16 on the host and a finer grid on a device, chosen by
//! the job; with several
//! observations, recomputed pointing sums the maps batch by batch, so they
//! agree with the kept pointing's to rounding), the data
//! keys (`det_pointing.quats`, `binner.pixel_dist`: names).
//!
//! The `mapmaker` section's output traits are TOAST's: `write_hits`,
//! `write_map`, `write_binmap`, `write_cov`, `write_invcov`, `write_rcond`,
//! `write_noiseweighted_map`, `write_float64` choose the files (TOAST's
//! names and format, written by the front-end), `output_dir` where the
//! maps go (the front-end resolves it against its output directory), and
//! `enabled = false` skips the map-making.
//!
//! Our workflow defaults that differ from TOAST's benchmark: for `tiny`,
//! `binner.full_pointing = true` (the pointing is expanded once and kept
//! for the whole solve instead of being recomputed in every pass; the maps
//! are the same). Only the pixels and weights are kept: the expansion runs
//! per batch of `binner.pointing_batch` detectors (default 8) and drops
//! each batch's quaternions, so the quaternions of all detectors never
//! coexist. From `xsmall` on, and for `auto`, `full_pointing` is TOAST's
//! `false` and `binner.compact_pointing = true`: the map-maker keeps a
//! 4-byte pixel per sample and its passes rebuild the weights from it and
//! the boresight block by block in cache (14 instead of 42 bytes per
//! detector sample; see [`crate::mapmaker`] and
//! [`crate::workflow::presets`]). `--set binner.compact_pointing=false`
//! gives TOAST's recomputation by the pointing kernels (10 bytes per
//! detector sample, slower).

use crate::mapmaker::MapMakerConfig;
use crate::ops::{
    BinnerConfig, PixelsHealpixConfig, PointingDetectorConfig, StokesMode, StokesWeightsConfig,
};
use crate::sim::{
    DefaultNoiseModelConfig, ScanHealpixMapConfig, SimNoiseConfig, SimSatelliteConfig,
};
use crate::templates::OffsetConfig;
use serde::de::DeserializeOwned;
use toast_accel::host::DispatchPolicy;
use toml::{Table, Value};

/// A configuration error: the section, key and value involved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A `section.key=value` override that cannot be applied.
    #[error("--set {spec:?}: {reason}")]
    Set { spec: String, reason: String },
    /// A section that no operator of the workflow has.
    #[error("config: unknown section `{section}` (known: {known})", known = SECTIONS.join(", "))]
    UnknownSection { section: String },
    /// A value that is not a table where a section is expected.
    #[error("config: `{section}` must be a section, not {found}")]
    NotASection { section: String, found: String },
    /// A key or value of a section that its operator refuses.
    #[error("config: [{section}] {reason}")]
    Section { section: String, reason: String },
    /// A parameter combination an operator's validation refuses.
    #[error("config: {0}")]
    Invalid(Box<toast_core::OpError>),
}

impl From<toast_core::OpError> for ConfigError {
    fn from(e: toast_core::OpError) -> Self {
        ConfigError::Invalid(Box::new(e))
    }
}

fn set_err(spec: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Set {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

fn section_err(section: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Section {
        section: section.to_string(),
        reason: reason.into(),
    }
}

/// Known sections, in the order they are written.
pub const SECTIONS: [&str; 11] = [
    "sim_satellite",
    "default_model",
    "scan_map",
    "sim_noise",
    "det_pointing",
    "pixels",
    "weights",
    "binner",
    "mapmaker",
    "baselines",
    "dispatch",
];

/// The operators of the workflow that call kernels, as the dispatcher
/// sees them: the names `operator.NAME` of the `dispatch` section may
/// take. The simulation's pointing and the map-maker's share
/// `det_pointing`, `pixels` and `weights`; `ScanMap` scans the input sky,
/// `scan_map` the map-maker's binned map (in the solver's left-hand side);
/// the binning passes accumulate under `{pass}_build_zmap`, the hits and
/// inverse covariance under `CovarianceAndHits_{hits,invcov}`
/// (`cov_accum_timestream`); `sim_noise` makes the noise, `mapmaker`
/// runs the fused passes and `solver_flags` the solver flags and rcond
/// mask (the offset template's good-sample counts of a device run are
/// `template_matrix`'s).
pub const DISPATCH_OPERATORS: [&str; 15] = [
    "det_pointing",
    "pixels",
    "weights",
    "ScanMap",
    "scan_map",
    "noise_weight",
    "template_matrix",
    "solver_binning_build_zmap",
    "binmap_build_zmap",
    "binner_final_build_zmap",
    "CovarianceAndHits_hits",
    "CovarianceAndHits_invcov",
    "sim_noise",
    "mapmaker",
    "solver_flags",
];

/// Keys the workflow fixes: an operator trait that the workflow sets itself
/// or that cannot change anything in it. Each is accepted only at its
/// default (so that `config.toml`, which lists every key, reads back);
/// another value is refused with the reason.
const FIXED: [(&str, &str, &str); 17] = [
    (
        "det_pointing",
        "enabled",
        "the sky scan and the map-maker need the detector pointing",
    ),
    (
        "pixels",
        "enabled",
        "the sky scan and the map-maker need the pixel numbers",
    ),
    (
        "weights",
        "enabled",
        "the sky scan and the map-maker need the Stokes weights",
    ),
    (
        "scan_map",
        "zero",
        "the timestream is still zero when the sky is scanned (SimNoise runs after), so \
         zeroing it first changes nothing",
    ),
    (
        "weights",
        "hwp_angle",
        "the satellite simulation has no half-wave plate",
    ),
    (
        "binner",
        "enabled",
        "the map-maker always bins; set mapmaker.enabled = false to skip the map-making",
    ),
    (
        "binner",
        "binned",
        "the map-maker names its maps itself (mapmaker_binmap, mapmaker_map), as TOAST's \
         MapMaker does",
    ),
    (
        "binner",
        "covariance",
        "the map-maker names its covariance itself (mapmaker_cov), as TOAST's MapMaker does",
    ),
    (
        "binner",
        "noiseweighted",
        "the map-maker names its noise-weighted map itself; ask for it with \
         mapmaker.write_noiseweighted_map",
    ),
    (
        "binner",
        "det_data",
        "the map-maker bins mapmaker.det_data (TOAST's MapMaker sets its binner's det_data)",
    ),
    (
        "mapmaker",
        "keep_solver_products",
        "the run ends with the map-maker, whose products are written (write_*) or dropped",
    ),
    (
        "mapmaker",
        "keep_final_products",
        "the run ends with the map-maker, whose products are written (write_*) or dropped",
    ),
    (
        "mapmaker",
        "save_cleaned",
        "the run ends with the map-maker and writes no timestream",
    ),
    (
        "mapmaker",
        "overwrite_cleaned",
        "the run ends with the map-maker and writes no timestream",
    ),
    (
        "mapmaker",
        "reset_pix_dist",
        "the workflow builds the pixel distribution once (ScanHealpixMap) and the map-maker \
         reuses it",
    ),
    (
        "mapmaker",
        "write_solver_products",
        "writing the solver's products is not implemented",
    ),
    (
        "baselines",
        "precond_width",
        "it sizes the noise prior's banded preconditioner (baselines.use_noise_prior), which \
         is not implemented",
    ),
];

/// The value a [`FIXED`] key must have: the workflow's default, else the
/// operator's.
fn fixed_value(section: &str, key: &str) -> Option<Value> {
    fn default_of<T: serde::Serialize + Default>() -> Option<Table> {
        match Value::try_from(T::default()) {
            Ok(Value::Table(t)) => Some(t),
            _ => None,
        }
    }
    if let Some(Value::Table(t)) = workflow_defaults("tiny").get(section) {
        if let Some(v) = t.get(key) {
            return Some(v.clone());
        }
    }
    let defaults = match section {
        "det_pointing" => default_of::<PointingDetectorConfig>(),
        "pixels" => default_of::<PixelsHealpixConfig>(),
        "scan_map" => default_of::<ScanHealpixMapConfig>(),
        "weights" => default_of::<StokesWeightsConfig>(),
        "binner" => default_of::<BinnerConfig>(),
        "mapmaker" => default_of::<MapMakerConfig>(),
        "baselines" => default_of::<OffsetConfig>(),
        _ => None,
    }?;
    defaults.get(key).cloned()
}

/// The default of a `scan_map` key of the synthetic sky.
fn synthetic_default(key: &str) -> Option<Value> {
    match Value::try_from(ScanHealpixMapConfig::default()) {
        Ok(Value::Table(t)) => t.get(key).cloned(),
        _ => None,
    }
}

/// Refuse a [`FIXED`] key at another value than its default, a
/// synthetic sky's setting (`seed`, `fwhm_arcmin`, `toast_ring_as_nest`)
/// or `enabled = false` with a sky map file, a
/// `scan_map.pixel_dist` other than `binner.pixel_dist`, a Stokes mode
/// other than IQU and a dispatch override of an operator the workflow
/// does not run.
fn check_workflow_keys(table: &Table, cfg: &SatelliteConfig) -> Result<(), ConfigError> {
    let given = |section: &str, key: &str| match table.get(section) {
        Some(Value::Table(t)) => t.get(key).cloned(),
        _ => None,
    };
    for (section, key, why) in FIXED {
        let Some(v) = given(section, key) else {
            continue;
        };
        let fixed = fixed_value(section, key);
        if fixed.as_ref() != Some(&v) {
            let accepted = match fixed {
                Some(f) => format!("only {key} = {f}"),
                None => format!("no {key}"),
            };
            return Err(section_err(
                section,
                format!("{key} = {v}: the workflow accepts {accepted}: {why}"),
            ));
        }
    }
    if !cfg.scan_map.file.is_empty() {
        if !cfg.scan_map.enabled {
            return Err(section_err(
                "scan_map",
                format!(
                    "file = {:?} with enabled = false: the sky map would not be read (drop \
                     the file or --sky-map, or enable the scan)",
                    cfg.scan_map.file
                ),
            ));
        }
        for key in ["seed", "fwhm_arcmin", "toast_ring_as_nest"] {
            let (Some(v), Some(d)) = (given("scan_map", key), synthetic_default(key)) else {
                continue;
            };
            if v != d {
                return Err(section_err(
                    "scan_map",
                    format!(
                        "{key} = {v}: it shapes the synthetic sky, but the sky is read from \
                         file = {:?}",
                        cfg.scan_map.file
                    ),
                ));
            }
        }
    }
    let scan_dist = given("scan_map", "pixel_dist");
    if scan_dist.is_some_and(|d| d.as_str() != Some(cfg.binner.pixel_dist.as_str())) {
        return Err(section_err(
            "scan_map",
            format!(
                "pixel_dist = {:?}: must be binner.pixel_dist ({:?}): the map-maker reuses the \
                 distribution the sky scan builds (set binner.pixel_dist to rename both)",
                cfg.scan_map.pixel_dist, cfg.binner.pixel_dist
            ),
        ));
    }
    if cfg.weights.mode != crate::ops::StokesMode::IQU {
        return Err(section_err(
            "weights",
            format!(
                "mode = {:?}: the workflow scans an I, Q, U sky and makes I, Q, U maps; only \
                 \"IQU\"",
                cfg.weights.mode
            ),
        ));
    }
    for (op, backend) in &cfg.dispatch.operators {
        if !DISPATCH_OPERATORS.contains(&op.as_str()) {
            return Err(section_err(
                "dispatch",
                format!(
                    "operator.{op}={backend}: no operator `{op}` calls kernels in this workflow \
                     (operators: {})",
                    DISPATCH_OPERATORS.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// The parsed configuration.
#[derive(Debug, Clone)]
pub struct SatelliteConfig {
    pub sim_satellite: SimSatelliteConfig,
    pub default_model: DefaultNoiseModelConfig,
    pub scan_map: ScanHealpixMapConfig,
    pub sim_noise: SimNoiseConfig,
    pub det_pointing: PointingDetectorConfig,
    pub pixels: PixelsHealpixConfig,
    pub weights: StokesWeightsConfig,
    pub binner: BinnerConfig,
    pub mapmaker: MapMakerConfig,
    pub baselines: OffsetConfig,
    /// The dispatch policy (the `dispatch` section, parsed once).
    pub dispatch: DispatchPolicy,
    /// The merged table the configuration was built from (its keys are
    /// checked against the workflow).
    pub table: Table,
}

impl SatelliteConfig {
    /// Whether `section.key` was given (by the workflow's defaults, the
    /// `--config` file or `--set`), rather than left to the operator's
    /// default or the job's choice.
    pub fn given(&self, section: &str, key: &str) -> bool {
        matches!(self.table.get(section), Some(Value::Table(t)) if t.contains_key(key))
    }
}

/// The workflow's defaults for `case` (TOAST's benchmark settings: nside
/// 1024 NEST, IQU weights, rcond threshold 1e-3 or 1e-6 for tiny, the
/// map-maker's outputs, cleaned timestream in place). `pixels.nside_submap`
/// is not among them: given, it is the user's; else the job chooses it
/// (TOAST's 16 on the host, a finer grid on a device:
/// [`crate::workflow::SatelliteJob::fit_device_pixels`]).
pub fn workflow_defaults(case: &str) -> Table {
    let rcond = if case == "tiny" { 1.0e-6 } else { 1.0e-3 };
    let full_pointing = crate::workflow::presets::keeps_pointing(case);
    let values: [(&str, &str, Value); 25] = [
        ("sim_satellite", "prec_angle", 65.0.into()),
        ("sim_satellite", "spin_angle", 30.0.into()),
        ("sim_satellite", "prec_period", 50.0.into()),
        ("sim_satellite", "spin_period", 10.0.into()),
        ("scan_map", "file", "".into()),
        ("sim_noise", "realization", 0.into()),
        ("pixels", "nside", 1024.into()),
        ("pixels", "nest", true.into()),
        ("weights", "mode", "IQU".into()),
        ("binner", "pixel_dist", "pixel_dist".into()),
        ("binner", "full_pointing", full_pointing.into()),
        ("binner", "compact_pointing", (!full_pointing).into()),
        ("mapmaker", "iter_max", 100.into()),
        ("mapmaker", "convergence", 1.0e-12.into()),
        ("mapmaker", "solve_rcond_threshold", rcond.into()),
        ("mapmaker", "map_rcond_threshold", rcond.into()),
        ("mapmaker", "write_hits", true.into()),
        ("mapmaker", "write_binmap", true.into()),
        ("mapmaker", "write_map", true.into()),
        ("mapmaker", "write_cov", false.into()),
        ("mapmaker", "write_rcond", false.into()),
        ("mapmaker", "save_cleaned", true.into()),
        ("mapmaker", "overwrite_cleaned", true.into()),
        ("baselines", "step_time", 10000.0.into()),
        ("baselines", "good_fraction", 0.5.into()),
    ];
    let mut table = Table::new();
    for (section, key, value) in values {
        if let Value::Table(t) = table
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()))
        {
            t.insert(key.to_string(), value);
        }
    }
    table
}

/// Merge `over` into `base`, section by section (keys of `over` win).
pub fn merge(base: &mut Table, over: &Table) {
    for (k, v) in over {
        match (base.get_mut(k), v) {
            (Some(Value::Table(b)), Value::Table(o)) => merge(b, o),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Whether `raw` is an integer beyond TOML's (i64): a sign at most, then
/// digits without a leading zero (TOML's `_` separators allowed), whose
/// value no i64 holds. Other text TOML refuses (`007`, `1__0`) stays a
/// string, as it was.
fn is_out_of_range_integer(raw: &str) -> bool {
    let unsigned = raw.strip_prefix(['+', '-']).unwrap_or(raw);
    let digits: String = unsigned.chars().filter(|&c| c != '_').collect();
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && !(digits.len() > 1 && digits.starts_with('0'))
        && raw.replace('_', "").parse::<i64>().is_err()
}

/// Apply one `--set section.key=value`.
pub fn apply_set(table: &mut Table, spec: &str) -> Result<(), ConfigError> {
    let (path, raw) = spec.split_once('=').ok_or_else(|| {
        set_err(
            spec,
            "expected section.key=value (e.g. baselines.step_time=60)",
        )
    })?;
    let path = path.trim();
    let (section, key) = path.split_once('.').ok_or_else(|| {
        set_err(
            spec,
            format!("`{path}` must be section.key (e.g. mapmaker.iter_max)"),
        )
    })?;
    if !SECTIONS.contains(&section) {
        return Err(set_err(
            spec,
            format!(
                "unknown section `{section}` (known: {})",
                SECTIONS.join(", ")
            ),
        ));
    }
    if key.is_empty() || (section != "dispatch" && key.contains('.')) {
        return Err(set_err(spec, format!("bad key `{key}`")));
    }
    let raw = raw.trim();
    // One value on one line: text after a line break would be TOML of its
    // own (`5\nbogus = 64`, `5\n[mapmaker]\n...`), settings no check saw,
    // and no setting is text with control characters.
    if let Some(c) = raw.chars().find(|c| c.is_control()) {
        return Err(set_err(
            spec,
            format!("the value holds the control character {c:?}: give one value on one line"),
        ));
    }
    let value = match format!("v = {raw}").parse::<Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        // Digits that TOML refuses are an integer out of its range, not a
        // string (which the setting then refused as "invalid type:
        // string").
        Err(_) if is_out_of_range_integer(raw) => {
            return Err(set_err(
                spec,
                format!(
                    "{raw} is outside the integers a setting holds ({} to {})",
                    i64::MIN,
                    i64::MAX
                ),
            ))
        }
        Err(_) => Value::String(raw.to_string()),
    };
    let sec = table
        .entry(section.to_string())
        .or_insert_with(|| Value::Table(Table::new()));
    let Value::Table(sec) = sec else {
        return Err(ConfigError::NotASection {
            section: section.to_string(),
            found: shown(sec, &*sec),
        });
    };
    // Dotted keys of `dispatch` become nested tables, as in a TOML file.
    let mut cur = sec;
    let parts: Vec<&str> = key.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        let e = cur
            .entry(p.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(t) = e else {
            return Err(set_err(spec, format!("`{section}.{p}` is not a table")));
        };
        cur = t;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// `text` (a value or a message about it) with the floats of `v` written
/// compactly (`1e300`, not 301 digits; [`toast_core::num::compact_in`]).
fn shown(v: &Value, text: impl std::fmt::Display) -> String {
    fn floats(v: &Value, out: &mut Vec<f64>) {
        match v {
            Value::Float(x) => out.push(*x),
            Value::Array(a) => a.iter().for_each(|x| floats(x, out)),
            Value::Table(t) => t.values().for_each(|x| floats(x, out)),
            _ => {}
        }
    }
    let mut xs = Vec::new();
    floats(v, &mut xs);
    xs.into_iter()
        .fold(text.to_string(), |t, x| toast_core::num::compact_in(&t, x))
}

/// Deserialize one section; on failure find the offending key.
fn section<T: DeserializeOwned>(table: &Table, name: &str) -> Result<T, ConfigError> {
    let sec = match table.get(name) {
        None => Table::new(),
        Some(Value::Table(t)) => t.clone(),
        Some(v) => {
            return Err(ConfigError::NotASection {
                section: name.to_string(),
                found: shown(v, v),
            })
        }
    };
    match Value::Table(sec.clone()).try_into::<T>() {
        Ok(v) => Ok(v),
        Err(whole) => {
            for (k, v) in &sec {
                let mut one = Table::new();
                one.insert(k.clone(), v.clone());
                if let Err(e) = Value::Table(one).try_into::<T>() {
                    let msg = shown(v, e.to_string().trim().replace('\n', " "));
                    return Err(section_err(name, format!("{k} = {}: {msg}", shown(v, v))));
                }
            }
            Err(section_err(
                name,
                whole.to_string().trim().replace('\n', " "),
            ))
        }
    }
}

fn flatten(prefix: &str, t: &Table, out: &mut Vec<String>) -> Result<(), ConfigError> {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(sub) => flatten(&key, sub, out)?,
            Value::String(s) => {
                // `[dispatch.kernel] scan_map` and `[dispatch]
                // "kernel.scan_map"` are one setting: given both ways, which
                // one wins would be the table's order, not the user's.
                let twice = out
                    .iter()
                    .find(|o| o.split_once('=').is_some_and(|(k, _)| k == key));
                if let Some(first) = twice {
                    return Err(section_err(
                        "dispatch",
                        format!("{key} is given twice ({first} and {key}={s}): give it once"),
                    ));
                }
                out.push(format!("{key}={s}"))
            }
            other => {
                return Err(section_err(
                    "dispatch",
                    format!(
                        "{key} = {}: expected a backend name (string)",
                        shown(other, other)
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The text settings that are not the name of an observation field (or of
/// a focal-plane column): a date, paths, a Stokes mode, an MPI pattern, a
/// telescope's name.
const NOT_FIELD_NAMES: [&str; 6] = [
    "mission_start",
    "file",
    "output_dir",
    "mode",
    "sync_type",
    "telescope",
];

/// Every other text setting names a field (`scan_map.det_data`,
/// `det_pointing.quats`, ...): refuse an empty name, or one with spaces or
/// control characters, which no field of TOAST's has; an operator would
/// otherwise write to a field nothing reads (`scan_map.det_data=` scanned
/// the sky into a field the map-maker never bins).
fn check_field_names(table: &Table) -> Result<(), ConfigError> {
    for (section, v) in table {
        let Value::Table(t) = v else { continue };
        if section == "dispatch" {
            continue;
        }
        for (key, v) in t {
            let Value::String(name) = v else { continue };
            if NOT_FIELD_NAMES.contains(&key.as_str()) {
                continue;
            }
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(section_err(
                    section,
                    format!(
                        "{key} = {name:?}: a field name must be non-empty, without spaces or \
                         control characters"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The map-maker's rcond thresholds against what an IQU pixel can reach:
/// its covariance has the I direction's value n (its noise-weighted hits)
/// and a Q/U block of trace at most n (each sample adds η² (cos² + sin²)
/// there, with the polarization efficiency η = (1 - ε) / (1 + ε) <= 1 for
/// a leakage ε >= 0; the simulated focal plane's is 0), so its smallest
/// eigenvalue is at most n / 2 and its largest at least n: rcond <= 1/2. A
/// threshold above 1/2 cuts every pixel and leaves an all-zero map.
fn check_iqu_rcond(cfg: &SatelliteConfig) -> Result<(), ConfigError> {
    if cfg.weights.mode != StokesMode::IQU {
        return Ok(());
    }
    for (key, v) in cfg.mapmaker.rcond_thresholds() {
        if v > 0.5 {
            return Err(section_err(
                "mapmaker",
                format!(
                    "{key} = {}: an IQU pixel's rcond is at most 1/2, so this threshold would \
                     cut every pixel (an all-zero map)",
                    toast_core::num::Compact(v)
                ),
            ));
        }
    }
    Ok(())
}

/// Check the table and build the typed configuration.
pub fn build(table: Table) -> Result<SatelliteConfig, ConfigError> {
    for k in table.keys() {
        if !SECTIONS.contains(&k.as_str()) {
            return Err(ConfigError::UnknownSection { section: k.clone() });
        }
    }
    let mut dispatch = DispatchPolicy::new();
    if let Some(v) = table.get("dispatch") {
        let Value::Table(t) = v else {
            return Err(ConfigError::NotASection {
                section: "dispatch".into(),
                found: shown(v, v),
            });
        };
        let mut settings = Vec::new();
        flatten("", t, &mut settings)?;
        for s in &settings {
            dispatch
                .apply(s)
                .map_err(|e| section_err("dispatch", format!("{s}: {e}")))?;
        }
    }
    let mut cfg = SatelliteConfig {
        sim_satellite: section(&table, "sim_satellite")?,
        default_model: section(&table, "default_model")?,
        scan_map: section(&table, "scan_map")?,
        sim_noise: section(&table, "sim_noise")?,
        det_pointing: section(&table, "det_pointing")?,
        pixels: section(&table, "pixels")?,
        weights: section(&table, "weights")?,
        binner: section(&table, "binner")?,
        mapmaker: section(&table, "mapmaker")?,
        baselines: section(&table, "baselines")?,
        dispatch,
        table,
    };
    check_field_names(&cfg.table)?;
    cfg.sim_satellite.validate()?;
    cfg.mapmaker.validate()?;
    cfg.baselines.validate()?;
    cfg.binner.validate()?;
    crate::pixels::check_submap(cfg.pixels.nside, cfg.pixels.nside_submap)
        .map_err(|x| section_err("pixels", x.to_string()))?;
    check_workflow_keys(&cfg.table, &cfg)?;
    check_iqu_rcond(&cfg)?;
    // The sky scan builds the distribution the map-maker reuses.
    cfg.scan_map.pixel_dist = cfg.binner.pixel_dist.clone();
    if !cfg.pixels.nest {
        return Err(section_err(
            "pixels",
            "nest = false: the workflow writes NEST maps",
        ));
    }
    Ok(cfg)
}

/// The effective configuration as TOML text: every parameter of every
/// section, defaults included, as the run used it (sections in [`SECTIONS`]
/// order), so the file reproduces the run with `--config`.
pub fn to_toml(cfg: &SatelliteConfig) -> Result<String, ConfigError> {
    fn section<T: serde::Serialize>(name: &str, v: &T) -> Result<String, ConfigError> {
        let value = Value::try_from(v).map_err(|e| section_err(name, e.to_string()))?;
        let mut one = Table::new();
        one.insert(name.to_string(), value);
        toml::to_string(&one).map_err(|e| section_err(name, e.to_string()))
    }
    let mut out =
        String::from("# the satellite workflow: the configuration used (every parameter)\n");
    // The dispatch policy's settings (dotted keys as nested tables).
    let mut dispatch = Table::new();
    for (key, backend) in cfg.dispatch.named_backends() {
        let backend = Value::String(backend.to_string());
        match key.split_once('.') {
            Some((level, name)) => {
                let sub = dispatch
                    .entry(level)
                    .or_insert_with(|| Value::Table(Table::new()));
                if let Value::Table(t) = sub {
                    t.insert(name.to_string(), backend);
                }
            }
            None => {
                dispatch.insert(key, backend);
            }
        }
    }
    let parts = [
        section("sim_satellite", &cfg.sim_satellite)?,
        section("default_model", &cfg.default_model)?,
        section("scan_map", &cfg.scan_map)?,
        section("sim_noise", &cfg.sim_noise)?,
        section("det_pointing", &cfg.det_pointing)?,
        section("pixels", &cfg.pixels)?,
        section("weights", &cfg.weights)?,
        section("binner", &cfg.binner)?,
        section("mapmaker", &cfg.mapmaker)?,
        section("baselines", &cfg.baselines)?,
        section("dispatch", &dispatch)?,
    ];
    for p in parts {
        out.push('\n');
        out.push_str(&p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sets: &[&str]) -> Result<SatelliteConfig, String> {
        let mut t = workflow_defaults("tiny");
        for s in sets {
            apply_set(&mut t, s).map_err(|e| e.to_string())?;
        }
        build(t).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_overrides() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.pixels.nside.get(), 1024);
        assert_eq!(c.mapmaker.solve_rcond_threshold, 1e-6);
        assert_eq!(c.baselines.step_time, 10000.0);
        let c = cfg(&[
            "baselines.step_time=60",
            "mapmaker.iter_max=50",
            "dispatch.kernel.scan_map=cpu",
            "weights.mode=IQU",
        ])
        .unwrap();
        assert_eq!(c.baselines.step_time, 60.0);
        assert_eq!(c.mapmaker.iter_max, 50);
        assert_eq!(
            c.dispatch.named_backends(),
            [("kernel.scan_map".to_string(), "cpu")]
        );
        let text = to_toml(&c).unwrap();
        let back = build(text.parse::<Table>().unwrap()).unwrap();
        assert_eq!(back.baselines.step_time, 60.0);
        assert_eq!(back.mapmaker.iter_max, 50);
        assert_eq!(back.dispatch, c.dispatch);
        // Every parameter is written, defaults included.
        assert!(text.contains("good_fraction"), "{text}");
        assert!(text.contains("nside_submap"), "{text}");
        assert!(text.contains("solve_rcond_threshold"), "{text}");
        assert_eq!(back.pixels, c.pixels);
        assert_eq!(back.mapmaker, c.mapmaker);
        assert_eq!(back.baselines, c.baselines);
        let mut file: Table =
            "[mapmaker]\niter_max = 7\n[dispatch]\nkernel.scan_map = \"opencl\"\n"
                .parse()
                .unwrap();
        let mut t = workflow_defaults("small");
        merge(&mut t, &std::mem::take(&mut file));
        let c = build(t).unwrap();
        assert_eq!(c.mapmaker.iter_max, 7);
        assert_eq!(c.mapmaker.solve_rcond_threshold, 1e-3);
        assert_eq!(c.mapmaker.convergence, 1e-12);
        assert_eq!(
            c.dispatch.named_backends(),
            [("kernel.scan_map".to_string(), "opencl")]
        );
    }

    #[test]
    fn errors_name_the_key() {
        let e = cfg(&["baselines.step_tim=60"]).unwrap_err();
        assert!(e.contains("[baselines] step_tim"), "{e}");
        let e = cfg(&["mapmaker.iter_max=abc"]).unwrap_err();
        assert!(e.contains("[mapmaker] iter_max"), "{e}");
        let e = cfg(&["nosuch.x=1"]).unwrap_err();
        assert!(e.contains("unknown section `nosuch`"), "{e}");
        let e = cfg(&["mapmaker"]).unwrap_err();
        assert!(e.contains("section.key=value"), "{e}");
        let e = cfg(&["baselines.step_time=-1"]).unwrap_err();
        assert!(e.contains("step_time"), "{e}");
        let e = cfg(&["pixels.nside=1000"]).unwrap_err();
        assert!(e.contains("[pixels]"), "{e}");
        let e = cfg(&["dispatch.kernel.nosuch=cpu"]).unwrap_err();
        assert!(e.contains("[dispatch]"), "{e}");
        // An integer out of TOML's range is named so, not read as a string.
        for big in ["18446744073709551616", "-9_223_372_036_854_775_809"] {
            let e = cfg(&[&format!("scan_map.seed={big}")]).unwrap_err();
            assert!(
                e.contains(&format!("{big} is outside the integers a setting holds")),
                "{e}"
            );
        }
        for text in ["1e3", "-", "007", "9223372036854775807", "1_0", "x1"] {
            assert!(!is_out_of_range_integer(text), "{text}");
        }
        assert!(is_out_of_range_integer("+9_223_372_036_854_775_808"));
        // Digits TOML refuses that are not out of range stay text.
        let c = cfg(&["mapmaker.output_dir=007"]).unwrap();
        assert_eq!(c.mapmaker.output_dir, "007");
        // One value on one line: what follows a line break is not read as
        // more settings.
        for set in [
            "pixels.nside_submap=16\nbogus=64",
            "mapmaker.iter_max=5\n[mapmaker]\niter_max=0",
        ] {
            let e = cfg(&[set]).unwrap_err();
            assert!(
                e.contains("the value holds the control character '\\n'"),
                "{e}"
            );
        }
        // A field name is a name.
        for set in [
            "scan_map.det_data=",
            "scan_map.det_data=\"x\" , y = 1",
            "mapmaker.det_data=a b",
        ] {
            let e = cfg(&[set]).unwrap_err();
            assert!(e.contains("a field name must be non-empty"), "{set}: {e}");
        }
        // A threshold no IQU pixel passes.
        let e = cfg(&["mapmaker.map_rcond_threshold=1"]).unwrap_err();
        assert!(
            e.contains("map_rcond_threshold = 1: an IQU pixel's rcond is at most 1/2"),
            "{e}"
        );
        cfg(&["mapmaker.solve_rcond_threshold=0.5"]).unwrap();
        // A dispatch setting given two ways is refused, not settled by order.
        let file: Table =
            "[dispatch.kernel]\nscan_map = \"cpu\"\n[dispatch]\n\"kernel.scan_map\" = \"opencl\"\n"
                .parse()
                .unwrap();
        let mut t = workflow_defaults("tiny");
        merge(&mut t, &file);
        let e = build(t).unwrap_err().to_string();
        assert!(e.contains("kernel.scan_map is given twice"), "{e}");
    }

    #[test]
    fn keys_without_effect_are_refused() {
        for (section, key, _) in FIXED {
            // Its default is accepted (config.toml lists every key)...
            let v = fixed_value(section, key);
            if let Some(v) = &v {
                cfg(&[&format!("{section}.{key}={v}")]).unwrap();
            }
            // ...another value is not, naming the key.
            let other = match v {
                Some(Value::Boolean(b)) => (!b).to_string(),
                Some(Value::Integer(i)) => (i + 1).to_string(),
                _ => "\"other\"".to_string(),
            };
            let e = cfg(&[&format!("{section}.{key}={other}")]).unwrap_err();
            assert!(e.contains(&format!("[{section}] {key} = ")), "{e}");
            assert!(e.contains("the workflow accepts"), "{e}");
        }
        let e = cfg(&["binner.noiseweighted=nw"]).unwrap_err();
        assert!(e.contains("[binner] noiseweighted"), "{e}");
        let e = cfg(&["scan_map.pixel_dist=other"]).unwrap_err();
        assert!(e.contains("[scan_map] pixel_dist"), "{e}");
        cfg(&["scan_map.pixel_dist=pd", "binner.pixel_dist=pd"]).unwrap();
        // Renaming the binner's renames the scan's; config.toml reads back.
        let c = cfg(&["binner.pixel_dist=pd"]).unwrap();
        assert_eq!(c.scan_map.pixel_dist, "pd");
        build(to_toml(&c).unwrap().parse::<Table>().unwrap()).unwrap();
        let e = cfg(&["scan_map.file=sky.fits", "scan_map.seed=7"]).unwrap_err();
        assert!(e.contains("[scan_map] seed = 7"), "{e}");
        assert!(e.contains("sky.fits"), "{e}");
        let e = cfg(&["scan_map.file=sky.fits", "scan_map.enabled=false"]).unwrap_err();
        assert!(e.contains("would not be read"), "{e}");
        cfg(&["scan_map.seed=7", "scan_map.fwhm_arcmin=10"]).unwrap();
        let e = cfg(&["weights.mode=I"]).unwrap_err();
        assert!(e.contains("[weights] mode"), "{e}");
        let e = cfg(&["dispatch.operator.NoSuchOp=cpu"]).unwrap_err();
        assert!(e.contains("operator.NoSuchOp=cpu"), "{e}");
        assert!(e.contains("template_matrix"), "{e}");
        for op in DISPATCH_OPERATORS {
            cfg(&[&format!("dispatch.operator.{op}=cpu")]).unwrap();
        }
    }
}
