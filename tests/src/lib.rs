//! Workspace-level integration tests live in `tests/tests/`.

/// How many reference cases `tests/data/toast-kernels/cases` holds: the 29
/// kernel cases and the 61 boundary-direction cases (`pointing_detector_boundary`
/// and `pixels_healpix_boundary_{nest,ring}_nside{1..2^29}`); see its FORMAT.md.
pub const SHIPPED_CASES: usize = 90;
