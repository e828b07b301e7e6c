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
//! with another size is an error (TOAST's), creating one twice is an error,
//! and so is creating one whose bytes overlap a present buffer's (the same
//! host bytes would have two device copies, an update of one overwriting
//! the other's). A kernel argument resolves to the entry at its address
//! whose buffer is at least as large (TOAST passes views of a buffer's first
//! elements: a `DetectorData`'s `data` is a prefix of its `_raw`); an
//! argument inside a present buffer at a non-zero offset cannot be
//! addressed (the plugin ABI takes whole buffers) and is refused with its
//! offset, one larger than the buffer at its address with both sizes. An
//! empty buffer has no device allocation, and is keyed by its Python object
//! (numpy gives an empty view a different dummy address each time).
//!
//! An entry holds a weak reference to the object that owns its host memory
//! (an array's base chain ends there: a view of a present array finds the
//! entry of that array). Once that object is gone, its memory is freed and
//! the address may be another array's, or (for an empty buffer) another
//! object's: the entry is stale. Every lookup drops a stale entry it meets,
//! freeing its device buffer, with a `RuntimeWarning` naming it, and goes
//! on as if it were absent. An owner that takes no weak references
//! (`bytes`) is held instead, until `accel_data_delete`.
//!
//! The weak reference's callback counts the deaths (an atomic add: it may
//! run inside any Python code, the table's own calls included, so it takes
//! no lock), and the next call into the table after one sweeps the whole
//! table: a dead owner's device buffer is freed, and stops counting against
//! the memory limit, at the next table call, whichever buffer it names.
//!
//! Locking: the table's lock is only held while no Python code can run (no
//! warning, no Python object made or let go that could run a finalizer),
//! since Python code may call back into the table and the lock is not
//! reentrant.
//!
//! Every byte moved is counted per TOAST staging operation (create's zeroing
//! is a reset, `update_device` is host to device, `update_host` device to
//! host) and per buffer name, which is how a pipeline shows that each
//! detector field crossed at most once each way.

use pyo3::exceptions::{PyRuntimeError, PyRuntimeWarning, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyCFunction;
use pyo3::types::{PyDict, PyMemoryView, PyWeakrefMethods, PyWeakrefReference};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
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

/// Whether an array-interface `descr` (a list of `(name, type[, shape])`,
/// `type` a typestr or a nested descr) has a field of Python objects
/// (`|O`), at any depth.
fn descr_has_objects(descr: &Bound<'_, PyAny>) -> bool {
    let Ok(fields) = descr.try_iter() else {
        return false;
    };
    fields.flatten().any(|field| match field.get_item(1) {
        Ok(ty) => match ty.extract::<String>() {
            Ok(typestr) => typestr.get(1..2) == Some("O"),
            Err(_) => descr_has_objects(&ty),
        },
        Err(_) => false,
    })
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
    let Some((array, iface)) = array_interface(obj)? else {
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
    // Python objects' bytes are pointers, each owning a reference: a device
    // copy written back would put freed (or null) pointers in the array.
    // numpy says it itself (`dtype.hasobject`): its descr falls back to
    // one `|V` field for a dtype of overlapping or unordered fields.
    let hasobject = match array.getattr("dtype") {
        Ok(dtype) => dtype
            .getattr("hasobject")
            .and_then(|h| h.extract::<bool>())
            .unwrap_or(false),
        Err(_) => false,
    };
    let descr = iface.get_item("descr")?;
    if hasobject || typestr.get(1..2) == Some("O") || descr.is_some_and(|d| descr_has_objects(&d)) {
        return Err(PyTypeError::new_err(format!(
            "toast_rs {what}: the array's dtype holds Python objects (typestr {typestr:?}, or a \
             field of it): their bytes are references, which a device copy cannot hold"
        )));
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

/// Where an entry sits in the table. Ordered with every `Object` key before
/// every `Memory` key, so the `Memory` keys are one range of addresses in
/// which an entry's neighbours are its neighbours in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// An empty buffer, which has no bytes: its Python object's address.
    Object(usize),
    /// A non-empty buffer: the address of its first byte.
    Memory(usize),
}

impl Key {
    fn addr(self) -> usize {
        match self {
            Key::Object(a) | Key::Memory(a) => a,
        }
    }
}

impl HostBlock {
    fn key(&self) -> Key {
        if self.nbytes == 0 {
            Key::Object(self.addr)
        } else {
            Key::Memory(self.addr)
        }
    }
}

/// The object whose life is the life of `obj`'s memory: for a numpy array,
/// the root of its `base` chain (a view's memory is its base's), through
/// memoryviews to their exporter (`np.asarray(memoryview(x))` is `x`'s
/// memory); any other object (TOAST's `Aligned*`, an `mmap`, `bytes`) is
/// its own.
fn memory_owner<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let ndarray = obj.py().import("numpy")?.getattr("ndarray")?;
    let mut owner = obj.clone();
    loop {
        let next = if owner.is_instance(&ndarray)? {
            owner.getattr("base")?
        } else if let Ok(view) = owner.cast::<PyMemoryView>() {
            // A released memoryview has no exporter to ask; one made from
            // raw memory has none (`obj` is None): it is the owner.
            match view.getattr("obj") {
                Ok(exporter) => exporter,
                Err(_) => break,
            }
        } else {
            break;
        };
        if next.is_none() {
            break;
        }
        owner = next;
    }
    Ok(owner)
}

/// How an entry holds the object that owns its host memory.
#[derive(Debug)]
enum Owner {
    /// A weak reference. Once it is dead the memory is freed and its
    /// address free for another array: the entry is stale.
    Weak(Py<PyWeakrefReference>),
    /// An object that takes no weak references (`bytes`, under a
    /// `np.frombuffer` array): held, so its memory stays allocated until
    /// `accel_data_delete` and the entry cannot go stale.
    Held { _owner: Py<PyAny> },
}

impl Owner {
    /// The owner of `b`, the host block of `obj`: the object itself for an
    /// empty buffer (its entry is keyed by that object), else the owner of
    /// its memory.
    /// `on_death` is the weak reference's callback.
    fn of(obj: &Bound<'_, PyAny>, b: HostBlock, on_death: &Py<PyCFunction>) -> PyResult<Owner> {
        let owner = if b.nbytes == 0 {
            obj.clone()
        } else {
            memory_owner(obj)?
        };
        Ok(
            match PyWeakrefReference::new_with(&owner, on_death.bind(obj.py())) {
                Ok(weak) => Owner::Weak(weak.unbind()),
                Err(_) => Owner::Held {
                    _owner: owner.unbind(),
                },
            },
        )
    }

    /// Whether the memory is still allocated. Runs no Python code: the
    /// strong reference `upgrade` makes is to an object that others keep
    /// alive, so dropping it frees nothing.
    fn alive(&self, py: Python<'_>) -> bool {
        match self {
            Owner::Weak(weak) => weak.bind(py).upgrade().is_some(),
            Owner::Held { .. } => true,
        }
    }
}

/// One present host buffer.
#[derive(Debug)]
struct Entry {
    nbytes: u64,
    /// The device buffer; `None` for an empty host buffer.
    handle: Option<u64>,
    name: String,
    owner: Owner,
    /// Copies of this buffer so far: host to device, device to host.
    h2d: u64,
    d2h: u64,
}

impl Entry {
    /// `'name' (host 0x..., N bytes)`, for messages.
    fn describe(&self, key: Key) -> String {
        match key {
            Key::Memory(a) => format!("'{}' (host {a:#x}, {} bytes)", self.name, self.nbytes),
            Key::Object(a) => format!("'{}' (empty, host object {a:#x})", self.name),
        }
    }
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
    /// No two entries' host bytes overlap (`create` refuses it), stale
    /// entries included.
    entries: BTreeMap<Key, Entry>,
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

impl State {
    /// The entry of `b` itself (its address, or an empty buffer's object).
    fn at(&self, b: HostBlock) -> Vec<Key> {
        let key = b.key();
        self.entries
            .contains_key(&key)
            .then_some(key)
            .into_iter()
            .collect()
    }

    /// The entries that hold any of `b`'s bytes (an empty buffer's: its
    /// own, [`State::at`]), in address order: the one starting before `b`
    /// and reaching into it, then those starting inside it.
    fn overlapping(&self, b: HostBlock) -> Vec<Key> {
        let Key::Memory(start) = b.key() else {
            return self.at(b);
        };
        let end = start.saturating_add(usize::try_from(b.nbytes).unwrap_or(usize::MAX));
        let before = self
            .entries
            .range(Key::Memory(0)..Key::Memory(start))
            .next_back()
            .filter(|(k, e)| k.addr() as u64 + e.nbytes > start as u64);
        let inside = self.entries.range(Key::Memory(start)..Key::Memory(end));
        before.into_iter().chain(inside).map(|(&k, _)| k).collect()
    }

    /// The entry whose host bytes hold byte `addr`.
    fn containing(&self, addr: usize) -> Option<Key> {
        self.entries
            .range(Key::Memory(0)..=Key::Memory(addr))
            .next_back()
            .filter(|(k, e)| ((addr - k.addr()) as u64) < e.nbytes)
            .map(|(&k, _)| k)
    }

    /// Take an entry out of the table (its device buffer is the caller's
    /// to free).
    fn remove(&mut self, key: Key) -> Option<Entry> {
        let e = self.entries.remove(&key)?;
        self.used -= e.nbytes;
        Some(e)
    }
}

/// The counts of a [`State`], copied for [`Present::stats`].
#[derive(Debug)]
struct Counts {
    ops: BTreeMap<&'static str, Moved>,
    by_name: BTreeMap<String, Crossings>,
    kernel_h2d: Moved,
    kernel_d2h: Moved,
    used: u64,
    peak: u64,
    buffers: usize,
}

/// The present table of one backend.
#[derive(Debug)]
pub struct Present {
    backend: Arc<Backend>,
    /// Device bytes this process may hold (`TOAST_GPU_MEM_GB`), and how the
    /// limit was set (for the error).
    limit: Mutex<Option<(u64, String)>>,
    state: Mutex<State>,
    /// Owners that died since the last sweep of the table, counted by
    /// [`on_death`](Self::on_death).
    deaths: Arc<AtomicUsize>,
    /// The callback of every entry's weak reference: counts a death.
    on_death: OnceLock<Py<PyCFunction>>,
}

/// What a kernel argument resolved to.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// The device buffer of a present host buffer.
    Device(abi::Array),
    /// Not present.
    Missing,
    /// At the start of the present buffer `name`, which has only `nbytes`
    /// bytes: fewer than the argument.
    Smaller { name: String, nbytes: u64 },
    /// Inside the present buffer `name` but not at its start.
    Interior { offset: u64, name: String },
}

fn mem_err(e: AccelError) -> PyErr {
    PyRuntimeError::new_err(format!("toast_rs: {e}"))
}

/// Warn (`RuntimeWarning`) about each stale entry a lookup dropped. Call it
/// with the table unlocked: a warning runs Python code (filters,
/// `warnings.showwarning`) that may use the table, and raises where the
/// filter says `error`.
pub fn warn_dropped(py: Python<'_>, dropped: &[String]) -> PyResult<()> {
    let category = py.get_type::<PyRuntimeWarning>();
    for message in dropped {
        let message = CString::new(message.replace('\0', "\\0")).expect("NULs replaced");
        PyErr::warn(py, &category, &message, 1)?;
    }
    Ok(())
}

impl Present {
    pub fn new(backend: Arc<Backend>) -> Present {
        Present {
            backend,
            limit: Mutex::new(None),
            state: Mutex::new(State::default()),
            deaths: Arc::new(AtomicUsize::new(0)),
            on_death: OnceLock::new(),
        }
    }

    /// The weak references' callback (made once): it adds one to `deaths`
    /// and does nothing else, so it is safe wherever the owner dies.
    fn on_death(&self, py: Python<'_>) -> PyResult<&Py<PyCFunction>> {
        if let Some(f) = self.on_death.get() {
            return Ok(f);
        }
        let deaths = Arc::clone(&self.deaths);
        let f = PyCFunction::new_closure(py, None, None, move |_args, _kwargs| -> PyResult<()> {
            deaths.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })?;
        // Two threads may both make one; the first set is kept.
        Ok(self.on_death.get_or_init(|| f.unbind()))
    }

    pub fn backend(&self) -> &Arc<Backend> {
        &self.backend
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drop the entries among `keys` whose owner is dead, freeing their
    /// device buffers; returns a warning for each. A stale entry's owner is
    /// a dead weak reference, so dropping it runs no Python code (the lock
    /// may be held).
    fn drop_stale(&self, py: Python<'_>, st: &mut State, keys: Vec<Key>) -> Vec<String> {
        let mut dropped = Vec::new();
        for key in keys {
            if st.entries.get(&key).is_none_or(|e| e.owner.alive(py)) {
                continue;
            }
            let e = st.remove(key).expect("looked up above");
            let freed = match e.handle.map(|h| self.backend.free(h)) {
                Some(Err(err)) => format!("; freeing its device buffer failed: {err}"),
                _ => String::new(),
            };
            dropped.push(format!(
                "toast_rs accel: dropped the present buffer {}: the object that owned its host \
                 memory was freed without accel_data_delete, so its device copy is released \
                 and the address is no longer present (any array there now is another){freed}",
                e.describe(key)
            ));
        }
        dropped
    }

    /// The entries a call checks for staleness: those it `touched`, or,
    /// after an owner's death, every entry (its device buffer is freed now,
    /// not when a call meets its address).
    fn to_check(&self, st: &State, touched: Vec<Key>) -> Vec<Key> {
        if self.deaths.swap(0, Ordering::Relaxed) > 0 {
            st.entries.keys().copied().collect()
        } else {
            touched
        }
    }

    /// The table, locked, once none of the entries `touched` picks out (all
    /// of them after an owner's death) is stale: stale ones are dropped
    /// (their device buffers freed) and warned about with the lock
    /// released, then looked up again (the warning ran Python code, which
    /// may have changed the table).
    fn live_state(
        &self,
        py: Python<'_>,
        touched: impl Fn(&State) -> Vec<Key>,
    ) -> PyResult<MutexGuard<'_, State>> {
        loop {
            let mut st = self.state();
            let keys = self.to_check(&st, touched(&st));
            let dropped = self.drop_stale(py, &mut st, keys);
            if dropped.is_empty() {
                return Ok(st);
            }
            drop(st);
            warn_dropped(py, &dropped)?;
        }
    }

    /// The whole table, locked, with every stale entry dropped.
    fn live_table(&self, py: Python<'_>) -> PyResult<MutexGuard<'_, State>> {
        self.live_state(py, |st| st.entries.keys().copied().collect())
    }

    /// Set (or clear) the device memory this process may hold.
    pub fn set_limit(&self, limit: Option<(u64, String)>) {
        *self.limit.lock().unwrap_or_else(|p| p.into_inner()) = limit;
    }

    /// Whether `b` is present; the same address with another size is
    /// TOAST's error.
    pub fn present(&self, py: Python<'_>, b: HostBlock, name: &str) -> PyResult<bool> {
        let st = self.live_state(py, |st| st.at(b))?;
        match st.entries.get(&b.key()) {
            None => Ok(false),
            Some(e) if e.nbytes == b.nbytes => Ok(true),
            Some(e) => Err(PyRuntimeError::new_err(format!(
                "toast_rs accel: host buffer {:#x} ('{name}') is present as '{}' with {} bytes, \
                 not {} (TOAST changed the buffer without deleting its device copy)",
                b.addr, e.name, e.nbytes, b.nbytes
            ))),
        }
    }

    /// `accel_data_create`: a device buffer for `b`, the host block of
    /// `obj` (contents undefined until an update or reset; the plugins zero
    /// new buffers). Refused when `b` is present already, or shares bytes
    /// with a present buffer (two device copies of the same host bytes,
    /// each update of one overwriting the other's).
    pub fn create(&self, obj: &Bound<'_, PyAny>, b: HostBlock, name: &str) -> PyResult<()> {
        let py = obj.py();
        let owner = Owner::of(obj, b, self.on_death(py)?)?;
        let mut st = self.live_state(py, |st| st.overlapping(b))?;
        if let Some(&key) = st.overlapping(b).first() {
            let e = &st.entries[&key];
            return Err(PyRuntimeError::new_err(
                if key == b.key() && e.nbytes == b.nbytes {
                    format!(
                        "toast_rs accel: cannot create '{name}': host buffer {:#x} is already \
                         present as '{}' with {} bytes",
                        b.addr, e.name, e.nbytes
                    )
                } else {
                    format!(
                        "toast_rs accel: cannot create '{name}' (host {:#x}, {} bytes): its host \
                         bytes overlap the present buffer {}; the same host bytes cannot have \
                         two device copies (delete '{}' first, or use its device copy)",
                        b.addr,
                        b.nbytes,
                        e.describe(key),
                        e.name
                    )
                },
            ));
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
            b.key(),
            Entry {
                nbytes: b.nbytes,
                handle,
                name: name.to_string(),
                owner,
                h2d: 0,
                d2h: 0,
            },
        );
        Ok(())
    }

    /// The entry of `b` for `op`, or the error naming what is there.
    fn entry<'s>(st: &'s State, b: HostBlock, op: &str, name: &str) -> PyResult<&'s Entry> {
        match st.entries.get(&b.key()) {
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
        let Some(e) = st.entries.get_mut(&b.key()) else {
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
    pub fn update_device(&self, py: Python<'_>, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.live_state(py, |st| st.at(b))?;
        let handle = Self::entry(&st, b, "update the device copy of", name)?.handle;
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
    pub fn update_host(&self, py: Python<'_>, b: HostBlock, name: &str) -> PyResult<()> {
        if b.readonly {
            return Err(PyValueError::new_err(format!(
                "toast_rs accel: cannot update the host copy of '{name}': host buffer {:#x} \
                 ({} bytes) is read-only (numpy's writeable flag is off), so the device copy \
                 cannot be written into it",
                b.addr, b.nbytes
            )));
        }
        let mut st = self.live_state(py, |st| st.at(b))?;
        let handle = Self::entry(&st, b, "update the host copy of", name)?.handle;
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
    pub fn reset(&self, py: Python<'_>, b: HostBlock, name: &str) -> PyResult<()> {
        let mut st = self.live_state(py, |st| st.at(b))?;
        let handle = Self::entry(&st, b, "reset", name)?.handle;
        if let Some(h) = handle {
            self.backend.reset(h, 0, b.nbytes).map_err(mem_err)?;
        }
        st.ops.entry("reset").or_default().add(b.nbytes);
        Ok(())
    }

    /// `accel_data_delete`: free the device copy.
    pub fn delete(&self, py: Python<'_>, b: HostBlock, name: &str) -> PyResult<()> {
        let e = {
            let mut st = self.live_state(py, |st| st.at(b))?;
            Self::entry(&st, b, "delete", name)?;
            let e = st.remove(b.key()).expect("checked above");
            st.ops.entry("delete").or_default().add(e.nbytes);
            e
        };
        // The entry goes with the lock released: a held owner may be freed
        // with it, which can run Python code (a `__del__`) that uses the
        // table.
        match e.handle {
            Some(h) => self.backend.free(h).map_err(mem_err),
            None => Ok(()),
        }
    }

    /// Free every device buffer (uninstall, a device change).
    pub fn clear(&self) -> PyResult<()> {
        let entries = {
            let mut st = self.state();
            st.used = 0;
            std::mem::take(&mut st.entries)
        };
        // Freed (and their owners let go) with the lock released, as in
        // `delete`.
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

    /// Whether no buffer is present (stale entries dropped first).
    pub fn is_empty(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.live_table(py)?.entries.is_empty())
    }

    /// The device buffer of a kernel argument of `bytes` bytes at `addr`.
    /// The present buffer holding `addr`, if its owner is dead, is dropped
    /// and its warning pushed to `dropped`, for the caller to give once the
    /// kernel has run: a warning runs Python code, which must not run
    /// between the arguments' lookups and the launch (it could free a
    /// device buffer an earlier argument resolved to).
    pub fn resolve(
        &self,
        py: Python<'_>,
        addr: usize,
        bytes: u64,
        len: u64,
        dropped: &mut Vec<String>,
    ) -> Resolved {
        let mut st = self.state();
        let touched = self.to_check(&st, st.containing(addr).into_iter().collect());
        dropped.extend(self.drop_stale(py, &mut st, touched));
        let Some(key) = st.containing(addr) else {
            return Resolved::Missing;
        };
        let e = &st.entries[&key];
        let start = key.addr();
        if start != addr {
            Resolved::Interior {
                offset: (addr - start) as u64,
                name: e.name.clone(),
            }
        } else if bytes > e.nbytes {
            Resolved::Smaller {
                name: e.name.clone(),
                nbytes: e.nbytes,
            }
        } else {
            match e.handle {
                Some(h) => Resolved::Device(abi::Array { ptr: h, len }),
                None => Resolved::Device(abi::Array::ABSENT),
            }
        }
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

    /// The table: `[(address, bytes, name)]` (an empty buffer's address is
    /// its Python object's), stale entries dropped first.
    pub fn table(&self, py: Python<'_>) -> PyResult<Vec<(usize, u64, String)>> {
        Ok(self
            .live_table(py)?
            .entries
            .iter()
            .map(|(k, e)| (k.addr(), e.nbytes, e.name.clone()))
            .collect())
    }

    /// `{"ops": {op: {calls, bytes}}, "by_name": {name: {h2d_calls,
    /// h2d_bytes, d2h_calls, d2h_bytes, buffers, max_h2d_per_buffer,
    /// max_d2h_per_buffer}}, "kernel_staging": {...},
    /// "h2d_bytes", "d2h_bytes", "device_bytes", "peak_device_bytes",
    /// "buffers"}` (stale entries dropped first).
    pub fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // A copy, read into Python objects with the lock released: making
        // them can start Python's garbage collector, whose finalizers (a
        // TOAST object's `__del__`) may delete from the table.
        let st = {
            let st = self.live_table(py)?;
            Counts {
                ops: st.ops.clone(),
                by_name: st.by_name.clone(),
                kernel_h2d: st.kernel_h2d,
                kernel_d2h: st.kernel_d2h,
                used: st.used,
                peak: st.peak,
                buffers: st.entries.len(),
            }
        };
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
        out.set_item("buffers", st.buffers)?;
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
