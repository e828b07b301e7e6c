//! The map-maker's configuration: [`MapMakerConfig`] (TOAST's `MapMaker`
//! traits and defaults, the `mapmaker` section) and [`MapMakerSetup`], all
//! the sections a map-maker is built from (`mapmaker`, `baselines`,
//! `binner`, `binner_final`, `det_pointing`, `pixels`, `weights`,
//! `pixels_final`).

use crate::ops::{BinnerConfig, PixelsHealpixConfig, PointingDetectorConfig, StokesWeightsConfig};
use crate::templates::OffsetConfig;
use serde::{Deserialize, Serialize};
use toast_core::num::Compact;
use toast_core::observation::defaults;
use toast_core::OpError;

/// Configuration of the map-maker (TOAST's `MapMaker` traits and defaults;
/// the `mapmaker` section).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MapMakerConfig {
    /// Whether the map-maker runs.
    pub enabled: bool,
    /// Timestream field.
    pub det_data: String,
    /// Relative convergence limit on `‖r‖² / ‖b‖²`.
    pub convergence: f64,
    /// Iterations before the stall test applies.
    pub iter_min: usize,
    /// Maximum number of iterations.
    pub iter_max: usize,
    /// rcond cut for the solver's covariance.
    pub solve_rcond_threshold: f64,
    /// rcond cut for the final map's covariance.
    pub map_rcond_threshold: f64,
    /// Produce the binned map of the raw timestream (`{name}_binmap`).
    pub write_binmap: bool,
    /// Write the destriped map (for the output writer).
    pub write_map: bool,
    /// Keep the noise-weighted map (`{name}_noiseweighted_map`).
    pub write_noiseweighted_map: bool,
    /// Write the hit map (for the output writer).
    pub write_hits: bool,
    /// Write the covariance (for the output writer).
    pub write_cov: bool,
    /// Keep the inverse covariance (`{name}_invcov`).
    pub write_invcov: bool,
    /// Write the rcond map (for the output writer).
    pub write_rcond: bool,
    /// Write maps in double precision (for the output writer).
    pub write_float64: bool,
    /// Write the solver products (for the output writer; implies keeping them).
    pub write_solver_products: bool,
    /// Keep the solver products in the data.
    pub keep_solver_products: bool,
    /// Keep the final products (they are always kept here; accepted for TOAST compatibility).
    pub keep_final_products: bool,
    /// Keep the template-subtracted timestream.
    pub save_cleaned: bool,
    /// With `save_cleaned`, subtract in place.
    pub overwrite_cleaned: bool,
    /// Output directory (for the output writer).
    pub output_dir: String,
    /// Rebuild the pixel distributions even if they exist.
    pub reset_pix_dist: bool,
}

impl Default for MapMakerConfig {
    fn default() -> Self {
        MapMakerConfig {
            enabled: true,
            det_data: defaults::DET_DATA.into(),
            convergence: 1.0e-12,
            iter_min: 3,
            iter_max: 100,
            solve_rcond_threshold: 1.0e-8,
            map_rcond_threshold: 1.0e-8,
            write_binmap: true,
            write_map: true,
            write_noiseweighted_map: false,
            write_hits: true,
            write_cov: true,
            write_invcov: false,
            write_rcond: true,
            write_float64: false,
            write_solver_products: false,
            keep_solver_products: false,
            keep_final_products: false,
            save_cleaned: false,
            overwrite_cleaned: false,
            output_dir: ".".into(),
            reset_pix_dist: false,
        }
    }
}

impl MapMakerConfig {
    /// The two rcond cuts, each with its key: the solver's covariance's,
    /// then the final map's.
    pub fn rcond_thresholds(&self) -> [(&'static str, f64); 2] {
        [
            ("solve_rcond_threshold", self.solve_rcond_threshold),
            ("map_rcond_threshold", self.map_rcond_threshold),
        ]
    }

    /// Check the values.
    pub fn validate(&self) -> Result<(), OpError> {
        let bad = |m: String| Err(OpError::Config(format!("mapmaker: {m}")));
        if !(self.convergence.is_finite() && self.convergence > 0.0) {
            return bad(format!(
                "convergence = {} must be positive",
                Compact(self.convergence)
            ));
        }
        for (n, v) in self.rcond_thresholds() {
            // rcond (the smallest over the largest eigenvalue) is at most
            // 1: a larger threshold cuts every pixel (an all-zero map).
            if !(0.0..=1.0).contains(&v) {
                return bad(format!(
                    "{n} = {} must be between 0 and 1 (a pixel's rcond is at most 1: a larger \
                     threshold cuts every pixel)",
                    Compact(v)
                ));
            }
        }
        Ok(())
    }
}

/// Everything a map-maker is built from: the configuration sections TOAST's
/// satellite workflow exposes (`mapmaker`, `baselines`, `binner`,
/// `binner_final`, `det_pointing`, `pixels`, `weights`, `pixels_final`).
///
/// It deserializes from a table with those sections (each optional, each
/// strict about its own keys); other top-level sections are ignored, so a
/// whole job configuration can be read into it. `pixels_final` and
/// `binner_final` are used only when present and `enabled`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct MapMakerSetup {
    /// Instance name (prefix of the product keys; not read from a configuration).
    #[serde(skip)]
    pub name: String,
    /// Map-maker parameters.
    pub mapmaker: MapMakerConfig,
    /// The offset template.
    pub baselines: OffsetConfig,
    /// The solver's binner (and the final one unless `binner_final` is set).
    pub binner: BinnerConfig,
    /// The final binner (used when `Some` and enabled).
    pub binner_final: Option<BinnerConfig>,
    /// Detector pointing.
    pub det_pointing: PointingDetectorConfig,
    /// Pixelization of the solve.
    pub pixels: PixelsHealpixConfig,
    /// Stokes weights.
    pub weights: StokesWeightsConfig,
    /// Pixelization of the final maps (used when `Some`).
    pub pixels_final: Option<PixelsHealpixConfig>,
}

impl Default for MapMakerSetup {
    fn default() -> Self {
        MapMakerSetup {
            name: "mapmaker".into(),
            mapmaker: MapMakerConfig::default(),
            baselines: OffsetConfig::default(),
            binner: BinnerConfig::default(),
            binner_final: None,
            det_pointing: PointingDetectorConfig::default(),
            pixels: PixelsHealpixConfig::default(),
            weights: StokesWeightsConfig::default(),
            pixels_final: None,
        }
    }
}
