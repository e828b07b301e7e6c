//! Small helpers shared by the operators: detector selection, the pointing
//! operator bundle, and field utilities (copy, reset, delete).

use super::{ExpandCompactPointing, PixelsHealpix, PointingDetector, StokesWeights};
use crate::exec::global_data::{global_bytes, global_bytes_mut};
use crate::pixels::PixelData;
use toast_core::{
    BufferKey, Category, DType, Data, ExecContext, Observation, OpError, Operator, Requirements,
};

/// The detectors of `ob` to process: the context's selection (or every
/// local detector), minus those whose detector flags have a bit of
/// `det_mask` (TOAST's `select_local_detectors(selection, flagmask)`).
pub fn select_detectors(ctx: &ExecContext, ob: &Observation, det_mask: u8) -> Vec<String> {
    ctx.selected_detectors(ob.local_detectors())
        .into_iter()
        .filter(|d| ob.det_flags(d).map(|f| f & det_mask == 0).unwrap_or(false))
        .collect()
}

/// Create the timestream `name` (f64, every local detector, zeros) in each
/// observation that lacks it, as TOAST's `detdata.ensure` does for the
/// operators that add to a timestream (`ScanMap`, `SimNoise`); an existing
/// one is left as it is.
pub fn ensure_timestream(data: &mut Data, name: &str) -> Result<(), OpError> {
    for ob in &mut data.obs {
        if !ob.detdata.contains(name) {
            ob.detdata.create(name, DType::F64, &[], None)?;
        }
    }
    Ok(())
}

/// The output field `name` of a pointing operator for the detectors `dets`
/// of `ob`. With `transient` (host runs of a pipeline over detector sets),
/// the field is replaced by one that holds only `dets`: each pass over a
/// detector set drops the previous set's rows, so the field never holds
/// all detectors at once (its consumers read rows by detector name). A
/// previous set's field of the same size is reused in place
/// (`DetDataManager::recycle`): its rows then hold the previous set's
/// values until written (the pointing operators write every sample of
/// their view, which is all their consumers read). Else the field is
/// created for every local detector if missing. Returns whether a field
/// was reused.
pub fn pointing_field(
    ob: &mut Observation,
    name: &str,
    dtype: DType,
    sample_shape: &[usize],
    dets: &[String],
    transient: bool,
) -> Result<bool, OpError> {
    if transient {
        if !dets.is_empty() && ob.detdata.recycle(name, dtype, sample_shape, dets) {
            return Ok(true);
        }
        if ob.detdata.contains(name) {
            ob.detdata.remove(name)?;
        }
        if !dets.is_empty() {
            ob.detdata.create(name, dtype, sample_shape, Some(dets))?;
        }
    } else {
        ob.detdata.create(name, dtype, sample_shape, None)?;
    }
    Ok(false)
}

/// The three operators that expand pointing, configured together as TOAST's
/// `pixel_pointing` (with its `detector_pointing`) and `stokes_weights`.
#[derive(Debug, Clone)]
pub struct PointingOps {
    /// Detector quaternions.
    pub det_pointing: PointingDetector,
    /// HEALPix pixels.
    pub pixels: PixelsHealpix,
    /// Stokes weights.
    pub weights: StokesWeights,
    /// With compact pointing (the map-maker's passes that read pointing
    /// fields, on the host or a device): the one operator
    /// that rebuilds a detector batch's pixels and weights from the
    /// compact pixels, run instead of the three (see
    /// [`PointingOps::set_compact`]).
    pub compact: Option<ExpandCompactPointing>,
}

impl PointingOps {
    /// The bundle.
    pub fn new(
        det_pointing: PointingDetector,
        pixels: PixelsHealpix,
        weights: StokesWeights,
    ) -> Self {
        PointingOps {
            det_pointing,
            pixels,
            weights,
            compact: None,
        }
    }

    /// Rebuild the pixels and weights from the i32 field `compact` (the
    /// pixels of these operators, written as i32 by the pixel operator,
    /// [`super::PixelsHealpix::compact`]) instead of running the three
    /// operators (`Some`), or stop (`None`). The rebuilt fields hold one
    /// detector batch (transient; on a device, their device copies too).
    pub fn set_compact(&mut self, compact: Option<&str>) {
        self.compact = compact.map(|c| ExpandCompactPointing {
            name: format!("{}_compact", self.weights.name()),
            compact: c.to_string(),
            det_pointing: self.det_pointing.config.clone(),
            pixels: self.pixels.config.clone(),
            weights: self.weights.config.clone(),
        });
    }

    /// Make all three operators' outputs transient (see
    /// [`pointing_field`]; host runs only) or not.
    pub fn set_transient(&mut self, on: bool) {
        self.det_pointing.transient = on;
        self.pixels.transient = on;
        self.weights.transient = on;
    }

    /// The operators, in pipeline order (the compact expansion alone when
    /// set).
    pub fn operators(&mut self) -> Vec<crate::exec::pipeline::OpRef<'_>> {
        if let Some(c) = &mut self.compact {
            return vec![c];
        }
        vec![&mut self.det_pointing, &mut self.pixels, &mut self.weights]
    }

    /// What the three operators need from outside, as a pipeline.
    pub fn requires(&self) -> Requirements {
        toast_core::pipeline_requires(&self.specs())
    }

    /// What they leave behind (the pixels and weights).
    pub fn provides(&self) -> Requirements {
        toast_core::pipeline_provides(&self.specs())
    }

    fn specs(&self) -> Vec<toast_core::StepSpec> {
        vec![
            toast_core::StepSpec::from_operator(&self.det_pointing, true),
            toast_core::StepSpec::from_operator(&self.pixels, true),
            toast_core::StepSpec::from_operator(&self.weights, true),
        ]
    }

    /// Name of the pixel field.
    pub fn pixels_field(&self) -> &str {
        &self.pixels.config.pixels
    }

    /// Name of the weights field.
    pub fn weights_field(&self) -> &str {
        &self.weights.config.weights
    }

    /// Number of Stokes weights per sample.
    pub fn nnz(&self) -> usize {
        self.weights.config.mode.nnz()
    }

    /// The sample view of the pixel pointing (TOAST's `pixel_pointing.view`).
    pub fn view(&self) -> Option<&str> {
        self.pixels.view()
    }
}

/// Copy detdata field `input` into `output` for the selected detectors
/// (TOAST's `Copy` operator), creating `output` like `input` if needed.
/// On a device (an accelerated step) the copy is made there, one kernel
/// call per observation (`exec::kernels::copy_detdata`) where the pass
/// selects every row of a float64 input and the output has the same rows;
/// otherwise the host copies, as a host step of the device scope.
#[derive(Debug, Clone)]
pub struct CopyDetData {
    /// Instance name.
    pub name: String,
    /// Source field.
    pub input: String,
    /// Destination field.
    pub output: String,
    /// Detector flag bits that exclude a detector.
    pub det_mask: u8,
    /// Host runs of a pipeline over detector sets: `output` is replaced by
    /// a field holding only the current set's detectors (see
    /// [`pointing_field`]), so a work copy never exists for all detectors
    /// at once. Ignored on an accelerated step.
    pub transient: bool,
}

impl Operator for CopyDetData {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new().detdata(&self.input)
    }
    fn provides(&self) -> Requirements {
        Requirements::new().detdata(&self.output)
    }
    /// On a device (an accelerated step) the work copy is made there.
    fn supports_accel(&self) -> bool {
        true
    }
    /// On a device: the output, if absent, like the input (its rows, type
    /// and shape), so that the step's device buffer exists before it runs.
    fn prepare_outputs(&self, data: &mut Data, _ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            if ob.detdata.contains(&self.output) || !ob.detdata.contains(&self.input) {
                continue;
            }
            let (dtype, shape, dets) = {
                let f = ob.detdata.get(&self.input)?;
                (f.dtype(), f.sample_shape().to_vec(), f.detectors().to_vec())
            };
            ob.detdata
                .create(&self.output, dtype, &shape, Some(&dets))?;
        }
        Ok(())
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !ctx.use_accel {
            return self.exec_on_host(data, ctx);
        }
        // Where the pass selects every row of a float64 input and the
        // output has the same rows, one copy of the whole field on the
        // device (in a streamed scope, of the rows the device holds, when
        // they are the selected ones); elsewhere the host's copy, as a host
        // step of the scope (the input comes back, the output goes up:
        // correct, not fast).
        let mut on_host = false;
        let Data { obs, meta, .. } = data;
        for ob in obs.iter_mut() {
            let dets = select_detectors(ctx, ob, self.det_mask);
            if dets.is_empty() {
                continue;
            }
            let whole = {
                let (src, dst) = (ob.detdata.get(&self.input)?, ob.detdata.get(&self.output)?);
                let rows = match crate::exec::movement::step_window(ctx, ob.name(), &self.input) {
                    Some(w) => w.first..w.first + w.rows,
                    None => 0..src.n_det(),
                };
                src.dtype() == DType::F64
                    && src.detectors() == dst.detectors()
                    && src.shape() == dst.shape()
                    && dst.dtype() == DType::F64
                    && dets.len() == rows.len()
                    && dets
                        .iter()
                        .all(|d| src.row_index(d).is_some_and(|r| rows.contains(&r)))
            };
            if !whole {
                on_host = true;
                continue;
            }
            let units = ob.detdata.get(&self.input)?.units().to_string();
            crate::exec::kernels::copy_detdata(
                ctx,
                &self.name,
                ob,
                meta,
                (&self.input, &self.output),
            )?;
            ob.detdata.get_mut(&self.output)?.set_units(units);
        }
        if on_host {
            let name = format!("{} (host copy)", self.name);
            let this = &*self;
            crate::exec::movement::with_host_step(
                data,
                ctx,
                &name,
                self.requires(),
                self.provides(),
                |data, ctx| this.exec_on_host(data, ctx),
            )?;
        }
        Ok(())
    }
}

impl CopyDetData {
    /// The copy on the host, row by row, of the selected detectors.
    fn exec_on_host(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            let dets = select_detectors(ctx, ob, self.det_mask);
            if dets.is_empty() {
                continue;
            }
            let (dtype, shape, units) = {
                let f = ob.detdata.get(&self.input)?;
                (f.dtype(), f.sample_shape().to_vec(), f.units().to_string())
            };
            pointing_field(
                ob,
                &self.output,
                dtype,
                &shape,
                &dets,
                self.transient && !ctx.use_accel,
            )?;
            let [src, dst] = ob
                .detdata
                .get_disjoint_mut([self.input.as_str(), self.output.as_str()])?;
            if dst.dtype() != dtype || dst.sample_shape() != shape.as_slice() {
                return Err(OpError::InvalidData {
                    what: format!(
                        "observation '{}': cannot copy detdata '{}' into '{}': different types \
                         or shapes",
                        ob.name(),
                        self.input,
                        self.output
                    ),
                });
            }
            let n = src.row_len() * dtype.size();
            for d in &dets {
                let (si, di) = match (src.row_index(d), dst.row_index(d)) {
                    (Some(a), Some(b)) => (a, b),
                    _ => {
                        return Err(OpError::Data(toast_core::DataError::MissingDetector {
                            observation: ob.name().to_string(),
                            where_: format!("detdata '{}' or '{}'", self.input, self.output),
                            detector: d.clone(),
                        }))
                    }
                };
                let from = src.as_bytes()[si * n..(si + 1) * n].to_vec();
                dst.as_bytes_mut()[di * n..(di + 1) * n].copy_from_slice(&from);
            }
            dst.set_units(units);
        }
        Ok(())
    }
}

/// Zero detdata fields (all rows) and global items. On an accelerated step,
/// an item staged on the device is zeroed there in place (TOAST's
/// `accel_reset`), with no transfer; otherwise the host copy is zeroed.
/// Missing detdata fields are created as f64 scalars per sample; global
/// items must exist. With `transient`, each detdata field is instead
/// replaced by a zeroed one holding only the selected detectors (see
/// [`pointing_field`]; on a device its mirror is sized to it): a work
/// timestream of one detector set.
#[derive(Debug, Clone, Default)]
pub struct ResetData {
    /// Instance name.
    pub name: String,
    /// Detdata fields.
    pub detdata: Vec<String>,
    /// Global items (maps, amplitude vectors).
    pub global: Vec<String>,
    /// Replace the detdata fields by zeroed ones of the selected detectors
    /// only.
    pub transient: bool,
}

impl Operator for ResetData {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new()
    }
    fn provides(&self) -> Requirements {
        let mut r = Requirements::new();
        for f in &self.detdata {
            r.add(Category::DetData, f);
        }
        for g in &self.global {
            r.add(Category::Global, g);
        }
        r
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn prepare_outputs(&self, data: &mut Data, ctx: &ExecContext) -> Result<(), OpError> {
        for ob in &mut data.obs {
            let dets = ctx.selected_detectors(ob.local_detectors());
            for f in &self.detdata {
                if !self.transient {
                    ob.detdata.create(f, toast_core::DType::F64, &[], None)?;
                } else if pointing_field(ob, f, DType::F64, &[], &dets, true)? && !ctx.use_accel {
                    // A field of the selected detectors, zeroed (a reused
                    // one holds the previous set's values). On a device
                    // step the device copy is zeroed instead (`exec`); the
                    // host copy is never written there, so it stays zeros
                    // and its pages untouched (no host memory per batch).
                    ob.detdata.get_mut(f)?.fill_zero();
                }
            }
        }
        for g in &self.global {
            if global_bytes(&data.meta, g).is_none() {
                return Err(OpError::Global {
                    key: g.clone(),
                    problem: "cannot be reset: it is missing or not a map or array".into(),
                });
            }
        }
        Ok(())
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        let use_accel = ctx.use_accel;
        // Transient host fields are new and zeroed by `prepare_outputs`
        // (of the selected detectors); on a device their mirrors, sized to
        // them, are zeroed below like whole fields.
        let fresh_on_host = self.transient && !use_accel;
        self.prepare_outputs(data, ctx)?;
        let mut keys: Vec<BufferKey> = Vec::new();
        for ob in &data.obs {
            for f in self.detdata.iter().filter(|_| !fresh_on_host) {
                keys.push(BufferKey::new(ob.name(), Category::DetData, f.clone()));
            }
        }
        for g in &self.global {
            keys.push(BufferKey::global(g.clone()));
        }
        for key in keys {
            if use_accel && crate::exec::movement::reset_on_device(ctx, &key)? {
                continue;
            }
            match key.category {
                Category::Global => {
                    if let Ok(map) = data.meta.object_mut::<PixelData<f64>>(&key.field) {
                        // A confined map zeroes only its support.
                        map.reset();
                    } else if let Some(bytes) = global_bytes_mut(&mut data.meta, &key.field) {
                        // Pages never written (unhit pixels) stay unmapped.
                        toast_core::mem::zero_sparse(bytes);
                    }
                }
                _ => data
                    .get_mut(&key.observation)?
                    .detdata
                    .get_mut(&key.field)?
                    .fill_zero(),
            }
        }
        Ok(())
    }
}

/// Delete detdata fields from every observation (host only; device mirrors
/// are freed by the pipeline scope that made them).
#[derive(Debug, Clone)]
pub struct DeleteDetData {
    /// Instance name.
    pub name: String,
    /// Fields to delete (missing ones are ignored).
    pub fields: Vec<String>,
}

impl Operator for DeleteDetData {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        Requirements::new()
    }
    fn provides(&self) -> Requirements {
        Requirements::new()
    }
    fn exec(&mut self, data: &mut Data, _ctx: &mut ExecContext) -> Result<(), OpError> {
        Ok(data.remove_detdata(&self.fields)?)
    }
}
