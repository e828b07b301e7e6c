"""TOAST's accelerator contract on a toast-rs backend (``install(..., accel=True)``).

TOAST 3 runs operators on a GPU through an accelerator layer: a present
table of host buffers and their device copies (``accel_data_present``,
``create``, ``update_device``, ``update_host``, ``reset``, ``delete`` in
``toast.accelerator.accel``), operators that say they can run there
(``Operator.supports_accel()``), pipelines that stage their data once
(``Data.accel_create`` / ``accel_update_device`` / ``accel_update_host``),
and registry kernels called with ``use_accel=True`` that work on the device
copies. In TOAST's own build that layer is OpenMP target offload (the
``omp_accel_*`` functions of ``toast._libtoast``); the PyPI wheel is built
without it.

:func:`enable` fills the layer with a toast-rs backend:

* In ``toast.accelerator.accel`` (the module whose functions every TOAST
  module calls), ``use_accel_omp`` becomes True and the ``omp_accel_*``
  functions its ``accel_data_*`` wrappers call become the present table of
  :class:`toast_rs._native.Runtime` (device buffers of the plugin), so
  ``accel_enabled()`` is True and every ``accel_data_*`` call lands here.
* TOAST's modules copy ``use_accel_omp`` into their namespace at import
  (``from ..accelerator import use_accel_omp``), so the flag is also set in
  every module under ``toast`` in ``sys.modules`` that holds it (found by
  walking ``sys.modules``, not from a list), and in the ``toast.accelerator``
  package, which later imports copy it from. Names bound to functions
  (``accel_enabled``, ``accel_data_create``, ...) need nothing: those
  functions read ``accel.py``'s globals when called.
* ``DetectorData._accel_exists`` answers False for an object under
  construction: TOAST 3.0.6's ``DetectorData.__init__`` asks
  ``accel_exists()`` (which reads ``_is_view`` and ``_raw``) before either
  is set (and ``__del__`` after ``clear()`` dropped ``_raw``), so no
  accelerator build of 3.0.6 could create detector data without this.
* ``ops.Copy._exec`` pushes its output to the device when the output field
  is in use there: TOAST 3.0.6's Copy runs on the host in hybrid pipelines
  and writes the host copy of a field whose device copy stays marked as the
  current one (zeroed by ``change_detectors``), so TOAST's MapMaker solved
  on zeros in every accelerator build of 3.0.6.
* ``SharedDataManager.accel_update_host`` unlocks the shared buffer for the
  copy: TOAST's shared data (pshmem's ``MPIShared._flat``) are numpy views
  of writable memory that pshmem keeps read-only (``writeable=False``)
  except while it writes them itself, and the present table refuses to
  write a read-only host array (a read-only mapping or a view of ``bytes``
  would crash or be corrupted). TOAST's OpenMP build writes them whatever
  the flag says.
* The registry kernels (all 14 of TOAST 3.0.6's are ours) called with
  ``use_accel=True`` run on the device buffers: see ``python/src/lib.rs``.

:func:`disable` puts every name back.

The CPU plugin is host-addressable, but with ``accel=True`` its "device"
buffers are still separate host allocations (the plugin's ``alloc``): the
host and device copies are distinct, as on a GPU, so TOAST's staging means
what it says and its tests (which clear the host copy to check the device
copy survives) hold. It is a faithful, slower model of a discrete device,
useful to test a pipeline's staging without a GPU.

Device selection (:func:`assign_device`): process ``node_rank`` of
``node_procs`` on a node uses device ``node_rank // ceil(node_procs /
n_devices)``, TOAST's OpenMP rule. The node layout comes from MPI (a
shared-memory split of ``COMM_WORLD``, as ``toast.mpi`` does) when TOAST uses
MPI. ``n_devices`` is ``TOAST_RS_DEVICES`` if set, else the driver's count
(``cuDeviceGetCount`` / ``hipGetDeviceCount``, after ``CUDA_VISIBLE_DEVICES`` /
``HIP_VISIBLE_DEVICES``), else 1 (opencl, cpu). ``TOAST_RS_DEVICE=N`` or
``install(..., device=N)`` overrides the choice. The device index reaches the
plugin as its ``device=`` option (opencl: ``device=P:N`` with platform
``P`` = ``TOAST_RS_OPENCL_PLATFORM``, default 0).

Device memory: ``TOAST_GPU_MEM_GB`` (or the ``mem_gb`` of a later
``accel_assign_device`` call) is the device's memory for TOAST, shared by
the processes assigned to it (by ``accel_assign_device``'s node layout, the
same whether the call moves this process to another device or not); a
``create`` that would take this process over its share raises
``RuntimeError`` naming the buffer, the sizes and the limit.
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

#: (module, attribute, previous value) of every name :func:`enable` set.
_patched: List[Tuple[Any, str, Any]] = []
#: The device the runtime was opened on, and what decided it.
_device: Dict[str, Any] = {}


_ABSENT = object()


def _set(module: Any, attr: str, value: Any) -> None:
    _patched.append((module, attr, getattr(module, attr, _ABSENT)))
    setattr(module, attr, value)


def _env_index(name: str) -> Optional[int]:
    """The non-negative integer in environment variable ``name`` (None when
    unset or empty). Only digits: the value goes into the plugin's option
    string (``device=P:N``), where anything else would be spliced in as
    options of its own."""
    env = os.environ.get(name)
    if env is None or not env.strip():
        return None
    if not re.fullmatch(r"\s*[0-9]+\s*", env):
        raise ValueError(f"toast_rs: {name}={env!r} is not a non-negative integer index")
    return int(env)


def node_layout() -> Tuple[int, int]:
    """``(node_procs, node_rank)``: this process's place among its node's."""
    try:
        import toast.mpi as tmpi
    except ImportError:  # pragma: no cover - TOAST always has it
        return 1, 0
    if not getattr(tmpi, "use_mpi", False):
        return 1, 0
    MPI = tmpi.MPI
    nodecomm = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, 0)
    try:
        return nodecomm.size, nodecomm.rank
    finally:
        nodecomm.Free()


def _driver_count(backend: str) -> Optional[int]:
    """The number of devices the vendor driver reports, or None."""
    libs = {
        "cuda": (("libcuda.so.1", "libcuda.so"), "cuInit", "cuDeviceGetCount"),
        "hip": (("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"), "hipInit",
                "hipGetDeviceCount"),
    }
    if backend not in libs:
        return None
    names, init, count = libs[backend]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        try:
            if getattr(lib, init)(0) != 0:
                return None
            n = ctypes.c_int(0)
            if getattr(lib, count)(ctypes.byref(n)) != 0:
                return None
            return n.value
        except AttributeError:
            return None
    return None


# The most devices TOAST_RS_DEVICES may claim: device ordinals are C ints.
_MAX_DEVICE_COUNT = 2**31 - 1


def device_count(backend: str) -> Tuple[int, str]:
    """``(n_devices, where the number came from)`` for ``backend``."""
    env = os.environ.get("TOAST_RS_DEVICES")
    if env:
        # ASCII digits only, as TOAST_RS_DEVICE: Python's int() would also
        # read "1_000" and other scripts' digits.
        if not re.fullmatch(r"\s*[0-9]+\s*", env):
            raise ValueError(f"toast_rs: TOAST_RS_DEVICES={env!r} is not a device count")
        n = int(env)
        if not 1 <= n <= _MAX_DEVICE_COUNT:
            raise ValueError(
                f"toast_rs: TOAST_RS_DEVICES={env!r} must be 1 to {_MAX_DEVICE_COUNT}"
            )
        return n, "TOAST_RS_DEVICES"
    n = _driver_count(backend)
    if n is not None and n > 0:
        return n, f"{backend} driver"
    return 1, "one device assumed"


def assign_device(
    backend: str,
    node_procs: int,
    node_rank: int,
    device: Optional[int] = None,
) -> Dict[str, Any]:
    """TOAST's rule: rank ``r`` of ``p`` on a node with ``n`` devices uses
    device ``r // ceil(p / n)``; ``device`` (or ``TOAST_RS_DEVICE``) wins.

    Returns ``{"device", "n_devices", "sharing", "how"}``: ``sharing`` is the
    number of processes of the node on this device (for the memory share).
    """
    if node_procs < 1 or not 0 <= node_rank < node_procs:
        raise ValueError(
            f"toast_rs accel_assign_device: node rank {node_rank} of {node_procs} processes"
        )
    n_dev, source = device_count(backend)
    per_dev = math.ceil(node_procs / n_dev)
    chosen = node_rank // per_dev
    sharing = min(per_dev, node_procs - chosen * per_dev)
    how = f"node rank {node_rank} of {node_procs}, {n_dev} devices ({source})"
    if device is None:
        device = _env_index("TOAST_RS_DEVICE")
        if device is not None:
            how = "TOAST_RS_DEVICE"
            what = f"TOAST_RS_DEVICE={os.environ['TOAST_RS_DEVICE']!r}"
    else:
        device = device_index(device)
        how = "install(device=...)"
        what = f"install(device={device})"
    if device is not None:
        # A count that is only assumed (one device) is not the backend's for
        # opencl, whose plugin lists its devices itself and refuses an index
        # it does not have (install names the variable then); the others'
        # counts are known (TOAST_RS_DEVICES, the driver's, the host's one).
        known = not (backend == "opencl" and source == "one device assumed")
        if known and device >= n_dev:
            raise ValueError(
                f"toast_rs: {what}: device {device} does not exist: the {backend} backend has "
                f"{n_dev} device{'s' if n_dev != 1 else ''} (0 to {n_dev - 1}; {source})"
            )
        chosen = device
        sharing = 1
    return {"device": chosen, "n_devices": n_dev, "sharing": sharing, "how": how}


def device_index(device: Any) -> int:
    """``install(device=...)`` as an index: an integer (not a bool), not
    negative; a ``TypeError`` or ``ValueError`` naming it otherwise."""
    if isinstance(device, (bool, np.bool_)):
        raise TypeError(f"toast_rs.install(device={device!r}): expected a device index")
    try:
        index = operator.index(device)
    except TypeError:
        raise TypeError(f"toast_rs.install(device={device!r}): expected a device index") from None
    if index < 0:
        raise ValueError(f"toast_rs: install(device={index}): device index {index} is negative")
    return index


def plugin_options(backend: str, device: int) -> Optional[str]:
    """The plugin's ``init`` option that opens ``device``."""
    if backend in ("cuda", "hip"):
        return f"device={device}"
    if backend == "opencl":
        platform = _env_index("TOAST_RS_OPENCL_PLATFORM")
        if platform is not None:
            return f"device={platform}:{device}"
        # The user's own choice of OpenCL device (TOAST_OPENCL_DEVICE), when
        # nothing of ours names one, is the plugin's to take, as without
        # accel.
        if (device == 0 and "TOAST_OPENCL_DEVICE" in os.environ
                and "TOAST_RS_DEVICE" not in os.environ
                and "TOAST_RS_DEVICES" not in os.environ):
            return None
        # Else the N-th suitable device over all platforms, the index the
        # assignment counts (the plugin's own choice under a launcher, rank
        # % devices, is not TOAST's rule).
        return f"device={device}"
    return None


def memory_limit(mem_gb: Optional[float], sharing: int, source: str) -> Tuple[Optional[int], Optional[str]]:
    """This process's device bytes: ``mem_gb`` GiB shared by ``sharing``."""
    if mem_gb is None:
        return None, None
    if not (mem_gb > 0 and math.isfinite(mem_gb)):
        raise ValueError(f"toast_rs: {source}={mem_gb!r} must be a positive number of GB")
    limit = int(mem_gb * 2**30 / max(sharing, 1))
    # The table counts bytes in 64 bits, and a limit of 0 bytes would refuse
    # every buffer: neither is a limit anyone meant.
    per = f" per process ({sharing} share the device)" if sharing > 1 else ""
    if limit < 1:
        raise ValueError(
            f"toast_rs: {source}={mem_gb!r} gives {limit} bytes{per}: under 1 byte"
        )
    if limit > 2**64 - 1:
        raise ValueError(
            f"toast_rs: {source}={mem_gb!r} gives {limit} bytes{per}: more than the "
            f"{2**64 - 1} a 64-bit byte count holds"
        )
    how = f"{source}={mem_gb:g} GB"
    if sharing > 1:
        how += f" shared by {sharing} processes on the device"
    return limit, how


def env_mem_gb() -> Optional[float]:
    env = os.environ.get("TOAST_GPU_MEM_GB")
    if not env:
        return None
    # A decimal number in ASCII, as toast-cli reads it: Python's float()
    # would also read "1_0" (10) and other scripts' digits.
    if not re.fullmatch(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", env):
        raise ValueError(f"toast_rs: TOAST_GPU_MEM_GB={env!r} is not a number of GB")
    return float(env)


def enable(runtime: Any, reinstall: Any) -> None:
    """Point TOAST's accelerator layer at ``runtime``'s present table.

    ``reinstall(device)`` re-creates the runtime on another device and
    returns it (for a later ``accel_assign_device`` call that moves this
    process; the call then sets the new runtime's memory limit and
    ``_device`` from its own assignment, as when the process stays).
    """
    import toast.accelerator as pkg
    import toast.accelerator.accel as acc

    disable()

    # TOAST's __del__ methods ask and delete at interpreter exit, when
    # imports fail: the process's device memory goes with it then.
    finalizing = sys.is_finalizing

    def present(data, name="None"):
        if finalizing():
            return False
        return runtime.accel_present(data, str(name))

    def create(data, name="None"):
        runtime.accel_create(data, str(name))

    def reset(data, name="None"):
        runtime.accel_reset(data, str(name))

    def update_device(data, name="None"):
        runtime.accel_update_device(data, str(name))

    def update_host(data, name="None"):
        runtime.accel_update_host(data, str(name))

    def delete(data, name="None"):
        if not finalizing():
            runtime.accel_delete(data, str(name))

    def dump():
        from toast.utils import Logger

        log = Logger.get()
        table = runtime.accel_table()
        log.info(f"toast_rs device table ({_device.get('backend')} device "
                 f"{_device.get('device')}): {len(table)} buffers")
        for addr, nbytes, name in table:
            log.info(f"  {addr:#x}  {nbytes:>12} bytes  {name}")

    def get_device():
        return _device.get("device", -1)

    def assign(node_procs, node_rank, mem_gb, disabled):
        if disabled:
            return
        a = assign_device(_device["backend"], int(node_procs), int(node_rank))
        # This process's share of the device's memory, the same whether it
        # moves or stays: ``mem_gb`` (TOAST passes TOAST_GPU_MEM_GB, or its
        # 2 GB default), else TOAST_GPU_MEM_GB, divided among the processes
        # on the device. Checked before anything moves.
        if mem_gb:
            limit, how = memory_limit(float(mem_gb), a["sharing"], "accel_assign_device mem_gb")
        else:
            limit, how = memory_limit(env_mem_gb(), a["sharing"], "TOAST_GPU_MEM_GB")
        target = runtime
        if a["device"] != _device["device"]:
            if not runtime.accel_empty():
                raise RuntimeError(
                    f"toast_rs accel_assign_device: this process is on device "
                    f"{_device['device']} with data present there; it cannot move to device "
                    f"{a['device']} (delete the device data first)"
                )
            target = reinstall(a["device"])
        if limit is not None:
            target.accel_set_limit(limit, how)
        _device.update(a)

    for attr, value in (
        ("omp_accel_present", present),
        ("omp_accel_create", create),
        ("omp_accel_reset", reset),
        ("omp_accel_update_device", update_device),
        ("omp_accel_update_host", update_host),
        ("omp_accel_delete", delete),
        ("omp_accel_dump", dump),
        ("omp_accel_get_device", get_device),
        ("omp_accel_assign_device", assign),
    ):
        _set(acc, attr, value)
    _set(acc, "use_accel_omp", True)
    # The modules that copied the flag at import (and the package, which
    # modules imported later copy it from).
    for name, mod in list(sys.modules.items()):
        if mod is None or mod is acc or not (name == "toast" or name.startswith("toast.")):
            continue
        if getattr(mod, "use_accel_omp", None) is False:
            _set(mod, "use_accel_omp", True)
    assert pkg.use_accel_omp is True
    # TOAST 3.0.6 bug met by any accelerator build: DetectorData.__init__
    # calls _allocate(), which asks accel_exists(), which reads _is_view and
    # _raw, before either exists (and __del__ asks again after clear() has
    # dropped _raw). An object without a buffer has no device copy: answer
    # False then, TOAST's answer otherwise.
    from toast.observation_data import DetectorData

    toast_exists = DetectorData._accel_exists

    def _accel_exists(self):
        if not getattr(self, "_is_view", False) and not hasattr(self, "_raw"):
            return False
        return toast_exists(self)

    _accel_exists.__doc__ = toast_exists.__doc__
    _set(DetectorData, "_accel_exists", _accel_exists)

    # TOAST 3.0.6 bug met by any accelerator build, in hybrid pipelines (the
    # MapMaker's): ops.Copy runs on the host and writes its output field's
    # host copy, but when that field is present and in use on the device
    # (change_detectors() keeps the in-use flag and zeroes both copies) it
    # leaves the flag, so the next device operator reads the zeroed device
    # copy. Copy writes every detector of the field (it resizes the field to
    # them), so the host copy is the whole current field: push it.
    from toast.ops.copy import Copy

    toast_copy = Copy._exec

    def _exec(self, data, *args, **kwargs):
        toast_copy(self, data, *args, **kwargs)
        for _, out_key in self.detdata or ():
            for ob in data.obs:
                dd = ob.detdata
                if out_key in dd and dd.accel_exists(out_key) and dd.accel_in_use(out_key):
                    dd.accel_used(out_key, False)
                    dd.accel_update_device(out_key)

    _exec.__doc__ = toast_copy.__doc__
    _set(Copy, "_exec", _exec)

    # TOAST's shared data are pshmem buffers locked read-only between
    # pshmem's own writes (MPIShared._lock_memory); the device copy goes
    # back into them as pshmem's writers do: unlocked for the copy, locked
    # again after. Any other read-only host array is refused by the table.
    from toast.observation_data import SharedDataManager

    toast_shared_update_host = SharedDataManager.accel_update_host

    def _shared_update_host(self, key):
        entry = self._internal.get(key)
        shdata = getattr(entry, "shdata", None)
        flat = getattr(shdata, "_flat", None)
        if flat is None or flat.flags.writeable or not hasattr(shdata, "_unlock_memory"):
            return toast_shared_update_host(self, key)
        shdata._unlock_memory()
        try:
            return toast_shared_update_host(self, key)
        finally:
            shdata._lock_memory()

    _shared_update_host.__doc__ = toast_shared_update_host.__doc__
    _set(SharedDataManager, "accel_update_host", _shared_update_host)


def patched_modules() -> List[str]:
    """The modules whose names :func:`enable` changed."""
    return sorted({m.__name__ for m, _, _ in _patched})


def disable() -> None:
    """Put back every name :func:`enable` changed."""
    while _patched:
        module, attr, old = _patched.pop()
        if old is _ABSENT:
            delattr(module, attr)
        else:
            setattr(module, attr, old)
