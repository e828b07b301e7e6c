//! Observations and the [`Data`] container.

use crate::detdata::DetDataManager;
use crate::error::{Category, DataError};
use crate::instrument::{Detector, Telescope};
use crate::intervals::IntervalList;
use crate::meta::Meta;
use crate::shared::SharedData;
use crate::uid::name_uid;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Default field names and flag bits, as TOAST's `observation.default_values`.
pub mod defaults {
    /// Shared timestamps (f64, seconds).
    pub const TIMES: &str = "times";
    /// Shared flags (u8).
    pub const SHARED_FLAGS: &str = "flags";
    /// Detector timestreams (f64).
    pub const DET_DATA: &str = "signal";
    /// Detector flags (u8).
    pub const DET_FLAGS: &str = "flags";
    /// HWP angle (f64, radians).
    pub const HWP_ANGLE: &str = "hwp_angle";
    /// Boresight quaternions in celestial coordinates (f64 ×4).
    pub const BORESIGHT_RADEC: &str = "boresight_radec";
    /// Boresight quaternions in horizontal coordinates (f64 ×4).
    pub const BORESIGHT_AZEL: &str = "boresight_azel";
    /// Position (f64 ×3, km).
    pub const POSITION: &str = "position";
    /// Velocity (f64 ×3, km/s).
    pub const VELOCITY: &str = "velocity";
    /// Pixel indices (i64).
    pub const PIXELS: &str = "pixels";
    /// Stokes weights (f64 ×nnz).
    pub const WEIGHTS: &str = "weights";
    /// Detector quaternions (f64 ×4).
    pub const QUATS: &str = "quats";
    /// Noise model metadata key.
    pub const NOISE_MODEL: &str = "noise_model";

    /// Shared flag: invalid sample.
    pub const SHARED_MASK_INVALID: u8 = 1;
    /// Shared flag: cut by processing.
    pub const SHARED_MASK_PROCESSING: u8 = 2;
    /// Shared flag: unstable scan rate.
    pub const SHARED_MASK_UNSTABLE_SCANRATE: u8 = 4;
    /// Shared flag: irregular sampling.
    pub const SHARED_MASK_IRREGULAR: u8 = 8;
    /// All shared non-science bits.
    pub const SHARED_MASK_NONSCIENCE: u8 = 1 | 2 | 4 | 8;
    /// Detector flag: invalid.
    pub const DET_MASK_INVALID: u8 = 1;
    /// Detector flag: cut by processing.
    pub const DET_MASK_PROCESSING: u8 = 2;
    /// Detector flag: solar-system object.
    pub const DET_MASK_SSO: u8 = 4;
    /// All detector non-science bits.
    pub const DET_MASK_NONSCIENCE: u8 = 1 | 2 | 4;
}

/// One observation: a span of samples of one telescope, with its shared
/// data, per-detector data, named intervals and metadata.
///
/// The data managers are public fields so that an operator can borrow
/// several of them at once (read `shared` while writing `detdata`).
#[derive(Debug)]
pub struct Observation {
    name: String,
    uid: u64,
    telescope: Telescope,
    n_samples: usize,
    local_detectors: Arc<[String]>,
    det_flags: BTreeMap<String, u8>,
    /// Per-sample data shared by all detectors.
    pub shared: SharedData,
    /// Per-detector data.
    pub detdata: DetDataManager,
    /// Named interval lists.
    pub intervals: IntervalsManager,
    /// Metadata (`noise_model`, ...).
    pub meta: Meta,
}

impl Observation {
    /// An observation of all the telescope's detectors. Its uid is
    /// [`name_uid`] of its name, as TOAST's `name_UID` (31 bits), so
    /// anything keyed on it (noise streams) matches TOAST.
    pub fn new(
        name: impl Into<String>,
        telescope: Telescope,
        n_samples: usize,
    ) -> Result<Self, DataError> {
        let dets: Vec<String> = telescope.focalplane.names().map(String::from).collect();
        Self::with_detectors(name, telescope, n_samples, &dets)
    }

    /// An observation of a subset of the telescope's detectors (this
    /// process's share), in the given order.
    pub fn with_detectors(
        name: impl Into<String>,
        telescope: Telescope,
        n_samples: usize,
        detectors: &[String],
    ) -> Result<Self, DataError> {
        let name = name.into();
        for (i, d) in detectors.iter().enumerate() {
            if detectors[..i].contains(d) {
                return Err(DataError::DuplicateDetector {
                    where_: format!("observation '{name}'"),
                    detector: d.clone(),
                });
            }
            if telescope.focalplane.get(d).is_none() {
                return Err(DataError::MissingDetector {
                    observation: name,
                    where_: format!("the focalplane of telescope '{}'", telescope.name),
                    detector: d.clone(),
                });
            }
        }
        let local: Arc<[String]> = detectors.to_vec().into();
        let obs: Arc<str> = Arc::from(name.as_str());
        Ok(Observation {
            uid: name_uid(&name) as u64,
            det_flags: detectors.iter().map(|d| (d.clone(), 0u8)).collect(),
            shared: SharedData::new(obs.clone(), n_samples),
            detdata: DetDataManager::new(obs.clone(), n_samples, local.clone()),
            intervals: IntervalsManager::new(obs, n_samples),
            meta: Meta::new(format!("observation '{name}'")),
            name,
            telescope,
            n_samples,
            local_detectors: local,
        })
    }

    /// Override the uid (TOAST allows an explicit one).
    pub fn set_uid(&mut self, uid: u64) {
        self.uid = uid;
    }

    /// Name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unique id (see [`Observation::new`]).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// The telescope.
    pub fn telescope(&self) -> &Telescope {
        &self.telescope
    }

    /// Sample rate of the focalplane (Hz).
    pub fn sample_rate(&self) -> f64 {
        self.telescope.focalplane.sample_rate()
    }

    /// Number of samples.
    pub fn n_samples(&self) -> usize {
        self.n_samples
    }

    /// The detectors held here, in row order of full-size detdata fields.
    pub fn local_detectors(&self) -> &[String] {
        &self.local_detectors
    }

    /// The focalplane entry of a local detector.
    pub fn detector(&self, name: &str) -> Result<&Detector, DataError> {
        if !self.local_detectors.iter().any(|d| d == name) {
            return Err(self.no_detector(name));
        }
        self.telescope
            .focalplane
            .get(name)
            .ok_or_else(|| self.no_detector(name))
    }

    fn no_detector(&self, name: &str) -> DataError {
        DataError::MissingDetector {
            observation: self.name.clone(),
            where_: "local detectors".into(),
            detector: name.to_string(),
        }
    }

    /// The timestamps (shared field `times`).
    pub fn times(&self) -> Result<&[f64], DataError> {
        self.shared.data::<f64>(defaults::TIMES)
    }

    /// Per-detector flags of a local detector (TOAST's `local_detector_flags`).
    pub fn det_flags(&self, det: &str) -> Result<u8, DataError> {
        self.det_flags
            .get(det)
            .copied()
            .ok_or_else(|| self.no_detector(det))
    }

    /// OR `bits` into a detector's flags.
    pub fn set_det_flags(&mut self, det: &str, bits: u8) -> Result<(), DataError> {
        let e = self.no_detector(det);
        *self.det_flags.get_mut(det).ok_or(e)? |= bits;
        Ok(())
    }

    /// Clear `bits` of a detector's flags.
    pub fn clear_det_flags(&mut self, det: &str, bits: u8) -> Result<(), DataError> {
        let e = self.no_detector(det);
        *self.det_flags.get_mut(det).ok_or(e)? &= !bits;
        Ok(())
    }

    /// Local detectors whose flags have none of the `mask` bits, in order
    /// (TOAST's `select_local_detectors(flagmask=mask)`).
    pub fn select_detectors(&self, mask: u8) -> Vec<String> {
        self.local_detectors
            .iter()
            .filter(|d| self.det_flags.get(*d).copied().unwrap_or(0) & mask == 0)
            .cloned()
            .collect()
    }

    /// Store as interval list `name` the runs of samples whose shared flags
    /// (field `flag_field`, u8) have none of the `mask` bits.
    pub fn intervals_from_shared_flags(
        &mut self,
        name: &str,
        flag_field: &str,
        mask: u8,
    ) -> Result<(), DataError> {
        let times = self.times()?;
        let flags = self.shared.data::<u8>(flag_field)?;
        let list = IntervalList::from_flags(times, flags, mask).map_err(|source| {
            DataError::Intervals {
                observation: self.name.clone(),
                field: name.to_string(),
                source,
            }
        })?;
        self.intervals.insert(name, list)
    }

    /// Store as interval list `name` the closed time spans `spans`
    /// (see [`IntervalList::from_timespans`]).
    pub fn intervals_from_timespans(
        &mut self,
        name: &str,
        spans: &[(f64, f64)],
    ) -> Result<(), DataError> {
        let list = IntervalList::from_timespans(self.times()?, spans).map_err(|source| {
            DataError::Intervals {
                observation: self.name.clone(),
                field: name.to_string(),
                source,
            }
        })?;
        self.intervals.insert(name, list)
    }

    /// Store as interval list `name` the sample ranges `ranges`.
    pub fn intervals_from_samples(
        &mut self,
        name: &str,
        ranges: &[(i64, i64)],
    ) -> Result<(), DataError> {
        let list = IntervalList::from_samples(self.times()?, ranges).map_err(|source| {
            DataError::Intervals {
                observation: self.name.clone(),
                field: name.to_string(),
                source,
            }
        })?;
        self.intervals.insert(name, list)
    }

    /// Whether an item of a category exists here (`Global` is never here).
    pub fn has(&self, category: Category, name: &str) -> bool {
        match category {
            Category::Global => false,
            Category::Meta => self.meta.contains(name),
            Category::DetData => self.detdata.contains(name),
            Category::Shared => self.shared.contains(name),
            Category::Intervals => self.intervals.contains(name),
        }
    }

    fn not_contiguous(&self, category: Category, name: &str) -> DataError {
        DataError::NotContiguous {
            observation: self.name.clone(),
            category,
            field: name.to_string(),
        }
    }

    /// The bytes of a contiguous field (detdata, shared, intervals), for a
    /// device transfer.
    pub fn field_bytes(&self, category: Category, name: &str) -> Result<&[u8], DataError> {
        match category {
            Category::DetData => Ok(self.detdata.get(name)?.as_bytes()),
            Category::Shared => Ok(self.shared.get(name)?.as_bytes()),
            Category::Intervals => Ok(self.intervals.get(name)?.as_bytes()),
            Category::Global | Category::Meta => Err(self.not_contiguous(category, name)),
        }
    }

    /// The bytes of a contiguous field, mutably (interval lists are
    /// read-only on the device and cannot be written back).
    pub fn field_bytes_mut(
        &mut self,
        category: Category,
        name: &str,
    ) -> Result<&mut [u8], DataError> {
        match category {
            Category::DetData => Ok(self.detdata.get_mut(name)?.as_bytes_mut()),
            Category::Shared => Ok(self.shared.get_mut(name)?.as_bytes_mut()),
            Category::Intervals => Err(DataError::ReadOnlyOnDevice {
                observation: self.name.clone(),
                category,
                field: name.to_string(),
            }),
            Category::Global | Category::Meta => Err(self.not_contiguous(category, name)),
        }
    }
}

/// The named interval lists of one observation.
#[derive(Debug, Clone, PartialEq)]
pub struct IntervalsManager {
    observation: Arc<str>,
    n_samples: usize,
    lists: BTreeMap<String, IntervalList>,
}

impl IntervalsManager {
    fn new(observation: Arc<str>, n_samples: usize) -> Self {
        IntervalsManager {
            observation,
            n_samples,
            lists: BTreeMap::new(),
        }
    }

    /// Store a list (replacing one of the same name); it must cover this
    /// observation's number of samples.
    pub fn insert(&mut self, name: &str, list: IntervalList) -> Result<(), DataError> {
        if list.n_samples() != self.n_samples {
            return Err(DataError::Intervals {
                observation: self.observation.to_string(),
                field: name.to_string(),
                source: crate::intervals::IntervalError::LengthMismatch {
                    what: "interval list",
                    expected: self.n_samples,
                    actual: list.n_samples(),
                },
            });
        }
        self.lists.insert(name.to_string(), list);
        Ok(())
    }

    /// A list by name.
    pub fn get(&self, name: &str) -> Result<&IntervalList, DataError> {
        self.lists.get(name).ok_or_else(|| DataError::MissingField {
            observation: self.observation.to_string(),
            category: Category::Intervals,
            field: name.to_string(),
        })
    }

    /// A list by name, or, for `None`, one interval over the whole
    /// observation (TOAST's default view), built from `times`.
    pub fn view(&self, name: Option<&str>, times: &[f64]) -> Result<IntervalList, DataError> {
        match name {
            Some(n) => self.get(n).cloned(),
            None => Ok(IntervalList::full(times)),
        }
    }

    /// Whether the list exists.
    pub fn contains(&self, name: &str) -> bool {
        self.lists.contains_key(name)
    }

    /// Remove a list.
    pub fn remove(&mut self, name: &str) -> Result<IntervalList, DataError> {
        self.lists
            .remove(name)
            .ok_or_else(|| DataError::MissingField {
                observation: self.observation.to_string(),
                category: Category::Intervals,
                field: name.to_string(),
            })
    }

    /// Names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.lists.keys().map(String::as_str)
    }

    /// Number of lists.
    pub fn len(&self) -> usize {
        self.lists.len()
    }

    /// Whether there is no list.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }
}

/// The observations of this process and the data-level metadata.
#[derive(Debug)]
pub struct Data {
    /// Observations, in order.
    pub obs: Vec<Observation>,
    /// Data-level ("global") metadata: maps, pixel distributions, ...
    pub meta: Meta,
}

impl Default for Data {
    fn default() -> Self {
        Self::new()
    }
}

impl Data {
    /// No observations.
    pub fn new() -> Self {
        Data {
            obs: Vec::new(),
            meta: Meta::new("data"),
        }
    }

    /// Add an observation; names must be unique.
    pub fn push(&mut self, obs: Observation) -> Result<(), DataError> {
        if self.obs.iter().any(|o| o.name == obs.name) {
            return Err(DataError::DuplicateObservation { name: obs.name });
        }
        self.obs.push(obs);
        Ok(())
    }

    /// Remove the detector-data fields `names` from every observation that
    /// has them (absent ones are skipped).
    pub fn remove_detdata<S: AsRef<str>>(&mut self, names: &[S]) -> Result<(), DataError> {
        for ob in &mut self.obs {
            for n in names {
                let n = n.as_ref();
                if ob.detdata.contains(n) {
                    ob.detdata.remove(n)?;
                }
            }
        }
        Ok(())
    }

    /// An observation by name.
    pub fn get(&self, name: &str) -> Result<&Observation, DataError> {
        self.obs
            .iter()
            .find(|o| o.name == name)
            .ok_or_else(|| DataError::MissingObservation {
                name: name.to_string(),
            })
    }

    /// An observation by name, mutably.
    pub fn get_mut(&mut self, name: &str) -> Result<&mut Observation, DataError> {
        self.obs
            .iter_mut()
            .find(|o| o.name == name)
            .ok_or_else(|| DataError::MissingObservation {
                name: name.to_string(),
            })
    }

    /// Number of observations.
    pub fn n_obs(&self) -> usize {
        self.obs.len()
    }

    /// The union of the local detectors of all observations, in first-seen
    /// order, skipping detectors flagged with `mask` (TOAST's
    /// `all_local_detectors`).
    pub fn all_local_detectors(&self, mask: u8) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for ob in &self.obs {
            for d in ob.select_detectors(mask) {
                if seen.insert(d.clone()) {
                    out.push(d);
                }
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::instrument::Focalplane;

    pub(crate) fn telescope(n_det: usize) -> Telescope {
        let dets = (0..n_det)
            .map(|i| Detector::new(format!("D{}{}", i / 2, if i % 2 == 0 { "A" } else { "B" })))
            .collect();
        Telescope::new("sat", Arc::new(Focalplane::new(dets, 10.0).unwrap()))
    }

    pub(crate) fn observation(name: &str, n_det: usize, n_samples: usize) -> Observation {
        let mut ob = Observation::new(name, telescope(n_det), n_samples).unwrap();
        let times: Vec<f64> = (0..n_samples).map(|i| i as f64 * 0.1).collect();
        ob.shared.set(defaults::TIMES, &[], &times).unwrap();
        ob
    }

    #[test]
    fn observation_basics() {
        let ob = observation("science_00000", 4, 10);
        assert_eq!(ob.uid(), 1501363988, "TOAST name_UID");
        assert_eq!(ob.sample_rate(), 10.0);
        assert_eq!(ob.n_samples(), 10);
        assert_eq!(ob.local_detectors(), ["D0A", "D0B", "D1A", "D1B"]);
        assert_eq!(ob.detector("D1A").unwrap().name, "D1A");
        assert!(ob.detector("X").is_err());
        assert_eq!(ob.times().unwrap()[3], 0.30000000000000004);

        let sub = ["D1B".to_string(), "D0A".to_string()];
        let ob2 = Observation::with_detectors("o2", telescope(4), 5, &sub).unwrap();
        assert_eq!(ob2.local_detectors(), sub);
        let e = Observation::with_detectors("o3", telescope(4), 5, &["Q".to_string()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'o3': the focalplane of telescope 'sat' has no detector 'Q'"
        );
        let dup = ["D0A".to_string(), "D0A".to_string()];
        let e = Observation::with_detectors("o4", telescope(4), 5, &dup).unwrap_err();
        assert_eq!(e.to_string(), "observation 'o4': duplicate detector 'D0A'");
    }

    #[test]
    fn detector_flags_and_selection() {
        let mut ob = observation("o", 4, 5);
        ob.set_det_flags("D0B", defaults::DET_MASK_INVALID).unwrap();
        ob.set_det_flags("D1A", defaults::DET_MASK_SSO).unwrap();
        assert_eq!(ob.det_flags("D0B").unwrap(), 1);
        assert_eq!(
            ob.select_detectors(defaults::DET_MASK_INVALID),
            ["D0A", "D1A", "D1B"]
        );
        assert_eq!(
            ob.select_detectors(defaults::DET_MASK_NONSCIENCE),
            ["D0A", "D1B"]
        );
        ob.clear_det_flags("D1A", 0xFF).unwrap();
        assert_eq!(ob.select_detectors(0xFF), ["D0A", "D1A", "D1B"]);
        assert!(ob.set_det_flags("nope", 1).is_err());
        assert!(ob.det_flags("nope").is_err());
    }

    #[test]
    fn intervals_and_flags_helpers() {
        let mut ob = observation("o", 2, 10);
        ob.shared
            .set::<u8>(defaults::SHARED_FLAGS, &[], &[0, 1, 1, 0, 0, 2, 0, 0, 0, 1])
            .unwrap();
        ob.intervals_from_shared_flags("good", defaults::SHARED_FLAGS, 1)
            .unwrap();
        let good = ob.intervals.get("good").unwrap();
        let got: Vec<(i64, i64)> = good.iter().map(|iv| (iv.first, iv.last)).collect();
        assert_eq!(got, vec![(0, 1), (3, 9)]);
        // Closed rule: samples 2..=5 (times 0.2 and 0.5 are exact sample times).
        ob.intervals_from_timespans("span", &[(0.2, 0.5)]).unwrap();
        assert_eq!(ob.intervals.get("span").unwrap().total_samples(), 4);
        ob.intervals_from_samples("s", &[(0, 4)]).unwrap();
        let e = ob.intervals_from_samples("bad", &[(0, 40)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'o': intervals 'bad': interval 0 [0, 40) is outside the 10 samples"
        );
        let e = ob
            .intervals
            .insert("x", IntervalList::empty(3))
            .unwrap_err();
        assert!(matches!(e, DataError::Intervals { .. }));
        let full = ob.intervals.view(None, ob.times().unwrap()).unwrap();
        assert_eq!(full.total_samples(), 10);
        assert_eq!(
            ob.intervals.names().collect::<Vec<_>>(),
            ["good", "s", "span"]
        );
        assert!(ob.has(Category::Intervals, "good"));
        ob.intervals.remove("s").unwrap();
        assert!(ob.intervals.get("s").is_err());
    }

    #[test]
    fn field_bytes_by_category() {
        let mut ob = observation("o", 2, 4);
        ob.detdata.create("signal", DType::F32, &[], None).unwrap();
        ob.intervals_from_samples("iv", &[(1, 3)]).unwrap();
        ob.meta.set("x", 1i64);
        assert_eq!(
            ob.field_bytes(Category::DetData, "signal").unwrap().len(),
            32
        );
        assert_eq!(ob.field_bytes(Category::Shared, "times").unwrap().len(), 32);
        assert_eq!(ob.field_bytes(Category::Intervals, "iv").unwrap().len(), 32);
        ob.field_bytes_mut(Category::DetData, "signal").unwrap()[0..4]
            .copy_from_slice(&2.5f32.to_ne_bytes());
        assert_eq!(
            ob.detdata.get("signal").unwrap().row::<f32>(0).unwrap()[0],
            2.5
        );
        let e = ob.field_bytes(Category::Meta, "x").unwrap_err();
        assert!(matches!(e, DataError::NotContiguous { .. }));
        assert!(matches!(
            ob.field_bytes_mut(Category::Intervals, "iv"),
            Err(DataError::ReadOnlyOnDevice { .. })
        ));
        assert!(ob.has(Category::Meta, "x"));
        assert!(!ob.has(Category::Global, "x"));
    }

    #[test]
    fn data_container() {
        let mut data = Data::new();
        data.push(observation("a", 2, 3)).unwrap();
        data.push(observation("b", 4, 3)).unwrap();
        let e = data.push(observation("a", 2, 3)).unwrap_err();
        assert_eq!(e.to_string(), "an observation named 'a' already exists");
        assert_eq!(data.n_obs(), 2);
        data.get_mut("a").unwrap().set_det_flags("D0A", 1).unwrap();
        assert_eq!(data.all_local_detectors(1), ["D0B", "D0A", "D1A", "D1B"]);
        assert!(matches!(
            data.get("zz"),
            Err(DataError::MissingObservation { .. })
        ));
        data.meta.set("nside", 64i64);
        assert_eq!(data.meta.get_int("nside").unwrap(), 64);
        assert_eq!(data.get("b").unwrap().local_detectors().len(), 4);
    }
}
