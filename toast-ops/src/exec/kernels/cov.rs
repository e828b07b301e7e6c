//! The safe call of `cov_accum_timestream` (ABI minor 5): the hit map and
//! the packed inverse covariance accumulated from the timestream's pointing
//! and flags (TOAST's `BuildHitMap` and `BuildInverseCovariance`). Either
//! map may be absent; the maps are global items, so on a staging backend
//! they are accumulated on the device and copied back once, when the host
//! needs them.

use super::{
    check_len, dist_for_map, launch, map_info, ptr_or_null, rows, shared_flags, KernelCall, Source,
    Spec, Target,
};
use crate::pixels::covariance::block_size;
use toast_accel::abi;
use toast_core::{ExecContext, Meta, Observation, OpError};

/// The maps `cov_accum_timestream` accumulates into (global keys).
#[derive(Debug, Clone, Copy)]
pub enum CovMaps<'a> {
    /// The hit map (`PixelData<i64>`, one value per pixel).
    Hits(&'a str),
    /// The packed inverse covariance (`PixelData<f64>`, `nnz (nnz + 1) / 2`
    /// values per pixel) from the Stokes weights field `weights` (f64 ×
    /// nnz) and the detectors' noise weights.
    InverseCovariance {
        map: &'a str,
        weights: &'a str,
        det_scale: &'a [f64],
    },
}

/// `cov_accum_timestream`: for every detector of `call`, interval and
/// sample, in that order, whose flags keep it and whose pixel is `>= 0`,
/// add one hit, or `w_det · p pᵀ` (the packed upper triangle), to its pixel
/// (field `pixels`, on the distribution at `pixel_dist`) of the map.
#[allow(clippy::too_many_arguments)]
pub fn cov_accum_timestream(
    ctx: &mut ExecContext,
    call: KernelCall<'_>,
    ob: &mut Observation,
    meta: &mut Meta,
    maps: CovMaps<'_>,
    pixels: &str,
    pixel_dist: &str,
    det_flags: Option<(&str, u8)>,
    shared_flag: Option<(&str, u8)>,
) -> Result<(), OpError> {
    let (key, want_dtype) = match maps {
        CovMaps::Hits(k) => (k, abi::DTYPE_I64),
        CovMaps::InverseCovariance { map, .. } => (map, abi::DTYPE_F64),
    };
    let (dtype, n_value, map_dist) = map_info(meta, key)?;
    if dtype != want_dtype {
        return Err(OpError::Global {
            key: key.to_string(),
            problem: match maps {
                CovMaps::Hits(_) => "the hit map must hold i64 values".into(),
                CovMaps::InverseCovariance { .. } => {
                    "the inverse covariance must hold f64 values".into()
                }
            },
        });
    }
    let dist = dist_for_map(meta, pixel_dist, key, &map_dist)?;
    let pixel_index = rows::<i64>(ctx, ob, pixels, &[], call.detectors)?;
    let (nnz, weights, weight_index, det_scale) = match maps {
        CovMaps::Hits(_) => (1, Source::Absent, Vec::new(), &[][..]),
        CovMaps::InverseCovariance {
            weights, det_scale, ..
        } => {
            check_len("det_scale", det_scale.len(), call.detectors.len())?;
            let nnz = (1..=16)
                .find(|&n| block_size(n) == n_value)
                .ok_or_else(|| OpError::Global {
                    key: key.to_string(),
                    problem: format!("{n_value} values per pixel is not a packed symmetric matrix"),
                })?;
            let wi = rows::<f64>(ctx, ob, weights, &[nnz], call.detectors)?;
            (nnz, Source::DetData(weights), wi, det_scale)
        }
    };
    let (dflags, dmask, flag_index) = match det_flags {
        Some((name, mask)) if mask != 0 => (
            Source::DetData(name),
            mask,
            rows::<u8>(ctx, ob, name, &[], call.detectors)?,
        ),
        _ => (Source::Absent, 0, Vec::new()),
    };
    let (sflags, smask) = shared_flags(ob, shared_flag)?;
    let (hits, invnpp) = match maps {
        CovMaps::Hits(k) => (
            Spec::output(Source::Global(k), 8),
            Spec::output(Source::Absent, 8),
        ),
        CovMaps::InverseCovariance { map, .. } => (
            Spec::output(Source::Absent, 8),
            Spec::output(Source::Global(map), 8),
        ),
    };
    let n_samp = ob.n_samples() as u64;
    let specs = vec![
        Spec::input(Source::Global(pixel_dist), 8),
        Spec::input(Source::DetData(pixels), 8),
        Spec::input(weights, 8),
        Spec::input(dflags, 1),
        Spec::input(sflags, 1),
        hits,
        invnpp,
    ];
    launch(
        ctx,
        call.operator,
        call.detectors,
        Target { ob: Some(ob), meta },
        specs,
        |a| abi::CovAccumTimestreamArgs {
            n_det: call.detectors.len() as u64,
            n_samp,
            nnz: nnz as u64,
            pixel_index: pixel_index.as_ptr(),
            weight_index: ptr_or_null(&weight_index),
            flag_index: ptr_or_null(&flag_index),
            det_scale: if det_scale.is_empty() {
                std::ptr::null()
            } else {
                det_scale.as_ptr()
            },
            intervals: call.intervals(),
            global2local: a[0],
            n_pix_submap: dist.n_pix_submap(),
            pixels: a[1],
            weights: a[2],
            det_flags: a[3],
            shared_flags: a[4],
            hits: a[5],
            invnpp: a[6],
            det_flag_mask: dmask,
            shared_flag_mask: smask,
            reserved: [0; 6],
        },
    )
}
