//! TOAST's accelerator contract on a toast-rs backend: the present table.
//!
//! TOAST's OpenMP-target build keeps, per process, a table from host
//! buffers to device buffers (`OmpManager`): `accel_data_create` allocates
//! the device copy of a host array, `update_device` / `update_host` copy one
//! way, `reset` zeroes the device copy, `delete` frees it, `present` asks;
//! kernels called with `use_accel=True` then look their array arguments up
//! in that table and work on the device copies. [`Present`] is that table on
//! the buffers of one toast-rs backend (its `alloc` / `copy_to_device` /
//! `copy_to_host` / `reset` / `free`).
//!
//! Entries are keyed by the host buffer's address and carry its size in
//! bytes, as `OmpManager`'s are: asking about an address that is present
//! with another size is an error (TOAST's), creating one twice is an error.
//! A kernel argument resolves to the entry at its address whose buffer is at
//! least as large (TOAST passes views of a buffer's first elements: a
//! `DetectorData`'s `data` is a prefix of its `_raw`); an argument inside a
//! present buffer at a non-zero offset cannot be addressed (the plugin ABI
//! takes whole buffers) and is refused with its offset. An empty buffer has
//! no device allocation, and is keyed by its Python object (numpy gives an
//! empty view a different dummy address each time).
//!
//! Every byte moved is counted per TOAST staging operation (create's zeroing
//! is a reset, `update_device` is host to device, `update_host` device to
//! host) and per buffer name, which is how a pipeline shows that each
//! detector field crossed at most once each way.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use toast_accel::abi;
use toast_accel::host::{AccelError, Backend};

/// A host buffer as TOAST hands it to `accel_data_*`: a contiguous block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBlock {
    pub addr: usize,
    pub nbytes: u64,
    /// numpy's writeable flag is off: `update_host` must not write it (a
    /// read-only memmap or a view of `bytes` is memory that cannot be
    /// written; an array locked with `setflags(write=False)` is one its
    /// owner does not want written).
    pub readonly: bool,
}

/// The array interface of `obj` (numpy arrays; TOAST's aligned buffers,
/// which export only the buffer protocol, through a memoryview that shares
/// their memory).
pub fn array_interface<'py>(
    obj: &Bound<'py, PyAny>,
) -> PyResult<Option<(Bound<'py, PyAny>, Bound<'py, PyDict>)>> {
    let mut obj = obj.clone();
    if !obj.hasattr("__array_interface__")? {
        let py = obj.py();
        match py.import("builtins")?.getattr("memoryview")?.call1((&obj,)) {
            Ok(mv) => obj = py.import("numpy")?.call_method1("asarray", (mv,))?,
            Err(_) => return Ok(None),
        }
    }
    Ok(obj
        .getattr("__array_interface__")
        .ok()
        .and_then(|d| d.cast_into::<PyDict>().ok())
        .map(|d| (obj, d)))
}

/// Bytes per element of an array-interface typestr (`<f8`, `|u1`, `|V32`):
/// its number, which counts bytes for every kind but `U`, whose number
/// counts UCS-4 characters of 4 bytes each (`<U10` is 40 bytes).
fn itemsize(typestr: &str) -> Option<u64> {
    let n: u64 = typestr.get(2..)?.parse().ok()?;
    match typestr.get(1..2)? {
        "U" => n.checked_mul(4),
        _ => Some(n),
    }
}

/// The host block of a C-contiguous buffer, or a `TypeError` / `ValueError`
/// naming `what` (the TOAST call and buffer name).
pub fn host_block(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<HostBlock> {
    let ty = || {
        obj.get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "?".into())
    };
    let Some((_, iface)) = array_interface(obj)? else {
        return Err(PyTypeError::new_err(format!(
            "toast_rs {what}: expected an array or buffer, got {}",
            ty()
        )));
    };
    let get = |k: &str| -> PyResult<Bound<'_, PyAny>> {
        iface.get_item(k)?.ok_or_else(|| {
            PyTypeError::new_err(format!("toast_rs {what}: no `{k}` in its array interface"))
        })
    };
    let shape: Vec<u64> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let (addr, readonly): (usize, bool) = get("data")?.extract()?;
    if let Some(s) = iface.get_item("strides")? {
        if !s.is_none() {
            return Err(PyValueError::new_err(format!(
                "toast_rs {what}: the buffer is not C-contiguous; the device copy of a \
                 host buffer is one block"
            )));
        }
    }
    let size = itemsize(&typestr).ok_or_else(|| {
        PyTypeError::new_err(format!("toast_rs {what}: unreadable typestr {typestr:?}"))
    })?;
    let nbytes = shape
        .iter()
        .try_fold(size, |a, &n| a.checked_mul(n))
        .ok_or_else(|| PyValueError::new_err(format!("toast_rs {what}: size overflows")))?;
    // An empty buffer's address means nothing (numpy gives a zero-size view
    // of a buffer a fresh dummy address each time): its entry is keyed by
    // the Python object TOAST hands over, whose address no live buffer's
    // data can start at.
    let addr = if nbytes == 0 {
        obj.as_ptr() as usize
    } else {
        addr
    };
    Ok(HostBlock {
        addr,
        nbytes,
        readonly,
    })
}

/// One present host buffer.
#[derive(Debug)]
struct Entry {
    nbytes: u64,
    /// The device buffer; `None` for an empty host buffer.
    handle: Option<u64>,
    name: String,
    /// Copies of this buffer so far: host to device, device to host.
    h2d: u64,
    d2h: u64,
}

/// Calls and bytes of one kind of transfer.
#[derive(Debug, Default, Clone, Copy)]
pub struct Moved {
    pub calls: u64,
    pub bytes: u64,
}

impl Moved {
    fn add(&mut self, bytes: u64) {
        self.calls += 1;
        self.bytes += bytes;
    }
}

/// Bytes moved, per direction, for one buffer name (TOAST names a
/// buffer by its key: `signal` for every observation's signal, `flags` for
/// both the shared and the detector flags).
#[derive(Debug, Default, Clone, Copy)]
struct Crossings {
    h2d: Moved,
    d2h: Moved,
    /// Device buffers created under this name.
    buffers: u64,
    /// The most copies one of those buffers made, each way.
    max_h2d_per_buffer: u64,
    max_d2h_per_buffer: u64,
}

/// A copy direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    H2d,
    D2h,
}

#[derive(Debug, Default)]
struct State {
    entries: BTreeMap<usize, Entry>,
    /// Device bytes held by the entries.
    used: u64,
    /// Largest `used` seen.
    peak: u64,
    /// TOAST staging operation -> calls and bytes.
    ops: BTreeMap<&'static str, Moved>,
    /// Buffer name -> bytes each way.
    by_name: BTreeMap<String, Crossings>,
    /// Arrays a kernel call stages for itself on `use_accel=True` calls
    /// (TOAST maps them per call too: `global2local`, `hit_submaps`).
    kernel_h2d: Moved,
    kernel_d2h: Moved,
}

/// The present table of one backend.
#[derive(Debug)]
pub struct Present {
    backend: Arc<Backend>,
    /// Device bytes this process may hold (`TOAST_GPU_MEM_GB`), and how the
    /// limit was set (for the error).
    limit: Mutex<Option<(u64, String)>>,
    state: Mutex<State>,
}

/// What a kernel argument resolved to.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// The device buffer of a present host buffer.
    Device(abi::Array),
    /// Not present.
    Missing,
    /// Inside the present buffer `name` but not at its start.
    Interior { offset: u64, name: String },
}

fn mem_err(e: AccelError) -> PyErr {
    PyRuntimeError::new_err(format!("toast_rs: {e}"))
}

impl Present {
    pub fn new(backend: Arc<Backend>) -> Present {
        Present {
            backend,
            limit: Mutex::new(None),
            state: Mutex::new(State::default()),
        }
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Set (or clear) the device memory this process may hold.
    pub fn set_limit(&self, limit: Option<(u64, String)>) {
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = limit;
    }

    /// Whether `b` is present; the same address with another size is
    /// TOAST's error.
    pub fn present(&self, b: HostBlock, name: &str) -> PyResult<bool> {
        let st = self.state();
        match st.entries.get(&b.addr) {
            None => Ok(false),
            Some(e) if e.nbytes == b.nbytes => Ok(true),
            Some(e) => Err(PyRuntimeError::new_err(format!(
                "toast_rs accel: host buffer {:#x} ('{name}') is present as '{}' with {} bytes, \
                 not {} (TOAST changed the buffer without deleting its device copy)",
                b.addr, e.name, e.nbytes, b.nbytes
            ))),
        }
    }

    /// `accel_data_create`: a device buffer for `b` (contents undefined
    /// until an update or reset; the plugins zero new buffers).
    pub fn create(&self, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.state();
        if let Some(e) = st.entries.get(&b.addr) {
            return Err(PyRuntimeError::new_err(format!(
                "toast_rs accel: cannot create '{name}': host buffer {:#x} is already present \
                 as '{}' with {} bytes",
                b.addr, e.name, e.nbytes
            )));
        }
        let handle = if b.nbytes == 0 {
            None
        } else {
            if let Some((limit, how)) = self
                .limit
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
            {
                if st.used + b.nbytes > *limit {
                    return Err(PyRuntimeError::new_err(format!(
                        "toast_rs accel: device memory limit exceeded: creating '{name}' \
                         ({} bytes) would bring this process's device buffers to {} bytes, \
                         over its {limit} bytes ({how}); {} buffers hold {} bytes now",
                        b.nbytes,
                        st.used + b.nbytes,
                        st.entries.len(),
                        st.used
                    )));
                }
            }
            Some(self.backend.alloc(b.nbytes, name).map_err(mem_err)?)
        };
        st.used += b.nbytes;
        st.peak = st.peak.max(st.used);
        st.ops.entry("create").or_default().add(b.nbytes);
        st.by_name.entry(name.to_string()).or_default().buffers += 1;
        st.entries.insert(
            b.addr,
            Entry {
                nbytes: b.nbytes,
                handle,
                name: name.to_string(),
                h2d: 0,
                d2h: 0,
            },
        );
        Ok(())
    }

    fn entry<'s>(st: &'s mut State, b: HostBlock, op: &str, name: &str) -> PyResult<&'s Entry> {
        match st.entries.get(&b.addr) {
            Some(e) if e.nbytes == b.nbytes => Ok(e),
            Some(e) => Err(PyRuntimeError::new_err(format!(
                "toast_rs accel: cannot {op} '{name}': host buffer {:#x} is present as '{}' \
                 with {} bytes, not {}",
                b.addr, e.name, e.nbytes, b.nbytes
            ))),
            None => Err(PyRuntimeError::new_err(format!(
                "toast_rs accel: cannot {op} '{name}': host buffer {:#x} ({} bytes) is not \
                 present on the device",
                b.addr, b.nbytes
            ))),
        }
    }

    /// Count one copy of the present buffer `b` under `name`.
    fn crossed(st: &mut State, b: HostBlock, name: &str, way: Way) {
        let Some(e) = st.entries.get_mut(&b.addr) else {
            return;
        };
        let n = match way {
            Way::H2d => {
                e.h2d += 1;
                e.h2d
            }
            Way::D2h => {
                e.d2h += 1;
                e.d2h
            }
        };
        let c = st.by_name.entry(name.to_string()).or_default();
        match way {
            Way::H2d => {
                c.h2d.add(b.nbytes);
                c.max_h2d_per_buffer = c.max_h2d_per_buffer.max(n);
            }
            Way::D2h => {
                c.d2h.add(b.nbytes);
                c.max_d2h_per_buffer = c.max_d2h_per_buffer.max(n);
            }
        }
    }

    /// `accel_data_update_device`: host to device.
    pub fn update_device(&self, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.state();
        let handle = Self::entry(&mut st, b, "update the device copy of", name)?.handle;
        if let Some(h) = handle {
            // SAFETY: `b` is the live, C-contiguous host buffer of `nbytes`
            // bytes that the caller's Python object (held, with the GIL, for
            // this call) exposes at `addr`; it is only read.
            let src = unsafe { std::slice::from_raw_parts(b.addr as *const u8, b.nbytes as usize) };
            self.backend.copy_to_device(h, 0, src).map_err(mem_err)?;
        }
        st.ops.entry("update_device").or_default().add(b.nbytes);
        Self::crossed(&mut st, b, name, Way::H2d);
        Ok(())
    }

    /// `accel_data_update_host`: device to host, into a writable host
    /// buffer only. A read-only one is refused before anything is copied:
    /// writing it would crash on a read-only mapping (`np.memmap(mode="r")`)
    /// or change an immutable object (`np.frombuffer(bytes)`) or an array
    /// its owner locked. TOAST's shared data (`MPIShared._flat`, locked
    /// views of writable memory) are unlocked for the copy by the caller
    /// (`toast_rs.accel`'s `SharedDataManager.accel_update_host`), as pshmem's
    /// own writers do.
    pub fn update_host(&self, b: HostBlock, name: &str) -> PyResult<()> {
        if b.readonly {
            return Err(PyValueError::new_err(format!(
                "toast_rs accel: cannot update the host copy of '{name}': host buffer {:#x} \
                 ({} bytes) is read-only (numpy's writeable flag is off), so the device copy \
                 cannot be written into it",
                b.addr, b.nbytes
            )));
        }
        let mut st = self.state();
        let handle = Self::entry(&mut st, b, "update the host copy of", name)?.handle;
        if let Some(h) = handle {
            // SAFETY: `b` is the live, C-contiguous host buffer of `nbytes`
            // bytes that the caller's Python object (held, with the GIL, for
            // this call) exposes at `addr`, writable by numpy's flag
            // (checked above); nothing else touches it while the GIL is held.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(b.addr as *mut u8, b.nbytes as usize) };
            self.backend.copy_to_host(h, 0, dst).map_err(mem_err)?;
        }
        st.ops.entry("update_host").or_default().add(b.nbytes);
        Self::crossed(&mut st, b, name, Way::D2h);
        Ok(())
    }

    /// `accel_data_reset`: zero the device copy.
    pub fn reset(&self, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.state();
        let handle = Self::entry(&mut st, b, "reset", name)?.handle;
        if let Some(h) = handle {
            self.backend.reset(h, 0, b.nbytes).map_err(mem_err)?;
        }
        st.ops.entry("reset").or_default().add(b.nbytes);
        Ok(())
    }

    /// `accel_data_delete`: free the device copy.
    pub fn delete(&self, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.state();
        Self::entry(&mut st, b, "delete", name)?;
        let e = st.entries.remove(&b.addr).expect("checked above");
        if let Some(h) = e.handle {
            self.backend.free(h).map_err(mem_err)?;
        }
        st.used -= e.nbytes;
        st.ops.entry("delete").or_default().add(e.nbytes);
        Ok(())
    }

    /// Free every device buffer (uninstall, a device change).
    pub fn clear(&self) -> PyResult<()> {
        let mut st = self.state();
        let entries = std::mem::take(&mut st.entries);
        st.used = 0;
        let mut first_err = None;
        for e in entries.into_values() {
            if let Some(h) = e.handle {
                if let Err(err) = self.backend.free(h) {
                    first_err.get_or_insert(err);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(mem_err(e)))
    }

    pub fn is_empty(&self) -> bool {
        self.state().entries.is_empty()
    }

    /// The device buffer of a kernel argument of `bytes` bytes at `addr`.
    pub fn resolve(&self, addr: usize, bytes: u64, len: u64) -> Resolved {
        let st = self.state();
        if let Some((&start, e)) = st.entries.range(..=addr).next_back() {
            let end = start as u64 + e.nbytes;
            if start == addr && bytes <= e.nbytes {
                return match e.handle {
                    Some(h) => Resolved::Device(abi::Array { ptr: h, len }),
                    None => Resolved::Device(abi::Array::ABSENT),
                };
            }
            if (addr as u64) < end && start != addr {
                return Resolved::Interior {
                    offset: (addr - start) as u64,
                    name: e.name.clone(),
                };
            }
        }
        Resolved::Missing
    }

    /// Count the bytes a `use_accel=True` kernel call staged for itself.
    pub fn count_kernel_staging(&self, h2d: u64, d2h: u64) {
        let mut st = self.state();
        if h2d > 0 {
            st.kernel_h2d.add(h2d);
        }
        if d2h > 0 {
            st.kernel_d2h.add(d2h);
        }
    }

    /// The table: `[(address, bytes, name)]`.
    pub fn table(&self) -> Vec<(usize, u64, String)> {
        self.state()
            .entries
            .iter()
            .map(|(&a, e)| (a, e.nbytes, e.name.clone()))
            .collect()
    }

    /// `{"ops": {op: {calls, bytes}}, "by_name": {name: {h2d_calls,
    /// h2d_bytes, d2h_calls, d2h_bytes, buffers, max_h2d_per_buffer,
    /// max_d2h_per_buffer}}, "kernel_staging": {...},
    /// "h2d_bytes", "d2h_bytes", "device_bytes", "peak_device_bytes",
    /// "buffers"}`.
    pub fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.state();
        let moved = |m: &Moved| -> PyResult<Bound<'py, PyDict>> {
            let d = PyDict::new(py);
            d.set_item("calls", m.calls)?;
            d.set_item("bytes", m.bytes)?;
            Ok(d)
        };
        let out = PyDict::new(py);
        let ops = PyDict::new(py);
        for (op, m) in &st.ops {
            ops.set_item(op, moved(m)?)?;
        }
        out.set_item("ops", ops)?;
        let names = PyDict::new(py);
        for (name, c) in &st.by_name {
            let d = PyDict::new(py);
            d.set_item("h2d_calls", c.h2d.calls)?;
            d.set_item("h2d_bytes", c.h2d.bytes)?;
            d.set_item("d2h_calls", c.d2h.calls)?;
            d.set_item("d2h_bytes", c.d2h.bytes)?;
            d.set_item("buffers", c.buffers)?;
            d.set_item("max_h2d_per_buffer", c.max_h2d_per_buffer)?;
            d.set_item("max_d2h_per_buffer", c.max_d2h_per_buffer)?;
            names.set_item(name, d)?;
        }
        out.set_item("by_name", names)?;
        let ks = PyDict::new(py);
        ks.set_item("h2d", moved(&st.kernel_h2d)?)?;
        ks.set_item("d2h", moved(&st.kernel_d2h)?)?;
        out.set_item("kernel_staging", ks)?;
        let get = |op: &str| st.ops.get(op).map_or(0, |m| m.bytes);
        out.set_item("h2d_bytes", get("update_device") + st.kernel_h2d.bytes)?;
        out.set_item("d2h_bytes", get("update_host") + st.kernel_d2h.bytes)?;
        out.set_item("device_bytes", st.used)?;
        out.set_item("peak_device_bytes", st.peak)?;
        out.set_item("buffers", st.entries.len())?;
        let limit = self.limit.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match limit {
            Some((l, how)) => {
                out.set_item("limit_bytes", l)?;
                out.set_item("limit", how)?;
            }
            None => {
                out.set_item("limit_bytes", py.None())?;
                out.set_item("limit", py.None())?;
            }
        }
        Ok(out)
    }

    /// Zero the counts (not the table).
    pub fn reset_stats(&self) {
        let mut st = self.state();
        st.ops.clear();
        st.by_name.clear();
        st.kernel_h2d = Moved::default();
        st.kernel_d2h = Moved::default();
        st.peak = st.used;
        for e in st.entries.values_mut() {
            e.h2d = 0;
            e.d2h = 0;
        }
    }
}

impl Drop for Present {
    fn drop(&mut self) {
        // Best effort: the process keeps running after an uninstall.
        let _ = self.clear();
    }
}
