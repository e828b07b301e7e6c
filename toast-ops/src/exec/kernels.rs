//! The kernel call layer: one safe function per kernel, which runs it for a
//! set of detectors of one observation on the backend the dispatcher picks.
//!
//! # What a call does
//!
//! 1. **Dispatch.** The backend comes from the [`Dispatcher`] installed in the
//!    [`ExecContext`] (`ctx.insert(dispatcher)`), resolved for the kernel and
//!    the calling operator: kernel override > operator override > pipeline >
//!    run > `cpu`, with fallback when a backend lacks the kernel. The call is
//!    timed under [`toast_accel::host::Resolved::timer_name`]
//!    (`"{operator}.{kernel}[{backend}]"`) in `ctx.timers`, so the timing
//!    report says what actually ran.
//! 2. **Arguments.** Small per-detector arrays (index arrays, focalplane
//!    quaternions, calibration, noise weights, the offset layout) and the
//!    intervals are host memory, built here. Every large array names its
//!    source: a detdata or shared field of the observation, or a global item
//!    of the data (a map, a pixel distribution's `global2local`, template
//!    amplitudes; see [`crate::exec::global_data`]). Its kernel address is
//!    * the **host address**, for a host-addressable backend (the CPU plugin);
//!    * otherwise the **device handle** of the field's copy in the open
//!      device scope, when the pipeline has staged it on this backend;
//!    * otherwise a temporary device copy made by
//!      [`toast_accel::host::ArrayArg`] (uploaded before the call, an output
//!      downloaded after): an **unstaged transfer**.
//! 3. **Consistency with the staged copies.** The layer asks the movement
//!    owner ([`crate::exec::movement::DataMovement`]) what each argument
//!    needs: before a call on the staging backend a staged input whose device
//!    copy is stale is uploaded; before a call elsewhere (the CPU, or a
//!    backend a kernel override chose) a staged argument whose device copy
//!    is newer is downloaded; after the call the staged outputs are marked
//!    modified on the side that wrote them. Every such copy, and every
//!    temporary one, is counted in the run's ledger
//!    ([`crate::exec::movement::TransferLedger::unstaged`]) and logged at
//!    debug level, because a well-staged pipeline makes none.
//!
//! One code path serves every backend; nothing here knows backend names.
//!
//! The operator-owned `hit_submaps` array of `pixels_healpix` is *scratch*:
//! on a staging backend it lives in a device buffer of the operator's,
//! created zeroed at its first call in the scope, never transferred by a
//! call; the operator reads it back once, when it is asked for the pixel
//! distribution ([`crate::exec::movement::take_scratch`]).

mod cov;
mod fused;
mod solver_flags;

pub use cov::{cov_accum_timestream, CovMaps};
pub use fused::{
    compact_expand_pointing, compact_expand_window, fused_accumulate, fused_project,
    CompactPointing, FusedInput, FusedMap, FusedOffsets, FusedPointing,
};
pub use solver_flags::{solver_flags, SolverFlagPass};

use crate::exec::global_data::{global_bytes, global_bytes_mut};
use crate::exec::movement::window::{host_range, RowWindow};
use crate::exec::movement::{CallSync, DataMovement};
use crate::pixels::{PixelData, PixelDistribution};
use std::sync::Arc;
use std::time::Instant;
use toast_accel::abi::{self, Kernel};
use toast_accel::host::{AccelError, ArrayArg, Dispatcher, KernelArgs};
use toast_core::{BufferKey, Category, DType, Element, ExecContext, Meta, Observation, OpError};

/// A kernel call that failed, naming the operator, kernel, backend and
/// observation.
#[derive(Debug, thiserror::Error)]
#[error(
    "operator '{operator}': kernel `{kernel}`{}{}: {source}{}",
    on_backend(.backend),
    for_observation(.observation),
    detector_list(.detectors)
)]
pub struct KernelError {
    /// Calling operator.
    pub operator: String,
    /// Kernel.
    pub kernel: Kernel,
    /// Backend that ran (or would have run) it; empty if dispatch failed.
    pub backend: String,
    /// Observation (empty for calls not tied to one).
    pub observation: String,
    /// The detectors of the call, in argument order (a backend reports a
    /// detector by its position in this list).
    pub detectors: Vec<String>,
    /// The cause.
    #[source]
    pub source: AccelError,
}

/// `" on backend `cuda`"`, or nothing when dispatch failed before a backend.
fn on_backend(backend: &str) -> String {
    if backend.is_empty() {
        String::new()
    } else {
        format!(" on backend `{backend}`")
    }
}

/// `" for observation 'o'"`, or nothing for calls not tied to one.
fn for_observation(observation: &str) -> String {
    if observation.is_empty() {
        String::new()
    } else {
        format!(" for observation '{observation}'")
    }
}

/// `" (detectors: 0 = 'a', 1 = 'b')"`, the first 16, or nothing.
fn detector_list(detectors: &[String]) -> String {
    const SHOW: usize = 16;
    if detectors.is_empty() {
        return String::new();
    }
    let names: Vec<String> = detectors
        .iter()
        .take(SHOW)
        .enumerate()
        .map(|(i, d)| format!("{i} = '{d}'"))
        .collect();
    let more = if detectors.len() > SHOW { ", ..." } else { "" };
    format!(" (detectors: {}{more})", names.join(", "))
}

/// Where the data of a kernel array argument lives on the host.
#[derive(Debug)]
enum Source<'a> {
    /// An absent optional array.
    Absent,
    /// A detdata field of the observation.
    DetData(&'a str),
    /// A shared field of the observation.
    Shared(&'a str),
    /// A global item of the data.
    Global(&'a str),
    /// Operator-owned scratch memory whose contents are never needed back.
    Scratch(&'a mut [u8], &'a str),
}

/// One kernel array argument.
#[derive(Debug)]
struct Spec<'a> {
    source: Source<'a>,
    elem_size: usize,
    output: bool,
}

impl<'a> Spec<'a> {
    fn input(source: Source<'a>, elem_size: usize) -> Self {
        Spec {
            source,
            elem_size,
            output: false,
        }
    }
    fn output(source: Source<'a>, elem_size: usize) -> Self {
        Spec {
            source,
            elem_size,
            output: true,
        }
    }
    fn key(&self, observation: &str) -> Option<BufferKey> {
        match self.source {
            Source::Absent => None,
            Source::DetData(n) => Some(BufferKey::new(observation, Category::DetData, n)),
            Source::Shared(n) => Some(BufferKey::new(observation, Category::Shared, n)),
            Source::Global(n) => Some(BufferKey::global(n)),
            Source::Scratch(_, n) => Some(crate::exec::movement::scratch_key(n)),
        }
    }
    fn is_scratch(&self) -> bool {
        matches!(self.source, Source::Scratch(..))
    }
}

/// The common part of one kernel call: an observation (or none) and the
/// data-level metadata.
struct Target<'a> {
    ob: Option<&'a mut Observation>,
    meta: &'a mut Meta,
}

impl Target<'_> {
    fn obs_name(&self) -> String {
        self.ob
            .as_ref()
            .map(|o| o.name().to_string())
            .unwrap_or_default()
    }

    fn missing_obs(what: &str) -> OpError {
        OpError::KernelArgument {
            argument: what.to_string(),
            problem: "needs an observation".into(),
        }
    }

    fn bytes<'s>(&'s self, s: &'s Source<'_>) -> Result<&'s [u8], OpError> {
        Ok(match s {
            Source::Absent => &[],
            Source::DetData(n) => self
                .ob
                .as_ref()
                .ok_or_else(|| Self::missing_obs(n))?
                .field_bytes(Category::DetData, n)?,
            Source::Shared(n) => self
                .ob
                .as_ref()
                .ok_or_else(|| Self::missing_obs(n))?
                .field_bytes(Category::Shared, n)?,
            Source::Global(n) => global_bytes(self.meta, n).ok_or_else(|| no_global(n))?,
            Source::Scratch(b, _) => b,
        })
    }

    fn bytes_mut<'s>(&'s mut self, s: &'s mut Source<'_>) -> Result<&'s mut [u8], OpError> {
        Ok(match s {
            Source::Absent => &mut [],
            Source::DetData(n) => self
                .ob
                .as_mut()
                .ok_or_else(|| Self::missing_obs(n))?
                .field_bytes_mut(Category::DetData, n)?,
            Source::Shared(n) => self
                .ob
                .as_mut()
                .ok_or_else(|| Self::missing_obs(n))?
                .field_bytes_mut(Category::Shared, n)?,
            Source::Global(n) => global_bytes_mut(self.meta, n).ok_or_else(|| no_global_mut(n))?,
            Source::Scratch(b, _) => b,
        })
    }
}

fn no_global(name: &str) -> OpError {
    OpError::Global {
        key: name.to_string(),
        problem: "missing, or not usable as a kernel array (a map, a pixel distribution or a \
                  host array)"
            .into(),
    }
}

fn no_global_mut(name: &str) -> OpError {
    OpError::Global {
        key: name.to_string(),
        problem: "cannot be written by a kernel (missing, or read-only)".into(),
    }
}

/// Run one kernel (the one whose argument struct `make` builds, from the
/// resolved kernel arrays in the order of `specs`).
fn launch<A: KernelArgs>(
    ctx: &mut ExecContext,
    operator: &str,
    detectors: &[String],
    mut target: Target<'_>,
    mut specs: Vec<Spec<'_>>,
    make: impl FnOnce(&[abi::Array]) -> A,
) -> Result<(), OpError> {
    let kernel = A::KERNEL;
    let observation = target.obs_name();
    let wrap = |backend: &str, source: AccelError| {
        OpError::Other(Box::new(KernelError {
            operator: operator.to_string(),
            kernel,
            backend: backend.to_string(),
            observation: observation.clone(),
            detectors: detectors.to_vec(),
            source,
        }))
    };
    let resolved = ctx
        .ext::<Dispatcher>()?
        .resolve(kernel, Some(operator))
        .map_err(|e| wrap("", e))?;
    let backend = Arc::clone(&resolved.backend);
    let timer = resolved.timer_name();

    // The same field twice would alias an output with another argument
    // (the same input twice, e.g. `r · r`, is harmless).
    for (i, s) in specs.iter().enumerate() {
        if let Some(k) = s.key(&observation) {
            if specs[..i]
                .iter()
                .any(|o| (o.output || s.output) && o.key(&observation).as_ref() == Some(&k))
            {
                return Err(OpError::KernelCall {
                    operator: operator.to_string(),
                    kernel: kernel.to_string(),
                    problem: format!("{k} was given for two arguments"),
                });
            }
        }
    }

    let host_addressable = backend.host_addressable();
    // The rows of each detdata argument a streamed scope's device buffer
    // holds (see `movement::window`): the copies below move those rows,
    // and a device step's call sees them as the whole field (`rows`).
    let windows: Vec<Option<RowWindow>> = specs
        .iter()
        .map(|s| match (&s.source, s.key(&observation)) {
            (Source::DetData(_), Some(k)) => DataMovement::for_call(ctx).window(&k),
            _ => None,
        })
        .collect();
    let seen: Vec<Option<RowWindow>> = windows
        .iter()
        .map(|w| w.filter(|_| ctx.use_accel))
        .collect();
    let movement = DataMovement::for_call(ctx);
    let staged = movement.staged_on(&backend);

    // Keep the staged copies truthful (see the module documentation).
    for (s, w) in specs
        .iter_mut()
        .zip(&windows)
        .filter(|(s, _)| !s.is_scratch())
    {
        let Some(key) = s.key(&observation) else {
            continue;
        };
        let sync = movement.sync_for_call(&key, staged);
        match sync {
            CallSync::None => {}
            CallSync::Upload => {
                let b = target.bytes(&s.source)?;
                let r = host_range(w.as_ref(), b.len(), &key)?;
                movement.upload_for_call(kernel, &key, &b[r])?;
            }
            CallSync::Download => {
                let b = target.bytes_mut(&mut s.source)?;
                let r = host_range(w.as_ref(), b.len(), &key)?;
                movement.download_for_call(kernel, &key, &mut b[r])?;
            }
        }
    }

    // Host addresses. No Rust reference to these buffers lives past this
    // loop, and `target` is borrowed mutably for the whole call, so nothing
    // else can move or reallocate them before the kernel returns.
    let mut host: Vec<(*mut u8, usize)> = Vec::with_capacity(specs.len());
    for (s, w) in specs.iter_mut().zip(&seen) {
        // Named only when windowed (the one case that can fail).
        let what = w.and_then(|_| s.key(&observation));
        let what = what.map(|k| k.to_string()).unwrap_or_default();
        if s.output {
            let b = target.bytes_mut(&mut s.source)?;
            let r = host_range(w.as_ref(), b.len(), &what)?;
            let b = &mut b[r];
            host.push((b.as_mut_ptr(), b.len()));
        } else {
            let b = target.bytes(&s.source)?;
            let r = host_range(w.as_ref(), b.len(), &what)?;
            let b = &b[r];
            host.push((b.as_ptr() as *mut u8, b.len()));
        }
    }

    let mut arrays = Vec::with_capacity(specs.len());
    let mut unstaged: Vec<(String, bool, u64)> = Vec::new();
    let mut temporaries: Vec<ArrayArg<'_>> = Vec::new();
    for (s, &(ptr, bytes)) in specs.iter().zip(&host) {
        let len = (bytes / s.elem_size.max(1)) as u64;
        if matches!(s.source, Source::Absent) || bytes == 0 {
            arrays.push(abi::Array::ABSENT);
            continue;
        }
        if host_addressable {
            arrays.push(abi::Array {
                ptr: ptr as u64,
                len,
            });
            continue;
        }
        let key = s.key(&observation);
        if staged {
            if let Some(key) = key.as_ref() {
                let view =
                    DataMovement::for_call(ctx).device_array(key, bytes as u64, s.is_scratch())?;
                if let Some(view) = view {
                    if view.bytes != bytes as u64 {
                        return Err(OpError::KernelCall {
                            operator: operator.to_string(),
                            kernel: kernel.to_string(),
                            problem: format!(
                                "device buffer {key} has {} bytes, its host data {bytes}",
                                view.bytes
                            ),
                        });
                    }
                    arrays.push(abi::Array {
                        ptr: view.handle,
                        len,
                    });
                    continue;
                }
            }
        }
        // Not staged: a temporary device copy.
        let name = key.as_ref().map(|k| k.to_string()).unwrap_or_default();
        let arg = if s.output {
            // SAFETY: `ptr` addresses `bytes` bytes of a host buffer that no
            // other live reference points into (distinct arguments are
            // distinct allocations, checked above), valid for the call.
            let slice = unsafe { std::slice::from_raw_parts_mut(ptr, bytes) };
            ArrayArg::output::<u8>(&backend, slice, &name)
        } else {
            // SAFETY: `ptr` addresses `bytes` bytes of a host buffer that stays valid for the call
            // (`target` is borrowed throughout); it is only read, and no output points into it (a
            // field given as an output and another argument is refused above).
            let slice = unsafe { std::slice::from_raw_parts(ptr as *const u8, bytes) };
            ArrayArg::input::<u8>(&backend, slice, &name)
        }
        .map_err(|e| wrap(backend.name(), e))?;
        let a = arg.abi();
        arrays.push(abi::Array { ptr: a.ptr, len });
        if !s.is_scratch() {
            let stat = key.map(|k| k.stat_name()).unwrap_or_default();
            unstaged.push((stat.clone(), true, bytes as u64));
            if s.output {
                unstaged.push((stat, false, bytes as u64));
            }
        }
        temporaries.push(arg);
    }

    let args = make(&arrays);
    let t0 = Instant::now();
    // SAFETY: every array is a host address valid for its length (host-
    // addressable backend), a live handle of this backend from the staged
    // buffers or a temporary `ArrayArg`, each sized by its host data; the
    // small host arrays the argument struct points to are owned by the caller
    // and outlive this call; no other code touches the outputs meanwhile.
    let result = unsafe { backend.launch(&args) };
    let seconds = t0.elapsed().as_secs_f64();
    ctx.timers.record(&timer, seconds, 1);
    if result.is_ok() {
        ctx.ext::<Dispatcher>()?
            .record(kernel, backend.name(), seconds);
    }
    result.map_err(|e| wrap(backend.name(), e))?;
    for t in temporaries {
        t.finish().map_err(|e| wrap(backend.name(), e))?;
    }
    let movement = DataMovement::for_call(ctx);
    for (name, up, bytes) in unstaged {
        movement.count_unstaged(&name, up, bytes, kernel);
    }

    // Outputs now newest where the kernel wrote them.
    let outputs: Vec<BufferKey> = specs
        .iter()
        .filter(|s| s.output && !s.is_scratch())
        .filter_map(|s| s.key(&observation))
        .collect();
    movement.after_call(&outputs, staged)?;
    Ok(())
}

/// What every per-detector kernel call needs: the calling operator, the
/// detectors (rows are looked up by name in each field), and the sample
/// intervals, `[first, last)`.
#[derive(Debug, Clone, Copy)]
pub struct KernelCall<'a> {
    /// Operator name (dispatch and timer name).
    pub operator: &'a str,
    /// Detectors to process, in order.
    pub detectors: &'a [String],
    /// Intervals to process, in order.
    pub intervals: &'a [abi::SampleRange],
}

impl KernelCall<'_> {
    fn intervals(&self) -> abi::SampleRanges {
        abi::SampleRanges {
            ptr: self.intervals.as_ptr(),
            len: self.intervals.len() as u64,
        }
    }
}

/// The sample intervals of a view (`None`: the whole observation), as
/// kernel intervals.
pub fn view_intervals(
    ob: &Observation,
    view: Option<&str>,
) -> Result<Vec<abi::SampleRange>, OpError> {
    let list = match view {
        Some(v) => ob.intervals.get(v)?.clone(),
        None => {
            return Ok(vec![abi::SampleRange {
                first: 0,
                last: ob.n_samples() as i64,
            }])
        }
    };
    Ok(list
        .iter()
        .map(|iv| abi::SampleRange {
            first: iv.first,
            last: iv.last,
        })
        .collect())
}

/// Rows of `dets` in the detdata field `field` (checked for type and
/// per-sample shape), as the call sees the field: counted from the first
/// row of its device window in a device step of a streamed scope
/// ([`crate::exec::movement::window`]; a detector outside it is an error),
/// else from the field's first row.
fn rows<T: Element>(
    ctx: &ExecContext,
    ob: &Observation,
    field: &str,
    shape: &[usize],
    dets: &[String],
) -> Result<Vec<i32>, OpError> {
    let f = ob.detdata.get(field)?;
    f.check::<T>(shape)?;
    let window = crate::exec::movement::step_window(ctx, ob.name(), field);
    dets.iter()
        .map(|d| {
            let r = f.row_index(d).ok_or_else(|| {
                OpError::Data(toast_core::DataError::MissingDetector {
                    observation: ob.name().to_string(),
                    where_: format!("detdata '{field}'"),
                    detector: d.clone(),
                })
            })?;
            let r = match &window {
                Some(w) => crate::exec::movement::window::row_in(w, r, ob.name(), field, d)?,
                None => r,
            };
            Ok(r as i32)
        })
        .collect()
}

fn check_shared<T: Element>(ob: &Observation, name: &str, shape: &[usize]) -> Result<(), OpError> {
    let f = ob.shared.get(name)?;
    f.check::<T>(shape)?;
    if f.n_rows() != ob.n_samples() {
        return Err(OpError::InvalidData {
            what: format!(
                "observation '{}': shared field '{name}' has {} rows, expected one per sample ({})",
                ob.name(),
                f.n_rows(),
                ob.n_samples()
            ),
        });
    }
    Ok(())
}

fn shared_flags<'a>(
    ob: &Observation,
    flags: Option<(&'a str, u8)>,
) -> Result<(Source<'a>, u8), OpError> {
    match flags {
        Some((name, mask)) if mask != 0 => {
            check_shared::<u8>(ob, name, &[])?;
            Ok((Source::Shared(name), mask))
        }
        _ => Ok((Source::Absent, 0)),
    }
}

/// `pointing_detector`: detector quaternions `quats` = boresight ⊗ focalplane
/// offset (identity boresight on samples with `shared_flags & mask`).
pub fn pointing_detector(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    boresight: &str,
    shared_flag: Option<(&str, u8)>,
    quats: &str,
) -> Result<(), OpError> {
    check_shared::<f64>(ob, boresight, &[4])?;
    let quat_index = rows::<f64>(ctx, ob, quats, &[4], call.detectors)?;
    let mut fp = Vec::with_capacity(4 * call.detectors.len());
    for d in call.detectors {
        fp.extend_from_slice(&ob.detector(d)?.quat);
    }
    let (flags, mask) = shared_flags(ob, shared_flag)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Shared(boresight), 8),
        Spec::input(flags, 1),
        Spec::output(Source::DetData(quats), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::PointingDetectorArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            quat_index: quat_index.as_ptr(),
            focalplane: fp.as_ptr(),
            intervals: call.intervals(),
            boresight: a[0],
            shared_flags: a[1],
            shared_flag_mask: mask,
            reserved: [0; 7],
            quats: a[2],
        },
    )
}

/// A host index array's pointer, null when it is empty (an index the
/// kernel reads only with an absent optional array).
fn ptr_or_null(v: &[i32]) -> *const i32 {
    if v.is_empty() {
        std::ptr::null()
    } else {
        v.as_ptr()
    }
}

/// HEALPix parameters of `pixels_healpix`.
#[derive(Debug, Clone, Copy)]
pub struct HealpixParams {
    /// Resolution (a power of two).
    pub nside: i64,
    /// Pixels per submap.
    pub n_pix_submap: i64,
    /// NESTED (true) or RING ordering.
    pub nest: bool,
}

/// `pixels_healpix`: pixel numbers from detector quaternions; `-1` on
/// samples with `shared_flags & mask`. `hit_submaps` (one byte per submap,
/// set to 1 where a sample falls) is scratch named `hits_name`: its host
/// contents are updated by a host-addressable backend (or a call without a
/// device scope), else the scope's device copy accumulates them
/// ([`crate::exec::movement::take_scratch`] reads it).
///
/// An i32 `pixels` field gets the compact pointing's pixels (ABI minor 8's
/// `pixels_i32`: the same pixels, 4 bytes a sample); the backend the call
/// resolves to must write them ([`toast_accel::host::Backend::writes_i32_pixels`]),
/// else the call is refused before it is made.
#[allow(clippy::too_many_arguments)]
pub fn pixels_healpix(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    quats: &str,
    shared_flag: Option<(&str, u8)>,
    pixels: &str,
    params: HealpixParams,
    hit_submaps: &mut [u8],
    hits_name: &str,
) -> Result<(), OpError> {
    let quat_index = rows::<f64>(ctx, ob, quats, &[4], call.detectors)?;
    let pixels_i32 = ob.detdata.get(pixels)?.dtype() == DType::I32;
    let pixel_index = if pixels_i32 {
        let resolved = ctx
            .ext::<Dispatcher>()?
            .resolve(abi::Kernel::PixelsHealpix, Some(call.operator))
            .map_err(|e| OpError::KernelCall {
                operator: call.operator.to_string(),
                kernel: abi::Kernel::PixelsHealpix.to_string(),
                problem: e.to_string(),
            })?;
        if !resolved.backend.writes_i32_pixels() {
            return Err(OpError::KernelCall {
                operator: call.operator.to_string(),
                kernel: abi::Kernel::PixelsHealpix.to_string(),
                problem: format!(
                    "backend {} (ABI minor {}) cannot write i32 pixels into `{pixels}` (the \
                     compact pointing needs a plugin of ABI minor 8 or later)",
                    resolved.backend.name(),
                    resolved.backend.plugin().abi_minor
                ),
            });
        }
        rows::<i32>(ctx, ob, pixels, &[], call.detectors)?
    } else {
        rows::<i64>(ctx, ob, pixels, &[], call.detectors)?
    };
    let (flags, mask) = shared_flags(ob, shared_flag)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::DetData(quats), 8),
        Spec::input(flags, 1),
        Spec::output(Source::DetData(pixels), if pixels_i32 { 4 } else { 8 }),
        Spec::output(Source::Scratch(hit_submaps, hits_name), 1),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::PixelsHealpixArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            quat_index: quat_index.as_ptr(),
            pixel_index: pixel_index.as_ptr(),
            intervals: call.intervals(),
            quats: a[0],
            shared_flags: a[1],
            pixels: a[2],
            hit_submaps: a[3],
            nside: params.nside,
            n_pix_submap: params.n_pix_submap,
            shared_flag_mask: mask,
            nest: u8::from(params.nest),
            pixels_i32: u8::from(pixels_i32),
            reserved: [0; 5],
        },
    )
}

/// `stokes_weights_I`: `weights[d, s] = cal[d]`.
pub fn stokes_weights_i(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    weights: &str,
    cal: &[f64],
) -> Result<(), OpError> {
    let weight_index = rows::<f64>(ctx, ob, weights, &[1], call.detectors)?;
    check_len("cal", cal.len(), call.detectors.len())?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![Spec::output(Source::DetData(weights), 8)];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::StokesWeightsIArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            weight_index: weight_index.as_ptr(),
            cal: cal.as_ptr(),
            intervals: call.intervals(),
            weights: a[0],
        },
    )
}

fn check_len(what: &str, got: usize, expected: usize) -> Result<(), OpError> {
    if got != expected {
        return Err(OpError::KernelArgument {
            argument: what.to_string(),
            problem: format!("{got} entries for {expected} detectors"),
        });
    }
    Ok(())
}

/// Per-detector parameters of `stokes_weights_IQU`.
#[derive(Debug, Clone, Copy)]
pub struct IquParams<'a> {
    /// Cross-polar leakage per detector.
    pub epsilon: &'a [f64],
    /// Polarisation angle `gamma` per detector (used with a HWP).
    pub gamma: &'a [f64],
    /// Calibration per detector.
    pub cal: &'a [f64],
    /// IAU convention (U sign flipped).
    pub iau: bool,
}

/// `stokes_weights_IQU`: I, Q, U weights from detector quaternions and an
/// optional HWP angle (shared field).
#[allow(clippy::too_many_arguments)]
pub fn stokes_weights_iqu(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    quats: &str,
    weights: &str,
    hwp_angle: Option<&str>,
    params: IquParams<'_>,
) -> Result<(), OpError> {
    let quat_index = rows::<f64>(ctx, ob, quats, &[4], call.detectors)?;
    let weight_index = rows::<f64>(ctx, ob, weights, &[3], call.detectors)?;
    let n = call.detectors.len();
    check_len("epsilon", params.epsilon.len(), n)?;
    check_len("gamma", params.gamma.len(), n)?;
    check_len("cal", params.cal.len(), n)?;
    let hwp = match hwp_angle {
        Some(h) => {
            check_shared::<f64>(ob, h, &[])?;
            Source::Shared(h)
        }
        None => Source::Absent,
    };
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::DetData(quats), 8),
        Spec::input(hwp, 8),
        Spec::output(Source::DetData(weights), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::StokesWeightsIquArgs {
            n_det: n as u64,
            n_samp,
            quat_index: quat_index.as_ptr(),
            weight_index: weight_index.as_ptr(),
            epsilon: params.epsilon.as_ptr(),
            gamma: params.gamma.as_ptr(),
            cal: params.cal.as_ptr(),
            intervals: call.intervals(),
            quats: a[0],
            hwp: a[1],
            weights: a[2],
            iau: u8::from(params.iau),
            reserved: [0; 7],
        },
    )
}

/// The element type code and nnz of the map stored at `key`.
fn map_info(meta: &Meta, key: &str) -> Result<(i32, usize, Arc<PixelDistribution>), OpError> {
    macro_rules! probe {
        ($t:ty, $code:expr) => {
            if let Ok(m) = meta.object::<PixelData<$t>>(key) {
                return Ok(($code, m.n_value(), Arc::clone(m.distribution())));
            }
        };
    }
    probe!(f64, abi::DTYPE_F64);
    probe!(f32, abi::DTYPE_F32);
    probe!(i64, abi::DTYPE_I64);
    probe!(i32, abi::DTYPE_I32);
    Err(OpError::Global {
        key: key.to_string(),
        problem: "missing, or not a map (a PixelData of f64, f32, i64 or i32)".into(),
    })
}

/// The pixel distribution at `dist_key`, checked against a map's.
fn dist_for_map(
    meta: &Meta,
    dist_key: &str,
    map_key: &str,
    map_dist: &PixelDistribution,
) -> Result<Arc<PixelDistribution>, OpError> {
    let d = meta.object::<Arc<PixelDistribution>>(dist_key)?;
    if **d != *map_dist {
        return Err(OpError::Global {
            key: map_key.to_string(),
            problem: format!("the map does not use the pixel distribution '{dist_key}'"),
        });
    }
    Ok(Arc::clone(d))
}

/// How `scan_map` combines the scanned value `v` with the timestream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanMode {
    /// Zero the timestream over the intervals first.
    pub zero: bool,
    /// `d -= v` (takes priority over `scale`).
    pub subtract: bool,
    /// `d *= v`.
    pub scale: bool,
}

/// Fields read by `scan_map` and `build_noise_weighted`.
#[derive(Debug, Clone, Copy)]
pub struct PointingFields<'a> {
    /// Pixel numbers (i64).
    pub pixels: &'a str,
    /// Stokes weights (f64 × nnz).
    pub weights: &'a str,
    /// The global key of the pixel distribution of the map.
    pub pixel_dist: &'a str,
}

/// `scan_map`: `det_data (+= | -= | *=) data_scale · Σ_k weights_k · map_k`.
#[allow(clippy::too_many_arguments)]
pub fn scan_map(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    map_key: &str,
    pointing: PointingFields<'_>,
    det_data: &str,
    data_scale: f64,
    mode: ScanMode,
) -> Result<(), OpError> {
    let (dtype, nnz, map_dist) = map_info(meta, map_key)?;
    let dist = dist_for_map(meta, pointing.pixel_dist, map_key, &map_dist)?;
    let pixel_index = rows::<i64>(ctx, ob, pointing.pixels, &[], call.detectors)?;
    let weight_index = rows::<f64>(ctx, ob, pointing.weights, &[nnz], call.detectors)?;
    let data_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    let n_samp = ob.n_samples() as u64;
    let map_elem = match dtype {
        abi::DTYPE_F64 | abi::DTYPE_I64 => 8,
        _ => 4,
    };
    let specs = vec![
        Spec::input(Source::Global(pointing.pixel_dist), 8),
        Spec::input(Source::Global(map_key), map_elem),
        Spec::input(Source::DetData(pointing.pixels), 8),
        Spec::input(Source::DetData(pointing.weights), 8),
        Spec::output(Source::DetData(det_data), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::ScanMapArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            nnz: nnz as u64,
            pixel_index: pixel_index.as_ptr(),
            weight_index: weight_index.as_ptr(),
            data_index: data_index.as_ptr(),
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap: dist.n_pix_submap(),
            map_dtype: dtype,
            reserved0: 0,
            mapdata: a[1],
            pixels: a[2],
            weights: a[3],
            det_data: a[4],
            data_scale,
            should_zero: u8::from(mode.zero),
            should_subtract: u8::from(mode.subtract),
            should_scale: u8::from(mode.scale),
            reserved: [0; 5],
        },
    )
}

/// `build_noise_weighted`: accumulate `det_scale · det_data · weights` into
/// the f64 map `zmap_key` over unflagged samples with a valid pixel.
#[allow(clippy::too_many_arguments)]
pub fn build_noise_weighted(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    zmap_key: &str,
    pointing: PointingFields<'_>,
    det_data: &str,
    det_flags: Option<(&str, u8)>,
    shared_flag: Option<(&str, u8)>,
    det_scale: &[f64],
) -> Result<(), OpError> {
    let (dtype, nnz, map_dist) = map_info(meta, zmap_key)?;
    if dtype != abi::DTYPE_F64 {
        return Err(OpError::Global {
            key: zmap_key.to_string(),
            problem: "the noise-weighted map must hold f64 values".into(),
        });
    }
    let dist = dist_for_map(meta, pointing.pixel_dist, zmap_key, &map_dist)?;
    check_len("det_scale", det_scale.len(), call.detectors.len())?;
    let pixel_index = rows::<i64>(ctx, ob, pointing.pixels, &[], call.detectors)?;
    let weight_index = rows::<f64>(ctx, ob, pointing.weights, &[nnz], call.detectors)?;
    let data_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    let (dflags, dmask, flag_index) = match det_flags {
        Some((name, mask)) if mask != 0 => (
            Source::DetData(name),
            mask,
            rows::<u8>(ctx, ob, name, &[], call.detectors)?,
        ),
        _ => (Source::Absent, 0, vec![-1; call.detectors.len()]),
    };
    let (sflags, smask) = shared_flags(ob, shared_flag)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Global(pointing.pixel_dist), 8),
        Spec::input(Source::DetData(pointing.pixels), 8),
        Spec::input(Source::DetData(pointing.weights), 8),
        Spec::input(Source::DetData(det_data), 8),
        Spec::input(dflags, 1),
        Spec::input(sflags, 1),
        Spec::output(Source::Global(zmap_key), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::BuildNoiseWeightedArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            nnz: nnz as u64,
            pixel_index: pixel_index.as_ptr(),
            weight_index: weight_index.as_ptr(),
            data_index: data_index.as_ptr(),
            flag_index: flag_index.as_ptr(),
            det_scale: det_scale.as_ptr(),
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap: dist.n_pix_submap(),
            pixels: a[1],
            weights: a[2],
            det_data: a[3],
            det_flags: a[4],
            shared_flags: a[5],
            zmap: a[6],
            det_flag_mask: dmask,
            shared_flag_mask: smask,
            reserved: [0; 6],
        },
    )
}

/// `noise_weight`: `det_data[d, s] *= detector_weights[d]`.
pub fn noise_weight(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    det_data: &str,
    detector_weights: &[f64],
) -> Result<(), OpError> {
    check_len(
        "detector_weights",
        detector_weights.len(),
        call.detectors.len(),
    )?;
    let data_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![Spec::output(Source::DetData(det_data), 8)];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::NoiseWeightArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            data_index: data_index.as_ptr(),
            detector_weights: detector_weights.as_ptr(),
            intervals: call.intervals(),
            det_data: a[0],
        },
    )
}

/// The noise streams of a `sim_noise` call: the Fourier amplitudes (one
/// table of `fft_len / 2 + 1` values per distinct noise model, flat) and
/// per detector its table and Threefry key (TOAST's layout,
/// `crate::sim::noise::NoiseKey`).
#[derive(Debug, Clone, Copy)]
pub struct NoiseStreams<'a> {
    /// `N`, a power of two above the observation's samples.
    pub fft_len: u64,
    /// Low counter word of deviate 0 (`first_sample * oversample`).
    pub counter0: u64,
    /// `[n_filter][fft_len / 2 + 1]`.
    pub amplitudes: &'a [f64],
    /// Per detector, its row of `amplitudes`.
    pub filter_index: &'a [i32],
    /// Per detector, two key words.
    pub keys: &'a [u64],
}

/// `sim_noise`: `det_data[d] += ` detector `d`'s noise stream (TOAST's
/// `tod_sim_noise_timestream`), on the backend the dispatcher picks; on a
/// device the stream is made there (Threefry, the Gaussian transform and the
/// inverse FFT) and never crosses the bus.
pub fn sim_noise(
    ctx: &mut ExecContext,
    operator: &str,
    detectors: &[String],
    ob: &mut Observation,
    meta: &mut Meta,
    det_data: &str,
    streams: NoiseStreams<'_>,
) -> Result<(), OpError> {
    check_len("filter_index", streams.filter_index.len(), detectors.len())?;
    check_len("keys", streams.keys.len(), 2 * detectors.len())?;
    let n_amp = streams.fft_len / 2 + 1;
    let n_filter = streams.amplitudes.len() as u64 / n_amp.max(1);
    let data_index = rows::<f64>(ctx, ob, det_data, &[], detectors)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![Spec::output(Source::DetData(det_data), 8)];
    launch(
        ctx,
        operator,
        detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::SimNoiseArgs {
            n_det: detectors.len() as u64,
            n_samp,
            fft_len: streams.fft_len,
            n_filter,
            counter0: streams.counter0,
            data_index: data_index.as_ptr(),
            filter_index: streams.filter_index.as_ptr(),
            keys: streams.keys.as_ptr(),
            amplitudes: streams.amplitudes.as_ptr(),
            det_data: a[0],
        },
    )
}

/// The amplitude layout of the offset template in one observation: the step
/// length, the number of amplitudes of each interval (view), and where each
/// detector's block starts in the amplitude vector.
#[derive(Debug, Clone, Copy)]
pub struct OffsetLayout<'a> {
    /// Samples per amplitude.
    pub step_length: i64,
    /// Amplitudes per interval (`ceil(len / step_length)`).
    pub n_amp_views: &'a [i64],
    /// First amplitude of each detector's block.
    pub amp_offset: &'a [i64],
}

impl OffsetLayout<'_> {
    fn abi(&self) -> abi::OffsetLayout {
        abi::OffsetLayout {
            step_length: self.step_length,
            n_amp_views: self.n_amp_views.as_ptr(),
            amp_offset: self.amp_offset.as_ptr(),
        }
    }
}

/// Global keys of an amplitude vector and its flags.
#[derive(Debug, Clone, Copy)]
pub struct AmplitudeKeys<'a> {
    /// Amplitudes (`HostArray<f64>`).
    pub amplitudes: &'a str,
    /// Flags (`HostArray<u8>`, non-zero: not used).
    pub flags: &'a str,
}

/// `template_offset_add_to_signal`: `det_data += amplitude` of each sample's
/// step, for unflagged amplitudes.
pub fn offset_add_to_signal(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    layout: OffsetLayout<'_>,
    amps: AmplitudeKeys<'_>,
    det_data: &str,
) -> Result<(), OpError> {
    check_len("amp_offset", layout.amp_offset.len(), call.detectors.len())?;
    let data_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Global(amps.amplitudes), 8),
        Spec::input(Source::Global(amps.flags), 1),
        Spec::output(Source::DetData(det_data), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::TemplateOffsetAddArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            data_index: data_index.as_ptr(),
            layout: layout.abi(),
            intervals: call.intervals(),
            amplitudes: a[0],
            amplitude_flags: a[1],
            det_data: a[2],
        },
    )
}

/// `template_offset_project_signal`: accumulate each step's unflagged
/// samples (`flags & mask == 0`) into its (unflagged) amplitude.
#[allow(clippy::too_many_arguments)]
pub fn offset_project_signal(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    layout: OffsetLayout<'_>,
    det_data: &str,
    det_flags: Option<(&str, u8)>,
    amps: AmplitudeKeys<'_>,
) -> Result<(), OpError> {
    check_len("amp_offset", layout.amp_offset.len(), call.detectors.len())?;
    let data_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    let (flags, mask, flag_index) = match det_flags {
        Some((name, mask)) => (
            Source::DetData(name),
            mask,
            rows::<u8>(ctx, ob, name, &[], call.detectors)?,
        ),
        None => (Source::Absent, 0, vec![-1; call.detectors.len()]),
    };
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::DetData(det_data), 8),
        Spec::input(flags, 1),
        Spec::output(Source::Global(amps.amplitudes), 8),
        Spec::input(Source::Global(amps.flags), 1),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::TemplateOffsetProjectArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            data_index: data_index.as_ptr(),
            flag_index: flag_index.as_ptr(),
            layout: layout.abi(),
            intervals: call.intervals(),
            det_data: a[0],
            flag_data: a[1],
            amplitudes: a[2],
            amplitude_flags: a[3],
            flag_mask: mask,
            reserved: [0; 7],
        },
    )
}

/// [`launch`] for a kernel whose arrays are all global items (no
/// observation, no detectors).
fn launch_global<A: KernelArgs>(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    specs: Vec<Spec<'_>>,
    make: impl FnOnce(&[abi::Array]) -> A,
) -> Result<(), OpError> {
    launch(ctx, operator, &[], Target { ob: None, meta }, specs, make)
}

/// The number of `elem`-byte elements of the global item `key`.
fn global_len(meta: &Meta, key: &str, elem: usize) -> Result<usize, OpError> {
    Ok(global_bytes(meta, key).ok_or_else(|| no_global(key))?.len() / elem)
}

/// The most partial sums of one device `amp_dot` (each block one device
/// thread summing in index order).
pub const AMP_DOT_DEVICE_BLOCKS: usize = 256;

/// The number of partial sums [`amp_dot`] should produce on the backend
/// that `operator`'s `amp_dot` resolves to: 1 on a host-addressable backend
/// (the plain sequential sum, the CPU path's bits; also without a
/// dispatcher), else one per 4096 entries, at most [`AMP_DOT_DEVICE_BLOCKS`]
/// (2 KiB to download per dot product, whatever the number of amplitudes).
pub fn amp_dot_blocks(ctx: &ExecContext, operator: &str, n: usize) -> Result<usize, OpError> {
    let Some(dispatcher) = ctx.extensions.get::<Dispatcher>() else {
        return Ok(1);
    };
    let resolved = dispatcher
        .resolve(abi::Kernel::AmpDot, Some(operator))
        .map_err(|e| OpError::KernelCall {
            operator: operator.to_string(),
            kernel: abi::Kernel::AmpDot.to_string(),
            problem: e.to_string(),
        })?;
    Ok(if resolved.backend.host_addressable() {
        1
    } else {
        n.div_ceil(4096).clamp(1, AMP_DOT_DEVICE_BLOCKS)
    })
}

/// `amp_dot`: `partials[k]` the flagged dot product of block `k` of the
/// global amplitude vectors `a` and `b` (`HostArray<f64>`s, flags the
/// `HostArray<u8>` `flags`); the number of blocks is the length of the
/// global `partials` (see [`amp_dot_blocks`]).
pub fn amp_dot(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    (a, b, flags): (&str, &str, &str),
    partials: &str,
) -> Result<(), OpError> {
    let n = global_len(meta, a, 8)?;
    let nblock = global_len(meta, partials, 8)?;
    let specs = vec![
        Spec::input(Source::Global(a), 8),
        Spec::input(Source::Global(b), 8),
        Spec::input(Source::Global(flags), 1),
        Spec::output(Source::Global(partials), 8),
    ];
    launch_global(ctx, operator, meta, specs, |arr| abi::AmpDotArgs {
        n: n as i64,
        nblock: nblock as i64,
        a: arr[0],
        b: arr[1],
        flags: arr[2],
        partials: arr[3],
    })
}

/// `amp_axpby`: `y ← (α x) + (β y)` on global `HostArray<f64>`s.
pub fn amp_axpby(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    (alpha, x): (f64, &str),
    (beta, y): (f64, &str),
) -> Result<(), OpError> {
    let n = global_len(meta, y, 8)?;
    let specs = vec![
        Spec::input(Source::Global(x), 8),
        Spec::output(Source::Global(y), 8),
    ];
    launch_global(ctx, operator, meta, specs, |arr| abi::AmpAxpbyArgs {
        n: n as i64,
        alpha,
        beta,
        x: arr[0],
        y: arr[1],
    })
}

/// A whole float64 detdata field of `ob` copied into `output`, a field of
/// the same rows and samples, by `amp_axpby` (`y ← 1·x` with `β = 0`, which
/// does not read `y`: an exact copy, signed zeros and NaNs included): the
/// device-to-device copy of a work timestream, where the data live.
pub fn copy_detdata(
    ctx: &mut ExecContext,
    operator: &str,
    ob: &mut Observation,
    meta: &mut Meta,
    (input, output): (&str, &str),
) -> Result<(), OpError> {
    let n = {
        let (src, dst) = (ob.detdata.get(input)?, ob.detdata.get(output)?);
        if src.dtype() != DType::F64 || dst.dtype() != DType::F64 || src.shape() != dst.shape() {
            return Err(OpError::InvalidData {
                what: format!(
                    "observation '{}': copy of detdata '{input}' into '{output}' on a device: \
                     both must be float64 fields of the same shape",
                    ob.name()
                ),
            });
        }
        // In a streamed scope a device step copies the rows both windows
        // hold (the same rows of fields of the same detectors).
        let window = |f: &str| crate::exec::movement::step_window(ctx, ob.name(), f);
        match (window(input), window(output)) {
            (None, None) => src.as_bytes().len() / 8,
            (Some(a), Some(b)) if (a.first, a.rows) == (b.first, b.rows) => a.bytes().len() / 8,
            (a, b) => {
                let rows = |w: Option<RowWindow>| match w {
                    Some(w) => format!("rows {}..{}", w.first, w.first + w.rows),
                    None => "every row".to_string(),
                };
                return Err(OpError::InvalidData {
                    what: format!(
                        "observation '{}': copy of detdata '{input}' ({}) into '{output}' ({}) \
                         on a device: the device holds different rows of the two fields",
                        ob.name(),
                        rows(a),
                        rows(b)
                    ),
                });
            }
        }
    };
    let specs = vec![
        Spec::input(Source::DetData(input), 8),
        Spec::output(Source::DetData(output), 8),
    ];
    launch(
        ctx,
        operator,
        &[],
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::AmpAxpbyArgs {
            n: n as i64,
            alpha: 1.0,
            beta: 0.0,
            x: a[0],
            y: a[1],
        },
    )
}

/// `template_offset_apply_diag_precond`: `out = flags == 0 ? in · var : 0`,
/// on global `HostArray`s of equal length.
pub fn offset_apply_diag_precond(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    offset_var: &str,
    input: AmplitudeKeys<'_>,
    output: &str,
) -> Result<(), OpError> {
    let n = global_len(meta, offset_var, 8)?;
    let specs = vec![
        Spec::input(Source::Global(offset_var), 8),
        Spec::input(Source::Global(input.amplitudes), 8),
        Spec::input(Source::Global(input.flags), 1),
        Spec::output(Source::Global(output), 8),
    ];
    launch_global(ctx, operator, meta, specs, |a| {
        abi::TemplateOffsetPrecondArgs {
            n_amp: n as u64,
            offset_var: a[0],
            amplitudes_in: a[1],
            amplitude_flags: a[2],
            amplitudes_out: a[3],
        }
    })
}

/// The local map and sample layout of the diagonal-covariance kernels
/// (TOAST's `cov_accum_diag_hits` / `cov_accum_diag_invnpp`): `nsub` local
/// submaps of `nsubpix` pixels, `nnz` map components, and the globals (each
/// a `HostArray<i64>`, one entry per sample) holding every sample's local
/// submap and pixel within it (negative: skipped).
#[derive(Debug, Clone, Copy)]
pub struct CovSamples<'a> {
    /// Local submaps (`< 1`: the call does nothing, as TOAST).
    pub nsub: i64,
    /// Pixels per submap.
    pub nsubpix: i64,
    /// Map components (unused by the hits).
    pub nnz: i64,
    /// The sample's local submap (`HostArray<i64>`).
    pub submap: &'a str,
    /// The sample's pixel within its submap (`HostArray<i64>`).
    pub subpix: &'a str,
}

/// `cov_accum_diag_hits`: `hits[submap * nsubpix + subpix] += 1` per
/// sample; `hits` is a global `i64` map (`PixelData<i64>` or
/// `HostArray<i64>`) of `nsub * nsubpix` elements.
pub fn cov_accum_diag_hits(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    samples: CovSamples<'_>,
    hits: &str,
) -> Result<(), OpError> {
    let specs = vec![
        Spec::input(Source::Global(samples.submap), 8),
        Spec::input(Source::Global(samples.subpix), 8),
        Spec::output(Source::Global(hits), 8),
    ];
    launch_global(ctx, operator, meta, specs, |a| abi::CovAccumDiagHitsArgs {
        nsub: samples.nsub,
        nsubpix: samples.nsubpix,
        nnz: samples.nnz,
        submap: a[0],
        subpix: a[1],
        hits: a[2],
    })
}

/// `cov_accum_diag_invnpp`: accumulate `scale · w wᵀ` (the lower triangle,
/// `nnz (nnz + 1) / 2` elements per pixel) of every sample's `weights`
/// (`HostArray<f64>` `[n_samp, nnz]`) into the global `f64` map `invnpp`.
pub fn cov_accum_diag_invnpp(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    samples: CovSamples<'_>,
    weights: &str,
    scale: f64,
    invnpp: &str,
) -> Result<(), OpError> {
    let specs = vec![
        Spec::input(Source::Global(samples.submap), 8),
        Spec::input(Source::Global(samples.subpix), 8),
        Spec::input(Source::Global(weights), 8),
        Spec::output(Source::Global(invnpp), 8),
    ];
    launch_global(ctx, operator, meta, specs, |a| {
        abi::CovAccumDiagInvnppArgs {
            nsub: samples.nsub,
            nsubpix: samples.nsubpix,
            nnz: samples.nnz,
            submap: a[0],
            subpix: a[1],
            weights: a[2],
            scale,
            invnpp: a[3],
        }
    })
}

/// `cov_apply_diag`: `map ← cov · map` at every local pixel, `map` a global
/// `PixelData<f64>` of `nnz` values per pixel and `cov` one of the packed
/// `nnz (nnz + 1) / 2` on the same distribution (checked here).
pub fn cov_apply_diag(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    cov: &str,
    map: &str,
) -> Result<(), OpError> {
    let (nnz, nsub, nsubpix) = {
        let m = meta.object::<PixelData<f64>>(map)?;
        let c = meta.object::<PixelData<f64>>(cov)?;
        let nnz = m.n_value();
        if c.n_value() != nnz * (nnz + 1) / 2 || c.distribution() != m.distribution() {
            return Err(OpError::Global {
                key: cov.to_string(),
                problem: format!(
                    "a covariance of {} values per pixel{} cannot apply to map '{map}' of {nnz}",
                    c.n_value(),
                    if c.distribution() == m.distribution() {
                        ""
                    } else {
                        " on another pixel distribution"
                    }
                ),
            });
        }
        let d = m.distribution();
        (nnz, d.n_local_submap() as i64, d.n_pix_submap())
    };
    let specs = vec![
        Spec::input(Source::Global(cov), 8),
        Spec::output(Source::Global(map), 8),
    ];
    launch_global(ctx, operator, meta, specs, |a| abi::CovApplyDiagArgs {
        nsub,
        nsubpix,
        nnz: nnz as i64,
        mat: a[0],
        vec: a[1],
    })
}

/// `filter_polynomial`: subtract from each detector's `det_data` (`f64`)
/// the Legendre fit of order `order` to its good samples (`flags`, a shared
/// `u8` field, non-zero: flagged) over each of `call.intervals` in turn (the
/// scans; TOAST clamps them to the observation), as TOAST's `PolyFilter`.
pub fn filter_polynomial(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    order: i64,
    flags: &str,
    det_data: &str,
) -> Result<(), OpError> {
    let signal_index = rows::<f64>(ctx, ob, det_data, &[], call.detectors)?;
    check_shared::<u8>(ob, flags, &[])?;
    let n_samp = ob.n_samples() as u64;
    let starts: Vec<i64> = call.intervals.iter().map(|i| i.first).collect();
    let stops: Vec<i64> = call.intervals.iter().map(|i| i.last).collect();
    let specs = vec![
        Spec::input(Source::Shared(flags), 1),
        Spec::output(Source::DetData(det_data), 8),
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::FilterPolynomialArgs {
            n_signal: call.detectors.len() as u64,
            n_samp,
            n_scan: starts.len() as u64,
            order,
            signal_index: signal_index.as_ptr(),
            starts: starts.as_ptr(),
            stops: stops.as_ptr(),
            flags: a[0],
            signals: a[1],
        },
    )
}

/// The global arrays of a `filter_poly2D` call (`HostArray`s): `signals`
/// (`f64` `[n_samp, n_det]`), `masks` (`u8` `[n_samp, n_det]`, 0: excluded)
/// and the output `coeff` (`f64` `[n_samp, n_group, n_mode]`).
#[derive(Debug, Clone, Copy)]
pub struct Poly2dKeys<'a> {
    pub signals: &'a str,
    pub masks: &'a str,
    pub coeff: &'a str,
}

/// `filter_poly2D`: per sample and detector group, the least-squares
/// coefficients of the group's signals in the detector templates
/// (`templates` `[n_det, n_mode]`, `det_groups` `[n_det]`, negative: in no
/// group), as TOAST's `PolyFilter2D` solves them.
pub fn filter_poly2d(
    ctx: &mut ExecContext,
    operator: &str,
    meta: &mut Meta,
    n_group: usize,
    det_groups: &[i32],
    templates: &[f64],
    keys: Poly2dKeys<'_>,
) -> Result<(), OpError> {
    let n_det = det_groups.len();
    if n_det == 0 || !templates.len().is_multiple_of(n_det) {
        return Err(OpError::KernelArgument {
            argument: "templates".into(),
            problem: format!(
                "{} elements is not [n_det, n_mode] for {n_det} detectors",
                templates.len()
            ),
        });
    }
    let n_mode = templates.len() / n_det;
    let n_samp = global_bytes(meta, keys.signals)
        .ok_or_else(|| no_global(keys.signals))?
        .len()
        / 8
        / n_det;
    let specs = vec![
        Spec::input(Source::Global(keys.signals), 8),
        Spec::input(Source::Global(keys.masks), 1),
        Spec::output(Source::Global(keys.coeff), 8),
    ];
    launch_global(ctx, operator, meta, specs, |a| abi::FilterPoly2dArgs {
        n_samp: n_samp as u64,
        n_det: n_det as u64,
        n_group: n_group as u64,
        n_mode: n_mode as u64,
        det_groups: det_groups.as_ptr(),
        templates: templates.as_ptr(),
        signals: a[0],
        masks: a[1],
        coeff: a[2],
    })
}

/// The element type of a detdata field, for operators that create outputs.
pub fn det_dtype(ob: &Observation, field: &str) -> Result<DType, OpError> {
    Ok(ob.detdata.get(field)?.dtype())
}
