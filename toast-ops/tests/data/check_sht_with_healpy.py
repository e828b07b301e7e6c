#!/usr/bin/env python3
"""Full-map comparison of toast-ops' synthesis with healpy.alm2map.

    env/bin/python toast-ops/tests/data/check_sht_with_healpy.py

Runs the Rust test `write_full_maps_for_healpy_check` (tests/sht_vectors.rs)
with TOAST_OPS_SHT_OUT set to a temporary directory; it writes I, Q, U maps
(RING, float64 FITS) of the deterministic a_lm of make_sht_vectors.py at
nside 64 (lmax 191) and 256 (lmax 767). Every pixel is compared with
healpy.alm2map([T, E, B], pol=True). Exits non-zero above 1e-9 relative.
"""
import os
import subprocess
import sys
import tempfile

import healpy as hp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_sht_vectors import alm_formula  # noqa: E402  (re-generates nothing on import)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def main():
    out = tempfile.mkdtemp(prefix="toast_ops_sht_")
    env = dict(os.environ, TOAST_OPS_SHT_OUT=out)
    subprocess.run(["nice", "-n", "10", "cargo", "test", "--release", "-j2", "-q", "-p",
                    "toast-ops", "--test", "sht_vectors", "write_full_maps_for_healpy_check"],
                   cwd=REPO, env=env, check=True)
    ok = True
    for nside, lmax in [(64, 191), (256, 767)]:
        ref = hp.alm2map([alm_formula(lmax, c) for c in "TEB"], nside, lmax=lmax, pol=True)
        mine = hp.read_map(os.path.join(out, f"rs_alm2map_n{nside}_l{lmax}.fits"),
                           field=None, nest=False)
        for name, a, b in zip("IQU", mine, ref):
            rel = np.max(np.abs(a - b)) / np.max(np.abs(b))
            rms = np.sqrt(np.mean((a - b) ** 2)) / np.sqrt(np.mean(b**2))
            good = rel < 1e-9
            ok &= good
            print(f"{'ok  ' if good else 'FAIL'} nside {nside} lmax {lmax} {name}: "
                  f"max|diff|/max|map| = {rel:.2e}, rms(diff)/rms(map) = {rms:.2e}")
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
