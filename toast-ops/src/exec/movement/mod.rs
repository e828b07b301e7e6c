//! Data movement: the one owner of what crosses the bus, when, and the
//! record of it.
//!
//! Everything a run moves between host and device is decided and counted
//! here, by one [`ExecContext`] extension, [`DataMovement`]. It holds
//!
//! * the open **device scope**, if any: the [`DeviceBuffers`] of the
//!   pipeline backend (the coherence state machine of every device copy,
//!   toast-core) and the [`Stager`] (the staging plan: where the newest copy
//!   of each item lives, simulated from the operators' requirements,
//!   toast-core);
//! * the **ledger** of the run ([`TransferLedger`]): the per-buffer report
//!   of every closed scope, and the unstaged copies kernel calls made.
//!
//! The parts below are mechanisms without policy: toast-core's planner and
//! state machine, toast-accel's per-call temporary copies
//! ([`toast_accel::host::ArrayArg`], for callers with no scope: `verify`,
//! tests) and its per-backend byte counters ([`bus::BusBytes`], read for
//! the phases of a run). Only this module changes a buffer's state; the
//! pipeline ([`super::pipeline`]) asks it to stage each step, the kernel
//! layer ([`super::kernels`]) asks it where each array argument lives and
//! tells it what a call wrote, and operators that need to know whether a
//! scope is open ask [`scope_open`] / [`residence`].
//!
//! # Staging scopes
//!
//! Whether data moves at all depends on the **pipeline backend**
//! ([`super::pipeline::pipeline_backend`]). A host-addressable backend (the
//! CPU plugin) reads host memory directly, so nothing is staged. For any
//! other backend [`open_scope`] opens a *device scope*, and [`close_scope`]
//! closes it: the outputs that are newest on the device are copied back and
//! every device buffer is freed. A pipeline run inside an open scope (a
//! nested pipeline, or a step of the map-maker, which opens one scope for
//! its whole solve) joins it instead of opening its own, so data stays on
//! the device across pipelines: the satellite workflow opens one for the
//! sky scan and the map-maker together, so the timestream made on the
//! device is solved there. A step done with some of the scope's data frees
//! its device copies without copying them back ([`forget`]): the scan its
//! input map and pointing, the map-maker its work fields.
//!
//! Around each step the plan of [`Stager::stage`] is applied to the real
//! buffers ([`stage_step`], [`finish_step`]): create and upload what an
//! accelerated operator requires and is not yet (validly) on the device,
//! create and zero its new outputs, copy back what a host operator reads or
//! writes, then mark what the step wrote. Observation fields become one
//! buffer per observation, of the host field's size: a *transient* field
//! (one detector batch's rows, [`crate::ops::pointing_field`]) remade with
//! another size gets a new buffer of that size (`resize_replaced`), so the
//! device holds one batch's pointing as the host does; global items (maps, the pixel distribution's
//! `global2local`, template amplitudes) one buffer each (see
//! [`super::global_data`]); metadata and interval lists have no device form
//! (intervals are host arguments of every kernel) and are skipped. The
//! actual state of each buffer is checked before acting, so it stays
//! correct when a kernel override sent a call to another backend.
//!
//! A scope may *stream* its detector data ([`stream_detector_data`], a
//! map-maker plan's choice): each device step's detdata buffers then hold
//! only the rows of its pass's detectors, moved as the passes move
//! ([`window`]), so no device buffer ever holds a whole timestream.
//!
//! A first upload of an all-zero host block (a fresh timestream, unset
//! flags) is a device memset instead of a copy; the buffer is then in sync.
//!
//! # Kernel calls
//!
//! A kernel call on the scope's backend reads the staged copies
//! (`DataMovement::device_array`); one elsewhere (the CPU, or a backend a
//! kernel override chose) first gets the newest copy of each argument on
//! its side (`DataMovement::sync_for_call`); outputs are then marked
//! newest where the kernel wrote them (`DataMovement::after_call`). Copies
//! made because data was not staged are counted per buffer in the ledger's
//! [`UnstagedTransfers`] and logged at debug level: a well-staged pipeline
//! makes none.
//!
//! # Pointing on both sides
//!
//! Pointing is cheap to recompute and expensive to move. A host step that
//! needs the pointing a device scope expanded gets its own copy
//! ([`super::pipeline::mirror_on_host`], which sets the scope aside with
//! [`set_scope_aside`] while the host runs the pointing operators), and
//! [`mark_host_copies`] then declares the host and device copies equal, so
//! neither a host step nor the end of the scope copies them back.

pub mod bus;
pub mod window;

use crate::exec::global_data::{global_bytes, global_bytes_mut};
use std::collections::BTreeMap;
use std::sync::Arc;
use toast_accel::abi::Kernel;
use toast_accel::host::Backend;
use toast_core::staging::{Residence, StepSpec, StepStaging};
use toast_core::{
    BufferKey, BufferState, Category, Data, DeviceBuffers, DeviceView, ExecContext, Item, OpError,
    Requirements, Stager, TransferReport,
};
use window::RowWindow;

/// The owner of data movement (an [`ExecContext`] extension, created on
/// first use): the open device scope and the run's transfer ledger.
#[derive(Debug, Default)]
pub struct DataMovement {
    scope: Option<DeviceScope>,
    ledger: TransferLedger,
}

/// An open device scope: the device copies and the staging planner's state.
#[derive(Debug)]
pub struct DeviceScope {
    buffers: DeviceBuffers,
    stager: Stager,
    steps: usize,
    /// Whether the detdata buffers hold one pass's rows ([`window`]).
    streamed: bool,
    /// The rows each windowed detdata buffer holds (absent: every row).
    windows: BTreeMap<BufferKey, RowWindow>,
}

impl DeviceScope {
    /// The planner.
    pub fn stager(&self) -> &Stager {
        &self.stager
    }
    /// Steps staged so far.
    pub fn steps(&self) -> usize {
        self.steps
    }
    /// The device copies.
    pub fn buffers(&self) -> &DeviceBuffers {
        &self.buffers
    }
}

/// Transfers of one buffer name made because the data was not staged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnstagedCounts {
    /// Host→device copies.
    pub uploads: u64,
    /// Host→device bytes.
    pub upload_bytes: u64,
    /// Device→host copies.
    pub downloads: u64,
    /// Device→host bytes.
    pub download_bytes: u64,
}

/// Unstaged transfers per buffer name (`detdata.signal`, `global.zmap`, ...).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnstagedTransfers {
    /// Per buffer name.
    pub per_buffer: BTreeMap<String, UnstagedCounts>,
}

impl UnstagedTransfers {
    /// Total number of copies in both directions.
    pub fn total_calls(&self) -> u64 {
        self.per_buffer
            .values()
            .map(|c| c.uploads + c.downloads)
            .sum()
    }
}

/// What moved in a run, per buffer: the report of every closed device scope
/// and the unstaged copies of kernel calls.
#[derive(Debug, Clone, Default)]
pub struct TransferLedger {
    /// One report per closed scope, in order.
    pub scopes: Vec<TransferReport>,
    /// Copies kernel calls made of data that was not staged.
    pub unstaged: UnstagedTransfers,
}

impl TransferLedger {
    /// Host→device and device→host staged copies of buffer name `name`
    /// (`detdata.signal`, `global.map`, ...) summed over the closed scopes.
    pub fn copies(&self, name: &str) -> (u64, u64) {
        self.scopes
            .iter()
            .filter_map(|r| r.per_buffer.get(name))
            .fold((0, 0), |(h, d), c| (h + c.h2d_calls, d + c.d2h_calls))
    }

    /// Staged totals over all buffers and closed scopes: (h2d calls, d2h
    /// calls, allocs, frees).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.scopes
            .iter()
            .map(|r| r.totals())
            .fold((0, 0, 0, 0), |a, t| {
                (
                    a.0 + t.h2d_calls,
                    a.1 + t.d2h_calls,
                    a.2 + t.allocs,
                    a.3 + t.frees,
                )
            })
    }

    /// The most bytes the staged buffers of one closed scope held at once.
    pub fn peak_staged_bytes(&self) -> u64 {
        self.scopes.iter().map(|r| r.peak_bytes).max().unwrap_or(0)
    }

    /// What made up [`TransferLedger::peak_staged_bytes`]: the live
    /// buffers' bytes per name at that scope's peak.
    pub fn peak_staged_buffers(&self) -> BTreeMap<String, u64> {
        self.scopes
            .iter()
            .max_by_key(|r| r.peak_bytes)
            .map(|r| r.peak_buffers.clone())
            .unwrap_or_default()
    }

    fn count_unstaged(&mut self, name: &str, up: bool, bytes: u64, kernel: Kernel) {
        tracing::debug!(
            "kernel {kernel}: unstaged {} of {name} ({bytes} bytes)",
            if up { "upload" } else { "download" }
        );
        let c = self
            .unstaged
            .per_buffer
            .entry(name.to_string())
            .or_default();
        if up {
            c.uploads += 1;
            c.upload_bytes += bytes;
        } else {
            c.downloads += 1;
            c.download_bytes += bytes;
        }
    }
}

/// Which way a kernel argument must be copied before a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSync {
    /// The copy the call reads is current.
    None,
    /// The call runs on the scope's device, whose copy is stale: upload.
    Upload,
    /// The call runs elsewhere and the device copy is newer: download.
    Download,
}

/// The movement owner of `ctx`, if anything was ever staged or counted.
pub fn of(ctx: &ExecContext) -> Option<&DataMovement> {
    ctx.extensions.get::<DataMovement>()
}

/// The movement owner of `ctx`, created if missing.
fn of_mut(ctx: &mut ExecContext) -> &mut DataMovement {
    if ctx.extensions.get::<DataMovement>().is_none() {
        ctx.insert(DataMovement::default());
    }
    ctx.extensions
        .get_mut::<DataMovement>()
        .expect("inserted just above")
}

/// The run's ledger, if anything was staged or counted.
pub fn ledger(ctx: &ExecContext) -> Option<&TransferLedger> {
    of(ctx).map(|m| &m.ledger)
}

/// Whether a device scope is open.
pub fn scope_open(ctx: &ExecContext) -> bool {
    of(ctx).is_some_and(|m| m.scope.is_some())
}

/// Where the newest copy of `item` lives in the open scope's plan (`None`:
/// no scope, or the item was never staged).
pub fn residence(ctx: &ExecContext, item: &Item) -> Option<Residence> {
    of(ctx)
        .and_then(|m| m.scope.as_ref())
        .and_then(|s| s.stager.residence(item))
}

/// The result of [`open_scope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// Whether this call opened the scope (and must close it).
    pub owner: bool,
    /// Whether steps run on staged device data.
    pub accel: bool,
}

fn same_device(buffers: &DeviceBuffers, backend: &Arc<Backend>) -> bool {
    Arc::as_ptr(buffers.device()) as *const u8 == Arc::as_ptr(backend) as *const u8
}

/// Open (or join) a device scope on `backend`. A host-addressable backend,
/// or none, needs no scope.
pub fn open_scope(ctx: &mut ExecContext, backend: Option<&Arc<Backend>>) -> Scope {
    let Some(backend) = backend.filter(|b| !b.host_addressable()) else {
        return Scope {
            owner: false,
            accel: false,
        };
    };
    let m = of_mut(ctx);
    if let Some(s) = &m.scope {
        return Scope {
            owner: false,
            accel: same_device(&s.buffers, backend),
        };
    }
    let device: Arc<dyn toast_core::DeviceMemory> = Arc::clone(backend) as _;
    m.scope = Some(DeviceScope {
        buffers: DeviceBuffers::new(device),
        stager: Stager::new(),
        steps: 0,
        streamed: false,
        windows: BTreeMap::new(),
    });
    tracing::debug!("opened a device scope on backend {}", backend.name());
    Scope {
        owner: true,
        accel: true,
    }
}

/// Close a scope this caller opened: copy back the `outputs` that are newest
/// on the device, free every device buffer, and add the scope's report to
/// the ledger (returned as well).
pub fn close_scope(
    data: &mut Data,
    ctx: &mut ExecContext,
    scope: Scope,
    outputs: &Requirements,
) -> Result<Option<TransferReport>, OpError> {
    if !scope.owner {
        return Ok(None);
    }
    let m = of_mut(ctx);
    let Some(mut s) = m.scope.take() else {
        return Ok(None);
    };
    let fin = s.stager.finish(outputs);
    let mut first_err: Option<OpError> = None;
    for it in &fin.update_host {
        if let Err(e) = download(data, &mut s.buffers, &s.windows, it) {
            first_err.get_or_insert(e);
        }
    }
    // Everything, including scratch buffers the planner does not know.
    if let Err(e) = s.buffers.delete_all() {
        first_err.get_or_insert(e.into());
    }
    tracing::debug!("closed a device scope:\n{}", s.buffers.report());
    let report = s.buffers.report().clone();
    m.ledger.scopes.push(report.clone());
    match first_err {
        Some(e) => Err(e),
        None => Ok(Some(report)),
    }
}

/// Free the device copies of `items` in the open scope, if any, without
/// copying them back, and forget them: for data whose owner is done with
/// it while a caller's scope lives on (the sky scan's pointing and input
/// map, once the scan is over, in a scope that carries its timestream on
/// to the map-maker). Call it while the host still holds the items (their
/// buffers are found from the host's fields). Returns the bytes freed.
pub fn forget(data: &Data, ctx: &mut ExecContext, items: &Requirements) -> Result<u64, OpError> {
    let Some(s) = scope_mut(ctx) else {
        return Ok(0);
    };
    let before = s.buffers.report().current_bytes;
    for it in items.items() {
        if s.stager.forget(&it).is_none() {
            continue;
        }
        for key in keys(data, &it) {
            if s.buffers.is_present(&key) {
                s.buffers.delete(&key)?;
            }
            s.windows.remove(&key);
        }
    }
    let freed = before - s.buffers.report().current_bytes;
    if freed > 0 {
        tracing::debug!("freed {freed} bytes of device copies no step reads again");
    }
    Ok(freed)
}

/// The device key of operator scratch memory named `name` (what a kernel
/// argument `Source::Scratch` of that name lives in on a staging backend).
pub fn scratch_key(name: &str) -> BufferKey {
    BufferKey::global(format!("scratch/{name}"))
}

/// OR the open scope's device copy of the operator scratch `name` (if a
/// kernel made one) into `host`, then free it, so the next call starts
/// from zeros: how an operator reads back what its kernels accumulated on
/// the device (the hit submaps of `pixels_healpix`, a byte a submap).
/// Returns whether there was a device copy. A planned copy (the bus
/// counters see it), not an unstaged one.
pub fn take_scratch(ctx: &mut ExecContext, name: &str, host: &mut [u8]) -> Result<bool, OpError> {
    let Some(s) = scope_mut(ctx) else {
        return Ok(false);
    };
    let key = scratch_key(name);
    if !s.buffers.is_present(&key) {
        return Ok(false);
    }
    let mut device = vec![0u8; host.len()];
    s.buffers.update_host(&key, &mut device)?;
    for (h, d) in host.iter_mut().zip(&device) {
        *h |= d;
    }
    s.buffers.delete(&key)?;
    Ok(true)
}

/// The open device scope of `ctx`, if any.
fn scope_mut(ctx: &mut ExecContext) -> Option<&mut DeviceScope> {
    ctx.extensions
        .get_mut::<DataMovement>()
        .and_then(|m| m.scope.as_mut())
}

/// Take the open scope out of `ctx` (so that what runs next stages
/// nothing); give it back with [`restore_scope`].
pub fn set_scope_aside(ctx: &mut ExecContext) -> Option<DeviceScope> {
    ctx.extensions
        .get_mut::<DataMovement>()
        .and_then(|m| m.scope.take())
}

/// Put back a scope [`set_scope_aside`] took.
pub fn restore_scope(ctx: &mut ExecContext, scope: Option<DeviceScope>) {
    if let Some(s) = scope {
        of_mut(ctx).scope = Some(s);
    }
}

/// Hand `items` to the host alone: in the open scope (if any), copy back
/// their device-newer copies, then free their device buffers ([`forget`]).
/// For data the device is done with but the host reads on (a map-maker's
/// hits and inverted covariance once its solve is over). Returns the bytes
/// freed.
pub fn release(
    data: &mut Data,
    ctx: &mut ExecContext,
    items: &Requirements,
) -> Result<u64, OpError> {
    let none = Requirements::new();
    with_host_step(data, ctx, "release", items.clone(), none, |_, _| Ok(()))?;
    forget(data, ctx, items)
}

/// The buffer keys of an item: one per observation holding the field, or the
/// global key when the global item has a device form; none for metadata and
/// interval lists.
fn keys(data: &Data, it: &Item) -> Vec<BufferKey> {
    match it.category {
        Category::DetData | Category::Shared => data
            .obs
            .iter()
            .filter(|ob| ob.has(it.category, &it.name))
            .map(|ob| BufferKey::new(ob.name(), it.category, it.name.clone()))
            .collect(),
        Category::Global if global_bytes(&data.meta, &it.name).is_some() => {
            vec![BufferKey::global(it.name.clone())]
        }
        _ => Vec::new(),
    }
}

/// The host bytes the device buffer of `key` mirrors: the whole field or
/// item, or a windowed field's window ([`window`]).
fn host_bytes<'a>(data: &'a Data, windows: &Windows, key: &BufferKey) -> Result<&'a [u8], OpError> {
    let all = match key.category {
        Category::Global => {
            global_bytes(&data.meta, &key.field).ok_or_else(|| OpError::Global {
                key: key.field.clone(),
                problem: "has no device form".into(),
            })?
        }
        c => data.get(&key.observation)?.field_bytes(c, &key.field)?,
    };
    let range = window::host_range(windows.get(key), all.len(), key)?;
    Ok(&all[range])
}

fn host_bytes_mut<'a>(
    data: &'a mut Data,
    windows: &Windows,
    key: &BufferKey,
) -> Result<&'a mut [u8], OpError> {
    let all = match key.category {
        Category::Global => {
            global_bytes_mut(&mut data.meta, &key.field).ok_or_else(|| OpError::Global {
                key: key.field.clone(),
                problem: "cannot be copied back from a device".into(),
            })?
        }
        c => data
            .get_mut(&key.observation)?
            .field_bytes_mut(c, &key.field)?,
    };
    let range = window::host_range(windows.get(key), all.len(), key)?;
    Ok(&mut all[range])
}

/// The windows of a scope's detdata buffers.
type Windows = BTreeMap<BufferKey, RowWindow>;

fn download(
    data: &mut Data,
    bufs: &mut DeviceBuffers,
    windows: &Windows,
    it: &Item,
) -> Result<(), OpError> {
    for key in keys(data, it) {
        if bufs.state(&key) == BufferState::DeviceNewer {
            let dst = host_bytes_mut(data, windows, &key)?;
            bufs.update_host(&key, dst)?;
        }
    }
    Ok(())
}

/// Whether every byte of `b` is zero (a block at a time, so the test
/// vectorises; it stops at the first block that is not).
fn all_zero(b: &[u8]) -> bool {
    b.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, &x| acc | x) == 0)
}

/// Apply the "before" part of a step's plan to the real buffers.
fn apply_before(
    data: &mut Data,
    bufs: &mut DeviceBuffers,
    windows: &Windows,
    plan: &StepStaging,
) -> Result<(), OpError> {
    for it in &plan.create {
        for key in keys(data, it) {
            if !bufs.is_present(&key) {
                let n = host_bytes(data, windows, &key)?.len() as u64;
                bufs.create(&key, n)?;
            }
        }
    }
    for it in &plan.update_device {
        for key in keys(data, it) {
            match bufs.state(&key) {
                // A first upload of zeros (a fresh field: the timestream
                // before the scan, unset flags) is a device memset.
                BufferState::Allocated if all_zero(host_bytes(data, windows, &key)?) => {
                    bufs.reset(&key)?;
                    bufs.mark_in_sync(&key)?;
                }
                BufferState::Allocated | BufferState::HostNewer => {
                    let src = host_bytes(data, windows, &key)?;
                    bufs.update_device(&key, src)?;
                }
                _ => {}
            }
        }
    }
    for it in &plan.reset {
        for key in keys(data, it) {
            if bufs.state(&key) == BufferState::Allocated {
                bufs.reset(&key)?;
            }
        }
    }
    for it in &plan.update_host {
        tracing::debug!(
            "step {} ({}): copying {:?} {} back (a host step reads it)",
            plan.step,
            plan.name,
            it.category,
            it.name
        );
        download(data, bufs, windows, it)?;
    }
    Ok(())
}

/// Apply the "after" part of a step's plan.
fn apply_after(data: &Data, bufs: &mut DeviceBuffers, plan: &StepStaging) -> Result<(), OpError> {
    for it in &plan.mark_device_modified {
        for key in keys(data, it) {
            // HostNewer: the kernel ran elsewhere and wrote the host copy.
            if bufs.is_present(&key) && bufs.state(&key) != BufferState::HostNewer {
                bufs.mark_device_modified(&key)?;
            }
        }
    }
    for it in &plan.mark_host_modified {
        for key in keys(data, it) {
            if bufs.is_present(&key) {
                bufs.mark_host_modified(&key)?;
            }
        }
    }
    Ok(())
}

/// Stage one step in the open scope (if any): returns its plan, for
/// [`finish_step`].
pub fn stage_step(
    data: &mut Data,
    ctx: &mut ExecContext,
    spec: &StepSpec,
) -> Result<Option<StepStaging>, OpError> {
    let detectors = ctx.detectors.clone();
    let Some(s) = scope_mut(ctx) else {
        return Ok(None);
    };
    let plan = s.stager.stage(s.steps, spec);
    s.steps += 1;
    // Streamed, a device step's buffers hold its pass's rows; after a
    // streamed part of the scope (a streamed map-maker in a caller's scope
    // that is not), whole fields again.
    if spec.accel && (s.streamed || !s.windows.is_empty()) {
        let rows = if s.streamed {
            detectors.as_deref()
        } else {
            None
        };
        move_windows(data, s, spec, rows, &plan)?;
    }
    resize_replaced(data, &mut s.buffers, &s.windows, spec)?;
    apply_before(data, &mut s.buffers, &s.windows, &plan)?;
    Ok(Some(plan))
}

/// Give every observation field a step reads or writes a device buffer of
/// its host size: a *transient* field (one detector batch's rows, replaced
/// by the next batch's; see [`crate::ops::pointing_field`]) may have been
/// remade with fewer rows (the last batch) or more (a whole field after
/// batches, or the reverse). Its device copy is then another field's, so
/// it is freed and a buffer of the new size allocated in its place
/// (zeroed where the new host field is zeros, else undefined, as a new
/// output's): the step that makes a
/// transient field writes it before any step reads it, as on the host.
fn resize_replaced(
    data: &Data,
    bufs: &mut DeviceBuffers,
    windows: &Windows,
    spec: &StepSpec,
) -> Result<(), OpError> {
    for it in detdata_items(spec) {
        for key in keys(data, &it) {
            if !bufs.is_present(&key) {
                continue;
            }
            let host = host_bytes(data, windows, &key)?;
            let n = host.len() as u64;
            if bufs.handle(&key)?.bytes != n {
                bufs.delete(&key)?;
                bufs.create(&key, n)?;
                // A remade field is zeros on the host (new, or reset): a
                // memset makes the copies equal, so no kernel call uploads
                // it as unstaged data.
                if all_zero(host) {
                    bufs.reset(&key)?;
                    bufs.mark_in_sync(&key)?;
                }
            }
        }
    }
    Ok(())
}

/// The detdata items step `spec` reads or writes.
fn detdata_items(spec: &StepSpec) -> impl Iterator<Item = Item> {
    let items = spec.requires.items().into_iter();
    items
        .chain(spec.provides.items())
        .filter(|it| it.category == Category::DetData)
}

/// Stream the detector data of the open scope (if any) from now on, or
/// stop: each device step's detdata buffers hold the rows of its pass's
/// detectors only ([`window`]). Returns whether a scope is open.
pub fn stream_detector_data(ctx: &mut ExecContext, on: bool) -> bool {
    match scope_mut(ctx) {
        Some(s) => {
            s.streamed = on;
            true
        }
        None => false,
    }
}

/// Whether the open scope streams its detector data.
pub fn streams_detector_data(ctx: &ExecContext) -> bool {
    of(ctx)
        .and_then(|m| m.scope.as_ref())
        .is_some_and(|s| s.streamed)
}

/// The rows of `observation`'s detdata field `field` that a kernel call of
/// the current step sees as the whole field: its window in a device step of
/// a streamed scope ([`window`]), else `None` (every row; a host step reads
/// the host's whole field).
pub fn step_window(ctx: &ExecContext, observation: &str, field: &str) -> Option<RowWindow> {
    if !ctx.use_accel {
        return None;
    }
    let key = BufferKey::new(observation, Category::DetData, field);
    of(ctx).and_then(|m| m.scope.as_ref()?.windows.get(&key).copied())
}

/// Move the window of every detdata field device step `spec` reads or
/// writes to the rows of `detectors` (the pass's set; `None`: all rows),
/// see [`window`]: the rows the device wrote go back to the host first
/// (unless the host field was remade since: a transient field's old rows
/// are dead), and the new window's buffer is filled from the host (a
/// memset where the rows are zeros), or zeroed where the plan makes the
/// field a new output.
fn move_windows(
    data: &mut Data,
    s: &mut DeviceScope,
    spec: &StepSpec,
    detectors: Option<&[String]>,
    plan: &StepStaging,
) -> Result<(), OpError> {
    let mut moves = Vec::new();
    for it in detdata_items(spec) {
        for ob in data.obs.iter().filter(|ob| ob.detdata.contains(&it.name)) {
            if let Some(want) = RowWindow::of_detectors(ob, &it.name, detectors)? {
                let key = BufferKey::new(ob.name(), Category::DetData, it.name.clone());
                moves.push((it.clone(), key, want));
            }
        }
    }
    for (it, key, want) in moves {
        let present = s.buffers.is_present(&key);
        let held = s
            .windows
            .get(&key)
            .copied()
            .unwrap_or_else(|| RowWindow::whole(want.field_rows, want.row_bytes));
        if present && held == want {
            continue;
        }
        if present {
            // The rows the device holds belong to this host field (not to a
            // field remade since with another size: dead rows).
            let bytes = s.buffers.handle(&key)?.bytes;
            let same_field =
                held.field_rows == want.field_rows && bytes == held.bytes().len() as u64;
            if same_field && s.buffers.state(&key) == BufferState::DeviceNewer {
                let dst = host_bytes_mut(data, &s.windows, &key)?;
                s.buffers.update_host(&key, dst)?;
            }
            s.buffers.delete(&key)?;
        }
        s.windows.insert(key.clone(), want);
        let src = host_bytes(data, &s.windows, &key)?;
        s.buffers.create(&key, src.len() as u64)?;
        if plan.reset.contains(&it) {
            s.buffers.reset(&key)?;
        } else if all_zero(src) {
            s.buffers.reset(&key)?;
            s.buffers.mark_in_sync(&key)?;
        } else {
            s.buffers.update_device(&key, src)?;
        }
    }
    Ok(())
}

/// Mark what a step staged by [`stage_step`] wrote.
pub fn finish_step(
    data: &Data,
    ctx: &mut ExecContext,
    plan: Option<&StepStaging>,
) -> Result<(), OpError> {
    let scope = scope_mut(ctx);
    if let (Some(plan), Some(s)) = (plan, scope) {
        apply_after(data, &mut s.buffers, plan)?;
    }
    Ok(())
}

/// Run host code `f` inside the open device scope (if any) as a host step
/// named `name` that reads `requires` and writes `provides`: device-newer
/// copies of those items come back first, and afterwards the device copies
/// of what it wrote are marked stale.
pub fn with_host_step<R>(
    data: &mut Data,
    ctx: &mut ExecContext,
    name: &str,
    requires: Requirements,
    provides: Requirements,
    f: impl FnOnce(&mut Data, &mut ExecContext) -> Result<R, OpError>,
) -> Result<R, OpError> {
    let spec = StepSpec::new(name, requires, provides, false);
    let plan = stage_step(data, ctx, &spec)?;
    let r = f(data, ctx)?;
    finish_step(data, ctx, plan.as_ref())?;
    Ok(r)
}

/// Declare, inside the open device scope (if any), that the host holds its
/// own copies of `items`, equal to the device's: items the device wrote
/// become in sync (toast-core's [`Stager::mark_in_sync`] and
/// `DeviceBuffers::mark_in_sync`), so no host step and no end of scope
/// copies them back. For values computed on both sides from the same
/// inputs by the same operators (pointing); only items the host actually
/// holds are marked.
pub fn mark_host_copies(
    data: &Data,
    ctx: &mut ExecContext,
    items: &Requirements,
) -> Result<(), OpError> {
    let Some(s) = scope_mut(ctx) else {
        return Ok(());
    };
    let held: Vec<(Item, Vec<BufferKey>)> = items
        .items()
        .into_iter()
        .map(|it| {
            let k = keys(data, &it);
            (it, k)
        })
        .filter(|(_, k)| !k.is_empty())
        .collect();
    for (it, ks) in &held {
        if !s.stager.mark_in_sync(it) {
            continue;
        }
        for key in ks {
            if s.buffers.state(key) == BufferState::DeviceNewer {
                s.buffers.mark_in_sync(key)?;
            }
        }
    }
    Ok(())
}

/// Zero the device copy of `key` in place if the open scope holds one
/// (an accelerated operator resetting its outputs); returns whether it did.
pub fn reset_on_device(ctx: &mut ExecContext, key: &BufferKey) -> Result<bool, OpError> {
    let Some(s) = scope_mut(ctx) else {
        return Ok(false);
    };
    if !s.buffers.is_present(key) {
        return Ok(false);
    }
    s.buffers.reset(key)?;
    Ok(true)
}

impl DataMovement {
    /// The open scope, if any.
    pub fn scope(&self) -> Option<&DeviceScope> {
        self.scope.as_ref()
    }

    /// The run's ledger.
    pub fn ledger(&self) -> &TransferLedger {
        &self.ledger
    }

    /// The movement owner of `ctx` for a kernel call (created if missing).
    pub(crate) fn for_call(ctx: &mut ExecContext) -> &mut DataMovement {
        of_mut(ctx)
    }

    /// The rows the open scope's device buffer of `key` holds, when it is
    /// a window of its field ([`window`]); `None`: every row, or no scope.
    pub(crate) fn window(&self, key: &BufferKey) -> Option<RowWindow> {
        self.scope
            .as_ref()
            .and_then(|s| s.windows.get(key).copied())
    }

    /// Whether a call on `backend` reads the open scope's device copies.
    pub(crate) fn staged_on(&self, backend: &Arc<Backend>) -> bool {
        !backend.host_addressable()
            && self
                .scope
                .as_ref()
                .is_some_and(|s| same_device(&s.buffers, backend))
    }

    /// What must be copied of argument `key` before a call that reads the
    /// scope's copies (`staged`) or host memory (`!staged`).
    pub(crate) fn sync_for_call(&self, key: &BufferKey, staged: bool) -> CallSync {
        let Some(s) = &self.scope else {
            return CallSync::None;
        };
        match s.buffers.state(key) {
            st if !st.is_present() => CallSync::None,
            BufferState::Allocated | BufferState::HostNewer if staged => CallSync::Upload,
            BufferState::DeviceNewer if !staged => CallSync::Download,
            _ => CallSync::None,
        }
    }

    /// Upload argument `key` from `host` before a call of `kernel` on the
    /// scope's copies ([`CallSync::Upload`]); counted as unstaged.
    pub(crate) fn upload_for_call(
        &mut self,
        kernel: Kernel,
        key: &BufferKey,
        host: &[u8],
    ) -> Result<(), OpError> {
        if let Some(s) = self.scope.as_mut() {
            s.buffers.update_device(key, host)?;
            let n = host.len() as u64;
            self.ledger
                .count_unstaged(&key.stat_name(), true, n, kernel);
        }
        Ok(())
    }

    /// Download argument `key` into `host` before a call of `kernel` that
    /// reads host memory ([`CallSync::Download`]); counted as unstaged.
    pub(crate) fn download_for_call(
        &mut self,
        kernel: Kernel,
        key: &BufferKey,
        host: &mut [u8],
    ) -> Result<(), OpError> {
        if let Some(s) = self.scope.as_mut() {
            s.buffers.update_host(key, host)?;
            let n = host.len() as u64;
            self.ledger
                .count_unstaged(&key.stat_name(), false, n, kernel);
        }
        Ok(())
    }

    /// The device copy a call on the scope's backend reads for `key`
    /// (`bytes` long): `None` when the scope holds none. Operator scratch
    /// (`scratch`) is created and zeroed on first use and never copied.
    pub(crate) fn device_array(
        &mut self,
        key: &BufferKey,
        bytes: u64,
        scratch: bool,
    ) -> Result<Option<DeviceView>, OpError> {
        let Some(s) = self.scope.as_mut() else {
            return Ok(None);
        };
        if scratch && !s.buffers.is_present(key) {
            s.buffers.create(key, bytes)?;
            s.buffers.reset(key)?;
        }
        if !s.buffers.is_present(key) {
            return Ok(None);
        }
        Ok(Some(s.buffers.handle(key)?))
    }

    /// Count a per-call temporary copy of buffer `name` (not staged).
    pub(crate) fn count_unstaged(&mut self, name: &str, up: bool, bytes: u64, kernel: Kernel) {
        self.ledger.count_unstaged(name, up, bytes, kernel);
    }

    /// After a call wrote `outputs`: newest on the device when it ran on
    /// the scope's copies (`staged`), else on the host.
    pub(crate) fn after_call<'k>(
        &mut self,
        outputs: impl IntoIterator<Item = &'k BufferKey>,
        staged: bool,
    ) -> Result<(), OpError> {
        let Some(s) = self.scope.as_mut() else {
            return Ok(());
        };
        for key in outputs {
            if !s.buffers.is_present(key) {
                continue;
            }
            if staged {
                s.buffers.mark_device_modified(key)?;
            } else {
                s.buffers.mark_host_modified(key)?;
            }
        }
        Ok(())
    }
}
