//! Metadata: small typed values and opaque objects stored by key.
//!
//! TOAST keeps arbitrary Python objects in `Data` and `Observation`
//! dictionaries (`ob["noise_model"]`, `data["pixel_dist"]`). Here plain
//! values are a [`Value`] enum and anything else (a noise model, a pixel
//! distribution defined in another crate) is an [`MetaItem::Object`]: a
//! `Box<dyn Any + Send + Sync>` read back with a checked downcast.

use crate::error::DataError;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;

/// A plain metadata or detector-property value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Floats.
    FloatArray(Vec<f64>),
    /// Integers.
    IntArray(Vec<i64>),
    /// Strings.
    StrArray(Vec<String>),
}

impl Value {
    /// The name of the variant, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "string",
            Value::FloatArray(_) => "float array",
            Value::IntArray(_) => "int array",
            Value::StrArray(_) => "string array",
        }
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Float(v)
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}
impl From<Vec<f64>> for Value {
    fn from(v: Vec<f64>) -> Self {
        Value::FloatArray(v)
    }
}
impl From<Vec<i64>> for Value {
    fn from(v: Vec<i64>) -> Self {
        Value::IntArray(v)
    }
}
impl From<Vec<String>> for Value {
    fn from(v: Vec<String>) -> Self {
        Value::StrArray(v)
    }
}

/// One metadata entry.
pub enum MetaItem {
    /// A plain value.
    Value(Value),
    /// An object of a type this crate does not know.
    Object {
        /// `std::any::type_name` of the stored type, for messages.
        type_name: &'static str,
        /// The object.
        object: Box<dyn Any + Send + Sync>,
    },
}

impl fmt::Debug for MetaItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaItem::Value(v) => f.debug_tuple("Value").field(v).finish(),
            MetaItem::Object { type_name, .. } => write!(f, "Object({type_name})"),
        }
    }
}

impl MetaItem {
    fn type_name(&self) -> &'static str {
        match self {
            MetaItem::Value(v) => v.type_name(),
            MetaItem::Object { type_name, .. } => type_name,
        }
    }
}

/// A metadata dictionary that knows its owner, so errors can name it.
#[derive(Debug)]
pub struct Meta {
    owner: String,
    items: BTreeMap<String, MetaItem>,
}

macro_rules! getter {
    ($fn:ident, $variant:ident, $t:ty, $name:literal) => {
        #[doc = concat!("The ", $name, " stored at `key`, or an error naming the owner and key.")]
        pub fn $fn(&self, key: &str) -> Result<$t, DataError> {
            match self.value(key)? {
                Value::$variant(v) => Ok(v.clone()),
                other => Err(self.type_error(key, $name, other.type_name())),
            }
        }
    };
}

impl Meta {
    /// An empty dictionary; `owner` appears in error messages
    /// (`observation 'x'`, `data`).
    pub fn new(owner: impl Into<String>) -> Self {
        Meta {
            owner: owner.into(),
            items: BTreeMap::new(),
        }
    }

    /// The owner named in errors.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.items.contains_key(key)
    }

    /// The keys, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.items.keys().map(String::as_str)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Store a plain value, replacing any entry.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) {
        self.items.insert(key.into(), MetaItem::Value(value.into()));
    }

    /// Store an object, replacing any entry.
    pub fn set_object<T: Any + Send + Sync>(&mut self, key: impl Into<String>, object: T) {
        self.items.insert(
            key.into(),
            MetaItem::Object {
                type_name: std::any::type_name::<T>(),
                object: Box::new(object),
            },
        );
    }

    /// Remove an entry, returning it.
    pub fn remove(&mut self, key: &str) -> Option<MetaItem> {
        self.items.remove(key)
    }

    /// Move the entry `from` to `to` (replacing any entry there) without
    /// copying it: a large object handed on under another name.
    pub fn rename(&mut self, from: &str, to: impl Into<String>) -> Result<(), DataError> {
        let item = self.items.remove(from).ok_or_else(|| self.missing(from))?;
        self.items.insert(to.into(), item);
        Ok(())
    }

    /// The raw entry.
    pub fn item(&self, key: &str) -> Option<&MetaItem> {
        self.items.get(key)
    }

    fn missing(&self, key: &str) -> DataError {
        DataError::MissingMeta {
            owner: self.owner.clone(),
            key: key.to_string(),
        }
    }

    fn type_error(&self, key: &str, expected: &str, actual: &str) -> DataError {
        DataError::MetaType {
            owner: self.owner.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }

    /// The plain value at `key`.
    pub fn value(&self, key: &str) -> Result<&Value, DataError> {
        match self.items.get(key) {
            None => Err(self.missing(key)),
            Some(MetaItem::Value(v)) => Ok(v),
            Some(other) => Err(self.type_error(key, "a plain value", other.type_name())),
        }
    }

    getter!(get_bool, Bool, bool, "bool");
    getter!(get_int, Int, i64, "int");
    getter!(get_str, Str, String, "string");
    getter!(get_float_array, FloatArray, Vec<f64>, "float array");
    getter!(get_int_array, IntArray, Vec<i64>, "int array");
    getter!(get_str_array, StrArray, Vec<String>, "string array");

    /// The float at `key`; an integer is converted.
    pub fn get_float(&self, key: &str) -> Result<f64, DataError> {
        match self.value(key)? {
            Value::Float(v) => Ok(*v),
            Value::Int(v) => Ok(*v as f64),
            other => Err(self.type_error(key, "float", other.type_name())),
        }
    }

    /// The object of type `T` at `key`.
    pub fn object<T: Any>(&self, key: &str) -> Result<&T, DataError> {
        match self.items.get(key) {
            None => Err(self.missing(key)),
            Some(MetaItem::Object { object, type_name }) => object
                .downcast_ref::<T>()
                .ok_or_else(|| self.type_error(key, std::any::type_name::<T>(), type_name)),
            Some(other) => Err(self.type_error(key, std::any::type_name::<T>(), other.type_name())),
        }
    }

    /// The object of type `T` at `key`, mutably.
    pub fn object_mut<T: Any>(&mut self, key: &str) -> Result<&mut T, DataError> {
        let (owner, key_s) = (self.owner.clone(), key.to_string());
        let err = |actual: &str| DataError::MetaType {
            owner: owner.clone(),
            key: key_s.clone(),
            expected: std::any::type_name::<T>().to_string(),
            actual: actual.to_string(),
        };
        match self.items.get_mut(key) {
            None => Err(DataError::MissingMeta {
                owner: self.owner.clone(),
                key: key.to_string(),
            }),
            Some(MetaItem::Object { object, type_name }) => {
                let tn: &'static str = type_name;
                object.downcast_mut::<T>().ok_or_else(|| err(tn))
            }
            Some(MetaItem::Value(v)) => Err(err(v.type_name())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Noise {
        net: f64,
    }

    #[test]
    fn rename_moves_an_entry() {
        let mut m = Meta::new("data");
        m.set_object("a", Noise { net: 2.0 });
        m.set("b", 1i64);
        m.rename("a", "b").unwrap();
        assert!(!m.contains("a"));
        assert_eq!(m.object::<Noise>("b").unwrap(), &Noise { net: 2.0 });
        let e = m.rename("a", "c").unwrap_err().to_string();
        assert!(e.contains("'a'") || e.contains("a"), "{e}");
        assert!(!m.contains("c"));
    }

    #[test]
    fn values_objects_and_errors() {
        let mut m = Meta::new("observation 'obs0'");
        m.set("rate", 100.0);
        m.set("n", 3i64);
        m.set("name", "x");
        m.set_object("noise_model", Noise { net: 5.0 });
        assert_eq!(m.get_float("rate").unwrap(), 100.0);
        assert_eq!(m.get_float("n").unwrap(), 3.0);
        assert_eq!(m.get_int("n").unwrap(), 3);
        assert_eq!(m.get_str("name").unwrap(), "x");
        assert_eq!(m.object::<Noise>("noise_model").unwrap().net, 5.0);
        m.object_mut::<Noise>("noise_model").unwrap().net = 6.0;
        assert_eq!(m.object::<Noise>("noise_model").unwrap().net, 6.0);
        assert_eq!(
            m.keys().collect::<Vec<_>>(),
            ["n", "name", "noise_model", "rate"]
        );

        let e = m.get_int("rate").unwrap_err();
        assert_eq!(
            e.to_string(),
            "observation 'obs0': metadata 'rate' is float, expected int"
        );
        let e = m.get_float("missing").unwrap_err();
        assert_eq!(e.to_string(), "observation 'obs0': no metadata 'missing'");
        assert!(matches!(
            m.object::<String>("noise_model"),
            Err(DataError::MetaType { .. })
        ));
        assert!(m.object_mut::<Noise>("rate").is_err());
        assert!(m.value("noise_model").is_err());
        assert!(format!("{:?}", m.item("noise_model").unwrap()).contains("Noise"));
        assert!(m.remove("rate").is_some());
        assert!(!m.contains("rate"));
        assert_eq!(m.len(), 3);
    }
}
