"""Run TOAST 3 pipelines on toast-rs backends.

``toast_rs.install(backend="cpu", **dispatch)`` replaces the DEFAULT and
COMPILED implementations of the kernels toast-rs has in TOAST's kernel
registry (``toast.accelerator.kernel_registry.registry``) by calls into a
toast-rs backend plugin (cpu, opencl, cuda, hip, or any third-party plugin),
with the positional signatures TOAST calls them with. Every TOAST operator
looks its kernel up in the registry at each call, so an existing pipeline runs
on our backends without a change. ``toast_rs.uninstall()`` puts TOAST's
implementations back.

``use_accel``: TOAST passes ``use_accel=True`` only when its own accelerator
layer (an OpenMP-target build, or JAX) has moved the operator's data to *its*
device; the arrays the kernel receives then stand for device memory that only
TOAST's compiled kernels can address. Such calls go to TOAST's own
implementation, unchanged (counted as ``toast_calls`` in :func:`stats`).
With ``use_accel`` false (always, with the PyPI wheel, which has no
accelerator support) the data are host numpy arrays: the CPU plugin reads
them in place, and a device backend (opencl, cuda, hip) copies them to its
device for the call and copies the outputs back, as toast-rs does for a
kernel call on unstaged data. TOAST's data movement stays TOAST's; ours is
per call.
"""

from __future__ import annotations

import inspect
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Union

from . import _native

__version__ = "0.1.0"

#: TOAST registry names of the kernels toast-rs implements.
KERNELS = tuple(_native.kernels())

_lock = threading.Lock()
_runtime: Optional[Any] = None
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
    if backend_path is None:
        explicit = []
    elif isinstance(backend_path, (str, os.PathLike)):
        explicit = [str(backend_path)]
    else:
        explicit = [str(p) for p in backend_path]
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
    import numpy as np

    a = args[i]
    if isinstance(a, np.ndarray) and a.dtype != np.float64 and a.dtype.kind in "fiu":
        args = args[:i] + (a.astype(np.float64),) + args[i + 1 :]
    return args


# Argument conventions TOAST's Python wrappers apply before the compiled call.
_PREPARE: Dict[str, Callable[[tuple], tuple]] = {
    "build_noise_weighted": lambda args: _as_float64(args, 7),
}


def _ours(name: str, runtime: Any, toast_fn: Callable[..., Any]) -> Callable[..., Any]:
    call = runtime.call
    prepare = _PREPARE.get(name)
    try:
        sig = inspect.signature(toast_fn)
    except (TypeError, ValueError):
        sig = None

    def kernel(*args: Any, use_accel: bool = False, **kwargs: Any) -> None:
        if use_accel:
            # Data on TOAST's own accelerator: only its kernels can run there.
            return _count_toast(name, toast_fn, *args, use_accel=use_accel, **kwargs)
        if kwargs:
            if sig is None:
                raise TypeError(f"toast_rs {name}: keyword arguments {sorted(kwargs)}")
            args = sig.bind(*args, **kwargs).args
        if prepare is not None:
            args = prepare(args)
        call(name, args)

    kernel.__name__ = kernel.__qualname__ = f"{name}_toast_rs"
    kernel.__doc__ = toast_fn.__doc__
    return kernel


def _counted(name: str, toast_fn: Callable[..., Any]) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return _count_toast(name, toast_fn, *args, **kwargs)

    kernel.__name__ = kernel.__qualname__ = f"{name}_toast"
    kernel.__doc__ = toast_fn.__doc__
    return kernel


def install(
    backend: str = "cpu",
    *,
    backend_path: Union[None, str, os.PathLike, Iterable] = None,
    **dispatch: str,
) -> Dict[str, str]:
    """Run TOAST's kernels on toast-rs backends.

    Args:
        backend: the backend of every kernel ("cpu", "opencl", "cuda", "hip",
            or a third-party plugin's name).
        backend_path: plugin files or directories searched first (then
            ``TOAST_BACKEND_PATH``, this package's ``backends/``, the build
            tree's ``target/release``, the system directories).
        **dispatch: per-kernel backends by TOAST registry name, as in the
            ``[dispatch]`` configuration: ``install("cpu", scan_map="opencl")``.

    Returns:
        TOAST registry name -> backend that runs it ("toast" for the kernels
        toast-rs does not implement, which keep TOAST's implementation).

    Raises:
        ValueError: an unknown kernel name in ``dispatch``.
        RuntimeError: a named backend was not found or is unavailable (the
            message says why).
    """
    global _runtime
    registry, impl = _toast_registry()
    explicit, fallback = _search_dirs(backend_path)
    runtime = _native.Runtime(backend, dict(dispatch), explicit, fallback)
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
            for k, toast_fn in _saved[name].items():
                if name in KERNELS:
                    # The timer TOAST wraps its own kernels in, for like-for-like timing reports.
                    entries[k] = function_timer(_ours(name, runtime, toast_fn))
                else:
                    entries[k] = _counted(name, toast_fn)
            chosen[name] = stats[name]["backend"] if name in KERNELS else "toast"
        _runtime = runtime
        _toast_uses.clear()
    return chosen


def _restore(registry) -> None:
    for name, impls in _saved.items():
        registry[name].update(impls)
    _saved.clear()


def uninstall() -> None:
    """Put TOAST's own kernel implementations back (a no-op if not installed)."""
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
    argument checks and any device copies), ``backend`` (the toast-rs backend
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
            out[name] = {"calls": 0, "seconds": 0.0, "backend": "toast", "ours": False, "fallbacks": []}
    for name, s in out.items():
        calls, seconds = _toast_uses.get(name, (0, 0.0))
        s["toast_calls"] = calls
        s["toast_seconds"] = seconds
    return dict(sorted(out.items()))


def reset_stats() -> None:
    """Zero the counts of :func:`stats`."""
    if _runtime is not None:
        _runtime.reset_stats()
    _toast_uses.clear()


def format_stats(s: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """:func:`stats` as a table."""
    s = stats() if s is None else s
    lines = [f"{'kernel':<28} {'backend':<8} {'calls':>8} {'seconds':>10} {'toast calls':>12}"]
    for name, u in s.items():
        lines.append(
            f"{name:<28} {u['backend']:<8} {u['calls']:>8} {u['seconds']:>10.4f} {u['toast_calls']:>12}"
        )
    return "\n".join(lines)


__all__ = ["KERNELS", "install", "uninstall", "installed", "stats", "reset_stats", "format_stats"]
