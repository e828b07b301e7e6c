//! How a job's work is split across processes, as TOAST splits it
//! (`toast.dist` and the satellite benchmark's `select_distribution`).
//!
//! * The world is cut into groups of `group_size` consecutive ranks
//!   ([`toast_core::ProcessLayout`]).
//! * Whole observations go to groups in contiguous blocks weighted by their
//!   sample counts ([`distribute_discrete`], TOAST's painter's-partition
//!   scheme).
//! * Within a group every process holds all samples of its detectors; the
//!   detector sets (one per focal-plane pixel, so A/B pairs stay together)
//!   are split into contiguous blocks by [`distribute_discrete`] over the
//!   set sizes, as TOAST's `distribute_detectors` does with
//!   `distribute_time = False`.
//!
//! Everything here is pure arithmetic: `toast-cli run --dry-run P,PPN`
//! prints the same plan a real `mpirun -n P` run uses, without MPI.

use std::ops::Range;

/// Contiguous blocks of indivisible items of `sizes` for `groups` groups,
/// minimising the largest total (TOAST's `distribute_discrete` with
/// `pow = 1`, no breaks): a binary search for the smallest feasible maximum,
/// then a greedy pass that carries each group's excess over the mean into
/// the next. Groups beyond the number of blocks formed are empty ranges at
/// the end.
pub fn distribute_discrete(sizes: &[u64], groups: usize) -> Result<Vec<Range<usize>>, String> {
    if groups == 0 {
        return Err("distribute_discrete: zero groups".into());
    }
    let n = sizes.len();
    if n == groups {
        return Ok((0..n)
            .map(|i| if sizes[i] == 0 { i..i } else { i..i + 1 })
            .collect());
    }
    if groups == 1 {
        #[allow(clippy::single_range_in_vec_init)] // one range: the one group's blocks
        return Ok(vec![0..n]);
    }
    if n == 0 {
        return Ok(vec![0..0; groups]);
    }
    let max_per = partition_max(sizes, groups) as f64;
    let target = sizes.iter().map(|&s| s as f64).sum::<f64>() / groups as f64;
    let mut dist = Vec::with_capacity(groups);
    let mut off = 0usize;
    let mut cur_weight = 0.0f64;
    for (cur, &w) in sizes.iter().enumerate() {
        let w = w as f64;
        if cur_weight + w > max_per {
            dist.push(off..cur);
            let over = cur_weight - target;
            cur_weight = w + over;
            off = cur;
        } else {
            cur_weight += w;
        }
    }
    dist.push(off..n);
    while dist.len() < groups {
        dist.push(n..n);
    }
    if dist.len() != groups {
        return Err(format!(
            "distribute_discrete: {} blocks for {groups} groups (sizes {sizes:?})",
            dist.len()
        ));
    }
    Ok(dist)
}

/// The smallest maximum block total with which `sizes` fits in `k`
/// contiguous blocks (binary search; TOAST's `distribute_partition`).
fn partition_max(sizes: &[u64], k: usize) -> u64 {
    let required = |max: u64| {
        let mut n = 1usize;
        let mut total = 0u64;
        for &s in sizes {
            total += s;
            if total > max {
                total = s;
                n += 1;
            }
        }
        n
    };
    let mut low = sizes.iter().copied().max().unwrap_or(0);
    let mut high: u64 = sizes.iter().sum();
    while low < high {
        let mid = low + (high - low) / 2;
        if required(mid) <= k {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    low
}

/// `total` items in `groups` contiguous ranges whose lengths differ by at
/// most one, the longer first (TOAST's `distribute_uniform`).
pub fn distribute_uniform(total: usize, groups: usize) -> Vec<Range<usize>> {
    let groups = groups.max(1);
    let base = total / groups;
    let left = total % groups;
    (0..groups)
        .map(|i| {
            let (n, off) = if i < left {
                (base + 1, i * (base + 1))
            } else {
                (base, (base + 1) * left + base * (i - left))
            };
            off..off + n
        })
        .collect()
}

/// TOAST's target of detectors per process when choosing a group size.
pub const TARGET_PROC_DETS: u64 = 200;

/// The group size (in processes) TOAST's benchmark picks for `n_procs`
/// processes with `procs_per_node` per node: whole nodes per group, a
/// divisor of the node count, no more groups than observations, and a group
/// smaller than the job only when it gives each process at most
/// [`TARGET_PROC_DETS`] detectors; of those, the smallest group (most
/// groups).
pub fn default_group_size(
    n_procs: usize,
    procs_per_node: usize,
    n_obs: usize,
    n_det: u64,
) -> usize {
    let ppn = procs_per_node.clamp(1, n_procs.max(1));
    let n_nodes = (n_procs / ppn).max(1);
    let mut best = n_nodes;
    for test_nodes in (1..=n_nodes).rev() {
        if !n_nodes.is_multiple_of(test_nodes) {
            continue;
        }
        let n_group = n_nodes / test_nodes;
        if n_group > n_obs.max(1) {
            continue;
        }
        let group_procs = (test_nodes * ppn) as u64;
        if test_nodes < n_nodes && group_procs * TARGET_PROC_DETS < n_det {
            continue;
        }
        best = test_nodes;
    }
    // Processes that do not fill whole nodes join one group.
    if !n_procs.is_multiple_of(ppn) {
        return n_procs;
    }
    best * ppn
}

/// The split of a job: which observations each group has and which
/// detector sets each process of a group holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDistribution {
    /// Number of processes.
    pub n_procs: usize,
    /// Processes per group.
    pub group_size: usize,
    /// Observation indices (into the schedule slice) of each group.
    pub group_obs: Vec<Range<usize>>,
    /// Detector-set indices of each rank within a group (the same for every
    /// observation: all observations share the focal plane).
    pub rank_detsets: Vec<Range<usize>>,
}

impl JobDistribution {
    /// Plan `n_procs` processes in groups of `group_size` over observations
    /// of `obs_samples` samples and detector sets of `detset_sizes`
    /// detectors. Errors name the impossible constraint.
    pub fn plan(
        n_procs: usize,
        group_size: usize,
        obs_samples: &[u64],
        detset_sizes: &[u64],
    ) -> Result<Self, String> {
        if n_procs == 0 {
            return Err("no processes".into());
        }
        if group_size == 0 || !n_procs.is_multiple_of(group_size) {
            return Err(format!(
                "group size {group_size} does not divide the {n_procs} processes"
            ));
        }
        let n_groups = n_procs / group_size;
        if n_groups > obs_samples.len() {
            return Err(format!(
                "{n_groups} process groups (of {group_size}) for {} observation(s): every \
                 group needs at least one observation; use a larger group size (at least {})",
                obs_samples.len(),
                n_procs.div_ceil(obs_samples.len().max(1))
            ));
        }
        if group_size > detset_sizes.len() {
            return Err(format!(
                "group size {group_size} is larger than the {} detector sets (focal-plane \
                 pixels): every process of a group needs at least one; use at most {} \
                 processes per group",
                detset_sizes.len(),
                detset_sizes.len()
            ));
        }
        let group_obs = distribute_discrete(obs_samples, n_groups)?;
        if let Some(g) = group_obs.iter().position(|r| r.is_empty()) {
            return Err(format!(
                "process group {g} got no observation ({} groups, {} observations)",
                n_groups,
                obs_samples.len()
            ));
        }
        let rank_detsets = distribute_discrete(detset_sizes, group_size)?;
        if let Some(r) = rank_detsets.iter().position(|r| r.is_empty()) {
            return Err(format!(
                "group rank {r} got no detector set ({group_size} processes per group, {} sets)",
                detset_sizes.len()
            ));
        }
        Ok(JobDistribution {
            n_procs,
            group_size,
            group_obs,
            rank_detsets,
        })
    }

    /// Number of groups.
    pub fn n_groups(&self) -> usize {
        self.n_procs / self.group_size
    }

    /// The observations of world rank `rank`.
    pub fn obs_of(&self, rank: usize) -> Range<usize> {
        self.group_obs[rank / self.group_size].clone()
    }

    /// The detector sets of world rank `rank`.
    pub fn detsets_of(&self, rank: usize) -> Range<usize> {
        self.rank_detsets[rank % self.group_size].clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discrete_matches_toast() {
        // Values from TOAST 3.0.6's distribute_discrete.
        assert_eq!(
            distribute_discrete(&[10, 10, 10, 10], 2).unwrap(),
            vec![0..2, 2..4]
        );
        assert_eq!(
            distribute_discrete(&[5, 1, 1, 1, 1, 1], 2).unwrap(),
            vec![0..1, 1..6]
        );
        assert_eq!(
            distribute_discrete(&[3, 0, 2], 3).unwrap(),
            vec![0..1, 1..1, 2..3]
        );
        let one = distribute_discrete(&[1, 2], 1).unwrap();
        assert_eq!((one.len(), one[0].clone()), (1, 0..2));
        assert_eq!(
            distribute_discrete(&[2; 7], 3).unwrap(),
            vec![0..3, 3..5, 5..7]
        );
        assert_eq!(
            distribute_discrete(&[4, 4], 3).unwrap(),
            vec![0..1, 1..2, 2..2]
        );
    }

    #[test]
    fn uniform_matches_toast() {
        assert_eq!(distribute_uniform(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(distribute_uniform(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
    }

    #[test]
    fn group_size_rule() {
        // One observation: a single group whatever the size.
        assert_eq!(default_group_size(2, 2, 1, 2), 2);
        // medium on 4 procs / 2 nodes, 1 obs per group at most...
        assert_eq!(default_group_size(4, 2, 1, 2054), 4);
        // large on 256 procs, 4 per node, 2054 dets, many obs: 16 groups of 16.
        assert_eq!(default_group_size(256, 4, 1000, 2054), 16);
        // ... and on 1024 procs: 64 groups of 16.
        assert_eq!(default_group_size(1024, 4, 1000, 2054), 16);
    }

    #[test]
    fn plan_splits_and_refuses() {
        let d = JobDistribution::plan(4, 2, &[100, 100, 50, 50], &[2; 6]).unwrap();
        assert_eq!(d.group_obs, vec![0..2, 2..4]);
        assert_eq!(d.rank_detsets, vec![0..3, 3..6]);
        assert_eq!((d.obs_of(3), d.detsets_of(3)), (2..4, 3..6));
        let e = JobDistribution::plan(2, 1, &[100], &[2; 6]).unwrap_err();
        assert!(e.contains("2 process groups"), "{e}");
        let e = JobDistribution::plan(4, 4, &[100], &[2; 3]).unwrap_err();
        assert!(e.contains("3 detector sets"), "{e}");
        let e = JobDistribution::plan(3, 2, &[100], &[2; 3]).unwrap_err();
        assert!(e.contains("does not divide"), "{e}");
    }
}
