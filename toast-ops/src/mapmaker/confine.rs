//! The solver's binned map confined to the pixels its samples reach
//! ([`crate::pixels::support`]): the map reset and `m ← C m`, twice per CG
//! iteration, visit those pixels only (on tiny 144,233 of 2,798,592 local
//! pixels) with the same values as the full passes.
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
use crate::accel::pipeline::StagingState;
use crate::ops::mapmaker_utils::ensure_map;
use crate::pixels::covariance::nnz_of_block;
use crate::pixels::{get_distribution, PixelData, PixelSupport};
use std::sync::Arc;
use toast_core::{comm_of, Data, ExecContext, OpError};

impl MapMaker {
    /// Confine the solver's binned map (see the module doc) when it
    /// applies; returns whether it did. The covariance must exist.
    pub(super) fn confine_solver_map(
        &self,
        data: &mut Data,
        ctx: &ExecContext,
        keys: &Keys,
    ) -> Result<bool, OpError> {
        if ctx.use_accel
            || ctx.extensions.get::<StagingState>().is_some()
            || comm_of(ctx).size() > 1
        {
            return Ok(false);
        }
        let binner = &self.setup.binner;
        let dist = get_distribution(data, &binner.pixel_dist)?;
        let support = if binner.full_pointing {
            support_of::<i64>(data, &dist, self.solve_pointing.pixels_field())
        } else {
            support_of::<i32>(data, &dist, &self.compact_field())
        };
        let Some(support) = support else {
            return Ok(false);
        };
        let block = data
            .meta
            .object::<PixelData<f64>>(&keys.solve_cov)?
            .n_value();
        let Some(nnz) = nnz_of_block(block) else {
            return Ok(false);
        };
        ensure_map::<f64>(data, &keys.solve_bin, &dist, nnz)?;
        data.meta
            .object_mut::<PixelData<f64>>(&keys.solve_bin)?
            .confine_to(Arc::new(support))?;
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
