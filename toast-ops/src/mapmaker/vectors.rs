//! The PCG solver's amplitude-vector steps as pipeline operators: a flagged
//! dot product into per-block partial sums (`amp_dot`) and the update
//! `y ← αx + βy` (`amp_axpby`).
//!
//! In the map-maker's device scope on a device backend both run as
//! kernels on the staged global items, so the solver's vectors (`x`, `r`,
//! `d`, `s`, `q`, `b`) stay on the device for the whole solve and only the
//! partial sums (at most [`crate::exec::kernels::amp_dot_blocks`] `f64`s
//! per dot product) cross the bus. Without a scope (the CPU backend, every
//! CPU run) they run on the host with `toast_accel::math`'s arithmetic, the
//! same function the CPU plugin's kernels call: with one block the dot
//! product is the plain sequential sum the solver always computed, so CPU
//! maps keep their bits.

use crate::exec::global_data::HostArray;
use crate::exec::kernels;
use toast_accel::math::{axpby, dot_block, flagged_dot};
use toast_core::{Data, ExecContext, OpError, Operator, Requirements};

/// One vector step of the solve.
#[derive(Debug, Clone)]
pub(super) enum VectorStep {
    /// `partials[k] = Σ_{i in block k, flags_i == 0} a_i b_i`.
    Dot {
        a: String,
        b: String,
        flags: String,
        partials: String,
    },
    /// `y ← (α x) + (β y)` (`y ← α x` when `β == 0`).
    Axpby {
        alpha: f64,
        x: String,
        beta: f64,
        y: String,
    },
}

/// A [`VectorStep`] as an operator (named `name` for dispatch and timers).
#[derive(Debug, Clone)]
pub(super) struct VectorOp {
    pub(super) name: String,
    pub(super) step: VectorStep,
}

impl VectorOp {
    fn on_host(&self, data: &mut Data) -> Result<(), OpError> {
        let meta = &mut data.meta;
        match &self.step {
            VectorStep::Dot {
                a,
                b,
                flags,
                partials,
            } => {
                let nblock = meta.object::<HostArray<f64>>(partials)?.values.len();
                let sums = {
                    let va = &meta.object::<HostArray<f64>>(a)?.values;
                    let vb = &meta.object::<HostArray<f64>>(b)?.values;
                    let vf = &meta.object::<HostArray<u8>>(flags)?.values;
                    let n = va.len();
                    if vb.len() != n || vf.len() != n {
                        return Err(OpError::Global {
                            key: b.clone(),
                            problem: format!(
                                "{} values and {} flags for a dot product with '{a}' of {n}",
                                vb.len(),
                                vf.len()
                            ),
                        });
                    }
                    (0..nblock)
                        .map(|k| {
                            let r = dot_block(k, n, nblock);
                            flagged_dot(&va[r.clone()], &vb[r.clone()], &vf[r])
                        })
                        .collect::<Vec<_>>()
                };
                meta.object_mut::<HostArray<f64>>(partials)?
                    .values
                    .copy_from_slice(&sums);
                Ok(())
            }
            VectorStep::Axpby { alpha, x, beta, y } => {
                let vx = meta.object::<HostArray<f64>>(x)?.values.clone();
                let vy = &mut meta.object_mut::<HostArray<f64>>(y)?.values;
                if vx.len() != vy.len() {
                    return Err(OpError::Global {
                        key: y.clone(),
                        problem: format!("{} values, '{x}' has {}", vy.len(), vx.len()),
                    });
                }
                axpby(*alpha, &vx, *beta, vy);
                Ok(())
            }
        }
    }
}

impl Operator for VectorOp {
    fn name(&self) -> &str {
        &self.name
    }
    fn requires(&self) -> Requirements {
        match &self.step {
            VectorStep::Dot { a, b, flags, .. } => {
                Requirements::new().global(a).global(b).global(flags)
            }
            VectorStep::Axpby { x, y, beta, .. } => {
                let r = Requirements::new().global(x);
                // y is not read when beta == 0 (so not uploaded for it).
                if *beta == 0.0 {
                    r
                } else {
                    r.global(y)
                }
            }
        }
    }
    fn provides(&self) -> Requirements {
        match &self.step {
            VectorStep::Dot { partials, .. } => Requirements::new().global(partials),
            VectorStep::Axpby { y, .. } => Requirements::new().global(y),
        }
    }
    fn supports_accel(&self) -> bool {
        true
    }
    fn exec(&mut self, data: &mut Data, ctx: &mut ExecContext) -> Result<(), OpError> {
        if !ctx.use_accel {
            return self.on_host(data);
        }
        match &self.step {
            VectorStep::Dot {
                a,
                b,
                flags,
                partials,
            } => kernels::amp_dot(ctx, &self.name, &mut data.meta, (a, b, flags), partials),
            VectorStep::Axpby { alpha, x, beta, y } => {
                kernels::amp_axpby(ctx, &self.name, &mut data.meta, (*alpha, x), (*beta, y))
            }
        }
    }
}
