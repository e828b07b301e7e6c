//! `toast_rs._native`: TOAST 3.0.6's kernel calls, made on toast-rs backends.
//!
//! One adapter per kernel turns the positional arguments TOAST's registry
//! passes (numpy arrays, Python scalars) into that kernel's ABI argument
//! struct and launches it on the backend dispatch chose. The adapters are
//! rows of one table ([`KERNELS`]: the kernels of toast-accel's kernel table
//! that TOAST's registry has); the Python package (`toast_rs`) reads it to
//! know which registry entries to replace.
//!
//! Arrays cross without copies: an argument's buffer is read through numpy's
//! `__array_interface__` (address, dtype, shape, contiguity), checked, and
//! handed to the backend through [`ArrayArg`], which passes the host address
//! straight to a host-addressable backend (the CPU plugin) and stages a
//! device backend's copy (upload, and download for outputs). A wrong dtype,
//! rank, shape, a non-contiguous, misaligned or read-only output array, or
//! an output overlapping another argument raises `TypeError` / `ValueError`
//! naming the kernel and the argument; the plugin's own validation
//! (`toast_accel::check`) refuses the rest (index ranges, lengths) before
//! touching memory, as `ValueError`.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

mod accel;
use accel::{Present, Resolved};
use std::time::Instant;
use toast_accel::abi::{self, Kernel, SampleRange, SampleRanges};
use toast_accel::host::{
    AccelError, ArrayArg, Backend, DiscoveryOptions, DispatchPolicy, Registry, StatusKind,
};

/// Element types of array arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dt {
    F64,
    F32,
    I64,
    I32,
    U8,
}

impl Dt {
    fn from_typestr(s: &str) -> Option<Dt> {
        Some(match s {
            "<f8" => Dt::F64,
            "<f4" => Dt::F32,
            "<i8" => Dt::I64,
            "<i4" => Dt::I32,
            "|u1" => Dt::U8,
            _ => return None,
        })
    }
    fn name(self) -> &'static str {
        match self {
            Dt::F64 => "float64",
            Dt::F32 => "float32",
            Dt::I64 => "int64",
            Dt::I32 => "int32",
            Dt::U8 => "uint8",
        }
    }
    fn size(self) -> usize {
        match self {
            Dt::F64 | Dt::I64 => 8,
            Dt::F32 | Dt::I32 => 4,
            Dt::U8 => 1,
        }
    }
}

/// One checked array argument: a C-contiguous numpy buffer.
#[derive(Debug)]
struct View<'py> {
    /// Keeps the array (and so its buffer) alive for the call.
    _obj: Bound<'py, PyAny>,
    name: &'static str,
    ptr: usize,
    shape: Vec<usize>,
    len: usize,
    dt: Dt,
    output: bool,
}

impl View<'_> {
    fn bytes(&self) -> usize {
        self.len * self.dt.size()
    }
    /// The buffer as host pointer of `T` (for the ABI's host arrays).
    fn host<T>(&self) -> *const T {
        self.ptr as *const T
    }
}

/// The last dimension of a quaternion array ([`Call::expect_dims`]).
const QUATERNION: Option<(usize, &str)> = Some((4, "a quaternion"));

/// The arguments of one kernel call and the checks they share.
struct Call<'a, 'py> {
    kernel: &'static str,
    args: &'a Bound<'py, PyTuple>,
    backend: &'a Backend,
    /// Byte ranges of the arrays taken so far: (start, end, name, output).
    ranges: Vec<(usize, usize, &'static str, bool)>,
    /// `use_accel=True`: the present table the device arrays resolve from.
    accel: Option<&'a Present>,
    /// Bytes this call staged for itself (host to device, device to host)
    /// on a `use_accel=True` call.
    staged: Cell<(u64, u64)>,
    /// Warnings about stale present buffers the arguments' lookups dropped,
    /// given after the call (`accel::warn_dropped`).
    dropped: RefCell<Vec<String>>,
}

/// A kernel's array argument: a host array (passed through, or staged for
/// the call), or the device buffer of a present host array.
#[derive(Debug)]
enum Arg<'a> {
    Host(ArrayArg<'a>),
    Device(abi::Array),
}

impl Arg<'_> {
    /// The absent array.
    const ABSENT: Arg<'static> = Arg::Device(abi::Array::ABSENT);

    fn abi(&self) -> abi::Array {
        match self {
            Arg::Host(a) => a.abi(),
            Arg::Device(a) => *a,
        }
    }

    /// Copy a staged output back and release its buffer; a device buffer
    /// stays where it is.
    fn finish(self) -> Result<(), AccelError> {
        match self {
            Arg::Host(a) => a.finish(),
            Arg::Device(_) => Ok(()),
        }
    }
}

fn type_err(kernel: &str, arg: &str, what: impl std::fmt::Display) -> PyErr {
    PyTypeError::new_err(format!("toast_rs {kernel}: argument `{arg}`: {what}"))
}
fn value_err(kernel: &str, arg: &str, what: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("toast_rs {kernel}: argument `{arg}`: {what}"))
}

fn accel_err(e: AccelError) -> PyErr {
    match &e {
        AccelError::Kernel {
            kind: StatusKind::InvalidArgument,
            ..
        } => PyValueError::new_err(format!("toast_rs: {e}")),
        _ => PyRuntimeError::new_err(format!("toast_rs: {e}")),
    }
}

/// TOAST's `interval_dtype`: (name, typestr, offset) of each field.
const INTERVAL_FIELDS: [(&str, &str); 4] = [
    ("start", "<f8"),
    ("stop", "<f8"),
    ("first", "<i8"),
    ("last", "<i8"),
];

/// The arguments of a call in a form that reading runs none of the
/// caller's Python code: every array-like (an object with an
/// `__array_interface__`, an ndarray subclass, TOAST's aligned buffers,
/// which export only the buffer protocol) a numpy array viewing its memory
/// (no copy), every number-like (numpy's scalars, 0-d arrays, objects with
/// `__index__` or `__float__`) a Python `int`, `float` or `bool`, the
/// elements of a list argument the same. [`Call`] then reads only exact
/// ndarrays and exact numbers, and refuses anything else.
///
/// [`Call`] records each array's address as it reads it. Were an argument
/// converted only when read, its conversion (an `__array_interface__`
/// property, an `__index__`) could run code that frees or reallocates an
/// array read before it (`ndarray.resize(refcheck=False)`,
/// `AlignedF64.resize`), and the kernel would write freed memory. So the
/// conversions that may run Python code come first, for every argument;
/// then those that run none (a view of an ndarray subclass, of a buffer
/// exporter: C code), so that no later conversion can move what they view.
/// (An interface that names memory its object does not keep alive, or a
/// resize with `refcheck=False` of an array another argument's interface
/// names, breaks numpy's own contract; numpy's arrays of it are as unsafe.)
fn settle_args<'py>(kernel: &str, args: &Bound<'py, PyTuple>) -> PyResult<Bound<'py, PyTuple>> {
    let py = args.py();
    let numpy = py.import("numpy")?;
    let named = |i: usize, e: PyErr| {
        PyErr::from_type(
            e.get_type(py),
            format!("toast_rs {kernel}: argument {i}: {}", e.value(py)),
        )
    };
    // Pass 1: the conversions that may run the caller's code.
    let mut first = Vec::with_capacity(args.len());
    for (i, a) in args.iter().enumerate() {
        let a = if a.cast::<PyList>().is_ok() || a.cast::<PyTuple>().is_ok() {
            let items = a
                .try_iter()
                .and_then(|it| it.map(|e| settle(&numpy, e?)).collect::<PyResult<Vec<_>>>())
                .map_err(|e| named(i, e))?;
            Settled::List(items)
        } else {
            settle(&numpy, a).map_err(|e| named(i, e))?
        };
        first.push(a);
    }
    // Pass 2: the views that run none.
    let settled = first
        .into_iter()
        .enumerate()
        .map(|(i, a)| a.view(&numpy).map_err(|e| named(i, e)))
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, settled)
}

/// An argument after [`settle_args`]' first pass.
enum Settled<'py> {
    /// Final: an exact ndarray, an exact Python scalar, `None`, or an
    /// object the kernel will refuse.
    Done(Bound<'py, PyAny>),
    /// An ndarray subclass or a buffer exporter, to view as an ndarray in
    /// the second pass.
    View(Bound<'py, PyAny>),
    /// A list or tuple argument's elements.
    List(Vec<Settled<'py>>),
}

impl<'py> Settled<'py> {
    /// The second pass: an ndarray view of a [`Settled::View`] (no Python
    /// code of the caller's runs: numpy views a subclass's memory, and a
    /// memoryview is the exporter's C `getbuffer`).
    fn view(self, numpy: &Bound<'py, PyModule>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Settled::Done(o) => Ok(o),
            Settled::View(o) => {
                if o.is_instance(&numpy.getattr("ndarray")?)? {
                    return numpy.call_method1("asarray", (o,));
                }
                match o
                    .py()
                    .import("builtins")?
                    .getattr("memoryview")?
                    .call1((&o,))
                {
                    Ok(mv) => numpy.call_method1("asarray", (mv,)),
                    // Neither an array nor a number: the kernel refuses it,
                    // naming the argument.
                    Err(_) => Ok(o),
                }
            }
            Settled::List(items) => {
                let py = numpy.py();
                let items = items
                    .into_iter()
                    .map(|s| s.view(numpy))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, items)?.into_any())
            }
        }
    }
}

/// Whether `obj` is one of the forms [`Call`] reads: `None`, an exact
/// Python `bool`, `int`, `float` or `str`, or an exact ndarray of at least
/// one dimension.
fn is_plain(obj: &Bound<'_, PyAny>, ndarray: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(obj.is_none()
        || obj.is_exact_instance_of::<PyBool>()
        || obj.is_exact_instance_of::<PyInt>()
        || obj.is_exact_instance_of::<PyFloat>()
        || obj.is_exact_instance_of::<PyString>()
        || (obj.get_type().is(ndarray) && obj.getattr("ndim")?.extract::<usize>()? > 0))
}

/// One argument, through [`settle_args`]' first pass.
fn settle<'py>(numpy: &Bound<'py, PyModule>, obj: Bound<'py, PyAny>) -> PyResult<Settled<'py>> {
    let py = obj.py();
    let ndarray = numpy.getattr("ndarray")?;
    if is_plain(&obj, &ndarray)? {
        return Ok(Settled::Done(obj));
    }
    // numpy's scalars and 0-d arrays (an object array's element too) as
    // Python's numbers: their item, settled in turn (once: an item that is
    // itself an array-like or a number-like is converted below).
    let item = if obj.is_instance(&numpy.getattr("generic")?)? || obj.get_type().is(&ndarray) {
        obj.call_method0("item")?
    } else {
        obj
    };
    if is_plain(&item, &ndarray)? {
        return Ok(Settled::Done(item));
    }
    if item.is_instance(&ndarray)? {
        return Ok(Settled::View(item));
    }
    if item.hasattr("__array_interface__")? {
        return Ok(Settled::Done(numpy.call_method1("asarray", (item,))?));
    }
    if item.hasattr("__index__")? {
        return Ok(Settled::Done(
            py.import("operator")?.call_method1("index", (item,))?,
        ));
    }
    if item.hasattr("__float__")? {
        return Ok(Settled::Done(
            PyFloat::new(py, item.extract::<f64>()?).into_any(),
        ));
    }
    Ok(Settled::View(item))
}

impl<'a, 'py> Call<'a, 'py> {
    fn arg(&self, i: usize, name: &str) -> PyResult<Bound<'py, PyAny>> {
        self.args.get_item(i).map_err(|_| {
            PyTypeError::new_err(format!(
                "toast_rs {}: missing argument {i} (`{name}`); got {} positional arguments",
                self.kernel,
                self.args.len()
            ))
        })
    }

    /// The array interface dictionary of argument `i`.
    fn interface(
        &self,
        i: usize,
        name: &'static str,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        self.interface_of(self.arg(i, name)?, name)
    }

    /// [`interface`](Self::interface) of an object (an element of a list
    /// argument). The arguments are [`settled`](settle_args): an array
    /// argument is a numpy array here, whose interface is numpy's own.
    fn interface_of(
        &self,
        obj: Bound<'py, PyAny>,
        name: &'static str,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyDict>)> {
        // Only an exact ndarray, whose interface is numpy's own code: any
        // other object's attribute lookup could run the caller's code.
        let exact = obj
            .get_type()
            .is(obj.py().import("numpy")?.getattr("ndarray")?);
        let iface = exact
            .then(|| obj.getattr("__array_interface__").ok())
            .flatten()
            .and_then(|d| d.cast_into::<PyDict>().ok())
            .ok_or_else(|| {
                let ty = obj
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into());
                type_err(
                    self.kernel,
                    name,
                    format!("expected a numpy array, got {ty}"),
                )
            })?;
        Ok((obj, iface))
    }

    fn item<T: for<'b> FromPyObject<'b, 'py>>(
        &self,
        d: &Bound<'py, PyDict>,
        key: &str,
        name: &str,
    ) -> PyResult<T> {
        d.get_item(key)?
            .ok_or_else(|| {
                type_err(
                    self.kernel,
                    name,
                    format!("no `{key}` in its array interface"),
                )
            })?
            .extract::<T>()
            .map_err(|_| {
                type_err(
                    self.kernel,
                    name,
                    format!("unreadable `{key}` in its array interface"),
                )
            })
    }

    /// Shape, address, read-only flag of a C-contiguous array.
    fn layout(
        &self,
        iface: &Bound<'py, PyDict>,
        name: &'static str,
    ) -> PyResult<(Vec<usize>, usize, bool)> {
        let shape: Vec<usize> = self.item(iface, "shape", name)?;
        if let Some(strides) = iface.get_item("strides")? {
            if !strides.is_none() {
                return Err(value_err(
                    self.kernel,
                    name,
                    "the array is not C-contiguous (pass np.ascontiguousarray(...))",
                ));
            }
        }
        let (ptr, readonly): (usize, bool) = self.item(iface, "data", name)?;
        Ok((shape, ptr, readonly))
    }

    fn take(
        &mut self,
        i: usize,
        name: &'static str,
        dts: &[Dt],
        ndims: &[usize],
        output: bool,
    ) -> PyResult<View<'py>> {
        let (obj, iface) = self.interface(i, name)?;
        self.take_from(obj, iface, name, dts, ndims, output)
    }

    /// [`take`](Self::take) of an object and its array interface.
    fn take_from(
        &mut self,
        obj: Bound<'py, PyAny>,
        iface: Bound<'py, PyDict>,
        name: &'static str,
        dts: &[Dt],
        ndims: &[usize],
        output: bool,
    ) -> PyResult<View<'py>> {
        let typestr: String = self.item(&iface, "typestr", name)?;
        let dt = Dt::from_typestr(&typestr)
            .filter(|d| dts.contains(d))
            .ok_or_else(|| {
                let dtype = obj
                    .getattr("dtype")
                    .map(|d| d.to_string())
                    .unwrap_or(typestr.clone());
                let want: Vec<&str> = dts.iter().map(|d| d.name()).collect();
                type_err(
                    self.kernel,
                    name,
                    format!("dtype {dtype}, expected {}", want.join(" or ")),
                )
            })?;
        let (shape, ptr, readonly) = self.layout(&iface, name)?;
        if !ndims.contains(&shape.len()) {
            let want: Vec<String> = ndims.iter().map(|n| n.to_string()).collect();
            return Err(value_err(
                self.kernel,
                name,
                format!(
                    "{} dimensions (shape {shape:?}), expected {}",
                    shape.len(),
                    want.join(" or ")
                ),
            ));
        }
        if output && readonly {
            return Err(value_err(
                self.kernel,
                name,
                "the output array is read-only",
            ));
        }
        let len = shape
            .iter()
            .try_fold(1usize, |a, &n| a.checked_mul(n))
            .ok_or_else(|| value_err(self.kernel, name, format!("shape {shape:?} overflows")))?;
        if len > 0 && ptr % dt.size() != 0 {
            return Err(value_err(
                self.kernel,
                name,
                format!("the buffer at {ptr:#x} is not aligned for {}", dt.name()),
            ));
        }
        let v = View {
            _obj: obj,
            name,
            ptr,
            shape,
            len,
            dt,
            output,
        };
        self.claim(&v)?;
        Ok(v)
    }

    /// Record the array's bytes; an output may overlap no other argument
    /// (the kernel would read what it writes, and Rust's slices forbid it).
    fn claim(&mut self, v: &View<'py>) -> PyResult<()> {
        let (start, end) = (v.ptr, v.ptr + v.bytes());
        if start == end {
            return Ok(());
        }
        for &(s, e, other, out) in &self.ranges {
            if (v.output || out) && start < e && s < end {
                let (o, i) = if v.output {
                    (v.name, other)
                } else {
                    (other, v.name)
                };
                return Err(value_err(
                    self.kernel,
                    o,
                    format!("the output array shares memory with argument `{i}`"),
                ));
            }
        }
        self.ranges.push((start, end, v.name, v.output));
        Ok(())
    }

    fn input(
        &mut self,
        i: usize,
        name: &'static str,
        dts: &[Dt],
        ndims: &[usize],
    ) -> PyResult<View<'py>> {
        self.take(i, name, dts, ndims, false)
    }

    fn output(
        &mut self,
        i: usize,
        name: &'static str,
        dts: &[Dt],
        ndims: &[usize],
    ) -> PyResult<View<'py>> {
        self.take(i, name, dts, ndims, true)
    }

    /// TOAST's intervals (a structured `interval_dtype` array) as the
    /// kernels' sample ranges (`first..last`, exclusive: TOAST 3's meaning).
    fn intervals(&self, i: usize) -> PyResult<Vec<SampleRange>> {
        const NAME: &str = "intervals";
        let (_obj, iface) = self.interface(i, NAME)?;
        let typestr: String = self.item(&iface, "typestr", NAME)?;
        let descr: Vec<(String, String)> = self.item(&iface, "descr", NAME).unwrap_or_default();
        let fields_ok = typestr == "|V32"
            && descr.len() == INTERVAL_FIELDS.len()
            && descr
                .iter()
                .zip(INTERVAL_FIELDS)
                .all(|((n, t), (en, et))| n == en && t == et);
        if !fields_ok {
            return Err(type_err(
                self.kernel,
                NAME,
                format!(
                    "expected TOAST's interval_dtype (start, stop: float64; first, last: int64), got {typestr} {descr:?}"
                ),
            ));
        }
        let (shape, ptr, _) = self.layout(&iface, NAME)?;
        if shape.len() != 1 {
            return Err(value_err(
                self.kernel,
                NAME,
                format!("shape {shape:?}, expected one dimension"),
            ));
        }
        let ranges = (0..shape[0])
            .map(|j| {
                let rec = (ptr + 32 * j) as *const u8;
                // SAFETY: the array interface says `shape[0]` contiguous
                // records of 32 bytes start at `ptr`, with `first` and `last`
                // int64 at byte offsets 16 and 24 (checked descr); the array
                // is alive (`_obj`) and the GIL is held, so nothing frees or
                // resizes it; unaligned reads need no alignment.
                unsafe {
                    SampleRange {
                        first: std::ptr::read_unaligned(rec.add(16) as *const i64),
                        last: std::ptr::read_unaligned(rec.add(24) as *const i64),
                    }
                }
            })
            .collect();
        Ok(ranges)
    }

    /// A number argument: an exact Python `bool`, `int` or `float` (the
    /// arguments are [settled](settle_args): number-likes were converted),
    /// whose extraction runs none of the caller's code.
    fn scalar<T: for<'b> FromPyObject<'b, 'py>>(
        &self,
        i: usize,
        name: &str,
        what: &str,
    ) -> PyResult<T> {
        let arg = self.arg(i, name)?;
        let number = arg.is_exact_instance_of::<PyBool>()
            || arg.is_exact_instance_of::<PyInt>()
            || arg.is_exact_instance_of::<PyFloat>();
        number
            .then(|| arg.extract::<T>().ok())
            .flatten()
            .ok_or_else(|| type_err(self.kernel, name, format!("expected {what}")))
    }
    fn i64(&self, i: usize, name: &str) -> PyResult<i64> {
        self.scalar(i, name, "an integer")
    }
    fn f64(&self, i: usize, name: &str) -> PyResult<f64> {
        self.scalar(i, name, "a float")
    }
    /// A flag mask: TOAST's bindings take it as `uint8_t`.
    fn mask(&self, i: usize, name: &str) -> PyResult<u8> {
        self.scalar(i, name, "an integer in 0..=255")
    }
    /// A boolean switch: `True`/`False` (or numpy's), or the integers 0
    /// and 1; anything else is refused rather than read by its
    /// truthiness. Stricter than TOAST's compiled bindings, which refuse
    /// the string `"False"` (true to Python) but read `None`, 2 or 1.0 by
    /// their truth; TOAST's own callers pass booleans.
    fn flag(&self, i: usize, name: &str) -> PyResult<bool> {
        let arg = self.arg(i, name)?;
        if let Ok(b) = arg.cast::<PyBool>() {
            return Ok(b.is_true());
        }
        match arg.cast::<PyInt>().ok().map(|n| n.extract::<i64>()) {
            Some(Ok(0)) => Ok(false),
            Some(Ok(1)) => Ok(true),
            _ => {
                let ty = arg
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|_| "?".into());
                Err(type_err(
                    self.kernel,
                    name,
                    format!("expected True or False, got {ty}"),
                ))
            }
        }
    }

    fn expect_len(&self, v: &View<'_>, n: usize, what: &str) -> PyResult<()> {
        if v.len == n {
            Ok(())
        } else {
            Err(value_err(
                self.kernel,
                v.name,
                format!("shape {:?}, expected {n} elements ({what})", v.shape),
            ))
        }
    }

    /// TOAST's shape check (`extract_buffer`, `_libtoast/common.hpp`): each
    /// `Some((n, what))` of `want` is the length dimension `d` of `v` must
    /// have, `what` saying where `n` comes from. A length that one array
    /// gives and another contradicts would otherwise pass the plugin's
    /// checks, which see total lengths only, and be read with the wrong
    /// layout (the error reads as TOAST's: `dimension 2 has length 3
    /// instead of 1`).
    fn expect_dims(&self, v: &View<'_>, want: &[Option<(usize, &str)>]) -> PyResult<()> {
        for (d, (&have, w)) in v.shape.iter().zip(want).enumerate() {
            if let Some((n, what)) = *w {
                if have != n {
                    return Err(value_err(
                        self.kernel,
                        v.name,
                        format!(
                            "dimension {d} has length {have} instead of {n} ({what}; shape {:?})",
                            v.shape
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// [`Call::expect_dims`] for detector quaternions, `[rows, samples,
    /// 4]`: `samples` where another array gives n_samp.
    fn expect_quats(&self, v: &View<'_>, samples: Option<(usize, &str)>) -> PyResult<()> {
        self.expect_dims(v, &[None, samples, QUATERNION])
    }

    /// Host pointer of a per-detector vector of `n` elements.
    fn per_det<T>(&self, v: &View<'_>, n: usize) -> PyResult<*const T> {
        self.expect_len(v, n, "one per detector")?;
        Ok(v.host())
    }

    /// An array the kernel reads or writes on the device: on a
    /// `use_accel=True` call, the device buffer of the present host array
    /// (an error naming the kernel and the array when it is not present);
    /// otherwise the host array, staged for the call by a device backend.
    fn stage<'v>(&self, v: &'v View<'py>) -> PyResult<Arg<'v>>
    where
        'a: 'v,
    {
        let Some(present) = self.accel else {
            return Ok(Arg::Host(stage(self.backend, v).map_err(accel_err)?));
        };
        if v.len == 0 {
            return Ok(Arg::ABSENT);
        }
        let resolved = present.resolve(
            self.args.py(),
            v.ptr,
            v.bytes() as u64,
            v.len as u64,
            &mut self.dropped.borrow_mut(),
        );
        match resolved {
            Resolved::Device(a) => Ok(Arg::Device(a)),
            Resolved::Missing => Err(PyRuntimeError::new_err(format!(
                "toast_rs {} (use_accel=True): argument `{}` (host {:#x}, {} bytes) is not \
                 present on the device; stage it first (Data.accel_create / \
                 accel_update_device, or accel_data_create / accel_data_update_device)",
                self.kernel,
                v.name,
                v.ptr,
                v.bytes()
            ))),
            Resolved::Smaller { name, nbytes } => Err(PyRuntimeError::new_err(format!(
                "toast_rs {} (use_accel=True): argument `{}` (host {:#x}, {} bytes) starts at \
                 the present buffer '{name}', which has {nbytes} bytes on the device: the \
                 argument needs {}; stage the whole array (delete '{name}' and create the \
                 larger array)",
                self.kernel,
                v.name,
                v.ptr,
                v.bytes(),
                v.bytes()
            ))),
            Resolved::Interior { offset, name } => Err(PyRuntimeError::new_err(format!(
                "toast_rs {} (use_accel=True): argument `{}` (host {:#x}) starts {offset} \
                 bytes into the present buffer '{name}'; a kernel takes whole device \
                 buffers, so pass the array that was staged",
                self.kernel, v.name, v.ptr
            ))),
        }
    }

    /// An array TOAST maps to the device for each call even on
    /// `use_accel=True` calls (`global2local`, `hit_submaps`), or builds on
    /// the host for each call (`offset_project_signal`'s `flag_data`):
    /// staged for the call, its bytes counted as the kernel's own staging.
    /// Not being present, the host array is the only copy, so this is
    /// correct; every other device array must be present.
    fn stage_per_call<'v>(&self, v: &'v View<'py>) -> PyResult<Arg<'v>>
    where
        'a: 'v,
    {
        let a = stage(self.backend, v).map_err(accel_err)?;
        if self.accel.is_some() && !self.backend.host_addressable() {
            let (h2d, d2h) = self.staged.get();
            let out = if v.output { v.bytes() as u64 } else { 0 };
            self.staged.set((h2d + v.bytes() as u64, d2h + out));
        }
        Ok(Arg::Host(a))
    }

    /// An array TOAST uses only when its length is `n` (shared flags, HWP
    /// angles): absent otherwise, as TOAST's kernels treat it.
    fn stage_if<'v>(&self, v: &'v View<'py>, used: bool) -> PyResult<Arg<'v>>
    where
        'a: 'v,
    {
        if used {
            self.stage(v)
        } else {
            Ok(Arg::ABSENT)
        }
    }
}

fn stage<'a>(b: &'a Backend, v: &'a View<'_>) -> Result<ArrayArg<'a>, AccelError> {
    macro_rules! go {
        ($t:ty) => {{
            let p = v.ptr as *mut $t;
            if v.len == 0 {
                ArrayArg::input::<$t>(b, &[], v.name)
            } else if v.output {
                // SAFETY: `p` is the address numpy's array interface gave for
                // a C-contiguous, aligned (checked in `take`), writable
                // (checked) buffer of `len` elements of this dtype; `_obj`
                // keeps it alive and the GIL, held for the whole call, keeps
                // Python code from touching it; `claim` checked that no other
                // argument of the call overlaps it, and this is its only
                // slice (one `stage` per view).
                let data = unsafe { std::slice::from_raw_parts_mut(p, v.len) };
                ArrayArg::output::<$t>(b, data, v.name)
            } else {
                // SAFETY: `p` is numpy's address of a C-contiguous, aligned (checked in
                // `take`) buffer of `len` elements of this dtype, kept alive by `_obj`;
                // it is only read, the GIL keeps Python code from writing it, and
                // `claim` checked that no output of the call overlaps it.
                let data = unsafe { std::slice::from_raw_parts(p, v.len) };
                ArrayArg::input::<$t>(b, data, v.name)
            }
        }};
    }
    match v.dt {
        Dt::F64 => go!(f64),
        Dt::F32 => go!(f32),
        Dt::I64 => go!(i64),
        Dt::I32 => go!(i32),
        Dt::U8 => go!(u8),
    }
}

fn ranges(v: &[SampleRange]) -> SampleRanges {
    SampleRanges {
        ptr: v.as_ptr(),
        len: v.len() as u64,
    }
}

/// Launch and copy back (outputs), releasing staged buffers.
fn run<A: toast_accel::host::KernelArgs>(
    b: &Backend,
    args: &A,
    arrays: Vec<Arg<'_>>,
) -> PyResult<()> {
    // SAFETY: every `Array` in `args` comes from an `Arg` in `arrays`: an
    // `ArrayArg` (a live host buffer of the declared length, or this
    // backend's staged copy of one), or the device buffer of a present host
    // array at least as large as the argument (`Present::resolve`), which
    // lives until `accel_data_delete` or until a lookup finds its owner dead
    // (no Python code runs between the arguments' lookups and this launch,
    // and a lookup drops only the entry holding its own argument, which an
    // earlier argument's lookup found alive); every host pointer comes from a
    // checked `View` alive for the call with the length the struct declares
    // for it (n_det, n_view), and outputs overlap nothing else
    // (`Call::claim`; two distinct present host buffers have distinct
    // device buffers).
    unsafe { b.launch(args) }.map_err(accel_err)?;
    for a in arrays {
        a.finish().map_err(accel_err)?;
    }
    Ok(())
}

use Dt::{F32, F64, I32, I64, U8};

/// `pointing_detector(focalplane, boresight, quat_index, quats, intervals,
/// shared_flags, shared_flag_mask)`.
fn pointing_detector(c: &mut Call<'_, '_>) -> PyResult<()> {
    let focalplane = c.input(0, "focalplane", &[F64], &[2])?;
    let boresight = c.input(1, "boresight", &[F64], &[2])?;
    let quat_index = c.input(2, "quat_index", &[I32], &[1])?;
    let quats = c.output(3, "quats", &[F64], &[3])?;
    let ivs = c.intervals(4)?;
    let shared = c.input(5, "shared_flags", &[U8], &[1])?;
    let mask = c.mask(6, "shared_flag_mask")?;
    let n_det = quat_index.len;
    let n_samp = quats.shape[1];
    c.expect_dims(
        &focalplane,
        &[Some((n_det, "n_det, the length of quat_index")), QUATERNION],
    )?;
    c.expect_dims(
        &boresight,
        &[Some((n_samp, "n_samp, as quats")), QUATERNION],
    )?;
    c.expect_quats(&quats, None)?;
    let (bs, sf, q) = (
        c.stage(&boresight)?,
        c.stage_if(&shared, shared.len == n_samp)?,
        c.stage(&quats)?,
    );
    let args = abi::PointingDetectorArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        quat_index: quat_index.host(),
        focalplane: focalplane.host(),
        intervals: ranges(&ivs),
        boresight: bs.abi(),
        shared_flags: sf.abi(),
        shared_flag_mask: mask,
        reserved: [0; 7],
        quats: q.abi(),
    };
    run(c.backend, &args, vec![q, bs, sf])
}

/// `pixels_healpix(quat_index, quats, shared_flags, shared_flag_mask,
/// pixel_index, pixels, intervals, hit_submaps, n_pix_submap, nside, nest)`.
fn pixels_healpix(c: &mut Call<'_, '_>) -> PyResult<()> {
    let quat_index = c.input(0, "quat_index", &[I32], &[1])?;
    let quats = c.input(1, "quats", &[F64], &[3])?;
    let shared = c.input(2, "shared_flags", &[U8], &[1])?;
    let mask = c.mask(3, "shared_flag_mask")?;
    let pixel_index = c.input(4, "pixel_index", &[I32], &[1])?;
    let pixels = c.output(5, "pixels", &[I64], &[2])?;
    let ivs = c.intervals(6)?;
    let hits = c.output(7, "hit_submaps", &[U8], &[1])?;
    let n_pix_submap = c.i64(8, "n_pix_submap")?;
    let nside = c.i64(9, "nside")?;
    let nest = c.flag(10, "nest")?;
    let n_det = quat_index.len;
    let n_samp = pixels.shape[1];
    c.expect_len(&pixel_index, n_det, "one per detector, as quat_index")?;
    c.expect_quats(&quats, Some((n_samp, "n_samp, as pixels")))?;
    let (q, sf, p, h) = (
        c.stage(&quats)?,
        c.stage_if(&shared, shared.len == n_samp)?,
        c.stage(&pixels)?,
        c.stage_per_call(&hits)?,
    );
    let args = abi::PixelsHealpixArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        quat_index: quat_index.host(),
        pixel_index: pixel_index.host(),
        intervals: ranges(&ivs),
        quats: q.abi(),
        shared_flags: sf.abi(),
        pixels: p.abi(),
        hit_submaps: h.abi(),
        nside,
        n_pix_submap,
        shared_flag_mask: mask,
        nest: u8::from(nest),
        pixels_i32: 0,
        reserved: [0; 5],
    };
    run(c.backend, &args, vec![p, h, q, sf])
}

/// `stokes_weights_I(weight_index, weights, intervals, cal)`.
fn stokes_weights_i(c: &mut Call<'_, '_>) -> PyResult<()> {
    let weight_index = c.input(0, "weight_index", &[I32], &[1])?;
    let weights = c.output(1, "weights", &[F64], &[2])?;
    let ivs = c.intervals(2)?;
    let n_det = weight_index.len;
    let cal = c.input(3, "cal", &[F64], &[1])?;
    let cal = c.per_det::<f64>(&cal, n_det)?;
    let n_samp = weights.shape[1];
    let w = c.stage(&weights)?;
    let args = abi::StokesWeightsIArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        weight_index: weight_index.host(),
        cal,
        intervals: ranges(&ivs),
        weights: w.abi(),
    };
    run(c.backend, &args, vec![w])
}

/// `stokes_weights_IQU(quat_index, quats, weight_index, weights, hwp,
/// intervals, epsilon, gamma, cal, IAU)`.
fn stokes_weights_iqu(c: &mut Call<'_, '_>) -> PyResult<()> {
    let quat_index = c.input(0, "quat_index", &[I32], &[1])?;
    let quats = c.input(1, "quats", &[F64], &[3])?;
    let weight_index = c.input(2, "weight_index", &[I32], &[1])?;
    let weights = c.output(3, "weights", &[F64], &[3])?;
    let hwp = c.input(4, "hwp", &[F64], &[1])?;
    let ivs = c.intervals(5)?;
    let n_det = quat_index.len;
    let n_samp = weights.shape[1];
    let epsilon = c.input(6, "epsilon", &[F64], &[1])?;
    let gamma = c.input(7, "gamma", &[F64], &[1])?;
    let cal = c.input(8, "cal", &[F64], &[1])?;
    let iau = c.flag(9, "IAU")?;
    c.expect_len(&weight_index, n_det, "one per detector, as quat_index")?;
    c.expect_dims(&weights, &[None, None, Some((3, "I, Q, U"))])?;
    c.expect_quats(&quats, Some((n_samp, "n_samp, as weights")))?;
    let (epsilon, gamma, cal) = (
        c.per_det::<f64>(&epsilon, n_det)?,
        c.per_det::<f64>(&gamma, n_det)?,
        c.per_det::<f64>(&cal, n_det)?,
    );
    let (q, h, w) = (
        c.stage(&quats)?,
        c.stage_if(&hwp, hwp.len == n_samp)?,
        c.stage(&weights)?,
    );
    let args = abi::StokesWeightsIquArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        quat_index: quat_index.host(),
        weight_index: weight_index.host(),
        epsilon,
        gamma,
        cal,
        intervals: ranges(&ivs),
        quats: q.abi(),
        hwp: h.abi(),
        weights: w.abi(),
        iau: u8::from(iau),
        reserved: [0; 7],
    };
    run(c.backend, &args, vec![w, q, h])
}

/// The number of values per sample of a `[n_rows, n_samp]` or
/// `[n_rows, n_samp, nnz]` weights array.
fn nnz_of(weights: &View<'_>) -> usize {
    if weights.shape.len() == 3 {
        weights.shape[2]
    } else {
        1
    }
}

/// TOAST's `scan_map` on a sample whose pixel lies in a submap that is not
/// local (`global2local` = -1) reads before the start of the map: undefined
/// behaviour, which TOAST's own tests reach (`ops_mapmaker`'s
/// `test_offset_ground`: the samples outside the "scanning" view keep pixel
/// 0, and are flagged afterwards). Our kernels refuse such a pixel. For
/// TOAST's callers this layer defines it as TOAST defines a negative pixel:
/// the sample is not hit and its `det_data` is left as it is. Returns a copy
/// of `pixels` with those samples set to -1, or `None` (the common case,
/// no copy) when every pixel the call reads is local, out of range of
/// `global2local` (the kernel reports it), or negative.
fn nonlocal_as_unhit(
    g2l: &View<'_>,
    n_pix_submap: i64,
    pixels: &View<'_>,
    pixel_index: &View<'_>,
    ivs: &[SampleRange],
) -> Option<Vec<i64>> {
    if n_pix_submap <= 0 || pixels.shape.len() != 2 || pixels.len == 0 {
        return None;
    }
    // SAFETY: each view is a live, C-contiguous, aligned numpy buffer of
    // `len` elements of the dtype checked by `Call::input` (int64 for
    // global2local and pixels, int32 for pixels_index); `_obj` keeps them
    // alive and the GIL, held for the call, keeps Python code from
    // changing them; they are only read here.
    let (g2l, pix, rows) = unsafe {
        (
            std::slice::from_raw_parts(g2l.host::<i64>(), g2l.len),
            std::slice::from_raw_parts(pixels.host::<i64>(), pixels.len),
            std::slice::from_raw_parts(pixel_index.host::<i32>(), pixel_index.len),
        )
    };
    let n_samp = pixels.shape[1];
    let nonlocal = |p: i64| {
        p >= 0
            && usize::try_from(p / n_pix_submap)
                .ok()
                .and_then(|sub| g2l.get(sub))
                .is_some_and(|&l| l < 0)
    };
    let mut hit: Vec<(usize, usize)> = Vec::new();
    for &row in rows {
        let Ok(row) = usize::try_from(row) else {
            continue;
        };
        if row >= pixels.shape[0] {
            continue;
        }
        for iv in ivs {
            let first = usize::try_from(iv.first).unwrap_or(0).min(n_samp);
            let last = usize::try_from(iv.last).unwrap_or(0).min(n_samp);
            for s in first..last {
                if nonlocal(pix[row * n_samp + s]) {
                    hit.push((row, s));
                }
            }
        }
    }
    if hit.is_empty() {
        return None;
    }
    let mut copy = pix.to_vec();
    for (row, s) in hit {
        copy[row * n_samp + s] = -1;
    }
    Some(copy)
}

/// `scan_map(global2local, n_pix_submap, mapdata, det_data, det_data_index,
/// pixels, pixels_index, weights, weight_index, intervals, data_scale,
/// should_zero, should_subtract, should_scale)`.
fn scan_map(c: &mut Call<'_, '_>) -> PyResult<()> {
    let g2l = c.input(0, "global2local", &[I64], &[1])?;
    let n_pix_submap = c.i64(1, "n_pix_submap")?;
    let mapdata = c.input(2, "mapdata", &[F64, F32, I64, I32], &[3])?;
    let det_data = c.output(3, "det_data", &[F64], &[2])?;
    let data_index = c.input(4, "det_data_index", &[I32], &[1])?;
    let pixels = c.input(5, "pixels", &[I64], &[2])?;
    let pixel_index = c.input(6, "pixels_index", &[I32], &[1])?;
    let weights = c.input(7, "weights", &[F64], &[2, 3])?;
    let weight_index = c.input(8, "weight_index", &[I32], &[1])?;
    let ivs = c.intervals(9)?;
    let data_scale = c.f64(10, "data_scale")?;
    let should_zero = c.flag(11, "should_zero")?;
    let should_subtract = c.flag(12, "should_subtract")?;
    let should_scale = c.flag(13, "should_scale")?;
    let n_det = pixel_index.len;
    let n_samp = pixels.shape[1];
    c.expect_len(&data_index, n_det, "one per detector, as pixels_index")?;
    c.expect_len(&weight_index, n_det, "one per detector, as pixels_index")?;
    // TOAST's shapes: weights [n_rows, n_samp(, nnz)], det_data [n_rows,
    // n_samp], mapdata [n_local_submap, n_pix_submap, nnz].
    let nnz = nnz_of(&weights);
    c.expect_dims(&weights, &[None, Some((n_samp, "n_samp, as pixels"))])?;
    c.expect_dims(&det_data, &[None, Some((n_samp, "n_samp, as pixels"))])?;
    c.expect_dims(
        &mapdata,
        &[
            None,
            usize::try_from(n_pix_submap)
                .ok()
                .map(|n| (n, "n_pix_submap")),
            Some((nnz, "nnz, as weights")),
        ],
    )?;
    let map_dtype = match mapdata.dt {
        F64 => abi::DTYPE_F64,
        F32 => abi::DTYPE_F32,
        I64 => abi::DTYPE_I64,
        _ => abi::DTYPE_I32,
    };
    // On a `use_accel=True` call the host pixels may be stale (the device
    // copy is the current one): the kernel reports a non-local pixel there.
    let unhit = if c.accel.is_none() {
        nonlocal_as_unhit(&g2l, n_pix_submap, &pixels, &pixel_index, &ivs)
    } else {
        None
    };
    let (g, m, w, d) = (
        c.stage_per_call(&g2l)?,
        c.stage(&mapdata)?,
        c.stage(&weights)?,
        c.stage(&det_data)?,
    );
    let p = match &unhit {
        Some(copy) => {
            Arg::Host(ArrayArg::input::<i64>(c.backend, copy, pixels.name).map_err(accel_err)?)
        }
        None => c.stage(&pixels)?,
    };
    let args = abi::ScanMapArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        nnz: nnz as u64,
        pixel_index: pixel_index.host(),
        weight_index: weight_index.host(),
        data_index: data_index.host(),
        intervals: ranges(&ivs),
        global2local: g.abi(),
        n_pix_submap,
        map_dtype,
        reserved0: 0,
        mapdata: m.abi(),
        pixels: p.abi(),
        weights: w.abi(),
        det_data: d.abi(),
        data_scale,
        should_zero: u8::from(should_zero),
        should_subtract: u8::from(should_subtract),
        should_scale: u8::from(should_scale),
        reserved: [0; 5],
    };
    run(c.backend, &args, vec![d, g, m, p, w])
}

/// `build_noise_weighted(global2local, zmap, pixel_index, pixels,
/// weight_index, weights, data_index, det_data, flag_index, det_flags,
/// det_scale, det_flag_mask, intervals, shared_flags, shared_flag_mask)`.
fn build_noise_weighted(c: &mut Call<'_, '_>) -> PyResult<()> {
    let g2l = c.input(0, "global2local", &[I64], &[1])?;
    let zmap = c.output(1, "zmap", &[F64], &[3])?;
    let pixel_index = c.input(2, "pixel_index", &[I32], &[1])?;
    let pixels = c.input(3, "pixels", &[I64], &[2])?;
    let weight_index = c.input(4, "weight_index", &[I32], &[1])?;
    let weights = c.input(5, "weights", &[F64], &[2, 3])?;
    let data_index = c.input(6, "data_index", &[I32], &[1])?;
    let det_data = c.input(7, "det_data", &[F64], &[2])?;
    let flag_index = c.input(8, "flag_index", &[I32], &[1])?;
    let det_flags = c.input(9, "det_flags", &[U8], &[2])?;
    let det_scale = c.input(10, "det_scale", &[F64], &[1])?;
    let det_flag_mask = c.mask(11, "det_flag_mask")?;
    let ivs = c.intervals(12)?;
    let shared = c.input(13, "shared_flags", &[U8], &[1])?;
    let shared_flag_mask = c.mask(14, "shared_flag_mask")?;
    let n_det = pixel_index.len;
    let n_samp = pixels.shape[1];
    c.expect_len(&weight_index, n_det, "one per detector, as pixel_index")?;
    c.expect_len(&data_index, n_det, "one per detector, as pixel_index")?;
    // TOAST's shapes: weights [n_rows, n_samp(, nnz)], det_data [n_rows,
    // n_samp], zmap [n_local_submap, n_pix_submap, nnz] (nnz: the weights').
    let nnz = nnz_of(&weights);
    c.expect_dims(&weights, &[None, Some((n_samp, "n_samp, as pixels"))])?;
    c.expect_dims(&det_data, &[None, Some((n_samp, "n_samp, as pixels"))])?;
    c.expect_dims(&zmap, &[None, None, Some((nnz, "nnz, as weights"))])?;
    let det_scale = c.per_det::<f64>(&det_scale, n_det)?;
    // TOAST reads det_flags only when its rows are n_samp long (the
    // operator passes a (1, 1) array, and a one-element flag_index, for none).
    let use_det_flags = det_flags.shape[1] == n_samp;
    if use_det_flags {
        c.expect_len(&flag_index, n_det, "one per detector, as pixel_index")?;
        // No row for flag_index to name: staged, an empty array is the
        // ABI's "no det_flags", which would drop the flags unread.
        if det_flags.len == 0 && n_det > 0 && n_samp > 0 {
            return Err(value_err(
                c.kernel,
                det_flags.name,
                format!(
                    "shape {:?}: rows of n_samp flags, so they are read, but no row for \
                     flag_index to name",
                    det_flags.shape
                ),
            ));
        }
    }
    let n_pix_submap = zmap.shape[1] as i64;
    let (g, p, w, d, f, sf, z) = (
        c.stage_per_call(&g2l)?,
        c.stage(&pixels)?,
        c.stage(&weights)?,
        c.stage(&det_data)?,
        c.stage_if(&det_flags, use_det_flags)?,
        c.stage_if(&shared, shared.len == n_samp)?,
        c.stage(&zmap)?,
    );
    let args = abi::BuildNoiseWeightedArgs {
        n_det: n_det as u64,
        n_samp: n_samp as u64,
        nnz: nnz as u64,
        pixel_index: pixel_index.host(),
        weight_index: weight_index.host(),
        data_index: data_index.host(),
        flag_index: if use_det_flags {
            flag_index.host()
        } else {
            std::ptr::null()
        },
        det_scale,
        intervals: ranges(&ivs),
        global2local: g.abi(),
        n_pix_submap,
        pixels: p.abi(),
        weights: w.abi(),
        det_data: d.abi(),
        det_flags: f.abi(),
        shared_flags: sf.abi(),
        zmap: z.abi(),
        det_flag_mask,
        shared_flag_mask,
        reserved: [0; 6],
    };
    run(c.backend, &args, vec![z, g, p, w, d, f, sf])
}

/// `noise_weight(det_data, det_data_index, intervals, detector_weights)`.
fn noise_weight(c: &mut Call<'_, '_>) -> PyResult<()> {
    let det_data = c.output(0, "det_data", &[F64], &[2])?;
    let data_index = c.input(1, "det_data_index", &[I32], &[1])?;
    let ivs = c.intervals(2)?;
    let weights = c.input(3, "detector_weights", &[F64], &[1])?;
    let n_det = data_index.len;
    let detector_weights = c.per_det::<f64>(&weights, n_det)?;
    let d = c.stage(&det_data)?;
    let args = abi::NoiseWeightArgs {
        n_det: n_det as u64,
        n_samp: det_data.shape[1] as u64,
        data_index: data_index.host(),
        detector_weights,
        intervals: ranges(&ivs),
        det_data: d.abi(),
    };
    run(c.backend, &args, vec![d])
}

/// `offset_add_to_signal(step_length, amp_offset, n_amp_views, amplitudes,
/// amplitude_flags, data_index, det_data, intervals)`: one detector.
fn offset_add_to_signal(c: &mut Call<'_, '_>) -> PyResult<()> {
    let step_length = c.i64(0, "step_length")?;
    let amp_offset = c.i64(1, "amp_offset")?;
    let n_amp_views = c.input(2, "n_amp_views", &[I64], &[1])?;
    let amplitudes = c.input(3, "amplitudes", &[F64], &[1])?;
    let amp_flags = c.input(4, "amplitude_flags", &[U8], &[1])?;
    let data_index: i32 = c.scalar(5, "data_index", "an int32 detector row")?;
    let det_data = c.output(6, "det_data", &[F64], &[2])?;
    let ivs = c.intervals(7)?;
    c.expect_len(&n_amp_views, ivs.len(), "one per interval")?;
    let (a, f, d) = (
        c.stage(&amplitudes)?,
        c.stage(&amp_flags)?,
        c.stage(&det_data)?,
    );
    let args = abi::TemplateOffsetAddArgs {
        n_det: 1,
        n_samp: det_data.shape[1] as u64,
        data_index: &data_index,
        layout: abi::OffsetLayout {
            step_length,
            n_amp_views: n_amp_views.host(),
            amp_offset: &amp_offset,
        },
        intervals: ranges(&ivs),
        amplitudes: a.abi(),
        amplitude_flags: f.abi(),
        det_data: d.abi(),
    };
    run(c.backend, &args, vec![d, a, f])
}

/// `offset_project_signal(data_index, det_data, flag_index, flag_data,
/// flag_mask, step_length, amp_offset, n_amp_views, amplitudes,
/// amplitude_flags, intervals)`: one detector.
fn offset_project_signal(c: &mut Call<'_, '_>) -> PyResult<()> {
    let data_index: i32 = c.scalar(0, "data_index", "an int32 detector row")?;
    let det_data = c.input(1, "det_data", &[F64], &[2])?;
    let flag_index: i32 = c.scalar(2, "flag_index", "an int32 flag row (-1: none)")?;
    let step_length = c.i64(5, "step_length")?;
    let amp_offset = c.i64(6, "amp_offset")?;
    let n_amp_views = c.input(7, "n_amp_views", &[I64], &[1])?;
    let amplitudes = c.output(8, "amplitudes", &[F64], &[1])?;
    let amp_flags = c.input(9, "amplitude_flags", &[U8], &[1])?;
    let ivs = c.intervals(10)?;
    c.expect_len(&n_amp_views, ivs.len(), "one per interval")?;
    // TOAST never looks at flag_data (nor flag_mask) when flag_index < 0.
    let (flag_data, flag_mask) = if flag_index >= 0 {
        (
            Some(c.input(3, "flag_data", &[U8], &[2])?),
            c.mask(4, "flag_mask")?,
        )
    } else {
        (None, 0)
    };
    if let Some(v) = &flag_data {
        c.expect_dims(v, &[None, Some((det_data.shape[1], "n_samp, as det_data"))])?;
    }
    let flag_index = flag_index.max(-1);
    // TOAST builds flag_data per call on the host (a copy of the detector
    // flags with the view mask or-ed in: templates/offset/offset.py), so it
    // is never present: staged for the call, as global2local is.
    let fd = match &flag_data {
        Some(v) => c.stage_per_call(v)?,
        None => Arg::ABSENT,
    };
    let (d, a, f) = (
        c.stage(&det_data)?,
        c.stage(&amplitudes)?,
        c.stage(&amp_flags)?,
    );
    let args = abi::TemplateOffsetProjectArgs {
        n_det: 1,
        n_samp: det_data.shape[1] as u64,
        data_index: &data_index,
        flag_index: &flag_index,
        layout: abi::OffsetLayout {
            step_length,
            n_amp_views: n_amp_views.host(),
            amp_offset: &amp_offset,
        },
        intervals: ranges(&ivs),
        det_data: d.abi(),
        flag_data: fd.abi(),
        amplitudes: a.abi(),
        amplitude_flags: f.abi(),
        flag_mask,
        reserved: [0; 7],
    };
    run(c.backend, &args, vec![a, d, fd, f])
}

/// `offset_apply_diag_precond(offset_var, amplitudes_in, amplitude_flags,
/// amplitudes_out)`.
fn offset_apply_diag_precond(c: &mut Call<'_, '_>) -> PyResult<()> {
    let var = c.input(0, "offset_var", &[F64], &[1])?;
    let a_in = c.input(1, "amplitudes_in", &[F64], &[1])?;
    let flags = c.input(2, "amplitude_flags", &[U8], &[1])?;
    let a_out = c.output(3, "amplitudes_out", &[F64], &[1])?;
    let (v, i, f, o) = (
        c.stage(&var)?,
        c.stage(&a_in)?,
        c.stage(&flags)?,
        c.stage(&a_out)?,
    );
    let args = abi::TemplateOffsetPrecondArgs {
        n_amp: a_in.len as u64,
        offset_var: v.abi(),
        amplitudes_in: i.abi(),
        amplitude_flags: f.abi(),
        amplitudes_out: o.abi(),
    };
    run(c.backend, &args, vec![o, v, i, f])
}

/// The shape a 3-D local map buffer of `nsub` submaps of `nsubpix` pixels
/// of `block` values has (`None` for a size that is negative: the plugin
/// refuses it).
fn map_dims(nsub: i64, nsubpix: i64, block: usize) -> [Option<(usize, &'static str)>; 3] {
    [
        usize::try_from(nsub).ok().map(|n| (n, "nsub")),
        usize::try_from(nsubpix).ok().map(|n| (n, "nsubpix")),
        Some((block, "values per pixel")),
    ]
}

/// `cov_accum_diag_hits(nsub, nsubpix, nnz, submap, subpix, hits)`.
fn cov_accum_diag_hits(c: &mut Call<'_, '_>) -> PyResult<()> {
    let nsub = c.i64(0, "nsub")?;
    let nsubpix = c.i64(1, "nsubpix")?;
    let nnz = c.i64(2, "nnz")?;
    let submap = c.input(3, "submap", &[I64], &[1])?;
    let subpix = c.input(4, "subpix", &[I64], &[1])?;
    let hits = c.output(5, "hits", &[I64], &[1, 2, 3])?;
    if nsub >= 1 && hits.shape.len() == 3 {
        // A PixelData's [n_submap, n_pix_submap, 1] buffer.
        c.expect_dims(&hits, &map_dims(nsub, nsubpix, 1))?;
    }
    // TOAST passes its whole local map buffer; the kernel's is nsub x nsubpix.
    let (m, p) = (c.stage(&submap)?, c.stage(&subpix)?);
    let h = c.stage(&hits)?;
    let args = abi::CovAccumDiagHitsArgs {
        nsub,
        nsubpix,
        nnz,
        submap: m.abi(),
        subpix: p.abi(),
        hits: if nsub < 1 {
            abi::Array::ABSENT
        } else {
            h.abi()
        },
    };
    run(c.backend, &args, vec![h, m, p])
}

/// `cov_accum_diag_invnpp(nsub, nsubpix, nnz, submap, subpix, weights,
/// scale, invnpp)`.
fn cov_accum_diag_invnpp(c: &mut Call<'_, '_>) -> PyResult<()> {
    let nsub = c.i64(0, "nsub")?;
    let nsubpix = c.i64(1, "nsubpix")?;
    let nnz = c.i64(2, "nnz")?;
    let submap = c.input(3, "submap", &[I64], &[1])?;
    let subpix = c.input(4, "subpix", &[I64], &[1])?;
    let weights = c.input(5, "weights", &[F64], &[1, 2])?;
    let scale = c.f64(6, "scale")?;
    let invnpp = c.output(7, "invnpp", &[F64], &[1, 2, 3])?;
    if nsub >= 1 {
        // [n_samp, nnz] weights, and a PixelData's [n_submap, n_pix_submap,
        // nnz (nnz + 1) / 2] buffer, agree with the sizes given.
        if let Ok(k) = usize::try_from(nnz) {
            if weights.shape.len() == 2 {
                c.expect_dims(
                    &weights,
                    &[
                        Some((submap.len, "n_samp, the length of submap")),
                        Some((k, "nnz")),
                    ],
                )?;
            }
            if invnpp.shape.len() == 3 {
                c.expect_dims(&invnpp, &map_dims(nsub, nsubpix, k * (k + 1) / 2))?;
            }
        }
    }
    let (m, p, w) = (c.stage(&submap)?, c.stage(&subpix)?, c.stage(&weights)?);
    let o = c.stage(&invnpp)?;
    let active = nsub >= 1;
    let args = abi::CovAccumDiagInvnppArgs {
        nsub,
        nsubpix,
        nnz,
        submap: m.abi(),
        subpix: p.abi(),
        weights: if active { w.abi() } else { abi::Array::ABSENT },
        scale,
        invnpp: if active { o.abi() } else { abi::Array::ABSENT },
    };
    run(c.backend, &args, vec![o, m, p, w])
}

/// `filter_polynomial(order, flags, signals_list, starts, stops)`: the
/// signals are separate arrays, filtered independently (one call each, the
/// scans in order), which is TOAST's result. Every signal is checked (dtype,
/// rank, its length against `flags`', as TOAST does) before any is
/// filtered, so a bad one leaves all of them as they were; the error names
/// it by its index.
fn filter_polynomial(c: &mut Call<'_, '_>) -> PyResult<()> {
    let order = c.i64(0, "order")?;
    let flags = c.input(1, "flags", &[U8], &[1])?;
    let starts = c.input(3, "starts", &[I64], &[1])?;
    let stops = c.input(4, "stops", &[I64], &[1])?;
    c.expect_len(&stops, starts.len, "one per scan, as starts")?;
    let list = c.arg(2, "signals_list")?;
    let py = list.py();
    // An error about one signal, with its index.
    let at = |i: usize, e: PyErr| {
        PyErr::from_type(
            e.get_type(py),
            format!("{} (signals_list[{i}])", e.value(py)),
        )
    };
    let mut signals = Vec::new();
    for (i, item) in list.try_iter()?.enumerate() {
        let sig = c
            .interface_of(item?, "signals_list")
            .and_then(|(obj, iface)| c.take_from(obj, iface, "signals_list", &[F64], &[1], true))
            .map_err(|e| at(i, e))?;
        if sig.len != flags.len {
            return Err(value_err(
                c.kernel,
                "signals_list",
                format!(
                    "signals_list[{i}] has {} samples, flags has {} (one flag per sample)",
                    sig.len, flags.len
                ),
            ));
        }
        signals.push(sig);
    }
    let index = [0i32];
    for sig in &signals {
        let (f, s) = (c.stage(&flags)?, c.stage(sig)?);
        let args = abi::FilterPolynomialArgs {
            n_signal: 1,
            n_samp: sig.len as u64,
            n_scan: starts.len as u64,
            order,
            signal_index: index.as_ptr(),
            starts: starts.host(),
            stops: stops.host(),
            flags: f.abi(),
            signals: s.abi(),
        };
        run(c.backend, &args, vec![s, f])?;
    }
    Ok(())
}

/// `filter_poly2D(det_groups, templates, signals, masks, coeff)`.
fn filter_poly2d(c: &mut Call<'_, '_>) -> PyResult<()> {
    let det_groups = c.input(0, "det_groups", &[I32], &[1])?;
    let templates = c.input(1, "templates", &[F64], &[2])?;
    let signals = c.input(2, "signals", &[F64], &[2])?;
    let masks = c.input(3, "masks", &[U8], &[2])?;
    let coeff = c.output(4, "coeff", &[F64], &[3])?;
    let n_det = det_groups.len;
    let (n_samp, n_mode) = (signals.shape[0], templates.shape[1]);
    // TOAST's shapes: signals and masks [n_samp, n_det], templates [n_det,
    // n_mode], coeff [n_samp, n_group, n_mode].
    let det = Some((n_det, "n_det, the length of det_groups"));
    c.expect_dims(&templates, &[det, None])?;
    c.expect_dims(&signals, &[None, det])?;
    c.expect_dims(&masks, &[Some((n_samp, "n_samp, as signals")), det])?;
    c.expect_dims(
        &coeff,
        &[
            Some((n_samp, "n_samp, as signals")),
            None,
            Some((n_mode, "n_mode, as templates")),
        ],
    )?;
    let (s, m, o) = (c.stage(&signals)?, c.stage(&masks)?, c.stage(&coeff)?);
    let args = abi::FilterPoly2dArgs {
        n_samp: n_samp as u64,
        n_det: n_det as u64,
        n_group: coeff.shape[1] as u64,
        n_mode: n_mode as u64,
        det_groups: det_groups.host(),
        templates: templates.host(),
        signals: s.abi(),
        masks: m.abi(),
        coeff: o.abi(),
    };
    run(c.backend, &args, vec![o, s, m])
}

/// One row of the kernel table: TOAST's registry name, our kernel, and the
/// adapter from TOAST's positional arguments to the ABI call.
struct KernelEntry {
    toast_name: &'static str,
    kernel: Kernel,
    adapt: Adapter,
}

/// The adapter of one kernel from TOAST's positional arguments.
type Adapter = fn(&mut Call<'_, '_>) -> PyResult<()>;

/// TOAST's registry name of a kernel of the table and its adapter, or
/// `None` for a kernel of ours that TOAST's registry does not have. The
/// match is exhaustive: a kernel added to the table does not compile here
/// until it is given its TOAST name and adapter, or `None`.
fn toast_entry(kernel: Kernel) -> Option<(&'static str, Adapter)> {
    Some(match kernel {
        Kernel::PointingDetector => ("pointing_detector", pointing_detector),
        Kernel::PixelsHealpix => ("pixels_healpix", pixels_healpix),
        Kernel::StokesWeightsI => ("stokes_weights_I", stokes_weights_i),
        Kernel::StokesWeightsIqu => ("stokes_weights_IQU", stokes_weights_iqu),
        Kernel::ScanMap => ("scan_map", scan_map),
        Kernel::BuildNoiseWeighted => ("build_noise_weighted", build_noise_weighted),
        Kernel::NoiseWeight => ("noise_weight", noise_weight),
        Kernel::TemplateOffsetAddToSignal => ("offset_add_to_signal", offset_add_to_signal),
        Kernel::TemplateOffsetProjectSignal => ("offset_project_signal", offset_project_signal),
        Kernel::TemplateOffsetApplyDiagPrecond => {
            ("offset_apply_diag_precond", offset_apply_diag_precond)
        }
        Kernel::CovAccumDiagHits => ("cov_accum_diag_hits", cov_accum_diag_hits),
        Kernel::CovAccumDiagInvnpp => ("cov_accum_diag_invnpp", cov_accum_diag_invnpp),
        Kernel::FilterPolynomial => ("filter_polynomial", filter_polynomial),
        Kernel::FilterPoly2d => ("filter_poly2D", filter_poly2d),
        // Ours: the map-maker's covariance application, the solver's
        // vector kernels, the fused passes and the hit map and inverse
        // covariance from the timestream (BuildHitMap and
        // BuildInverseCovariance are operators in TOAST, not registry
        // kernels); and the noise simulation (TOAST's SimNoise calls its
        // compiled `tod_sim_noise_timestream` directly, not through the
        // kernel registry).
        Kernel::CovApplyDiag
        | Kernel::AmpDot
        | Kernel::AmpAxpby
        | Kernel::CompactExpandPointing
        | Kernel::FusedAccumulate
        | Kernel::FusedProject
        | Kernel::SimNoise
        | Kernel::CovAccumTimestream
        | Kernel::SolverFlags => return None,
    })
}

/// Every TOAST registry kernel toast-rs implements: the kernels of the
/// table ([`Kernel::ALL`], in table order) that TOAST's registry has
/// ([`toast_entry`]). The Python package replaces exactly the registry
/// entries named here and leaves TOAST's others.
static KERNELS: std::sync::LazyLock<Vec<KernelEntry>> = std::sync::LazyLock::new(|| {
    Kernel::ALL
        .iter()
        .filter_map(|&kernel| {
            toast_entry(kernel).map(|(toast_name, adapt)| KernelEntry {
                toast_name,
                kernel,
                adapt,
            })
        })
        .collect()
});

fn entry(toast_name: &str) -> PyResult<(usize, &'static KernelEntry)> {
    KERNELS
        .iter()
        .enumerate()
        .find(|(_, e)| e.toast_name == toast_name)
        .ok_or_else(|| PyValueError::new_err(format!("toast_rs: no kernel `{toast_name}`")))
}

/// Calls and seconds of one kernel.
#[derive(Debug, Default, Clone, Copy)]
struct Use {
    calls: u64,
    /// Of which `use_accel=True` calls on device-resident arrays.
    accel_calls: u64,
    seconds: f64,
}

/// Plugins loaded, the backend each kernel resolved to, and the counts.
#[pyclass(module = "toast_rs._native", frozen)]
#[derive(Debug)]
struct Runtime {
    /// Per row of [`KERNELS`]: the backend that runs it.
    backends: Vec<Arc<Backend>>,
    /// Per row of [`KERNELS`]: why it does not run where asked, if so.
    fallbacks: Vec<Vec<(String, String)>>,
    uses: Mutex<Vec<Use>>,
    /// TOAST's accelerator contract (`install(..., accel=True)`): the
    /// present table on the one backend that runs every kernel.
    present: Option<Present>,
    /// Keeps the plugins loaded; declared last so that the present table's
    /// buffers are freed while their plugin is still loaded.
    _registry: Arc<Registry>,
}

impl Runtime {
    fn present(&self) -> PyResult<&Present> {
        self.present.as_ref().ok_or_else(|| {
            PyRuntimeError::new_err(
                "toast_rs: accelerator support is off (toast_rs.install(..., accel=True) turns it on)",
            )
        })
    }
}

/// A host buffer of an `accel_data_*` call, named for errors.
fn block(data: &Bound<'_, PyAny>, op: &str, name: &str) -> PyResult<accel::HostBlock> {
    accel::host_block(data, &format!("accel_data_{op}('{name}')"))
}

#[pymethods]
impl Runtime {
    /// Load the plugins and resolve every kernel: `backend` for all,
    /// `dispatch` (TOAST kernel name → backend) overriding it per kernel.
    /// A backend named but not found or unavailable is an error (with the
    /// reason); one lacking a kernel falls back to `cpu` for it, as the
    /// `[dispatch]` configuration does. `options` is handed to `backend`'s
    /// `init` (`device=N`). With `accel`, every kernel must run on
    /// `backend` (its device buffers are the present table's).
    #[new]
    #[pyo3(signature = (backend, dispatch, backend_path, fallback_dirs, accel=false, options=None))]
    fn new(
        backend: &str,
        dispatch: BTreeMap<String, String>,
        backend_path: Vec<PathBuf>,
        fallback_dirs: Vec<PathBuf>,
        accel: bool,
        options: Option<String>,
    ) -> PyResult<Self> {
        let mut policy = DispatchPolicy::new().with_run(backend);
        for (name, b) in &dispatch {
            let (_, e) = entry(name).map_err(|_| {
                let known: Vec<&str> = KERNELS.iter().map(|e| e.toast_name).collect();
                PyValueError::new_err(format!(
                    "toast_rs.install: unknown kernel `{name}` (toast-rs kernels: {})",
                    known.join(", ")
                ))
            })?;
            policy = policy.with_kernel(e.kernel, b);
        }
        let mut opts = DiscoveryOptions {
            explicit: backend_path,
            ..DiscoveryOptions::default()
        };
        // After the explicit paths and TOAST_BACKEND_PATH, before the
        // system directories: the package's own and the build tree's.
        opts.system_dirs.splice(0..0, fallback_dirs);
        if let Some(o) = &options {
            opts = opts.with_backend_options(backend, o);
        }
        let registry = Arc::new(Registry::discover(&opts));
        // Every backend named must be usable.
        let mut named: Vec<&str> = vec![backend];
        named.extend(dispatch.values().map(String::as_str));
        for name in named {
            registry.get(name).map_err(|e| {
                PyRuntimeError::new_err(format!("toast_rs.install: backend `{name}`: {e}"))
            })?;
        }
        let mut backends = Vec::new();
        let mut fallbacks = Vec::new();
        for e in KERNELS.iter() {
            let r = policy
                .resolve(&registry, e.kernel, None)
                .map_err(accel_err)?;
            backends.push(r.backend);
            fallbacks.push(r.fallbacks);
        }
        let present = if accel {
            let main = registry.get(backend).map_err(accel_err)?;
            let elsewhere: Vec<String> = KERNELS
                .iter()
                .zip(&backends)
                .filter(|(_, b)| !Arc::ptr_eq(b, &main))
                .map(|(e, b)| format!("{} on {}", e.toast_name, b.name()))
                .collect();
            if !elsewhere.is_empty() {
                return Err(PyValueError::new_err(format!(
                    "toast_rs.install(accel=True): every kernel must run on `{backend}`, whose \
                     device buffers TOAST's data live in; {}",
                    elsewhere.join(", ")
                )));
            }
            Some(Present::new(main))
        } else {
            None
        };
        Ok(Runtime {
            backends,
            fallbacks,
            uses: Mutex::new(vec![Use::default(); KERNELS.len()]),
            present,
            _registry: registry,
        })
    }

    /// Run TOAST kernel `name` with TOAST's positional arguments. With
    /// `use_accel`, the device arrays are the present table's.
    #[pyo3(signature = (name, args, use_accel=false))]
    fn call(&self, name: &str, args: &Bound<'_, PyTuple>, use_accel: bool) -> PyResult<()> {
        let (row, e) = entry(name)?;
        let accel = if use_accel {
            Some(self.present.as_ref().ok_or_else(|| {
                PyRuntimeError::new_err(format!(
                    "toast_rs {name}: called with use_accel=True, but toast_rs was installed \
                     without accel=True (no device data to run on)"
                ))
            })?)
        } else {
            None
        };
        let start = Instant::now();
        let args = settle_args(e.toast_name, args)?;
        let mut c = Call {
            kernel: e.toast_name,
            args: &args,
            backend: &self.backends[row],
            ranges: Vec::new(),
            accel,
            staged: Cell::new((0, 0)),
            dropped: RefCell::new(Vec::new()),
        };
        let ran = (e.adapt)(&mut c);
        accel::warn_dropped(args.py(), &c.dropped.take())?;
        ran?;
        if let Some(p) = accel {
            let (h2d, d2h) = c.staged.get();
            p.count_kernel_staging(h2d, d2h);
        }
        let seconds = start.elapsed().as_secs_f64();
        let mut uses = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        uses[row].calls += 1;
        uses[row].accel_calls += u64::from(use_accel);
        uses[row].seconds += seconds;
        Ok(())
    }

    /// `{kernel: {"calls", "accel_calls", "seconds", "backend", "fallbacks"}}`.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        let uses = self.uses.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (i, e) in KERNELS.iter().enumerate() {
            let d = PyDict::new(py);
            d.set_item("calls", uses[i].calls)?;
            d.set_item("accel_calls", uses[i].accel_calls)?;
            d.set_item("seconds", uses[i].seconds)?;
            d.set_item("backend", self.backends[i].name())?;
            let fb = PyList::empty(py);
            for (b, why) in &self.fallbacks[i] {
                fb.append(format!("{b}: {why}"))?;
            }
            d.set_item("fallbacks", fb)?;
            out.set_item(e.toast_name, d)?;
        }
        Ok(out)
    }

    /// Zero the counts.
    fn reset_stats(&self) {
        let mut uses = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        uses.iter_mut().for_each(|u| *u = Use::default());
        if let Some(p) = &self.present {
            p.reset_stats();
        }
    }

    /// Whether this runtime fills TOAST's accelerator contract.
    fn accel(&self) -> bool {
        self.present.is_some()
    }

    /// The backend's transfer counts since it was loaded: allocations,
    /// frees, copies and bytes each way, resets.
    fn transfers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let b = match &self.present {
            Some(p) => Arc::clone(p.backend()),
            None => Arc::clone(&self.backends[0]),
        };
        let t = b.stats().snapshot();
        let d = PyDict::new(py);
        d.set_item("allocs", t.allocs)?;
        d.set_item("alloc_bytes", t.alloc_bytes)?;
        d.set_item("frees", t.frees)?;
        d.set_item("h2d_calls", t.h2d_calls)?;
        d.set_item("h2d_bytes", t.h2d_bytes)?;
        d.set_item("d2h_calls", t.d2h_calls)?;
        d.set_item("d2h_bytes", t.d2h_bytes)?;
        d.set_item("resets", t.resets)?;
        Ok(d)
    }

    /// `accel_data_present(data, name)`.
    fn accel_present(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<bool> {
        self.present()?
            .present(data.py(), block(data, "present", name)?, name)
    }

    /// `accel_data_create(data, name)`: a device buffer of the same size.
    fn accel_create(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        self.present()?
            .create(data, block(data, "create", name)?, name)
    }

    /// `accel_data_reset(data, name)`: zero the device copy.
    fn accel_reset(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        self.present()?
            .reset(data.py(), block(data, "reset", name)?, name)
    }

    /// `accel_data_update_device(data, name)`: host to device.
    fn accel_update_device(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        self.present()?
            .update_device(data.py(), block(data, "update_device", name)?, name)
    }

    /// `accel_data_update_host(data, name)`: device to host.
    fn accel_update_host(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        self.present()?
            .update_host(data.py(), block(data, "update_host", name)?, name)
    }

    /// `accel_data_delete(data, name)`: free the device copy.
    fn accel_delete(&self, data: &Bound<'_, PyAny>, name: &str) -> PyResult<()> {
        self.present()?
            .delete(data.py(), block(data, "delete", name)?, name)
    }

    /// The present table: `[(host address, bytes, name)]`.
    fn accel_table(&self, py: Python<'_>) -> PyResult<Vec<(usize, u64, String)>> {
        self.present()?.table(py)
    }

    /// Free every device buffer of the present table.
    fn accel_clear(&self) -> PyResult<()> {
        self.present()?.clear()
    }

    /// Whether the present table is empty.
    fn accel_empty(&self, py: Python<'_>) -> PyResult<bool> {
        self.present()?.is_empty(py)
    }

    /// Limit the device bytes this process may hold (`None`: no limit);
    /// `how` says where the limit came from, for the error.
    #[pyo3(signature = (limit, how=None))]
    fn accel_set_limit(&self, limit: Option<u64>, how: Option<String>) -> PyResult<()> {
        self.present()?
            .set_limit(limit.map(|l| (l, how.unwrap_or_else(|| "set by the caller".into()))));
        Ok(())
    }

    /// Bytes moved per TOAST staging operation and buffer name (see
    /// `accel::Present::stats`).
    fn accel_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.present()?.stats(py)
    }
}

/// TOAST registry names of the kernels toast-rs implements, in table order.
#[pyfunction]
fn kernels() -> Vec<&'static str> {
    KERNELS.iter().map(|e| e.toast_name).collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Runtime>()?;
    m.add_function(wrap_pyfunction!(kernels, m)?)?;
    // The plugins of the workspace this extension was built in
    // (`cargo build --release` puts them there).
    let build_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("release");
    m.add("BUILD_PLUGIN_DIR", build_dir)?;
    m.add(
        "ABI_VERSION",
        format!("{}.{}", abi::ABI_MAJOR, abi::ABI_MINOR),
    )?;
    Ok(())
}
