//! Detector noise weights and the `NoiseWeight` operator.
//!
//! TOAST's map-maker weights each detector by its noise model's
//! `detector_weight(det)`: the inverse of the white-noise PSD level times the
//! sample rate, `1 / (PSD_white · rate)`, which for an analytic 1/f model is
//! about `1 / (NET² · rate)` (in 1/K²). The noise model lives in the
//! observation's metadata (key `noise_model`). This crate only needs that
//! one number per detector, through the [`DetectorWeights`] trait, and finds
//! it in a metadata object stored as
//!
//! * an `Arc<dyn DetectorWeights>` or `Box<dyn DetectorWeights>`,
//! * a [`WhiteNoiseWeights`] (explicit weights, or from the focalplane NETs:
//!   `1 / (NET² · rate)`, exactly TOAST's `AnalyticNoise` weight),
//! * a `BTreeMap` or `HashMap` from detector name to
//!   [`crate::noise_model::AnalyticNoiseParams`] (the analytic model,
//!   weight [`crate::noise_model::AnalyticNoiseParams::detector_weight`]),
//! * or any type registered once with [`register_noise_model`] (how a noise
//!   model type defined elsewhere, e.g. an analytic PSD model, plugs in
//!   without this crate knowing it).

use super::util::select_detectors;
use crate::exec::kernels::{self, view_intervals, KernelCall};
use crate::noise_model::AnalyticNoiseParams;
use serde::Deserialize;
use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use toast_core::meta::MetaItem;
use toast_core::observation::defaults;
use toast_core::{Category, Data, ExecContext, Observation, OpError, Operator, Requirements};

/// A noise model's per-detector weight (TOAST's `Noise.detector_weight`):
/// the inverse white-noise variance per sample, `1 / (PSD_white · rate)`.
pub trait DetectorWeights: Send + Sync {
    /// The weight of `det`, or `None` if the model does not know it. A weight
    /// of 0 means the detector is cut by the noise model.
    fn detector_weight(&self, det: &str) -> Option<f64>;
}

/// Explicit detector weights.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WhiteNoiseWeights {
    /// Weight per detector (1/K²).
    pub weights: BTreeMap<String, f64>,
}

impl WhiteNoiseWeights {
    /// Weights `1 / (NET² · rate)` from the focalplane NETs of an
    /// observation's local detectors (0 for a detector with NET 0).
    pub fn from_net(ob: &Observation) -> Result<Self, OpError> {
        let rate = ob.sample_rate();
        let mut weights = BTreeMap::new();
        for d in ob.local_detectors() {
            let net = ob.detector(d)?.net;
            let w = if net > 0.0 && rate > 0.0 {
                1.0 / (net * net * rate)
            } else {
                0.0
            };
            weights.insert(d.clone(), w);
        }
        Ok(WhiteNoiseWeights { weights })
    }
}

impl DetectorWeights for WhiteNoiseWeights {
    fn detector_weight(&self, det: &str) -> Option<f64> {
        self.weights.get(det).copied()
    }
}

impl DetectorWeights for BTreeMap<String, AnalyticNoiseParams> {
    fn detector_weight(&self, det: &str) -> Option<f64> {
        self.get(det).map(AnalyticNoiseParams::detector_weight)
    }
}

impl DetectorWeights for HashMap<String, AnalyticNoiseParams> {
    fn detector_weight(&self, det: &str) -> Option<f64> {
        self.get(det).map(AnalyticNoiseParams::detector_weight)
    }
}

type Probe = for<'a> fn(&'a (dyn Any + Send + Sync)) -> Option<&'a dyn DetectorWeights>;

fn probe<T: DetectorWeights + 'static>(
    a: &(dyn Any + Send + Sync),
) -> Option<&dyn DetectorWeights> {
    a.downcast_ref::<T>().map(|t| t as &dyn DetectorWeights)
}

static REGISTERED: RwLock<Vec<Probe>> = RwLock::new(Vec::new());

/// Let [`detector_weights`] find noise models of type `T` stored directly in
/// observation metadata. Registering a type twice is harmless.
pub fn register_noise_model<T: DetectorWeights + 'static>() {
    let p: Probe = probe::<T>;
    let mut reg = REGISTERED.write().unwrap_or_else(|e| e.into_inner());
    if !reg.iter().any(|q| std::ptr::fn_addr_eq(*q, p)) {
        reg.push(p);
    }
}

fn as_weights(object: &(dyn Any + Send + Sync)) -> Option<&dyn DetectorWeights> {
    if let Some(a) = object.downcast_ref::<Arc<dyn DetectorWeights>>() {
        return Some(a.as_ref());
    }
    if let Some(b) = object.downcast_ref::<Box<dyn DetectorWeights>>() {
        return Some(b.as_ref());
    }
    if let Some(w) = probe::<WhiteNoiseWeights>(object) {
        return Some(w);
    }
    if let Some(w) = probe::<BTreeMap<String, AnalyticNoiseParams>>(object) {
        return Some(w);
    }
    if let Some(w) = probe::<HashMap<String, AnalyticNoiseParams>>(object) {
        return Some(w);
    }
    let reg = REGISTERED.read().unwrap_or_else(|e| e.into_inner());
    reg.iter().find_map(|p| p(object))
}

/// The noise weights of `dets` from the noise model at `key` in the
/// observation's metadata.
pub fn detector_weights(ob: &Observation, key: &str, dets: &[String]) -> Result<Vec<f64>, OpError> {
    let err = |problem: String| OpError::NoiseModel {
        observation: ob.name().to_string(),
        key: key.to_string(),
        problem,
    };
    let model = match ob.meta.item(key) {
        Some(MetaItem::Object { object, type_name }) => {
            as_weights(object.as_ref()).ok_or_else(|| {
                err(format!(
                    "it is a {type_name}, which gives no detector weights (store an \
                     Arc<dyn DetectorWeights>, or register the type with register_noise_model)"
                ))
            })?
        }
        Some(MetaItem::Value(v)) => {
            return Err(err(format!("it is a plain {} value", v.type_name())))
        }
        None => return Err(err("not in the observation's metadata".into())),
    };
    dets.iter()
        .map(|d| match model.detector_weight(d) {
            Some(w) if w.is_finite() && w >= 0.0 => Ok(w),
            Some(w) => Err(err(format!("gives detector '{d}' the weight {w}"))),
            None => Err(err(format!("has no detector '{d}'"))),
        })
        .collect()
}

/// Configuration of [`NoiseWeight`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NoiseWeightConfig {
    /// Whether the operator runs (TOAST's `enabled`).
    pub enabled: bool,
    /// Observation metadata key of the noise model.
    pub noise_model: String,
    /// Interval list (`None`: every sample).
    pub view: Option<String>,
    /// Timestream field.
    pub det_data: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
}

impl Default for NoiseWeightConfig {
    fn default() -> Self {
        NoiseWeightConfig {
            enabled: true,
            noise_model: defaults::NOISE_MODEL.into(),
            view: None,
            det_data: defaults::DET_DATA.into(),
            det_mask: defaults::DET_MASK_INVALID,
        }
    }
}

/// Multiply each detector's timestream by its noise weight (the
/// `noise_weight` kernel).
#[derive(Debug, Clone)]
pub struct NoiseWeight {
    name: String,
    /// The configuration.
    pub config: NoiseWeightConfig,
}

impl NoiseWeight {
    /// An operator.
    pub fn new(name: impl Into<String>, config: NoiseWeightConfig) -> Self {
        NoiseWeight {
            name: name.into(),
            config,
        }
    }
}

impl Operator for NoiseWeight {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .meta(&self.config.noise_model)
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

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let c = &self.config;
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = select_detectors(ctx, ob, c.det_mask);
            if dets.is_empty() || !ob.detdata.contains(&c.det_data) {
                continue;
            }
            let weights = detector_weights(ob, &c.noise_model, &dets)?;
            let intervals = view_intervals(ob, c.view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            kernels::noise_weight(ctx, call, ob, meta, &c.det_data, &weights)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use toast_core::{Detector, Focalplane, Telescope};

    #[derive(Debug)]
    struct Flat(f64);
    impl DetectorWeights for Flat {
        fn detector_weight(&self, _det: &str) -> Option<f64> {
            Some(self.0)
        }
    }

    fn obs() -> Observation {
        let mut d = Detector::new("d0");
        d.net = 2.0;
        let fp = Arc::new(Focalplane::new(vec![d, Detector::new("d1")], 10.0).unwrap());
        Observation::new("o", Telescope::new("t", fp), 4).unwrap()
    }

    #[test]
    fn every_supported_model_form() {
        let mut ob = obs();
        let dets = vec!["d0".to_string()];
        let e = detector_weights(&ob, "noise_model", &dets)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "observation 'o': noise model 'noise_model': not in the observation's metadata"
        );
        ob.meta
            .set_object("noise_model", WhiteNoiseWeights::from_net(&ob).unwrap());
        assert_eq!(
            detector_weights(&ob, "noise_model", &dets).unwrap(),
            [1.0 / 40.0]
        );
        let e = detector_weights(&ob, "noise_model", &["zz".to_string()]).unwrap_err();
        assert!(e.to_string().contains("has no detector 'zz'"), "{e}");
        let arc: Arc<dyn DetectorWeights> = Arc::new(Flat(3.0));
        ob.meta.set_object("noise_model", arc);
        assert_eq!(detector_weights(&ob, "noise_model", &dets).unwrap(), [3.0]);
        let mut m = BTreeMap::new();
        m.insert(
            "d0".to_string(),
            AnalyticNoiseParams {
                rate: 10.0,
                net: 2.0,
                fknee: 0.0,
                fmin: 0.0,
                alpha: 1.0,
            },
        );
        ob.meta.set_object("noise_model", m);
        assert_eq!(
            detector_weights(&ob, "noise_model", &dets).unwrap(),
            [1.0 / 40.0]
        );
        ob.meta.set_object("noise_model", Flat(5.0));
        let e = detector_weights(&ob, "noise_model", &dets)
            .unwrap_err()
            .to_string();
        assert!(e.contains("register_noise_model"), "{e}");
        register_noise_model::<Flat>();
        register_noise_model::<Flat>();
        assert_eq!(detector_weights(&ob, "noise_model", &dets).unwrap(), [5.0]);
        ob.meta.set("noise_model", 1i64);
        assert!(detector_weights(&ob, "noise_model", &dets).is_err());
    }
}
