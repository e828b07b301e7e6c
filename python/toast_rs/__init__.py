"""Run TOAST 3 pipelines on toast-rs backends.

``toast_rs.install(backend="cpu", **dispatch)`` replaces the DEFAULT and
COMPILED implementations of the kernels toast-rs has in TOAST's kernel
registry (``toast.accelerator.kernel_registry.registry``) by calls into a
toast-rs backend plugin (cpu, opencl, cuda, hip, or any third-party plugin),
with the positional signatures TOAST calls them with. Every TOAST operator
looks its kernel up in the registry at each call, so an existing pipeline runs
on our backends without a change. ``toast_rs.uninstall()`` puts TOAST's
implementations back.

``accel`` (``install(backend, accel=True)``, or ``TOAST_RS_ACCEL=1``):
toast-rs becomes TOAST's accelerator. ``accel_enabled()`` is True, TOAST's
``accel_data_*`` calls (and so ``Data.accel_create`` / ``accel_update_device``
/ ``accel_update_host`` and its pipelines' staging) fill a present table of
device buffers of the backend's plugin, and the registry kernels called with
``use_accel=True`` run on those device buffers with no per-call staging
(counted as ``accel_calls``; bytes moved in :func:`accel_stats`). See
:mod:`toast_rs.accel` for how TOAST's layer is patched, device selection and
the memory limit.

Without ``accel`` (the default): TOAST's ``use_accel`` is always false with
the PyPI wheel, which has no accelerator support, and the data are host
numpy arrays: the CPU plugin reads them in place, and a device backend
(opencl, cuda, hip) copies them to its device for the call and copies the
outputs back. A ``use_accel=True`` call (TOAST's own accelerator layer, in a
build that has one) goes to TOAST's implementation, unchanged (counted as
``toast_calls`` in :func:`stats`).
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Union

import numpy as np

from . import _native
from . import accel as _accel

__version__ = "0.1.0"

#: TOAST registry names of the kernels toast-rs implements.
KERNELS = tuple(_native.kernels())

_lock = threading.Lock()
_runtime: Optional[Any] = None
# The arguments of the install in effect (to re-open on another device).
_install_args: Dict[str, Any] = {}
# name -> {ImplementationType: TOAST's function}, for uninstall.
_saved: Dict[str, Dict[Any, Callable[..., Any]]] = {}
# Calls that stayed TOAST's (kernels we lack, use_accel=True): name -> [calls, seconds].
_toast_uses: Dict[str, list] = {}


def _toast_registry():
    """TOAST's registry, with every kernel registered."""
    import toast.ops  # noqa: F401  (importing the operators registers their kernels)
    import toast.templates  # noqa: F401
    from toast.accelerator.kernel_registry import ImplementationType, registry

    return registry, ImplementationType


def _search_dirs(backend_path: Union[None, str, os.PathLike, Iterable]) -> tuple:
    def one(p: Any) -> str:
        if not isinstance(p, (str, os.PathLike)) or isinstance(p, bytes):
            raise TypeError(
                f"toast_rs.install: backend_path: expected a path (str or os.PathLike) or "
                f"an iterable of them, got {type(p).__name__}"
            )
        path = os.fspath(p)
        if not isinstance(path, str):
            raise TypeError(f"toast_rs.install: backend_path: {path!r} is not a str path")
        return path

    if backend_path is None:
        explicit = []
    elif isinstance(backend_path, (str, os.PathLike, bytes, bytearray)):
        explicit = [one(backend_path)]
    else:
        explicit = [one(p) for p in backend_path]
    fallback = [str(Path(__file__).parent / "backends"), _native.BUILD_PLUGIN_DIR]
    return explicit, [d for d in fallback if os.path.isdir(d)]


def _count_toast(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    start = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        use = _toast_uses.setdefault(name, [0, 0.0])
        use[0] += 1
        use[1] += time.perf_counter() - start


def _as_float64(args: tuple, i: int) -> tuple:
    # TOAST's DEFAULT build_noise_weighted passes det_data.astype(np.float64).
    a = args[i]
    if isinstance(a, np.ndarray) and a.dtype != np.float64 and a.dtype.kind in "fiu":
        args = args[:i] + (a.astype(np.float64),) + args[i + 1 :]
    return args


# Argument conventions TOAST's Python wrappers apply before the compiled call.
_PREPARE: Dict[str, Callable[[tuple], tuple]] = {
    "build_noise_weighted": lambda args: _as_float64(args, 7),
}


def _ours(
    name: str, runtime: Any, toast_fn: Callable[..., Any], sig: inspect.Signature
) -> Callable[..., Any]:
    """Our implementation of TOAST kernel ``name`` in place of ``toast_fn``.

    Every call is bound to ``sig``, the signature of TOAST's DEFAULT
    implementation (its COMPILED one takes ``*args``), so that a call TOAST
    would refuse (an argument too many or missing, an unknown keyword,
    ``use_accel`` given twice) raises the same ``TypeError`` rather than
    being cut to the arguments the kernel reads, and ``use_accel`` counts
    however it is passed (by keyword, or positionally after the others).
    """
    call = runtime.call
    prepare = _PREPARE.get(name)
    params = [p for p in sig.parameters if p != "use_accel"]
    on_device = runtime.accel()

    def kernel(*args: Any, **kwargs: Any) -> None:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{name}(): {e}") from None
        bound.apply_defaults()
        use_accel = bound.arguments.get("use_accel", False)
        args = tuple(bound.arguments[p] for p in params)
        if use_accel and not on_device:
            # Data on TOAST's own accelerator: only its kernels can run there.
            return _count_toast(name, toast_fn, *args, use_accel=use_accel)
        if prepare is not None:
            args = prepare(args)
        call(name, args, bool(use_accel))

    kernel.__name__ = kernel.__qualname__ = f"{name}_toast_rs"
    kernel.__doc__ = toast_fn.__doc__
    return kernel


def _counted(name: str, toast_fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _count_toast(name, toast_fn, *args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"{name}_toast"
    kernel.__doc__ = toast_fn.__doc__
    return kernel


def _env_flag(name: str) -> bool:
    v = os.environ.get(name, "").strip().lower()
    if v in ("", "0", "no", "false", "off"):
        return False
    if v in ("1", "yes", "true", "on"):
        return True
    raise ValueError(f"toast_rs: {name}={os.environ[name]!r}: expected 1/yes/true or 0/no/false")


def install(
    backend: str = "cpu",
    *,
    backend_path: Union[None, str, os.PathLike, Iterable] = None,
    accel: Optional[bool] = None,
    device: Optional[int] = None,
    **dispatch: str,
) -> Dict[str, str]:
    """Run TOAST's kernels on toast-rs backends.

    Args:
        backend: the backend of every kernel ("cpu", "opencl", "cuda", "hip",
            or a third-party plugin's name).
        backend_path: plugin files or directories searched first (then
            ``TOAST_BACKEND_PATH``, this package's ``backends/``, the build
            tree's ``target/release``, the system directories).
        accel: be TOAST's accelerator (:mod:`toast_rs.accel`): ``accel_enabled()``
            is True, ``accel_data_*`` keep device buffers of ``backend``, and
            ``use_accel=True`` kernel calls run on them. ``None`` (default):
            the ``TOAST_RS_ACCEL`` environment variable (1/yes/true).
        device: with ``accel``, the device index to open (default: TOAST's
            rule from the node-local rank; ``TOAST_RS_DEVICE`` overrides it).
        **dispatch: per-kernel backends by TOAST registry name, as in the
            ``[dispatch]`` configuration: ``install("cpu", scan_map="opencl")``.
            Not with ``accel`` (every kernel must run where the data are).

    Returns:
        TOAST registry name -> backend that runs it ("toast" for the kernels
        toast-rs does not implement, which keep TOAST's implementation).

    Raises:
        ValueError: an unknown kernel name in ``dispatch``.
        RuntimeError: a named backend was not found or is unavailable (the
            message says why).
    """
    global _runtime
    if accel is None:
        accel = _env_flag("TOAST_RS_ACCEL")
    elif not isinstance(accel, (bool, np.bool_)):
        # bool("false") is True: a string here is a mistake, not a switch.
        raise TypeError(
            f"toast_rs.install: accel={accel!r}: expected True, False or None "
            "(None: the TOAST_RS_ACCEL environment variable)"
        )
    accel = bool(accel)
    if device is not None:
        # Checked with accel off too (where it is unused): a bad index is a
        # mistake either way.
        device = _accel.device_index(device)
    registry, impl = _toast_registry()
    explicit, fallback = _search_dirs(backend_path)
    options = None
    placed: Dict[str, Any] = {}
    if accel:
        if dispatch:
            raise ValueError(
                "toast_rs.install(accel=True): per-kernel dispatch is not supported with "
                f"accel ({', '.join(sorted(dispatch))}): every kernel runs on {backend!r}, "
                "where TOAST's device data are"
            )
        node_procs, node_rank = _accel.node_layout()
        placed = _accel.assign_device(backend, node_procs, node_rank, device)
        options = _accel.plugin_options(backend, placed["device"])
    try:
        runtime = _native.Runtime(backend, dict(dispatch), explicit, fallback, bool(accel),
                                  options)
    except RuntimeError as e:
        if options is None:
            raise
        # Say which device option the backend was opened with and where its
        # parts came from (the failure may be the option's or another's).
        src = f"device {placed['device']} from {placed['how']}"
        if os.environ.get("TOAST_RS_OPENCL_PLATFORM", "").strip():
            src += ", platform from TOAST_RS_OPENCL_PLATFORM"
        raise RuntimeError(f"{e} [opened with option {options!r}: {src}]") from None
    if accel:
        limit, how = _accel.memory_limit(_accel.env_mem_gb(), placed["sharing"],
                                         "TOAST_GPU_MEM_GB")
        runtime.accel_set_limit(limit, how)
    try:
        from toast.timing import function_timer
    except ImportError:  # pragma: no cover - TOAST always has it

        def function_timer(f):
            return f

    with _lock:
        if _runtime is not None:
            _restore(registry)
        chosen = {}
        stats = runtime.stats()
        for name in sorted(n for n in registry if isinstance(registry[n], dict)):
            entries = registry[name]
            _saved[name] = {k: entries[k] for k in (impl.DEFAULT, impl.COMPILED) if k in entries}
            if impl.DEFAULT not in entries:
                continue
            sig = inspect.signature(entries[impl.DEFAULT]) if name in KERNELS else None
            for k, toast_fn in _saved[name].items():
                if name in KERNELS:
                    # The timer TOAST wraps its own kernels in, for like-for-like timing reports.
                    entries[k] = function_timer(_ours(name, runtime, toast_fn, sig))
                else:
                    entries[k] = _counted(name, toast_fn)
            chosen[name] = stats[name]["backend"] if name in KERNELS else "toast"
        _runtime = runtime
        _toast_uses.clear()
        _install_args.clear()
        _install_args.update(backend=backend, backend_path=backend_path, accel=bool(accel))
        if accel:
            _accel._device.clear()
            _accel._device.update(placed, backend=backend)

            def reinstall(dev: int) -> Any:
                install(backend, backend_path=backend_path, accel=True, device=dev)
                return _runtime

            _accel.enable(runtime, reinstall)
    return chosen


def _restore(registry) -> None:
    _accel.disable()
    if _runtime is not None and _runtime.accel():
        _runtime.accel_clear()
    for name, impls in _saved.items():
        registry[name].update(impls)
    _saved.clear()


def uninstall() -> None:
    """Put TOAST's own kernel implementations (and, after ``accel=True``, its
    accelerator layer) back; frees the device buffers. A no-op if not
    installed."""
    global _runtime
    with _lock:
        if _runtime is None:
            return
        registry, _ = _toast_registry()
        _restore(registry)
        _runtime = None


def installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _runtime is not None


def stats() -> Dict[str, Dict[str, Any]]:
    """Kernel use since :func:`install`, keyed by TOAST registry name.

    Each value has ``calls`` and ``seconds`` (our calls, including the
    argument checks and any device copies), ``accel_calls`` (of those, the
    ``use_accel=True`` calls that ran on device-resident data, with
    ``accel=True``), ``backend`` (the toast-rs backend
    that runs it, or ``"toast"`` for a kernel toast-rs does not implement),
    ``ours`` (whether toast-rs implements it), ``toast_calls`` and
    ``toast_seconds`` (calls that ran TOAST's implementation: its kernels we
    lack, and ``use_accel=True`` calls), and ``fallbacks`` (backends passed
    over for this kernel, with why).
    """
    if _runtime is None:
        return {}
    out: Dict[str, Dict[str, Any]] = {}
    for name, s in _runtime.stats().items():
        s["ours"] = True
        out[name] = s
    for name in _saved:
        if name not in out:
            out[name] = {"calls": 0, "accel_calls": 0, "seconds": 0.0, "backend": "toast",
                         "ours": False, "fallbacks": []}
    for name, s in out.items():
        calls, seconds = _toast_uses.get(name, (0, 0.0))
        s["toast_calls"] = calls
        s["toast_seconds"] = seconds
    return dict(sorted(out.items()))


def accel_stats() -> Dict[str, Any]:
    """Data movement since :func:`install` with ``accel=True`` (else ``{}``).

    ``ops``: per TOAST staging operation (``create``, ``update_device``,
    ``update_host``, ``reset``, ``delete``) its ``calls`` and ``bytes``;
    ``by_name``: per buffer name TOAST gave (``<obs>_<field>`` style names
    for detector data) ``h2d_calls``, ``h2d_bytes``, ``d2h_calls``,
    ``d2h_bytes``; ``kernel_staging``: the small arrays TOAST maps per kernel
    call (``global2local``, ``hit_submaps``), ``h2d`` and ``d2h``;
    ``h2d_bytes`` / ``d2h_bytes``: totals each way; ``device_bytes``,
    ``peak_device_bytes``, ``buffers``: the table now; ``limit_bytes`` and
    ``limit``: the memory limit; ``device``: the device and how it was
    chosen; ``transfers``: the plugin's own counts (allocs, copies, bytes).
    """
    if _runtime is None or not _runtime.accel():
        return {}
    s = dict(_runtime.accel_stats())
    s["device"] = dict(_accel._device)
    s["transfers"] = dict(_runtime.transfers())
    return s


def reset_stats() -> None:
    """Zero the counts of :func:`stats`."""
    if _runtime is not None:
        _runtime.reset_stats()
    _toast_uses.clear()


def format_stats(s: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """:func:`stats` as a table."""
    s = stats() if s is None else s
    lines = [f"{'kernel':<28} {'backend':<8} {'calls':>8} {'accel':>8} {'seconds':>10} "
             f"{'toast calls':>12}"]
    for name, u in s.items():
        lines.append(
            f"{name:<28} {u['backend']:<8} {u['calls']:>8} {u.get('accel_calls', 0):>8} "
            f"{u['seconds']:>10.4f} {u['toast_calls']:>12}"
        )
    a = accel_stats()
    if a:
        lines.append(
            f"device data ({a['device'].get('backend')} device {a['device'].get('device')}): "
            f"{a['h2d_bytes']} bytes to the device, {a['d2h_bytes']} bytes back; "
            f"peak {a['peak_device_bytes']} bytes"
        )
        for op, m in a["ops"].items():
            lines.append(f"  {op:<14} {m['calls']:>8} calls {m['bytes']:>14} bytes")
        for way in ("h2d", "d2h"):
            m = a["kernel_staging"][way]
            if m["calls"]:
                lines.append(f"  kernel {way:<7} {m['calls']:>8} calls {m['bytes']:>14} bytes")
    return "\n".join(lines)


__all__ = ["KERNELS", "install", "uninstall", "installed", "stats", "accel_stats", "reset_stats",
           "format_stats"]
