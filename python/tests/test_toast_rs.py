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


# ---------------------------------------------------------------------------
# install(..., accel=True): toast-rs as TOAST's accelerator (cpu plugin:
# separate "device" allocations, so host and device copies are distinct).


@pytest.fixture
def accel_cpu():
    toast_rs.install("cpu", accel=True)
    yield
    toast_rs.uninstall()


def test_accel_enables_toast_layer_and_uninstall_restores():
    import sys

    import toast.accelerator as pkg
    import toast.accelerator.accel as acc
    from toast.accelerator import accel_enabled

    before = {n: getattr(m, "use_accel_omp", None) for n, m in sys.modules.items()
              if n.startswith("toast") and m is not None}
    toast_rs.install("cpu", accel=True)
    try:
        assert accel_enabled() and acc.use_accel_omp and pkg.use_accel_omp
        # Every toast module that copied the flag sees it.
        for n, m in sys.modules.items():
            if n.startswith("toast.") and m is not None and hasattr(m, "use_accel_omp"):
                assert m.use_accel_omp is True, n
        assert "toast.observation_data" in toast_rs._accel.patched_modules()
        assert toast_rs.accel_stats()["device"]["device"] == 0
    finally:
        toast_rs.uninstall()
    assert not accel_enabled()
    after = {n: getattr(m, "use_accel_omp", None) for n, m in sys.modules.items()
             if n in before}
    assert after == before


def test_accel_data_roundtrip_is_a_separate_copy(accel_cpu):
    from toast.accelerator import (accel_data_create, accel_data_delete, accel_data_present,
                                   accel_data_reset, accel_data_update_device,
                                   accel_data_update_host)
    from toast.utils import AlignedF64

    for host in (np.arange(10, dtype=np.float32), AlignedF64.zeros(7)):
        view = np.asarray(memoryview(host))
        view[:] = np.arange(len(view))
        assert not accel_data_present(host, "x")
        accel_data_create(host, "x")
        accel_data_update_device(host, "x")
        assert accel_data_present(host, "x")
        view[:] = -1  # the device copy keeps the old values
        accel_data_update_host(host, "x")
        np.testing.assert_array_equal(view, np.arange(len(view)))
        accel_data_reset(host, "x")
        accel_data_update_host(host, "x")
        assert not view.any()
        accel_data_delete(host, "x")
        assert not accel_data_present(host, "x")
    s = toast_rs.accel_stats()
    assert s["ops"]["update_device"]["calls"] == 2
    assert s["ops"]["update_device"]["bytes"] == 40 + 56
    assert s["by_name"]["x"]["d2h_calls"] == 4
    assert s["buffers"] == 0 and s["device_bytes"] == 0


def test_accel_errors_name_the_buffer(accel_cpu):
    from toast.accelerator import accel_data_create, accel_data_present, accel_data_update_host

    a = np.ones(4)
    with pytest.raises(RuntimeError, match="'a'.*not present"):
        accel_data_update_host(a, "a")
    accel_data_create(a, "a")
    with pytest.raises(RuntimeError, match="already present"):
        accel_data_create(a, "again")
    with pytest.raises(RuntimeError, match="32 bytes, not 16"):
        accel_data_present(a[:2], "a")


def test_accel_kernel_runs_on_device_data_only(accel_cpu):
    from toast.accelerator import (accel_data_create, accel_data_delete,
                                   accel_data_update_device, accel_data_update_host)

    det_data, index, iv, weights = noise_weight_args()
    expected = det_data.copy()
    registry["noise_weight"]["dispatch"](expected, index, iv, weights)
    dispatch = registry["noise_weight"]["dispatch"]
    # Not present: the error names the kernel and the array.
    with pytest.raises(RuntimeError, match="noise_weight.*`det_data`.*not present"):
        dispatch(det_data, index, iv, weights, use_accel=True)
    start = det_data.copy()
    accel_data_create(det_data, "signal")
    accel_data_update_device(det_data, "signal")
    dispatch(det_data, index, iv, weights, impl=ImplementationType.COMPILED, use_accel=True)
    np.testing.assert_array_equal(det_data, start)  # the host copy is untouched
    accel_data_update_host(det_data, "signal")
    np.testing.assert_array_equal(det_data, expected)
    accel_data_delete(det_data, "signal")
    s = toast_rs.stats()["noise_weight"]
    assert s["accel_calls"] == 1 and s["toast_calls"] == 0
    moved = toast_rs.accel_stats()["by_name"]["signal"]
    assert moved == {
        "h2d_calls": 1, "h2d_bytes": det_data.nbytes, "d2h_calls": 1,
        "d2h_bytes": det_data.nbytes, "buffers": 1, "max_h2d_per_buffer": 1,
        "max_d2h_per_buffer": 1}


def test_accel_memory_limit(monkeypatch):
    from toast.accelerator import accel_data_create

    monkeypatch.setenv("TOAST_GPU_MEM_GB", str(1000 / 2**30))  # 1000 bytes
    toast_rs.install("cpu", accel=True)
    try:
        small = np.ones(100)  # 800 bytes, kept alive (a dead one is freed)
        accel_data_create(small, "small")
        with pytest.raises(RuntimeError, match="memory limit.*'big'.*TOAST_GPU_MEM_GB"):
            accel_data_create(np.ones(50), "big")
    finally:
        toast_rs.uninstall()


def test_accel_refuses_arrays_of_python_objects(accel_cpu):
    # An object's bytes are a reference: a device copy written back put
    # freed pointers in the array (a double free at exit).
    from toast.accelerator import accel_data_create, accel_data_present

    # The last: fields out of order, whose descr numpy gives as one |V16.
    for dt in [np.dtype(object), np.dtype([("o", object), ("x", "f8")]),
               np.dtype([("n", [("o", object)]), ("x", "f8")]), np.dtype([("o", object, (2,))]),
               np.dtype({"names": ["x", "o"], "formats": ["f8", object], "offsets": [8, 0]})]:
        a = np.empty(4, dtype=dt)
        with pytest.raises(TypeError, match="holds Python objects"):
            accel_data_create(a, "objs")
        with pytest.raises(TypeError, match="holds Python objects"):
            accel_data_present(a, "objs")
    # Plain structured data is bytes, and may go.
    a = np.zeros(4, dtype=[("x", "f8"), ("n", "i4")])
    accel_data_create(a, "rec")
    assert accel_data_present(a, "rec")
    from toast.accelerator import accel_data_delete
    accel_data_delete(a, "rec")


def test_accel_dead_entry_is_freed_at_the_next_call(monkeypatch):
    # A present array freed without accel_data_delete: its device buffer is
    # released by the next table call, whatever buffer that call names, so
    # it no longer counts against the limit.
    import gc

    from toast.accelerator import accel_data_create, accel_data_delete

    monkeypatch.setenv("TOAST_GPU_MEM_GB", str(1000 / 2**30))  # 1000 bytes
    toast_rs.install("cpu", accel=True)
    try:
        a = np.ones(100)  # 800 bytes
        other = np.ones(100)  # alive beside a: another address
        accel_data_create(a, "a")
        del a
        gc.collect()
        with pytest.warns(RuntimeWarning, match="dropped the present buffer 'a'"):
            accel_data_create(other, "other")
        s = toast_rs.accel_stats()
        assert s["buffers"] == 1 and s["device_bytes"] == 800
        assert s["transfers"]["frees"] == 1
        # A use_accel=True kernel argument, naming another buffer, sweeps too.
        accel_data_delete(other, "other")
        data = np.ones((2, 10))  # 160 bytes
        accel_data_create(data, "data")
        dead = np.ones(2)
        accel_data_create(dead, "dead")
        del dead
        gc.collect()
        weights = (np.arange(2, dtype=np.int32), intervals((0, 10)), np.array([2.0, 3.0]))
        with pytest.warns(RuntimeWarning, match="dropped the present buffer 'dead'"):
            registry["noise_weight"]["dispatch"](data, *weights, use_accel=True)
        assert toast_rs.accel_stats()["buffers"] == 1
        accel_data_delete(data, "data")
    finally:
        toast_rs.uninstall()


def test_accel_device_assignment(monkeypatch):
    from toast_rs import accel

    monkeypatch.setenv("TOAST_RS_DEVICES", "2")
    monkeypatch.delenv("TOAST_RS_DEVICE", raising=False)
    # TOAST's rule: 4 ranks on 2 devices -> 0, 0, 1, 1; 3 on 2 -> 0, 0, 1.
    assert [accel.assign_device("cuda", 4, r)["device"] for r in range(4)] == [0, 0, 1, 1]
    assert [accel.assign_device("cuda", 3, r)["sharing"] for r in range(3)] == [2, 2, 1]
    monkeypatch.setenv("TOAST_RS_DEVICE", "1")
    assert accel.assign_device("cuda", 4, 0)["device"] == 1
    assert accel.plugin_options("cuda", 1) == "device=1"
    # OpenCL: the N-th suitable device over all platforms, as CUDA's index.
    assert accel.plugin_options("opencl", 1) == "device=1"
    assert accel.plugin_options("opencl", 0) == "device=0"
    monkeypatch.delenv("TOAST_RS_DEVICE")
    monkeypatch.delenv("TOAST_RS_DEVICES")
    monkeypatch.setenv("TOAST_OPENCL_DEVICE", "pthread")
    assert accel.plugin_options("opencl", 0) is None  # the user's choice stands
    monkeypatch.delenv("TOAST_OPENCL_DEVICE")
    with pytest.raises(ValueError, match="node rank 4 of 4"):
        accel.assign_device("cuda", 4, 4)


def test_accel_no_dispatch():
    with pytest.raises(ValueError, match="dispatch is not supported with accel"):
        toast_rs.install("cpu", accel=True, scan_map="cpu")
    assert not toast_rs.installed()


def test_accel_operator_on_device_data(accel_cpu):
    # toast.tests.accelerator's operator test, with data that are not zero
    # (TOAST's own runs on a zero signal, which any result passes).
    from toast import ops
    from toast.tests.helpers import close_data, create_satellite_data

    data = create_satellite_data(None)
    rng = np.random.default_rng(1)
    for ob in data.obs:
        ob.detdata["signal"][:] = rng.normal(size=ob.detdata["signal"].data.shape)
    ops.Copy(detdata=[("signal", "original")]).apply(data)
    weight = ops.NoiseWeight(noise_model=ops.DefaultNoiseModel().noise_model, det_data="signal")
    ops.DefaultNoiseModel().apply(data)
    cpu = []
    toast_rs.uninstall()
    try:
        weight.apply(data)
        cpu = [ob.detdata["signal"].data.copy() for ob in data.obs]
        for ob in data.obs:
            ob.detdata["signal"][:] = ob.detdata["original"][:]
            ob.detdata["signal"].update_units(ob.detdata["original"].units)
    finally:
        toast_rs.install("cpu", accel=True)
    pipe = ops.Pipeline(operators=[weight])
    pipe.apply(data)  # stages signal, runs noise_weight on the device copy
    # The weights did act (TOAST's sim flags every detector of some observations).
    assert any(not np.array_equal(ref, ob.detdata["original"].data)
               for ob, ref in zip(data.obs, cpu))
    for ob, ref in zip(data.obs, cpu):
        np.testing.assert_array_equal(ob.detdata["signal"].data, ref)
    s = toast_rs.stats()["noise_weight"]
    assert s["accel_calls"] == s["calls"] > 0
    close_data(data)
    assert toast_rs.accel_stats()["buffers"] == 0


def _mapmaker_map(accel: bool):
    import astropy.units as u

    from toast import ops
    from toast.observation import default_values as defaults
    from toast.templates import Offset
    from toast.tests.helpers import close_data, create_satellite_data

    data = create_satellite_data(None, obs_time=5 * u.minute)
    ops.DefaultNoiseModel().apply(data)
    ops.SimNoise().apply(data)
    detpointing = ops.PointingDetectorSimple()
    pixels = ops.PixelsHealpix(nside=16, detector_pointing=detpointing)
    weights = ops.StokesWeights(mode="IQU", hwp_angle=defaults.hwp_angle,
                                detector_pointing=detpointing)
    binner = ops.BinMap(pixel_dist="pixel_dist", pixel_pointing=pixels, stokes_weights=weights,
                        noise_model="noise_model")
    tmpl = Offset(times=defaults.times, noise_model="noise_model", step_time=10 * u.second,
                  use_noise_prior=False)
    mm = ops.MapMaker(name="mm", det_data=defaults.det_data, binning=binner,
                      template_matrix=ops.TemplateMatrix(templates=[tmpl]),
                      solve_rcond_threshold=1e-2, map_rcond_threshold=1e-2, write_hits=False,
                      write_map=False, write_cov=False, write_rcond=False,
                      keep_final_products=True, output_dir=".")
    toast_rs.install("cpu", accel=accel)
    try:
        mm.apply(data)
        out = np.array(data["mm_map"].data)
        accel_calls = toast_rs.stats()["offset_project_signal"]["accel_calls"]
    finally:
        toast_rs.uninstall()
    close_data(data)
    return out, accel_calls


def test_accel_mapmaker_hybrid_pipelines_equal_host(tmp_path, monkeypatch):
    # TOAST's MapMaker mixes device and host operators (hybrid pipelines);
    # TOAST 3.0.6's ops.Copy left a stale device copy there (mended while
    # installed, toast_rs/accel.py), which made the solve run on zeros.
    monkeypatch.chdir(tmp_path)
    host, _ = _mapmaker_map(False)
    dev, calls = _mapmaker_map(True)
    assert calls > 0  # the template ran on device data
    assert np.any(host)
    np.testing.assert_array_equal(dev, host)


# ---------------------------------------------------------------------------
# Hostile input: what TOAST refuses is refused (with the argument named),
# nothing is written before the arguments are checked, no read-only memory
# is written.


def _toast_refuses(kernel, args):
    """TOAST's own compiled kernel refuses ``args`` too (toast_rs is
    uninstalled for the call and installed again on the cpu backend)."""
    toast_rs.uninstall()
    try:
        with pytest.raises((RuntimeError, ValueError, TypeError)):
            registry[kernel][ImplementationType.COMPILED](*args)
    finally:
        toast_rs.install("cpu")


def _scan_map_args(mapdata, weights, n_pix_submap=4, n_samp=4):
    idx = np.zeros(1, np.int32)
    return [np.array([0, 1], np.int64), n_pix_submap, mapdata, np.zeros((1, n_samp)), idx,
            np.array([[0, 1, 4, 5]], np.int64)[:, :n_samp].copy(), idx, weights, idx,
            intervals((0, n_samp)), 1.0, False, False, False]


@pytest.mark.parametrize(
    "mapdata_shape, weights_shape, words",
    [
        # The probe's case: 2-D weights (nnz 1), a map of I, Q, U: TOAST's message.
        ((2, 4, 3), (1, 4), "dimension 2 has length 3 instead of 1 (nnz, as weights"),
        ((2, 12), (1, 4), "2 dimensions (shape [2, 12]), expected 3"),
        ((24,), (1, 4), "1 dimensions (shape [24]), expected 3"),
        ((4, 2, 3), (1, 4, 3), "dimension 1 has length 2 instead of 4 (n_pix_submap"),
        ((1, 8, 3), (1, 4, 3), "dimension 1 has length 8 instead of 4 (n_pix_submap"),
        ((2, 4, 3), (1, 2, 6), "`weights`: dimension 1 has length 2 instead of 4 (n_samp"),
    ],
    ids=["nnz", "2d", "1d", "n_pix_submap", "n_pix_submap_rows", "weights_n_samp"],
)
def test_scan_map_shapes_checked_as_toast(cpu, mapdata_shape, weights_shape, words):
    mapdata = np.arange(np.prod(mapdata_shape), dtype=np.float64).reshape(mapdata_shape)
    args = _scan_map_args(mapdata, np.ones(weights_shape))
    with pytest.raises(ValueError) as e:
        registry["scan_map"]["dispatch"](*args)
    assert "toast_rs scan_map" in str(e.value) and words in str(e.value)
    assert not args[3].any()  # det_data untouched
    _toast_refuses("scan_map", _scan_map_args(mapdata, np.ones(weights_shape)))
    # The consistent call runs, and gives TOAST's values.
    good = _scan_map_args(np.arange(24.0).reshape(2, 4, 3), np.ones((1, 4, 3)))
    registry["scan_map"]["dispatch"](*good)
    np.testing.assert_array_equal(good[3], [[3.0, 12.0, 39.0, 48.0]])


def _bnw_args(zmap_nnz, weights_nnz):
    iv = intervals((0, 10))
    i2 = np.arange(2, dtype=np.int32)
    pixels = (np.arange(20, dtype=np.int64) % 8).reshape(2, 10)
    return [np.array([0, 1], np.int64), np.zeros((2, 4, zmap_nnz)), i2, pixels, i2,
            np.ones((2, 10, weights_nnz)), i2, np.ones((2, 10)), i2, np.zeros((2, 10), np.uint8),
            np.ones(2), 1, iv, np.zeros(10, np.uint8), 1]


def test_build_noise_weighted_zmap_nnz_is_the_weights(cpu):
    args = _bnw_args(2, 3)
    with pytest.raises(ValueError) as e:
        registry["build_noise_weighted"]["dispatch"](*args)
    assert str(e.value).startswith(
        "toast_rs build_noise_weighted: argument `zmap`: dimension 2 has length 2 instead of 3 "
        "(nnz, as weights")
    assert not args[1].any()
    _toast_refuses("build_noise_weighted", _bnw_args(2, 3))
    args = _bnw_args(3, 3)
    registry["build_noise_weighted"]["dispatch"](*args)
    assert args[1].sum() == 2 * 10 * 3


def test_build_noise_weighted_det_flags_without_rows_is_refused(cpu):
    # Rows of n_samp flags are read (TOAST's rule); with none, flag_index
    # names a row that is not there. An empty array staged is the ABI's "no
    # det_flags": the flags were dropped, every sample accumulated.
    args = _bnw_args(3, 3)
    args[9] = np.ones((0, 10), np.uint8)
    with pytest.raises(ValueError, match=r"build_noise_weighted: argument `det_flags`: shape "
                                         r"\[0, 10\]: .*no row for flag_index to name"):
        registry["build_noise_weighted"]["dispatch"](*args)
    assert not args[1].any()
    # A (1, 1) array and a one-element flag_index: TOAST's "no flags".
    args = _bnw_args(3, 3)
    args[8], args[9] = np.zeros(1, np.int32), np.zeros((1, 1), np.uint8)
    registry["build_noise_weighted"]["dispatch"](*args)
    assert args[1].sum() == 2 * 10 * 3


def _shape_cases():
    iv = intervals((0, 10))
    i1, i2 = np.zeros(1, np.int32), np.arange(2, dtype=np.int32)
    quats = np.zeros((2, 10, 4))
    quats[..., 3] = 1
    fp = np.zeros((2, 4))
    fp[:, 3] = 1
    bore = np.zeros((10, 4))
    bore[:, 3] = 1
    return [
        # Every total length agrees with the others'; a dimension does not.
        ("pointing_detector", [fp.reshape(4, 2), bore, i2, np.zeros((2, 10, 4)), iv,
                               np.zeros(1, np.uint8), 0],
         "`focalplane`: dimension 0 has length 4 instead of 2"),
        ("pointing_detector", [fp, bore.reshape(20, 2), i2, np.zeros((2, 10, 4)), iv,
                               np.zeros(1, np.uint8), 0],
         "`boresight`: dimension 0 has length 20 instead of 10"),
        ("stokes_weights_IQU", [i2, quats, i2, np.zeros((3, 10, 2)), np.zeros(0), iv,
                                np.zeros(2), np.zeros(2), np.ones(2), False],
         "`weights`: dimension 2 has length 2 instead of 3"),
        ("offset_project_signal", [0, np.ones((1, 10)), 0, np.zeros((2, 5), np.uint8), 1, 5, 0,
                                   np.array([2], np.int64), np.zeros(2), np.zeros(2, np.uint8),
                                   iv],
         "`flag_data`: dimension 1 has length 5 instead of 10"),
        ("filter_poly2D", [i2, np.ones((2, 1)), np.ones((6, 2)), np.ones((2, 6), np.uint8),
                           np.zeros((6, 2, 1))],
         "`masks`: dimension 0 has length 2 instead of 6"),
        ("cov_accum_diag_invnpp", [1, 4, 3, np.zeros(4, np.int64), np.arange(4, dtype=np.int64),
                                   np.ones((3, 4)), 1.0, np.zeros(24)],
         "`weights`: dimension 0 has length 3 instead of 4"),
        ("cov_accum_diag_hits", [1, 4, 1, np.zeros(4, np.int64), np.arange(4, dtype=np.int64),
                                 np.zeros((2, 2, 1), np.int64)],
         "`hits`: dimension 0 has length 2 instead of 1 (nsub;"),
    ]


@pytest.mark.parametrize("case", range(len(_shape_cases())))
def test_contradicting_shapes_refused(cpu, case):
    kernel, args, words = _shape_cases()[case]
    with pytest.raises(ValueError) as e:
        registry[kernel]["dispatch"](*args)
    assert f"toast_rs {kernel}" in str(e.value) and words in str(e.value)
    _toast_refuses(kernel, _shape_cases()[case][1])


def test_filter_polynomial_checks_every_signal_first(cpu):
    rng = np.random.default_rng(0)
    flags = np.zeros(10, np.uint8)
    starts, stops = np.array([0, 5]), np.array([4, 9])
    for bad, exc, words in [
        (np.zeros(5), ValueError, "signals_list[1] has 5 samples, flags has 10"),
        (np.zeros(10, np.float32), TypeError, "dtype float32, expected float64 (signals_list[1])"),
    ]:
        ok = rng.random(10)
        before = ok.copy()
        with pytest.raises(exc) as e:
            registry["filter_polynomial"]["dispatch"](1, flags, [ok, bad], starts, stops)
        assert "toast_rs filter_polynomial: argument `signals_list`" in str(e.value)
        assert words in str(e.value) and "`flags`" not in str(e.value)
        np.testing.assert_array_equal(ok, before)  # not filtered
    # Both good: both filtered, as TOAST does.
    sigs = [rng.random(10), rng.random(10)]
    theirs = [s.copy() for s in sigs]
    registry["filter_polynomial"]["dispatch"](1, flags, sigs, starts, stops)
    toast_rs.uninstall()
    try:
        registry["filter_polynomial"]["dispatch"](1, flags, theirs, starts, stops)
    finally:
        toast_rs.install("cpu")
    np.testing.assert_allclose(sigs, theirs, atol=1e-12)


def test_filter_polynomial_high_order_matches_toast(cpu):
    # Order 150 on 500 samples (templates of condition ~3e9): the normal
    # equations left a residual 10% of the data off TOAST's; the CPU plugin
    # now solves such scans as TOAST's SVD does, to cond x eps (numpy's own
    # SVD least squares is 2.6e-8 off TOAST without flags).
    from toast.accelerator.kernel_registry import ImplementationType

    n, order = 500, 150
    x = np.random.default_rng(0).random(n)
    flags = (np.arange(n) % 61 == 3).astype(np.uint8)
    ours, theirs = [x.copy()], [x.copy()]
    registry["filter_polynomial"][ImplementationType.COMPILED](
        order, flags, ours, np.array([0]), np.array([n]))
    toast_rs._saved["filter_polynomial"][ImplementationType.COMPILED](
        order, flags, theirs, np.array([0]), np.array([n]))
    # The good samples to cond x eps of the data; the flagged ones, where
    # the polynomial is extrapolated to ~3e5, to the same relative to theirs.
    diff, good = np.abs(ours[0] - theirs[0]), flags == 0
    assert diff[good].max() < 1e-5
    assert diff[~good].max() < 1e-5 * np.abs(theirs[0][~good]).max()


def test_extra_arguments_are_refused(cpu):
    args = noise_weight_args()
    before = args[0].copy()
    dispatch = registry["noise_weight"]["dispatch"]
    with pytest.raises(TypeError, match=r"^noise_weight\(\): (too many positional|multiple )"):
        dispatch(*args, "extra", 99)  # TOAST's: noise_weight() got multiple values ...
    with pytest.raises(TypeError, match=r"noise_weight\(\): .*'bogus'"):
        dispatch(*args, bogus=1)
    with pytest.raises(TypeError, match=r"noise_weight\(\): multiple values for argument "
                                        r"'use_accel'"):
        dispatch(*args, True)  # dispatch passes use_accel= too, as TOAST's does
    with pytest.raises(TypeError, match=r"noise_weight\(\): missing a required argument"):
        dispatch(*args[:3])
    np.testing.assert_array_equal(args[0], before)
    assert toast_rs.stats()["noise_weight"]["calls"] == 0
    # A positional use_accel counts: True goes to TOAST's implementation
    # (without accel=True, toast_rs has no device data).
    registry["noise_weight"][ImplementationType.DEFAULT](*args, True)
    s = toast_rs.stats()["noise_weight"]
    assert s["toast_calls"] == 1 and s["calls"] == 0
    registry["noise_weight"][ImplementationType.COMPILED](*args, False)
    assert toast_rs.stats()["noise_weight"]["calls"] == 1
    with pytest.raises(TypeError, match=r"^scan_map\(\): too many positional arguments"):
        registry["scan_map"][ImplementationType.COMPILED](
            *_scan_map_args(np.ones((2, 4, 3)), np.ones((1, 4, 3))), False, 99)
    with pytest.raises(TypeError, match=r"^scan_map\(\): "):
        registry["scan_map"]["dispatch"](*_scan_map_args(np.ones((2, 4, 3)), np.ones((1, 4, 3))),
                                         "extra", 99)


def test_accel_update_host_refuses_read_only(accel_cpu, tmp_path):
    from toast.accelerator import (accel_data_create, accel_data_reset,
                                   accel_data_update_device, accel_data_update_host)

    path = tmp_path / "ro.bin"
    np.arange(4.0).tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r")  # PROT_READ: writing it segfaults
    locked = np.arange(4.0)
    raw = np.arange(4.0).tobytes()
    frozen = np.frombuffer(raw, dtype=np.float64)  # an immutable bytes object
    locked.setflags(write=False)
    for name, a in (("mapped", mapped), ("locked", locked), ("frozen", frozen)):
        accel_data_create(a, name)
        accel_data_update_device(a, name)
        accel_data_reset(a, name)
        with pytest.raises(ValueError) as e:
            accel_data_update_host(a, name)
        assert f"toast_rs accel: cannot update the host copy of '{name}'" in str(e.value)
        assert "is read-only (numpy's writeable flag is off)" in str(e.value)
        np.testing.assert_array_equal(a, np.arange(4.0))
    assert raw == np.arange(4.0).tobytes()
    assert "update_host" not in toast_rs.accel_stats()["ops"]


def test_accel_create_refuses_overlapping_buffers(accel_cpu):
    # Two device copies of the same host bytes: an update of one would
    # silently overwrite the other's.
    from toast.accelerator import accel_data_create, accel_data_delete, accel_data_update_host

    a = np.ones((2, 10))
    accel_data_create(a, "whole")
    flat = a.reshape(-1)
    for part in (a[1:], a[:1], flat[5:15], flat[15:]):
        with pytest.raises(RuntimeError) as e:
            accel_data_create(part, "part")
        assert str(e.value) == (
            f"toast_rs accel: cannot create 'part' (host {part.ctypes.data:#x}, {part.nbytes} "
            f"bytes): its host bytes overlap the present buffer 'whole' (host "
            f"{a.ctypes.data:#x}, 160 bytes); the same host bytes cannot have two device "
            "copies (delete 'whole' first, or use its device copy)")
    # The same start and size: today's error.
    with pytest.raises(RuntimeError, match="host buffer .* is already present as 'whole' "
                                           "with 160 bytes"):
        accel_data_create(a.reshape(20), "again")
    # A buffer holding a present one is refused too, naming the one inside.
    big = np.ones(40)
    accel_data_create(big[10:20], "inner")
    with pytest.raises(RuntimeError, match="'big'.*overlap the present buffer 'inner'"):
        accel_data_create(big, "big")
    # Neighbours that share no byte are fine.
    accel_data_create(big[20:30], "next")
    accel_data_create(big[:10], "before")
    assert sorted(n for _, _, n in toast_rs._runtime.accel_table()) == [
        "before", "inner", "next", "whole"]
    accel_data_update_host(a, "whole")
    accel_data_delete(a, "whole")
    accel_data_create(a[1:], "tail")  # nothing overlaps it now
    assert toast_rs.accel_stats()["buffers"] == 4


class _Window:
    """Memory it does not own, through an array interface (as a view whose
    owner is the window): once the window is gone the memory outlives it, so
    a new object at the same address is certain."""

    def __init__(self, backing):
        self.__array_interface__ = dict(backing.__array_interface__)


def test_accel_entry_of_a_freed_array_is_dropped(accel_cpu):
    import gc
    import warnings

    from toast.accelerator import (accel_data_create, accel_data_delete, accel_data_present,
                                   accel_data_reset, accel_data_update_device,
                                   accel_data_update_host)

    # The probe's case: freed without accel_data_delete.
    a = np.full((2, 10), 1.0)
    accel_data_create(a, "a")
    accel_data_update_device(a, "a")
    del a
    gc.collect()
    with pytest.warns(RuntimeWarning, match=r"dropped the present buffer 'a' \(host 0x[0-9a-f]+, "
                                            r"160 bytes\): the object that owned its host memory "
                                            r"was freed without accel_data_delete"):
        s = toast_rs.accel_stats()
    assert s["buffers"] == 0 and s["device_bytes"] == 0
    assert s["transfers"]["frees"] == s["transfers"]["allocs"] == 1  # its device buffer too

    # The address taken by another object, for certain: every lookup drops
    # the stale entry (with a warning) and goes on as if it were absent.
    backing = np.full((2, 10), 50.0)
    dispatch = registry["noise_weight"]["dispatch"]
    weights = (np.arange(2, dtype=np.int32), intervals((0, 10)), np.array([2.0, 3.0]))
    lookups = [
        (lambda: accel_data_present(backing, "b"), None),
        (lambda: accel_data_update_host(backing, "b"), "not present"),
        (lambda: accel_data_update_device(backing, "b"), "not present"),
        (lambda: accel_data_reset(backing, "b"), "not present"),
        (lambda: accel_data_delete(backing, "b"), "not present"),
        (lambda: dispatch(backing, *weights, use_accel=True), "`det_data`.*not present"),
    ]
    for lookup, error in lookups:
        w = _Window(backing)
        accel_data_create(w, "dead")
        del w
        with pytest.warns(RuntimeWarning, match="dropped the present buffer 'dead'"):
            if error is None:
                assert lookup() is False
            else:
                with pytest.raises(RuntimeError, match=error):
                    lookup()
        assert toast_rs.accel_stats()["buffers"] == 0
    np.testing.assert_array_equal(backing, 50.0)  # no dead device data came back
    # create: the stale entry goes, the new one is made.
    w = _Window(backing)
    accel_data_create(w, "dead")
    del w
    with pytest.warns(RuntimeWarning, match="dropped the present buffer 'dead'"):
        accel_data_create(backing, "b")
    assert [n for _, _, n in toast_rs._runtime.accel_table()] == ["b"]
    # Overlapping a stale entry is no overlap.
    accel_data_delete(backing, "b")
    w = _Window(backing)
    accel_data_create(w, "dead")
    del w
    with pytest.warns(RuntimeWarning, match="dropped the present buffer 'dead'"):
        accel_data_create(backing[1:], "tail")
    accel_data_delete(backing[1:], "tail")

    # Empty arrays are keyed by their object, whose id CPython reuses at once.
    tmp = np.zeros(0)
    key = id(tmp)
    accel_data_create(tmp, "tmp")
    del tmp
    for _ in range(1000):
        f = np.zeros(0)
        if id(f) == key:
            break
        del f
    else:
        pytest.skip("CPython did not reuse the empty array's id")
    with pytest.warns(RuntimeWarning, match=r"dropped the present buffer 'tmp' \(empty"):
        assert not accel_data_present(f, "f")
    accel_data_create(f, "f")
    assert accel_data_present(f, "f")
    accel_data_delete(f, "f")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not any(accel_data_present(np.zeros(0), "f") for _ in range(100))
        # A view of a live present array finds it (the entry's owner is the
        # memory's, not the object passed): the array lives while a view does.
        a = np.arange(20.0)
        accel_data_create(a, "a")
        accel_data_update_device(a, "a")
        view = a.reshape(2, 10)
        del a
        gc.collect()
        assert accel_data_present(view.reshape(20), "a")
        out = view.copy()
        dispatch(view, *weights, use_accel=True)
        accel_data_update_host(view.reshape(20), "a")
        dispatch(out, *weights)
        np.testing.assert_array_equal(view, out)
        accel_data_delete(view.reshape(20), "a")
        # An owner that takes no weak references (bytes) is held until delete.
        raw = np.arange(4.0).tobytes()
        accel_data_create(np.frombuffer(raw), "frozen")
        gc.collect()
        assert accel_data_present(np.frombuffer(raw), "frozen")
        accel_data_delete(np.frombuffer(raw), "frozen")
    assert toast_rs.accel_stats()["buffers"] == 0


def test_accel_stale_warning_may_use_the_table(accel_cpu, monkeypatch):
    # The warning runs Python code (a showwarning hook, an error filter),
    # which may call back into the table: it comes with the table unlocked.
    import warnings

    from toast.accelerator import accel_data_create, accel_data_present

    backing = np.ones(8)
    seen = []

    def show(message, *args, **kwargs):
        seen.append((str(message), accel_data_present(backing, "again")))

    w = _Window(backing)
    accel_data_create(w, "dead")
    del w
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", show)
        assert not accel_data_present(backing, "b")
    assert len(seen) == 1 and "'dead'" in seen[0][0] and seen[0][1] is False
    # An error filter raises the warning; the entry is gone all the same.
    w = _Window(backing)
    accel_data_create(w, "dead")
    del w
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="'dead'"):
            accel_data_present(backing, "b")
        assert not accel_data_present(backing, "b")


def test_accel_kernel_argument_larger_than_its_buffer(accel_cpu):
    from toast.accelerator import accel_data_create, accel_data_update_device

    big = np.ones((4, 10))
    accel_data_create(big[:2], "first_half")
    accel_data_update_device(big[:2], "first_half")
    with pytest.raises(RuntimeError) as e:
        registry["noise_weight"]["dispatch"](big, np.arange(4, dtype=np.int32),
                                             intervals((0, 10)), np.ones(4), use_accel=True)
    assert str(e.value) == (
        f"toast_rs noise_weight (use_accel=True): argument `det_data` (host "
        f"{big.ctypes.data:#x}, 320 bytes) starts at the present buffer 'first_half', which "
        "has 160 bytes on the device: the argument needs 320; stage the whole array (delete "
        "'first_half' and create the larger array)")


def test_accel_assign_device_move_keeps_the_memory_rules(monkeypatch):
    import toast.accelerator.accel as acc
    from toast.accelerator import accel_data_create

    monkeypatch.setenv("TOAST_RS_DEVICES", "2")
    monkeypatch.delenv("TOAST_RS_DEVICE", raising=False)
    monkeypatch.setenv("TOAST_GPU_MEM_GB", "1")
    toast_rs.install("cpu", accel=True)
    try:
        # One process of two on the node: device 1, alone, with mem_gb.
        acc.accel_assign_device(2, 1, 1e-6, False)
        s = toast_rs.accel_stats()
        assert s["device"]["device"] == 1 and s["device"]["sharing"] == 1
        assert s["limit_bytes"] == int(1e-6 * 2**30)
        assert s["limit"] == "accel_assign_device mem_gb=1e-06 GB"
        with pytest.raises(RuntimeError, match="memory limit.*'big'"):
            accel_data_create(np.ones(1000), "big")
        # Back to device 0, shared by two of four processes: mem_gb divided.
        acc.accel_assign_device(4, 0, 2.0, False)
        s = toast_rs.accel_stats()
        assert s["device"]["device"] == 0 and s["device"]["sharing"] == 2
        assert s["limit_bytes"] == 2**30
        assert s["limit"] == "accel_assign_device mem_gb=2 GB shared by 2 processes on the device"
        # Without mem_gb, TOAST_GPU_MEM_GB's share, moving as staying.
        for rank, device in ((2, 1), (3, 1)):
            acc.accel_assign_device(4, rank, None, False)
            s = toast_rs.accel_stats()
            assert s["device"]["device"] == device and s["device"]["sharing"] == 2
            assert s["limit_bytes"] == 2**29
            assert s["limit"] == "TOAST_GPU_MEM_GB=1 GB shared by 2 processes on the device"
    finally:
        toast_rs.uninstall()


def test_accel_shared_data_come_back_from_the_device(accel_cpu):
    # TOAST's shared data are pshmem buffers numpy marks read-only; their
    # device copy still comes back (unlocked for the copy, locked after).
    from toast.observation import default_values as defaults
    from toast.tests.helpers import close_data, create_satellite_data

    data = create_satellite_data(None)
    ob = data.obs[0]
    key = defaults.times
    expected = np.array(ob.shared[key].data)
    assert not ob.shared[key].data.flags.writeable
    ob.shared.accel_create(key)
    ob.shared.accel_update_device(key)
    ob.shared[key].set(np.zeros_like(expected), fromrank=0)
    assert not ob.shared[key].data.any()
    ob.shared.accel_update_host(key)
    np.testing.assert_array_equal(ob.shared[key].data, expected)
    assert not ob.shared[key].data.flags.writeable
    ob.shared.accel_delete(key)
    close_data(data)


@pytest.mark.parametrize(
    "value, words",
    [("1e30", "TOAST_GPU_MEM_GB=1e+30 gives 107374182400000002135"),
     ("1e-300", "TOAST_GPU_MEM_GB=1e-300 gives 0 bytes: under 1 byte")],
    ids=["huge", "tiny"],
)
def test_accel_memory_limit_out_of_range(monkeypatch, value, words):
    monkeypatch.setenv("TOAST_GPU_MEM_GB", value)
    with pytest.raises(ValueError) as e:
        toast_rs.install("cpu", accel=True)
    assert str(e.value).startswith(f"toast_rs: {words}")
    if value == "1e30":
        assert "more than the 18446744073709551615 a 64-bit byte count holds" in str(e.value)
    assert not toast_rs.installed()


def test_accel_device_index_checked(monkeypatch):
    from toast_rs import accel

    monkeypatch.delenv("TOAST_RS_DEVICES", raising=False)
    monkeypatch.delenv("TOAST_RS_OPENCL_PLATFORM", raising=False)
    for value in ("99", "18446744073709551616"):
        monkeypatch.setenv("TOAST_RS_DEVICE", value)
        with pytest.raises(ValueError) as e:
            toast_rs.install("cpu", accel=True)
        assert str(e.value) == (
            f"toast_rs: TOAST_RS_DEVICE={value!r}: device {value} does not exist: the cpu "
            "backend has 1 device (0 to 0; one device assumed)")
        assert not toast_rs.installed()
    for value in ("-1", "abc", "1;x=1", "1.0"):
        monkeypatch.setenv("TOAST_RS_DEVICE", value)
        with pytest.raises(ValueError, match=rf"^toast_rs: TOAST_RS_DEVICE={value!r} is not a "
                                             "non-negative integer index"):
            toast_rs.install("cpu", accel=True)
    monkeypatch.delenv("TOAST_RS_DEVICE")
    with pytest.raises(ValueError, match=r"install\(device=3\): device 3 does not exist"):
        toast_rs.install("cpu", accel=True, device=3)
    with pytest.raises(TypeError, match="expected a device index"):
        toast_rs.install("cpu", accel=True, device="0")
    assert not toast_rs.installed()
    # The OpenCL platform goes into the plugin's option string: digits only.
    for value in ("abc", "0;x=1", "0:1", "-1"):
        monkeypatch.setenv("TOAST_RS_OPENCL_PLATFORM", value)
        with pytest.raises(ValueError, match=rf"^toast_rs: TOAST_RS_OPENCL_PLATFORM={value!r} "
                                             "is not a non-negative integer index"):
            accel.plugin_options("opencl", 1)
    monkeypatch.setenv("TOAST_RS_OPENCL_PLATFORM", "2")
    assert accel.plugin_options("opencl", 1) == "device=2:1"
    assert accel.plugin_options("opencl", 0) == "device=2:0"  # not ignored


def _pixels(nest, nside=8, n_samp=5):
    q = np.random.default_rng(0).normal(size=(1, n_samp, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    pixels = np.zeros((1, n_samp), np.int64)
    registry["pixels_healpix"][ImplementationType.DEFAULT](
        np.zeros(1, np.int32), q, np.zeros(n_samp, np.uint8), 0, np.zeros(1, np.int32), pixels,
        intervals((0, n_samp)), np.zeros(12 * nside**2 // 64, np.uint8), 64, nside, nest)
    return pixels[0]


def test_flags_are_booleans_not_truthiness(cpu):
    # The string "False" is true to Python; TOAST's bindings refuse it.
    ring, nest = _pixels(False), _pixels(True)
    assert not np.array_equal(ring, nest)
    np.testing.assert_array_equal(_pixels(np.bool_(True)), nest)
    np.testing.assert_array_equal(_pixels(0), ring)
    for bad in ("False", None, 2, 1.0):
        with pytest.raises(TypeError, match="argument `nest`: expected True or False"):
            _pixels(bad)


def test_install_arguments_checked():
    with pytest.raises(TypeError, match="accel='false': expected True, False or None"):
        toast_rs.install("cpu", accel="false")
    for device, exc in ((-7, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(exc):
            toast_rs.install("cpu", device=device)
    for path in (b"/tmp", [None], [b"/tmp"]):
        with pytest.raises(TypeError, match="backend_path"):
            toast_rs.install("cpu", backend_path=path)
    assert not toast_rs.installed()


def test_env_numbers_are_ascii_decimals(monkeypatch):
    from toast_rs import accel

    for value in ("1_0", "\u0661", "0x10"):
        monkeypatch.setenv("TOAST_GPU_MEM_GB", value)
        with pytest.raises(ValueError, match="is not a number of GB"):
            accel.env_mem_gb()
    monkeypatch.setenv("TOAST_GPU_MEM_GB", " 1.5e1 ")
    assert accel.env_mem_gb() == 15.0
    for value in ("1_000", "\u0663", "99999999999999999999", "0"):
        monkeypatch.setenv("TOAST_RS_DEVICES", value)
        with pytest.raises(ValueError, match="TOAST_RS_DEVICES"):
            accel.device_count("cuda")
    monkeypatch.setenv("TOAST_RS_DEVICES", "4")
    assert accel.device_count("cuda") == (4, "TOAST_RS_DEVICES")


def test_unicode_buffer_is_copied_whole(accel_cpu):
    from toast.accelerator import (accel_data_create, accel_data_delete,
                                   accel_data_update_device, accel_data_update_host)

    u = np.array(["abcdefghij"] * 4, dtype="<U10")
    accel_data_create(u, "u")
    accel_data_update_device(u, "u")
    u[:] = "ZZZZZZZZZZ"
    accel_data_update_host(u, "u")
    assert u.tolist() == ["abcdefghij"] * 4
    accel_data_delete(u, "u")


def test_arguments_converted_before_any_address_is_read(cpu):
    # Reading a later argument (an __array_interface__ property, __index__)
    # may run code that reallocates an array read before it: the kernel must
    # see the array as it is after every conversion, never freed memory.
    det = np.ones((4, 1 << 16))
    iv = intervals((0, 1 << 16))

    class Intervals:
        @property
        def __array_interface__(self):
            det.resize((1,), refcheck=False)
            return iv.__array_interface__

    with pytest.raises(ValueError, match=r"argument `det_data`: 1 dimensions"):
        registry["noise_weight"]["dispatch"](det, np.arange(4, dtype=np.int32), Intervals(),
                                             np.full(4, 2.0))
    # A number read after an array, inside a 0-d object array: its
    # __index__ runs while the arguments are settled, before any address.
    n_samp, nside = 1 << 16, 8
    pixels = np.zeros((1, n_samp), np.int64)

    class Nside:
        def __index__(self):
            pixels.resize((1,), refcheck=False)
            return nside

    q = np.tile(np.array([0.0, 0.0, 0.0, 1.0]), (1, n_samp, 1))
    with pytest.raises(ValueError, match=r"argument `pixels`: 1 dimensions"):
        registry["pixels_healpix"][ImplementationType.DEFAULT](
            np.zeros(1, np.int32), q, np.zeros(n_samp, np.uint8), 0, np.zeros(1, np.int32),
            pixels, intervals((0, n_samp)), np.zeros(12 * nside**2 // 64, np.uint8), 64,
            np.array(Nside(), dtype=object), True)
    # Array-likes and number-likes still work, converted once.
    args = noise_weight_args()
    ours = args[0].copy()

    class Like:
        def __init__(self, a):
            self.a = a

        @property
        def __array_interface__(self):
            return self.a.__array_interface__

    registry["noise_weight"]["dispatch"](Like(ours), args[1], Like(args[2]), args[3])
    theirs = args[0].copy()
    registry["noise_weight"]["dispatch"](theirs, *args[1:])
    np.testing.assert_array_equal(ours, theirs)


def test_plugin_options_with_nul_refused():
    from toast_rs import _native

    explicit, fallback = toast_rs._search_dirs(None)
    with pytest.raises(RuntimeError, match="contain a NUL byte"):
        _native.Runtime("cpu", {}, explicit, fallback, False, "threads=1\x00;x=1")
