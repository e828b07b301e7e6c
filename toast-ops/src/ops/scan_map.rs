//! Scan a distributed map into timestreams (TOAST's `ScanMap`).

use super::util::select_detectors;
use crate::exec::kernels::{self, view_intervals, KernelCall, PointingFields, ScanMode};
use serde::Deserialize;
use toast_core::observation::defaults;
use toast_core::{Category, Data, ExecContext, OpError, Operator, Requirements};

/// Configuration of [`ScanMap`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScanMapConfig {
    /// Whether the operator runs (TOAST's `enabled`).
    pub enabled: bool,
    /// Timestream field (created, zeroed, if missing).
    pub det_data: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Interval list (`None`: every sample).
    pub view: Option<String>,
    /// Pixel field.
    pub pixels: String,
    /// Stokes weight field.
    pub weights: String,
    /// Global key of the map (a `PixelData`).
    pub map_key: String,
    /// Global key of the map's pixel distribution.
    pub pixel_dist: String,
    /// Subtract the scanned signal instead of adding it.
    pub subtract: bool,
    /// Zero the timestream first.
    pub zero: bool,
    /// Multiply the timestream by the scanned value instead (TOAST's `ScanScale`).
    pub scale: bool,
}

impl Default for ScanMapConfig {
    fn default() -> Self {
        ScanMapConfig {
            enabled: true,
            det_data: defaults::DET_DATA.into(),
            det_mask: defaults::DET_MASK_INVALID,
            view: None,
            pixels: defaults::PIXELS.into(),
            weights: defaults::WEIGHTS.into(),
            map_key: String::new(),
            pixel_dist: "pixel_dist".into(),
            subtract: false,
            zero: false,
            scale: false,
        }
    }
}

/// Add (or subtract, or multiply by) `Σ_k weights_k · map_k(pixel)` to each
/// sample (the `scan_map` kernel). Samples with a negative pixel are left
/// alone (zeroed first when `zero` is set).
#[derive(Debug, Clone)]
pub struct ScanMap {
    name: String,
    /// The configuration.
    pub config: ScanMapConfig,
}

impl ScanMap {
    /// An operator; `map_key` must be set.
    pub fn new(name: impl Into<String>, config: ScanMapConfig) -> Result<Self, OpError> {
        if config.map_key.is_empty() {
            return Err(OpError::Config("ScanMap: map_key is not set".into()));
        }
        Ok(ScanMap {
            name: name.into(),
            config,
        })
    }
}

impl Operator for ScanMap {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(&self.config.map_key)
            .global(&self.config.pixel_dist)
            .detdata(&self.config.pixels)
            .detdata(&self.config.weights)
            .detdata(&self.config.det_data);
        if let Some(v) = &self.config.view {
            r.add(Category::Intervals, v);
        }
        r
    }

    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.config.det_data)
    }

    fn supports_accel(&self) -> bool {
        true
    }

    /// Creates the timestream for every local detector when it is missing;
    /// an existing one may hold only some detectors (a transient work
    /// timestream of a detector set, see [`super::ResetData::transient`]),
    /// whose rows are then read by name.
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        super::ensure_timestream(data, &self.config.det_data)
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        self.prepare_outputs(data, ctx)?;
        let c = &self.config;
        let mode = ScanMode {
            zero: c.zero,
            subtract: c.subtract,
            scale: c.scale,
        };
        let pointing = PointingFields {
            pixels: &c.pixels,
            weights: &c.weights,
            pixel_dist: &c.pixel_dist,
        };
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = select_detectors(ctx, ob, c.det_mask);
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, c.view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            kernels::scan_map(
                ctx,
                call,
                ob,
                meta,
                &c.map_key,
                pointing,
                &c.det_data,
                1.0,
                mode,
            )?;
        }
        Ok(())
    }
}
