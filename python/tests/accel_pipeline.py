"""A TOAST pipeline on toast-rs as TOAST's accelerator, against per-call staging.

    python python/tests/accel_pipeline.py --backend opencl [--obs-minutes M] [--pixels P]
        [--json FILE]

Builds TOAST's satellite simulation (``toast.tests.helpers``), an input sky
map, and one TOAST pipeline: detector pointing -> HEALPix pixels -> Stokes
weights -> scan the map into the signal -> binning (the
noise-weighted map, ``BuildNoiseWeighted``) -> noise weight (last: TOAST's
units forbid binning a noise-weighted signal). It runs the pipeline three
times on fresh copies of the same data:

* ``reference``: ``install("cpu")`` (our CPU kernels on host data; equal to
  TOAST's own, as ``run_toast_tests.py`` checks);
* ``staged``: ``install(backend)``: each kernel call copies its arrays to the
  device and back (what ``install`` did before ``accel``);
* ``accel``: ``install(backend, accel=True)``: TOAST's pipeline stages its
  data once (``Data.accel_create`` / ``accel_update_device``), the kernels
  run on the device copies, and the products come back once.

Checks (exit status 1 if one fails): the accel products (the noise-weighted
map, which the signal, pixels and weights all feed, and the noise-weighted
signal) equal the reference's (to 1e-12 relative: the device may sum in
another order); every kernel call of the accel run was on device data;
each detector or shared field of each observation crossed the bus at most
once each way (``max_h2d_per_buffer`` / ``max_d2h_per_buffer`` of
``toast_rs.accel_stats()["by_name"]``; the noise-weighted map crosses back,
is reduced on the host, and goes again: TOAST's BuildNoiseWeighted.finalize). Prints the seconds of each run and
the bytes moved. Timings are wall-clock seconds of ``pipe.apply`` alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def build(obs_minutes: float, pixels_per_process: int):
    import astropy.units as u

    from toast import ops
    from toast.observation import default_values as defaults
    from toast.pixels import PixelData
    from toast.tests.helpers import create_satellite_data

    data = create_satellite_data(
        None, obs_per_group=2, obs_time=obs_minutes * u.minute,
        pixel_per_process=pixels_per_process, flagged_pixels=False,
        flagged_obs=False, flagged_proc=False,
    )
    ops.DefaultNoiseModel().apply(data)
    detpointing = ops.PointingDetectorSimple(quats="quats")
    pixels = ops.PixelsHealpix(nside=64, detector_pointing=detpointing, pixels="pixels")
    weights = ops.StokesWeights(mode="IQU", detector_pointing=detpointing, weights="weights")
    ops.BuildPixelDistribution(pixel_dist="pixel_dist", pixel_pointing=pixels).apply(data)
    # The distribution's pass computed the pointing on the host: drop it, so
    # that the pipeline computes it (on the device with accel).
    for ob in data.obs:
        for key in ("quats", "pixels", "weights"):
            if key in ob.detdata:
                del ob.detdata[key]
    sky = PixelData(data["pixel_dist"], np.float64, n_value=3, units=defaults.det_data_units)
    sky.raw[:] = np.random.default_rng(7).normal(size=len(sky.raw))
    data["sky"] = sky
    for ob in data.obs:
        ob.detdata[defaults.det_data][:] = 0.0
    return data, detpointing, pixels, weights


def pipeline(data, detpointing, pixels, weights):
    from toast import ops
    from toast.observation import default_values as defaults

    operators = [
        detpointing,
        pixels,
        weights,
        ops.ScanMap(map_key="sky", pixels="pixels", weights="weights"),
        ops.BuildNoiseWeighted(
            pixel_dist="pixel_dist", zmap="zmap", pixels="pixels", weights="weights",
            noise_model="noise_model",
        ),
        # Last: TOAST's units forbid binning a noise-weighted signal (1/K),
        # and the pipeline copies back only what no later operator needs.
        ops.NoiseWeight(noise_model="noise_model", det_data=defaults.det_data),
    ]
    # A pipeline's operators must cut the same detectors.
    for op in operators:
        if op.has_trait("det_mask"):
            op.det_mask = defaults.det_mask_invalid
    return ops.Pipeline(operators=operators)


def run(backend: str, accel: bool, obs_minutes: float, pixels_per_process: int):
    import toast_rs
    from toast.observation import default_values as defaults

    data, detpointing, pixels, weights = build(obs_minutes, pixels_per_process)
    toast_rs.install(backend, accel=accel)
    try:
        toast_rs.reset_stats()
        pipe = pipeline(data, detpointing, pixels, weights)
        start = time.perf_counter()
        pipe.apply(data)
        seconds = time.perf_counter() - start
        # The pipeline's products, on the host after its finalize.
        out = {
            "seconds": seconds,
            "zmap": np.array(data["zmap"].raw[:]),
            "signal": [np.array(ob.detdata[defaults.det_data].data) for ob in data.obs],
            "stats": toast_rs.stats(),
            "accel": toast_rs.accel_stats(),
            "n_obs": len(data.obs),
            "shape": data.obs[0].detdata[defaults.det_data].data.shape,
            "transfers": dict(toast_rs._runtime.transfers()),
            "fields": {ob.name: sorted(ob.detdata.keys()) + sorted(ob.shared.keys())
                       for ob in data.obs},
        }
    finally:
        toast_rs.uninstall()
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="opencl")
    p.add_argument("--obs-minutes", type=float, default=10.0)
    p.add_argument("--pixels", type=int, default=1,
                   help="focalplane pixels (two detectors each) per process")
    p.add_argument("--json", help="write the numbers here")
    a = p.parse_args()

    ref = run("cpu", False, a.obs_minutes, a.pixels)
    staged = run(a.backend, False, a.obs_minutes, a.pixels)
    acc = run(a.backend, True, a.obs_minutes, a.pixels)

    failures = []

    def same(name, x, y):
        scale = max(float(np.max(np.abs(x))), 1e-300)
        diff = float(np.max(np.abs(x - y))) if x.size else 0.0
        if diff > 1e-12 * scale:
            failures.append(f"{name}: max difference {diff:.3e} (scale {scale:.3e})")
        return diff

    diffs = {"zmap": same("zmap", acc["zmap"], ref["zmap"])}
    diffs["signal"] = max(same(f"signal[{i}]", x, y)
                          for i, (x, y) in enumerate(zip(acc["signal"], ref["signal"])))
    if not np.any(ref["zmap"]):
        failures.append("the reference map is zero: the check would be empty")
    diffs["staged_zmap"] = same("staged zmap", staged["zmap"], ref["zmap"])

    calls = {k: (s["calls"], s["accel_calls"]) for k, s in acc["stats"].items() if s["calls"]}
    for k, (c, ac) in calls.items():
        if c != ac:
            failures.append(f"{k}: {c - ac} of {c} calls were not on device data")
    by_name = acc["accel"]["by_name"]
    # Detector and shared fields (the maps may cross more: BuildNoiseWeighted's
    # finalize brings the map to the host for its MPI reduction and back).
    fields = set()
    for names in acc["fields"].values():
        fields |= set(names)
    for name, m in by_name.items():
        if name not in fields:
            continue
        if m["max_h2d_per_buffer"] > 1 or m["max_d2h_per_buffer"] > 1:
            failures.append(f"{name}: a buffer crossed {m['max_h2d_per_buffer']} times to "
                            f"the device and {m['max_d2h_per_buffer']} back")

    print(f"backend {a.backend}; {acc['n_obs']} observations of {a.obs_minutes:g} minutes, "
          f"signal {acc['shape']} each")
    print(f"seconds: reference (cpu, host data) {ref['seconds']:.3f}; {a.backend} per-call "
          f"staging {staged['seconds']:.3f}; {a.backend} accel {acc['seconds']:.3f}")
    print(f"max |difference| to the reference: {diffs}")
    print(f"kernel calls (calls, on device data): {calls}")
    print(f"bytes to the device {acc['accel']['h2d_bytes']}, back {acc['accel']['d2h_bytes']}; "
          f"per operation {acc['accel']['ops']}; kernels' own staging "
          f"{acc['accel']['kernel_staging']}")
    print("per buffer name: buffers; to the device: copies, bytes, most copies of one "
          "buffer; back: the same")
    for name, m in sorted(by_name.items()):
        print(f"  {name:<20} {m['buffers']:>3}   {m['h2d_calls']:>3} {m['h2d_bytes']:>12} "
              f"{m['max_h2d_per_buffer']:>2}   {m['d2h_calls']:>3} {m['d2h_bytes']:>12} "
              f"{m['max_d2h_per_buffer']:>2}")
    t = staged["transfers"]
    print(f"per-call staging run: {t['h2d_bytes']} bytes to the device in {t['h2d_calls']} "
          f"copies, {t['d2h_bytes']} back in {t['d2h_calls']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "seconds": {"reference": ref["seconds"],
                       "staged": staged["seconds"], "accel": acc["seconds"]},
                       "diffs": diffs, "calls": calls, "accel": acc["accel"],
                       "staged_transfers": staged["transfers"],
                       "failures": failures}, f, indent=1, default=str)
    for f in failures:
        print(f"FAILED: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
