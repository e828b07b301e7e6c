//! `DefaultNoiseModel` and `SimNoise`.

use super::satellite::SESSION_UID;
use crate::astro::scan_strategy::rate_from_times;
use crate::exec::kernels::{self, NoiseStreams};
use crate::ops::{ensure_timestream, register_noise_model, DetectorWeights};
use crate::sim::noise::{AnalyticNoiseParams, NoiseFilter, NoiseKey};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use toast_core::meta::Value;
use toast_core::observation::defaults;
use toast_core::{Data, ExecContext, OpError, Operator, Requirements};

/// TOAST's `AnalyticNoise`: one 1/f model per detector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnalyticNoiseModel {
    /// Parameters per detector (the rate is the focal plane's nominal one).
    pub params: BTreeMap<String, AnalyticNoiseParams>,
}

impl DetectorWeights for AnalyticNoiseModel {
    fn detector_weight(&self, det: &str) -> Option<f64> {
        self.params.get(det).map(|p| p.detector_weight())
    }
}

/// Configuration of [`DefaultNoiseModel`] (TOAST's trait names).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DefaultNoiseModelConfig {
    /// Observation key of the model.
    pub noise_model: String,
}

impl Default for DefaultNoiseModelConfig {
    fn default() -> Self {
        DefaultNoiseModelConfig {
            noise_model: defaults::NOISE_MODEL.into(),
        }
    }
}

/// Stores an [`AnalyticNoiseModel`] built from the focal-plane columns
/// (`psd_net`, `psd_fknee`, `psd_fmin`, `psd_alpha`, nominal sample rate) in
/// every observation.
#[derive(Debug, Clone)]
pub struct DefaultNoiseModel {
    name: String,
    /// The configuration.
    pub config: DefaultNoiseModelConfig,
}

impl DefaultNoiseModel {
    /// The operator.
    pub fn new(name: impl Into<String>, config: DefaultNoiseModelConfig) -> Self {
        register_noise_model::<AnalyticNoiseModel>();
        DefaultNoiseModel {
            name: name.into(),
            config,
        }
    }
}

impl Operator for DefaultNoiseModel {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new()
    }
    fn provides(&self) -> Requirements {
        Requirements::new().meta(&self.config.noise_model)
    }
    fn exec(&mut self, data: &mut Data, _ctx: &mut ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            let fp = &ob.telescope().focalplane;
            let rate = fp.sample_rate();
            let mut params = BTreeMap::new();
            for d in ob.local_detectors() {
                let det = ob.detector(d)?;
                params.insert(
                    d.clone(),
                    AnalyticNoiseParams {
                        rate,
                        net: det.net,
                        fknee: det.fknee,
                        fmin: det.fmin,
                        alpha: det.alpha,
                    },
                );
            }
            ob.meta
                .set_object(&self.config.noise_model, AnalyticNoiseModel { params });
        }
        Ok(())
    }
}

/// Configuration of [`SimNoise`] (TOAST's trait names).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimNoiseConfig {
    /// Whether noise is added.
    pub enabled: bool,
    /// Observation key of the noise model.
    pub noise_model: String,
    /// Timestream field the noise is added to.
    pub det_data: String,
    /// Monte Carlo realization.
    pub realization: u64,
    /// Component of the RNG key.
    pub component: u64,
}

impl Default for SimNoiseConfig {
    fn default() -> Self {
        SimNoiseConfig {
            enabled: true,
            noise_model: defaults::NOISE_MODEL.into(),
            det_data: defaults::DET_DATA.into(),
            realization: 0,
            component: 0,
        }
    }
}

/// Adds simulated 1/f + white noise to the timestream (TOAST's `SimNoise`
/// with `serial = True`), with TOAST's RNG keys (see [`crate::sim::noise`]).
#[derive(Debug, Clone)]
pub struct SimNoise {
    name: String,
    /// The configuration.
    pub config: SimNoiseConfig,
}

impl SimNoise {
    /// The operator.
    pub fn new(name: impl Into<String>, config: SimNoiseConfig) -> Self {
        SimNoise {
            name: name.into(),
            config,
        }
    }
}

impl Operator for SimNoise {
    fn name(&self) -> &str {
        &self.name
    }
    /// The noise model, the timestream it adds to, and the timestamps (read
    /// on the host for the sample rate; the kernel never reads them, so a
    /// device scope does not stage them: they are not listed).
    fn requires(&self) -> Requirements {
        Requirements::new()
            .meta(&self.config.noise_model)
            .detdata(&self.config.det_data)
    }
    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.config.det_data)
    }
    /// The noise is the `sim_noise` kernel's, on the run's backend.
    fn supports_accel(&self) -> bool {
        true
    }
    /// Creates the timestream (zeros) where it is missing, as TOAST's
    /// `SimNoise` does (`detdata.ensure`): the noise then stands alone in
    /// it. An existing one is added to.
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        ensure_timestream(data, &self.config.det_data)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        self.prepare_outputs(data, ctx)?;
        let cfg = &self.config;
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let obname = ob.name().to_string();
            let err = |m: String| OpError::InvalidData {
                what: format!("sim_noise: observation '{obname}': {m}"),
            };
            let model_err = |problem: String| OpError::NoiseModel {
                observation: obname.clone(),
                key: cfg.noise_model.clone(),
                problem,
            };
            let rate = rate_from_times(ob.times()?).map_err(|e| err(e.to_string()))?;
            let session = match ob.meta.value(SESSION_UID) {
                Ok(Value::Int(v)) => *v as u64,
                _ => ob.uid(),
            };
            // TOAST's `local_index_offset`: 0, as each process holds whole
            // observations (`distribute_time = False`).
            let first_sample = 0u64;
            let telescope = ob.telescope().uid;
            let dets = ctx.selected_detectors(ob.local_detectors());
            let n = ob.n_samples();
            let model = ob.meta.object::<AnalyticNoiseModel>(&cfg.noise_model)?;
            // One filter per distinct set of parameters.
            let mut filters: Vec<(AnalyticNoiseParams, NoiseFilter)> = Vec::new();
            let mut which = Vec::with_capacity(dets.len());
            let mut keys = Vec::with_capacity(dets.len());
            for d in &dets {
                let p = *model
                    .params
                    .get(d)
                    .ok_or_else(|| model_err(format!("no parameters for detector '{d}'")))?;
                let i = match filters.iter().position(|(q, _)| *q == p) {
                    Some(i) => i,
                    None => {
                        let (freq, psd) = p
                            .tabulate()
                            .map_err(|e| model_err(format!("detector '{d}': {e}")))?;
                        let f = NoiseFilter::new(rate, n, 2, &freq, &psd)
                            .map_err(|e| model_err(format!("detector '{d}': {e}")))?;
                        filters.push((p, f));
                        filters.len() - 1
                    }
                };
                which.push(i);
                keys.push(NoiseKey {
                    realization: cfg.realization,
                    telescope,
                    component: cfg.component,
                    session,
                    detector: ob.detector(d)?.uid,
                });
            }
            if dets.is_empty() {
                continue;
            }
            let fft_len = filters[0].1.fft_len();
            let amplitudes: Vec<f64> = filters
                .iter()
                .flat_map(|(_, f)| f.amplitude().iter().copied())
                .collect();
            let filter_index: Vec<i32> = which.iter().map(|&i| i as i32).collect();
            let keys: Vec<u64> = keys.iter().flat_map(NoiseKey::rng_key).collect();
            let streams = NoiseStreams {
                fft_len: fft_len as u64,
                counter0: filters[0].1.counter0(first_sample),
                amplitudes: &amplitudes,
                filter_index: &filter_index,
                keys: &keys,
            };
            kernels::sim_noise(ctx, &self.name, &dets, ob, meta, &cfg.det_data, streams)?;
        }
        Ok(())
    }
}
