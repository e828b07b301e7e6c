"""Compare the maps two toast_benchmark_satellite runs wrote.

    python python/tests/compare_maps.py DIR_A DIR_B [--tolerance 1e-9]

For every ``*.fits`` map in DIR_A (searched recursively) with a namesake in
DIR_B: the RMS of the difference over the pixels both observed, relative to
the RMS of DIR_A's map. Exit status 1 if any exceeds the tolerance or no map
was compared.
"""

import argparse
import sys
from pathlib import Path

import healpy as hp
import numpy as np


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--tolerance", type=float, default=1e-9)
    a = p.parse_args()
    worst = 0.0
    n = 0
    for fa in sorted(Path(a.a).rglob("*.fits")):
        fb = Path(a.b) / fa.relative_to(a.a)
        if not fb.exists():
            continue
        ma = np.atleast_2d(hp.read_map(str(fa), field=None, nest=True, dtype=np.float64))
        mb = np.atleast_2d(hp.read_map(str(fb), field=None, nest=True, dtype=np.float64))
        good = (ma != hp.UNSEEN) & (mb != hp.UNSEEN) & np.isfinite(ma) & np.isfinite(mb)
        same_mask = np.array_equal(ma == hp.UNSEEN, mb == hp.UNSEEN)
        rms = np.sqrt(np.mean(ma[good] ** 2)) if good.any() else 0.0
        diff = np.sqrt(np.mean((ma[good] - mb[good]) ** 2)) if good.any() else 0.0
        rel = diff / rms if rms > 0 else diff
        worst = max(worst, rel)
        n += 1
        print(f"{fa.relative_to(a.a)}: rms {rms:.6e}, rms diff {diff:.3e}, relative {rel:.3e}, "
              f"same observed pixels: {same_mask}")
        if not same_mask:
            worst = max(worst, np.inf)
    print(f"{n} maps compared, worst relative rms difference {worst:.3e}")
    return 0 if n > 0 and worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
