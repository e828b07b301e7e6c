//! Staging plans: what a pipeline moves between host and device, and when.
//!
//! A pipeline runs a list of operators, some accelerated, some host-only.
//! The plan is computed from their [`Requirements`] and accel flags alone,
//! before any data moves, by simulating where the newest copy of every item
//! lives:
//!
//! * before an **accelerated** step, each required item that has no device
//!   copy is created and uploaded; one whose device copy is stale (a host
//!   step wrote it) is uploaded again. Each provided item not yet on the
//!   device is created and zeroed there (no transfer: it starts as a fresh
//!   host field would, all zeros). After the step, its provided items are
//!   newest on the device;
//! * before a **host** step, each item it requires or provides whose newest
//!   copy is on the device is copied back (a provided item too, because the
//!   step may write only part of it). After the step, its provided items
//!   that have a device copy are newest on the host;
//! * at the **end**, the pipeline's outputs that are newest on the device
//!   are copied back, and every device buffer is deleted.
//!
//! The outputs are TOAST's `Pipeline._provides` (walk forward: drop what a
//! later step requires, add what it provides) plus anything the caller asks
//! to keep, and the inputs are TOAST's `Pipeline._requires` (walk in
//! reverse: drop what a step provides, add what it requires). So an
//! intermediate such as detector quaternions, pixels or Stokes weights,
//! produced and consumed on the device, never crosses the bus: TOAST measured
//! 40% from this alone.
//!
//! The plan improves on TOAST's own bookkeeping in two places: an item
//! copied back for a host step stays valid on the device (no second
//! upload), and an item a host step writes is marked stale on the device so
//! that a later accelerated step uploads it again.
//!
//! The plan names items only. Its executor (toast-ops' `exec::movement`,
//! the one owner of data movement) applies it to
//! [`crate::device_buffers::DeviceBuffers`] in this order per step:
//! `create`, `update_device`, `reset`, `update_host`, run the step, then the
//! `mark_*` lists; it calls [`Operator::prepare_outputs`] first so that
//! outputs have host fields to size their mirrors, and it skips items that
//! have no device representation (metadata that is not an accelerator
//! object). The tests run every plan against the real state machine.
//!
//! An executor that has the host compute its own copy of an item the
//! device wrote (pointing, recomputed rather than copied back) tells the
//! stager with [`Stager::mark_in_sync`]: the item is then valid on both
//! sides and no later host step or end of scope copies it.
//!
//! A [`Stager`] keeps the simulation state between steps, so a pipeline
//! that runs its operator list once per detector set stages each item once;
//! [`plan_staging`] is the one-pass convenience.

use crate::error::Category;
use crate::operator::{Item, Operator, Requirements};
use std::collections::BTreeMap;

/// One step of a pipeline, as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSpec {
    /// Operator name (for reports).
    pub name: String,
    /// What it reads.
    pub requires: Requirements,
    /// What it writes.
    pub provides: Requirements,
    /// Whether it runs on the device.
    pub accel: bool,
}

impl StepSpec {
    /// A step.
    pub fn new(
        name: impl Into<String>,
        requires: Requirements,
        provides: Requirements,
        accel: bool,
    ) -> Self {
        StepSpec {
            name: name.into(),
            requires,
            provides,
            accel,
        }
    }

    /// The step of an operator: accelerated when the pipeline uses the
    /// accelerator (`use_accel`) and the operator supports it.
    pub fn from_operator(op: &dyn Operator, use_accel: bool) -> Self {
        StepSpec {
            name: op.name().to_string(),
            requires: op.requires(),
            provides: op.provides(),
            accel: use_accel && op.supports_accel(),
        }
    }
}

/// What a pipeline needs from outside: walk in reverse, dropping what a step
/// provides and adding what it requires (TOAST `Pipeline._requires`).
pub fn pipeline_requires(steps: &[StepSpec]) -> Requirements {
    let mut req = Requirements::new();
    for s in steps.iter().rev() {
        req.remove_all(&s.provides);
        req.extend(&s.requires);
    }
    req
}

/// What a pipeline produces for later use: walk forward, dropping what a
/// later step requires (an intermediate) and adding what it provides
/// (TOAST `Pipeline._provides`).
pub fn pipeline_provides(steps: &[StepSpec]) -> Requirements {
    let mut prov = Requirements::new();
    for s in steps {
        prov.remove_all(&s.requires);
        prov.extend(&s.provides);
    }
    prov
}

/// Where the newest copy of an item with a device buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residence {
    /// The device copy is stale (or was never written) and the host copy is valid.
    HostNewer,
    /// Both copies are equal.
    InSync,
    /// The device copy is newer.
    DeviceNewer,
}

/// What to do around one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepStaging {
    /// Position of the step.
    pub step: usize,
    /// Operator name.
    pub name: String,
    /// Whether it runs on the device.
    pub accel: bool,
    /// Before: allocate device buffers (inputs and outputs not yet there).
    pub create: Vec<Item>,
    /// Before: host→device copies.
    pub update_device: Vec<Item>,
    /// Before: zero new output buffers on the device (no transfer).
    pub reset: Vec<Item>,
    /// Before a host step: device→host copies.
    pub update_host: Vec<Item>,
    /// After an accelerated step: items now newest on the device.
    pub mark_device_modified: Vec<Item>,
    /// After a host step: items whose device copy is now stale.
    pub mark_host_modified: Vec<Item>,
}

/// What to do after the last step.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalStaging {
    /// Outputs to copy back.
    pub update_host: Vec<Item>,
    /// Device buffers to free (all of them).
    pub delete: Vec<Item>,
}

/// A whole plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StagingPlan {
    /// One entry per step, in order.
    pub steps: Vec<StepStaging>,
    /// After the last step.
    pub finish: FinalStaging,
}

impl StagingPlan {
    /// Every host→device copy, as (step, item).
    pub fn uploads(&self) -> Vec<(usize, Item)> {
        self.steps
            .iter()
            .flat_map(|s| s.update_device.iter().map(move |i| (s.step, i.clone())))
            .collect()
    }

    /// Every device→host copy before a step, as (step, item): the data a
    /// host-only operator forced back (TOAST reports these as "unstaged").
    pub fn unstaged(&self) -> Vec<(usize, Item)> {
        self.steps
            .iter()
            .flat_map(|s| s.update_host.iter().map(move |i| (s.step, i.clone())))
            .collect()
    }

    /// Whether `item` crosses the bus anywhere in the plan.
    pub fn transfers(&self, item: &Item) -> bool {
        self.steps
            .iter()
            .any(|s| s.update_device.contains(item) || s.update_host.contains(item))
            || self.finish.update_host.contains(item)
    }
}

/// The planner's state across steps (see the module documentation).
#[derive(Debug, Clone, Default)]
pub struct Stager {
    on_device: BTreeMap<Item, Residence>,
}

impl Stager {
    /// Nothing on the device.
    pub fn new() -> Self {
        Self::default()
    }

    /// Where an item is (`None`: host only).
    pub fn residence(&self, item: &Item) -> Option<Residence> {
        self.on_device.get(item).copied()
    }

    /// Items with a device buffer, sorted.
    pub fn on_device(&self) -> Vec<Item> {
        self.on_device.keys().cloned().collect()
    }

    /// Plan the transfers around step `index` and advance the state.
    pub fn stage(&mut self, index: usize, step: &StepSpec) -> StepStaging {
        let mut out = StepStaging {
            step: index,
            name: step.name.clone(),
            accel: step.accel,
            ..StepStaging::default()
        };
        let requires = step.requires.items();
        let provides = step.provides.items();
        if step.accel {
            for it in &requires {
                match self.residence(it) {
                    None => {
                        out.create.push(it.clone());
                        out.update_device.push(it.clone());
                    }
                    Some(Residence::HostNewer) => out.update_device.push(it.clone()),
                    Some(_) => continue,
                }
                self.on_device.insert(it.clone(), Residence::InSync);
            }
            for it in provides.iter().filter(|it| !requires.contains(it)) {
                match self.residence(it) {
                    None => {
                        out.create.push(it.clone());
                        out.reset.push(it.clone());
                    }
                    // Keep the host's values where the step does not write.
                    Some(Residence::HostNewer) => out.update_device.push(it.clone()),
                    Some(_) => {}
                }
            }
            for it in provides {
                self.on_device.insert(it.clone(), Residence::DeviceNewer);
                out.mark_device_modified.push(it);
            }
        } else {
            for it in requires.iter().chain(provides.iter()) {
                if self.residence(it) == Some(Residence::DeviceNewer)
                    && !out.update_host.contains(it)
                {
                    out.update_host.push(it.clone());
                    self.on_device.insert(it.clone(), Residence::InSync);
                }
            }
            for it in provides {
                if let Some(r) = self.on_device.get_mut(&it) {
                    *r = Residence::HostNewer;
                    out.mark_host_modified.push(it);
                }
            }
        }
        out
    }

    /// Record that the host computed its own copy of `item`, equal to the
    /// device's (see [`crate::device_buffers::DeviceBuffers::mark_in_sync`]): a
    /// device-newer item becomes in sync, so no host step and no end of
    /// scope copies it back. Returns whether the item was device-newer
    /// (the executor marks its buffers then); any other residence is left.
    pub fn mark_in_sync(&mut self, item: &Item) -> bool {
        match self.on_device.get_mut(item) {
            Some(r) if *r == Residence::DeviceNewer => {
                *r = Residence::InSync;
                true
            }
            _ => false,
        }
    }

    /// Forget `item`: its device buffers are being freed without a copy
    /// back (its owner is done with it). Returns where it was (`None`: not
    /// on the device).
    pub fn forget(&mut self, item: &Item) -> Option<Residence> {
        self.on_device.remove(item)
    }

    /// Copy back the `outputs` that are newest on the device, and delete
    /// every device buffer. The stager is empty afterwards.
    pub fn finish(&mut self, outputs: &Requirements) -> FinalStaging {
        let mut out = FinalStaging::default();
        for (it, r) in &self.on_device {
            if *r == Residence::DeviceNewer && outputs.contains(it.category, &it.name) {
                out.update_host.push(it.clone());
            }
            out.delete.push(it.clone());
        }
        self.on_device.clear();
        out
    }
}

/// Plan one pass over `steps`. The items copied back at the end are the
/// pipeline's outputs ([`pipeline_provides`]) plus `keep`.
pub fn plan_staging(steps: &[StepSpec], keep: &Requirements) -> StagingPlan {
    let mut stager = Stager::new();
    let planned = steps
        .iter()
        .enumerate()
        .map(|(i, s)| stager.stage(i, s))
        .collect();
    let mut outputs = pipeline_provides(steps);
    outputs.extend(keep);
    StagingPlan {
        steps: planned,
        finish: stager.finish(&outputs),
    }
}

/// Shorthand for an item.
pub fn item(category: Category, name: &str) -> Item {
    Item::new(category, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_buffers::mock::MockDevice;
    use crate::device_buffers::{BufferKey, BufferState, DeviceBuffers};
    use std::sync::Arc;
    use Category::{DetData, Global, Shared};

    fn det(n: &str) -> Item {
        item(DetData, n)
    }

    fn pointing(accel: bool) -> StepSpec {
        StepSpec::new(
            "det_pointing",
            Requirements::new()
                .shared("boresight_radec")
                .shared("flags"),
            Requirements::new().detdata("quats"),
            accel,
        )
    }
    fn pixels(accel: bool) -> StepSpec {
        StepSpec::new(
            "pixels",
            Requirements::new().detdata("quats"),
            Requirements::new().detdata("pixels"),
            accel,
        )
    }
    fn weights(accel: bool) -> StepSpec {
        StepSpec::new(
            "weights",
            Requirements::new().detdata("quats"),
            Requirements::new().detdata("weights"),
            accel,
        )
    }
    fn scan_map(accel: bool) -> StepSpec {
        StepSpec::new(
            "scan_map",
            Requirements::new()
                .global("input_map")
                .detdata("pixels")
                .detdata("weights")
                .detdata("signal"),
            Requirements::new().detdata("signal"),
            accel,
        )
    }

    /// Run a plan against the real state machine with a mock device: every
    /// transition must be legal. Returns the buffers for inspection.
    fn execute(plan: &StagingPlan, passes: &[&StagingPlan]) -> (Arc<MockDevice>, DeviceBuffers) {
        let dev = Arc::new(MockDevice::new(1 << 20));
        let mut bufs = DeviceBuffers::new(dev.clone());
        let key = |it: &Item| BufferKey::new("obs", it.category, it.name.clone());
        let host = vec![0u8; 16];
        let mut host_out = vec![0u8; 16];
        let mut run_steps = |p: &StagingPlan, bufs: &mut DeviceBuffers| {
            for s in &p.steps {
                for it in &s.create {
                    bufs.create(&key(it), 16).unwrap();
                }
                for it in &s.update_device {
                    bufs.update_device(&key(it), &host).unwrap();
                }
                for it in &s.reset {
                    bufs.reset(&key(it)).unwrap();
                }
                for it in &s.update_host {
                    bufs.update_host(&key(it), &mut host_out).unwrap();
                }
                for it in &s.mark_device_modified {
                    bufs.mark_device_modified(&key(it)).unwrap();
                }
                for it in &s.mark_host_modified {
                    bufs.mark_host_modified(&key(it)).unwrap();
                }
            }
        };
        run_steps(plan, &mut bufs);
        for p in passes {
            run_steps(p, &mut bufs);
        }
        let fin = if passes.is_empty() {
            &plan.finish
        } else {
            &passes[passes.len() - 1].finish
        };
        for it in &fin.update_host {
            bufs.update_host(&key(it), &mut host_out).unwrap();
        }
        for it in &fin.delete {
            bufs.delete(&key(it)).unwrap();
        }
        assert!(bufs.present_keys().is_empty(), "everything freed");
        assert_eq!(dev.live_buffers(), 0);
        (dev, bufs)
    }

    #[test]
    fn mark_in_sync_skips_the_copy_back() {
        let mut st = Stager::new();
        st.stage(0, &pointing(true));
        st.stage(1, &pixels(true));
        assert_eq!(st.residence(&det("pixels")), Some(Residence::DeviceNewer));
        assert!(st.mark_in_sync(&det("pixels")));
        assert!(!st.mark_in_sync(&det("pixels")), "already in sync");
        assert!(!st.mark_in_sync(&det("weights")), "not on the device");
        let host = StepSpec::new(
            "cov",
            Requirements::new().detdata("pixels"),
            Requirements::new(),
            false,
        );
        assert!(st.stage(2, &host).update_host.is_empty());
        let fin = st.finish(&Requirements::new().detdata("pixels"));
        assert!(fin.update_host.is_empty());
    }

    #[test]
    fn pipeline_requires_and_provides_follow_toast() {
        let steps = [pointing(true), pixels(true), weights(true), scan_map(true)];
        let req = pipeline_requires(&steps);
        assert_eq!(req.global, ["input_map"]);
        assert_eq!(req.detdata, ["signal"]);
        assert_eq!(req.shared, ["boresight_radec", "flags"]);
        let prov = pipeline_provides(&steps);
        assert_eq!(prov, Requirements::new().detdata("signal"));
    }

    #[test]
    fn all_accelerated_pointing_keeps_intermediates_on_device() {
        let steps = [pointing(true), pixels(true), weights(true), scan_map(true)];
        let plan = plan_staging(&steps, &Requirements::new());

        let s0 = &plan.steps[0];
        assert_eq!(
            s0.create,
            [
                item(Shared, "boresight_radec"),
                item(Shared, "flags"),
                det("quats")
            ]
        );
        assert_eq!(
            s0.update_device,
            [item(Shared, "boresight_radec"), item(Shared, "flags")]
        );
        assert_eq!(s0.reset, [det("quats")]);
        assert_eq!(s0.mark_device_modified, [det("quats")]);
        assert_eq!(plan.steps[1].create, [det("pixels")]);
        assert!(plan.steps[1].update_device.is_empty());
        assert_eq!(plan.steps[2].create, [det("weights")]);
        let s3 = &plan.steps[3];
        assert_eq!(s3.create, [item(Global, "input_map"), det("signal")]);
        assert_eq!(s3.update_device, [item(Global, "input_map"), det("signal")]);
        assert!(
            s3.reset.is_empty(),
            "signal is read, so uploaded, not zeroed"
        );

        for name in ["quats", "pixels", "weights"] {
            assert!(!plan.transfers(&det(name)), "{name} never crosses the bus");
        }
        assert!(plan.unstaged().is_empty());
        assert_eq!(plan.finish.update_host, [det("signal")]);
        assert_eq!(plan.finish.delete.len(), 7);
        let (_dev, bufs) = execute(&plan, &[]);
        let r = bufs.report();
        assert_eq!(r.per_buffer["detdata.signal"].h2d_calls, 1);
        assert_eq!(r.per_buffer["detdata.signal"].d2h_calls, 1);
        assert_eq!(r.per_buffer["detdata.quats"].h2d_calls, 0);
        assert_eq!(r.per_buffer["detdata.quats"].d2h_calls, 0);
        assert_eq!(r.per_buffer["detdata.pixels"].resets, 1);
    }

    #[test]
    fn host_only_operators_pull_back_only_what_they_read() {
        // CovarianceAndHits: pointing on the device, hit map and inverse
        // covariance on the host.
        let hits = StepSpec::new(
            "build_hit_map",
            Requirements::new().detdata("pixels"),
            Requirements::new().global("hits"),
            false,
        );
        let invcov = StepSpec::new(
            "build_inverse_covariance",
            Requirements::new().detdata("pixels").detdata("weights"),
            Requirements::new().global("invcov"),
            false,
        );
        let steps = [pointing(true), pixels(true), weights(true), hits, invcov];
        let plan = plan_staging(&steps, &Requirements::new());
        assert_eq!(plan.steps[3].update_host, [det("pixels")]);
        assert_eq!(
            plan.steps[4].update_host,
            [det("weights")],
            "pixels already copied back and still in sync"
        );
        assert!(
            plan.steps[3].mark_host_modified.is_empty(),
            "hits has no device copy"
        );
        assert_eq!(plan.unstaged(), [(3, det("pixels")), (4, det("weights"))]);
        assert!(!plan.transfers(&det("quats")));
        assert!(
            plan.finish.update_host.is_empty(),
            "outputs are on the host"
        );
        assert_eq!(
            pipeline_provides(&steps),
            Requirements::new().global("hits").global("invcov")
        );
        execute(&plan, &[]);
    }

    #[test]
    fn host_step_writing_staged_data_invalidates_the_device_copy() {
        let dev_op = |n: &str| {
            StepSpec::new(
                n,
                Requirements::new().detdata("signal"),
                Requirements::new().detdata("signal"),
                true,
            )
        };
        let host_op = StepSpec::new(
            "sim_noise",
            Requirements::new().detdata("signal"),
            Requirements::new().detdata("signal"),
            false,
        );
        let steps = [dev_op("scan_map"), host_op, dev_op("noise_weight")];
        let plan = plan_staging(&steps, &Requirements::new());
        assert_eq!(plan.steps[0].create, [det("signal")]);
        assert_eq!(plan.steps[0].update_device, [det("signal")]);
        assert_eq!(plan.steps[1].update_host, [det("signal")]);
        assert_eq!(plan.steps[1].mark_host_modified, [det("signal")]);
        assert!(plan.steps[2].create.is_empty(), "buffer kept");
        assert_eq!(plan.steps[2].update_device, [det("signal")], "re-uploaded");
        assert_eq!(plan.finish.update_host, [det("signal")]);
        let (_d, bufs) = execute(&plan, &[]);
        let c = &bufs.report().per_buffer["detdata.signal"];
        assert_eq!((c.h2d_calls, c.d2h_calls, c.allocs), (2, 2, 1));
    }

    #[test]
    fn host_step_reading_in_sync_data_needs_no_copy() {
        let read_dev = StepSpec::new(
            "stokes",
            Requirements::new().detdata("quats"),
            Requirements::new().detdata("weights"),
            true,
        );
        let read_host = StepSpec::new(
            "stats",
            Requirements::new().detdata("quats"),
            Requirements::new().meta("stats"),
            false,
        );
        let plan = plan_staging(&[read_dev, read_host], &Requirements::new());
        assert!(plan.steps[1].update_host.is_empty());
        assert_eq!(plan.finish.update_host, [det("weights")]);
        execute(&plan, &[]);
    }

    #[test]
    fn host_step_providing_device_newer_data_copies_it_back_first() {
        let a = StepSpec::new(
            "pixels",
            Requirements::new().detdata("quats"),
            Requirements::new().detdata("pixels"),
            true,
        );
        let b = StepSpec::new(
            "mask_pixels",
            Requirements::new(),
            Requirements::new().detdata("pixels"),
            false,
        );
        let c = StepSpec::new(
            "pixels_again",
            Requirements::new(),
            Requirements::new().detdata("pixels"),
            true,
        );
        let plan = plan_staging(&[a, b, c], &Requirements::new());
        assert_eq!(plan.steps[1].update_host, [det("pixels")]);
        assert_eq!(plan.steps[1].mark_host_modified, [det("pixels")]);
        assert_eq!(
            plan.steps[2].update_device,
            [det("pixels")],
            "stale device copy of a provided-only item is refreshed, not zeroed"
        );
        assert!(plan.steps[2].reset.is_empty());
        assert_eq!(plan.finish.update_host, [det("pixels")]);
        execute(&plan, &[]);
    }

    #[test]
    fn without_accelerator_nothing_moves() {
        let steps = [
            pointing(false),
            pixels(false),
            weights(false),
            scan_map(false),
        ];
        let plan = plan_staging(&steps, &Requirements::new().detdata("pixels"));
        for s in &plan.steps {
            assert!(s.create.is_empty() && s.update_device.is_empty() && s.update_host.is_empty());
            assert!(s.mark_host_modified.is_empty() && s.mark_device_modified.is_empty());
        }
        assert_eq!(plan.finish, FinalStaging::default());
    }

    #[test]
    fn keep_brings_back_an_intermediate() {
        let steps = [pointing(true), pixels(true), weights(true), scan_map(true)];
        let plan = plan_staging(&steps, &Requirements::new().detdata("pixels"));
        assert_eq!(plan.finish.update_host, [det("pixels"), det("signal")]);
        assert!(!plan.transfers(&det("quats")));
        execute(&plan, &[]);
    }

    #[test]
    fn mapmaker_accumulates_global_map_on_device() {
        let bnw = StepSpec::new(
            "build_noise_weighted",
            Requirements::new()
                .detdata("pixels")
                .detdata("weights")
                .detdata("signal")
                .detdata("flags"),
            Requirements::new().global("zmap"),
            true,
        );
        let steps = [pointing(true), pixels(true), weights(true), bnw];
        let plan = plan_staging(&steps, &Requirements::new());
        assert_eq!(
            plan.steps[3].create,
            [det("signal"), det("flags"), item(Global, "zmap")]
        );
        assert_eq!(plan.steps[3].reset, [item(Global, "zmap")]);
        assert_eq!(plan.finish.update_host, [item(Global, "zmap")]);
        assert_eq!(
            plan.uploads(),
            [
                (0, item(Shared, "boresight_radec")),
                (0, item(Shared, "flags")),
                (3, det("signal")),
                (3, det("flags"))
            ]
        );
        execute(&plan, &[]);
    }

    #[test]
    fn repeated_passes_stage_once() {
        // A pipeline over two detector sets runs its list twice.
        let steps = [pointing(true), pixels(true), weights(true), scan_map(true)];
        let mut st = Stager::new();
        let first: Vec<StepStaging> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| st.stage(i, s))
            .collect();
        let second: Vec<StepStaging> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| st.stage(i, s))
            .collect();
        assert!(first.iter().any(|s| !s.create.is_empty()));
        for s in &second {
            assert!(s.create.is_empty(), "{}: nothing new to create", s.name);
            assert!(s.update_device.is_empty(), "{}: nothing to upload", s.name);
            assert!(s.update_host.is_empty());
        }
        assert_eq!(st.residence(&det("signal")), Some(Residence::DeviceNewer));
        assert_eq!(st.on_device().len(), 7);
        let fin = st.finish(&pipeline_provides(&steps));
        assert_eq!(fin.update_host, [det("signal")]);
        assert!(st.on_device().is_empty());
        let p1 = StagingPlan {
            steps: first,
            finish: FinalStaging::default(),
        };
        let p2 = StagingPlan {
            steps: second,
            finish: fin,
        };
        let (_d, bufs) = execute(&p1, &[&p2]);
        assert_eq!(bufs.report().per_buffer["detdata.signal"].h2d_calls, 1);
        assert_eq!(
            bufs.state(&BufferKey::new("obs", DetData, "signal")),
            BufferState::Deleted
        );
    }

    #[test]
    fn from_operator_uses_support_flag() {
        use crate::observation::Data;
        use crate::operator::{ExecContext, OpError};
        struct Op(bool);
        impl Operator for Op {
            fn name(&self) -> &str {
                "op"
            }
            fn requires(&self) -> Requirements {
                Requirements::new().detdata("a")
            }
            fn provides(&self) -> Requirements {
                Requirements::new().detdata("b")
            }
            fn supports_accel(&self) -> bool {
                self.0
            }
            fn exec(&mut self, _d: &mut Data, _c: &mut ExecContext) -> Result<(), OpError> {
                Ok(())
            }
        }
        assert!(StepSpec::from_operator(&Op(true), true).accel);
        assert!(!StepSpec::from_operator(&Op(true), false).accel);
        assert!(!StepSpec::from_operator(&Op(false), true).accel);
        let s = StepSpec::from_operator(&Op(true), true);
        assert_eq!(s.name, "op");
        assert_eq!(s.requires.detdata, ["a"]);
    }
}
