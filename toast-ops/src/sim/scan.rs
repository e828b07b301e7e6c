//! `ScanHealpixMap`: scan an input I/Q/U sky into the timestream.

use crate::accel::pipeline::{run_operators, OpRef, RunOptions};
use crate::io::fits::read_healpix_map;
use crate::ops::{BuildPixelDistribution, PointingOps, ScanMap, ScanMapConfig};
use crate::pixels::{PixelData, PixelDistribution};
use crate::sim::sky::{synthesize_sky_on, SkyConfig, SkyError};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;
use toast_core::observation::defaults;
use toast_core::{Data, ExecContext, OpError, Operator, Requirements};

/// A full-sky I/Q/U input map in NEST order (float32, K).
#[derive(Debug, Clone, PartialEq)]
pub struct InputSky {
    /// Resolution.
    pub nside: u64,
    /// I, Q, U.
    pub maps: [Vec<f32>; 3],
    /// Where it came from (a path or "synthetic").
    pub source: String,
}

/// An unusable sky map file.
fn sky_map_err(path: &Path, reason: String) -> OpError {
    OpError::Input {
        what: "sky map",
        path: path.to_path_buf(),
        reason,
    }
}

impl InputSky {
    /// Read I, Q, U (the first three map columns) from a HEALPix FITS file,
    /// honouring its `ORDERING` header. Errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, OpError> {
        let m = read_healpix_map(path, None).map_err(|e| sky_map_err(path, e.to_string()))?;
        if m.fields.len() < 3 {
            return Err(sky_map_err(
                path,
                format!("{} map column(s), need 3 (I, Q, U)", m.fields.len()),
            ));
        }
        let unseen = |x: f64| {
            if x <= -1.6e30 || !x.is_finite() {
                0.0
            } else {
                x
            }
        };
        let mut fields = m.fields.into_iter();
        let mut take = || -> Vec<f32> {
            fields
                .next()
                .map(|f| f.data.into_iter().map(|x| unseen(x) as f32).collect())
                .unwrap_or_default()
        };
        let maps = [take(), take(), take()];
        Ok(InputSky {
            nside: m.nside,
            maps,
            source: path.display().to_string(),
        })
    }

    /// [`InputSky::from_file`] for every process of `comm`: rank 0 reads
    /// the file and broadcasts the maps, so a job of thousands of ranks
    /// opens it once. A read error on rank 0 is returned on every rank.
    pub fn from_file_on(path: &Path, comm: &dyn toast_core::Comm) -> Result<Self, OpError> {
        if comm.size() == 1 {
            return Self::from_file(path);
        }
        let bcast_err = |source: toast_core::CommError| OpError::Comm {
            what: format!("sky map {}", path.display()),
            source,
        };
        let mut buf = Vec::new();
        if comm.rank() == 0 {
            buf = match Self::from_file(path) {
                Ok(sky) => sky.encode(),
                Err(e) => {
                    // The reason alone: the other ranks name the file.
                    let reason = match e {
                        OpError::Input { reason, .. } => reason,
                        e => e.to_string(),
                    };
                    let mut b = vec![1u8];
                    b.extend_from_slice(reason.as_bytes());
                    b
                }
            };
        }
        comm.broadcast_bytes(0, &mut buf).map_err(bcast_err)?;
        match buf.first() {
            Some(0) => Self::decode(&buf[1..], path),
            Some(_) => Err(sky_map_err(
                path,
                format!("{} (read on rank 0)", String::from_utf8_lossy(&buf[1..])),
            )),
            None => Err(bcast_err(toast_core::CommError::new(
                "broadcast",
                "nothing received from rank 0",
            ))),
        }
    }

    /// Status byte 0, nside, three maps (length then f32 values), source.
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8];
        b.extend_from_slice(&self.nside.to_le_bytes());
        for m in &self.maps {
            b.extend_from_slice(&(m.len() as u64).to_le_bytes());
            b.extend_from_slice(bytemuck::cast_slice(m));
        }
        b.extend_from_slice(self.source.as_bytes());
        b
    }

    fn decode(b: &[u8], path: &Path) -> Result<Self, OpError> {
        let bad = || OpError::Comm {
            what: format!("sky map {}", path.display()),
            source: toast_core::CommError::new("broadcast", "truncated message from rank 0"),
        };
        let word = |at: usize| -> Result<u64, OpError> {
            let s = b.get(at..at + 8).ok_or_else(bad)?;
            Ok(u64::from_le_bytes(s.try_into().map_err(|_| bad())?))
        };
        let nside = word(0)?;
        let mut at = 8;
        let mut maps: [Vec<f32>; 3] = Default::default();
        for m in &mut maps {
            let n = word(at)? as usize;
            at += 8;
            let bytes = b.get(at..at + 4 * n).ok_or_else(bad)?;
            *m = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            at += 4 * n;
        }
        Ok(InputSky {
            nside,
            maps,
            source: String::from_utf8_lossy(&b[at..]).into_owned(),
        })
    }

    /// The benchmark's synthetic sky (see [`crate::sim::sky`]).
    pub fn synthetic(cfg: &SkyConfig) -> Result<Self, OpError> {
        Self::synthetic_on(cfg, &toast_core::SerialComm)
    }

    /// [`InputSky::synthetic`] with the synthesis shared by the processes of
    /// `comm` (the same sky, bit for bit, on every process).
    pub fn synthetic_on(cfg: &SkyConfig, comm: &dyn toast_core::Comm) -> Result<Self, OpError> {
        let s = synthesize_sky_on(cfg, comm).map_err(|e| match e {
            SkyError::Comm(message) => OpError::Comm {
                what: "synthetic sky".into(),
                source: toast_core::CommError::new("sky synthesis", message),
            },
            e => OpError::Config(format!("synthetic sky: {e}")),
        })?;
        Ok(InputSky {
            nside: s.nside,
            maps: [s.i, s.q, s.u],
            source: "synthetic".into(),
        })
    }
}

/// Configuration of [`ScanHealpixMap`] (TOAST's trait names; `file` empty
/// means the built-in synthetic sky).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScanHealpixMapConfig {
    /// Whether the sky is scanned.
    pub enabled: bool,
    /// HEALPix FITS file of the input sky (I, Q, U); empty: synthetic.
    pub file: String,
    /// Timestream field.
    pub det_data: String,
    /// Global key of the pixel distribution (built here, reused by the map-maker).
    pub pixel_dist: String,
    /// Subtract instead of add.
    pub subtract: bool,
    /// Zero the timestream first.
    pub zero: bool,
    /// Seed of the synthetic sky.
    pub seed: u64,
    /// Beam FWHM of the synthetic sky (arcmin).
    pub fwhm_arcmin: f64,
    /// Reproduce TOAST 3.0.6's ordering bug for the synthetic sky (RING data used as NEST).
    pub toast_ring_as_nest: bool,
}

impl Default for ScanHealpixMapConfig {
    fn default() -> Self {
        ScanHealpixMapConfig {
            enabled: true,
            file: String::new(),
            det_data: defaults::DET_DATA.into(),
            pixel_dist: "pixel_dist".into(),
            subtract: false,
            zero: false,
            seed: crate::sim::sky::TOAST_SKY_SEED,
            fwhm_arcmin: crate::sim::sky::TOAST_SKY_FWHM_ARCMIN,
            toast_ring_as_nest: false,
        }
    }
}

/// Expand pointing, build the pixel distribution, scan the sky (see
/// [`crate::sim`]). The input sky is consumed by the first `exec`.
#[derive(Debug)]
pub struct ScanHealpixMap {
    name: String,
    /// The configuration.
    pub config: ScanHealpixMapConfig,
    pointing: PointingOps,
    sky: Option<InputSky>,
    /// Detector sets for the pointing passes.
    pub options: RunOptions,
}

impl ScanHealpixMap {
    /// The operator; `sky` must have the pointing's nside.
    pub fn new(
        name: impl Into<String>,
        config: ScanHealpixMapConfig,
        pointing: PointingOps,
        sky: InputSky,
    ) -> Result<Self, OpError> {
        let nside = pointing.pixels.config.nside;
        if sky.nside != nside.get() {
            return Err(OpError::Config(format!(
                "scan_map: the sky map {} has nside {} but pixels.nside is {nside}",
                sky.source, sky.nside
            )));
        }
        Ok(ScanHealpixMap {
            name: name.into(),
            config,
            pointing,
            sky: Some(sky),
            options: RunOptions::default(),
        })
    }
}

impl Operator for ScanHealpixMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = self.pointing.requires();
        r.add(toast_core::Category::DetData, self.config.det_data.clone());
        r
    }
    fn provides(&self) -> Requirements {
        Requirements::new()
            .detdata(&self.config.det_data)
            .global(&self.config.pixel_dist)
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let sky = self.sky.take().ok_or_else(|| OpError::State {
            what: "scan_map: the input sky was already used".into(),
        })?;
        let cfg = &self.config;
        // Pointing and the pixel distribution.
        let pixels = self.pointing.pixels.clone();
        let mut build =
            BuildPixelDistribution::new("BuildPixelDistribution", &cfg.pixel_dist, &pixels);
        // The quaternions are dropped below: per detector set, each pass
        // replaces the previous set's (host runs; see
        // `PointingDetector::transient`), so all of them never coexist.
        let quats = self.pointing.det_pointing.config.quats.clone();
        self.pointing.det_pointing.transient =
            !data.obs.iter().any(|ob| ob.detdata.contains(&quats));
        {
            let mut ops = self.pointing.operators();
            ops.push(&mut build);
            run_operators(
                "ScanHealpixMap.pointing",
                &mut ops,
                data,
                ctx,
                &self.options,
            )?;
        }
        let dist = data
            .meta
            .object::<Arc<PixelDistribution>>(&cfg.pixel_dist)?
            .clone();
        // The sky on the hit submaps only (TOAST's `PixelData.read`).
        let mut map = PixelData::<f64>::new(Arc::clone(&dist), 3);
        map.set_units("K");
        let nps = dist.n_pix_submap() as usize;
        for (ls, &gs) in dist.local_submaps().iter().enumerate() {
            let g0 = gs as usize * nps;
            let block = &mut map.data_mut()[ls * nps * 3..(ls + 1) * nps * 3];
            for (p, v) in block.chunks_exact_mut(3).enumerate() {
                for (x, m) in v.iter_mut().zip(&sky.maps) {
                    *x = m[g0 + p] as f64;
                }
            }
        }
        drop(sky);
        let map_key = format!("{}_input_map", self.name);
        data.meta.set_object(&map_key, map);
        let mut scan = ScanMap::new(
            "ScanMap",
            ScanMapConfig {
                det_data: cfg.det_data.clone(),
                pixels: self.pointing.pixels_field().to_string(),
                weights: self.pointing.weights_field().to_string(),
                map_key: map_key.clone(),
                pixel_dist: cfg.pixel_dist.clone(),
                subtract: cfg.subtract,
                zero: cfg.zero,
                det_mask: self.pointing.det_pointing.config.det_mask,
                view: self.pointing.view().map(String::from),
                ..ScanMapConfig::default()
            },
        )?;
        let r = {
            let mut ops: Vec<OpRef<'_>> = vec![&mut scan];
            run_operators("ScanHealpixMap.scan", &mut ops, data, ctx, &self.options)
        };
        data.meta.remove(&map_key);
        // The pointing is recomputed (or re-expanded) by the map-maker.
        for ob in &mut data.obs {
            for f in [
                self.pointing.det_pointing.config.quats.as_str(),
                self.pointing.pixels_field(),
                self.pointing.weights_field(),
            ] {
                if ob.detdata.contains(f) {
                    ob.detdata.remove(f)?;
                }
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_encoding_round_trips_and_rejects_truncation() {
        let sky = InputSky {
            nside: 2,
            maps: [vec![1.5; 48], vec![-2.0; 48], vec![0.25; 48]],
            source: "a.fits".into(),
        };
        let b = sky.encode();
        assert_eq!(b[0], 0);
        let back = InputSky::decode(&b[1..], Path::new("a.fits")).unwrap();
        assert_eq!(
            (back.nside, &back.maps, back.source.as_str()),
            (2, &sky.maps, "a.fits")
        );
        let e = InputSky::decode(&b[1..100], Path::new("a.fits")).unwrap_err();
        assert!(matches!(e, OpError::Comm { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "sky map a.fits: broadcast: truncated message from rank 0"
        );
    }
}
