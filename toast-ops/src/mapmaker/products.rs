//! The map-maker's products: their keys (TOAST's names, prefixed with the
//! instance name), [`MapMakerResult`] (how the solve ended and where the
//! products are), the cleaned timestream (step 5h) and the removal of the
//! solver's work products and temporaries.

use super::MapMaker;
use crate::exec::global_data::HostArray;
use crate::exec::movement;
use crate::exec::pipeline::{run_operators, OpRef, RunOptions};
use crate::ops::CopyDetData;
use crate::templates::offset::OffsetAddToSignal;
use crate::templates::OffsetTemplate;
use std::sync::Arc;
use toast_core::{Data, ExecContext, OpError, Operator, Requirements};

/// How the PCG solve ended, and the products it left in `data.meta`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MapMakerResult {
    /// PCG iterations run, i.e. LHS applications (TOAST logs the 0-based
    /// index of the last one, `iterations - 1`, as "converged after N
    /// iterations").
    pub iterations: usize,
    /// Whether the convergence criterion was met.
    pub converged: bool,
    /// Whether TOAST's stall test stopped the solve.
    pub stalled: bool,
    /// `‖b‖²`, TOAST's "initial residual".
    pub initial_residual: f64,
    /// `‖r‖² / ‖b‖²` after each iteration.
    pub residuals: Vec<f64>,
    /// Offset amplitudes.
    pub n_amplitudes: usize,
    /// Of which flagged (not solved).
    pub n_flagged_amplitudes: usize,
    /// Samples the solver flags cut (of the selected detectors, in the view).
    pub solver_cut_samples: u64,
    /// Samples of the selected detectors in the view.
    pub solver_total_samples: u64,
    /// Global key of the hit map (`PixelData<i64>`).
    pub hits: String,
    /// Global key of the final covariance (`PixelData<f64>`, packed).
    pub cov: String,
    /// Global key of the final rcond map.
    pub rcond: String,
    /// Global key of the inverse covariance, if kept.
    pub invcov: Option<String>,
    /// Global key of the binned raw map, if made.
    pub binmap: Option<String>,
    /// Global key of the destriped map.
    pub map: String,
    /// Global key of the noise-weighted destriped map, if kept.
    pub noiseweighted_map: Option<String>,
    /// Detdata field of the cleaned timestream, if kept.
    pub cleaned: Option<String>,
    /// Global key of the solved amplitudes, if kept.
    pub amplitudes: Option<String>,
}

/// Keys of the solver's products and work vectors.
pub(super) struct Keys {
    pub(super) solve_flags: String,
    pub(super) temp: String,
    pub(super) solve_hits: String,
    pub(super) solve_cov: String,
    pub(super) solve_rcond: String,
    pub(super) solve_bin: String,
    pub(super) rhs: String,
    pub(super) amplitudes: String,
    pub(super) lhs_in: String,
    pub(super) lhs_out: String,
    pub(super) residual: String,
    pub(super) precond: String,
    pub(super) solution: String,
    pub(super) dot_partials: String,
    pub(super) hits: String,
    pub(super) cov: String,
    pub(super) invcov: String,
    pub(super) rcond: String,
    pub(super) binmap: String,
    pub(super) map: String,
    pub(super) noiseweighted: String,
    pub(super) cleaned: String,
    pub(super) neg_amplitudes: String,
}

impl Keys {
    pub(super) fn new(name: &str) -> Self {
        let k = |s: &str| format!("{name}_{s}");
        Keys {
            solve_flags: k("solve_flags"),
            temp: k("temp"),
            solve_hits: k("solve_hits"),
            solve_cov: k("solve_cov"),
            solve_rcond: k("solve_rcond"),
            solve_bin: k("solve_bin"),
            rhs: k("solve_rhs"),
            amplitudes: k("solve_amplitudes"),
            lhs_in: k("lhs_in"),
            lhs_out: k("lhs_out"),
            residual: k("solve_residual"),
            precond: k("solve_precond"),
            solution: k("solve_x"),
            dot_partials: k("solve_dot_partials"),
            hits: k("hits"),
            cov: k("cov"),
            invcov: k("invcov"),
            rcond: k("rcond"),
            binmap: k("binmap"),
            map: k("map"),
            noiseweighted: k("noiseweighted_map"),
            cleaned: k("cleaned"),
            neg_amplitudes: k("solve_neg_amplitudes"),
        }
    }
}

impl MapMaker {
    /// The solver's work timestream and flags, its work vectors and (unless
    /// `keep_solver_products`/`write_solver_products`) its map-domain
    /// products: `(detdata fields, global keys)`.
    fn solver_products(&self, keys: &Keys) -> (Vec<String>, Vec<String>) {
        let keep_solver = self.keeps_solver_products();
        let mut detdata = vec![keys.temp.clone()];
        if !keep_solver {
            detdata.push(keys.solve_flags.clone());
        }
        let mut global = vec![
            keys.lhs_in.clone(),
            keys.lhs_out.clone(),
            keys.residual.clone(),
            keys.precond.clone(),
            keys.solution.clone(),
            keys.dot_partials.clone(),
            keys.neg_amplitudes.clone(),
        ];
        if !keep_solver {
            global.extend([
                keys.solve_hits.clone(),
                keys.solve_cov.clone(),
                keys.solve_rcond.clone(),
                keys.solve_bin.clone(),
                keys.rhs.clone(),
            ]);
        }
        (detdata, global)
    }

    /// Whether the solver products stay in the data.
    pub(super) fn keeps_solver_products(&self) -> bool {
        let mm = &self.setup.mapmaker;
        mm.keep_solver_products || mm.write_solver_products
    }

    /// Free the solver's work timestream, flags and map-domain products
    /// (those not kept by `keep_solver_products`/`write_solver_products`).
    pub(super) fn free_solver(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let (detdata, global) = self.solver_products(keys);
        remove_products(data, ctx, &detdata, &global)
    }

    /// On a device, once the solve is over: free the device copies of the
    /// solver's map-domain products (unless they are kept, to come back at
    /// the end): its binned map (dead) and its covariance, whose host copy
    /// the final passes read (inverted on the host; a newer device copy
    /// would come back first). 48 bytes a local pixel for the IQU
    /// covariance and 24 for the map, before the final passes bin theirs.
    pub(super) fn free_solver_maps_on_device(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<(), OpError> {
        if self.keeps_solver_products() {
            return Ok(());
        }
        let globals = |ks: &[&String]| {
            ks.iter()
                .filter(|k| data.meta.contains(k))
                .fold(Requirements::new(), |r, k| r.global(k.to_string()))
        };
        let read = globals(&[&keys.solve_cov, &keys.solve_rcond]);
        let dead = globals(&[&keys.solve_bin]);
        movement::release(data, ctx, &read)?;
        movement::forget(data, ctx, &dead)?;
        Ok(())
    }

    /// Remove temporaries and (unless kept) solver products, the pointing
    /// this run made and (unless `save_cleaned`) the cleaned timestream.
    /// (In a caller's scope their device copies are freed as well.)
    pub(super) fn cleanup(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
    ) -> Result<(), OpError> {
        let (mut detdata, mut global) = self.solver_products(keys);
        // Pointing this run made: the quaternions always go, the pixels and
        // weights unless they are kept (`full_pointing`).
        for f in self.pointing_fields() {
            let kept = self.plan.keeps_pointing() && f != self.setup.det_pointing.quats;
            if !kept && !self.preexisting.contains(&f) {
                detdata.push(f);
            }
        }
        if !self.setup.mapmaker.save_cleaned {
            detdata.push(keys.cleaned.clone());
        }
        detdata.push(self.compact_field());
        if !self.keeps_solver_products() {
            global.extend([
                keys.amplitudes.clone(),
                format!("{}_amp_flags", "baselines"),
                format!("{}_offset_var", "baselines"),
            ]);
        }
        remove_products(data, ctx, &detdata, &global)
    }

    /// 5h: subtract `F x` from the timestream, into `target` (copied from the
    /// timestream first unless it is the timestream).
    pub(super) fn apply_amplitudes(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        tmpl: &Arc<OffsetTemplate>,
        x: &[f64],
        target: &str,
    ) -> Result<(), OpError> {
        let det_data = self.setup.mapmaker.det_data.clone();
        let neg: Vec<f64> = x.iter().map(|v| -v).collect();
        data.meta
            .set_object(&keys.neg_amplitudes, HostArray { values: neg });
        let mut ops: Vec<Box<dyn Operator>> = Vec::new();
        if target != det_data {
            ops.push(Box::new(CopyDetData {
                name: "copy_cleaned".into(),
                input: det_data,
                output: target.to_string(),
                det_mask: self.setup.binner.det_mask,
                transient: false,
            }));
        }
        ops.push(Box::new(OffsetAddToSignal {
            name: "template_matrix".into(),
            template: Arc::clone(tmpl),
            amplitudes: keys.neg_amplitudes.clone(),
            det_data: target.to_string(),
        }));
        let mut refs: Vec<OpRef<'_>> = ops.iter_mut().map(|o| o.as_mut() as OpRef<'_>).collect();
        // Per batch when the detector data are streamed (per detector
        // either way).
        let opts = RunOptions {
            detector_sets: self.batched_sets(data, self.plan.streams_detector_data()),
            ..RunOptions::default()
        };
        run_operators("ApplyAmplitudes", &mut refs, data, ctx, &opts)
    }
}

/// Removes the `detdata` fields from every observation that has them and
/// the `global` keys from `data.meta`, and their device copies from the
/// open device scope, if any (the map-maker's own scope is closed by then;
/// a caller's that it joined lives on).
fn remove_products(
    data: &mut Data,
    ctx: &mut ExecContext,
    detdata: &[String],
    global: &[String],
) -> Result<(), OpError> {
    let dropped = detdata
        .iter()
        .fold(Requirements::new(), |r, f| r.detdata(f));
    let dropped = global.iter().fold(dropped, |r, g| r.global(g));
    movement::forget(data, ctx, &dropped)?;
    data.remove_detdata(detdata)?;
    for g in global {
        data.meta.remove(g);
    }
    Ok(())
}
