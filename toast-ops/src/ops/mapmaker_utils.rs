//! Map-domain accumulations (TOAST's `mapmaker_utils`): the pixel
//! distribution (a host scan of the pixels), the hit map and the inverse
//! covariance (the `cov_accum_timestream` kernel; TOAST does them on the
//! host), and the noise-weighted map (the `build_noise_weighted` kernel).

use super::noise_weight::detector_weights;
use super::util::select_detectors;
use super::PixelsHealpix;
use crate::exec::kernels::{self, view_intervals, CovMaps, KernelCall, PointingFields};
use crate::pixels::covariance::block_size;
use crate::pixels::{global_hit_submaps, PixelData, PixelDistribution};
use std::sync::Arc;
use toast_core::observation::defaults;
use toast_core::{
    comm_of, Category, Data, Element, ExecContext, Meta, Observation, OpError, Operator,
    PixelOutOfRange, Requirements,
};

/// Which samples and detectors a map-domain operator uses: a detector is
/// skipped when its flags have a bit of `det_mask`; a sample is skipped when
/// its detector flags have a bit of `det_flag_mask` or its shared flags a bit
/// of `shared_flag_mask`, or when its pixel is negative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagSelection {
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Per-sample detector flags field (`None`: none).
    pub det_flags: Option<String>,
    /// Detector flag bits that exclude a sample.
    pub det_flag_mask: u8,
    /// Shared flags field (`None`: none).
    pub shared_flags: Option<String>,
    /// Shared flag bits that exclude a sample.
    pub shared_flag_mask: u8,
}

impl Default for FlagSelection {
    /// TOAST's defaults: non-science detector and shared flags.
    fn default() -> Self {
        FlagSelection {
            det_mask: defaults::DET_MASK_NONSCIENCE,
            det_flags: Some(defaults::DET_FLAGS.into()),
            det_flag_mask: defaults::DET_MASK_NONSCIENCE,
            shared_flags: Some(defaults::SHARED_FLAGS.into()),
            shared_flag_mask: defaults::SHARED_MASK_NONSCIENCE,
        }
    }
}

impl FlagSelection {
    /// Adds the flag fields this selection reads: those whose mask is not 0
    /// ([`Self::det`], [`Self::shared`]).
    pub(crate) fn add_requirements(&self, r: &mut Requirements) {
        if let Some((f, _)) = self.det() {
            r.add(Category::DetData, f);
        }
        if let Some((f, _)) = self.shared() {
            r.add(Category::Shared, f);
        }
    }

    /// The detector flags to use, if any (`None` when the mask is 0).
    pub fn det(&self) -> Option<(&str, u8)> {
        self.det_flags
            .as_deref()
            .filter(|_| self.det_flag_mask != 0)
            .map(|f| (f, self.det_flag_mask))
    }

    /// The shared flags to use, if any (`None` when the mask is 0).
    pub fn shared(&self) -> Option<(&str, u8)> {
        self.shared_flags
            .as_deref()
            .filter(|_| self.shared_flag_mask != 0)
            .map(|f| (f, self.shared_flag_mask))
    }

    /// The per-sample cut of detector `det` of `ob`: `cut[s]` is true when the
    /// sample is excluded by its flags.
    pub fn sample_cut(&self, ob: &Observation, det: &str) -> Result<Vec<bool>, OpError> {
        let mut cut = vec![false; ob.n_samples()];
        if let Some((name, mask)) = self.shared() {
            let f = ob.shared.get(name)?;
            f.check::<u8>(&[])?;
            for (c, &x) in cut.iter_mut().zip(f.data::<u8>()?) {
                *c |= x & mask != 0;
            }
        }
        if let Some((name, mask)) = self.det() {
            let f = ob.detdata.get(name)?;
            f.check::<u8>(&[])?;
            for (c, &x) in cut.iter_mut().zip(f.row_of::<u8>(det)?) {
                *c |= x & mask != 0;
            }
        }
        Ok(cut)
    }
}

/// The sample ranges of a view, as host ranges.
fn view_ranges(ob: &Observation, view: Option<&str>) -> Result<Vec<(usize, usize)>, OpError> {
    Ok(view_intervals(ob, view)?
        .iter()
        .map(|iv| (iv.first as usize, iv.last as usize))
        .collect())
}

/// Call `f` once per observation of `data` with a kernel call of
/// `operator` over the detectors `det_mask` keeps (an observation without
/// any is skipped) and the intervals of `view`: the loop of the map-domain
/// accumulations, whose work is one kernel call per observation.
fn per_observation(
    data: &mut Data,
    ctx: &mut ExecContext,
    operator: &str,
    det_mask: u8,
    view: Option<&str>,
    mut f: impl FnMut(
        &mut ExecContext,
        KernelCall<'_>,
        &mut Observation,
        &mut Meta,
    ) -> Result<(), OpError>,
) -> Result<(), OpError> {
    let Data { obs, meta } = data;
    for ob in obs.iter_mut() {
        let dets = select_detectors(ctx, ob, det_mask);
        if dets.is_empty() {
            continue;
        }
        let intervals = view_intervals(ob, view)?;
        let call = KernelCall {
            operator,
            detectors: &dets,
            intervals: &intervals,
        };
        f(ctx, call, ob, meta)?;
    }
    Ok(())
}

/// Get or create a map at `key` on `dist` (the distribution at `dist_key`)
/// with `n_value` values per pixel. A new map is prefaulted at the pixels
/// of a support registered for `dist_key` (see
/// [`crate::pixels::support::support_key`]).
pub(crate) fn ensure_map<T: Element>(
    data: &mut Data,
    key: &str,
    dist_key: &str,
    dist: &Arc<PixelDistribution>,
    n_value: usize,
) -> Result<(), OpError> {
    if data.meta.contains(key) {
        let m = data.meta.object::<PixelData<T>>(key)?;
        if m.distribution() != dist || m.n_value() != n_value {
            return Err(OpError::Global {
                key: key.to_string(),
                problem: format!(
                    "the existing map has another pixel distribution or {} values per pixel \
                     instead of {n_value}",
                    m.n_value()
                ),
            });
        }
        return Ok(());
    }
    let mut map = PixelData::<T>::try_new(Arc::clone(dist), n_value, key)?;
    if let Ok(support) = data
        .meta
        .object::<Arc<crate::pixels::PixelSupport>>(&crate::pixels::support::support_key(dist_key))
    {
        map.prefault(support);
    }
    data.meta.set_object(key, map);
    Ok(())
}

/// Build the pixel distribution from the pixels of the selected detectors:
/// the submaps any sample hits are local (TOAST's `BuildPixelDistribution`;
/// host only). Repeated `exec` calls (detector sets) accumulate.
#[derive(Debug, Clone)]
pub struct BuildPixelDistribution {
    name: String,
    /// Global key of the distribution.
    pub pixel_dist: String,
    pixels: PixelsHealpix,
    hit: Vec<u8>,
}

impl BuildPixelDistribution {
    /// An operator for the pixelization of `pixels` (its field, view and
    /// detector mask).
    pub fn new(
        name: impl Into<String>,
        pixel_dist: impl Into<String>,
        pixels: &PixelsHealpix,
    ) -> Self {
        BuildPixelDistribution {
            name: name.into(),
            pixel_dist: pixel_dist.into(),
            hit: vec![0; pixels.n_submap() as usize],
            pixels: pixels.clone(),
        }
    }
}

impl Operator for BuildPixelDistribution {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new().detdata(&self.pixels.config.pixels);
        if let Some(v) = self.pixels.view() {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.pixel_dist)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let nps = self.pixels.n_pix_submap();
        let n_pix = self.pixels.n_pix();
        for ob in &data.obs {
            let dets = select_detectors(ctx, ob, self.pixels.detector_pointing.det_mask);
            let ranges = view_ranges(ob, self.pixels.view())?;
            let field = ob.detdata.get(&self.pixels.config.pixels)?;
            field.check::<i64>(&[])?;
            for d in &dets {
                let pix = field.row_of::<i64>(d)?;
                for &(a, b) in &ranges {
                    for (s, &p) in pix[a..b].iter().enumerate() {
                        if p >= n_pix {
                            return Err(PixelOutOfRange {
                                what: format!("{}: hit submaps", self.name),
                                observation: ob.name().to_string(),
                                detector: d.clone(),
                                sample: a + s,
                                pixel: p,
                                limit: format!(
                                    "is beyond the {n_pix} pixels of nside {}",
                                    self.pixels.config.nside
                                ),
                            }
                            .into());
                        }
                        if p >= 0 {
                            self.hit[(p / nps) as usize] = 1;
                        }
                    }
                }
            }
        }
        self.publish(data, ctx)
    }
}

impl BuildPixelDistribution {
    /// The distribution of the submaps `hit` (a byte a submap, as
    /// [`PixelsHealpix::take_hit_submaps`] gives them) and those already
    /// seen, without reading the pixels: what a device run does, whose
    /// pixels are on the device (the kernel recorded the hit submaps there;
    /// the same set the host pass finds, since both mark the submap of
    /// every sample with a pixel, in the same view and detectors).
    pub fn from_hit_submaps(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        hit: &[u8],
    ) -> Result<(), OpError> {
        if hit.len() != self.hit.len() {
            return Err(OpError::State {
                what: format!(
                    "{}: {} hit submaps given for a pixelization of {}",
                    self.name,
                    hit.len(),
                    self.hit.len()
                ),
            });
        }
        for (h, &g) in self.hit.iter_mut().zip(hit) {
            *h |= u8::from(g != 0);
        }
        self.publish(data, ctx)
    }

    /// Reduce the hit set over the job and store the distribution.
    fn publish(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        // The job-wide hit set: what the map reductions run over.
        let comm = comm_of(ctx);
        let (global, shared) = global_hit_submaps(&*comm, &self.hit)?;
        let dist = Arc::new(
            self.pixels
                .distribution(&self.hit)?
                .with_global_submaps(global, shared)?,
        );
        data.meta.set_object(&self.pixel_dist, dist);
        Ok(())
    }
}

/// Accumulate the hit map (TOAST's `BuildHitMap`, the
/// `cov_accum_timestream` kernel): one hit per unflagged sample with a valid
/// pixel. Accumulates into an existing map.
#[derive(Debug, Clone)]
pub struct BuildHitMap {
    name: String,
    /// Global key of the pixel distribution.
    pub pixel_dist: String,
    /// Global key of the hit map (`PixelData<i64>`, one value).
    pub hits: String,
    /// Pixel field.
    pub pixels: String,
    /// Interval list.
    pub view: Option<String>,
    /// Flags.
    pub flags: FlagSelection,
}

impl BuildHitMap {
    /// An operator.
    pub fn new(
        name: impl Into<String>,
        pixel_dist: impl Into<String>,
        hits: impl Into<String>,
        pixels: impl Into<String>,
        view: Option<String>,
        flags: FlagSelection,
    ) -> Self {
        BuildHitMap {
            name: name.into(),
            pixel_dist: pixel_dist.into(),
            hits: hits.into(),
            pixels: pixels.into(),
            view,
            flags,
        }
    }
}

impl Operator for BuildHitMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(&self.pixel_dist)
            .detdata(&self.pixels);
        self.flags.add_requirements(&mut r);
        if let Some(v) = &self.view {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.hits)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        let dist = crate::pixels::get_distribution(data, &self.pixel_dist)?;
        ensure_map::<i64>(data, &self.hits, &self.pixel_dist, &dist, 1)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.prepare_outputs(data, ctx)?;
        let (pixels, pixel_dist) = (&self.pixels, &self.pixel_dist);
        let flags = &self.flags;
        let hits = CovMaps::Hits(&self.hits);
        per_observation(
            data,
            ctx,
            &self.name,
            flags.det_mask,
            self.view.as_deref(),
            |ctx, call, ob, meta| {
                kernels::cov_accum_timestream(
                    ctx,
                    call,
                    ob,
                    meta,
                    hits,
                    pixels,
                    pixel_dist,
                    flags.det(),
                    flags.shared(),
                )
            },
        )
    }
}

/// Accumulate the inverse pixel covariance `Σ w_det p pᵀ` (TOAST's
/// `BuildInverseCovariance`, the `cov_accum_timestream` kernel), packed
/// upper triangle per pixel.
#[derive(Debug, Clone)]
pub struct BuildInverseCovariance {
    name: String,
    /// Global key of the pixel distribution.
    pub pixel_dist: String,
    /// Global key of the output (`PixelData<f64>`, `nnz(nnz+1)/2` values).
    pub inverse_covariance: String,
    /// Pixel field.
    pub pixels: String,
    /// Stokes weight field.
    pub weights: String,
    /// Observation key of the noise model.
    pub noise_model: String,
    /// Interval list.
    pub view: Option<String>,
    /// Flags.
    pub flags: FlagSelection,
}

impl BuildInverseCovariance {
    /// An operator.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: impl Into<String>,
        pixel_dist: impl Into<String>,
        inverse_covariance: impl Into<String>,
        pixels: impl Into<String>,
        weights: impl Into<String>,
        noise_model: impl Into<String>,
        view: Option<String>,
        flags: FlagSelection,
    ) -> Self {
        BuildInverseCovariance {
            name: name.into(),
            pixel_dist: pixel_dist.into(),
            inverse_covariance: inverse_covariance.into(),
            pixels: pixels.into(),
            weights: weights.into(),
            noise_model: noise_model.into(),
            view,
            flags,
        }
    }
}

/// The number of Stokes weights of field `weights` (its per-sample shape),
/// the same in every observation that has it.
pub(crate) fn weights_nnz(data: &Data, weights: &str) -> Result<usize, OpError> {
    let mut nnz = None;
    for ob in &data.obs {
        if let Ok(f) = ob.detdata.get(weights) {
            let n = f.sample_shape().iter().product::<usize>().max(1);
            match nnz {
                None => nnz = Some(n),
                Some(m) if m != n => {
                    return Err(OpError::InvalidData {
                        what: format!(
                            "observation '{}': Stokes weights '{weights}' have {n} values per \
                             sample, other observations {m}",
                            ob.name()
                        ),
                    })
                }
                _ => {}
            }
        }
    }
    nnz.ok_or_else(|| OpError::InvalidData {
        what: format!("no observation has the Stokes weights '{weights}'"),
    })
}

impl Operator for BuildInverseCovariance {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(&self.pixel_dist)
            .meta(&self.noise_model)
            .detdata(&self.pixels)
            .detdata(&self.weights);
        self.flags.add_requirements(&mut r);
        if let Some(v) = &self.view {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.inverse_covariance)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        let dist = crate::pixels::get_distribution(data, &self.pixel_dist)?;
        let nnz = weights_nnz(data, &self.weights)?;
        ensure_map::<f64>(
            data,
            &self.inverse_covariance,
            &self.pixel_dist,
            &dist,
            block_size(nnz),
        )
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.prepare_outputs(data, ctx)?;
        let (pixels, weights, pixel_dist) = (&self.pixels, &self.weights, &self.pixel_dist);
        let (flags, noise_model) = (&self.flags, &self.noise_model);
        let map = &self.inverse_covariance;
        per_observation(
            data,
            ctx,
            &self.name,
            flags.det_mask,
            self.view.as_deref(),
            |ctx, call, ob, meta| {
                let det_scale = detector_weights(ob, noise_model, call.detectors)?;
                let maps = CovMaps::InverseCovariance {
                    map,
                    weights,
                    det_scale: &det_scale,
                };
                kernels::cov_accum_timestream(
                    ctx,
                    call,
                    ob,
                    meta,
                    maps,
                    pixels,
                    pixel_dist,
                    flags.det(),
                    flags.shared(),
                )
            },
        )
    }
}

/// Accumulate the noise-weighted map `Σ w_det d p` (TOAST's
/// `BuildNoiseWeighted`, the `build_noise_weighted` kernel). Accumulates
/// into an existing map; creates it (zeroed) if missing.
#[derive(Debug, Clone)]
pub struct BuildNoiseWeighted {
    name: String,
    /// Global key of the pixel distribution.
    pub pixel_dist: String,
    /// Global key of the output map (`PixelData<f64>`, nnz values).
    pub zmap: String,
    /// Pixel field.
    pub pixels: String,
    /// Stokes weight field.
    pub weights: String,
    /// Timestream field.
    pub det_data: String,
    /// Observation key of the noise model.
    pub noise_model: String,
    /// Interval list.
    pub view: Option<String>,
    /// Flags.
    pub flags: FlagSelection,
}

impl BuildNoiseWeighted {
    /// An operator.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: impl Into<String>,
        pixel_dist: impl Into<String>,
        zmap: impl Into<String>,
        pixels: impl Into<String>,
        weights: impl Into<String>,
        det_data: impl Into<String>,
        noise_model: impl Into<String>,
        view: Option<String>,
        flags: FlagSelection,
    ) -> Self {
        BuildNoiseWeighted {
            name: name.into(),
            pixel_dist: pixel_dist.into(),
            zmap: zmap.into(),
            pixels: pixels.into(),
            weights: weights.into(),
            det_data: det_data.into(),
            noise_model: noise_model.into(),
            view,
            flags,
        }
    }
}

impl Operator for BuildNoiseWeighted {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = Requirements::new()
            .global(&self.pixel_dist)
            .meta(&self.noise_model)
            .detdata(&self.pixels)
            .detdata(&self.weights)
            .detdata(&self.det_data);
        self.flags.add_requirements(&mut r);
        if let Some(v) = &self.view {
            r.add(Category::Intervals, v);
        }
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new().global(&self.zmap)
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        let dist = crate::pixels::get_distribution(data, &self.pixel_dist)?;
        let nnz = weights_nnz(data, &self.weights)?;
        ensure_map::<f64>(data, &self.zmap, &self.pixel_dist, &dist, nnz)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        self.prepare_outputs(data, ctx)?;
        let pointing = PointingFields {
            pixels: &self.pixels,
            weights: &self.weights,
            pixel_dist: &self.pixel_dist,
        };
        let (flags, noise_model) = (&self.flags, &self.noise_model);
        let (zmap, det_data) = (&self.zmap, &self.det_data);
        per_observation(
            data,
            ctx,
            &self.name,
            flags.det_mask,
            self.view.as_deref(),
            |ctx, call, ob, meta| {
                let det_scale = detector_weights(ob, noise_model, call.detectors)?;
                kernels::build_noise_weighted(
                    ctx,
                    call,
                    ob,
                    meta,
                    zmap,
                    pointing,
                    det_data,
                    flags.det(),
                    flags.shared(),
                    &det_scale,
                )
            },
        )
    }
}
