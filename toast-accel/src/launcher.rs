//! What a process launcher (`mpirun`, `srun`, ...) tells a process about
//! its node through the environment: its rank among the node's processes
//! and how many they are. Read by the GPU plugins (which spread the ranks
//! of a node over its devices, and size their caches to the processes that
//! may share one) and by the host (which counts the processes sharing the
//! node's memory): one list of the launchers' variables for both.

/// The environment variables in which process launchers give a process its
/// rank among the processes of its node, in the order they are read: Open
/// MPI's `mpirun`, MPICH's and Intel MPI's Hydra, Slurm's `srun`, Cray
/// PALS, PMI.
pub const NODE_LOCAL_RANK_VARS: [&str; 5] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
    "PALS_LOCAL_RANKID",
    "PMI_LOCAL_RANK",
];

/// This process's node-local rank from the first of
/// [`NODE_LOCAL_RANK_VARS`] that is set to a non-negative integer (`None`:
/// not started by such a launcher, e.g. a serial run).
pub fn node_local_rank() -> Option<(usize, &'static str)> {
    node_local_rank_in(|k| std::env::var(k).ok())
}

/// [`node_local_rank`] over a given environment (for tests).
pub fn node_local_rank_in(var: impl Fn(&str) -> Option<String>) -> Option<(usize, &'static str)> {
    NODE_LOCAL_RANK_VARS
        .iter()
        .find_map(|&k| Some((var(k)?.trim().parse::<usize>().ok()?, k)))
}

/// The environment variables in which process launchers give the number
/// of processes of the job on this node, in the order they are read: Open
/// MPI's `mpirun`, MPICH's and Intel MPI's Hydra, Cray PALS, PMI. (Slurm
/// gives a per-node list, `SLURM_TASKS_PER_NODE`, not this node's count.)
pub const NODE_LOCAL_SIZE_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "PALS_LOCAL_SIZE",
    "PMI_LOCAL_SIZE",
];

/// The number of processes of this job on this node, from the first of
/// [`NODE_LOCAL_SIZE_VARS`] that is set to a positive integer (`None`: not
/// started by such a launcher).
pub fn node_local_size() -> Option<usize> {
    node_local_size_in(|k| std::env::var(k).ok())
}

/// [`node_local_size`] over a given environment (for tests).
pub fn node_local_size_in(var: impl Fn(&str) -> Option<String>) -> Option<usize> {
    NODE_LOCAL_SIZE_VARS
        .iter()
        .find_map(|&k| var(k)?.trim().parse::<usize>().ok().filter(|&n| n > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An environment of `pairs` only.
    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_node_local_rank_comes_from_the_first_launcher_variable_set() {
        assert_eq!(node_local_rank_in(env(&[])), None);
        assert_eq!(
            node_local_rank_in(env(&[("SLURM_LOCALID", "3")])),
            Some((3, "SLURM_LOCALID"))
        );
        assert_eq!(
            node_local_rank_in(env(&[
                ("SLURM_LOCALID", "3"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1")
            ])),
            Some((1, "OMPI_COMM_WORLD_LOCAL_RANK"))
        );
        // Not a rank: the next variable is read.
        assert_eq!(
            node_local_rank_in(env(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "x"),
                ("MPI_LOCALRANKID", "2")
            ])),
            Some((2, "MPI_LOCALRANKID"))
        );
    }

    #[test]
    fn the_node_local_size_comes_from_the_first_launcher_variable_set() {
        assert_eq!(node_local_size_in(env(&[])), None);
        assert_eq!(node_local_size_in(env(&[("PMI_LOCAL_SIZE", "4")])), Some(4));
        assert_eq!(
            node_local_size_in(env(&[
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "0"),
                ("MPI_LOCALNRANKS", "2")
            ])),
            Some(2)
        );
    }
}
