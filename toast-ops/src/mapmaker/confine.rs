//! The solver's binned map confined to the pixels its samples reach
//! ([`crate::pixels::support`]): the map reset and `m ← C m`, twice per CG
//! iteration, visit those pixels only (on tiny 144,233 of 2,798,592 local
//! pixels) with the same values as the full passes.
//!
//! The support is registered for the solver's pixel distribution once its
//! pointing exists ([`MapMaker::register_support`]) and removed at the end
//! of the run: every map made for that distribution in between (hits,
//! covariance, the solver's and the final binned maps) is prefaulted at
//! those pixels ([`PixelData::prefault`]), and the solver's map is
//! confined to them.
//!
//! It applies where the promise of [`PixelData::confine_to`] holds: a host
//! run (a device copy is reset and multiplied by the kernels) of one
//! process (a map summed over processes is non-zero where other processes'
//! samples point), with the solver's pixels resident (kept with
//! `full_pointing`, or compact). The support is made of every local
//! detector's pixels, a superset of the samples any solver pass
//! accumulates; if a row holds a pixel outside the local submaps (a
//! detector the pointing skipped), the map is simply not confined.

use super::products::Keys;
use super::MapMaker;
use crate::ops::mapmaker_utils::ensure_map;
use crate::pixels::covariance::nnz_of_block;
use crate::pixels::support::support_key;
use crate::pixels::{get_distribution, PixelData, PixelSupport};
use std::sync::Arc;
use toast_core::{comm_of, Data, ExecContext, OpError};

impl MapMaker {
    /// Register the support of the solver's pixels for its pixel
    /// distribution (see [`crate::pixels::support::support_key`]) when it
    /// applies (see the module doc): the maps made for it are prefaulted
    /// at those pixels, and the solver's map can be confined. Returns
    /// whether it did. `compact`: this run made the compact pixels.
    pub(super) fn register_support(
        &self,
        data: &mut Data,
        ctx: &ExecContext,
        compact: bool,
    ) -> Result<bool, OpError> {
        if ctx.use_accel || crate::exec::movement::scope_open(ctx) || comm_of(ctx).size() > 1 {
            return Ok(false);
        }
        let binner = &self.setup.binner;
        let dist = get_distribution(data, &binner.pixel_dist)?;
        // Only the pixels this run's solver reads: the kept field, or the
        // compact one made for this run.
        let support = if self.plan.keeps_pointing() {
            support_of::<i64>(data, &dist, self.solve_pointing.pixels_field())
        } else if compact {
            support_of::<i32>(data, &dist, &self.compact_field())
        } else {
            None
        };
        let Some(support) = support else {
            return Ok(false);
        };
        data.meta
            .set_object(support_key(&binner.pixel_dist), Arc::new(support));
        Ok(true)
    }

    /// Remove what [`MapMaker::register_support`] registered.
    pub(super) fn unregister_support(&self, data: &mut Data) {
        data.meta
            .remove(&support_key(&self.setup.binner.pixel_dist));
    }

    /// Confine the solver's binned map to the registered support (see the
    /// module doc), if there is one; returns whether it did. The
    /// covariance must exist.
    pub(super) fn confine_solver_map(&self, data: &mut Data, keys: &Keys) -> Result<bool, OpError> {
        let binner = &self.setup.binner;
        let Ok(support) = data
            .meta
            .object::<Arc<PixelSupport>>(&support_key(&binner.pixel_dist))
        else {
            return Ok(false);
        };
        let support = Arc::clone(support);
        let dist = get_distribution(data, &binner.pixel_dist)?;
        let block = data
            .meta
            .object::<PixelData<f64>>(&keys.solve_cov)?
            .n_value();
        let Some(nnz) = nnz_of_block(block) else {
            return Ok(false);
        };
        ensure_map::<f64>(data, &keys.solve_bin, &binner.pixel_dist, &dist, nnz)?;
        data.meta
            .object_mut::<PixelData<f64>>(&keys.solve_bin)?
            .confine_to(support)?;
        Ok(true)
    }

    /// End the confinement of the solver's binned map, if it exists.
    pub(super) fn unconfine_solver_map(data: &mut Data, keys: &Keys) {
        if let Ok(m) = data.meta.object_mut::<PixelData<f64>>(&keys.solve_bin) {
            m.unconfine();
        }
    }
}

/// The support of every local detector's row of pixel field `field` in
/// every observation, or `None` where a field is missing or a pixel is not
/// local.
fn support_of<P>(
    data: &Data,
    dist: &crate::pixels::PixelDistribution,
    field: &str,
) -> Option<PixelSupport>
where
    P: toast_core::Element + Copy + Into<i64>,
{
    let mut rows = Vec::new();
    for ob in &data.obs {
        let f = ob.detdata.get(field).ok()?;
        for d in ob.local_detectors() {
            rows.push((d.as_str(), f.row_of::<P>(d).ok()?));
        }
    }
    PixelSupport::from_pixels(dist, rows).ok()
}
