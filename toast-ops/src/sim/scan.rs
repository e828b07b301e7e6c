//! `ScanHealpixMap`: scan an input I/Q/U sky into the timestream.

use crate::exec::movement::{close_scope, forget, open_scope};
use crate::exec::pipeline::{mirror_on_host, pipeline_backend, run_operators, OpRef, RunOptions};
use crate::io::fits::{
    read_healpix_map, units, HealpixHeader, HealpixMap, MapField, Ordering, UNSEEN,
};
use crate::math::healpix::Healpix;
use crate::ops::{BuildPixelDistribution, PointingOps, ScanMap, ScanMapConfig};
use crate::pixels::{PixelData, PixelDistribution};
use crate::sim::sky::{
    assemble_sky, synthesize_sky_on, synthesize_sky_part, SkyConfig, SkyError, SkyMaps,
};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{self, AtomicBool};
use std::sync::Arc;
use toast_accel::host::Dispatcher;
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
    ///
    /// The values are checked (`sky_values`): healpy's `UNSEEN`
    /// (unobserved pixels, and the pixels a partial-sky file leaves out)
    /// is scanned as zero signal and counted in the log; NaN, ±inf and
    /// values beyond single precision (the sky is scanned as float32) are
    /// refused, naming the column and the first such pixel. Each column's
    /// `TUNITn` (K, mK, uK, with `_CMB`/`_RJ`; none is K: see
    /// [`crate::io::fits::units`]) is converted to K, the run's unit; a
    /// unit that is not a temperature is refused, naming column and unit.
    pub fn from_file(path: &Path) -> Result<Self, OpError> {
        let mut m = read_healpix_map(path, None).map_err(|e| sky_map_err(path, e.reason()))?;
        check_sky_columns(m.fields.len()).map_err(|reason| sky_map_err(path, reason))?;
        let (maps, unseen) = sky_values(&mut m).map_err(|reason| sky_map_err(path, reason))?;
        let n_unseen: usize = unseen.iter().sum();
        if n_unseen > 0 {
            tracing::warn!(
                "sky map {}: {n_unseen} value(s) are UNSEEN or an integer column's TNULLn \
                 (I {}, Q {}, U {}): scanned as unobserved (zero signal)",
                path.display(),
                unseen[0],
                unseen[1],
                unseen[2]
            );
        }
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
        Self::from_synthesis(cfg, synthesize_sky_on(cfg, comm))
    }

    /// The input sky of a synthesis of `cfg` (its error as the operator's),
    /// refused where a value is not finite.
    fn from_synthesis(cfg: &SkyConfig, s: Result<SkyMaps, SkyError>) -> Result<Self, OpError> {
        let s = s.map_err(|e| match e {
            SkyError::Comm(message) => OpError::Comm {
                what: "synthetic sky".into(),
                source: toast_core::CommError::new("sky synthesis", message),
            },
            SkyError::Internal(m) => OpError::State {
                what: format!("synthetic sky: {m}"),
            },
            e => OpError::Config(format!("synthetic sky: {e}")),
        })?;
        for (k, m) in [&s.i, &s.q, &s.u].into_iter().enumerate() {
            if let Some(p) = m.iter().position(|x| !x.is_finite()) {
                return Err(OpError::Numerical {
                    what: format!(
                        "synthetic sky (scan_map.seed = {}, fwhm_arcmin = {}): {} at NEST pixel \
                         {p} is {}",
                        cfg.seed, cfg.fwhm_arcmin, STOKES[k], m[p]
                    ),
                });
            }
        }
        Ok(InputSky {
            nside: s.nside,
            maps: [s.i, s.q, s.u],
            source: "synthetic".into(),
        })
    }
}

/// What the background thread of a [`SkySynthesis`] hands back: this
/// process's part of the sky, and the seconds it took.
type SkyPart = (Result<SkyMaps, SkyError>, f64);

/// The synthetic sky ([`InputSky::synthetic_on`]), synthesised on a
/// background thread while the run does other work, and taken when the
/// scan needs it ([`SkySynthesis::finish`]).
///
/// The synthesis is host work, the same for every case at nside 1024 (its
/// Legendre sums, O(nside·lmax²), dominate: about a third of tiny's CPU
/// run on 2 cores). On a device run the host would do it alone, in the
/// scan, while the device waits; the satellite workflow starts it with
/// such a run, so that it overlaps the simulation's serial work, the
/// backend's start and the device's pointing. A host run, whose cores are
/// all busy anyway, synthesises in its scan ([`InputSky::synthetic_on`]).
///
/// * The thread computes only this process's part of the rings
///   ([`synthesize_sky_part`]), which touches no communicator; `finish`
///   joins it and runs the collectives (whether every process's part
///   succeeded, then the assembling allreduce) on the caller's thread, so
///   no collective ever runs beside another.
/// * Its parallel loops run on a pool of its own, of as many threads as
///   the caller's: rayon's workers take their own and stolen jobs before
///   those submitted from outside the pool, so on the caller's pool the
///   caller's parallel loops would wait for the synthesis's. On its own
///   pool the system shares the cores between the two. Where no pool can
///   be built, it runs on the global pool.
/// * The memory is the sky's (3 float32 full-sky maps, which the run holds
///   through the scan anyway, here also during the simulation) and its
///   a_ℓm.
/// * Where no thread can be started, `finish` synthesises on the caller's
///   thread, as [`InputSky::synthetic_on`] does.
/// * Dropping an unfinished one (the run failed before its scan) cancels
///   the synthesis, which stops within one block of rings, and waits for
///   the thread: no synthesis outlives its run.
#[derive(Debug)]
pub struct SkySynthesis {
    cfg: SkyConfig,
    /// `(rank, size)` of the communicator given to `start`: this
    /// process's part of the rings, and the communicator `finish` needs.
    part: (usize, usize),
    thread: Option<std::thread::JoinHandle<SkyPart>>,
    /// Set by `drop` to stop an unwanted synthesis.
    cancel: Arc<AtomicBool>,
}

impl SkySynthesis {
    /// Start synthesising this process's part of `cfg`'s sky; `comm` is
    /// the communicator [`SkySynthesis::finish`] must be given (only its
    /// rank and size are read here).
    pub fn start(cfg: SkyConfig, comm: &dyn toast_core::Comm) -> Self {
        let part = (comm.rank(), comm.size());
        let cancel = Arc::new(AtomicBool::new(false));
        let threads = rayon::current_num_threads();
        let (job, stop) = (cfg.clone(), Arc::clone(&cancel));
        let thread = std::thread::Builder::new()
            .name("sky synthesis".into())
            .spawn(move || {
                let synthesize = || synthesize_part_timed(&job, part, &stop);
                match rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("sky-synthesis-{i}"))
                    .build()
                {
                    Ok(pool) => pool.install(synthesize),
                    Err(_) => synthesize(),
                }
            })
            .map_err(|e| {
                tracing::warn!("sky synthesis: no background thread ({e}); it runs in the scan")
            })
            .ok();
        SkySynthesis {
            cfg,
            part,
            thread,
            cancel,
        }
    }

    /// The configuration being synthesised.
    pub fn config(&self) -> &SkyConfig {
        &self.cfg
    }

    /// Wait for the part, agree with the other processes of `comm` that
    /// every part succeeded, assemble the whole sky: a collective of every
    /// process of `comm`, which must have the rank and size of the one
    /// given to `start`. Also gives the seconds the synthesis itself took
    /// (on its thread; the caller's wait is at most that).
    pub fn finish(mut self, comm: &dyn toast_core::Comm) -> Result<(InputSky, f64), OpError> {
        if (comm.rank(), comm.size()) != self.part {
            return Err(OpError::State {
                what: format!(
                    "synthetic sky: started for process {} of {}, finished on process {} of {} \
                     (the same communicator must start and finish it)",
                    self.part.0,
                    self.part.1,
                    comm.rank(),
                    comm.size()
                ),
            });
        }
        let (part, seconds) = match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|panic| {
                let why = toast_accel::plugin_support::panic_message(&*panic);
                let e = SkyError::Internal(format!("the background synthesis panicked: {why}"));
                (Err(e), 0.0)
            }),
            None => synthesize_part_timed(&self.cfg, self.part, &self.cancel),
        };
        // A part that failed on one process only (a panic) must not leave
        // the others in the assembling allreduce.
        let mut ok = [f64::from(u8::from(part.is_ok()))];
        if comm.size() > 1 {
            comm.allreduce_f64(&mut ok, toast_core::ReduceOp::Min)
                .map_err(|source| OpError::Comm {
                    what: "synthetic sky: whether every process synthesised its part".into(),
                    source,
                })?;
        }
        let whole = match part {
            Ok(_) if ok[0] == 0.0 => Err(SkyError::Internal(
                "the synthesis failed on another process".into(),
            )),
            Ok(p) => assemble_sky(p, comm),
            Err(e) => Err(e),
        };
        Ok((InputSky::from_synthesis(&self.cfg, whole)?, seconds))
    }
}

impl Drop for SkySynthesis {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            // Its result is not wanted: stop it, and wait for the thread (a
            // panic in it was already reported by the panic hook).
            self.cancel.store(true, atomic::Ordering::Relaxed);
            let _ = t.join();
        }
    }
}

/// Where [`ScanHealpixMap`] gets its sky: a map at hand, or a synthesis
/// under way ([`SkySynthesis`]), which the scan waits for only when it
/// needs the sky: after its pointing and its pixel distribution, so that
/// on a device the host synthesises while the device expands the pointing.
#[derive(Debug)]
pub enum SkySource {
    /// A sky already in memory (a file's, or synthesised).
    Map(InputSky),
    /// The synthetic sky, being synthesised.
    Synthesis(SkySynthesis),
}

impl From<InputSky> for SkySource {
    fn from(sky: InputSky) -> Self {
        SkySource::Map(sky)
    }
}

impl From<SkySynthesis> for SkySource {
    fn from(s: SkySynthesis) -> Self {
        SkySource::Synthesis(s)
    }
}

impl SkySource {
    /// The sky's resolution.
    pub fn nside(&self) -> u64 {
        match self {
            SkySource::Map(m) => m.nside,
            SkySource::Synthesis(s) => s.config().nside.get(),
        }
    }

    /// Where it comes from (a path or "synthetic"), as [`InputSky::source`].
    pub fn source(&self) -> &str {
        match self {
            SkySource::Map(m) => &m.source,
            SkySource::Synthesis(_) => "synthetic",
        }
    }

    /// The sky (waiting for a synthesis: a collective of `comm`'s
    /// processes, see [`SkySynthesis::finish`]), and the seconds a
    /// synthesis took on its own thread.
    pub fn take(self, comm: &dyn toast_core::Comm) -> Result<(InputSky, Option<f64>), OpError> {
        match self {
            SkySource::Map(m) => Ok((m, None)),
            SkySource::Synthesis(s) => s.finish(comm).map(|(m, t)| (m, Some(t))),
        }
    }
}

/// What [`ScanHealpixMap`] scanned, for a caller's messages and timers.
#[derive(Debug, Clone, PartialEq)]
pub struct ScannedSky {
    /// Where the sky came from (a path or "synthetic").
    pub source: String,
    /// Its largest |value| over the whole sky (K).
    pub largest_abs: f32,
    /// The seconds a background synthesis took on its own thread.
    pub synthesis_seconds: Option<f64>,
}

impl ScannedSky {
    /// What `sky` is, with the seconds of the synthesis that made it.
    pub(crate) fn of(sky: &InputSky, synthesis_seconds: Option<f64>) -> Self {
        let largest_abs = sky
            .maps
            .par_iter()
            .map(|m| m.iter().fold(0.0f32, |a, x| a.max(x.abs())))
            .reduce(|| 0.0, f32::max);
        ScannedSky {
            source: sky.source.clone(),
            largest_abs,
            synthesis_seconds,
        }
    }
}

/// [`synthesize_sky_part`] and its wall seconds.
fn synthesize_part_timed(
    cfg: &SkyConfig,
    (index, count): (usize, usize),
    cancel: &AtomicBool,
) -> SkyPart {
    let t0 = std::time::Instant::now();
    let part = synthesize_sky_part(cfg, index, count, Some(cancel));
    (part, t0.elapsed().as_secs_f64())
}

/// The Stokes components of an input sky, in column order.
const STOKES: [&str; 3] = ["I", "Q", "U"];

/// Whether `x` is healpy's `UNSEEN`, with healpy's tolerance
/// (`healpy.mask_bad`: within `1e-5 |UNSEEN|`).
pub fn is_unseen(x: f64) -> bool {
    (x - UNSEEN).abs() <= 1e-5 * UNSEEN.abs()
}

/// Why a sky value cannot be scanned, if it cannot (what follows the
/// value in the message): NaN, ±inf, or beyond float32 (the precision the
/// sky is scanned in). `UNSEEN` can be.
fn bad_sky_value(x: f64) -> Option<&'static str> {
    if is_unseen(x) {
        None
    } else if !x.is_finite() {
        Some("")
    } else if x.abs() > f32::MAX as f64 {
        Some(", beyond single precision (|value| > 3.4e38; the sky is scanned as float32)")
    } else {
        None
    }
}

/// The first three fields of `m` as the float32 maps to scan, with the
/// count of `UNSEEN` values of each (scanned as 0: an unobserved pixel
/// adds no signal). A NaN, infinite or out-of-float32 value is an error
/// naming the column (1-based among the map columns, its `TTYPE` and
/// Stokes component) and the first such pixel in the file's ordering.
fn sky_values(m: &mut HealpixMap) -> Result<([Vec<f32>; 3], [usize; 3]), String> {
    let mut maps: [Vec<f32>; 3] = Default::default();
    let mut unseen = [0usize; 3];
    for k in 0..m.fields.len().min(3) {
        let f = &m.fields[k];
        let scale = kelvin_scale(k, &f.name, f.unit.as_deref(), m.partial)?;
        if f.data.iter().any(|&x| bad_sky_value(x).is_some()) {
            let (pix, x, why) = first_bad(f, m)?;
            return Err(format!(
                "column {} ('{}', Stokes {}): pixel {pix} ({} ordering) is {x:e}{why}; a sky \
                 map must be finite (mark unobserved pixels UNSEEN, -1.6375e30)",
                k + 1,
                f.name,
                STOKES[k],
                match m.file_ordering {
                    Ordering::Nested => "NESTED",
                    Ordering::Ring => "RING",
                },
            ));
        }
        maps[k] = f
            .data
            .iter()
            .map(|&x| {
                if is_unseen(x) {
                    unseen[k] += 1;
                    0.0
                } else {
                    (x * scale) as f32
                }
            })
            .collect();
        // Converted: the f64 column is freed before the next one is.
        m.fields[k].data = Vec::new();
    }
    Ok((maps, unseen))
}

/// The factor that turns map column `k` (0-based among the map columns; in
/// a partial-sky file they follow `PIXEL`) of unit `unit` into K, or the
/// refusal naming the column and the unit
/// ([`crate::io::fits::units::kelvin_per_unit`]).
fn kelvin_scale(k: usize, name: &str, unit: Option<&str>, partial: bool) -> Result<f64, String> {
    units::kelvin_per_unit(unit).ok_or_else(|| {
        format!(
            "column {} ('{name}', Stokes {}): unit '{}' (TUNIT{}) cannot be converted to K; \
             known units: {}",
            k + 1,
            STOKES[k],
            unit.unwrap_or_default(),
            k + 1 + usize::from(partial),
            units::KNOWN_UNITS
        )
    })
}

/// A sky map's map columns: I, Q, U are the first three.
fn check_sky_columns(n: usize) -> Result<(), String> {
    if n < 3 {
        return Err(format!("{n} map column(s), need 3 (I, Q, U)"));
    }
    Ok(())
}

/// Refuse a sky map with fewer than three map columns, or whose I, Q, U
/// columns (the first three) have a unit that cannot be converted to K,
/// from its header alone: the check a job makes before any work, where
/// [`InputSky::from_file`] makes it again.
pub fn check_sky_header(header: &HealpixHeader) -> Result<(), String> {
    check_sky_columns(header.columns.len())?;
    for (k, (name, unit)) in header.columns.iter().take(3).enumerate() {
        kelvin_scale(k, name, unit.as_deref(), header.partial)?;
    }
    Ok(())
}

/// The first bad value of field `f` in the file's pixel order (its data
/// are NEST): `(pixel, value, why)`.
fn first_bad(f: &MapField, m: &HealpixMap) -> Result<(u64, f64, &'static str), String> {
    let hp = Healpix::new(m.nside).map_err(|e| e.to_string())?;
    let nest_of = |file_pix: u64| match m.file_ordering {
        Ordering::Nested => file_pix,
        Ordering::Ring => hp.ring2nest(file_pix),
    };
    (0..f.data.len() as u64)
        .find_map(|p| {
            let x = f.data[nest_of(p) as usize];
            bad_sky_value(x).map(|why| (p, x, why))
        })
        .ok_or_else(|| format!("column '{}': bad value not found again", f.name))
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
    sky: Option<SkySource>,
    /// What the first `exec` scanned (`None` before it, or when disabled).
    pub scanned: Option<ScannedSky>,
    /// Detector sets for the pointing passes.
    pub options: RunOptions,
    /// Keep no pointing for all detectors: the pixels and weights too (not
    /// only the quaternions) hold one detector set at a time, and the scan
    /// recomputes them per set (one more pointing expansion, 32 bytes a
    /// detector sample less at the scan's peak; on a device, 64 bytes of
    /// device memory, what a small device budget needs).
    pub transient_pointing: bool,
    /// Leave the pixels and weights on the host at the end (the quaternions
    /// are dropped): the caller hands them to a map-maker with the same
    /// pointing configuration (`MapMaker::reuse_pointing`) instead of
    /// expanding them twice. Ignored with `transient_pointing`.
    pub keep_pointing: bool,
    /// With `keep_pointing` on a device, keep the Stokes weights too (the
    /// default). Off (the satellite workflow, whose device map-maker reads
    /// no host weights, `MapMaker::discard_timestream`), the host never
    /// makes them: it expands quaternions and pixels only, the pixel
    /// distribution's input (24 bytes a detector sample of host memory and
    /// a host pass saved). Host runs keep both regardless.
    pub keep_weights: bool,
    /// `SimNoise`, run in this operator's device scope after the scan: on
    /// a device the noise is made there (the `sim_noise` kernel) and added
    /// to the timestream there, which comes back once, with the noise (the
    /// workflow does this on a device backend; on the host it runs
    /// `SimNoise` on its own, the same noise).
    pub noise: Option<super::SimNoise>,
}

impl ScanHealpixMap {
    /// What the scan of `config` reads and provides besides its pointing's
    /// items (`PointingOps::requires`): the timestream it adds to (created
    /// where missing), and the pixel distribution it registers. The
    /// workflow checks its steps' items with these before it makes the
    /// operator (`SatelliteJob::check_wiring`).
    pub fn items(config: &ScanHealpixMapConfig) -> (Requirements, Requirements) {
        (
            Requirements::new().detdata(&config.det_data),
            Requirements::new()
                .detdata(&config.det_data)
                .global(&config.pixel_dist),
        )
    }

    /// The operator; `sky` (an [`InputSky`] or a [`SkySynthesis`]) must
    /// have the pointing's nside.
    pub fn new(
        name: impl Into<String>,
        config: ScanHealpixMapConfig,
        pointing: PointingOps,
        sky: impl Into<SkySource>,
    ) -> Result<Self, OpError> {
        let sky = sky.into();
        let nside = pointing.pixels.config.nside;
        if sky.nside() != nside.get() {
            return Err(OpError::Config(format!(
                "scan_map: the sky map {} has nside {} but pixels.nside is {nside}",
                sky.source(),
                sky.nside()
            )));
        }
        Ok(ScanHealpixMap {
            name: name.into(),
            config,
            pointing,
            sky: Some(sky),
            scanned: None,
            options: RunOptions::default(),
            transient_pointing: false,
            keep_pointing: false,
            keep_weights: true,
            noise: None,
        })
    }
}

impl Operator for ScanHealpixMap {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        let mut r = self.pointing.requires();
        r.extend(&Self::items(&self.config).0);
        r
    }
    fn provides(&self) -> Requirements {
        Self::items(&self.config).1
    }
    /// One device scope for the whole operator (see [`crate::sim`]'s
    /// "Data movement"): on a device the pointing is expanded there once
    /// and read there by the scan (and the noise added there, with
    /// [`ScanHealpixMap::noise`]), and only the timestream comes back.
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !self.config.enabled {
            return Ok(());
        }
        let backend = ctx
            .extensions
            .get::<Dispatcher>()
            .and_then(|d| pipeline_backend(d, self.options.backend.as_deref()));
        let scope = open_scope(ctx, backend.as_ref());
        let r = self.scan(data, ctx, scope.accel);
        let outputs = Requirements::new().detdata(&self.config.det_data);
        let closed = close_scope(data, ctx, scope, &outputs);
        let dropped = self.drop_pointing(data, ctx, scope.accel);
        r?;
        closed?;
        dropped
    }
}

impl ScanHealpixMap {
    /// Drop the pointing fields at the end: all of them, or only the
    /// quaternions with `keep_pointing` (unless transient).
    /// Their device copies go too, in a caller's scope that outlives the
    /// scan (in the scan's own they are gone with it).
    /// On a device (`accel`) without `keep_weights` the kept pointing is
    /// the pixels only: the host never computed the weights.
    fn drop_pointing(
        &self,
        data: &mut Data,
        ctx: &mut ExecContext,
        accel: bool,
    ) -> Result<(), OpError> {
        let keep = self.keep_pointing && !self.transient_pointing;
        let quats = self.pointing.det_pointing.config.quats.as_str();
        let fields = if keep && accel && !self.keep_weights {
            vec![quats, self.pointing.weights_field()]
        } else if keep {
            vec![quats]
        } else {
            vec![
                quats,
                self.pointing.pixels_field(),
                self.pointing.weights_field(),
            ]
        };
        let dropped = fields
            .iter()
            .fold(Requirements::new(), |r, &f| r.detdata(f));
        forget(data, ctx, &dropped)?;
        Ok(data.remove_detdata(&fields)?)
    }

    /// The pointing, the pixel distribution and the scan, inside the scope
    /// `exec` opened (`accel`: a device scope).
    fn scan(&mut self, data: &mut Data, ctx: &mut ExecContext, accel: bool) -> Result<(), OpError> {
        let sky = self.sky.take().ok_or_else(|| OpError::State {
            what: "scan_map: the input sky was already used".into(),
        })?;
        let cfg = &self.config;
        // Pointing and the pixel distribution.
        let pixels = self.pointing.pixels.clone();
        let mut build =
            BuildPixelDistribution::new("BuildPixelDistribution", &cfg.pixel_dist, &pixels);
        // The quaternions are dropped at the end: per detector set, each
        // pass replaces the previous set's (host runs; see
        // `PointingDetector::transient`), so all of them never coexist.
        let quats = self.pointing.det_pointing.config.quats.clone();
        let fresh = |f: &str| !data.obs.iter().any(|ob| ob.detdata.contains(f));
        let transient = self.transient_pointing
            && fresh(&quats)
            && fresh(self.pointing.pixels_field())
            && fresh(self.pointing.weights_field());
        let fresh_quats = fresh(&quats);
        // On a device the pointing is expanded there, in whole fields once
        // or, when transient, per detector set like the host's (the device
        // copies one set's too); the scan reads it there, and the pixel
        // distribution is built from the submaps the device's pixels hit
        // (a byte a submap comes back).
        // The host has pointing of its own only for a caller that keeps it
        // (`keep_pointing`): recomputed from the boresight rather than
        // copied back, so no pointing crosses the bus.
        self.pointing.set_transient(transient);
        self.pointing.det_pointing.transient = fresh_quats;
        {
            let mut ops = self.pointing.operators();
            if !accel {
                ops.push(&mut build);
            }
            run_operators(
                "ScanHealpixMap.pointing",
                &mut ops,
                data,
                ctx,
                &self.options,
            )?;
        }
        if accel {
            let hit = self.pointing.pixels.take_hit_submaps(ctx)?;
            let none = vec![0; self.pointing.pixels.n_submap() as usize];
            build.from_hit_submaps(data, ctx, hit.as_deref().unwrap_or(&none))?;
            // The caller's host copy: whole fields (the device steps size
            // their arguments from them; the quaternions, which none
            // reads, stay per set), the quaternions and pixels, and the
            // weights only when they are kept for the caller
            // (`keep_weights`).
            if self.keep_pointing && !transient {
                let mut ops = self.pointing.operators();
                if !self.keep_weights {
                    ops.truncate(2);
                }
                let host = "ScanHealpixMap.pointing_host";
                mirror_on_host(host, &mut ops, data, ctx, &self.options)?;
            }
            // Whole-field quaternions are read by nothing after the pixels
            // and weights: their device copy (32 B a detector sample, as
            // much as the pixels and weights together) is freed before the
            // scan and the noise, whose workspace needs the room.
            if !transient {
                forget(data, ctx, &Requirements::new().detdata(&quats))?;
            }
        }
        let dist = data
            .meta
            .object::<Arc<PixelDistribution>>(&cfg.pixel_dist)?
            .clone();
        // The sky, now that it is needed: a synthesis started before the
        // operator ran its pointing beside it.
        const WAIT: &str = "ScanHealpixMap.sky";
        ctx.timers.enter(WAIT)?;
        let taken = sky.take(&*toast_core::comm_of(ctx));
        ctx.timers.exit(WAIT)?;
        let (sky, synthesis_seconds) = taken?;
        self.scanned = Some(ScannedSky::of(&sky, synthesis_seconds));
        // The sky on the hit submaps only (TOAST's `PixelData.read`).
        let mut map = PixelData::<f64>::try_new(Arc::clone(&dist), 3, "the sky map to scan")?;
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
            let mut ops: Vec<OpRef<'_>> = Vec::new();
            // Transient pointing is expanded again, set by set, for the scan.
            if transient {
                ops.extend(self.pointing.operators());
            }
            ops.push(&mut scan);
            run_operators("ScanHealpixMap.scan", &mut ops, data, ctx, &self.options)
        };
        self.pointing.set_transient(false);
        // The sky's device copy is freed now (the noise made next, and a
        // caller's scope that outlives the scan, need its memory).
        let forgotten = forget(data, ctx, &Requirements::new().global(&map_key));
        data.meta.remove(&map_key);
        r?;
        forgotten?;
        // Transient pointing (the last set's) is not read again: freed
        // before the noise, whose workspace needs the room on a device
        // sized to a small budget.
        if transient {
            self.drop_pointing(data, ctx, accel)?;
        }
        match self.noise.as_mut() {
            Some(noise) => run_operators(
                "ScanHealpixMap.noise",
                &mut [noise as OpRef<'_>],
                data,
                ctx,
                &self.options,
            ),
            None => Ok(()),
        }
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

    /// Write an nside-2 IQU map (float64) with `set` applied to its RING
    /// values, read it as a sky.
    fn sky_with(name: &str, set: &[(usize, usize, f64)]) -> Result<InputSky, OpError> {
        use crate::io::fits::{write_iqu_map, MapPrecision};
        let mut maps = [vec![1.0f64; 48], vec![0.5; 48], vec![-0.5; 48]];
        for &(k, pix, v) in set {
            maps[k][pix] = v;
        }
        let dir = std::env::temp_dir().join(format!("toast-sky-values-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        write_iqu_map(
            &path,
            Ordering::Ring,
            [&maps[0], &maps[1], &maps[2]],
            "K",
            MapPrecision::F64,
            &[],
        )
        .unwrap();
        let r = InputSky::from_file(&path);
        let _ = std::fs::remove_file(&path);
        r
    }

    #[test]
    fn bad_sky_values_are_refused_and_unseen_is_unobserved() {
        let hp = Healpix::new(2).unwrap();
        // UNSEEN (with healpy's tolerance) is zero signal.
        let sky = sky_with(
            "unseen.fits",
            &[(0, 5, UNSEEN), (2, 7, UNSEEN * (1.0 + 1e-7))],
        )
        .unwrap();
        assert_eq!(sky.maps[0][hp.ring2nest(5) as usize], 0.0);
        assert_eq!(sky.maps[2][hp.ring2nest(7) as usize], 0.0);
        assert_eq!(sky.maps[0][hp.ring2nest(6) as usize], 1.0);
        // NaN, inf and float32 overflow are refused, naming the file, the
        // column and the first bad pixel (file ordering).
        for (k, v, what) in [
            (1, f64::NAN, "is NaN;"),
            (0, f64::INFINITY, "is inf;"),
            (2, f64::NEG_INFINITY, "is -inf;"),
            (1, 1e300, "beyond single precision"),
            (0, -1e39, "beyond single precision"),
        ] {
            let e = sky_with("bad.fits", &[(k, 9, v), (k, 30, v)]).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, OpError::Input { .. }), "{e:?}");
            assert!(msg.contains("bad.fits"), "{msg}");
            assert!(msg.contains(&format!("column {} (", k + 1)), "{msg}");
            assert!(msg.contains(&format!("Stokes {}", STOKES[k])), "{msg}");
            assert!(msg.contains("pixel 9 (RING ordering)"), "{msg}");
            assert!(msg.contains(what), "{msg}");
        }
        // Just below UNSEEN's tolerance is an ordinary (huge) value.
        assert!(sky_with("near.fits", &[(0, 1, -1.6e30)]).is_ok());
    }

    #[test]
    fn a_synthetic_sky_beam_wider_than_the_sky_is_refused() {
        let cfg = SkyConfig {
            nside: crate::math::healpix::Nside::try_from(4).unwrap(),
            fwhm_arcmin: 1e308,
            ..SkyConfig::default()
        };
        let e = InputSky::synthetic(&cfg).unwrap_err().to_string();
        assert!(e.contains("beam FWHM 1e308 arcmin"), "{e}");
        assert!(e.contains("180 degrees"), "{e}");
    }

    fn small_sky(fwhm_arcmin: f64) -> SkyConfig {
        SkyConfig {
            nside: crate::math::healpix::Nside::try_from(32).unwrap(),
            fwhm_arcmin,
            ..SkyConfig::default()
        }
    }

    #[test]
    fn a_background_synthesis_gives_the_synthetic_sky_or_its_error() {
        use toast_core::SerialComm;
        let cfg = small_sky(60.0);
        let source = SkySource::from(SkySynthesis::start(cfg.clone(), &SerialComm));
        assert_eq!((source.nside(), source.source()), (32, "synthetic"));
        let (sky, seconds) = source.take(&SerialComm).unwrap();
        assert_eq!(sky, InputSky::synthetic(&cfg).unwrap());
        assert!(seconds.is_some_and(|s| s >= 0.0), "{seconds:?}");
        let scanned = ScannedSky::of(&sky, seconds);
        let peak = sky
            .maps
            .iter()
            .flatten()
            .fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(peak > 0.0);
        assert_eq!(scanned.largest_abs, peak);
        // The error is the inline synthesis's, given by `finish`.
        let bad = small_sky(1e308);
        let e = SkySynthesis::start(bad.clone(), &SerialComm)
            .finish(&SerialComm)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            InputSky::synthetic(&bad).unwrap_err().to_string()
        );
        // One never finished is waited for when dropped (no thread left).
        drop(SkySynthesis::start(cfg, &SerialComm));
    }

    /// Process 0 of two, whose partner's synthesis failed: its `Min`
    /// gives 0; any other collective is an error (the assembly must not
    /// start).
    #[derive(Debug)]
    struct PartnerFailed;

    impl toast_core::Comm for PartnerFailed {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn describe(&self) -> String {
            "partner failed".into()
        }
        fn barrier(&self) -> Result<(), toast_core::CommError> {
            Ok(())
        }
        fn allreduce_f64(
            &self,
            buf: &mut [f64],
            op: toast_core::ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            match op {
                toast_core::ReduceOp::Min => {
                    buf.fill(0.0);
                    Ok(())
                }
                _ => Err(toast_core::CommError::new("allreduce", "not expected")),
            }
        }
        fn allreduce_i64(
            &self,
            _: &mut [i64],
            _: toast_core::ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            Err(toast_core::CommError::new("allreduce", "not expected"))
        }
        fn reduce_f64(
            &self,
            _: usize,
            _: &mut [f64],
            _: toast_core::ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            Err(toast_core::CommError::new("reduce", "not expected"))
        }
        fn reduce_i64(
            &self,
            _: usize,
            _: &mut [i64],
            _: toast_core::ReduceOp,
        ) -> Result<(), toast_core::CommError> {
            Err(toast_core::CommError::new("reduce", "not expected"))
        }
        fn gather_bytes(
            &self,
            _: usize,
            _: &[u8],
        ) -> Result<Option<Vec<Vec<u8>>>, toast_core::CommError> {
            Err(toast_core::CommError::new("gather", "not expected"))
        }
        fn broadcast_bytes(&self, _: usize, _: &mut Vec<u8>) -> Result<(), toast_core::CommError> {
            Err(toast_core::CommError::new("broadcast", "not expected"))
        }
        fn abort(&self, code: i32) -> ! {
            std::process::exit(code)
        }
    }

    #[test]
    fn a_synthesis_that_failed_on_another_process_fails_on_every_process() {
        let e = SkySynthesis::start(small_sky(60.0), &PartnerFailed)
            .finish(&PartnerFailed)
            .unwrap_err()
            .to_string();
        assert!(e.contains("failed on another process"), "{e}");
        // Finished on another communicator than it was started for.
        let e = SkySynthesis::start(small_sky(60.0), &PartnerFailed)
            .finish(&toast_core::SerialComm)
            .unwrap_err();
        assert!(matches!(e, OpError::State { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("started for process 0 of 2, finished on process 0 of 1 (the same"),
            "{e}"
        );
    }

    #[test]
    fn a_cancelled_synthesis_stops_with_its_error() {
        let cancel = AtomicBool::new(true);
        let e = synthesize_sky_part(&small_sky(60.0), 0, 1, Some(&cancel)).unwrap_err();
        assert_eq!(e.to_string(), "the synthesis was cancelled");
    }
}
