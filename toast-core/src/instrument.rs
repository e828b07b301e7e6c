//! Detectors, focalplanes and telescopes.
//!
//! The typed fields of [`Detector`] are the focalplane columns that TOAST's
//! operators read (`quat`, `gamma`, `psi_pol`, `pol_leakage`, `psd_net`,
//! `psd_fknee`, `psd_fmin`, `psd_alpha`, `fwhm`, `bandcenter`, `bandwidth`,
//! `pixel`), in TOAST's units; anything else goes into [`Detector::extra`].

use crate::error::DataError;
use crate::meta::Value;
use crate::uid::name_uid;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One detector of a focalplane.
#[derive(Debug, Clone, PartialEq)]
pub struct Detector {
    /// Unique name.
    pub name: String,
    /// `name_uid(name)` by default (TOAST's `name_UID`, 31 bits).
    pub uid: u64,
    /// Offset from the boresight, quaternion `[x, y, z, w]` (scalar last).
    pub quat: [f64; 4],
    /// Polarisation orientation `gamma` in the xi/eta/gamma frame (radians);
    /// StokesWeights uses it with a HWP.
    pub gamma: f64,
    /// Rotation from the beam frame to the polarisation-sensitive direction (radians).
    pub psi_pol: f64,
    /// Cross-polar leakage `epsilon` (TOAST `pol_leakage`): the Stokes
    /// weights scale Q and U by `(1 - epsilon) / (1 + epsilon)`.
    pub pol_leakage: f64,
    /// Polarisation efficiency (1 for an ideal polarimeter).
    pub pol_efficiency: f64,
    /// Noise equivalent temperature `psd_net` (K·√s).
    pub net: f64,
    /// 1/f knee frequency `psd_fknee` (Hz).
    pub fknee: f64,
    /// Low-frequency flattening `psd_fmin` (Hz).
    pub fmin: f64,
    /// 1/f slope `psd_alpha`.
    pub alpha: f64,
    /// Beam FWHM (arcmin).
    pub fwhm: f64,
    /// Band centre (GHz).
    pub bandcenter: f64,
    /// Band width (GHz).
    pub bandwidth: f64,
    /// Name of the pixel (detector set key: A/B pairs share it).
    pub pixel: String,
    /// Any other property.
    pub extra: BTreeMap<String, Value>,
}

impl Detector {
    /// A detector with an identity offset and zero/neutral properties.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Detector {
            uid: name_uid(&name) as u64,
            pixel: name.clone(),
            name,
            quat: [0.0, 0.0, 0.0, 1.0],
            gamma: 0.0,
            psi_pol: 0.0,
            pol_leakage: 0.0,
            pol_efficiency: 1.0,
            net: 0.0,
            fknee: 0.0,
            fmin: 0.0,
            alpha: 1.0,
            fwhm: 0.0,
            bandcenter: 0.0,
            bandwidth: 0.0,
            extra: BTreeMap::new(),
        }
    }
}

/// The detectors of an instrument and their sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Focalplane {
    detectors: Vec<Detector>,
    index: HashMap<String, usize>,
    sample_rate: f64,
}

impl Focalplane {
    /// A focalplane; detector names must be unique.
    pub fn new(detectors: Vec<Detector>, sample_rate: f64) -> Result<Self, DataError> {
        let mut index = HashMap::with_capacity(detectors.len());
        for (i, d) in detectors.iter().enumerate() {
            if index.insert(d.name.clone(), i).is_some() {
                return Err(DataError::DuplicateDetector {
                    where_: "focalplane".into(),
                    detector: d.name.clone(),
                });
            }
        }
        Ok(Focalplane {
            detectors,
            index,
            sample_rate,
        })
    }

    /// Sample rate (Hz).
    pub fn sample_rate(&self) -> f64 {
        self.sample_rate
    }

    /// The detectors, in order.
    pub fn detectors(&self) -> &[Detector] {
        &self.detectors
    }

    /// Number of detectors.
    pub fn len(&self) -> usize {
        self.detectors.len()
    }

    /// Whether there is no detector.
    pub fn is_empty(&self) -> bool {
        self.detectors.is_empty()
    }

    /// A detector by name.
    pub fn get(&self, name: &str) -> Option<&Detector> {
        self.index.get(name).map(|&i| &self.detectors[i])
    }

    /// Names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.detectors.iter().map(|d| d.name.as_str())
    }
}

/// A telescope: a name and a focalplane, shared by its observations.
#[derive(Debug, Clone, PartialEq)]
pub struct Telescope {
    /// Name.
    pub name: String,
    /// `name_uid(name)` by default.
    pub uid: u64,
    /// The focalplane (shared: thousands of observations use one).
    pub focalplane: Arc<Focalplane>,
}

impl Telescope {
    /// A telescope with a uid derived from its name.
    pub fn new(name: impl Into<String>, focalplane: Arc<Focalplane>) -> Self {
        let name = name.into();
        Telescope {
            uid: name_uid(&name) as u64,
            name,
            focalplane,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn focalplane_lookup_and_duplicates() {
        let mut a = Detector::new("D0A-150");
        a.net = 50e-6;
        a.extra.insert("wafer".into(), Value::from("w0"));
        let b = Detector::new("D0B-150");
        assert_eq!(a.uid, 965203544);
        let fp = Focalplane::new(vec![a.clone(), b], 100.0).unwrap();
        assert_eq!(fp.len(), 2);
        assert_eq!(fp.get("D0A-150").unwrap().net, 50e-6);
        assert!(fp.get("nope").is_none());
        assert_eq!(fp.names().collect::<Vec<_>>(), ["D0A-150", "D0B-150"]);
        let e = Focalplane::new(vec![a.clone(), a], 1.0).unwrap_err();
        assert_eq!(e.to_string(), "focalplane: duplicate detector 'D0A-150'");
        let t = Telescope::new("telescope", Arc::new(fp));
        assert_eq!(t.uid, 1274491784);
        assert_eq!(t.focalplane.sample_rate(), 100.0);
    }
}
