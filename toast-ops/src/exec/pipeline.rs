//! Pipelines: run a list of operators over the data, per detector set,
//! moving data to the accelerator once.
//!
//! # Data movement
//!
//! What moves between host and device, and its record, belong to
//! [`crate::exec::movement`]: a pipeline opens (or joins) a device scope on
//! its backend ([`open_scope`]), asks the movement owner to stage each step
//! around the operator's `exec` ([`crate::exec::movement::stage_step`],
//! [`crate::exec::movement::finish_step`]) and closes the scope at the end.
//! [`mirror_on_host`] is the pipeline-level piece of "pointing on both
//! sides": it runs the pointing operators on the host with the scope set
//! aside.
//!
//! # Detector sets
//!
//! TOAST's `Pipeline(detector_sets=...)`: `All` runs every operator once
//! over all selected detectors; `Single` runs the operator list once per
//! detector; `Sets` once per given set. The staging state persists across
//! sets, so each input is still uploaded once per pipeline.

use crate::exec::movement::{
    close_scope, finish_step, mark_host_copies, open_scope, restore_scope, set_scope_aside,
    stage_step,
};
use std::sync::Arc;
use toast_accel::host::{Backend, DispatchPolicy, Dispatcher, Registry, DEFAULT_BACKEND};
use toast_core::staging::StepSpec;
use toast_core::{
    pipeline_provides, pipeline_requires, Data, ExecContext, OpError, Operator, Requirements,
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

/// Run `ops` on the host (the `cpu` backend at the pipeline level) with
/// the open device scope (if any) set aside, so nothing is staged for
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
    let scope = set_scope_aside(ctx);
    let host = RunOptions {
        backend: Some(DEFAULT_BACKEND.to_string()),
        ..opts.clone()
    };
    let r = run_operators(name, ops, data, ctx, &host);
    restore_scope(ctx, scope);
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
        // `use_accel` tells it the outputs are made for a device step.
        ctx.use_accel = true;
        let r = op.prepare_outputs(data, ctx);
        ctx.use_accel = false;
        r?;
    }
    let plan = stage_step(data, ctx, &spec)?;
    ctx.use_accel = spec.accel;
    let r = op.exec(data, ctx);
    ctx.use_accel = false;
    r?;
    finish_step(data, ctx, plan.as_ref())
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
