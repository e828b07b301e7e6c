//! Stokes weights of each sample (TOAST's `StokesWeights`, modes I and IQU).

use super::util::{pointing_field, select_detectors};
use super::PointingDetectorConfig;
use crate::exec::kernels::{self, view_intervals, IquParams, KernelCall};
use serde::{Deserialize, Serialize};
use toast_core::observation::defaults;
use toast_core::{
    Category, DType, Data, ExecContext, Observation, OpError, Operator, Requirements,
};

/// Which Stokes parameters a detector's samples are weighted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum StokesMode {
    /// Intensity only: one weight, the calibration.
    I,
    /// Intensity and linear polarisation: three weights.
    #[allow(clippy::upper_case_acronyms)]
    IQU,
}

impl StokesMode {
    /// Weights per sample.
    pub fn nnz(self) -> usize {
        match self {
            StokesMode::I => 1,
            StokesMode::IQU => 3,
        }
    }
}

/// Configuration of [`StokesWeights`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StokesWeightsConfig {
    /// Whether the operator runs (TOAST's `enabled`).
    pub enabled: bool,
    /// `I` (TOAST's default) or `IQU`.
    pub mode: StokesMode,
    /// Interval list (`None`: the detector pointing's view).
    pub view: Option<String>,
    /// Output detdata field (f64 × nnz).
    pub weights: String,
    /// Shared field of HWP angles, used when the observation has it.
    pub hwp_angle: Option<String>,
    /// IAU polarisation convention instead of COSMO.
    #[serde(rename = "IAU")]
    pub iau: bool,
}

impl Default for StokesWeightsConfig {
    fn default() -> Self {
        StokesWeightsConfig {
            enabled: true,
            mode: StokesMode::I,
            view: None,
            weights: defaults::WEIGHTS.into(),
            hwp_angle: Some(defaults::HWP_ANGLE.into()),
            iau: false,
        }
    }
}

/// Stokes weights (the `stokes_weights_I` / `stokes_weights_IQU` kernels):
/// `[cal]` or `[cal, η cos 2α · cal, η sin 2α · cal]` with `η = (1-ε)/(1+ε)`
/// from the detector's `pol_leakage`, and, with a HWP angle in the
/// observation, TOAST's HWP modulation using the detector's `gamma`.
/// Calibration is 1.
#[derive(Debug, Clone)]
pub struct StokesWeights {
    name: String,
    /// The configuration.
    pub config: StokesWeightsConfig,
    /// The detector pointing it reads.
    pub detector_pointing: PointingDetectorConfig,
    /// Each `exec` replaces the weights field by one holding only the
    /// current pass's detectors (see [`super::pointing_field`]; on a device
    /// its mirror is one pass's too).
    pub transient: bool,
}

impl StokesWeights {
    /// An operator.
    pub fn new(
        name: impl Into<String>,
        config: StokesWeightsConfig,
        detector_pointing: PointingDetectorConfig,
    ) -> Self {
        StokesWeights {
            name: name.into(),
            config,
            detector_pointing,
            transient: false,
        }
    }

    fn view(&self) -> Option<&str> {
        self.config
            .view
            .as_deref()
            .or(self.detector_pointing.view.as_deref())
    }
}

impl StokesWeights {
    /// The detectors of `ob` this pass processes, with the weights field made
    /// for them: whole, or only theirs when transient
    /// ([`super::pointing_field`]; on a device its mirror is sized to it).
    fn output_field(
        &self,
        ob: &mut Observation,
        ctx: &ExecContext,
    ) -> Result<Vec<String>, OpError> {
        let nnz = self.config.mode.nnz();
        let dets = select_detectors(ctx, ob, self.detector_pointing.det_mask);
        pointing_field(
            ob,
            &self.config.weights,
            DType::F64,
            &[nnz],
            &dets,
            self.transient,
        )?;
        Ok(dets)
    }
}

impl Operator for StokesWeights {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new();
        if self.config.mode == StokesMode::IQU {
            r.add(Category::DetData, &self.detector_pointing.quats);
        }
        if let Some(v) = self.view() {
            r.add(Category::Intervals, v);
        }
        r
    }

    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.config.weights)
    }

    fn supports_accel(&self) -> bool {
        true
    }

    fn prepare_outputs(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            self.output_field(ob, ctx)?;
        }
        Ok(())
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let view = self.view().map(str::to_string);
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = self.output_field(ob, ctx)?;
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            let cal = vec![1.0; dets.len()];
            match self.config.mode {
                StokesMode::I => {
                    kernels::stokes_weights_i(ctx, call, ob, meta, &self.config.weights, &cal)?
                }
                StokesMode::IQU => {
                    let hwp = self
                        .config
                        .hwp_angle
                        .as_deref()
                        .filter(|h| ob.shared.contains(h))
                        .map(str::to_string);
                    let mut epsilon = Vec::with_capacity(dets.len());
                    let mut gamma = Vec::with_capacity(dets.len());
                    for d in &dets {
                        let det = ob.detector(d)?;
                        epsilon.push(det.pol_leakage);
                        gamma.push(if hwp.is_some() { det.gamma } else { 0.0 });
                    }
                    let params = IquParams {
                        epsilon: &epsilon,
                        gamma: &gamma,
                        cal: &cal,
                        iau: self.config.iau,
                    };
                    kernels::stokes_weights_iqu(
                        ctx,
                        call,
                        ob,
                        meta,
                        &self.detector_pointing.quats,
                        &self.config.weights,
                        hwp.as_deref(),
                        params,
                    )?
                }
            }
        }
        Ok(())
    }
}
