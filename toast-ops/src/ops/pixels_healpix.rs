//! HEALPix pixel numbers from detector quaternions (TOAST's `PixelsHealpix`).
//!
//! Like TOAST's operator it also records which submaps its samples hit
//! (the kernel's `hit_submaps`): [`PixelsHealpix::take_hit_submaps`] gives
//! them back, from the device when the kernel ran there, so a device run
//! builds its pixel distribution without the pixels on the host
//! ([`crate::ops::BuildPixelDistribution::from_hit_submaps`]).

use super::util::{pointing_field, select_detectors};
use super::PointingDetectorConfig;
use crate::exec::kernels::{self, view_intervals, HealpixParams, KernelCall};
use crate::exec::movement;
use crate::math::healpix::Nside;
use crate::pixels::{check_submap, PixelDistribution};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use toast_core::observation::defaults;
use toast_core::{
    Category, DType, Data, ExecContext, Observation, OpError, Operator, Requirements,
};

/// Configuration of [`PixelsHealpix`] (TOAST trait names and defaults).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PixelsHealpixConfig {
    /// Whether the operator runs (TOAST's `enabled`).
    pub enabled: bool,
    /// HEALPix resolution.
    pub nside: Nside,
    /// Resolution of the submaps.
    pub nside_submap: Nside,
    /// NESTED (true) or RING ordering.
    pub nest: bool,
    /// Interval list (`None`: the detector pointing's view).
    pub view: Option<String>,
    /// Output detdata field of pixel numbers (i64).
    pub pixels: String,
}

impl Default for PixelsHealpixConfig {
    fn default() -> Self {
        PixelsHealpixConfig {
            enabled: true,
            nside: Nside::new(64).expect("a power of two"),
            nside_submap: Nside::new(16).expect("a power of two"),
            nest: true,
            view: None,
            pixels: defaults::PIXELS.into(),
        }
    }
}

/// Pixel numbers of each sample (the `pixels_healpix` kernel); `-1` on
/// samples whose shared flags have a bit of the detector pointing's mask.
/// It reads the quaternions and flags that its detector pointing
/// configuration names, as TOAST's operator does.
#[derive(Debug, Clone)]
pub struct PixelsHealpix {
    name: String,
    /// The configuration.
    pub config: PixelsHealpixConfig,
    /// The detector pointing it reads.
    pub detector_pointing: PointingDetectorConfig,
    /// Each `exec` replaces the pixel field by one holding only the current
    /// pass's detectors (see [`super::pointing_field`]; on a device its
    /// mirror is one pass's too).
    pub transient: bool,
    /// Write the pixels as i32 (the map-maker's compact pointing, 4 bytes
    /// a sample; ABI minor 8's `pixels_i32`) instead of TOAST's i64: the
    /// same pixel numbers, for a pixelization whose `12 nside²` fits.
    pub compact: bool,
    n_pix_submap: i64,
    n_submap: i64,
    /// The submaps hit since the last [`PixelsHealpix::take_hit_submaps`]
    /// (host copy), and the name of the kernel scratch holding them (one
    /// per operator built, so two operators of one device scope never
    /// share a device copy; a clone shares its original's). Empty until a
    /// kernel call needs it: an operator made only for its items
    /// (`requires`, `provides`) allocates nothing, whatever its nside.
    hit_submaps: Vec<u8>,
    hits_name: String,
    /// Whether a kernel call recorded hits since the last take.
    hits_recorded: bool,
}

/// Numbers the operators' hit-submap scratch names.
static NEXT_HITS: AtomicU64 = AtomicU64::new(0);

impl PixelsHealpix {
    /// An operator; checks `nside` and `nside_submap`.
    pub fn new(
        name: impl Into<String>,
        config: PixelsHealpixConfig,
        detector_pointing: PointingDetectorConfig,
    ) -> Result<Self, OpError> {
        check_submap(config.nside, config.nside_submap)?;
        let n_submap = (i64::from(config.nside) / i64::from(config.nside_submap)).pow(2);
        Ok(PixelsHealpix {
            name: name.into(),
            n_pix_submap: config.nside_submap.npix() as i64,
            n_submap,
            hit_submaps: Vec::new(),
            hits_name: format!(
                "pixels_healpix/{}/hit_submaps",
                NEXT_HITS.fetch_add(1, Ordering::Relaxed)
            ),
            hits_recorded: false,
            transient: false,
            compact: false,
            config,
            detector_pointing,
        })
    }

    /// Total number of pixels (`12 nside²`).
    pub fn n_pix(&self) -> i64 {
        self.config.nside.npix() as i64
    }

    /// Pixels per submap (`12 nside_submap²`).
    pub fn n_pix_submap(&self) -> i64 {
        self.n_pix_submap
    }

    /// Number of submaps (`(nside / nside_submap)²`).
    pub fn n_submap(&self) -> i64 {
        self.n_submap
    }

    /// The view used (its own, else the detector pointing's).
    pub fn view(&self) -> Option<&str> {
        self.config
            .view
            .as_deref()
            .or(self.detector_pointing.view.as_deref())
    }

    /// The submaps (a byte each, 1 where hit) that the samples of this
    /// operator's calls since the last take fell in: the host copy OR the
    /// open device scope's (read back once, a byte a submap, and freed);
    /// `None` when no call was made since. Both start again from zeros.
    pub fn take_hit_submaps(&mut self, ctx: &mut ExecContext) -> Result<Option<Vec<u8>>, OpError> {
        let mut hit = std::mem::take(&mut self.hit_submaps);
        hit.resize(self.n_submap as usize, 0);
        movement::take_scratch(ctx, &self.hits_name, &mut hit)?;
        let recorded = std::mem::take(&mut self.hits_recorded);
        Ok(recorded.then_some(hit))
    }

    /// A distribution of this pixelization that stores the given submaps.
    pub fn distribution(&self, hit: &[u8]) -> Result<PixelDistribution, OpError> {
        PixelDistribution::healpix(
            self.config.nside,
            self.config.nside_submap,
            self.config.nest,
            hit,
        )
    }
}

impl PixelsHealpix {
    /// The detectors of `ob` this pass processes, with the pixels field made
    /// for them: whole, or only theirs when transient
    /// ([`super::pointing_field`]; on a device its mirror is sized to it).
    fn output_field(
        &self,
        ob: &mut Observation,
        ctx: &ExecContext,
    ) -> Result<Vec<String>, OpError> {
        let dets = select_detectors(ctx, ob, self.detector_pointing.det_mask);
        let dtype = if self.compact { DType::I32 } else { DType::I64 };
        pointing_field(ob, &self.config.pixels, dtype, &[], &dets, self.transient)?;
        Ok(dets)
    }
}

impl Operator for PixelsHealpix {
    fn name(&self) -> &str {
        &self.name
    }

    fn requires(&self) -> Requirements {
        let mut r = Requirements::new().detdata(&self.detector_pointing.quats);
        if let Some((f, _)) = self.detector_pointing.shared_flags_in_use() {
            r.add(Category::Shared, f);
        }
        if let Some(v) = self.view() {
            r.add(Category::Intervals, v);
        }
        r
    }

    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.config.pixels)
    }

    fn supports_accel(&self) -> bool {
        true
    }

    fn prepare_outputs(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            self.output_field(ob, ctx)?;
        }
        Ok(())
    }

    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let params = HealpixParams {
            nside: self.config.nside.into(),
            n_pix_submap: self.n_pix_submap,
            nest: self.config.nest,
        };
        let flags = self.detector_pointing.shared_flags_in_use();
        let view = self.view().map(str::to_string);
        let Data { obs, meta } = data;
        for ob in obs.iter_mut() {
            let dets = self.output_field(ob, ctx)?;
            if dets.is_empty() {
                continue;
            }
            let intervals = view_intervals(ob, view.as_deref())?;
            let call = KernelCall {
                operator: &self.name,
                detectors: &dets,
                intervals: &intervals,
            };
            self.hit_submaps.resize(self.n_submap as usize, 0);
            kernels::pixels_healpix(
                ctx,
                call,
                ob,
                meta,
                &self.detector_pointing.quats,
                flags,
                &self.config.pixels,
                params,
                &mut self.hit_submaps,
                &self.hits_name,
            )?;
            self.hits_recorded = true;
        }
        Ok(())
    }
}
