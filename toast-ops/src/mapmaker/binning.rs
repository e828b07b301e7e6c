//! The map-maker's pixel-domain passes (TOAST's `BinMap` and
//! `CovarianceAndHits` as the map-maker runs them): the pixel
//! distributions, hits and covariance for the solver (5b) and the final
//! maps (5f), and the final binning passes, the binned raw map (5g) and the
//! destriped map (5i). The binning itself is [`crate::ops::binning`]'s.

use super::fused::{Fused, Input};
use super::products::{Keys, MapMakerResult};
use super::{timed, MapMaker};
use crate::exec::movement;
use crate::exec::pipeline::{run_operators, DetectorSets, OpRef, RunOptions};
use crate::ops::binning::{bin_map, BinPass, PassPointing};
use crate::ops::covariance_and_hits::{covariance_and_hits, CovPass};
use crate::ops::{BuildPixelDistribution, FlagSelection};
use toast_core::{Data, ExecContext, OpError};

/// Keys of one covariance-and-hits pass.
pub(super) struct CovKeys<'a> {
    pub(super) pixel_dist: &'a str,
    pub(super) hits: &'a str,
    pub(super) cov: &'a str,
    pub(super) rcond: &'a str,
    pub(super) invcov: Option<&'a str>,
}

impl MapMaker {
    /// Builds the pixel distribution `key` (with operator name `op_name`)
    /// from the solver's or the final pointing (expanded first when
    /// `expand`) unless it exists; with `reset`, a present one is rebuilt.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ensure_pixel_dist(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        op_name: &str,
        key: &str,
        reset: bool,
        expand: bool,
        final_pointing: bool,
    ) -> Result<(), OpError> {
        if reset {
            data.meta.remove(key);
        }
        if data.meta.contains(key) {
            return Ok(());
        }
        let pixels = if final_pointing {
            self.final_ops()
        } else {
            &self.solve_pointing
        }
        .pixels
        .clone();
        let mut build = BuildPixelDistribution::new(op_name, key, &pixels);
        if movement::scope_open(ctx) {
            // On a device: from the submaps the device's pixels hit, a
            // byte a submap (the pixels never come back): those its pixel
            // operator recorded when it expanded the kept pointing just
            // before, else recorded now (per batch, as every pass that
            // recomputes pointing).
            let opts = RunOptions {
                detector_sets: self.pointing_sets(data),
                ..RunOptions::default()
            };
            let pointing = if final_pointing {
                self.final_ops_mut()
            } else {
                &mut self.solve_pointing
            };
            let kept = match pointing.pixels.take_hit_submaps(ctx)? {
                Some(hit) if !expand => Some(hit),
                _ => None,
            };
            let hit = match kept {
                Some(hit) => hit,
                None => {
                    // Compact pointing's operator rebuilds fields from the
                    // compact pixels and records no hits: the pixel kernel
                    // runs for them (a distribution of the solver's
                    // pixelization under another key, the final binner's).
                    let mut ops: Vec<OpRef<'_>> = if pointing.compact.is_some() {
                        vec![&mut pointing.det_pointing, &mut pointing.pixels]
                    } else {
                        pointing.operators()
                    };
                    if !expand {
                        ops.truncate(2);
                    }
                    run_operators("BuildPixelDistribution", &mut ops, data, ctx, &opts)?;
                    let n = pointing.pixels.n_submap() as usize;
                    pointing.pixels.take_hit_submaps(ctx)?.unwrap_or(vec![0; n])
                }
            };
            build.from_hit_submaps(data, ctx, &hit)?;
        } else {
            // One pass over all detectors: the builder reduces over the job
            // after each pass, and processes may hold different numbers of
            // detector batches.
            self.run_with_pointing(
                data,
                ctx,
                "BuildPixelDistribution",
                expand,
                final_pointing,
                vec![&mut build],
            )?;
        }
        if self.plan.transient_pointing() {
            self.drop_pointing(data)?;
        }
        Ok(())
    }

    /// Remove the pointing fields the map-maker made (not those that
    /// existed before its run).
    pub(super) fn drop_pointing(&self, data: &mut Data) -> Result<(), OpError> {
        let mut fields = self.pointing_fields();
        fields.retain(|f| !self.preexisting.contains(f));
        Ok(data.remove_detdata(&fields)?)
    }

    /// Run `ops`, preceded by the pointing operators when `expand`.
    fn run_with_pointing(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        name: &str,
        expand: bool,
        final_pointing: bool,
        ops: Vec<OpRef<'_>>,
    ) -> Result<(), OpError> {
        let pointing = if final_pointing {
            self.final_ops_mut()
        } else {
            &mut self.solve_pointing
        };
        let mut all: Vec<OpRef<'_>> = Vec::new();
        if expand {
            all.extend(pointing.operators());
        }
        all.extend(ops);
        run_operators(name, &mut all, data, ctx, &RunOptions::default())
    }

    /// Hits, inverse covariance, inversion with `threshold`, with the
    /// solver's or the final pointing (expanded first when `expand`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn covariance_and_hits(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        k: CovKeys<'_>,
        flags: FlagSelection,
        noise_model: &str,
        threshold: f64,
        expand: bool,
        final_pointing: bool,
    ) -> Result<(), OpError> {
        let ops = if final_pointing {
            self.final_ops_mut()
        } else {
            &mut self.solve_pointing
        };
        let (pix, wts, view) = (
            ops.pixels_field().to_string(),
            ops.weights_field().to_string(),
            ops.view().map(str::to_string),
        );
        let pass = CovPass {
            name: "CovarianceAndHits",
            pixel_dist: k.pixel_dist,
            hits: k.hits,
            covariance: k.cov,
            rcond: k.rcond,
            inverse_covariance: k.invcov,
            pixels: &pix,
            weights: &wts,
            view: view.as_deref(),
            flags,
            noise_model,
            threshold,
        };
        let sets = if expand {
            self.pointing_sets(data)
        } else {
            DetectorSets::All
        };
        let ops = if final_pointing {
            self.final_ops_mut()
        } else {
            &mut self.solve_pointing
        };
        covariance_and_hits(data, ctx, pass, expand.then_some(ops), &sets)
    }

    /// Whether the final passes expand their own pointing.
    fn expand_final(&self) -> bool {
        self.final_pointing.is_some() || !self.plan.keeps_pointing()
    }

    /// 5f, 5g: the final products with the final binner and pointing
    /// before the timestream is cleaned: hits, covariance and rcond
    /// (`map_rcond_threshold`; already in place when `shared_cov`, see
    /// `MapMaker::share_solver_covariance`), and the binned map of the raw
    /// timestream (with `write_binmap`).
    pub(super) fn final_covariance_and_binmap(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        res: &mut MapMakerResult,
        shared_cov: bool,
    ) -> Result<(), OpError> {
        let mm = self.setup.mapmaker.clone();
        let fb = self.final_binner().clone();
        let expand_final = self.expand_final();
        self.ensure_pixel_dist(
            data,
            ctx,
            "pixel_dist_final",
            &fb.pixel_dist,
            mm.reset_pix_dist && fb.pixel_dist != self.setup.binner.pixel_dist,
            expand_final,
            true,
        )?;
        if !shared_cov {
            timed(data, ctx, "CovarianceAndHits", |data, ctx| {
                let invcov = mm.write_invcov.then_some(keys.invcov.as_str());
                self.covariance_and_hits(
                    data,
                    ctx,
                    CovKeys {
                        pixel_dist: &fb.pixel_dist,
                        hits: &keys.hits,
                        cov: &keys.cov,
                        rcond: &keys.rcond,
                        invcov,
                    },
                    fb.flags(),
                    &fb.noise_model,
                    mm.map_rcond_threshold,
                    expand_final,
                    true,
                )
            })?;
        }
        res.hits = keys.hits.clone();
        res.cov = keys.cov.clone();
        res.rcond = keys.rcond.clone();
        res.invcov = mm.write_invcov.then(|| keys.invcov.clone());

        if mm.write_binmap {
            let pass = BinPass {
                name: "binmap",
                config: &fb,
                covariance: &keys.cov,
                binned: &keys.binmap,
                det_data: &mm.det_data,
                flags: fb.flags(),
                noiseweighted: None,
                covariance_on_device: false,
            };
            self.bin_final(data, ctx, pass, expand_final)?;
            res.binmap = Some(keys.binmap.clone());
        }
        Ok(())
    }

    /// 5i: the destriped map of `cleaned_field` (and its noise-weighted map
    /// when kept), with the final binner and pointing.
    pub(super) fn final_map(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        keys: &Keys,
        cleaned_field: &str,
        res: &mut MapMakerResult,
    ) -> Result<(), OpError> {
        let mm = self.setup.mapmaker.clone();
        let fb = self.final_binner().clone();
        let expand_final = self.expand_final();
        let keep_nw = mm.write_noiseweighted_map || mm.keep_final_products;
        let pass = BinPass {
            name: "binner_final",
            config: &fb,
            covariance: &keys.cov,
            binned: &keys.map,
            det_data: cleaned_field,
            flags: fb.flags(),
            noiseweighted: keep_nw.then_some(keys.noiseweighted.as_str()),
            covariance_on_device: false,
        };
        self.bin_final(data, ctx, pass, expand_final)?;
        res.map = keys.map.clone();
        res.noiseweighted_map = keep_nw.then(|| keys.noiseweighted.clone());
        Ok(())
    }

    /// One final binning pass (timed as `BinMap`), with the final pointing
    /// expanded first when `expand`.
    fn bin_final(
        &mut self,
        data: &mut Data,
        ctx: &mut ExecContext,
        pass: BinPass<'_>,
        expand: bool,
    ) -> Result<(), OpError> {
        timed(data, ctx, "BinMap", |data, ctx| {
            // Fused with compact pointing. With the pointing kept, the
            // kernel reads it as it is: no work timestream to save, and on
            // tiny at 2 threads a fused pass measured slower (0.29-0.39 s
            // against 0.21-0.23 s for the two passes, loaded machine).
            let fused = match self.fused_applies(data, None)? {
                Some(Fused::Compact) if expand => Some(Fused::Compact),
                _ => None,
            };
            if let Some(fused) = fused {
                // The unfused pass's detector order.
                let sets = self.pointing_sets(data);
                self.ensure_weights_finite(data, ctx, fused)?;
                let keys = Keys::new(&self.setup.name);
                let input = Input::Timestream(pass.det_data);
                return self.bin_fused(data, ctx, (&pass, &sets), (None, fused), input, &keys);
            }
            let sets = if expand {
                self.pointing_sets(data)
            } else {
                DetectorSets::All
            };
            let pointing = PassPointing::of(self.final_ops_mut(), !expand);
            bin_map(data, ctx, pass, pointing, Vec::new(), &sets)
        })
    }
}
