//! TOAST's reference timings, and which kernels the report lists.
//!
//! [`TOAST_REFERENCE`] is the table of TOAST 3.0.6's CPU timings the bench
//! compares with (`tests/data/toast-kernels/timings.md`); [`JSON_KEYS`]
//! are the kernels of the JSON output and [`STREAMING_BYTES`] the memory
//! traffic of the streaming kernels, from which the report derives an
//! achieved bandwidth.

/// One row of TOAST's CPU timings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToastReference {
    /// Key of the kernel in the report and the JSON output.
    pub key: &'static str,
    /// The row's label in timings.md.
    pub label: &'static str,
    /// ns per sample per detector (per amplitude for apply_diag_precond),
    /// OMP_NUM_THREADS=2.
    pub ns_2thr: f64,
    /// The same with OMP_NUM_THREADS=1.
    pub ns_1thr: f64,
}

/// TOAST 3.0.6's compiled kernels (PyPI cp311 wheel, `use_accel=False`),
/// from `tests/data/toast-kernels/timings.md`, third table: measured by
/// `time_toast_kernels.py --threads 2,1` on the 2-core Intel Xeon VM the
/// bench runs on, on a quiet machine (24 Nov 2026, 16:33 UTC, right after
/// `toast-cli bench kernels --threads 1` and `--threads 2` in the same
/// window, nothing else running), best of 5 calls. `ns_2thr` is the
/// OMP_NUM_THREADS=2 figure, `ns_1thr` the OMP_NUM_THREADS=1 one.
/// The template_offset add/project, cov_accum_diag_* and
/// filter_polynomial rows are sums of single-detector calls (as TOAST's
/// operators make them); filter_poly2D is per detector and sample of its
/// own 1000 samples.
pub const TOAST_REFERENCE: [ToastReference; 18] = [
    ToastReference {
        key: "pointing_detector",
        label: "pointing_detector",
        ns_2thr: 2.256,
        ns_1thr: 4.185,
    },
    ToastReference {
        key: "pixels_healpix_nest",
        label: "pixels_healpix (NEST, nside 2048)",
        ns_2thr: 16.436,
        ns_1thr: 31.319,
    },
    ToastReference {
        key: "pixels_healpix_ring",
        label: "pixels_healpix (RING, nside 2048)",
        ns_2thr: 14.550,
        ns_1thr: 26.782,
    },
    ToastReference {
        key: "stokes_weights_iqu",
        label: "stokes_weights_IQU (no HWP)",
        ns_2thr: 37.475,
        ns_1thr: 73.537,
    },
    ToastReference {
        key: "stokes_weights_iqu_hwp",
        label: "stokes_weights_IQU (HWP)",
        ns_2thr: 41.098,
        ns_1thr: 80.795,
    },
    ToastReference {
        key: "stokes_weights_i",
        label: "stokes_weights_I",
        ns_2thr: 0.274,
        ns_1thr: 0.481,
    },
    ToastReference {
        key: "scan_map_f64",
        label: "scan_map (float64, nnz=3, add)",
        ns_2thr: 11.302,
        ns_1thr: 21.698,
    },
    ToastReference {
        key: "scan_map_f32",
        label: "scan_map (float32, nnz=3, add)",
        ns_2thr: 9.357,
        ns_1thr: 18.880,
    },
    ToastReference {
        key: "build_noise_weighted",
        label: "build_noise_weighted (nnz=3, det+shared flags)",
        ns_2thr: 18.237,
        ns_1thr: 31.102,
    },
    ToastReference {
        key: "noise_weight",
        label: "noise_weight",
        ns_2thr: 0.239,
        ns_1thr: 0.436,
    },
    ToastReference {
        key: "template_offset_add_to_signal",
        label: "template_offset_add_to_signal (step 200)",
        ns_2thr: 1.425,
        ns_1thr: 2.713,
    },
    ToastReference {
        key: "template_offset_project_signal",
        label: "template_offset_project_signal (step 200)",
        ns_2thr: 4.654,
        ns_1thr: 9.202,
    },
    ToastReference {
        key: "template_offset_apply_diag_precond",
        label: "template_offset_apply_diag_precond (n_amp=47500, per amp)",
        ns_2thr: 0.321,
        ns_1thr: 0.597,
    },
    ToastReference {
        key: "template_offset_apply_diag_precond_large",
        label: "template_offset_apply_diag_precond (n_amp=10000000, per amp)",
        ns_2thr: 0.814,
        ns_1thr: 1.606,
    },
    ToastReference {
        key: "cov_accum_diag_hits",
        label: "cov_accum_diag_hits (per-detector calls)",
        ns_2thr: 5.767,
        ns_1thr: 9.246,
    },
    ToastReference {
        key: "cov_accum_diag_invnpp",
        label: "cov_accum_diag_invnpp (nnz=3, per-detector calls)",
        ns_2thr: 26.886,
        ns_1thr: 46.143,
    },
    ToastReference {
        key: "filter_polynomial",
        label: "filter_polynomial (order 3, per-detector calls)",
        ns_2thr: 11.098,
        ns_1thr: 22.444,
    },
    ToastReference {
        key: "filter_poly2D",
        label: "filter_poly2D (64 modes, 2 groups, 1000 samples)",
        ns_2thr: 4292.426,
        ns_1thr: 8495.420,
    },
];

/// The keys of the JSON output (ns per sample per detector; per amplitude
/// for `template_offset_apply_diag_precond`, measured at the workload's
/// n_amp). The large apply_diag_precond figure is under `metadata`.
pub const JSON_KEYS: [&str; 17] = [
    "pointing_detector",
    "pixels_healpix_nest",
    "pixels_healpix_ring",
    "stokes_weights_iqu",
    "stokes_weights_iqu_hwp",
    "stokes_weights_i",
    "scan_map_f64",
    "scan_map_f32",
    "build_noise_weighted",
    "noise_weight",
    "template_offset_add_to_signal",
    "template_offset_project_signal",
    "template_offset_apply_diag_precond",
    "cov_accum_diag_hits",
    "cov_accum_diag_invnpp",
    "filter_polynomial",
    "filter_poly2D",
];

/// Bytes of main memory a streaming kernel moves per sample per detector
/// (per amplitude for apply_diag_precond): the arrays it must read and
/// write once, at their element sizes. Achieved bandwidth = bytes / time.
/// Gather/scatter kernels (pixels, weights, maps) are not listed: their
/// traffic depends on the scan's locality.
pub const STREAMING_BYTES: [(&str, f64); 5] = [
    // quats written (32 B); boresight (32 B) shared by all detectors, read once per detector.
    ("pointing_detector", 64.0),
    // weights written (8 B).
    ("stokes_weights_i", 8.0),
    // det_data read and written (8 + 8 B).
    ("noise_weight", 16.0),
    // det_data read and written (16 B); the amplitudes stay in cache.
    ("template_offset_add_to_signal", 16.0),
    // offset_var, amplitudes_in, amplitudes_out (8 B each) and the flag (1 B).
    ("template_offset_apply_diag_precond_large", 25.0),
];

/// Key of the large apply_diag_precond row (not one of [`JSON_KEYS`]).
pub const PRECOND_LARGE: &str = "template_offset_apply_diag_precond_large";

/// The reference the achieved bandwidths are fractions of, measured in the
/// same run on the same device: `amp_axpby` (`y <- alpha x + beta y`, a
/// STREAM-style 1-D kernel: x and y read, y written, [`STREAM_BYTES`] per
/// element) over [`STREAM_FACTOR`] x `precond_n_amp` elements. Timed
/// whenever a streaming row is (the key `stream_reference` of `--rows`
/// times it alone).
pub const STREAM_KEY: &str = "stream_reference";
/// Bytes the reference moves per element: x and y read, y written.
pub const STREAM_BYTES: f64 = 24.0;
/// The reference's elements per amplitude of the large preconditioner row
/// (10^7 by default: 4 x 10^7 elements, 0.96 GB moved per call).
pub const STREAM_FACTOR: usize = 4;

/// TOAST's figures for `key`.
pub fn toast_reference(key: &str) -> Option<&'static ToastReference> {
    TOAST_REFERENCE.iter().find(|r| r.key == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_table_covers_every_key() {
        for key in JSON_KEYS {
            assert!(toast_reference(key).is_some(), "{key}");
        }
        assert!(toast_reference(PRECOND_LARGE).is_some());
    }
}
