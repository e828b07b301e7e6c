//! The ten kernels: argument marshalling and launches of the shared device
//! source (`toast_accel::device_source`).
//!
//! Each `run` takes the validated arguments from `toast_accel::check` and
//! the raw argument struct (whose kernel arrays are buffer handles here),
//! resolves the handles, uploads the small per-detector arrays and the
//! intervals as temporary device arrays, launches, waits, and turns a
//! recorded data-dependent fault into an error naming detector and sample.

pub(crate) mod healpix;
pub(crate) mod mapmaker;
pub(crate) mod pointing;
pub(crate) mod scan_map;
pub(crate) mod stokes;
pub(crate) mod template_offset;
pub(crate) mod weight;

use crate::context::{cl_error, OpenClContext};
use opencl3::event::Event;
use opencl3::memory::{Buffer, ClMem, CL_MEM_COPY_HOST_PTR, CL_MEM_READ_WRITE};
use opencl3::types::{cl_mem, CL_BLOCKING};
use toast_accel::abi::{self, Array, SampleRange};
use toast_accel::device_source::{decode_error_key, ERROR_KEY_SAMPLE_BITS, NO_ERROR};
use toast_accel::plugin_support::PluginError;

/// Work-group multiple of grid dimension 0.
const GROUP: usize = 64;

/// A kernel argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KArg {
    Mem(cl_mem),
    I64(i64),
    I32(i32),
    F64(f64),
}

/// One kernel call: the temporary device arrays it uploaded (freed when it
/// ends) and the handles it resolved (to refuse aliasing outputs).
pub(crate) struct KernelLaunch<'c> {
    pub(crate) ctx: &'c OpenClContext,
    pub(crate) kernel: &'static str,
    temps: Vec<Buffer<u8>>,
    outputs: Vec<(&'static str, u64)>,
    inputs: Vec<(&'static str, u64)>,
    err: Option<cl_mem>,
}

fn device_error(kernel: &str, what: &str, e: opencl3::error_codes::ClError) -> PluginError {
    PluginError::new(
        abi::ERR_DEVICE,
        format!("{kernel}: {what} failed: {}", cl_error(e)),
    )
}

impl<'c> KernelLaunch<'c> {
    pub(crate) fn new(ctx: &'c OpenClContext, kernel: &'static str) -> Self {
        KernelLaunch {
            ctx,
            kernel,
            temps: Vec::new(),
            outputs: Vec::new(),
            inputs: Vec::new(),
            err: None,
        }
    }

    /// Upload `data` (host memory) as a temporary device array; an empty
    /// slice gets a small dummy array (never read).
    pub(crate) fn small<T: Copy>(&mut self, name: &str, data: &[T]) -> Result<cl_mem, PluginError> {
        let bytes = std::mem::size_of_val(data);
        let mut pad = [0u8; 8];
        let (ptr, size) = if bytes == 0 {
            (pad.as_mut_ptr(), pad.len())
        } else {
            (data.as_ptr() as *mut u8, bytes)
        };
        // SAFETY: COPY_HOST_PTR copies `size` bytes from `ptr`, which is
        // valid for them, during the call; the buffer never writes back.
        let buf = unsafe {
            Buffer::<u8>::create(
                &self.ctx.dev.context,
                CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                size,
                ptr as *mut std::ffi::c_void,
            )
        }
        .map_err(|e| {
            PluginError::new(
                abi::ERR_OUT_OF_MEMORY,
                format!(
                    "{}: cannot upload `{name}` ({size} bytes) to the device: {}",
                    self.kernel,
                    cl_error(e)
                ),
            )
        })?;
        let m = buf.get();
        self.temps.push(buf);
        Ok(m)
    }

    /// The intervals as a device array of (first, last) pairs.
    pub(crate) fn intervals(&mut self, ivs: &[SampleRange]) -> Result<cl_mem, PluginError> {
        let flat: Vec<i64> = ivs.iter().flat_map(|i| [i.first, i.last]).collect();
        self.small("intervals", &flat)
    }

    /// The one-element data-dependent error buffer (initialised to "none").
    pub(crate) fn error_buffer(&mut self) -> Result<cl_mem, PluginError> {
        let m = self.small("error buffer", &[NO_ERROR])?;
        self.err = Some(m);
        Ok(m)
    }

    /// Resolve a kernel array: its buffer, checked to hold `len` elements of
    /// `T`; an absent array gets a dummy (never read).
    pub(crate) fn array<T>(
        &mut self,
        name: &'static str,
        a: Array,
        output: bool,
    ) -> Result<cl_mem, PluginError> {
        if a.len == 0 {
            return self.small::<u8>(name, &[]);
        }
        let (mem, bytes) = self.ctx.registry.mem(a.ptr).map_err(|e| {
            PluginError::new(
                e.status,
                format!("{}: array `{name}`: {}", self.kernel, e.message),
            )
        })?;
        let need = a.len.checked_mul(std::mem::size_of::<T>() as u64);
        if need.is_none_or(|n| n > bytes) {
            return Err(PluginError::invalid(format!(
                "{}: array `{name}` declares {} elements of {} bytes, but its buffer holds {bytes} bytes",
                self.kernel,
                a.len,
                std::mem::size_of::<T>()
            )));
        }
        if output {
            self.outputs.push((name, a.ptr));
        } else {
            self.inputs.push((name, a.ptr));
        }
        Ok(mem)
    }

    /// Refuse an output buffer that is also another argument (the kernels
    /// declare their arrays `restrict`).
    pub(crate) fn check_disjoint(&self) -> Result<(), PluginError> {
        for (i, (on, oh)) in self.outputs.iter().enumerate() {
            let others = self.outputs[i + 1..].iter().chain(&self.inputs);
            if let Some((n, _)) = others.into_iter().find(|(_, h)| h == oh) {
                return Err(PluginError::invalid(format!(
                    "{}: output array `{on}` is the same buffer as `{n}`",
                    self.kernel
                )));
            }
        }
        Ok(())
    }

    /// Read `dst.len()` bytes at byte `offset` of device memory `mem`.
    pub(crate) fn read(
        &self,
        mem: cl_mem,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), PluginError> {
        // SAFETY: `dst` is valid for its length; the read is blocking, and
        // the caller keeps the range inside the buffer.
        let ev = unsafe {
            cl3::command_queue::enqueue_read_buffer(
                self.ctx.dev.queue.get(),
                mem,
                CL_BLOCKING,
                offset,
                dst.len(),
                dst.as_mut_ptr() as *mut std::ffi::c_void,
                0,
                std::ptr::null(),
            )
        }
        .map_err(|e| {
            device_error(
                self.kernel,
                "reading back",
                opencl3::error_codes::ClError(e),
            )
        })?;
        drop(Event::new(ev));
        Ok(())
    }

    /// Launch entry point `name` on a grid of `global` work items.
    pub(crate) fn launch(
        &self,
        name: &'static str,
        args: &[KArg],
        global: &[usize],
    ) -> Result<(), PluginError> {
        if global.contains(&0) {
            return Ok(());
        }
        let kernels = self
            .ctx
            .dev
            .kernels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let k = kernels.get(name).ok_or_else(|| {
            PluginError::new(
                abi::ERR_INTERNAL,
                format!(
                    "{}: device kernel `{name}` is not in the program",
                    self.kernel
                ),
            )
        })?;
        for (i, a) in args.iter().enumerate() {
            let i = i as u32;
            // SAFETY: the argument types follow the kernel's signature in
            // device/kernels.h (cl_mem for pointers, i64/i32/f64 scalars).
            let r = unsafe {
                match a {
                    KArg::Mem(m) => k.set_arg(i, m),
                    KArg::I64(x) => k.set_arg(i, x),
                    KArg::I32(x) => k.set_arg(i, x),
                    KArg::F64(x) => k.set_arg(i, x),
                }
            };
            r.map_err(|e| device_error(self.kernel, &format!("argument {i} of `{name}`"), e))?;
        }
        // SAFETY: every argument is set; `global` has global.len() entries.
        let ev = unsafe {
            self.ctx.dev.queue.enqueue_nd_range_kernel(
                k.get(),
                global.len() as u32,
                std::ptr::null(),
                global.as_ptr(),
                std::ptr::null(),
                &[],
            )
        }
        .map_err(|e| device_error(self.kernel, &format!("launching `{name}`"), e))?;
        drop(ev);
        Ok(())
    }

    /// Launch a per-sample kernel over detectors x intervals x samples. The
    /// grid arguments (det0, det_end, iv0, iv_end) are prepended to `args`.
    /// With `serial`, every (detector, interval) pair is its own launch, in
    /// order (for detectors sharing an output row, or overlapping intervals).
    /// `extent` gives the grid's dimension 0 for an interval.
    pub(crate) fn samples(
        &self,
        name: &'static str,
        n_det: usize,
        ivs: &[SampleRange],
        serial: bool,
        args: &[KArg],
        extent: impl Fn(&SampleRange) -> usize,
    ) -> Result<(), PluginError> {
        let mut full = vec![KArg::I64(0); 4];
        full.extend_from_slice(args);
        let mut go = |d0: usize, d1: usize, i0: usize, i1: usize| {
            let longest = ivs[i0..i1].iter().map(&extent).max().unwrap_or(0);
            full[0] = KArg::I64(d0 as i64);
            full[1] = KArg::I64(d1 as i64);
            full[2] = KArg::I64(i0 as i64);
            full[3] = KArg::I64(i1 as i64);
            self.launch(
                name,
                &full,
                &[longest.div_ceil(GROUP) * GROUP, i1 - i0, d1 - d0],
            )
        };
        if serial {
            for d in 0..n_det {
                for i in 0..ivs.len() {
                    go(d, d + 1, i, i + 1)?;
                }
            }
            Ok(())
        } else {
            go(0, n_det, 0, ivs.len())
        }
    }

    /// Wait for the device; the first recorded fault, if any.
    pub(crate) fn finish(&self) -> Result<Option<(usize, usize)>, PluginError> {
        self.ctx
            .dev
            .queue
            .finish()
            .map_err(|e| device_error(self.kernel, "waiting for the device", e))?;
        let Some(m) = self.err else { return Ok(None) };
        let mut b = [0u8; 8];
        self.read(m, 0, &mut b)?;
        Ok(decode_error_key(u64::from_ne_bytes(b)).map(|(d, s)| (d as usize, s as usize)))
    }

    /// The error for a data-dependent fault at (det, sample).
    pub(crate) fn fault(
        &self,
        ivs: &[SampleRange],
        det: usize,
        s: usize,
        what: &str,
    ) -> PluginError {
        let view = ivs
            .iter()
            .position(|iv| (iv.first..iv.last).contains(&(s as i64)))
            .unwrap_or(0);
        PluginError::invalid(format!(
            "{}: detector {det} (interval {view}), sample {s}: {what}",
            self.kernel
        ))
    }
}

/// Refuse sizes the error key cannot encode.
pub(crate) fn check_key_range(
    kernel: &str,
    n_det: usize,
    n_samp: usize,
) -> Result<(), PluginError> {
    if (n_samp as u64) >> ERROR_KEY_SAMPLE_BITS != 0
        || (n_det as u64) >> (64 - ERROR_KEY_SAMPLE_BITS) != 0
    {
        return Err(PluginError::invalid(format!(
            "{kernel}: n_det = {n_det} / n_samp = {n_samp} exceed the device error-key range (2^20 detectors, 2^44 samples)"
        )));
    }
    Ok(())
}

/// Whether grid points could write the same element: two detectors with the
/// same output row, or overlapping intervals.
pub(crate) fn conflicts(rows: &[i32], ivs: &[SampleRange]) -> bool {
    let mut r = rows.to_vec();
    r.sort_unstable();
    if r.windows(2).any(|w| w[0] == w[1]) {
        return true;
    }
    let mut v: Vec<SampleRange> = ivs.iter().copied().filter(|i| i.last > i.first).collect();
    v.sort_unstable_by_key(|i| i.first);
    v.windows(2).any(|w| w[1].first < w[0].last)
}

/// The length of an interval.
pub(crate) fn len(iv: &SampleRange) -> usize {
    (iv.last - iv.first).max(0) as usize
}

/// `(submap, why)` text of a pixel that is not in the map, as the CPU
/// backend words it.
pub(crate) fn pixel_fault(pix: i64, g2l: &[i64], n_pix_submap: i64) -> String {
    let g = pix / n_pix_submap;
    match g2l.get(g as usize) {
        Some(&l) => format!(
            "pixel {pix} is in submap {g}, which is not local to this map (global2local = {l})"
        ),
        None => format!(
            "pixel {pix} is beyond the map ({} submaps x {n_pix_submap} pixels)",
            g2l.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(first: i64, last: i64) -> SampleRange {
        SampleRange { first, last }
    }

    #[test]
    fn conflicts_are_shared_rows_or_overlapping_intervals() {
        assert!(!conflicts(&[0, 1, 2], &[iv(0, 5), iv(5, 9)]));
        assert!(conflicts(&[0, 1, 0], &[iv(0, 5)]));
        assert!(conflicts(&[0], &[iv(4, 9), iv(0, 5)]));
        // Empty intervals overlap nothing.
        assert!(!conflicts(&[0], &[iv(3, 3), iv(0, 5)]));
    }

    #[test]
    fn key_range_is_checked() {
        assert!(check_key_range("k", 1 << 20, 1 << 40).is_err());
        assert!(check_key_range("k", (1 << 20) - 1, (1 << 44) - 1).is_ok());
        assert!(check_key_range("k", 1, 1 << 44).is_err());
    }

    #[test]
    fn pixel_faults_are_worded_as_on_the_cpu() {
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
