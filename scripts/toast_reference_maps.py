#!/usr/bin/env python3
"""TOAST 3.0.6's benchmark maps at a low resolution, for toast-cli's test
`tiny_maps_match_toast` (toast-cli/tests/run.rs).

Runs `toast_benchmark_satellite --case tiny` in this process, unchanged
except that the map resolution (hard-coded to nside 1024 in the script's
`parse_arguments`) is set to NSIDE, and that the input sky is TOAST's own
`fake_input_sky_nside1024.fits` degraded to NSIDE (healpy `ud_grade`, NEST),
written under the name the benchmark looks for, so that it scans it instead
of synthesising one. Everything else (schedule, focal plane, telescope
"satellite", noise, map-maker settings) is the benchmark's.

Writes, under toast-cli/tests/data/:

* toast_tiny_sky_nside{NSIDE}.fits: the degraded sky on the pixels the run
  hits only (healpy partial map, explicit indexing), the input of the test;
* toast_tiny_maps_nside{NSIDE}.txt: for each hit pixel (NEST), TOAST's hits
  and its destriped map I, Q, U (`mapmaker_map.fits`, float32, printed with
  9 significant digits, which round-trips).

    env/bin/python scripts/toast_reference_maps.py SKY_NSIDE1024_FITS WORKDIR [--nside 32]

(SKY_NSIDE1024_FITS: the file toast_benchmark_satellite writes into its
current directory on a first run.)
"""

import argparse
import os
import sys

import healpy as hp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUTDIR = os.path.join(HERE, "..", "toast-cli", "tests", "data")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sky1024")
    ap.add_argument("workdir")
    ap.add_argument("--nside", type=int, default=32)
    a = ap.parse_args()
    nside = a.nside
    sky1024 = os.path.abspath(a.sky1024)
    os.makedirs(a.workdir, exist_ok=True)
    os.chdir(a.workdir)

    sky = hp.read_map(sky1024, field=(0, 1, 2), nest=True, dtype=np.float64)
    low = hp.ud_grade(np.array(sky), nside, order_in="NEST", order_out="NEST")
    low = np.array(low, dtype=np.float32)
    skyfile = f"fake_input_sky_nside{nside}.fits"
    hp.write_map(
        skyfile, low, nest=True, column_units="K", fits_IDL=False,
        dtype=np.float32, overwrite=True,
    )

    import toast.scripts.toast_benchmark_satellite as tbs

    parse = tbs.parse_arguments

    def parse_low():
        config, args, jobargs = parse()
        args.nside = nside
        args.input_map = skyfile
        return config, args, jobargs

    tbs.parse_arguments = parse_low
    out = os.path.abspath("toast_out")
    sys.argv = ["toast_benchmark_satellite", "--case", "tiny", "--out_dir", out]
    tbs.main()

    hits = hp.read_map(os.path.join(out, "mapmaker_hits.fits"), nest=True, dtype=None)
    maps = hp.read_map(
        os.path.join(out, "mapmaker_map.fits"), field=(0, 1, 2), nest=True, dtype=None
    )
    hit = np.nonzero(hits > 0)[0]
    partial = [np.full(hp.nside2npix(nside), hp.UNSEEN, dtype=np.float32) for _ in range(3)]
    for k in range(3):
        partial[k][hit] = low[k][hit]
    hp.write_map(
        os.path.join(OUTDIR, f"toast_tiny_sky_nside{nside}.fits"), partial, nest=True,
        column_units="K", fits_IDL=False, dtype=np.float32, partial=True, overwrite=True,
    )
    path = os.path.join(OUTDIR, f"toast_tiny_maps_nside{nside}.txt")
    with open(path, "w") as f:
        f.write(
            f"# TOAST 3.0.6 toast_benchmark_satellite --case tiny at nside {nside} "
            "(sky: fake_input_sky_nside1024.fits ud_graded, NEST)\n"
        )
        f.write("# pixel hits I Q U (mapmaker_map.fits, float32; 0 0 0 for cut pixels)\n")
        for p in hit:
            f.write(
                f"{p} {int(hits[p])} "
                + " ".join(f"{float(maps[k][p]):.9g}" for k in range(3))
                + "\n"
            )
    print(f"wrote {len(hit)} hit pixels to {path}")


if __name__ == "__main__":
    main()
