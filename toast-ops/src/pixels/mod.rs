//! Distributed pixel maps: [`PixelDistribution`] and [`PixelData`].
//!
//! As in TOAST, a map of `n_pix` pixels is cut into `n_submap` submaps of
//! `n_pix_submap` pixels, and a process stores only its *local* submaps (the
//! submaps its own pointing hits; the reductions across processes are at
//! the end of this module). A
//! [`PixelData`] holds `n_local_submap × n_pix_submap × n_value` elements,
//! row-major, so the kernels (`scan_map`, `build_noise_weighted`) index it
//! as `[global2local[pix / n_pix_submap], pix % n_pix_submap, k]` with the
//! distribution's `global2local` array (`-1` for submaps not stored here).
//!
//! Both live in [`toast_core::Data::meta`] as objects, under TOAST's keys
//! (`pix_dist`, `mapmaker_hits`, ...). A map shares its distribution
//! through an `Arc`, and maps are compatible when their distributions are
//! equal.
//!
//! [`PixelData::stats`] computes TOAST's MPI-style statistics: the mean and
//! the RMS over **all** `n_submap × n_pix_submap` pixels, unhit ones counted
//! as zeros, with `ddof = 1`. That is what TOAST's `stats.json` reference
//! values were produced with (see the project's `toast-satellite.md` §4).
//! The sums run in pixel order, so the result does not depend on threads.
//!
//! [`covariance`] holds the pixel-domain white-noise covariance: hits and
//! inverse-covariance accumulation, per-pixel inversion with the rcond cut,
//! and its application to a noise-weighted map.

pub mod covariance;
pub mod support;

pub use support::PixelSupport;

pub use crate::io::fits::MapValue;
use crate::math::healpix::Nside;

use std::sync::Arc;
use toast_core::OpError;
use toast_core::{comm_of, Comm, CommError, Data, DataError, Element, ExecContext, ReduceOp};

/// How a map's pixels are cut into submaps, and which submaps are stored here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PixelDistribution {
    n_pix: i64,
    n_submap: i64,
    n_pix_submap: i64,
    local_submaps: Vec<i64>,
    global2local: Vec<i64>,
    nest: bool,
    /// Submaps hit by any process of the job (ascending); the local ones in
    /// a one-process run.
    global_submaps: Vec<i64>,
    /// Submaps hit by more than one process (ascending): the only ones a
    /// reduction has to combine.
    shared_submaps: Vec<i64>,
}

impl PixelDistribution {
    /// A distribution of `n_pix` pixels into `n_submap` submaps (the last
    /// may be padded, as in TOAST), storing `local_submaps` here in the given
    /// order.
    pub fn new(n_pix: i64, n_submap: i64, local_submaps: &[i64]) -> Result<Self, OpError> {
        if n_pix <= 0 || n_submap <= 0 || n_submap > n_pix {
            return Err(OpError::InvalidData {
                what: format!(
                    "pixel distribution: need 0 < n_submap ({n_submap}) <= n_pix ({n_pix})"
                ),
            });
        }
        let mut n_pix_submap = n_pix / n_submap;
        if n_pix % n_submap != 0 {
            n_pix_submap += 1;
        }
        let mut global2local = vec![-1i64; n_submap as usize];
        for (i, &s) in local_submaps.iter().enumerate() {
            if s < 0 || s >= n_submap {
                return Err(OpError::InvalidData {
                    what: format!(
                        "pixel distribution: local submap {s} (entry {i}) is outside \
                         [0, {n_submap})"
                    ),
                });
            }
            if global2local[s as usize] >= 0 {
                return Err(OpError::InvalidData {
                    what: format!("pixel distribution: local submap {s} is listed twice"),
                });
            }
            global2local[s as usize] = i as i64;
        }
        Ok(PixelDistribution {
            n_pix,
            n_submap,
            n_pix_submap,
            global_submaps: {
                let mut g = local_submaps.to_vec();
                g.sort_unstable();
                g
            },
            shared_submaps: Vec::new(),
            local_submaps: local_submaps.to_vec(),
            global2local,
            nest: true,
        })
    }

    /// The HEALPix distribution TOAST's `PixelsHealpix` makes: `12 nside²`
    /// pixels in `(nside / nside_submap)²` submaps of `12 nside_submap²`
    /// pixels, storing the submaps whose entry in `hit` is non-zero.
    pub fn healpix(
        nside: Nside,
        nside_submap: Nside,
        nest: bool,
        hit: &[u8],
    ) -> Result<Self, OpError> {
        check_submap(nside, nside_submap)?;
        let (nside, nside_submap) = (i64::from(nside), i64::from(nside_submap));
        let n_submap = (nside / nside_submap) * (nside / nside_submap);
        if hit.len() as i64 != n_submap {
            return Err(OpError::InvalidData {
                what: format!(
                    "pixel distribution: {} hit-submap flags for {n_submap} submaps",
                    hit.len()
                ),
            });
        }
        let local: Vec<i64> = (0..n_submap).filter(|&s| hit[s as usize] != 0).collect();
        let mut d = Self::new(12 * nside * nside, n_submap, &local)?;
        d.nest = nest;
        Ok(d)
    }

    /// Total number of pixels.
    pub fn n_pix(&self) -> i64 {
        self.n_pix
    }
    /// Number of submaps.
    pub fn n_submap(&self) -> i64 {
        self.n_submap
    }
    /// Pixels per submap.
    pub fn n_pix_submap(&self) -> i64 {
        self.n_pix_submap
    }
    /// Number of submaps stored here.
    pub fn n_local_submap(&self) -> usize {
        self.local_submaps.len()
    }
    /// The submaps stored here, in storage order.
    pub fn local_submaps(&self) -> &[i64] {
        &self.local_submaps
    }
    /// For each global submap, its local index or -1.
    pub fn global2local(&self) -> &[i64] {
        &self.global2local
    }
    /// Whether pixel numbers are HEALPix NESTED.
    pub fn nest(&self) -> bool {
        self.nest
    }

    /// The flat index of global pixel `pix` in a local buffer with one value
    /// per pixel, or `None` when the pixel is negative or its submap is not
    /// stored here.
    #[inline]
    pub fn local_index(&self, pix: i64) -> Option<usize> {
        if pix < 0 || pix >= self.n_pix {
            return None;
        }
        let sm = pix / self.n_pix_submap;
        let loc = self.global2local[sm as usize];
        if loc < 0 {
            return None;
        }
        Some((loc * self.n_pix_submap + (pix - sm * self.n_pix_submap)) as usize)
    }

    /// The global pixel of local flat pixel index `i`.
    pub fn global_pixel(&self, i: usize) -> i64 {
        let nps = self.n_pix_submap as usize;
        self.local_submaps[i / nps] * self.n_pix_submap + (i % nps) as i64
    }

    /// The submaps hit anywhere in the job (ascending): the set the map
    /// reductions run over.
    pub fn global_submaps(&self) -> &[i64] {
        &self.global_submaps
    }

    /// The submaps hit by more than one process (ascending; none in one
    /// process).
    pub fn shared_submaps(&self) -> &[i64] {
        &self.shared_submaps
    }

    /// Set the job-wide hit submaps and those hit by several processes
    /// (both ascending; `global` must contain every local submap and
    /// `shared` must lie in `global`).
    pub fn with_global_submaps(
        mut self,
        global: Vec<i64>,
        shared: Vec<i64>,
    ) -> Result<Self, OpError> {
        if shared.windows(2).any(|w| w[0] >= w[1])
            || shared.iter().any(|s| global.binary_search(s).is_err())
        {
            return Err(OpError::InvalidData {
                what: "pixel distribution: the shared submaps must be ascending and hit".into(),
            });
        }
        if global.windows(2).any(|w| w[0] >= w[1])
            || global.iter().any(|&s| s < 0 || s >= self.n_submap)
        {
            return Err(OpError::InvalidData {
                what: "pixel distribution: the global submaps must be ascending and in range"
                    .into(),
            });
        }
        if let Some(s) = self
            .local_submaps
            .iter()
            .find(|s| global.binary_search(s).is_err())
        {
            return Err(OpError::InvalidData {
                what: format!(
                    "pixel distribution: local submap {s} is missing from the global set"
                ),
            });
        }
        self.global_submaps = global;
        self.shared_submaps = shared;
        Ok(self)
    }

    /// Bytes of the `global2local` array, for device staging.
    pub fn global2local_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.global2local)
    }
}

/// Check that the submaps fit the map, as TOAST's `PixelsHealpix` does
/// (each resolution is valid by construction: [`Nside`]).
pub fn check_submap(nside: Nside, nside_submap: Nside) -> Result<(), OpError> {
    if nside_submap > nside {
        return Err(OpError::Config(format!(
            "nside_submap = {nside_submap} is larger than nside = {nside}"
        )));
    }
    Ok(())
}

/// Statistics of each component of a map (see [`PixelData::stats`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MapStats {
    /// Sum of each component.
    pub sum: Vec<f64>,
    /// Mean of each component.
    pub mean: Vec<f64>,
    /// Standard deviation (ddof 1) of each component.
    pub rms: Vec<f64>,
    /// Number of pixels each statistic is over.
    pub count: u64,
}

/// Values on the local submaps of a [`PixelDistribution`]: `n_value` per
/// pixel, stored `[n_local_submap, n_pix_submap, n_value]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelData<T: Element> {
    dist: Arc<PixelDistribution>,
    n_value: usize,
    data: Vec<T>,
    units: String,
    /// Where the values can be non-zero, when confined
    /// ([`PixelData::confine_to`]).
    support: Option<Arc<PixelSupport>>,
}

/// Take the f64 map `key` out of the metadata (the caller puts it back
/// when done): the rest of the metadata can then be read while the map is
/// written, and nothing is copied.
pub(crate) fn take_map(data: &mut Data, key: &str) -> Result<Box<PixelData<f64>>, OpError> {
    let not_a_map = || OpError::Global {
        key: key.to_string(),
        problem: "not a map (a PixelData of f64)".into(),
    };
    data.meta.object::<PixelData<f64>>(key)?;
    match data.meta.remove(key) {
        Some(toast_core::MetaItem::Object { object, .. }) => {
            object.downcast::<PixelData<f64>>().map_err(|_| not_a_map())
        }
        _ => Err(not_a_map()),
    }
}

impl<T: Element> PixelData<T> {
    /// A zeroed map on ordinary pages, not touched here (a calloc-like
    /// allocation): only the pages that hold a hit pixel ever become
    /// resident, as long as resets and passes over all pixels write only
    /// where a value is non-zero ([`PixelData::reset`], the covariance
    /// inversion). Huge pages (as `toast_core::mem::zeroed_large` advises
    /// for the kernel benchmark's arrays, like numpy) would commit 2 MiB
    /// around every hit pixel: on `xsmall` every page of the maps, 60 MB
    /// more, and no faster (tiny was 0.4 s slower with them).
    pub fn new(dist: Arc<PixelDistribution>, n_value: usize) -> Self {
        let len = dist.n_local_submap() * dist.n_pix_submap() as usize * n_value;
        PixelData {
            dist,
            n_value,
            data: vec![<T as bytemuck::Zeroable>::zeroed(); len],
            units: String::new(),
            support: None,
        }
    }

    /// [`PixelData::new`] for the pipeline's maps, whose size comes from the
    /// input: a map whose memory cannot be had (an address-space or data
    /// limit, no memory left) is an error naming `what` it was for and the
    /// bytes, where `new` would abort the process.
    pub fn try_new(
        dist: Arc<PixelDistribution>,
        n_value: usize,
        what: &str,
    ) -> Result<Self, OpError> {
        let elements =
            (dist.n_local_submap() as u128) * (dist.n_pix_submap() as u128) * (n_value as u128);
        let data = usize::try_from(elements)
            .ok()
            .and_then(toast_core::mem::try_zeroed::<T>)
            .ok_or_else(|| OpError::Global {
                key: what.to_string(),
                problem: format!(
                    "cannot allocate {} bytes for a map of {n_value} value(s) per pixel \
                     (out of memory)",
                    elements * std::mem::size_of::<T>() as u128
                ),
            })?;
        Ok(PixelData {
            dist,
            n_value,
            data,
            units: String::new(),
            support: None,
        })
    }

    /// The distribution.
    pub fn distribution(&self) -> &Arc<PixelDistribution> {
        &self.dist
    }
    /// Values per pixel.
    pub fn n_value(&self) -> usize {
        self.n_value
    }
    /// Number of locally stored pixels.
    pub fn n_local_pix(&self) -> usize {
        self.dist.n_local_submap() * self.dist.n_pix_submap() as usize
    }
    /// The local buffer.
    pub fn data(&self) -> &[T] {
        &self.data
    }
    /// The local buffer, mutably.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }
    /// Units (free text).
    pub fn units(&self) -> &str {
        &self.units
    }
    /// Set the units.
    pub fn set_units(&mut self, units: impl Into<String>) {
        self.units = units.into();
    }
    /// Zero every value. A confined map ([`PixelData::confine_to`]) zeroes
    /// only its support's pixels, and of those only the ones holding a
    /// non-zero byte; the rest are zero already.
    pub fn reset(&mut self) {
        // Every element type's zero is all-zero bits (`T::default()`); the
        // pages of pixels no sample hit stay unmapped
        // ([`toast_core::mem::zero_sparse`]).
        let Some(support) = self.support.clone() else {
            toast_core::mem::zero_sparse(self.as_bytes_mut());
            return;
        };
        support::for_each_support_pixel(&mut self.data, self.n_value, support.pixels(), |_, v| {
            if bytemuck::cast_slice::<T, u8>(v).iter().any(|&b| b != 0) {
                v.fill(<T as bytemuck::Zeroable>::zeroed());
            }
        });
    }

    /// Declare that from now on only `support`'s pixels of this map are
    /// written with non-zero values (the caller's promise: the map is
    /// accumulated only from the samples the support was made of, on this
    /// process, see [`support`]); every value is zeroed here first. Then
    /// [`PixelData::reset`] and the covariance's application
    /// (`covariance::apply_covariance`) visit only those pixels, with the
    /// same result. [`PixelData::unconfine`] ends it.
    pub fn confine_to(&mut self, support: Arc<PixelSupport>) -> Result<(), OpError> {
        if support.n_local_pix() != self.n_local_pix() {
            return Err(OpError::InvalidData {
                what: format!(
                    "a pixel support over {} local pixels for a map of {}",
                    support.n_local_pix(),
                    self.n_local_pix()
                ),
            });
        }
        self.support = None;
        self.reset();
        self.support = Some(support);
        Ok(())
    }

    /// Commit the pages of `support`'s pixels by writing their (zero)
    /// values, in a map that nothing has read or written yet. An
    /// accumulation's first `+=` on an untouched page reads it first,
    /// which maps the kernel's shared zero page, and then writes it, which
    /// replaces that mapping and flushes it from every CPU running the
    /// process (an inter-processor interrupt per page, costly in a virtual
    /// machine: on tiny a tenth of the run's CPU time). Written first, a
    /// page is allocated at once. The values are unchanged (zero); a
    /// support for another layout is ignored.
    pub fn prefault(&mut self, support: &PixelSupport) {
        if support.n_local_pix() != self.n_local_pix() {
            return;
        }
        support::for_each_support_pixel(&mut self.data, self.n_value, support.pixels(), |_, v| {
            // Opaque to the optimiser: the zero stores into zeroed memory
            // must happen.
            std::hint::black_box(v).fill(<T as bytemuck::Zeroable>::zeroed());
        });
    }

    /// End a confinement: the map may be written anywhere again.
    pub fn unconfine(&mut self) {
        self.support = None;
    }

    /// The support the map is confined to, if any.
    pub fn support(&self) -> Option<&Arc<PixelSupport>> {
        self.support.as_ref()
    }
    /// The values of global pixel `pix`, if it is stored here.
    pub fn pixel(&self, pix: i64) -> Option<&[T]> {
        let i = self.dist.local_index(pix)?;
        Some(&self.data[i * self.n_value..(i + 1) * self.n_value])
    }
    /// Raw bytes, for device staging.
    pub fn as_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.data)
    }
    /// Raw bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.data)
    }

    /// The full-sky map in the distribution's pixel order (`n_pix × n_value`,
    /// pixels not stored here as zeros), as the FITS writers want it.
    pub fn to_full_sky(&self) -> Vec<T> {
        let nv = self.n_value;
        let mut out = vec![T::default(); self.dist.n_pix() as usize * nv];
        let nps = self.dist.n_pix_submap() as usize;
        for (loc, &sm) in self.dist.local_submaps().iter().enumerate() {
            let first = sm as usize * nps;
            let n = nps.min(self.dist.n_pix() as usize - first);
            out[first * nv..(first + n) * nv]
                .copy_from_slice(&self.data[loc * nps * nv..(loc * nps + n) * nv]);
        }
        out
    }

    /// Value `k` of every pixel of the full sky, read in place (pixels not
    /// stored here read as zeros): what [`PixelData::full_sky_component`]
    /// copies out, for writers that stream it.
    pub fn column(&self, k: usize) -> crate::io::fits::SubmapColumn<'_, T> {
        crate::io::fits::SubmapColumn {
            data: &self.data,
            n_value: self.n_value,
            value: k,
            n_pix_submap: self.dist.n_pix_submap() as usize,
            global2local: self.dist.global2local(),
            n_pix: self.dist.n_pix() as usize,
        }
    }

    /// Value `k` of every pixel of the full sky, in the distribution's pixel
    /// order (pixels not stored here as zeros): one Stokes component of an
    /// I/Q/U map, as the FITS writers and plots want it.
    pub fn full_sky_component(&self, k: usize) -> Vec<T> {
        let nv = self.n_value;
        let mut out = vec![T::default(); self.dist.n_pix() as usize];
        let nps = self.dist.n_pix_submap() as usize;
        for (loc, &sm) in self.dist.local_submaps().iter().enumerate() {
            let first = sm as usize * nps;
            let n = nps.min(self.dist.n_pix() as usize - first);
            let src = &self.data[loc * nps * nv..(loc * nps + n) * nv];
            for (d, v) in out[first..first + n].iter_mut().zip(src.chunks_exact(nv)) {
                *d = v[k];
            }
        }
        out
    }
}

impl<T: MapValue> PixelData<T> {
    /// TOAST's MPI-style statistics: for each component, the sum, the mean
    /// over all `n_submap × n_pix_submap` pixels (pixels of submaps not
    /// stored here count as zeros) and the standard deviation with
    /// `ddof = 1`, by two passes in pixel order.
    pub fn stats(&self) -> MapStats {
        let nv = self.n_value;
        let n_total = (self.dist.n_submap() * self.dist.n_pix_submap()) as u64;
        let n_local = self.n_local_pix() as u64;
        let mut sum = vec![0.0f64; nv];
        for px in self.data.chunks_exact(nv.max(1)) {
            for (s, &x) in sum.iter_mut().zip(px) {
                *s += x.to_f64();
            }
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / n_total as f64).collect();
        let mut var = vec![0.0f64; nv];
        for px in self.data.chunks_exact(nv.max(1)) {
            for ((v, &x), m) in var.iter_mut().zip(px).zip(&mean) {
                let d = x.to_f64() - m;
                *v += d * d;
            }
        }
        // Pixels of submaps stored elsewhere are zeros.
        let n_zero = (n_total - n_local) as f64;
        for (v, m) in var.iter_mut().zip(&mean) {
            *v += n_zero * m * m;
        }
        let rms = var
            .iter()
            .map(|v| {
                if n_total > 1 {
                    (v / (n_total - 1) as f64).sqrt()
                } else {
                    0.0
                }
            })
            .collect();
        MapStats {
            sum,
            mean,
            rms,
            count: n_total,
        }
    }
}

/// The distribution stored at `key` in the data.
pub fn get_distribution(data: &Data, key: &str) -> Result<Arc<PixelDistribution>, DataError> {
    data.meta.object::<Arc<PixelDistribution>>(key).cloned()
}

/// A map of element type `T` stored at `key`.
pub fn get_map<'a, T: Element>(data: &'a Data, key: &str) -> Result<&'a PixelData<T>, DataError> {
    data.meta.object::<PixelData<T>>(key)
}

/// A map of element type `T` stored at `key`, mutably.
pub fn get_map_mut<'a, T: Element>(
    data: &'a mut Data,
    key: &str,
) -> Result<&'a mut PixelData<T>, DataError> {
    data.meta.object_mut::<PixelData<T>>(key)
}

// ---------------------------------------------------------------------------
// Reductions across processes.
//
// Each process accumulates hits, inverse covariance and noise-weighted maps
// over its own samples into its own (hit) submaps; the sums over the job
// are taken by an allreduce over the job-wide hit submaps
// ([`PixelDistribution::global_submaps`]; only those hit by several
// processes, [`PixelDistribution::shared_submaps`], need combining) in chunks of at most
// [`SYNC_CHUNK_BYTES`], so a process never stores more than its own
// submaps plus one chunk. This is TOAST's `sync_type = "allreduce"` scheme;
// docs/DISTRIBUTED.md says why it serves both `sync_type` values.

/// Timer frame of the map reductions (hits, covariance, noise-weighted maps).
pub const SYNC_TIMER: &str = "sync_map";

/// Largest buffer of one map-reduction step (bytes).
pub const SYNC_CHUNK_BYTES: usize = 16 << 20;

/// Map element types that can be reduced across processes.
pub trait Reducible: Element + Copy + Default {
    /// Elementwise reduction onto every process.
    fn allreduce(comm: &dyn Comm, buf: &mut [Self], op: ReduceOp) -> Result<(), CommError>;
    /// Elementwise reduction onto `root`.
    fn reduce(
        comm: &dyn Comm,
        root: usize,
        buf: &mut [Self],
        op: ReduceOp,
    ) -> Result<(), CommError>;
}

impl Reducible for f64 {
    fn allreduce(comm: &dyn Comm, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        comm.allreduce_f64(buf, op)
    }
    fn reduce(
        comm: &dyn Comm,
        root: usize,
        buf: &mut [f64],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        comm.reduce_f64(root, buf, op)
    }
}

impl Reducible for i64 {
    fn allreduce(comm: &dyn Comm, buf: &mut [i64], op: ReduceOp) -> Result<(), CommError> {
        comm.allreduce_i64(buf, op)
    }
    fn reduce(
        comm: &dyn Comm,
        root: usize,
        buf: &mut [i64],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        comm.reduce_i64(root, buf, op)
    }
}

fn comm_err(what: &str, source: CommError) -> OpError {
    OpError::Comm {
        what: what.to_string(),
        source,
    }
}

/// Number of whole submaps of `per_submap` elements of `T` in one chunk.
fn chunk_submaps<T>(per_submap: usize) -> usize {
    (SYNC_CHUNK_BYTES / (per_submap * std::mem::size_of::<T>()).max(1)).max(1)
}

/// Replace every process's local submaps of `map` by their sum over all
/// processes (TOAST's `PixelData.sync_allreduce`). A no-op in one process.
pub fn sync_sum<T: Reducible>(comm: &dyn Comm, map: &mut PixelData<T>) -> Result<(), OpError> {
    if comm.size() == 1 {
        return Ok(());
    }
    let dist = Arc::clone(&map.dist);
    let per = dist.n_pix_submap() as usize * map.n_value;
    let g2l = dist.global2local();
    let mut buf: Vec<T> = Vec::new();
    // A submap hit by one process already holds its job-wide sum there.
    for chunk in dist.shared_submaps().chunks(chunk_submaps::<T>(per)) {
        buf.clear();
        buf.resize(chunk.len() * per, T::default());
        for (i, &gs) in chunk.iter().enumerate() {
            let loc = g2l[gs as usize];
            if loc >= 0 {
                let loc = loc as usize;
                buf[i * per..(i + 1) * per].copy_from_slice(&map.data[loc * per..(loc + 1) * per]);
            }
        }
        T::allreduce(comm, &mut buf, ReduceOp::Sum).map_err(|e| comm_err("map reduction", e))?;
        for (i, &gs) in chunk.iter().enumerate() {
            let loc = g2l[gs as usize];
            if loc >= 0 {
                let loc = loc as usize;
                map.data[loc * per..(loc + 1) * per].copy_from_slice(&buf[i * per..(i + 1) * per]);
            }
        }
    }
    Ok(())
}

/// [`sync_sum`] of the f64 maps under `f64_keys` and the i64 maps under
/// `i64_keys` in `data.meta`, timed as [`SYNC_TIMER`]; nothing in one
/// process.
pub fn sync_maps(
    data: &mut Data,
    ctx: &mut ExecContext,
    f64_keys: &[&str],
    i64_keys: &[&str],
) -> Result<(), OpError> {
    let comm = comm_of(ctx);
    if comm.size() == 1 {
        return Ok(());
    }
    ctx.timers.enter(SYNC_TIMER)?;
    let mut sync = || -> Result<(), OpError> {
        for k in i64_keys {
            sync_sum(&*comm, data.meta.object_mut::<PixelData<i64>>(k)?)?;
        }
        for k in f64_keys {
            sync_sum(&*comm, data.meta.object_mut::<PixelData<f64>>(k)?)?;
        }
        Ok(())
    };
    let r = sync();
    ctx.timers.exit(SYNC_TIMER)?;
    r
}

/// The job-wide hit submaps (hit by any process) and the shared ones (hit
/// by more than one), ascending, from every process's `hit` flags (one per
/// submap).
pub fn global_hit_submaps(comm: &dyn Comm, hit: &[u8]) -> Result<(Vec<i64>, Vec<i64>), OpError> {
    let mut count: Vec<i64> = hit.iter().map(|&h| i64::from(h != 0)).collect();
    comm.allreduce_i64(&mut count, ReduceOp::Sum)
        .map_err(|e| comm_err("hit submaps", e))?;
    let pick = |min: i64| {
        (0..count.len() as i64)
            .filter(|&s| count[s as usize] >= min)
            .collect::<Vec<i64>>()
    };
    Ok((pick(1), pick(2)))
}

/// The whole map (every job-wide hit submap) on `root`, `None` elsewhere:
/// each submap is taken from the lowest rank that stores it. A clone in
/// one process. KernelCall on every process after the map was synchronised.
pub fn gather_map<T: Reducible>(
    comm: &dyn Comm,
    map: &PixelData<T>,
    root: usize,
) -> Result<Option<PixelData<T>>, OpError> {
    if comm.size() == 1 {
        return Ok(Some(map.clone()));
    }
    let dist = &map.dist;
    let rank = comm.rank() as i64;
    let mut owner = vec![comm.size() as i64; dist.n_submap() as usize];
    for &s in dist.local_submaps() {
        owner[s as usize] = rank;
    }
    comm.allreduce_i64(&mut owner, ReduceOp::Min)
        .map_err(|e| comm_err("map gather", e))?;
    let global = dist.global_submaps().to_vec();
    let mut full = PixelDistribution::new(dist.n_pix(), dist.n_submap(), &global)?;
    full.nest = dist.nest();
    let mut out = if comm.rank() == root {
        Some(PixelData::try_new(
            Arc::new(full),
            map.n_value,
            "the gathered full-sky map",
        )?)
    } else {
        None
    };
    if let Some(o) = out.as_mut() {
        o.units = map.units.clone();
    }
    let per = dist.n_pix_submap() as usize * map.n_value;
    let g2l = dist.global2local();
    let mut buf: Vec<T> = Vec::new();
    let mut done = 0usize;
    for chunk in global.chunks(chunk_submaps::<T>(per)) {
        buf.clear();
        buf.resize(chunk.len() * per, T::default());
        for (i, &gs) in chunk.iter().enumerate() {
            if owner[gs as usize] == rank {
                let loc = g2l[gs as usize] as usize;
                buf[i * per..(i + 1) * per].copy_from_slice(&map.data[loc * per..(loc + 1) * per]);
            }
        }
        T::reduce(comm, root, &mut buf, ReduceOp::Sum).map_err(|e| comm_err("map gather", e))?;
        if let Some(o) = out.as_mut() {
            o.data[done * per..(done + chunk.len()) * per].copy_from_slice(&buf);
        }
        done += chunk.len();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healpix_distribution_layout() {
        let mut hit = vec![0u8; 16];
        hit[3] = 1;
        hit[10] = 1;
        let n = |n: u64| Nside::new(n).unwrap();
        let d = PixelDistribution::healpix(n(8), n(2), true, &hit).unwrap();
        assert_eq!(d.n_pix(), 768);
        assert_eq!(d.n_submap(), 16);
        assert_eq!(d.n_pix_submap(), 48);
        assert_eq!(d.local_submaps(), &[3, 10]);
        assert_eq!(d.global2local()[3], 0);
        assert_eq!(d.global2local()[10], 1);
        assert_eq!(d.global2local()[0], -1);
        assert_eq!(d.local_index(3 * 48 + 5), Some(5));
        assert_eq!(d.local_index(10 * 48), Some(48));
        assert_eq!(d.local_index(0), None);
        assert_eq!(d.local_index(-1), None);
        assert_eq!(d.global_pixel(49), 10 * 48 + 1);
        assert!(Nside::new(6).is_err());
        assert!(PixelDistribution::healpix(n(8), n(16), true, &hit).is_err());
        assert!(PixelDistribution::new(10, 3, &[5]).is_err());
        assert!(PixelDistribution::new(10, 3, &[1, 1]).is_err());
    }

    #[test]
    fn stats_count_unhit_pixels_as_zeros() {
        // 4 submaps of 3 pixels, one stored.
        let d = Arc::new(PixelDistribution::new(12, 4, &[2]).unwrap());
        let mut m = PixelData::<f64>::new(d, 2);
        m.data_mut()
            .copy_from_slice(&[1.0, -1.0, 2.0, 0.0, 3.0, 1.0]);
        let s = m.stats();
        let full = m.to_full_sky();
        assert_eq!(full.len(), 24);
        assert_eq!(&full[12..18], &[1.0, -1.0, 2.0, 0.0, 3.0, 1.0]);
        for c in 0..2 {
            let xs: Vec<f64> = full.iter().skip(c).step_by(2).copied().collect();
            let mean = xs.iter().sum::<f64>() / 12.0;
            let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / 11.0;
            assert!((s.mean[c] - mean).abs() < 1e-15);
            assert!((s.rms[c] - var.sqrt()).abs() < 1e-14);
        }
        assert_eq!(s.sum, vec![6.0, 0.0]);
        assert_eq!(s.count, 12);
    }
}
