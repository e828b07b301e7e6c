//! The field categories of the data model and the errors of data access.

use crate::dtype::DType;
use crate::intervals::IntervalError;
use std::fmt;
use thiserror::Error;

/// The five kinds of named data an operator can require or provide, as in
/// TOAST's `requires()`/`provides()` dictionaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// Data-level metadata ([`crate::Data::meta`]): maps, pixel distributions.
    Global,
    /// Observation metadata ([`crate::Observation::meta`]): noise models, ...
    Meta,
    /// Per-detector timestreams ([`crate::Observation::detdata`]).
    DetData,
    /// Per-sample data common to all detectors ([`crate::Observation::shared`]).
    Shared,
    /// Named interval lists ([`crate::Observation::intervals`]).
    Intervals,
}

impl Category {
    /// All categories, in TOAST's order.
    pub const ALL: [Category; 5] = [
        Category::Global,
        Category::Meta,
        Category::DetData,
        Category::Shared,
        Category::Intervals,
    ];

    /// TOAST's key for the category (`global`, `meta`, `detdata`, `shared`, `intervals`).
    pub fn key(self) -> &'static str {
        match self {
            Category::Global => "global",
            Category::Meta => "meta",
            Category::DetData => "detdata",
            Category::Shared => "shared",
            Category::Intervals => "intervals",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// An error accessing or creating observation data. Every variant names the
/// observation (or metadata owner) and the field involved.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DataError {
    /// No observation with that name in the [`crate::Data`].
    #[error("no observation named '{name}'")]
    MissingObservation {
        /// The requested name.
        name: String,
    },
    /// Two observations with one name.
    #[error("an observation named '{name}' already exists")]
    DuplicateObservation {
        /// The duplicated name.
        name: String,
    },
    /// A field that does not exist.
    #[error("observation '{observation}': no {category} field '{field}'")]
    MissingField {
        /// Observation name.
        observation: String,
        /// Category searched.
        category: Category,
        /// Field name.
        field: String,
    },
    /// A typed access with the wrong element type.
    #[error(
        "observation '{observation}': {category} field '{field}' has type {actual}, \
         expected {expected}"
    )]
    TypeMismatch {
        /// Observation name.
        observation: String,
        /// Category of the field.
        category: Category,
        /// Field name.
        field: String,
        /// Type asked for.
        expected: DType,
        /// Type held.
        actual: DType,
    },
    /// A field with another per-sample shape than expected.
    #[error(
        "observation '{observation}': {category} field '{field}' has per-sample shape \
         {actual:?}, expected {expected:?}"
    )]
    ShapeMismatch {
        /// Observation name.
        observation: String,
        /// Category of the field.
        category: Category,
        /// Field name.
        field: String,
        /// Shape asked for.
        expected: Vec<usize>,
        /// Shape held.
        actual: Vec<usize>,
    },
    /// `create` of a field that exists with another type or shape.
    /// The memory of a new field could not be allocated (an address-space
    /// or data limit, or no memory left): an error, not an abort.
    #[error(
        "observation '{observation}': cannot allocate {bytes} bytes for {category} field \
         '{field}' (out of memory)"
    )]
    OutOfMemory {
        observation: String,
        category: Category,
        field: String,
        bytes: u64,
    },
    #[error(
        "observation '{observation}': {category} field '{field}' already exists as \
         {existing_dtype} {existing_shape:?}; cannot create it as {dtype} {shape:?}"
    )]
    FieldConflict {
        /// Observation name.
        observation: String,
        /// Category of the field.
        category: Category,
        /// Field name.
        field: String,
        /// Type of the existing field.
        existing_dtype: DType,
        /// Shape of the existing field.
        existing_shape: Vec<usize>,
        /// Requested type.
        dtype: DType,
        /// Requested shape.
        shape: Vec<usize>,
    },
    /// A detector that the observation (or a field) does not hold.
    #[error("observation '{observation}': {where_} has no detector '{detector}'")]
    MissingDetector {
        /// Observation name.
        observation: String,
        /// Where it was looked for (`local detectors`, `detdata 'signal'`, ...).
        where_: String,
        /// Detector name.
        detector: String,
    },
    /// A detector row index past the end of a field.
    #[error(
        "observation '{observation}': detdata field '{field}' has {n_det} detector rows, \
         no row {index}"
    )]
    RowOutOfRange {
        /// Observation name.
        observation: String,
        /// Field name.
        field: String,
        /// Requested row.
        index: usize,
        /// Rows held.
        n_det: usize,
    },
    /// Data of the wrong length given for a field.
    #[error(
        "observation '{observation}': {category} field '{field}' needs {expected} elements, \
         got {actual}"
    )]
    LengthMismatch {
        /// Observation name.
        observation: String,
        /// Category of the field.
        category: Category,
        /// Field name.
        field: String,
        /// Elements needed.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// The same field asked for twice in one disjoint mutable borrow.
    #[error("observation '{observation}': {category} field '{field}' requested twice")]
    DuplicateBorrow {
        /// Observation name.
        observation: String,
        /// Category of the field.
        category: Category,
        /// Field name.
        field: String,
    },
    /// A category that has no contiguous byte representation (metadata).
    #[error(
        "observation '{observation}': {category} '{field}' is not a contiguous field and \
         cannot be mirrored on a device by the data model"
    )]
    NotContiguous {
        /// Observation name.
        observation: String,
        /// Category of the item.
        category: Category,
        /// Item name.
        field: String,
    },
    /// An interval list could not be built or is invalid.
    #[error("observation '{observation}': intervals '{field}': {source}")]
    Intervals {
        /// Observation name.
        observation: String,
        /// Interval list name.
        field: String,
        /// The cause.
        #[source]
        source: IntervalError,
    },
    /// A metadata key that is absent.
    #[error("{owner}: no metadata '{key}'")]
    MissingMeta {
        /// `observation 'name'` or `data`.
        owner: String,
        /// The key.
        key: String,
    },
    /// A metadata value of another type than asked for.
    #[error("{owner}: metadata '{key}' is {actual}, expected {expected}")]
    MetaType {
        /// `observation 'name'` or `data`.
        owner: String,
        /// The key.
        key: String,
        /// Type asked for.
        expected: String,
        /// Type held.
        actual: String,
    },
    /// A detector listed twice.
    #[error("{where_}: duplicate detector '{detector}'")]
    DuplicateDetector {
        /// Where (`focalplane`, `observation 'x'`, ...).
        where_: String,
        /// The duplicated name.
        detector: String,
    },
    /// A field that a device may read but never write back.
    #[error(
        "observation '{observation}': {category} '{field}' is read-only on a device and \
         cannot be copied back to the host"
    )]
    ReadOnlyOnDevice {
        /// Observation name.
        observation: String,
        /// Category of the item.
        category: Category,
        /// Item name.
        field: String,
    },
}
