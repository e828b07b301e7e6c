"""Tests of the toast_rs package that need TOAST 3.0.6 but no TOAST test suite.

Plain pytest (``python -m pytest python/tests``); each test installs our
kernels and uninstalls them at the end.
"""

import numpy as np
import pytest

import toast_rs
from toast.accelerator.kernel_registry import ImplementationType, registry
from toast.intervals import interval_dtype


@pytest.fixture
def cpu():
    toast_rs.install("cpu")
    yield
    toast_rs.uninstall()


def intervals(*ranges):
    iv = np.zeros(len(ranges), dtype=interval_dtype)
    for i, (first, last) in enumerate(ranges):
        iv[i]["first"], iv[i]["last"] = first, last
    return iv


def noise_weight_args(n_det=2, n_samp=10):
    det_data = np.arange(n_det * n_samp, dtype=np.float64).reshape(n_det, n_samp)
    return [det_data, np.arange(n_det, dtype=np.int32), intervals((0, 4), (6, 10)),
            np.array([2.0, 3.0])]


def test_install_replaces_and_uninstall_restores():
    toast_default = registry["noise_weight"][ImplementationType.DEFAULT]
    toast_compiled = registry["noise_weight"][ImplementationType.COMPILED]
    chosen = toast_rs.install("cpu")
    try:
        for k in toast_rs.KERNELS:
            assert chosen[k] == "cpu"
        assert registry["noise_weight"][ImplementationType.DEFAULT] is not toast_default
        # All 14 of TOAST's registry kernels are ours.
        assert set(toast_rs.KERNELS) >= {"cov_accum_diag_hits", "cov_accum_diag_invnpp",
                                         "filter_polynomial", "filter_poly2D"}
        assert chosen["cov_accum_diag_hits"] == "cpu"
    finally:
        toast_rs.uninstall()
    assert registry["noise_weight"][ImplementationType.DEFAULT] is toast_default
    assert registry["noise_weight"][ImplementationType.COMPILED] is toast_compiled
    assert not toast_rs.installed()


def test_same_result_as_toast_and_counted(cpu):
    args = noise_weight_args()
    ours = args[0].copy()
    dispatch = registry["noise_weight"]["dispatch"]
    dispatch(ours, *args[1:])
    toast_rs.uninstall()
    theirs = args[0].copy()
    dispatch(theirs, *args[1:])
    toast_rs.install("cpu")
    np.testing.assert_array_equal(ours, theirs)
    toast_rs.reset_stats()
    dispatch(ours, *args[1:], impl=ImplementationType.COMPILED)
    s = toast_rs.stats()["noise_weight"]
    assert s["calls"] == 1 and s["backend"] == "cpu" and s["toast_calls"] == 0


def test_zero_copy_in_place(cpu):
    args = noise_weight_args()
    det_data = args[0]
    before = det_data.copy()
    registry["noise_weight"]["dispatch"](*args)
    assert det_data[0, 1] == before[0, 1] * 2.0  # written in the caller's buffer
    assert det_data[1, 5] == before[1, 5]  # outside the intervals


@pytest.mark.parametrize(
    "change, exc, words",
    [
        (lambda a: a.__setitem__(0, a[0].astype(np.float32)), TypeError, "det_data"),
        (lambda a: a.__setitem__(1, a[1].astype(np.int64)), TypeError, "det_data_index"),
        (lambda a: a.__setitem__(0, np.asfortranarray(np.ones((2, 10)))[:, ::2]), ValueError,
         "C-contiguous"),
        (lambda a: a.__setitem__(0, a[0].ravel()), ValueError, "dimensions"),
        (lambda a: a.__setitem__(3, np.ones(3)), ValueError, "detector_weights"),
        (lambda a: a.__setitem__(1, np.array([0, 7], dtype=np.int32)), ValueError, "data_index"),
        (lambda a: a.__setitem__(2, np.zeros(2)), TypeError, "intervals"),
        (lambda a: a.__setitem__(0, [[1.0] * 10] * 2), TypeError, "det_data"),
    ],
)
def test_bad_arguments_raise(cpu, change, exc, words):
    args = noise_weight_args()
    change(args)
    with pytest.raises(exc) as e:
        registry["noise_weight"]["dispatch"](*args)
    assert "noise_weight" in str(e.value) and words in str(e.value)


def test_read_only_output_and_overlap(cpu):
    args = noise_weight_args()
    args[0].setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        registry["noise_weight"]["dispatch"](*args)
    amp = np.ones(8)
    flags = np.zeros(8, dtype=np.uint8)
    with pytest.raises(ValueError, match="shares memory"):
        registry["offset_apply_diag_precond"]["dispatch"](np.ones(8), amp, flags, amp)


def test_use_accel_goes_to_toast(cpu):
    args = noise_weight_args()
    registry["noise_weight"]["dispatch"](*args, use_accel=True)
    s = toast_rs.stats()["noise_weight"]
    assert s["toast_calls"] == 1 and s["calls"] == 0


def test_unknown_kernel_and_backend():
    with pytest.raises(ValueError, match="unknown kernel"):
        toast_rs.install("cpu", not_a_kernel="cpu")
    with pytest.raises(RuntimeError, match="no_such_backend"):
        toast_rs.install("no_such_backend")
    assert not toast_rs.installed()


def test_per_kernel_dispatch():
    chosen = toast_rs.install("cpu", noise_weight="cpu")
    toast_rs.uninstall()
    assert chosen["noise_weight"] == "cpu"


def test_scan_map_nonlocal_submap_is_unhit(cpu):
    # Submap 0 is not local (global2local -1): TOAST's compiled scan_map
    # reads before the map there (undefined); ours leaves those samples as
    # they are, as for a negative pixel, and scans the others.
    n_pix_submap = 4
    g2l = np.array([-1, 0], dtype=np.int64)
    mapdata = np.arange(12, dtype=np.float64).reshape(1, n_pix_submap, 3)
    det_data = np.full((1, 6), 0.5)
    pixels = np.array([[0, 1, 4, 5, -1, 7]], dtype=np.int64)
    weights = np.ones((1, 6, 3))
    idx = np.zeros(1, dtype=np.int32)
    toast_rs.reset_stats()
    registry["scan_map"]["dispatch"](
        g2l, n_pix_submap, mapdata, det_data, idx, pixels, idx, weights, idx,
        intervals((0, 6)), 1.0, False, False, False,
    )
    np.testing.assert_array_equal(det_data, [[0.5, 0.5, 3.5, 12.5, 0.5, 30.5]])
    assert toast_rs.stats()["scan_map"]["calls"] == 1
