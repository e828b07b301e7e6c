//! The operator interface: typed requirements, the execution context, and
//! requirement checking.

use crate::comm::CommError;
use crate::device_buffers::DeviceFieldError;
use crate::error::{Category, DataError};
use crate::observation::Data;
use crate::timing::{TimerError, Timers};
use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use thiserror::Error;

/// One named item of a category.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    /// Its category.
    pub category: Category,
    /// Its name.
    pub name: String,
}

impl Item {
    /// An item.
    pub fn new(category: Category, name: impl Into<String>) -> Self {
        Item {
            category,
            name: name.into(),
        }
    }
}

impl fmt::Display for Item {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.category, self.name)
    }
}

/// Names an operator reads (`requires`) or writes (`provides`), in TOAST's
/// five categories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    /// Data-level metadata keys.
    pub global: Vec<String>,
    /// Observation metadata keys.
    pub meta: Vec<String>,
    /// Detector data fields.
    pub detdata: Vec<String>,
    /// Shared data fields.
    pub shared: Vec<String>,
    /// Interval lists.
    pub intervals: Vec<String>,
}

impl Requirements {
    /// Nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The names of one category.
    pub fn get(&self, category: Category) -> &[String] {
        match category {
            Category::Global => &self.global,
            Category::Meta => &self.meta,
            Category::DetData => &self.detdata,
            Category::Shared => &self.shared,
            Category::Intervals => &self.intervals,
        }
    }

    fn get_mut(&mut self, category: Category) -> &mut Vec<String> {
        match category {
            Category::Global => &mut self.global,
            Category::Meta => &mut self.meta,
            Category::DetData => &mut self.detdata,
            Category::Shared => &mut self.shared,
            Category::Intervals => &mut self.intervals,
        }
    }

    /// Add a name (no duplicates).
    pub fn add(&mut self, category: Category, name: impl Into<String>) {
        let name = name.into();
        let v = self.get_mut(category);
        if !v.contains(&name) {
            v.push(name);
        }
    }

    /// Builder: add a name.
    pub fn with(mut self, category: Category, name: impl Into<String>) -> Self {
        self.add(category, name);
        self
    }

    /// Builder: add a global key.
    pub fn global(self, name: impl Into<String>) -> Self {
        self.with(Category::Global, name)
    }

    /// Builder: add an observation metadata key.
    pub fn meta(self, name: impl Into<String>) -> Self {
        self.with(Category::Meta, name)
    }

    /// Builder: add a detdata field.
    pub fn detdata(self, name: impl Into<String>) -> Self {
        self.with(Category::DetData, name)
    }

    /// Builder: add a shared field.
    pub fn shared(self, name: impl Into<String>) -> Self {
        self.with(Category::Shared, name)
    }

    /// Builder: add an interval list.
    pub fn intervals(self, name: impl Into<String>) -> Self {
        self.with(Category::Intervals, name)
    }

    /// Whether a name is listed.
    pub fn contains(&self, category: Category, name: &str) -> bool {
        self.get(category).iter().any(|n| n == name)
    }

    /// Whether nothing is listed.
    pub fn is_empty(&self) -> bool {
        Category::ALL.iter().all(|c| self.get(*c).is_empty())
    }

    /// Every item, category by category in TOAST's order.
    pub fn items(&self) -> Vec<Item> {
        Category::ALL
            .iter()
            .flat_map(|&c| self.get(c).iter().map(move |n| Item::new(c, n.clone())))
            .collect()
    }

    /// Build from items.
    pub fn from_items<'a>(items: impl IntoIterator<Item = &'a Item>) -> Self {
        let mut r = Self::new();
        for it in items {
            r.add(it.category, it.name.clone());
        }
        r
    }

    /// Add every name of `other`.
    pub fn extend(&mut self, other: &Requirements) {
        for it in other.items() {
            self.add(it.category, it.name);
        }
    }

    /// Remove every name of `other`.
    pub fn remove_all(&mut self, other: &Requirements) {
        for c in Category::ALL {
            let drop = other.get(c);
            self.get_mut(c).retain(|n| !drop.contains(n));
        }
    }

    /// Names in both.
    pub fn intersection(&self, other: &Requirements) -> Requirements {
        let mut r = Self::new();
        for it in self.items() {
            if other.contains(it.category, &it.name) {
                r.add(it.category, it.name);
            }
        }
        r
    }
}

/// A required item that the data does not hold.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequirementError {
    /// A data-level key.
    #[error("missing global '{key}' in the data")]
    MissingGlobal {
        /// The key.
        key: String,
    },
    /// A field of an observation.
    #[error("observation '{observation}' lacks {category} '{field}'")]
    MissingField {
        /// Observation name.
        observation: String,
        /// Category.
        category: Category,
        /// Field name.
        field: String,
    },
}

/// Check that `data` holds everything in `req`: global keys in
/// [`Data::meta`], and every other category in every observation. Returns
/// the first missing item (globals first, then observation by observation
/// in category order).
pub fn check_requirements(data: &Data, req: &Requirements) -> Result<(), RequirementError> {
    for key in &req.global {
        if !data.meta.contains(key) {
            return Err(RequirementError::MissingGlobal { key: key.clone() });
        }
    }
    for ob in &data.obs {
        for c in [
            Category::Meta,
            Category::DetData,
            Category::Shared,
            Category::Intervals,
        ] {
            if let Some(field) = req.get(c).iter().find(|f| !ob.has(c, f)) {
                return Err(RequirementError::MissingField {
                    observation: ob.name().to_string(),
                    category: c,
                    field: field.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Anything that can go wrong in an operator.
#[derive(Debug, Error)]
pub enum OpError {
    /// Input data missing.
    #[error(transparent)]
    Requirements(#[from] RequirementError),
    /// Data access failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Device buffer lifecycle or device failure.
    #[error(transparent)]
    Accel(#[from] DeviceFieldError),
    /// Timer misuse.
    #[error(transparent)]
    Timer(#[from] TimerError),
    /// A context extension the operator needs was not installed.
    #[error("the execution context has no {type_name} (install it with ExecContext::insert)")]
    MissingExtension {
        /// `std::any::type_name` of the missing type.
        type_name: &'static str,
    },
    /// A configuration value refused by validation (an operator's
    /// `validate()`, a sync type, an empty focal plane, a key not set).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A collective across the processes failed.
    #[error("{what}: {source}")]
    Comm {
        /// What was being exchanged (`"mapmaker: PCG dot product"`, ...).
        what: String,
        /// The failed collective.
        #[source]
        source: CommError,
    },
    /// A computation gave a value it cannot go on with (a non-finite
    /// residual, ...).
    #[error("numerical failure: {what}")]
    Numerical {
        /// What failed, with the offending value.
        what: String,
    },
    /// An input file could not be used.
    #[error("{what} {}: {reason}", path.display())]
    Input {
        /// The kind of file (`"sky map"`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be used.
        reason: String,
    },
    /// A data-level (global) object is missing, of the wrong type, or does
    /// not fit the others (maps, pixel distributions, covariances, host
    /// arrays, global items without a device form).
    #[error("global item '{key}': {problem}")]
    Global {
        /// Its key in the data's metadata.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An observation's noise model is missing, of the wrong type, or has no
    /// usable entry for a detector.
    #[error("observation '{observation}': noise model '{key}': {problem}")]
    NoiseModel {
        /// The observation.
        observation: String,
        /// The noise model's key in the observation's metadata.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// A pixel index outside the map or its local submaps.
    #[error(transparent)]
    PixelOutOfRange(Box<PixelOutOfRange>),
    /// Data that is present but does not fit the operation (fields of
    /// different shapes, too few timestamps, objects built on other pixel
    /// distributions, arguments of an inconsistent pixel distribution).
    #[error("invalid data: {what}")]
    InvalidData {
        /// What does not fit, naming the observation and field.
        what: String,
    },
    /// An operator's state does not fit this call (a one-shot input already
    /// used, a template initialised on other data).
    #[error("operator state: {what}")]
    State {
        /// What does not fit.
        what: String,
    },
    /// A kernel argument the call layer cannot build (an argument that needs
    /// an observation, a per-detector array of the wrong length).
    #[error("kernel argument {argument}: {problem}")]
    KernelArgument {
        /// The argument.
        argument: String,
        /// What is wrong.
        problem: String,
    },
    /// A kernel call refused before launch: two arguments aliasing one
    /// buffer, a staged device buffer whose size differs from its host data.
    #[error("operator '{operator}': kernel `{kernel}`: {problem}")]
    KernelCall {
        /// The calling operator.
        operator: String,
        /// The kernel.
        kernel: String,
        /// What is wrong.
        problem: String,
    },
    /// Any other failure.
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
    /// An error inside a named operator (added by pipelines).
    #[error("operator '{operator}': {source}")]
    InOperator {
        /// Operator name.
        operator: String,
        /// The cause.
        #[source]
        source: Box<OpError>,
    },
}

/// A pixel index outside the map or its local submaps, met at one sample.
#[derive(Debug, Error)]
#[error(
    "{what}: observation '{observation}', detector '{detector}', sample {sample}: pixel {pixel} \
     {limit}"
)]
pub struct PixelOutOfRange {
    /// What was being computed.
    pub what: String,
    /// The observation.
    pub observation: String,
    /// The detector.
    pub detector: String,
    /// The sample in the observation.
    pub sample: usize,
    /// The pixel index.
    pub pixel: i64,
    /// The range it is outside of, as a phrase (`"is beyond the 3072 pixels
    /// of nside 16"`).
    pub limit: String,
}

impl From<PixelOutOfRange> for OpError {
    fn from(e: PixelOutOfRange) -> Self {
        OpError::PixelOutOfRange(Box::new(e))
    }
}

impl From<crate::device_buffers::AccelStateError> for OpError {
    fn from(e: crate::device_buffers::AccelStateError) -> Self {
        OpError::Accel(DeviceFieldError::State(e))
    }
}

impl OpError {
    /// Wrap with the operator name.
    pub fn in_operator(self, operator: impl Into<String>) -> Self {
        OpError::InOperator {
            operator: operator.into(),
            source: Box::new(self),
        }
    }
}

/// Type-keyed extensions of an [`ExecContext`].
#[derive(Default)]
pub struct Extensions {
    map: HashMap<TypeId, (&'static str, Box<dyn Any + Send>)>,
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.map.values().map(|(n, _)| n))
            .finish()
    }
}

impl Extensions {
    /// Install a value, returning the one it replaces.
    pub fn insert<T: Any + Send>(&mut self, value: T) -> Option<T> {
        self.map
            .insert(
                TypeId::of::<T>(),
                (std::any::type_name::<T>(), Box::new(value)),
            )
            .and_then(|(_, b)| b.downcast::<T>().ok().map(|b| *b))
    }

    /// The installed value of type `T`.
    pub fn get<T: Any + Send>(&self) -> Option<&T> {
        self.map
            .get(&TypeId::of::<T>())
            .and_then(|(_, b)| b.downcast_ref::<T>())
    }

    /// The installed value of type `T`, mutably.
    pub fn get_mut<T: Any + Send>(&mut self) -> Option<&mut T> {
        self.map
            .get_mut(&TypeId::of::<T>())
            .and_then(|(_, b)| b.downcast_mut::<T>())
    }

    /// Remove and return the value of type `T`.
    pub fn remove<T: Any + Send>(&mut self) -> Option<T> {
        self.map
            .remove(&TypeId::of::<T>())
            .and_then(|(_, b)| b.downcast::<T>().ok().map(|b| *b))
    }
}

/// What an operator gets besides the data.
///
/// It carries the timers and an extension map keyed by type. Crates above
/// this one install what they need (toast-ops puts its dispatcher and the
/// staged [`crate::device_buffers::DeviceBuffers`] there) without this crate knowing
/// their types, and without a type parameter that would make
/// `dyn Operator` impossible. Several independent extensions can coexist,
/// which a single `&mut dyn Any` slot would not allow.
#[derive(Debug, Default)]
pub struct ExecContext {
    /// Timers of this run.
    pub timers: Timers,
    /// Detectors to process (`None`: every local detector), as TOAST's
    /// `exec(data, detectors=...)`; pipelines set it per detector set.
    pub detectors: Option<Vec<String>>,
    /// Whether this call runs on the accelerator (the pipeline has staged
    /// the operator's requirements on the device).
    pub use_accel: bool,
    /// Typed extensions.
    pub extensions: Extensions,
}

impl ExecContext {
    /// An empty context.
    pub fn new() -> Self {
        Self::default()
    }

    /// Install an extension, returning the one it replaces.
    pub fn insert<T: Any + Send>(&mut self, value: T) -> Option<T> {
        self.extensions.insert(value)
    }

    /// An extension, or [`OpError::MissingExtension`].
    pub fn ext<T: Any + Send>(&self) -> Result<&T, OpError> {
        self.extensions.get::<T>().ok_or(OpError::MissingExtension {
            type_name: std::any::type_name::<T>(),
        })
    }

    /// An extension, mutably, or [`OpError::MissingExtension`].
    pub fn ext_mut<T: Any + Send>(&mut self) -> Result<&mut T, OpError> {
        self.extensions
            .get_mut::<T>()
            .ok_or(OpError::MissingExtension {
                type_name: std::any::type_name::<T>(),
            })
    }

    /// The detectors of `obs` to process: its local detectors, filtered by
    /// [`ExecContext::detectors`] when set, in the observation's order.
    pub fn selected_detectors(&self, local: &[String]) -> Vec<String> {
        match &self.detectors {
            None => local.to_vec(),
            Some(sel) => local.iter().filter(|d| sel.contains(d)).cloned().collect(),
        }
    }
}

/// An operation on [`Data`], as TOAST's `Operator`.
pub trait Operator {
    /// Instance name (used in timer names and errors).
    fn name(&self) -> &str;

    /// What `exec` reads.
    fn requires(&self) -> Requirements;

    /// What `exec` (and `finalize`) write.
    fn provides(&self) -> Requirements;

    /// Whether `exec` can run on staged device data.
    fn supports_accel(&self) -> bool {
        false
    }

    /// Create on the host, zeroed, the fields listed in `provides` that do
    /// not exist yet (idempotent). A pipeline calls this before `exec` of an
    /// accelerated operator so that it can size the device mirrors of the
    /// outputs (see [`crate::staging`]); TOAST's operators do the same with
    /// `detdata.ensure` inside `exec`. An operator with *transient*
    /// outputs (fields that hold only the detectors of the current pass,
    /// e.g. pointing expanded per detector batch) sizes them to the
    /// detectors `ctx` selects, so the device mirror is one batch's too
    /// (`ctx.use_accel` is set when a pipeline calls it for a device step).
    /// The default does nothing, which is right for operators that only
    /// run on the host.
    fn prepare_outputs(&self, _data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        Ok(())
    }

    /// Process the data (may be called several times, e.g. per detector set).
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError>;

    /// Finish after the last `exec` (reductions, writing outputs).
    fn finalize(&mut self, _data: &mut Data, _ctx: &mut ExecContext) -> Result<(), OpError> {
        Ok(())
    }

    /// `exec` then `finalize`, as TOAST's `apply`.
    fn apply(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.exec(data, ctx)?;
        self.finalize(data, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::observation::tests::observation;

    #[test]
    fn op_error_stays_small() {
        // Every `Result<_, OpError>` carries this size: no variant of its own
        // is larger than the data-model error it wraps (big payloads are
        // boxed), and it stays under clippy's `result_large_err` line.
        let size = std::mem::size_of::<OpError>();
        assert!(
            size <= std::mem::size_of::<DataError>() + 8,
            "OpError is {size} bytes"
        );
        assert!(size < 128, "OpError is {size} bytes");
    }

    #[test]
    fn error_classes_say_what_they_are() {
        let e = OpError::Numerical {
            what: "PCG residual is not finite (NaN)".into(),
        };
        assert_eq!(
            e.to_string(),
            "numerical failure: PCG residual is not finite (NaN)"
        );
        let e = OpError::Comm {
            what: "PCG dot product".into(),
            source: CommError::new("allreduce", "rank 3 died"),
        };
        assert_eq!(e.to_string(), "PCG dot product: allreduce: rank 3 died");
        assert!(std::error::Error::source(&e).is_some());
        let e = OpError::Input {
            what: "sky map",
            path: "/x/sky.fits".into(),
            reason: "no such file".into(),
        };
        assert_eq!(e.to_string(), "sky map /x/sky.fits: no such file");
        let e: OpError = PixelOutOfRange {
            what: "hits".into(),
            observation: "o".into(),
            detector: "d".into(),
            sample: 7,
            pixel: 99,
            limit: "is beyond the 48 pixels of nside 2".into(),
        }
        .into();
        assert_eq!(
            e.to_string(),
            "hits: observation 'o', detector 'd', sample 7: pixel 99 is beyond the 48 pixels of \
             nside 2"
        );
    }

    /// Scales `signal` of the selected detectors by a factor.
    struct Scale {
        factor: f64,
        finalized: bool,
    }

    impl Operator for Scale {
        fn name(&self) -> &str {
            "scale"
        }
        fn requires(&self) -> Requirements {
            Requirements::new().detdata("signal")
        }
        fn provides(&self) -> Requirements {
            Requirements::new().detdata("signal")
        }
        fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
            check_requirements(data, &self.requires())?;
            ctx.timers.start("scale")?;
            for ob in &mut data.obs {
                let dets = ctx.selected_detectors(ob.local_detectors());
                let sig = ob.detdata.get_mut("signal")?;
                for d in dets {
                    for x in sig.row_of_mut::<f64>(&d)? {
                        *x = *x * self.factor + 1.0;
                    }
                }
            }
            ctx.timers.stop("scale")?;
            // A counter another crate installed.
            if let Ok(n) = ctx.ext_mut::<u32>() {
                *n += 1;
            }
            Ok(())
        }
        fn finalize(&mut self, _d: &mut Data, _c: &mut ExecContext) -> Result<(), OpError> {
            self.finalized = true;
            Ok(())
        }
    }

    #[test]
    fn operator_runs_with_context_and_selection() {
        let mut data = Data::new();
        let mut ob = observation("o", 4, 3);
        ob.detdata.create("signal", DType::F64, &[], None).unwrap();
        data.push(ob).unwrap();
        let mut op = Scale {
            factor: 2.0,
            finalized: false,
        };
        let mut ctx = ExecContext::new();
        ctx.detectors = Some(vec!["D1A".into(), "D0B".into()]);
        ctx.insert(0u32);
        let boxed: &mut dyn Operator = &mut op;
        boxed.apply(&mut data, &mut ctx).unwrap();
        assert!(op.finalized);
        let sig = data.get("o").unwrap().detdata.get("signal").unwrap();
        assert_eq!(sig.row_of::<f64>("D0A").unwrap(), &[0.0; 3]);
        assert_eq!(sig.row_of::<f64>("D0B").unwrap(), &[1.0; 3]);
        assert_eq!(sig.row_of::<f64>("D1A").unwrap(), &[1.0; 3]);
        assert_eq!(*ctx.ext::<u32>().unwrap(), 1);
        assert_eq!(ctx.timers.get("scale").unwrap().calls(), 1);
        assert!(!op.supports_accel());
    }

    #[test]
    fn missing_requirement_is_a_typed_error() {
        let mut data = Data::new();
        data.push(observation("o", 2, 3)).unwrap();
        let mut op = Scale {
            factor: 1.0,
            finalized: false,
        };
        let e = op
            .exec(&mut data, &mut ExecContext::new())
            .unwrap_err()
            .in_operator("scale");
        assert_eq!(
            e.to_string(),
            "operator 'scale': observation 'o' lacks detdata 'signal'"
        );
        match e {
            OpError::InOperator { source, .. } => assert!(matches!(
                *source,
                OpError::Requirements(RequirementError::MissingField {
                    category: Category::DetData,
                    ..
                })
            )),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn check_requirements_reports_the_first_missing_item() {
        let mut data = Data::new();
        let mut a = observation("a", 2, 3);
        a.meta.set("noise_model", "x");
        a.detdata.create("signal", DType::F64, &[], None).unwrap();
        a.intervals_from_samples("scan", &[(0, 3)]).unwrap();
        let mut b = observation("b", 2, 3);
        b.meta.set("noise_model", "x");
        b.detdata.create("signal", DType::F64, &[], None).unwrap();
        data.push(a).unwrap();
        data.push(b).unwrap();
        let req = Requirements::new()
            .meta("noise_model")
            .detdata("signal")
            .shared("times")
            .intervals("scan");
        let e = check_requirements(&data, &req).unwrap_err();
        assert_eq!(
            e,
            RequirementError::MissingField {
                observation: "b".into(),
                category: Category::Intervals,
                field: "scan".into()
            }
        );
        let e = check_requirements(&data, &Requirements::new().global("pixel_dist")).unwrap_err();
        assert_eq!(e.to_string(), "missing global 'pixel_dist' in the data");
        data.meta.set("pixel_dist", 1i64);
        let req = Requirements::new()
            .global("pixel_dist")
            .meta("noise_model")
            .detdata("signal")
            .shared("times");
        check_requirements(&data, &req).unwrap();
    }

    #[test]
    fn requirement_set_algebra() {
        let a = Requirements::new()
            .detdata("signal")
            .detdata("signal")
            .shared("times")
            .global("zmap");
        assert_eq!(a.detdata, ["signal"], "no duplicates");
        let b = Requirements::new().detdata("signal").detdata("pixels");
        assert_eq!(a.intersection(&b), Requirements::new().detdata("signal"));
        let mut u = a.clone();
        u.extend(&b);
        assert_eq!(u.detdata, ["signal", "pixels"]);
        u.remove_all(&b);
        assert_eq!(u, Requirements::new().shared("times").global("zmap"));
        assert_eq!(
            a.items().iter().map(|i| i.to_string()).collect::<Vec<_>>(),
            ["global:zmap", "detdata:signal", "shared:times"]
        );
        assert_eq!(Requirements::from_items(&a.items()), a);
        assert!(Requirements::new().is_empty());
        assert!(!a.is_empty());
    }

    #[test]
    fn extensions_by_type() {
        #[derive(Debug, PartialEq)]
        struct Dispatcher(&'static str);
        let mut ctx = ExecContext::new();
        assert!(matches!(
            ctx.ext::<Dispatcher>(),
            Err(OpError::MissingExtension { .. })
        ));
        let e = ctx.ext::<Dispatcher>().unwrap_err().to_string();
        assert!(e.contains("Dispatcher"), "{e}");
        assert!(ctx.insert(Dispatcher("cpu")).is_none());
        assert_eq!(ctx.insert(Dispatcher("cuda")), Some(Dispatcher("cpu")));
        ctx.insert(5u8);
        ctx.ext_mut::<Dispatcher>().unwrap().0 = "hip";
        assert_eq!(ctx.ext::<Dispatcher>().unwrap().0, "hip");
        assert_eq!(*ctx.ext::<u8>().unwrap(), 5);
        assert_eq!(ctx.extensions.remove::<u8>(), Some(5));
        assert!(ctx.extensions.get::<u8>().is_none());
        assert!(format!("{:?}", ctx.extensions).contains("Dispatcher"));
    }
}
