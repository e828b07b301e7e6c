//! Pipelines: run a list of operators over the data, per detector set,
//! moving data to the accelerator once.
//!
//! # Staging scopes
//!
//! Whether data moves at all depends on the **pipeline backend**: the first
//! available backend among the pipeline's own setting, the dispatcher's
//! pipeline and run settings, and `cpu`. A host-addressable backend (the CPU
//! plugin) reads host memory directly, so nothing is staged. For any other
//! backend the pipeline opens a *staging scope*: it installs a
//! [`DeviceBuffers`] for that backend and a [`StagingState`] (toast-core's
//! [`Stager`], which simulates where the newest copy of each item lives) in
//! the [`ExecContext`], and closes it at the end: the outputs that are
//! newest on the device are copied back and every device buffer is freed.
//!
//! Around each step the plan of [`Stager::stage`] is applied to the real
//! buffers: create and upload what an accelerated operator requires and is
//! not yet (validly) on the device, create and zero its new outputs, copy
//! back what a host operator reads or writes, then mark what the step wrote.
//! Observation fields become one buffer per observation; global items (maps,
//! the pixel distribution's `global2local`, template amplitudes) one buffer
//! each (see [`crate::exec::global_data`]); metadata and interval lists have no
//! device form (intervals are host arguments of every kernel) and are
//! skipped. The executor checks each buffer's actual state before acting, so
//! it stays correct when a kernel override sent a call to another backend
//! (the kernel layer then moves data itself and says so).
//!
//! A first upload of an all-zero host block (a fresh timestream, unset
//! flags) is a device memset instead of a copy; the buffer is then in sync.
//!
//! # Pointing on both sides
//!
//! Pointing is cheap to recompute and expensive to move (pixels and
//! weights are 32 bytes a detector sample; the boresight they come from,
//! 32 bytes a sample). A host step inside a device scope that needs the
//! pointing the device expanded gets its own copy: [`mirror_on_host`] runs
//! the pointing operators on the host with the scope set aside, then
//! [`mark_host_copies`] declares the host and device copies equal, so
//! neither a host step nor the end of the scope copies them back.
//!
//! A pipeline run inside an open scope (a nested pipeline, or a step of the
//! map-maker, which opens one scope for its whole solve) joins it instead of
//! opening its own, so data stays on the device across pipelines; the
//! [`Stager`]'s state carries over, and so does the rule that an item is
//! uploaded once until a host step changes it. Host-side work inside a scope
//! goes through [`with_host_step`], which copies back what it reads and
//! marks what it writes.
//!
//! # Detector sets
//!
//! TOAST's `Pipeline(detector_sets=...)`: `All` runs every operator once
//! over all selected detectors; `Single` runs the operator list once per
//! detector; `Sets` once per given set. The staging state persists across
//! sets, so each input is still uploaded once per pipeline.

use crate::exec::global_data::{global_bytes, global_bytes_mut};
use std::sync::Arc;
use toast_accel::host::{Backend, DispatchPolicy, Dispatcher, Registry, DEFAULT_BACKEND};
use toast_core::staging::{StepSpec, StepStaging};
use toast_core::{
    pipeline_provides, pipeline_requires, BufferKey, BufferState, Category, Data, DeviceBuffers,
    ExecContext, Item, OpError, Operator, Requirements, Stager, TransferReport,
};

/// A borrowed operator in a list of pipeline steps.
pub type OpRef<'a> = &'a mut (dyn Operator + 'static);

/// Which detectors each pass of a pipeline processes (TOAST's
/// `detector_sets`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DetectorSets {
    /// One pass over all selected detectors.
    #[default]
    All,
    /// One pass per detector.
    Single,
    /// One pass per listed set (intersected with the caller's selection).
    Sets(Vec<Vec<String>>),
}

/// The simulation state of an open staging scope (an [`ExecContext`]
/// extension, next to the scope's [`DeviceBuffers`]).
#[derive(Debug, Default)]
pub struct StagingState {
    stager: Stager,
    steps: usize,
}

impl StagingState {
    /// The planner.
    pub fn stager(&self) -> &Stager {
        &self.stager
    }
    /// Steps staged so far.
    pub fn steps(&self) -> usize {
        self.steps
    }
}

/// The transfer reports of the staging scopes closed so far (an
/// [`ExecContext`] extension that [`close_scope`] appends to).
#[derive(Debug, Clone, Default)]
pub struct StagingReports {
    /// One report per closed scope, in order.
    pub reports: Vec<TransferReport>,
}

impl StagingReports {
    /// Host→device and device→host copies of buffer name `name`
    /// (`detdata.signal`, `global.map`, ...) summed over all scopes.
    pub fn copies(&self, name: &str) -> (u64, u64) {
        self.reports
            .iter()
            .filter_map(|r| r.per_buffer.get(name))
            .fold((0, 0), |(h, d), c| (h + c.h2d_calls, d + c.d2h_calls))
    }

    /// Totals over all buffers and scopes: (h2d calls, d2h calls, allocs, frees).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.reports
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
}

/// The result of [`open_scope`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope {
    /// Whether this call opened the scope (and must close it).
    pub owner: bool,
    /// Whether steps run on staged device data.
    pub accel: bool,
}

/// The backend a pipeline's data lives on: the first available of
/// `override_backend`, the dispatcher's pipeline and run settings, and `cpu`.
pub fn pipeline_backend(
    dispatcher: &Dispatcher,
    override_backend: Option<&str>,
) -> Option<Arc<Backend>> {
    pipeline_backend_in(dispatcher.registry(), dispatcher.policy(), override_backend)
}

/// [`pipeline_backend`] of `policy` over `registry`, before a dispatcher
/// exists (a dry run's plan).
pub fn pipeline_backend_in(
    registry: &Registry,
    policy: &DispatchPolicy,
    override_backend: Option<&str>,
) -> Option<Arc<Backend>> {
    let chain = [
        override_backend,
        policy.pipeline.as_deref(),
        policy.run.as_deref(),
        Some(DEFAULT_BACKEND),
    ];
    chain
        .into_iter()
        .flatten()
        .find_map(|name| registry.get(name).ok())
}

/// Open (or join) a staging scope on `backend`. A host-addressable backend,
/// or none, needs no scope.
pub fn open_scope(ctx: &mut ExecContext, backend: Option<&Arc<Backend>>) -> Scope {
    let Some(backend) = backend.filter(|b| !b.host_addressable()) else {
        return Scope {
            owner: false,
            accel: false,
        };
    };
    if let Some(bufs) = ctx.extensions.get::<DeviceBuffers>() {
        let same = Arc::as_ptr(bufs.device()) as *const u8 == Arc::as_ptr(backend) as *const u8;
        return Scope {
            owner: false,
            accel: same && ctx.extensions.get::<StagingState>().is_some(),
        };
    }
    let device: Arc<dyn toast_core::DeviceMemory> = Arc::clone(backend) as _;
    ctx.insert(DeviceBuffers::new(device));
    ctx.insert(StagingState::default());
    tracing::debug!("opened a staging scope on backend {}", backend.name());
    Scope {
        owner: true,
        accel: true,
    }
}

/// Close a scope this caller opened: copy back the `outputs` that are newest
/// on the device, free every device buffer, and remove the scope's context
/// extensions (returning the buffers, whose transfer report stays readable).
pub fn close_scope(
    data: &mut Data,
    ctx: &mut ExecContext,
    scope: Scope,
    outputs: &Requirements,
) -> Result<Option<DeviceBuffers>, OpError> {
    if !scope.owner {
        return Ok(None);
    }
    let Some(mut state) = ctx.extensions.remove::<StagingState>() else {
        return Ok(None);
    };
    let Some(mut bufs) = ctx.extensions.remove::<DeviceBuffers>() else {
        return Ok(None);
    };
    let fin = state.stager.finish(outputs);
    let mut first_err: Option<OpError> = None;
    for it in &fin.update_host {
        if let Err(e) = download(data, &mut bufs, it) {
            first_err.get_or_insert(e);
        }
    }
    // Everything, including scratch buffers the planner does not know.
    if let Err(e) = bufs.delete_all() {
        first_err.get_or_insert(e.into());
    }
    tracing::debug!("closed a staging scope:\n{}", bufs.report());
    let report = bufs.report().clone();
    match ctx.extensions.get_mut::<StagingReports>() {
        Some(r) => r.reports.push(report),
        None => {
            ctx.insert(StagingReports {
                reports: vec![report],
            });
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(Some(bufs)),
    }
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

fn host_bytes<'a>(data: &'a Data, key: &BufferKey) -> Result<&'a [u8], OpError> {
    match key.category {
        Category::Global => global_bytes(&data.meta, &key.field).ok_or_else(|| OpError::Global {
            key: key.field.clone(),
            problem: "has no device form".into(),
        }),
        c => Ok(data.get(&key.observation)?.field_bytes(c, &key.field)?),
    }
}

fn host_bytes_mut<'a>(data: &'a mut Data, key: &BufferKey) -> Result<&'a mut [u8], OpError> {
    match key.category {
        Category::Global => {
            global_bytes_mut(&mut data.meta, &key.field).ok_or_else(|| OpError::Global {
                key: key.field.clone(),
                problem: "cannot be copied back from a device".into(),
            })
        }
        c => Ok(data
            .get_mut(&key.observation)?
            .field_bytes_mut(c, &key.field)?),
    }
}

fn download(data: &mut Data, bufs: &mut DeviceBuffers, it: &Item) -> Result<(), OpError> {
    for key in keys(data, it) {
        if bufs.state(&key) == BufferState::DeviceNewer {
            let dst = host_bytes_mut(data, &key)?;
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
    plan: &StepStaging,
) -> Result<Vec<BufferKey>, OpError> {
    let mut created = Vec::new();
    for it in &plan.create {
        for key in keys(data, it) {
            if !bufs.is_present(&key) {
                let n = host_bytes(data, &key)?.len() as u64;
                bufs.create(&key, n)?;
                created.push(key);
            }
        }
    }
    for it in &plan.update_device {
        for key in keys(data, it) {
            match bufs.state(&key) {
                // A first upload of zeros (a fresh field: the timestream
                // before the scan, unset flags) is a device memset.
                BufferState::Allocated if all_zero(host_bytes(data, &key)?) => {
                    bufs.reset(&key)?;
                    bufs.mark_in_sync(&key)?;
                }
                BufferState::Allocated | BufferState::HostNewer => {
                    let src = host_bytes(data, &key)?;
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
        download(data, bufs, it)?;
    }
    Ok(created)
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

/// Stage one step in the open scope (if any); returns its plan.
fn stage_before(
    data: &mut Data,
    ctx: &mut ExecContext,
    spec: &StepSpec,
) -> Result<Option<StepStaging>, OpError> {
    let Some(state) = ctx.extensions.get_mut::<StagingState>() else {
        return Ok(None);
    };
    let plan = state.stager.stage(state.steps, spec);
    state.steps += 1;
    let Some(bufs) = ctx.extensions.get_mut::<DeviceBuffers>() else {
        return Ok(None);
    };
    apply_before(data, bufs, &plan)?;
    Ok(Some(plan))
}

fn stage_after(
    data: &Data,
    ctx: &mut ExecContext,
    plan: Option<&StepStaging>,
) -> Result<(), OpError> {
    if let (Some(plan), Some(bufs)) = (plan, ctx.extensions.get_mut::<DeviceBuffers>()) {
        apply_after(data, bufs, plan)?;
    }
    Ok(())
}

/// Run host code `f` inside the open staging scope (if any) as a host step
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
    let plan = stage_before(data, ctx, &spec)?;
    let r = f(data, ctx)?;
    stage_after(data, ctx, plan.as_ref())?;
    Ok(r)
}

/// Declare, inside the open staging scope (if any), that the host holds
/// its own copies of `items`, equal to the device's: items the device wrote
/// become in sync (toast-core's [`Stager::mark_in_sync`] and
/// `DeviceBuffers::mark_in_sync`), so no host step and no end of scope
/// copies them back. For values computed on both sides from the same
/// inputs by the same operators (pointing, see [`mirror_on_host`]); only
/// items the host actually holds are marked.
pub fn mark_host_copies(
    data: &Data,
    ctx: &mut ExecContext,
    items: &Requirements,
) -> Result<(), OpError> {
    let Some(state) = ctx.extensions.get_mut::<StagingState>() else {
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
    let marked: Vec<&Vec<BufferKey>> = held
        .iter()
        .filter(|(it, _)| state.stager.mark_in_sync(it))
        .map(|(_, k)| k)
        .collect();
    let Some(bufs) = ctx.extensions.get_mut::<DeviceBuffers>() else {
        return Ok(());
    };
    for key in marked.into_iter().flatten() {
        if bufs.state(key) == BufferState::DeviceNewer {
            bufs.mark_in_sync(key)?;
        }
    }
    Ok(())
}

/// Run `ops` on the host (the `cpu` backend at the pipeline level) with
/// the open staging scope (if any) set aside, so nothing is staged for
/// them, then declare the fields they leave behind (their pipeline's
/// outputs) equal to the device's copies ([`mark_host_copies`]). This is
/// how the host gets pointing that a device scope also expands:
/// recomputing it from the boresight the host already holds costs no bus
/// traffic, where copying pixels and weights back would cost 32 bytes a
/// detector sample. The operators must be deterministic functions of host
/// data that the scope has not changed (boresight, flags, focal plane), and
/// must leave whole fields (not transient ones: device steps size their
/// arguments from the host fields); the two copies then agree to the
/// kernels' conformance tolerance (bit for bit where the device is exact).
pub fn mirror_on_host(
    name: &str,
    ops: &mut [OpRef<'_>],
    data: &mut Data,
    ctx: &mut ExecContext,
    opts: &RunOptions,
) -> Result<(), OpError> {
    let state = ctx.extensions.remove::<StagingState>();
    let bufs = ctx.extensions.remove::<DeviceBuffers>();
    let host = RunOptions {
        backend: Some(DEFAULT_BACKEND.to_string()),
        ..opts.clone()
    };
    let r = run_operators(name, ops, data, ctx, &host);
    if let Some(s) = state {
        ctx.insert(s);
    }
    if let Some(b) = bufs {
        ctx.insert(b);
    }
    r?;
    let outputs = pipeline_provides(
        &ops.iter()
            .map(|o| StepSpec::from_operator(&**o, false))
            .collect::<Vec<_>>(),
    );
    mark_host_copies(data, ctx, &outputs)
}

/// Options of [`run_operators`].
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Detector sets.
    pub detector_sets: DetectorSets,
    /// Pipeline-level backend (the dispatch chain's pipeline level).
    pub backend: Option<String>,
    /// Items to copy back at the end besides the pipeline's outputs.
    pub keep: Requirements,
}

/// The detector selections of the passes of a pipeline over `sets`
/// (`None`: every detector), each intersected with the context's selection.
pub(crate) fn detector_passes(
    data: &Data,
    ctx: &ExecContext,
    sets: &DetectorSets,
) -> Vec<Option<Vec<String>>> {
    let allowed = |d: &String| ctx.detectors.as_ref().is_none_or(|sel| sel.contains(d));
    match sets {
        DetectorSets::All => vec![ctx.detectors.clone()],
        DetectorSets::Single => data
            .all_local_detectors(0)
            .into_iter()
            .filter(allowed)
            .map(|d| Some(vec![d]))
            .collect(),
        DetectorSets::Sets(list) => list
            .iter()
            .map(|s| Some(s.iter().filter(|d| allowed(d)).cloned().collect::<Vec<_>>()))
            .filter(|s| s.as_ref().is_some_and(|v| !v.is_empty()))
            .collect(),
    }
}

/// Run `ops` in order over `data` (TOAST's `Pipeline.exec`): per detector
/// set, each operator's `exec`, with the staging described in the module
/// documentation. `name` labels the timer frame. Errors name the operator.
pub fn run_operators(
    name: &str,
    ops: &mut [OpRef<'_>],
    data: &mut Data,
    ctx: &mut ExecContext,
    opts: &RunOptions,
) -> Result<(), OpError> {
    // The pipeline level of the dispatch chain, restored afterwards.
    let saved = match (&opts.backend, ctx.extensions.get::<Dispatcher>()) {
        (Some(b), Some(d)) => {
            let replaced = d.for_pipeline(Some(b));
            ctx.insert(replaced)
        }
        _ => None,
    };
    let result = run_inner(name, ops, data, ctx, opts);
    if let Some(d) = saved {
        ctx.insert(d);
    }
    result
}

fn run_inner(
    name: &str,
    ops: &mut [OpRef<'_>],
    data: &mut Data,
    ctx: &mut ExecContext,
    opts: &RunOptions,
) -> Result<(), OpError> {
    let backend = ctx
        .extensions
        .get::<Dispatcher>()
        .and_then(|d| pipeline_backend(d, None));
    let scope = open_scope(ctx, backend.as_ref());
    let frame = ctx.timers.enter(name).ok();
    let passes = detector_passes(data, ctx, &opts.detector_sets);
    let saved_sel = ctx.detectors.clone();
    let saved_accel = ctx.use_accel;
    let mut result = Ok(());
    'passes: for sel in passes {
        ctx.detectors = sel;
        for op in ops.iter_mut() {
            let r = run_step(&mut **op, data, ctx, scope.accel);
            if let Err(e) = r {
                // Kernel errors already name their operator.
                let named = e
                    .to_string()
                    .starts_with(&format!("operator '{}'", op.name()));
                result = Err(if named { e } else { e.in_operator(op.name()) });
                break 'passes;
            }
        }
    }
    ctx.detectors = saved_sel;
    ctx.use_accel = saved_accel;
    if frame.is_some() {
        let _ = ctx.timers.exit(name);
    }
    let mut outputs = pipeline_provides(
        &ops.iter()
            .map(|o| StepSpec::from_operator(&**o, scope.accel))
            .collect::<Vec<_>>(),
    );
    outputs.extend(&opts.keep);
    let closed = close_scope(data, ctx, scope, &outputs);
    result?;
    closed.map(|_| ())
}

fn run_step(
    op: &mut dyn Operator,
    data: &mut Data,
    ctx: &mut ExecContext,
    accel: bool,
) -> Result<(), OpError> {
    let spec = StepSpec::from_operator(op, accel);
    if spec.accel {
        op.prepare_outputs(data)?;
    }
    let plan = stage_before(data, ctx, &spec)?;
    ctx.use_accel = spec.accel;
    let r = op.exec(data, ctx);
    ctx.use_accel = false;
    r?;
    stage_after(data, ctx, plan.as_ref())
}

/// A pipeline that owns its operators (TOAST's `Pipeline`).
pub struct Pipeline {
    name: String,
    /// The operators, in order.
    pub operators: Vec<Box<dyn Operator + Send>>,
    /// Options.
    pub options: RunOptions,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field(
                "operators",
                &self
                    .operators
                    .iter()
                    .map(|o| o.name().to_string())
                    .collect::<Vec<_>>(),
            )
            .field("options", &self.options)
            .finish()
    }
}

impl Pipeline {
    /// A pipeline over all detectors at once.
    pub fn new(name: impl Into<String>, operators: Vec<Box<dyn Operator + Send>>) -> Self {
        Pipeline {
            name: name.into(),
            operators,
            options: RunOptions::default(),
        }
    }

    /// Set the detector sets.
    pub fn with_detector_sets(mut self, sets: DetectorSets) -> Self {
        self.options.detector_sets = sets;
        self
    }

    /// Set the pipeline-level backend.
    pub fn with_backend(mut self, backend: Option<&str>) -> Self {
        self.options.backend = backend.map(str::to_string);
        self
    }

    fn specs(&self) -> Vec<StepSpec> {
        self.operators
            .iter()
            .map(|o| StepSpec::from_operator(o.as_ref(), true))
            .collect()
    }
}

impl Operator for Pipeline {
    fn name(&self) -> &str {
        &self.name
    }
    /// What the pipeline needs from outside (TOAST's `Pipeline._requires`).
    fn requires(&self) -> Requirements {
        pipeline_requires(&self.specs())
    }
    /// What it leaves behind (TOAST's `Pipeline._provides`).
    fn provides(&self) -> Requirements {
        pipeline_provides(&self.specs())
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let mut ops: Vec<OpRef<'_>> = self
            .operators
            .iter_mut()
            .map(|o| &mut **o as OpRef<'_>)
            .collect();
        run_operators(&self.name, &mut ops, data, ctx, &self.options)
    }
    fn finalize(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        for op in &mut self.operators {
            op.finalize(data, ctx)
                .map_err(|e| e.in_operator(op.name()))?;
        }
        Ok(())
    }
}
