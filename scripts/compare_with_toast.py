#!/usr/bin/env python3
"""Compare a toast-cli run's maps with TOAST 3.0.6's (toast_benchmark_satellite).

Usage (with the healpy/numpy of a TOAST environment):

    env/bin/python scripts/compare_with_toast.py TOAST_OUT_DIR OURS_OUT_DIR \
        [--file mapmaker_map.fits] [--tol-i 0.02] [--tol-qu 0.05] [--min-overlap 0.95]
        [--exact-hits]

Both directories hold `mapmaker_map.fits` and `mapmaker_hits.fits` (NEST,
nside 1024). Reported, for the destriped map:

* hits: total of each side, whether they are equal, and the number of
  pixels whose hit counts differ (`hits_differing_pixels`, 0 when the hit
  maps are identical pixel for pixel);
* hit-pixel overlap: |hit_T ∩ hit_R| / |hit_T ∪ hit_R| (hits > 0);
* kept pixels: non-zero map pixels (TOAST writes cut and unhit pixels as 0);
  kept-pixel overlap the same way;
* on the pixels both maps keep, for I, Q, U: RMS of the difference relative
  to the RMS of TOAST's map on those pixels.

Exit status 0 when overlaps ≥ min-overlap, the relative RMS differences
are within tol-i (I) and tol-qu (Q, U) and, with --exact-hits, the hit maps
are identical; 1 otherwise. With TOAST's input sky and the default settings
our maps agree with TOAST's to float rounding:

    env/bin/python scripts/compare_with_toast.py TOAST_DIR OURS_DIR \
        --exact-hits --tol-i 1e-6 --tol-qu 1e-6
"""

import argparse
import json
import os
import sys

import healpy as hp
import numpy as np


def read(d, name, fields):
    return hp.read_map(os.path.join(d, name), field=fields, nest=True, dtype=np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("toast_dir")
    ap.add_argument("ours_dir")
    ap.add_argument("--file", default="mapmaker_map.fits")
    ap.add_argument("--tol-i", type=float, default=0.02)
    ap.add_argument("--tol-qu", type=float, default=0.05)
    ap.add_argument("--min-overlap", type=float, default=0.95)
    ap.add_argument("--exact-hits", action="store_true", help="require identical hit maps")
    ap.add_argument("--json", help="write the numbers to this file")
    a = ap.parse_args()

    ht = read(a.toast_dir, "mapmaker_hits.fits", None)
    hr = read(a.ours_dir, "mapmaker_hits.fits", None)
    mt = np.array(read(a.toast_dir, a.file, (0, 1, 2)))
    mr = np.array(read(a.ours_dir, a.file, (0, 1, 2)))
    out = {}
    out["hits_toast"] = int(ht.sum())
    out["hits_ours"] = int(hr.sum())
    out["hits_differing_pixels"] = int((ht != hr).sum())
    hit_t, hit_r = ht > 0, hr > 0
    out["hit_pixels_toast"] = int(hit_t.sum())
    out["hit_pixels_ours"] = int(hit_r.sum())
    out["hit_overlap"] = float((hit_t & hit_r).sum() / max(1, (hit_t | hit_r).sum()))
    keep_t = np.any(mt != 0, axis=0)
    keep_r = np.any(mr != 0, axis=0)
    both = keep_t & keep_r
    out["kept_pixels_toast"] = int(keep_t.sum())
    out["kept_pixels_ours"] = int(keep_r.sum())
    out["kept_overlap"] = float(both.sum() / max(1, (keep_t | keep_r).sum()))
    out["kept_both"] = int(both.sum())
    ok = out["hit_overlap"] >= a.min_overlap
    if a.exact_hits:
        ok = ok and out["hits_differing_pixels"] == 0
    for k, c in enumerate("IQU"):
        t = mt[k][both]
        r = mr[k][both]
        # RMS of the difference relative to the RMS of TOAST's map, on the
        # common pixels. Also reported: the same after removing each map's
        # mean (the destriped map's monopole is poorly constrained).
        rms_t = float(np.sqrt(np.mean(t**2)))
        rel = float(np.sqrt(np.mean((r - t) ** 2)) / rms_t) if rms_t > 0 else float("inf")
        d = (r - r.mean()) - (t - t.mean())
        rms_t0 = float(np.std(t))
        rel0 = float(np.sqrt(np.mean(d**2)) / rms_t0) if rms_t0 > 0 else float("inf")
        out[f"rms_toast_{c}"] = rms_t
        out[f"rel_rms_diff_{c}"] = rel
        out[f"rel_rms_diff_{c}_demeaned"] = rel0
        out[f"mean_diff_{c}"] = float(r.mean() - t.mean())
        tol = a.tol_i if c == "I" else a.tol_qu
        ok = ok and rel <= tol
    # Full-sky statistics as TOAST's stats.json (all pixels, zeros, ddof 1).
    for name, m in (("toast", mt), ("ours", mr)):
        for k, c in enumerate("IQU"):
            out[f"fullsky_rms_{c}_{name}"] = float(np.std(m[k], ddof=1))
    for k, v in out.items():
        print(f"{k:32s} {v}")
    print("PASS" if ok else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
