"""``python -m toast_rs --backend NAME [--accel] SCRIPT_OR_ENTRY_POINT [ARGS...]``.

Runs a TOAST script (a path) or console entry point (e.g.
``toast_benchmark_satellite``) unchanged, with toast-rs kernels installed in
TOAST's registry, and prints the kernel statistics at exit. ``--accel`` (or
``TOAST_RS_ACCEL=1`` in the environment) makes toast-rs TOAST's accelerator
(``install(..., accel=True)``): TOAST's pipelines then stage their data on
the backend's device and run the kernels there.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from importlib import metadata

import toast_rs


def _entry_point(name: str):
    try:
        eps = metadata.entry_points(group="console_scripts")
    except TypeError:  # Python < 3.10
        eps = metadata.entry_points().get("console_scripts", [])
    for ep in eps:
        if ep.name == name:
            return ep
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m toast_rs",
        description="Run a TOAST script or entry point on toast-rs backends.",
    )
    p.add_argument("--backend", default="cpu", help="backend of every kernel (default: cpu)")
    p.add_argument(
        "--dispatch",
        action="append",
        default=[],
        metavar="KERNEL=BACKEND",
        help="per-kernel backend, by TOAST registry name (repeatable)",
    )
    p.add_argument("--backend-path", action="append", default=None, help="plugin file or directory")
    p.add_argument("--accel", action="store_true", default=None,
                   help="be TOAST's accelerator (default: TOAST_RS_ACCEL=1 in the environment)")
    p.add_argument("--device", type=int, default=None,
                   help="with --accel: the device index (default: from the node-local rank)")
    p.add_argument("--stats-json", metavar="FILE", help="also write the statistics to FILE as JSON")
    p.add_argument("--quiet-stats", action="store_true", help="do not print the statistics")
    p.add_argument("target", help="a script path or a console entry point name")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)

    dispatch = {}
    for d in a.dispatch:
        k, sep, b = d.partition("=")
        if not sep or not k or not b:
            p.error(f"--dispatch {d!r}: expected KERNEL=BACKEND")
        dispatch[k] = b
    try:
        chosen = toast_rs.install(a.backend, backend_path=a.backend_path, accel=a.accel,
                                  device=a.device, **dispatch)
    except (ValueError, RuntimeError) as e:
        print(f"toast_rs: {e}", file=sys.stderr)
        return 3 if isinstance(e, RuntimeError) else 2
    ours = sorted(k for k, b in chosen.items() if b != "toast")
    accel = toast_rs.accel_stats()
    on = (f"; TOAST's accelerator: {a.backend} device {accel['device']['device']} "
          f"({accel['device']['how']})") if accel else ""
    print(f"toast_rs: {len(ours)} kernels on toast-rs ({a.backend}); TOAST's own: "
          f"{', '.join(sorted(k for k, b in chosen.items() if b == 'toast')) or 'none'}{on}",
          file=sys.stderr)

    status = 0
    sys.argv = [a.target] + a.args
    try:
        if os.path.isfile(a.target):
            sys.path.insert(0, os.path.dirname(os.path.abspath(a.target)))
            runpy.run_path(a.target, run_name="__main__")
        else:
            ep = _entry_point(a.target)
            if ep is None:
                print(f"toast_rs: {a.target!r} is neither a file nor a console entry point",
                      file=sys.stderr)
                return 2
            result = ep.load()()
            status = result if isinstance(result, int) else 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        s = toast_rs.stats()
        if not a.quiet_stats:
            print("toast_rs kernel statistics:", file=sys.stderr)
            print(toast_rs.format_stats(s), file=sys.stderr)
        if a.stats_json:
            accel = toast_rs.accel_stats()
            if accel:
                # The kernels' table, and the data movement beside it.
                s = {"kernels": s, "accel": accel}
            with open(a.stats_json, "w") as f:
                json.dump(s, f, indent=1, sort_keys=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
