//! Every kernel of the table (`toast_accel::toast_kernels!`): validation, argument marshalling and launch planning
//! for the shared device source (`toast_accel::device_source`), written
//! once for every [`Driver`]; only the driver's `TARGET` (the source's
//! dialect) and its launch call differ between backends.
//!
//! # Launch planning
//!
//! The per-sample kernels run on the source's grid: dimension 0 the sample
//! inside an interval (up to the longest interval), dimension 1 the
//! interval, dimension 2 the detector. One launch covers every detector and
//! interval when no two grid points write the same element. Otherwise the
//! call is split, in the CPU's detector → interval order: one detector per
//! launch when two detectors share an output row, one interval per launch
//! when intervals overlap. `build_noise_weighted` accumulates with atomics
//! and never splits; `template_offset_project_signal` runs one detector per
//! launch when the amplitude blocks of two detectors overlap. Grid
//! dimensions 1 and 2 are cut into chunks of at most 65535 (the hardware
//! limit) with the source's `det0`/`iv0` arguments.
//!
//! The polynomial filters solve their fits in slices of a global workspace
//! (`KernelLaunch::workspace`), since a fit of up to 1024 templates does
//! not fit in a block's shared memory. `filter_polynomial` runs one block
//! per fit (signal and scan). `filter_poly2D` runs three launches per chunk
//! of its (sample, group) grid (`kernels.h`, section 14): a thread per point
//! marks where a group's mask changes (the chunk's first sample is always
//! such a head), a block per head builds and decomposes the normal matrix,
//! and a thread per point solves with its head's decomposition: the CPU's
//! algorithm, and its bits. The workspace is 256 MiB, or one work item
//! where that is larger (`toast_accel::budget::WorkspaceLimit`: less on a
//! device with a smaller largest allocation or under 2 GiB of memory, but
//! never less than one item; the plugin option `workspace_bytes=N` sets
//! another limit), and the grid is cut into launches whose points' slices
//! fit in it (`grid_chunks`).
//!
//! The small per-detector arrays and the intervals, which the kernels only
//! read, are looked up by their bytes in the context's cache of device
//! copies (`small_cache`): a call repeating an earlier call's arrays (TOAST
//! calls the same kernels per detector in every solver iteration) neither
//! allocates nor uploads them. The workspace is a pool buffer of the call,
//! returned to the pool after it.
//!
//! `template_offset_project_signal` and `fused_project` run one block of
//! `TOAST_PROJECT_THREADS` (128) threads per amplitude (× interval ×
//! detector), the threads strided over the amplitude's samples and their
//! sums added by a fixed-shape tree in block-shared memory: one amplitude
//! may be a whole observation (the satellite workflow's default baseline
//! is longer than one). Their amplitudes differ from the CPU's sequential
//! sums by rounding (the conformance runner's tolerant mode: within
//! 1e-15 × step_length of the largest amplitude, FORMAT.md sections 9
//! and 17).
//!
//! # One synchronisation per call
//!
//! A launch is queued, not waited for (`KernelLaunch::launch_grid`): a
//! call with several launches (detectors or intervals split, grid chunks,
//! workspace chunks) waits once, at its end (`KernelLaunch::finish`, from
//! the entry), or earlier where the host must read device data (the error
//! word, a pixel to word a fault, a `global2local` table not read back
//! since its buffer was written: `checked_tables`), where the download
//! itself is the wait. This is sound because a driver queues everything
//! in order on one stream or queue and a copy returns once done
//! ([`Driver`]'s "Synchronisation"): a read sees every launch before it.
//! A failure seen while waiting names the kernels launched since the last
//! wait (`kernel toast_…: <driver message>` when there is one; with
//! several, the last and the earlier ones, any of which may have faulted:
//! a device reports a fault at the next wait, not at its launch). The
//! backend option `sync=launch` waits after every launch instead, so that
//! a fault names its own kernel (for debugging; one `synchronize` per
//! launch). Before any host-side driver operation of the call (an upload
//! on a cache miss, a pool allocation or fill, the error word's first
//! allocation) the call's pending launches are waited for first, so that
//! their failure is not reported as the copy's or as a lack of memory; a
//! call that fails between a launch and its end waits before its buffers
//! go back to the pool, and a fault seen there (the call already fails for
//! its own reason) goes to the host's log at error level, naming the
//! kernels, rather than being lost.
//!
//! The wait is not deferred past the call, to the host's next
//! synchronisation point, although stream order would make the outputs
//! visible to a following `copy_to_host`: the ABI reports a failure as the
//! status of the call that raised it (the host's operators stop at the
//! failing kernel, a fallback backend takes over on a refusal), the fault
//! messages read the call's own inputs back (the quaternion, the pixel),
//! which the host may overwrite or free as soon as the call returns, and a
//! host may `free` a buffer (or another thread call into the context) right
//! after a call. Deferring would need every entry point to settle pending
//! launches first and carry the failing call's name to whichever call sees
//! the failure; one wait per call keeps the contract at the cost of one
//! `synchronize` (a few microseconds) per call. The contract holds with
//! several host threads too: a context runs one call at a time (its call
//! lock, taken by every entry point: `context::ctx_ref`), so no call's wait
//! sees another call's launches.
//!
//! # The error word
//!
//! The kernels with data-dependent faults record the smallest error key in
//! one 8-byte word (`error_buffer`): the context's persistent word
//! (`Context::error_word`), allocated by the first call that needs it
//! and kept, not a new buffer per call. It holds `NO_ERROR` between calls:
//! a call that reads it back clean leaves it so; a call that found a key,
//! or that launched with it and failed before reading it, leaves it
//! "dirty", and the next call resets it (one upload) before its launch. A
//! call therefore costs no allocation, fill or upload for it, and one
//! download at its one synchronisation point. Calls are serialised, so
//! the word is never shared between concurrent calls.
//!
//! # Refusals before launch
//!
//! Besides the validator, a call is refused when an output array is the
//! same buffer as another array argument (the source declares its arrays
//! `restrict`; only inputs the kernel table marks `InPlace`, those of
//! `template_offset_apply_diag_precond`, may share an output's buffer),
//! and, for the kernels with a data-dependent error buffer, when its sizes
//! exceed what the error key encodes (2^20 detectors, 2^44 samples). Parameters are
//! handed to the driver as a typed list ([`crate::driver::Param`]); CUDA and HIP lay them
//! out as 8-byte slots ([`ParamSlots`](crate::ParamSlots)).

pub(crate) mod entries;
pub(crate) mod params;

use crate::context::{Context, ErrorWord, WorkspaceLayout};
use crate::driver::{Driver, Grid};
use crate::small_cache::Lookup;
use params::LaunchParams;
use std::cell::RefCell;
use std::sync::{Arc, MutexGuard};
use toast_accel::abi::{self, SampleRange};
use toast_accel::budget::WorkspaceLimit;
use toast_accel::check;
use toast_accel::device_source as ds;
use toast_accel::plugin_support::PluginError;

/// Threads per block (along dimension 0).
const BLOCK: u32 = 128;
/// Largest grid extent along dimensions 1 and 2.
const MAX_GRID_YZ: usize = 65535;
/// Largest grid extent along dimension 0, in blocks: CUDA's limit,
/// 2^31 - 1. HIP also bounds the threads along it (`blocks × threads`, a
/// 32-bit count on AMD): [`MAX_GRID_X_THREADS`]. OpenCL's global size is a
/// `size_t`: both are within it.
const MAX_GRID_X: u64 = i32::MAX as u64;
/// Largest number of threads along dimension 0 of a grid: HIP's limit on
/// AMD, 2^32 - 1.
const MAX_GRID_X_THREADS: u64 = u32::MAX as u64;

/// A kernel call in progress: the context, the kernel's name, the
/// scratch buffers to return to the pool afterwards and the entries of the
/// small-argument cache it holds.
pub(crate) struct KernelLaunch<'c, D: Driver> {
    c: &'c Context<D>,
    kernel: &'static str,
    scratch: Vec<u64>,
    held: Vec<u64>,
    /// The kernels launched and not yet waited for, each once, in the
    /// order of their last launch (see "One synchronisation per call" in
    /// the module docs).
    unsynced: RefCell<Vec<&'static str>>,
    /// The context's error word, held by this call once it uses it.
    error_word: Option<MutexGuard<'c, ErrorWord>>,
}

impl<D: Driver> Drop for KernelLaunch<'_, D> {
    fn drop(&mut self) {
        // A call that failed between a launch and its end: wait for the
        // device before its buffers go back to the pool (or the driver),
        // as the driver's `free` requires. The call reports its own error;
        // a fault of its launches seen here goes to the host's log, or the
        // next call would report it as its own with no trace of its kernel.
        let pending = self.unsynced.take();
        if !pending.is_empty() {
            if let Err(e) = self.c.driver.synchronize() {
                let e = kernels_failed(&pending, e);
                self.c.log(
                    abi::LOG_ERROR,
                    &format!(
                        "{}: a device fault after the call had failed: {}",
                        self.kernel, e.message
                    ),
                );
            }
        }
        if !self.held.is_empty() {
            let mut cache = self.c.small_cache();
            for h in self.held.drain(..) {
                cache.release(h);
            }
        }
        for h in self.scratch.drain(..) {
            let _ = self.c.memory.free(&self.c.driver, h);
        }
    }
}

impl<'c, D: Driver> KernelLaunch<'c, D> {
    pub(crate) fn new(c: &'c Context<D>, kernel: &'static str) -> Self {
        KernelLaunch {
            c,
            kernel,
            scratch: Vec::new(),
            held: Vec::new(),
            unsynced: RefCell::new(Vec::new()),
            error_word: None,
        }
    }

    /// Wait for the kernels this call launched (one `synchronize`, none
    /// when nothing is pending); a device failure names the kernels
    /// launched since the last wait ([`kernels_failed`]). The entry calls it
    /// once the call's launches are all queued; reads of device data in
    /// between wait through [`read_into`](Self::read_into).
    pub(crate) fn finish(&self) -> Result<(), PluginError> {
        let pending = self.unsynced.take();
        if pending.is_empty() {
            return Ok(());
        }
        self.c
            .driver
            .synchronize()
            .map_err(|e| kernels_failed(&pending, e))
    }

    /// A pool buffer of `len` bytes for the call (`len` > 0), returned to
    /// the pool when the call ends; its device buffer and offset.
    fn scratch_buffer(&mut self, name: &str, len: u64) -> Result<(D::Buffer, u64), PluginError> {
        // The pool may fill (or free) device memory: after this call's
        // launches, so that their failure is reported as theirs.
        self.settle_for_host()?;
        let h = self
            .c
            .memory
            .alloc(&self.c.driver, len, &format!("{}.{name}", self.kernel))?;
        self.scratch.push(h);
        self.c.memory.range(self.kernel, h, 0, len)
    }

    /// A small host array the kernel only reads, on the device: the
    /// cache's copy of the same bytes, else uploaded (and kept in the cache
    /// for later calls); its buffer (`None` when empty: the kernel never
    /// reads it then).
    pub(crate) fn small<T: bytemuck::Pod>(
        &mut self,
        name: &str,
        data: &[T],
    ) -> Result<Option<D::Buffer>, PluginError> {
        if data.is_empty() {
            return Ok(None);
        }
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let lookup = self.c.small_cache().acquire(bytes);
        let handle = match lookup {
            Lookup::Hit(h) => {
                self.held.push(h);
                h
            }
            Lookup::Miss => {
                // (`scratch_buffer` waits for this call's launches first.)
                let (buf, offset) = self.scratch_buffer(name, bytes.len() as u64)?;
                // SAFETY: `buf` is the live buffer just allocated,
                // range-checked for the bytes at `offset`.
                unsafe { self.c.driver.upload(buf, offset, bytes)? };
                let h = self.scratch[self.scratch.len() - 1];
                let (kept, evicted) = self.c.small_cache().insert(bytes, h);
                if kept {
                    self.scratch.pop();
                    self.held.push(h);
                }
                for e in evicted {
                    // An entry no call holds: no launch reads it.
                    let _ = self.c.memory.free(&self.c.driver, e);
                }
                h
            }
        };
        let (buf, _) = self
            .c
            .memory
            .range(self.kernel, handle, 0, bytes.len() as u64)?;
        Ok(Some(buf))
    }

    /// The workspace of a kernel whose work items each need `item_len`
    /// doubles (see [`Workspace`]), for `items` work items in all: room for
    /// as many of them as [`workspace_items`] allows per launch (at most
    /// `items`).
    pub(crate) fn workspace(
        &mut self,
        item_len: u64,
        items: u64,
    ) -> Result<Workspace<D::Buffer>, PluginError> {
        let d = &self.c.driver;
        // Within the budget's room as well (less a size class's rounding):
        // fewer items a launch rather than out of memory, down to one.
        let room_items = self.c.memory.room().saturating_sub(1 << 20) / (item_len * 8).max(1);
        let per_launch = workspace_items(
            self.kernel,
            item_len,
            self.c.workspace_bytes,
            d.max_allocation(),
            d.total_memory(),
        )?
        .min(items.max(1))
        .min(room_items.max(1));
        let (buf, _) = self.scratch_buffer("workspace", per_launch * item_len * 8)?;
        Ok(Workspace {
            buf,
            item_len,
            per_launch,
            layout: self.c.workspace,
        })
    }

    /// The buffer of a kernel array argument.
    pub(crate) fn array(
        &self,
        arg: &str,
        a: abi::Array,
        elem: u64,
    ) -> Result<Option<D::Buffer>, PluginError> {
        self.c.memory.array(self.kernel, arg, a, elem)
    }

    /// The entries of `global2local` (the array `a`, in `buf`, `n`
    /// entries), checked against `n_local` submaps (the kernels index the
    /// map with them unchecked): read back and checked once per buffer
    /// until it is written (`checked_tables`); the host copy, for messages.
    pub(crate) fn global2local(
        &self,
        a: abi::Array,
        buf: Option<D::Buffer>,
        n: usize,
        n_local: usize,
    ) -> Result<Arc<[i64]>, PluginError> {
        let n_local = n_local as u64;
        let found = self.c.checked_tables().find(a.ptr, n, n_local);
        let entries = match found {
            Some(f) if f.checked => return Ok(f.entries),
            Some(f) => f.entries,
            None => {
                let mut g2l = vec![0i64; n];
                self.read_into(buf, 0, &mut g2l)?;
                Arc::from(g2l)
            }
        };
        check::global2local(self.kernel, &entries, n_local)?;
        if n > 0 {
            self.c
                .checked_tables()
                .insert(a.ptr, Arc::clone(&entries), n_local);
        }
        Ok(entries)
    }

    /// The intervals as `(first, last)` pairs on the device.
    pub(crate) fn intervals(
        &mut self,
        iv: &[SampleRange],
    ) -> Result<Option<D::Buffer>, PluginError> {
        let flat: Vec<i64> = iv.iter().flat_map(|i| [i.first, i.last]).collect();
        self.small("intervals", &flat)
    }

    /// A one-element error buffer holding `NO_ERROR` for the kernels to
    /// record a data-dependent fault in (never from the small cache: the
    /// kernel writes it): the context's persistent error word (no
    /// allocation, fill or upload; reset only after a call that may have
    /// left a key in it).
    pub(crate) fn error_buffer(&mut self) -> Result<Option<D::Buffer>, PluginError> {
        let c = self.c;
        let first = self
            .error_word
            .get_or_insert_with(|| c.error_word())
            .handle
            .is_none();
        if first {
            // The first allocation fills the block: after this call's
            // launches, so that their failure is reported as theirs.
            self.settle_for_host()?;
        }
        let (handle, dirty) = {
            let word = self.error_word.as_mut().expect("taken above");
            let handle = match word.handle {
                Some(h) => h,
                None => {
                    let h = c.memory.alloc(&c.driver, 8, "error word")?;
                    word.handle = Some(h);
                    word.dirty = true;
                    h
                }
            };
            (handle, word.dirty)
        };
        let (buf, offset) = c.memory.range(self.kernel, handle, 0, 8)?;
        if dirty {
            self.settle_for_host()?;
            // SAFETY: the context's live 8-byte error word; no launch of
            // this call uses it yet and earlier calls have finished.
            unsafe {
                c.driver
                    .upload(buf, offset, bytemuck::bytes_of(&ds::NO_ERROR))?
            };
        }
        // Dirty until a read finds it clean: a call that fails between its
        // launch and its read leaves the next call to reset it.
        if let Some(word) = self.error_word.as_mut() {
            word.dirty = true;
        }
        Ok(Some(buf))
    }

    /// The `(detector, sample)` recorded in an error buffer, if any (the
    /// read waits for this call's kernels: it is the call's one
    /// synchronisation point).
    pub(crate) fn read_error(
        &mut self,
        err: Option<D::Buffer>,
    ) -> Result<Option<(u64, u64)>, PluginError> {
        let key: u64 = self.read(err, 0)?;
        if let Some(word) = self.error_word.as_mut() {
            word.dirty = key != ds::NO_ERROR;
        }
        Ok(ds::decode_error_key(key))
    }

    /// Before a host-side driver operation that synchronises the device
    /// (an upload, a download), wait for this call's launched kernels, so
    /// that a failure of theirs is reported as theirs.
    fn settle_for_host(&self) -> Result<(), PluginError> {
        self.finish()
    }

    /// Read elements `index..index + out.len()` of a device array that the
    /// call's validator and [`array`](Self::array) have checked holds them.
    pub(crate) fn read_into<T: bytemuck::Pod>(
        &self,
        buf: Option<D::Buffer>,
        index: u64,
        out: &mut [T],
    ) -> Result<(), PluginError> {
        if out.is_empty() {
            return Ok(());
        }
        let buf = buf.ok_or_else(|| {
            PluginError::new(
                abi::ERR_INTERNAL,
                format!("{}: read from an absent array", self.kernel),
            )
        })?;
        let offset = index * std::mem::size_of::<T>() as u64;
        // The download is queued after this call's launches and returns once
        // done (the driver's contract): it is the wait for them, and its
        // failure is theirs when any is pending.
        let pending = self.unsynced.take();
        // SAFETY: a live buffer of this call holding the elements read (the
        // caller's contract, from the validated argument lengths).
        unsafe {
            self.c
                .driver
                .download(buf, offset, bytemuck::cast_slice_mut(out))
        }
        .map_err(|e| {
            if pending.is_empty() {
                e
            } else {
                kernels_failed(&pending, e)
            }
        })
    }

    /// Read one element of a device array.
    pub(crate) fn read<T: bytemuck::Pod>(
        &self,
        buf: Option<D::Buffer>,
        index: u64,
    ) -> Result<T, PluginError> {
        let mut v = [T::zeroed()];
        self.read_into(buf, index, &mut v)?;
        Ok(v[0])
    }

    /// Launch the kernel `name` once on a grid of `dim0` threads along
    /// dimension 0 and `ny`, `nz` along 1 and 2 (queued: the call waits
    /// once, at its end or its first read of device data). `params`
    /// are the kernel's by name ([`params`]); `name` must be one of the
    /// kernels they launch.
    pub(crate) fn launch<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        dim0: u64,
        ny: usize,
        nz: usize,
        params: L,
    ) -> Result<(), PluginError> {
        self.check_kernel::<L>(name, false)?;
        if dim0 == 0 || ny == 0 || nz == 0 {
            return Ok(());
        }
        let gx = dim0.div_ceil(u64::from(BLOCK));
        let gx = grid_x(gx, BLOCK).ok_or_else(|| {
            PluginError::invalid(format!(
                "{}: {dim0} threads along the sample axis exceed the grid limit \
                 ({MAX_GRID_X} blocks, {MAX_GRID_X_THREADS} threads)",
                self.kernel
            ))
        })?;
        self.launch_grid(name, gx, ny, nz, BLOCK, params)
    }

    /// Launch the cooperative kernel `name` (one block per work item, its
    /// threads sharing memory and barriers) on `gx` x `ny` x `nz` blocks of
    /// [`params::FIT_THREADS`] threads (queued, as [`launch`](Self::launch)).
    pub(crate) fn launch_blocks<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        gx: u64,
        ny: usize,
        nz: usize,
        params: L,
    ) -> Result<(), PluginError> {
        self.launch_blocks_of(name, params::FIT_THREADS, gx, ny, nz, params)
    }

    /// [`launch_blocks`](Self::launch_blocks) with `threads` threads per
    /// block (the size the kernel's block-shared arrays are declared for).
    pub(crate) fn launch_blocks_of<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        threads: u32,
        gx: u64,
        ny: usize,
        nz: usize,
        params: L,
    ) -> Result<(), PluginError> {
        self.check_kernel::<L>(name, true)?;
        if gx == 0 || ny == 0 || nz == 0 {
            return Ok(());
        }
        let gx = grid_x(gx, threads).ok_or_else(|| {
            PluginError::invalid(format!(
                "{}: {gx} blocks of {threads} threads exceed the grid limit ({MAX_GRID_X} \
                 blocks, {MAX_GRID_X_THREADS} threads)",
                self.kernel
            ))
        })?;
        self.launch_grid(name, gx, ny, nz, threads, params)
    }

    /// `name` is one of the kernels `L` launches, and cooperative or not as
    /// the launch shape assumes.
    fn check_kernel<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        cooperative: bool,
    ) -> Result<(), PluginError> {
        if !L::KERNELS.contains(&name) || L::COOPERATIVE != cooperative {
            return Err(PluginError::new(
                abi::ERR_INTERNAL,
                format!(
                    "{}: launch of {name} with the parameters of {:?} (cooperative: {}) as \
                     cooperative: {cooperative}",
                    self.kernel,
                    L::KERNELS,
                    L::COOPERATIVE
                ),
            ));
        }
        Ok(())
    }

    fn launch_grid<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        gx: u32,
        ny: usize,
        nz: usize,
        threads: u32,
        params: L,
    ) -> Result<(), PluginError> {
        let f = self.c.function(name)?;
        let grid = Grid {
            blocks: (gx, ny as u32, nz as u32),
            threads,
        };
        let params = params.params();
        // SAFETY: `params` follow the prototype of `name` in kernels.h (laid
        // out by the struct generated from it, and `name` is one of the
        // kernels it was generated for); every buffer among them is a live
        // pool buffer checked to be large enough; the call waits for the
        // kernel (`finish`, a read, or `Drop`) before any of them can be
        // freed.
        let queued = unsafe { self.c.driver.launch(name, f, grid, &params) };
        // Pending from now on, even when the launch reports a failure: an
        // earlier launch of the call may still run.
        let mut pending = self.unsynced.borrow_mut();
        pending.retain(|&k| k != name);
        pending.push(name);
        if let Err(e) = queued {
            let earlier = &pending[..pending.len() - 1];
            return Err(if earlier.is_empty() {
                kernel_failed(name, e)
            } else {
                PluginError::new(
                    e.status,
                    format!(
                        "kernel {name} (after {} of the same call): {}",
                        earlier.join(", "),
                        e.message
                    ),
                )
            });
        }
        drop(pending);
        if self.c.sync_each_launch {
            self.finish()?;
        }
        Ok(())
    }

    /// Launch a per-sample kernel over `n_det` detectors and `iv`, split as
    /// the module documentation says. `params(det0, det_end, iv0, iv_end)`
    /// gives the full parameter list of one launch.
    pub(crate) fn launch_samples<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        n_det: usize,
        iv: &[SampleRange],
        split_det: bool,
        split_iv: bool,
        params: impl Fn(i64, i64, i64, i64) -> L,
    ) -> Result<(), PluginError> {
        let split = (split_det, split_iv);
        self.launch_sample_chunks(name, n_det, iv, split, 1, |d0, d1, i0, i1, _| {
            params(d0, d1, i0, i1)
        })
    }

    /// [`launch_samples`](Self::launch_samples) for a kernel whose threads
    /// take `chunk` samples each, strided by the grid's width along
    /// dimension 0: `params(det0, det_end, iv0, iv_end, stride)`, with
    /// `stride` that width (`ceil(longest interval / chunk)`; the longest
    /// interval itself for `chunk` 1, one thread a sample). `split` says
    /// whether detectors and intervals get a launch each.
    pub(crate) fn launch_sample_chunks<L: LaunchParams<D::Buffer>>(
        &self,
        name: &'static str,
        n_det: usize,
        iv: &[SampleRange],
        (split_det, split_iv): (bool, bool),
        chunk: u64,
        params: impl Fn(i64, i64, i64, i64, i64) -> L,
    ) -> Result<(), PluginError> {
        let width = |r: std::ops::Range<usize>| {
            iv[r]
                .iter()
                .map(|i| (i.last - i.first).max(0) as u64)
                .max()
                .unwrap_or(0)
                .div_ceil(chunk.max(1))
        };
        for (d0, d1) in ranges(n_det, split_det) {
            for (i0, i1) in ranges(iv.len(), split_iv) {
                let w = width(i0..i1);
                self.launch(
                    name,
                    w,
                    i1 - i0,
                    d1 - d0,
                    params(d0 as i64, d1 as i64, i0 as i64, i1 as i64, w as i64),
                )?;
            }
        }
        Ok(())
    }

    /// The pixel fault a per-sample map kernel (scan_map,
    /// build_noise_weighted, cov_accum_timestream) recorded in `err`, if
    /// any: the error naming the detector, the sample and why its pixel
    /// (read back from `pixels`, rows `pixel_index` of `n_samp`) is not in
    /// the map of `g2l` (the host copy of `global2local`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn map_pixel_fault(
        &mut self,
        err: Option<D::Buffer>,
        pixels: Option<D::Buffer>,
        pixel_index: &[i32],
        n_samp: usize,
        iv: &[SampleRange],
        g2l: &[i64],
        n_pix_submap: i64,
    ) -> Result<(), PluginError> {
        let Some((det, s)) = self.read_error(err)? else {
            return Ok(());
        };
        let row = u64::from(pixel_index[det as usize] as u32);
        let pix: i64 = self.read(pixels, row * n_samp as u64 + s)?;
        Err(self.fault(iv, det, s, &pixel_fault(pix, g2l, n_pix_submap)))
    }

    /// The error for a data-dependent fault at `(det, sample)`.
    pub(crate) fn fault(&self, iv: &[SampleRange], det: u64, samp: u64, what: &str) -> PluginError {
        let s = samp as i64;
        let view = iv
            .iter()
            .position(|i| i.first <= s && s < i.last)
            .map_or("?".to_string(), |v| v.to_string());
        PluginError::invalid(format!(
            "{}: detector {det} (interval {view}), sample {samp}: {what}",
            self.kernel
        ))
    }
}

/// A device failure seen while waiting for the kernel `name`, naming it.
fn kernel_failed(name: &str, e: PluginError) -> PluginError {
    PluginError::new(e.status, format!("kernel {name}: {}", e.message))
}

/// A failure seen while waiting for `pending`, the kernels launched since
/// the last wait (in the order of their last launch; not empty): with
/// one, it is that kernel's; with several, any of them may have faulted (a
/// device reports a fault at the next wait), so the message names the
/// last and the earlier ones, and how to have the fault name its own.
fn kernels_failed(pending: &[&str], e: PluginError) -> PluginError {
    match pending {
        [] | [_] => kernel_failed(pending.first().copied().unwrap_or("?"), e),
        [earlier @ .., last] => PluginError::new(
            e.status,
            format!(
                "kernel {last} or one launched before it in the same call ({}; the backend \
                 option sync=launch waits after every launch, naming the one at fault): {}",
                earlier.join(", "),
                e.message
            ),
        ),
    }
}

/// A grid's extent along dimension 0 (`blocks` of `threads`), when
/// within [`MAX_GRID_X`] blocks and [`MAX_GRID_X_THREADS`] threads.
fn grid_x(blocks: u64, threads: u32) -> Option<u32> {
    let fits = blocks <= MAX_GRID_X
        && blocks
            .checked_mul(u64::from(threads))
            .is_some_and(|t| t <= MAX_GRID_X_THREADS);
    fits.then_some(blocks as u32)
}

/// How many work items of `item_len` doubles one launch of `kernel` may
/// have: as many as the workspace limit `limit` allows
/// ([`WorkspaceLimit::launch_bytes`]: 256 MiB by default, less on a device
/// whose largest allocation `max_allocation` or an eighth of whose
/// `total_memory` is less, but at least one item; the option
/// `workspace_bytes=` sets another limit); an error naming the sizes when
/// not even one item fits.
pub(crate) fn workspace_items(
    kernel: &str,
    item_len: u64,
    limit: WorkspaceLimit,
    max_allocation: u64,
    total_memory: u64,
) -> Result<u64, PluginError> {
    let item_bytes = item_len.saturating_mul(8).max(1);
    match limit.launch_bytes(item_bytes, max_allocation, total_memory) {
        Ok(bytes) => Ok(bytes / item_bytes),
        Err(why) => Err(PluginError::new(
            abi::ERR_OUT_OF_MEMORY,
            format!("{kernel}: one work item needs {item_bytes} bytes of device workspace, {why}"),
        )),
    }
}

/// The global workspace of the polynomial filters (`kernels.h`, "small
/// symmetric solves"): one slice of `item_len` doubles per work item of a
/// launch, `per_launch` slices, laid out as `layout` says. The kernels take
/// the buffer, then the distance between two items' first elements and
/// between two elements of one item ([`params`](Self::params)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Workspace<B> {
    pub(crate) buf: B,
    pub(crate) item_len: u64,
    pub(crate) per_launch: u64,
    pub(crate) layout: WorkspaceLayout,
}

impl<B: Copy> Workspace<B> {
    /// The kernel parameters `work, item_step, elem_step` of a launch of
    /// `items` work items (at most `per_launch`).
    pub(crate) fn params(&self, items: u64) -> WorkspaceParams<B> {
        debug_assert!(items <= self.per_launch);
        let (item_step, elem_step) = match self.layout {
            WorkspaceLayout::Contiguous => (self.item_len, 1),
            WorkspaceLayout::Interleaved => (1, items),
        };
        WorkspaceParams {
            work: Some(self.buf),
            item_step: item_step as i64,
            elem_step: elem_step as i64,
        }
    }
}

/// The workspace parameters of one launch (the last three of the
/// polynomial filters' prototypes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkspaceParams<B> {
    /// The workspace buffer.
    pub(crate) work: Option<B>,
    /// Elements between two work items' first elements.
    pub(crate) item_step: i64,
    /// Elements between two consecutive elements of one work item.
    pub(crate) elem_step: i64,
}

/// The launches of a 2-D grid of `n0` x `n1` work items when one launch
/// may have at most `per_launch` of them and `max1` along dimension 1: the
/// `(start, end)` ranges along dimensions 0 and 1 of each, dimension 0
/// varying fastest. Dimension 1 gets as many as it can, dimension 0 the
/// rest of the budget.
pub(crate) fn grid_chunks(
    n0: usize,
    n1: usize,
    max1: usize,
    per_launch: u64,
) -> Vec<((usize, usize), (usize, usize))> {
    let per_launch = usize::try_from(per_launch).unwrap_or(usize::MAX).max(1);
    let c1 = n1.min(max1).min(per_launch).max(1);
    let c0 = n0.min(per_launch / c1).max(1);
    let mut out = Vec::new();
    for a1 in (0..n1).step_by(c1) {
        for a0 in (0..n0).step_by(c0) {
            out.push(((a0, (a0 + c0).min(n0)), (a1, (a1 + c1).min(n1))));
        }
    }
    out
}

/// Refuse sizes the data-dependent error key cannot encode.
pub(crate) fn check_key_range(
    kernel: &str,
    n_det: usize,
    n_samp: usize,
) -> Result<(), PluginError> {
    if (n_samp as u64) >> ds::ERROR_KEY_SAMPLE_BITS != 0
        || (n_det as u64) >> (64 - ds::ERROR_KEY_SAMPLE_BITS) != 0
    {
        return Err(PluginError::invalid(format!(
            "{kernel}: n_det = {n_det} / n_samp = {n_samp} exceed the device error-key range (2^20 detectors, 2^44 samples)"
        )));
    }
    Ok(())
}

/// Why `pix` is not in the map, as the CPU backend words it.
pub(crate) fn pixel_fault(pix: i64, g2l: &[i64], n_pix_submap: i64) -> String {
    let g = pix.checked_div(n_pix_submap).unwrap_or(-1);
    match usize::try_from(g).ok().and_then(|g| g2l.get(g)) {
        Some(&l) => format!(
            "pixel {pix} is in submap {g}, which is not local to this map (global2local = {l})"
        ),
        None => format!(
            "pixel {pix} is beyond the map ({} submaps x {n_pix_submap} pixels)",
            g2l.len()
        ),
    }
}

/// `[start, end)` chunks of `0..n`: single items when `split`, else runs of
/// at most `MAX_GRID_YZ`.
fn ranges(n: usize, split: bool) -> Vec<(usize, usize)> {
    let step = if split { 1 } else { MAX_GRID_YZ };
    (0..n)
        .step_by(step)
        .map(|a| (a, (a + step).min(n)))
        .collect()
}

/// Whether an index array names a row twice.
pub(crate) fn has_duplicates(rows: &[i32]) -> bool {
    let mut v = rows.to_vec();
    v.sort_unstable();
    v.windows(2).any(|w| w[0] == w[1])
}

/// Whether two non-empty intervals overlap.
pub(crate) fn intervals_overlap(iv: &[SampleRange]) -> bool {
    let mut v: Vec<(i64, i64)> = iv
        .iter()
        .filter(|i| i.last > i.first)
        .map(|i| (i.first, i.last))
        .collect();
    v.sort_unstable();
    v.windows(2).any(|w| w[1].0 < w[0].1)
}

/// Whether the amplitude blocks `[off, off + len)` of two detectors overlap.
pub(crate) fn blocks_overlap(amp_offset: &[i64], len: i64) -> bool {
    if len == 0 {
        return false;
    }
    let mut v = amp_offset.to_vec();
    v.sort_unstable();
    v.windows(2).any(|w| w[1] < w[0] + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_names_the_kernels_pending_at_the_wait() {
        let fault = || PluginError::new(abi::ERR_DEVICE, "cuda: an illegal memory access");
        assert_eq!(
            kernels_failed(&["toast_a"], fault()).message,
            "kernel toast_a: cuda: an illegal memory access"
        );
        let e = kernels_failed(&["toast_a", "toast_b", "toast_c"], fault());
        assert_eq!(e.status, abi::ERR_DEVICE);
        assert_eq!(
            e.message,
            "kernel toast_c or one launched before it in the same call (toast_a, toast_b; the \
             backend option sync=launch waits after every launch, naming the one at fault): \
             cuda: an illegal memory access"
        );
        assert_eq!(grid_x(MAX_GRID_X, 1), Some(i32::MAX as u32));
        assert_eq!(grid_x(MAX_GRID_X + 1, 1), None);
        assert_eq!(grid_x(u64::from(u32::MAX), 1), None);
        // HIP's bound on the threads: 2^25 blocks of 128 are one too many.
        assert_eq!(grid_x((1 << 25) - 1, 128), Some((1 << 25) - 1));
        assert_eq!(grid_x(1 << 25, 128), None);
    }

    #[test]
    fn planning_helpers() {
        assert_eq!(ranges(3, true), vec![(0, 1), (1, 2), (2, 3)]);
        assert_eq!(ranges(70000, false), vec![(0, 65535), (65535, 70000)]);
        assert!(has_duplicates(&[0, 2, 0]));
        assert!(!has_duplicates(&[0, 1, 2]));
        let iv = |a, b| SampleRange { first: a, last: b };
        assert!(!intervals_overlap(&[iv(0, 5), iv(5, 9), iv(3, 3)]));
        assert!(intervals_overlap(&[iv(4, 9), iv(0, 5)]));
        assert!(blocks_overlap(&[0, 3], 4));
        assert!(!blocks_overlap(&[4, 0], 4));
    }

    #[test]
    fn workspace_budget_and_chunks() {
        // 64 modes: 2 * 64^2 + 2 * 64 doubles = 66560 bytes per item.
        let item = 2 * 64 * 64 + 2 * 64;
        let d = WorkspaceLimit::Default;
        assert_eq!(
            workspace_items("k", item, d, u64::MAX, 64 << 30).unwrap(),
            (256 << 20) / 66560
        );
        assert_eq!(
            workspace_items("k", item, d, 1 << 20, 64 << 30).unwrap(),
            15
        );
        assert_eq!(workspace_items("k", item, d, u64::MAX, 1 << 20).unwrap(), 1);
        // The default holds one item, even past its 256 MiB.
        assert_eq!(
            workspace_items("k", 40 << 20, d, u64::MAX, 64 << 30).unwrap(),
            1
        );
        let e = workspace_items("k", item, d, 60_000, 64 << 30).unwrap_err();
        assert_eq!(e.status, abi::ERR_OUT_OF_MEMORY);
        assert!(
            e.message
                .starts_with("k: one work item needs 66560 bytes of device workspace, more than the device's largest allocation, 60000"),
            "{}",
            e.message
        );
        let set = WorkspaceLimit::Option(60_000);
        let e = workspace_items("k", item, set, u64::MAX, 64 << 30).unwrap_err();
        assert!(e.message.contains("workspace_bytes"), "{}", e.message);
        // Dimension 1 whole when it fits, dimension 0 the rest.
        assert_eq!(grid_chunks(10, 2, 65535, 100), vec![((0, 10), (0, 2))]);
        assert_eq!(
            grid_chunks(10, 2, 65535, 8),
            vec![((0, 4), (0, 2)), ((4, 8), (0, 2)), ((8, 10), (0, 2))]
        );
        // One item per launch; dimension 1 capped by max1.
        assert_eq!(
            grid_chunks(2, 2, 65535, 1),
            vec![
                ((0, 1), (0, 1)),
                ((1, 2), (0, 1)),
                ((0, 1), (1, 2)),
                ((1, 2), (1, 2))
            ]
        );
        assert_eq!(
            grid_chunks(3, 5, 2, 100),
            vec![((0, 3), (0, 2)), ((0, 3), (2, 4)), ((0, 3), (4, 5))]
        );
        // Every item exactly once, at most `per_launch` per launch.
        for (n0, n1, max1, per) in [(7, 5, 3, 4), (1, 9, 65535, 2), (13, 1, 1, 5)] {
            let mut seen = vec![0u32; n0 * n1];
            for ((a0, b0), (a1, b1)) in grid_chunks(n0, n1, max1, per) {
                assert!(((b0 - a0) * (b1 - a1)) as u64 <= per && b1 - a1 <= max1);
                for i1 in a1..b1 {
                    for i0 in a0..b0 {
                        seen[i1 * n0 + i0] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{n0} {n1} {max1} {per}");
        }
    }

    #[test]
    fn key_range_and_pixel_faults() {
        assert!(check_key_range("k", 1 << 20, 1 << 40).is_err());
        assert!(check_key_range("k", (1 << 20) - 1, (1 << 44) - 1).is_ok());
        assert!(check_key_range("k", 1, 1 << 44).is_err());
        assert_eq!(
            pixel_fault(1000, &[0, 1], 4),
            "pixel 1000 is beyond the map (2 submaps x 4 pixels)"
        );
        assert_eq!(
            pixel_fault(5, &[0, -1], 4),
            "pixel 5 is in submap 1, which is not local to this map (global2local = -1)"
        );
    }
}
