#!/usr/bin/env python3
# Copyright (c) toast-rs contributors. BSD-2-Clause.
"""Time TOAST 3.0.6's compiled kernels on the workload of ``toast-cli bench kernels``.

Measures every row of ``timings.md``: each kernel of ``toast._libtoast`` (CPU
path, ``use_accel=False``) called from Python on the workload described
there, best of ``--repeats`` wall-clock times, divided by the number of
detector samples inside the intervals (per amplitude for
template_offset_apply_diag_precond; per detector sample of its own workload
for filter_poly2D, see below).

Usage:
    python time_toast_kernels.py [--repeats 5] [--threads 2,1] [--rows KEY,...]
                                 [--json FILE]

Without ``--worker`` the script runs itself once per thread count in a child
process with ``OMP_NUM_THREADS`` set (libgomp reads it when it loads), then
prints the rows of the table in timings.md (and writes them as JSON with
``--json``). The keys are those of ``toast-cli/src/cmd/bench/reference.rs``.

The workload is synthesised as ``toast-cli/src/cmd/bench/workload.rs`` does
(same scan, focal plane, intervals, flag fractions, map layout, offset
step), with numpy's generator for the random parts: the same workload, not
the same random bits, which the timings do not depend on. The inputs of the
later kernels are the outputs of the earlier ones, as in the bench.

The rows of the four kernels added last, as TOAST's operators call them:
* cov_accum_diag_hits / cov_accum_diag_invnpp (CovarianceAndHits): one call
  per detector over its in-interval samples, submap and pixel from the NEST
  pixels, samples with a shared or detector flag at -1, nnz = 3 weights,
  scale = det_scale; into the local hit map / covariance of the hit submaps.
* filter_polynomial (PolyFilter): order 3, one call per detector (its own
  flags: shared | detector), the 10 intervals as scans; in place.
* filter_poly2D (PolyFilter2D): order 7 (64 modes, PolyFilter2D's
  (order + 1)^2), the n_det detectors in 2 groups (alternating), templates
  x^i y^j of the detector positions, over the first 1000 in-interval samples
  (a 64-mode least-squares solve per sample and group is far costlier than
  the other kernels per sample: the full workload would take minutes).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

ROWS = [
    ("pointing_detector", "pointing_detector"),
    ("pixels_healpix_nest", "pixels_healpix (NEST, nside 2048)"),
    ("pixels_healpix_ring", "pixels_healpix (RING, nside 2048)"),
    ("stokes_weights_iqu", "stokes_weights_IQU (no HWP)"),
    ("stokes_weights_iqu_hwp", "stokes_weights_IQU (HWP)"),
    ("stokes_weights_i", "stokes_weights_I"),
    ("scan_map_f64", "scan_map (float64, nnz=3, add)"),
    ("scan_map_f32", "scan_map (float32, nnz=3, add)"),
    ("build_noise_weighted", "build_noise_weighted (nnz=3, det+shared flags)"),
    ("noise_weight", "noise_weight"),
    ("template_offset_add_to_signal", "template_offset_add_to_signal (step 200, 50 calls)"),
    ("template_offset_project_signal", "template_offset_project_signal (step 200, 50 calls)"),
    ("template_offset_apply_diag_precond", "template_offset_apply_diag_precond (n_amp=47500) (per amplitude)"),
    ("template_offset_apply_diag_precond_large",
     "template_offset_apply_diag_precond (n_amp=10000000) (per amplitude)"),
    ("cov_accum_diag_hits", "cov_accum_diag_hits (nside 2048, 50 calls)"),
    ("cov_accum_diag_invnpp", "cov_accum_diag_invnpp (nnz=3, nside 2048, 50 calls)"),
    ("filter_polynomial", "filter_polynomial (order 3, 10 scans, 50 calls)"),
    ("filter_poly2D", "filter_poly2D (64 modes, 2 groups, 1000 samples)"),
]

N_DET, N_SAMP, NSIDE = 50, 200_000, 2048
SAMPLE_RATE, SPIN_PERIOD, OPENING_DEG = 200.0, 60.0, 85.0
PRECESSION_DEG, PRECESSION_PERIOD, HWP_RATE = 55.0, 1200.0, 2.0
DET_SPACING_DEG, N_INTERVALS, STEP = 2.0, 10, 200
FLAG_FRACTION = 0.01
PRECOND_LARGE = 10_000_000
POLY_ORDER = 3
POLY2D_ORDER, POLY2D_GROUPS, POLY2D_SAMPLES = 7, 2, 1000


def worker(args):
    import numpy as np
    import toast.qarray as qa
    from toast import _libtoast as lt
    from toast.intervals import interval_dtype

    rng = np.random.default_rng(20261124)
    wanted = set(args.rows.split(",")) if args.rows else None
    results = {}

    def best(key, f, units):
        t = math.inf
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            f()
            t = min(t, time.perf_counter() - t0)
        if wanted is None or key in wanted:
            results[key] = {"best_ms": 1e3 * t, "ns": 1e9 * t / units}
        print(f"  {key}: {1e3 * t:.2f} ms", file=sys.stderr, flush=True)

    # Intervals: 95 % of each tenth of the samples, centred.
    block = N_SAMP // N_INTERVALS
    gap = block // 20
    spans = [(k * block + gap // 2, k * block + gap // 2 + block - gap) for k in range(N_INTERVALS)]
    iv = np.zeros(len(spans), dtype=interval_dtype)
    for i, (a, b) in enumerate(spans):
        iv[i]["first"], iv[i]["last"] = a, b
        iv[i]["start"], iv[i]["stop"] = a / SAMPLE_RATE, (b - 1) / SAMPLE_RATE
    n_in = sum(b - a for a, b in spans)
    units = N_DET * n_in
    inside = np.zeros(N_SAMP, dtype=bool)
    for a, b in spans:
        inside[a:b] = True

    # Boresight: spin axis precessing about the anti-sun direction.
    zaxis, yaxis = np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 0.0])
    t = np.arange(N_SAMP) / SAMPLE_RATE
    prec = qa.rotation(zaxis, 2 * np.pi * t / PRECESSION_PERIOD)
    spin = qa.rotation(zaxis, 2 * np.pi * t / SPIN_PERIOD)
    fixed = qa.mult(qa.rotation(yaxis, np.pi / 2), prec)
    fixed = qa.mult(fixed, qa.rotation(yaxis, np.radians(PRECESSION_DEG)))
    bore = qa.mult(qa.mult(fixed, spin), qa.rotation(yaxis, np.radians(OPENING_DEG)))
    boresight = np.ascontiguousarray(qa.norm(bore))

    ncol = max(int(math.ceil(math.sqrt(2.0 * N_DET))), 1)
    nrow = -(-N_DET // ncol)
    fp, gamma, xs, ys = [], [], [], []
    for d in range(N_DET):
        x = (d % ncol) - 0.5 * (ncol - 1)
        y = (d // ncol) - 0.5 * (nrow - 1)
        theta = math.radians(DET_SPACING_DEG * math.hypot(x, y))
        phi = math.atan2(y, x)
        psi = (d % 4) * math.pi / 4
        q = qa.mult(qa.mult(qa.mult(qa.rotation(zaxis, phi), qa.rotation(yaxis, theta)),
                            qa.rotation(zaxis, -phi)), qa.rotation(zaxis, psi))
        fp.append(qa.norm(q))
        gamma.append(psi)
        xs.append(x / max(ncol, 1))
        ys.append(y / max(nrow, 1))
    focalplane = np.ascontiguousarray(np.array(fp))
    gamma = np.array(gamma)

    def bursts(n_rows, n, length):
        per_row = max(int(round(FLAG_FRACTION * n / length)), 1)
        f = np.zeros((n_rows, n), dtype=np.uint8)
        for r in range(n_rows):
            for s in rng.integers(0, n - length + 1, per_row):
                f[r, s:s + length] = 1
        return f

    shared_flags = bursts(1, N_SAMP, min(100, block // 10))[0]
    det_flags = bursts(N_DET, N_SAMP, min(20, block // 10))
    hwp = np.mod(2 * np.pi * HWP_RATE * np.arange(N_SAMP) / SAMPLE_RATE, 2 * np.pi)
    epsilon = rng.uniform(0.0, 0.01, N_DET)
    cal = rng.uniform(0.95, 1.05, N_DET)
    det_scale = rng.uniform(0.5, 1.5, N_DET)
    noise_weights = rng.uniform(0.999, 1.001, N_DET)
    rows = np.arange(N_DET, dtype=np.int32)
    nside_submap = min(NSIDE, 16)
    n_submap = 12 * nside_submap**2
    n_pix_submap = (NSIDE // nside_submap) ** 2

    quats = np.zeros((N_DET, N_SAMP, 4))
    best("pointing_detector",
         lambda: lt.pointing_detector(focalplane, boresight, rows, quats, iv, shared_flags, 1, False),
         units)
    pixels = np.full((N_DET, N_SAMP), -1, dtype=np.int64)
    hits = np.zeros(n_submap, dtype=np.uint8)
    best("pixels_healpix_ring",
         lambda: lt.pixels_healpix(rows, quats, shared_flags, 1, rows, pixels, iv, hits,
                                   n_pix_submap, NSIDE, False, False), units)
    hits[:] = 0
    best("pixels_healpix_nest",
         lambda: lt.pixels_healpix(rows, quats, shared_flags, 1, rows, pixels, iv, hits,
                                   n_pix_submap, NSIDE, True, False), units)
    weights = np.zeros((N_DET, N_SAMP, 3))
    best("stokes_weights_iqu_hwp",
         lambda: lt.stokes_weights_IQU(rows, quats, rows, weights, hwp, iv, epsilon, gamma, cal,
                                       False, False), units)
    nohwp = np.zeros(1)
    best("stokes_weights_iqu",
         lambda: lt.stokes_weights_IQU(rows, quats, rows, weights, nohwp, iv, epsilon, gamma, cal,
                                       False, False), units)
    del quats
    weights_i = np.zeros((N_DET, N_SAMP))
    best("stokes_weights_i", lambda: lt.stokes_weights_I(rows, weights_i, iv, cal, False), units)
    del weights_i

    g2l = np.full(n_submap, -1, dtype=np.int64)
    hit_idx = np.nonzero(hits)[0]
    n_local = len(hit_idx)
    g2l[hit_idx] = np.arange(n_local)
    mapdata = rng.uniform(-1.0, 1.0, (n_local, n_pix_submap, 3))
    det_data = np.zeros((N_DET, N_SAMP))
    best("scan_map_f64",
         lambda: lt.ops_scan_map_float64(g2l, n_pix_submap, mapdata, det_data, rows, pixels, rows,
                                         weights, rows, iv, 1.0, False, False, False, False), units)
    map32 = mapdata.astype(np.float32)
    best("scan_map_f32",
         lambda: lt.ops_scan_map_float32(g2l, n_pix_submap, map32, det_data, rows, pixels, rows,
                                         weights, rows, iv, 1.0, False, False, False, False), units)
    del map32
    zmap = mapdata
    zmap[:] = 0.0
    best("build_noise_weighted",
         lambda: lt.build_noise_weighted(g2l, zmap, rows, pixels, rows, weights, rows, det_data,
                                         rows, det_flags, det_scale, 1, iv, shared_flags, 1, False),
         units)
    del zmap, mapdata
    best("noise_weight", lambda: lt.noise_weight(det_data, rows, iv, noise_weights, False), units)

    n_amp_views = np.array([-(-(b - a) // STEP) for a, b in spans], dtype=np.int64)
    per_det = int(n_amp_views.sum())
    amp_offset = [d * per_det for d in range(N_DET)]
    n_amp = N_DET * per_det
    amplitudes = rng.normal(size=n_amp)
    amp_flags = (rng.random(n_amp) < FLAG_FRACTION).astype(np.uint8)
    offset_var = np.repeat(1.0 / (det_scale * STEP), per_det)

    def add_all():
        for d in range(N_DET):
            lt.template_offset_add_to_signal(STEP, amp_offset[d], n_amp_views, amplitudes,
                                             amp_flags, d, det_data, iv, False)

    def project_all():
        for d in range(N_DET):
            lt.template_offset_project_signal(d, det_data, d, det_flags, 1, STEP, amp_offset[d],
                                              n_amp_views, amplitudes, amp_flags, iv, False)

    best("template_offset_add_to_signal", add_all, units)
    best("template_offset_project_signal", project_all, units)
    out = np.zeros(n_amp)
    best("template_offset_apply_diag_precond",
         lambda: lt.template_offset_apply_diag_precond(offset_var, amplitudes, amp_flags, out,
                                                       False), n_amp)
    big_var = rng.uniform(1e-3, 1e-2, PRECOND_LARGE)
    big_amp = rng.uniform(-1.0, 1.0, PRECOND_LARGE)
    big_flags = (rng.random(PRECOND_LARGE) < FLAG_FRACTION).astype(np.uint8)
    big_out = np.zeros(PRECOND_LARGE)
    best("template_offset_apply_diag_precond_large",
         lambda: lt.template_offset_apply_diag_precond(big_var, big_amp, big_flags, big_out,
                                                       False), PRECOND_LARGE)
    del big_var, big_amp, big_flags, big_out

    # CovarianceAndHits: per detector, its in-interval samples.
    submaps, subpixs, wts = [], [], []
    for d in range(N_DET):
        pix = pixels[d, inside]
        sm = np.where(pix >= 0, g2l[np.maximum(pix, 0) // n_pix_submap], -1)
        px = np.where(pix >= 0, pix % n_pix_submap, -1)
        bad = ((shared_flags[inside] | det_flags[d, inside]) & 1) != 0
        px[bad] = -1
        submaps.append(np.ascontiguousarray(sm, dtype=np.int64))
        subpixs.append(np.ascontiguousarray(px, dtype=np.int64))
        wts.append(np.ascontiguousarray(weights[d, inside].reshape(-1)))
    del pixels, weights
    hitmap = np.zeros(n_local * n_pix_submap, dtype=np.int64)

    def hits_all():
        for d in range(N_DET):
            lt.cov_accum_diag_hits(n_local, n_pix_submap, 3, submaps[d], subpixs[d], hitmap, False)

    best("cov_accum_diag_hits", hits_all, units)
    del hitmap
    invnpp = np.zeros(n_local * n_pix_submap * 6)

    def invnpp_all():
        for d in range(N_DET):
            lt.cov_accum_diag_invnpp(n_local, n_pix_submap, 3, submaps[d], subpixs[d], wts[d],
                                     float(det_scale[d]), invnpp, False)

    best("cov_accum_diag_invnpp", invnpp_all, units)
    del invnpp, submaps, subpixs, wts

    # PolyFilter: per detector, its own flags, the intervals as scans.
    starts = np.array([a for a, _ in spans], dtype=np.int64)
    stops = np.array([b for _, b in spans], dtype=np.int64)
    flags = [np.ascontiguousarray((shared_flags | det_flags[d]) & 1) for d in range(N_DET)]

    def poly_all():
        for d in range(N_DET):
            lt.filter_polynomial(POLY_ORDER, flags[d], [det_data[d]], starts, stops, False)

    best("filter_polynomial", poly_all, units)

    # PolyFilter2D: (order + 1)^2 modes x^i y^j of the detector positions.
    x, y = np.array(xs), np.array(ys)
    templates = np.ascontiguousarray(np.stack(
        [x**i * y**j for i in range(POLY2D_ORDER + 1) for j in range(POLY2D_ORDER + 1)], axis=1))
    n_mode = templates.shape[1]
    det_groups = (np.arange(N_DET) % POLY2D_GROUPS).astype(np.int32)
    samples = np.nonzero(inside)[0][:POLY2D_SAMPLES]
    masks = np.ascontiguousarray(
        (((shared_flags[samples][:, None] | det_flags[:, samples].T) & 1) == 0).astype(np.uint8))
    signals = np.ascontiguousarray(det_data[:, samples].T * masks)
    coeff = np.zeros((len(samples), POLY2D_GROUPS, n_mode))
    best("filter_poly2D",
         lambda: lt.filter_poly2D(det_groups, templates, signals, masks, coeff, False),
         N_DET * len(samples))

    meta = {"n_local_submap": int(n_local), "n_amp": int(n_amp), "n_in": int(n_in)}
    json.dump({"results": results, "meta": meta}, sys.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="2,1", help="comma-separated OMP_NUM_THREADS values")
    p.add_argument("--rows", default="", help="comma-separated keys to report (default: all)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    by_threads = {}
    for n in [int(s) for s in args.threads.split(",")]:
        env = dict(os.environ, OMP_NUM_THREADS=str(n))
        cmd = [sys.executable, __file__, "--worker", "--repeats", str(args.repeats)]
        if args.rows:
            cmd += ["--rows", args.rows]
        print(f"OMP_NUM_THREADS={n}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=True)
        by_threads[n] = json.loads(r.stdout)
    threads = list(by_threads)
    head = "| kernel |" + "".join(f" best ms ({n} thr) | ns/sample/det ({n} thr) |" for n in threads)
    print(head)
    print("|---|" + "---:|---:|" * len(threads))
    for key, label in ROWS:
        if all(key in by_threads[n]["results"] for n in threads):
            cells = "".join(f" {by_threads[n]['results'][key]['best_ms']:.2f} |"
                            f" {by_threads[n]['results'][key]['ns']:.3f} |" for n in threads)
            print(f"| {label} |{cells}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(n): v for n, v in by_threads.items()}, f, indent=1)


if __name__ == "__main__":
    main()
