//! Device mirrors of data fields, with one explicit state machine.
//!
//! [`DeviceBuffers`] owns every device buffer of one backend, keyed by
//! [`BufferKey`] (observation, category, field name). Its public methods are
//! the only way to change a buffer's [`BufferState`]: each checks the state,
//! then calls the [`DeviceMemory`] hook, then records the new state and the
//! transfer, in the manner of TOAST's `AcceleratorObject` (public method
//! checks, backend fills `_accel_*`). Fields are contiguous blocks, so
//! every transfer copies a whole buffer. It is a mechanism without policy:
//! which buffers exist and when they move is decided by the one owner of
//! data movement (toast-ops' `exec::movement`).
//!
//! # States and transitions
//!
//! | operation | Absent / Deleted | Allocated | InSync | DeviceNewer | HostNewer |
//! |---|---|---|---|---|---|
//! | `create` | → Allocated | AlreadyCreated | AlreadyCreated | AlreadyCreated | AlreadyCreated |
//! | `update_device` | NotCreated | → InSync | → InSync | refused: would discard device results | → InSync |
//! | `update_host` | NotCreated | refused: never written | → InSync | → InSync | refused: would discard host changes |
//! | `reset` | NotCreated | → DeviceNewer | → DeviceNewer | → DeviceNewer | refused: would discard host changes |
//! | `mark_device_modified` | NotCreated | → DeviceNewer | → DeviceNewer | DeviceNewer | refused: both sides changed |
//! | `mark_host_modified` | NotCreated | → HostNewer | → HostNewer | refused: both sides changed | HostNewer |
//! | `mark_in_sync` | NotCreated | refused: never written | InSync | → InSync (the host computed an equal copy) | refused: would hide host changes |
//! | `delete` | NotCreated / DeletedTwice | → Deleted | → Deleted | → Deleted | → Deleted |
//!
//! `Allocated` means "allocated, contents undefined". A failed copy leaves
//! a device buffer whose contents are undefined, so a failed `update_device`
//! or `reset` moves it to `Allocated`; a failed `update_host` leaves the
//! state as it was (the device copy is still good). Buffers of zero bytes
//! are tracked but never touch the device (their handle is 0, which kernels
//! read as an absent array).

use crate::device::{DeviceError, DeviceMemory};
use crate::error::{Category, DataError};
use crate::observation::Observation;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;
use thiserror::Error;

/// Identifies one device buffer: a field of an observation, or a global item.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferKey {
    /// Observation name (empty for [`Category::Global`]).
    pub observation: String,
    /// Category of the field.
    pub category: Category,
    /// Field name.
    pub field: String,
}

impl BufferKey {
    /// The key of a field of an observation.
    pub fn new(
        observation: impl Into<String>,
        category: Category,
        field: impl Into<String>,
    ) -> Self {
        BufferKey {
            observation: observation.into(),
            category,
            field: field.into(),
        }
    }

    /// The key of a data-level (global) item.
    pub fn global(field: impl Into<String>) -> Self {
        Self::new("", Category::Global, field)
    }

    /// The name transfers are counted under: `category.field`, the same for
    /// every observation.
    pub fn stat_name(&self) -> String {
        format!("{}.{}", self.category, self.field)
    }
}

impl fmt::Display for BufferKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.category == Category::Global {
            write!(f, "'global/{}'", self.field)
        } else {
            write!(f, "'{}/{}/{}'", self.observation, self.category, self.field)
        }
    }
}

/// Where the valid copy of a buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferState {
    /// Never created.
    Absent,
    /// Allocated on the device; contents undefined.
    Allocated,
    /// Device and host hold the same data.
    InSync,
    /// The device copy is newer (a kernel wrote it, or it was reset).
    DeviceNewer,
    /// The host copy is newer (host code wrote it after a sync).
    HostNewer,
    /// Freed (kept to tell a double delete from a never-created buffer).
    Deleted,
}

impl BufferState {
    /// Whether a device allocation exists.
    pub fn is_present(self) -> bool {
        !matches!(self, BufferState::Absent | BufferState::Deleted)
    }
}

impl fmt::Display for BufferState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BufferState::Absent => "absent",
            BufferState::Allocated => "allocated (contents undefined)",
            BufferState::InSync => "in sync",
            BufferState::DeviceNewer => "device newer",
            BufferState::HostNewer => "host newer",
            BufferState::Deleted => "deleted",
        })
    }
}

/// Misuse of the buffer lifecycle, or a backend failure, naming the buffer.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AccelStateError {
    /// An operation on a buffer that does not exist on the device.
    #[error(
        "cannot {op} device buffer {buffer}: {}",
        if *deleted { "it was deleted" } else { "it was never created" }
    )]
    NotCreated {
        /// The buffer.
        buffer: BufferKey,
        /// The operation.
        op: &'static str,
        /// Whether it existed once and was deleted.
        deleted: bool,
    },
    /// `create` of a buffer that exists.
    #[error("cannot create device buffer {buffer}: it already exists ({bytes} bytes, {state})")]
    AlreadyCreated {
        /// The buffer.
        buffer: BufferKey,
        /// Its size.
        bytes: u64,
        /// Its state.
        state: BufferState,
    },
    /// `delete` of a buffer already deleted.
    #[error("cannot delete device buffer {buffer}: it was already deleted")]
    DeletedTwice {
        /// The buffer.
        buffer: BufferKey,
    },
    /// A transfer whose host side has another size than the device buffer.
    #[error(
        "cannot {op} device buffer {buffer}: the device buffer has {device_bytes} bytes, the \
         host data {host_bytes}"
    )]
    SizeMismatch {
        /// The buffer.
        buffer: BufferKey,
        /// The operation.
        op: &'static str,
        /// Device size.
        device_bytes: u64,
        /// Host size.
        host_bytes: u64,
    },
    /// A transition the state machine refuses because it would lose data.
    #[error("cannot {op} device buffer {buffer} in state '{state}': {reason}")]
    InvalidTransition {
        /// The buffer.
        buffer: BufferKey,
        /// The operation.
        op: &'static str,
        /// Its state.
        state: BufferState,
        /// Why.
        reason: &'static str,
    },
    /// The backend failed.
    #[error("{op} of device buffer {buffer} ({bytes} bytes) failed: {source}")]
    Device {
        /// The buffer.
        buffer: BufferKey,
        /// The operation.
        op: &'static str,
        /// Size involved.
        bytes: u64,
        /// The backend's error (boxed to keep the error small).
        #[source]
        source: Box<DeviceError>,
    },
}

/// An error of the field-level helpers: either the data model or the buffer.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DeviceFieldError {
    /// Buffer lifecycle or device failure.
    #[error(transparent)]
    State(#[from] AccelStateError),
    /// The field could not be read from the observation.
    #[error(transparent)]
    Data(#[from] DataError),
}

/// Handle and size of a device buffer, for kernel arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceView {
    /// Backend handle (0 for a zero-byte buffer).
    pub handle: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// Transfers and allocations of one buffer name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransferCounts {
    /// Host→device copies.
    pub h2d_calls: u64,
    /// Host→device bytes.
    pub h2d_bytes: u64,
    /// Host→device seconds.
    pub h2d_seconds: f64,
    /// Device→host copies.
    pub d2h_calls: u64,
    /// Device→host bytes.
    pub d2h_bytes: u64,
    /// Device→host seconds.
    pub d2h_seconds: f64,
    /// Resets (zero fills on the device).
    pub resets: u64,
    /// Allocations.
    pub allocs: u64,
    /// Bytes allocated.
    pub alloc_bytes: u64,
    /// Frees.
    pub frees: u64,
}

impl TransferCounts {
    fn add(&mut self, o: &TransferCounts) {
        self.h2d_calls += o.h2d_calls;
        self.h2d_bytes += o.h2d_bytes;
        self.h2d_seconds += o.h2d_seconds;
        self.d2h_calls += o.d2h_calls;
        self.d2h_bytes += o.d2h_bytes;
        self.d2h_seconds += o.d2h_seconds;
        self.resets += o.resets;
        self.allocs += o.allocs;
        self.alloc_bytes += o.alloc_bytes;
        self.frees += o.frees;
    }
}

/// Transfer accounting of a [`DeviceBuffers`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransferReport {
    /// Counts per buffer name ([`BufferKey::stat_name`]).
    pub per_buffer: BTreeMap<String, TransferCounts>,
    /// Bytes allocated now.
    pub current_bytes: u64,
    /// Most bytes allocated at once.
    pub peak_bytes: u64,
    /// What made up the peak: the live buffers' bytes per name
    /// ([`BufferKey::stat_name`], summed over the observations) when
    /// `peak_bytes` was reached.
    pub peak_buffers: BTreeMap<String, u64>,
}

impl TransferReport {
    /// Sum over all buffer names.
    pub fn totals(&self) -> TransferCounts {
        let mut t = TransferCounts::default();
        for c in self.per_buffer.values() {
            t.add(c);
        }
        t
    }
}

impl fmt::Display for TransferReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<32} {:>8} {:>14} {:>10} {:>8} {:>14} {:>10} {:>7} {:>7}",
            "buffer", "h2d", "h2d bytes", "h2d s", "d2h", "d2h bytes", "d2h s", "resets", "allocs"
        )?;
        let total = self.totals();
        for (name, c) in self
            .per_buffer
            .iter()
            .chain(std::iter::once((&"total".to_string(), &total)))
        {
            writeln!(
                f,
                "{:<32} {:>8} {:>14} {:>10.6} {:>8} {:>14} {:>10.6} {:>7} {:>7}",
                name,
                c.h2d_calls,
                c.h2d_bytes,
                c.h2d_seconds,
                c.d2h_calls,
                c.d2h_bytes,
                c.d2h_seconds,
                c.resets,
                c.allocs
            )?;
        }
        write!(
            f,
            "device memory: {} bytes now, {} bytes peak",
            self.current_bytes, self.peak_bytes
        )?;
        let mut at_peak: Vec<_> = self.peak_buffers.iter().collect();
        at_peak.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (name, bytes) in at_peak {
            write!(f, "\n  at peak: {name:<32} {bytes:>14}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    handle: u64,
    bytes: u64,
    state: BufferState,
}

/// All device buffers of one backend, with the state machine and the
/// transfer accounting (see the module documentation).
pub struct DeviceBuffers {
    device: Arc<dyn DeviceMemory>,
    entries: HashMap<BufferKey, Entry>,
    report: TransferReport,
    /// The live bytes per buffer name (kept up to date by `create` and
    /// `delete`, so a new peak's composition is a copy of it).
    live_by_name: BTreeMap<String, u64>,
}

impl fmt::Debug for DeviceBuffers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffers")
            .field("backend", &self.device.backend_name())
            .field("entries", &self.entries)
            .field("report", &self.report)
            .finish()
    }
}

impl DeviceBuffers {
    /// Buffers on `device`.
    pub fn new(device: Arc<dyn DeviceMemory>) -> Self {
        DeviceBuffers {
            device,
            entries: HashMap::new(),
            report: TransferReport::default(),
            live_by_name: BTreeMap::new(),
        }
    }

    /// The backend's name.
    pub fn backend_name(&self) -> &str {
        self.device.backend_name()
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn DeviceMemory> {
        &self.device
    }

    /// State of a buffer ([`BufferState::Absent`] if unknown).
    pub fn state(&self, key: &BufferKey) -> BufferState {
        self.entries
            .get(key)
            .map_or(BufferState::Absent, |e| e.state)
    }

    /// Whether a device allocation exists for `key`.
    pub fn is_present(&self, key: &BufferKey) -> bool {
        self.state(key).is_present()
    }

    /// Keys of the allocated buffers, sorted.
    pub fn present_keys(&self) -> Vec<BufferKey> {
        let mut v: Vec<BufferKey> = self
            .entries
            .iter()
            .filter(|(_, e)| e.state.is_present())
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// The transfer accounting.
    pub fn report(&self) -> &TransferReport {
        &self.report
    }

    fn counts(&mut self, key: &BufferKey) -> &mut TransferCounts {
        self.report.per_buffer.entry(key.stat_name()).or_default()
    }

    fn not_created(key: &BufferKey, op: &'static str, state: BufferState) -> AccelStateError {
        AccelStateError::NotCreated {
            buffer: key.clone(),
            op,
            deleted: state == BufferState::Deleted,
        }
    }

    /// The live entry of `key`, or NotCreated.
    fn live(&self, key: &BufferKey, op: &'static str) -> Result<Entry, AccelStateError> {
        let state = self.state(key);
        if !state.is_present() {
            return Err(Self::not_created(key, op, state));
        }
        Ok(self.entries[key])
    }

    fn set_state(&mut self, key: &BufferKey, state: BufferState) {
        if let Some(e) = self.entries.get_mut(key) {
            e.state = state;
        }
    }

    fn refuse(
        key: &BufferKey,
        op: &'static str,
        state: BufferState,
        reason: &'static str,
    ) -> AccelStateError {
        AccelStateError::InvalidTransition {
            buffer: key.clone(),
            op,
            state,
            reason,
        }
    }

    fn device_error(
        key: &BufferKey,
        op: &'static str,
        bytes: u64,
        source: DeviceError,
    ) -> AccelStateError {
        AccelStateError::Device {
            buffer: key.clone(),
            op,
            bytes,
            source: Box::new(source),
        }
    }

    /// Allocate `bytes` bytes for `key` (contents undefined). Returns the handle.
    pub fn create(&mut self, key: &BufferKey, bytes: u64) -> Result<DeviceView, AccelStateError> {
        if let Some(e) = self.entries.get(key) {
            if e.state.is_present() {
                return Err(AccelStateError::AlreadyCreated {
                    buffer: key.clone(),
                    bytes: e.bytes,
                    state: e.state,
                });
            }
        }
        let handle = if bytes == 0 {
            0
        } else {
            self.device
                .alloc(bytes, &key.to_string())
                .map_err(|s| Self::device_error(key, "create", bytes, s))?
        };
        self.entries.insert(
            key.clone(),
            Entry {
                handle,
                bytes,
                state: BufferState::Allocated,
            },
        );
        let c = self.counts(key);
        c.allocs += 1;
        c.alloc_bytes += bytes;
        self.report.current_bytes += bytes;
        *self.live_by_name.entry(key.stat_name()).or_insert(0) += bytes;
        if self.report.current_bytes > self.report.peak_bytes {
            self.report.peak_bytes = self.report.current_bytes;
            self.report.peak_buffers = self
                .live_by_name
                .iter()
                .filter(|(_, &b)| b > 0)
                .map(|(n, &b)| (n.clone(), b))
                .collect();
        }
        Ok(DeviceView { handle, bytes })
    }

    /// Handle and size of a live buffer, for kernel arguments.
    pub fn handle(&self, key: &BufferKey) -> Result<DeviceView, AccelStateError> {
        let e = self.live(key, "get the handle of")?;
        Ok(DeviceView {
            handle: e.handle,
            bytes: e.bytes,
        })
    }

    /// Copy the whole host block `src` to the device buffer.
    pub fn update_device(&mut self, key: &BufferKey, src: &[u8]) -> Result<(), AccelStateError> {
        const OP: &str = "update_device";
        let e = self.live(key, OP)?;
        if e.state == BufferState::DeviceNewer {
            return Err(Self::refuse(
                key,
                OP,
                e.state,
                "the device copy is newer and would be overwritten (copy it to the host first)",
            ));
        }
        if src.len() as u64 != e.bytes {
            return Err(AccelStateError::SizeMismatch {
                buffer: key.clone(),
                op: OP,
                device_bytes: e.bytes,
                host_bytes: src.len() as u64,
            });
        }
        let t0 = Instant::now();
        if e.bytes > 0 {
            if let Err(s) = self.device.copy_to_device(e.handle, 0, src) {
                self.set_state(key, BufferState::Allocated);
                return Err(Self::device_error(key, OP, e.bytes, s));
            }
        }
        let dt = t0.elapsed().as_secs_f64();
        self.set_state(key, BufferState::InSync);
        let c = self.counts(key);
        c.h2d_calls += 1;
        c.h2d_bytes += e.bytes;
        c.h2d_seconds += dt;
        Ok(())
    }

    /// Copy the whole device buffer into the host block `dst`.
    pub fn update_host(&mut self, key: &BufferKey, dst: &mut [u8]) -> Result<(), AccelStateError> {
        const OP: &str = "update_host";
        let e = self.live(key, OP)?;
        match e.state {
            BufferState::Allocated => {
                return Err(Self::refuse(
                    key,
                    OP,
                    e.state,
                    "the device copy was never written (no upload, reset or kernel output)",
                ))
            }
            BufferState::HostNewer => {
                return Err(Self::refuse(
                    key,
                    OP,
                    e.state,
                    "the host copy is newer and would be overwritten",
                ))
            }
            _ => {}
        }
        if dst.len() as u64 != e.bytes {
            return Err(AccelStateError::SizeMismatch {
                buffer: key.clone(),
                op: OP,
                device_bytes: e.bytes,
                host_bytes: dst.len() as u64,
            });
        }
        let t0 = Instant::now();
        if e.bytes > 0 {
            self.device
                .copy_to_host(e.handle, 0, dst)
                .map_err(|s| Self::device_error(key, OP, e.bytes, s))?;
        }
        let dt = t0.elapsed().as_secs_f64();
        self.set_state(key, BufferState::InSync);
        let c = self.counts(key);
        c.d2h_calls += 1;
        c.d2h_bytes += e.bytes;
        c.d2h_seconds += dt;
        Ok(())
    }

    /// Zero the device buffer; the device copy becomes the newer one.
    pub fn reset(&mut self, key: &BufferKey) -> Result<(), AccelStateError> {
        const OP: &str = "reset";
        let e = self.live(key, OP)?;
        if e.state == BufferState::HostNewer {
            return Err(Self::refuse(
                key,
                OP,
                e.state,
                "the host copy is newer and resetting the device would make zeros authoritative",
            ));
        }
        if e.bytes > 0 {
            if let Err(s) = self.device.reset(e.handle, 0, e.bytes) {
                self.set_state(key, BufferState::Allocated);
                return Err(Self::device_error(key, OP, e.bytes, s));
            }
        }
        self.set_state(key, BufferState::DeviceNewer);
        self.counts(key).resets += 1;
        Ok(())
    }

    /// Record that the host computed its own copy of a buffer the device
    /// wrote, from the same inputs with the same operators (a pointing
    /// field expanded on both sides instead of copied): both copies are
    /// valid, so neither a host step nor the end of a scope copies it back.
    /// Only a device-newer or in-sync buffer can be marked; a host-newer
    /// one would hide a host change from the device.
    pub fn mark_in_sync(&mut self, key: &BufferKey) -> Result<(), AccelStateError> {
        const OP: &str = "mark in sync";
        let e = self.live(key, OP)?;
        match e.state {
            BufferState::DeviceNewer | BufferState::InSync => {}
            s => {
                return Err(Self::refuse(
                    key,
                    OP,
                    s,
                    "only a copy the device wrote can be declared equal to the host's",
                ))
            }
        }
        self.set_state(key, BufferState::InSync);
        Ok(())
    }

    /// Record that a kernel wrote the device buffer.
    pub fn mark_device_modified(&mut self, key: &BufferKey) -> Result<(), AccelStateError> {
        const OP: &str = "mark device-modified";
        let e = self.live(key, OP)?;
        if e.state == BufferState::HostNewer {
            return Err(Self::refuse(
                key,
                OP,
                e.state,
                "the host copy was modified too; one of the two changes would be lost",
            ));
        }
        self.set_state(key, BufferState::DeviceNewer);
        Ok(())
    }

    /// Record that host code wrote the host block after a sync.
    pub fn mark_host_modified(&mut self, key: &BufferKey) -> Result<(), AccelStateError> {
        const OP: &str = "mark host-modified";
        let e = self.live(key, OP)?;
        if e.state == BufferState::DeviceNewer {
            return Err(Self::refuse(
                key,
                OP,
                e.state,
                "the device copy was modified too; one of the two changes would be lost",
            ));
        }
        self.set_state(key, BufferState::HostNewer);
        Ok(())
    }

    /// Free the device buffer.
    pub fn delete(&mut self, key: &BufferKey) -> Result<(), AccelStateError> {
        const OP: &str = "delete";
        let e = match self.entries.get(key) {
            None => return Err(Self::not_created(key, OP, BufferState::Absent)),
            Some(e) if e.state == BufferState::Deleted => {
                return Err(AccelStateError::DeletedTwice {
                    buffer: key.clone(),
                })
            }
            Some(e) => *e,
        };
        if e.bytes > 0 {
            self.device
                .free(e.handle)
                .map_err(|s| Self::device_error(key, OP, e.bytes, s))?;
        }
        self.entries.insert(
            key.clone(),
            Entry {
                handle: 0,
                bytes: 0,
                state: BufferState::Deleted,
            },
        );
        self.report.current_bytes -= e.bytes;
        if let Some(live) = self.live_by_name.get_mut(&key.stat_name()) {
            *live -= e.bytes;
        }
        self.counts(key).frees += 1;
        Ok(())
    }

    /// Free every live buffer; on failures, keep going and return the first error.
    pub fn delete_all(&mut self) -> Result<(), AccelStateError> {
        let mut first = None;
        for key in self.present_keys() {
            if let Err(e) = self.delete(&key) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Make the device copy valid: create if absent, upload unless it is
    /// already in sync or newer. Returns whether a copy was made.
    pub fn ensure_device(&mut self, key: &BufferKey, src: &[u8]) -> Result<bool, AccelStateError> {
        match self.state(key) {
            BufferState::InSync | BufferState::DeviceNewer => Ok(false),
            s => {
                if !s.is_present() {
                    self.create(key, src.len() as u64)?;
                }
                self.update_device(key, src)?;
                Ok(true)
            }
        }
    }

    /// Make the host copy valid: download if the device copy is newer.
    /// Returns whether a copy was made.
    pub fn ensure_host(
        &mut self,
        key: &BufferKey,
        dst: &mut [u8],
    ) -> Result<bool, AccelStateError> {
        if self.state(key) == BufferState::DeviceNewer {
            self.update_host(key, dst)?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Create the mirror of a field of `obs`, sized to its host block.
    pub fn create_field(
        &mut self,
        obs: &Observation,
        category: Category,
        name: &str,
    ) -> Result<DeviceView, DeviceFieldError> {
        let bytes = obs.field_bytes(category, name)?.len() as u64;
        Ok(self.create(&BufferKey::new(obs.name(), category, name), bytes)?)
    }

    /// Upload a field of `obs`.
    pub fn update_device_field(
        &mut self,
        obs: &Observation,
        category: Category,
        name: &str,
    ) -> Result<(), DeviceFieldError> {
        let src = obs.field_bytes(category, name)?;
        Ok(self.update_device(&BufferKey::new(obs.name(), category, name), src)?)
    }

    /// Download a field of `obs`.
    pub fn update_host_field(
        &mut self,
        obs: &mut Observation,
        category: Category,
        name: &str,
    ) -> Result<(), DeviceFieldError> {
        let key = BufferKey::new(obs.name(), category, name);
        let dst = obs.field_bytes_mut(category, name)?;
        Ok(self.update_host(&key, dst)?)
    }

    /// [`DeviceBuffers::ensure_device`] for a field of `obs`.
    pub fn ensure_device_field(
        &mut self,
        obs: &Observation,
        category: Category,
        name: &str,
    ) -> Result<bool, DeviceFieldError> {
        let src = obs.field_bytes(category, name)?;
        Ok(self.ensure_device(&BufferKey::new(obs.name(), category, name), src)?)
    }

    /// [`DeviceBuffers::ensure_host`] for a field of `obs`.
    pub fn ensure_host_field(
        &mut self,
        obs: &mut Observation,
        category: Category,
        name: &str,
    ) -> Result<bool, DeviceFieldError> {
        let key = BufferKey::new(obs.name(), category, name);
        if self.state(&key) != BufferState::DeviceNewer {
            return Ok(false);
        }
        let dst = obs.field_bytes_mut(category, name)?;
        Ok(self.ensure_host(&key, dst)?)
    }
}

#[cfg(test)]
pub(crate) mod mock {
    //! A recording, failure-injecting [`DeviceMemory`] for tests.

    use super::*;
    use std::sync::Mutex;

    /// One recorded call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        Alloc { bytes: u64, name: String },
        Free { handle: u64 },
        ToDevice { handle: u64, bytes: u64 },
        ToHost { handle: u64, bytes: u64 },
        Reset { handle: u64, bytes: u64 },
    }

    #[derive(Debug, Default)]
    struct Inner {
        next: u64,
        buffers: HashMap<u64, Vec<u8>>,
        calls: Vec<Call>,
        fail_next: Option<&'static str>,
    }

    /// Device memory in host `Vec`s, with a capacity and injectable failures.
    #[derive(Debug)]
    pub struct MockDevice {
        capacity: u64,
        inner: Mutex<Inner>,
    }

    impl MockDevice {
        pub fn new(capacity: u64) -> Self {
            MockDevice {
                capacity,
                inner: Mutex::new(Inner {
                    next: 0x1000,
                    ..Inner::default()
                }),
            }
        }
        pub fn calls(&self) -> Vec<Call> {
            self.inner.lock().unwrap().calls.clone()
        }
        /// Make the next call of `op` fail.
        pub fn fail_next(&self, op: &'static str) {
            self.inner.lock().unwrap().fail_next = Some(op);
        }
        pub fn used(&self) -> u64 {
            let g = self.inner.lock().unwrap();
            g.buffers.values().map(|b| b.len() as u64).sum()
        }
        pub fn live_buffers(&self) -> usize {
            self.inner.lock().unwrap().buffers.len()
        }
        /// What a kernel would do: write into device memory.
        pub fn poke(&self, handle: u64, offset: usize, bytes: &[u8]) {
            let mut g = self.inner.lock().unwrap();
            g.buffers.get_mut(&handle).unwrap()[offset..offset + bytes.len()]
                .copy_from_slice(bytes);
        }
        pub fn peek(&self, handle: u64) -> Vec<u8> {
            self.inner.lock().unwrap().buffers[&handle].clone()
        }
        fn err(op: &'static str, message: String) -> DeviceError {
            DeviceError {
                backend: "mock".into(),
                op,
                message,
            }
        }
        fn check_fail(g: &mut Inner, op: &'static str) -> Result<(), DeviceError> {
            if g.fail_next == Some(op) {
                g.fail_next = None;
                return Err(Self::err(op, "injected failure".into()));
            }
            Ok(())
        }
    }

    impl DeviceMemory for MockDevice {
        fn backend_name(&self) -> &str {
            "mock"
        }
        fn alloc(&self, bytes: u64, name: &str) -> Result<u64, DeviceError> {
            let mut g = self.inner.lock().unwrap();
            g.calls.push(Call::Alloc {
                bytes,
                name: name.to_string(),
            });
            Self::check_fail(&mut g, "alloc")?;
            let used: u64 = g.buffers.values().map(|b| b.len() as u64).sum();
            if used + bytes > self.capacity {
                return Err(Self::err(
                    "alloc",
                    format!(
                        "out of memory allocating {bytes} bytes for {name} ({used} of {} bytes in use)",
                        self.capacity
                    ),
                ));
            }
            g.next += 0x100;
            let h = g.next;
            // Garbage, so reads of never-written memory are visible.
            g.buffers.insert(h, vec![0xAB; bytes as usize]);
            Ok(h)
        }
        fn free(&self, handle: u64) -> Result<(), DeviceError> {
            let mut g = self.inner.lock().unwrap();
            g.calls.push(Call::Free { handle });
            Self::check_fail(&mut g, "free")?;
            g.buffers
                .remove(&handle)
                .map(|_| ())
                .ok_or_else(|| Self::err("free", format!("unknown handle {handle:#x}")))
        }
        fn copy_to_device(&self, handle: u64, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
            let mut g = self.inner.lock().unwrap();
            g.calls.push(Call::ToDevice {
                handle,
                bytes: src.len() as u64,
            });
            Self::check_fail(&mut g, "copy_to_device")?;
            let b = g.buffers.get_mut(&handle).ok_or_else(|| {
                Self::err("copy_to_device", format!("unknown handle {handle:#x}"))
            })?;
            let o = offset as usize;
            b[o..o + src.len()].copy_from_slice(src);
            Ok(())
        }
        fn copy_to_host(
            &self,
            handle: u64,
            offset: u64,
            dst: &mut [u8],
        ) -> Result<(), DeviceError> {
            let mut g = self.inner.lock().unwrap();
            g.calls.push(Call::ToHost {
                handle,
                bytes: dst.len() as u64,
            });
            Self::check_fail(&mut g, "copy_to_host")?;
            let b = g
                .buffers
                .get(&handle)
                .ok_or_else(|| Self::err("copy_to_host", format!("unknown handle {handle:#x}")))?;
            let o = offset as usize;
            dst.copy_from_slice(&b[o..o + dst.len()]);
            Ok(())
        }
        fn reset(&self, handle: u64, offset: u64, bytes: u64) -> Result<(), DeviceError> {
            let mut g = self.inner.lock().unwrap();
            g.calls.push(Call::Reset { handle, bytes });
            Self::check_fail(&mut g, "reset")?;
            let b = g
                .buffers
                .get_mut(&handle)
                .ok_or_else(|| Self::err("reset", format!("unknown handle {handle:#x}")))?;
            b[offset as usize..(offset + bytes) as usize].fill(0);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mock::{Call, MockDevice};
    use super::*;
    use crate::dtype::DType;
    use crate::observation::tests::observation;

    fn setup(capacity: u64) -> (Arc<MockDevice>, DeviceBuffers) {
        let dev = Arc::new(MockDevice::new(capacity));
        let bufs = DeviceBuffers::new(dev.clone());
        (dev, bufs)
    }

    fn key(f: &str) -> BufferKey {
        BufferKey::new("obs0", Category::DetData, f)
    }

    #[test]
    fn mark_in_sync_only_from_a_device_written_copy() {
        let (_dev, mut b) = setup(1 << 20);
        let k = key("pixels");
        let mut host = vec![0u8; 16];
        b.create(&k, 16).unwrap();
        // Allocated (never written): refused.
        assert!(b.mark_in_sync(&k).is_err());
        b.reset(&k).unwrap();
        b.mark_device_modified(&k).unwrap();
        b.mark_in_sync(&k).unwrap();
        assert_eq!(b.state(&k), BufferState::InSync);
        // Nothing is copied back for a host step any more.
        b.update_host(&k, &mut host).unwrap();
        assert_eq!(b.report().per_buffer["detdata.pixels"].d2h_calls, 1);
        b.mark_host_modified(&k).unwrap();
        // Host-newer: declaring it equal would hide the host's change.
        let e = b.mark_in_sync(&k).unwrap_err().to_string();
        assert!(e.contains("mark in sync"), "{e}");
        assert_eq!(b.state(&k), BufferState::HostNewer);
        assert!(b.mark_in_sync(&key("absent")).is_err());
    }

    #[test]
    fn full_lifecycle_round_trip() {
        let (dev, mut b) = setup(1 << 20);
        let k = key("signal");
        let host: Vec<u8> = (0..64).collect();
        assert_eq!(b.state(&k), BufferState::Absent);
        let v = b.create(&k, 64).unwrap();
        assert_eq!(v.bytes, 64);
        assert_eq!(b.state(&k), BufferState::Allocated);
        assert_eq!(b.handle(&k).unwrap(), v);
        b.update_device(&k, &host).unwrap();
        assert_eq!(b.state(&k), BufferState::InSync);
        assert_eq!(dev.peek(v.handle), host);
        // A kernel writes the device copy.
        dev.poke(v.handle, 0, &[99, 98]);
        b.mark_device_modified(&k).unwrap();
        assert_eq!(b.state(&k), BufferState::DeviceNewer);
        let mut back = host.clone();
        b.update_host(&k, &mut back).unwrap();
        assert_eq!(&back[..3], &[99, 98, 2]);
        assert_eq!(b.state(&k), BufferState::InSync);
        b.reset(&k).unwrap();
        assert_eq!(b.state(&k), BufferState::DeviceNewer);
        assert!(dev.peek(v.handle).iter().all(|&x| x == 0));
        b.delete(&k).unwrap();
        assert_eq!(b.state(&k), BufferState::Deleted);
        assert_eq!(dev.live_buffers(), 0);
        assert_eq!(
            dev.calls(),
            vec![
                Call::Alloc {
                    bytes: 64,
                    name: "'obs0/detdata/signal'".into()
                },
                Call::ToDevice {
                    handle: v.handle,
                    bytes: 64
                },
                Call::ToHost {
                    handle: v.handle,
                    bytes: 64
                },
                Call::Reset {
                    handle: v.handle,
                    bytes: 64
                },
                Call::Free { handle: v.handle },
            ]
        );
        // Re-creating after delete is allowed.
        b.create(&k, 8).unwrap();
        assert_eq!(b.state(&k), BufferState::Allocated);
    }

    #[test]
    fn update_of_a_buffer_never_created() {
        let (dev, mut b) = setup(1024);
        let k = key("signal");
        let e = b.update_device(&k, &[0; 8]).unwrap_err();
        assert_eq!(
            e,
            AccelStateError::NotCreated {
                buffer: k.clone(),
                op: "update_device",
                deleted: false
            }
        );
        assert_eq!(
            e.to_string(),
            "cannot update_device device buffer 'obs0/detdata/signal': it was never created"
        );
        assert!(matches!(
            b.update_host(&k, &mut [0; 8]),
            Err(AccelStateError::NotCreated {
                op: "update_host",
                ..
            })
        ));
        assert!(matches!(
            b.handle(&k),
            Err(AccelStateError::NotCreated { .. })
        ));
        assert!(matches!(
            b.mark_device_modified(&k),
            Err(AccelStateError::NotCreated { .. })
        ));
        assert!(matches!(
            b.mark_host_modified(&k),
            Err(AccelStateError::NotCreated { .. })
        ));
        assert!(
            dev.calls().is_empty(),
            "no backend call on a refused operation"
        );
    }

    #[test]
    fn reset_before_create() {
        let (dev, mut b) = setup(1024);
        let e = b.reset(&key("pixels")).unwrap_err();
        assert!(matches!(
            e,
            AccelStateError::NotCreated {
                op: "reset",
                deleted: false,
                ..
            }
        ));
        assert!(dev.calls().is_empty());
    }

    #[test]
    fn delete_twice_and_delete_never_created() {
        let (dev, mut b) = setup(1024);
        let k = key("quats");
        let e = b.delete(&k).unwrap_err();
        assert!(matches!(
            e,
            AccelStateError::NotCreated { op: "delete", .. }
        ));
        b.create(&k, 32).unwrap();
        b.delete(&k).unwrap();
        let e = b.delete(&k).unwrap_err();
        assert_eq!(e, AccelStateError::DeletedTwice { buffer: k.clone() });
        assert_eq!(
            e.to_string(),
            "cannot delete device buffer 'obs0/detdata/quats': it was already deleted"
        );
        // Use after delete names the deletion.
        let e = b.update_device(&k, &[0; 32]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot update_device device buffer 'obs0/detdata/quats': it was deleted"
        );
        assert!(matches!(
            b.reset(&k),
            Err(AccelStateError::NotCreated { deleted: true, .. })
        ));
        let frees = dev
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::Free { .. }))
            .count();
        assert_eq!(frees, 1, "the backend frees once");
    }

    #[test]
    fn create_twice() {
        let (_dev, mut b) = setup(1024);
        let k = key("weights");
        b.create(&k, 24).unwrap();
        let e = b.create(&k, 24).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot create device buffer 'obs0/detdata/weights': it already exists (24 bytes, \
             allocated (contents undefined))"
        );
    }

    #[test]
    fn size_mismatch_both_directions() {
        let (dev, mut b) = setup(1024);
        let k = key("signal");
        b.create(&k, 16).unwrap();
        let e = b.update_device(&k, &[0; 8]).unwrap_err();
        assert_eq!(
            e,
            AccelStateError::SizeMismatch {
                buffer: k.clone(),
                op: "update_device",
                device_bytes: 16,
                host_bytes: 8
            }
        );
        assert_eq!(b.state(&k), BufferState::Allocated, "state unchanged");
        b.update_device(&k, &[1; 16]).unwrap();
        let e = b.update_host(&k, &mut [0; 32]).unwrap_err();
        assert!(matches!(
            e,
            AccelStateError::SizeMismatch {
                op: "update_host",
                device_bytes: 16,
                host_bytes: 32,
                ..
            }
        ));
        assert!(e.to_string().contains("16 bytes, the host data 32"));
        let copies = dev
            .calls()
            .iter()
            .filter(|c| matches!(c, Call::ToDevice { .. } | Call::ToHost { .. }))
            .count();
        assert_eq!(copies, 1);
    }

    #[test]
    fn out_of_memory_names_buffer_and_size() {
        let (dev, mut b) = setup(100);
        b.create(&key("a"), 60).unwrap();
        let k = key("signal");
        let e = b.create(&k, 80).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("create of device buffer 'obs0/detdata/signal' (80 bytes) failed:"),
            "{msg}"
        );
        assert!(msg.contains("out of memory allocating 80 bytes for 'obs0/detdata/signal'"));
        assert!(matches!(
            e,
            AccelStateError::Device {
                op: "create",
                bytes: 80,
                ..
            }
        ));
        assert_eq!(b.state(&k), BufferState::Absent, "nothing recorded");
        assert_eq!(b.report().current_bytes, 60);
        assert_eq!(dev.used(), 60);
    }

    #[test]
    fn injected_copy_failures_leave_consistent_states() {
        let (dev, mut b) = setup(1024);
        let k = key("signal");
        b.create(&k, 8).unwrap();
        b.update_device(&k, &[1; 8]).unwrap();
        dev.fail_next("copy_to_device");
        let e = b.update_device(&k, &[2; 8]).unwrap_err();
        assert!(matches!(
            e,
            AccelStateError::Device {
                op: "update_device",
                ..
            }
        ));
        assert_eq!(
            b.state(&k),
            BufferState::Allocated,
            "a failed upload leaves undefined contents"
        );
        b.update_device(&k, &[2; 8]).unwrap();
        b.mark_device_modified(&k).unwrap();
        dev.fail_next("copy_to_host");
        assert!(b.update_host(&k, &mut [0; 8]).is_err());
        assert_eq!(
            b.state(&k),
            BufferState::DeviceNewer,
            "device copy still good"
        );
        dev.fail_next("reset");
        assert!(b.reset(&k).is_err());
        assert_eq!(b.state(&k), BufferState::Allocated);
        dev.fail_next("free");
        assert!(matches!(
            b.delete(&k),
            Err(AccelStateError::Device { op: "delete", .. })
        ));
        assert!(b.is_present(&k));
        b.delete(&k).unwrap();
        assert_eq!(b.report().current_bytes, 0);
    }

    #[test]
    fn refused_transitions_protect_data() {
        let (_dev, mut b) = setup(1024);
        let k = key("signal");
        b.create(&k, 8).unwrap();
        // Never written: nothing to download.
        let e = b.update_host(&k, &mut [0; 8]).unwrap_err();
        assert!(matches!(
            e,
            AccelStateError::InvalidTransition {
                state: BufferState::Allocated,
                ..
            }
        ));
        b.update_device(&k, &[0; 8]).unwrap();
        b.mark_device_modified(&k).unwrap();
        // Device newer: an upload would discard kernel output.
        let e = b.update_device(&k, &[0; 8]).unwrap_err();
        assert!(e.to_string().contains("the device copy is newer"), "{e}");
        assert!(b.mark_host_modified(&k).is_err());
        b.update_host(&k, &mut [0; 8]).unwrap();
        b.mark_host_modified(&k).unwrap();
        // Host newer: a download or reset would discard host changes.
        assert!(b.update_host(&k, &mut [0; 8]).is_err());
        assert!(b.reset(&k).is_err());
        assert!(b.mark_device_modified(&k).is_err());
        b.update_device(&k, &[3; 8]).unwrap();
        assert_eq!(b.state(&k), BufferState::InSync);
    }

    #[test]
    fn ensure_helpers_skip_redundant_copies() {
        let (dev, mut b) = setup(1024);
        let k = key("signal");
        assert!(b.ensure_device(&k, &[1; 8]).unwrap());
        assert!(!b.ensure_device(&k, &[1; 8]).unwrap());
        assert!(!b.ensure_host(&k, &mut [0; 8]).unwrap());
        b.mark_device_modified(&k).unwrap();
        assert!(
            !b.ensure_device(&k, &[1; 8]).unwrap(),
            "device newer: keep it"
        );
        assert!(b.ensure_host(&k, &mut [0; 8]).unwrap());
        b.mark_host_modified(&k).unwrap();
        assert!(b.ensure_device(&k, &[1; 8]).unwrap());
        let n = dev.calls().len();
        assert_eq!(n, 4, "alloc, upload, download, upload: {:?}", dev.calls());
    }

    #[test]
    fn zero_byte_buffers_never_touch_the_device() {
        let (dev, mut b) = setup(1024);
        let k = BufferKey::new("obs0", Category::Intervals, "empty");
        let v = b.create(&k, 0).unwrap();
        assert_eq!(v.handle, 0);
        b.update_device(&k, &[]).unwrap();
        b.reset(&k).unwrap();
        b.update_host(&k, &mut []).unwrap();
        b.delete(&k).unwrap();
        assert!(dev.calls().is_empty());
    }

    #[test]
    fn transfer_report_counts_per_name() {
        let (_dev, mut b) = setup(1 << 20);
        for obs in ["o1", "o2"] {
            let k = BufferKey::new(obs, Category::DetData, "signal");
            b.create(&k, 100).unwrap();
            b.update_device(&k, &[0; 100]).unwrap();
            b.mark_device_modified(&k).unwrap();
            b.update_host(&k, &mut [0; 100]).unwrap();
        }
        let g = BufferKey::global("zmap");
        b.create(&g, 40).unwrap();
        b.reset(&g).unwrap();
        let r = b.report();
        let s = &r.per_buffer["detdata.signal"];
        assert_eq!(
            (s.h2d_calls, s.h2d_bytes, s.d2h_calls, s.d2h_bytes),
            (2, 200, 2, 200)
        );
        assert_eq!((s.allocs, s.alloc_bytes), (2, 200));
        assert_eq!(r.per_buffer["global.zmap"].resets, 1);
        assert_eq!(r.current_bytes, 240);
        assert_eq!(r.peak_bytes, 240);
        let at_peak = BTreeMap::from([
            ("detdata.signal".to_string(), 200),
            ("global.zmap".to_string(), 40),
        ]);
        assert_eq!(r.peak_buffers, at_peak);
        b.delete_all().unwrap();
        assert!(b.present_keys().is_empty());
        // A smaller set of buffers later leaves the peak's composition; a
        // new peak lists only the live buffers (not the freed ones).
        let k = BufferKey::global("small");
        b.create(&k, 8).unwrap();
        b.delete(&k).unwrap();
        let r = b.report();
        assert_eq!(r.current_bytes, 0);
        assert_eq!(r.peak_bytes, 240);
        assert_eq!(r.peak_buffers, at_peak);
        assert_eq!(r.totals().frees, 4);
        let text = r.to_string();
        assert!(text.contains("detdata.signal"));
        assert!(text.contains("total"));
        assert!(text.contains("240 bytes peak"));
        assert!(text.contains("at peak: detdata.signal"), "{text}");
        let big = BufferKey::global("big");
        b.create(&big, 300).unwrap();
        let r = b.report();
        assert_eq!(r.peak_bytes, 300);
        assert_eq!(
            r.peak_buffers,
            BTreeMap::from([("global.big".to_string(), 300)])
        );
        assert_eq!(g.to_string(), "'global/zmap'");
    }

    #[test]
    fn field_helpers_move_observation_blocks() {
        let (dev, mut b) = setup(1 << 20);
        let mut ob = observation("obs0", 2, 4);
        ob.detdata.create("signal", DType::F64, &[], None).unwrap();
        ob.detdata
            .get_mut("signal")
            .unwrap()
            .row_mut::<f64>(1)
            .unwrap()[3] = 7.0;
        let v = b.create_field(&ob, Category::DetData, "signal").unwrap();
        assert_eq!(v.bytes, 2 * 4 * 8);
        b.update_device_field(&ob, Category::DetData, "signal")
            .unwrap();
        // Kernel doubles det 1, sample 3 (element 7).
        dev.poke(v.handle, 7 * 8, &14.0f64.to_ne_bytes());
        b.mark_device_modified(&key("signal")).unwrap();
        b.update_host_field(&mut ob, Category::DetData, "signal")
            .unwrap();
        assert_eq!(
            ob.detdata.get("signal").unwrap().row::<f64>(1).unwrap()[3],
            14.0
        );
        // Shared and intervals mirror too; intervals are upload-only.
        assert!(b
            .ensure_device_field(&ob, Category::Shared, "times")
            .unwrap());
        ob.intervals_from_samples("scan", &[(0, 2)]).unwrap();
        assert!(b
            .ensure_device_field(&ob, Category::Intervals, "scan")
            .unwrap());
        assert!(!b
            .ensure_host_field(&mut ob, Category::Shared, "times")
            .unwrap());
        // Missing fields and metadata are data errors.
        let e = b.create_field(&ob, Category::DetData, "nope").unwrap_err();
        assert!(matches!(
            e,
            DeviceFieldError::Data(DataError::MissingField { .. })
        ));
        ob.meta.set("m", 1i64);
        assert!(matches!(
            b.create_field(&ob, Category::Meta, "m"),
            Err(DeviceFieldError::Data(DataError::NotContiguous { .. }))
        ));
        // A host field that changed size no longer matches its mirror.
        ob.detdata.remove("signal").unwrap();
        ob.detdata.create("signal", DType::F32, &[], None).unwrap();
        let e = b.update_host_field(&mut ob, Category::DetData, "signal");
        assert!(matches!(
            e,
            Err(DeviceFieldError::State(
                AccelStateError::SizeMismatch { .. }
            ))
        ));
    }
}
