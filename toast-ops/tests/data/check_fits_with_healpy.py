#!/usr/bin/env python3
"""Check that healpy (and astropy) read the FITS maps toast-ops writes.

    env/bin/python toast-ops/tests/data/check_fits_with_healpy.py

Runs the Rust test `write_files_for_healpy_check` (toast-ops/tests/fits_io.rs)
with TOAST_OPS_FITS_OUT set to a temporary directory, then reads the files
with healpy.read_map(f, field=None, nest=True) and compares with the values
the test wrote (same formula as fits_io.rs::test_maps). Exits non-zero on any
mismatch.
"""
import os
import subprocess
import sys
import tempfile

import healpy as hp
import numpy as np
from astropy.io import fits

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NSIDE = 32


def expected_maps():
    p = np.arange(12 * NSIDE**2, dtype=np.int64)
    return [((7 * p + 1000 * f) % 4099) * 0.125 - 256.0 for f in range(3)]


def main():
    out = tempfile.mkdtemp(prefix="toast_ops_fits_")
    env = dict(os.environ, TOAST_OPS_FITS_OUT=out)
    subprocess.run(
        ["nice", "-n", "10", "cargo", "test", "-j2", "-q", "-p", "toast-ops", "--test", "fits_io",
         "write_files_for_healpy_check"],
        cwd=REPO, env=env, check=True)
    exp = expected_maps()
    hits = (np.arange(12 * NSIDE**2) * 13 % 1000).astype(np.int64)
    ok = True

    def check(cond, msg):
        nonlocal ok
        print(("ok   " if cond else "FAIL ") + msg)
        ok &= bool(cond)

    # float32, NESTED: values given in nest order
    f = os.path.join(out, "rs_map_f32_nest.fits")
    m, h = hp.read_map(f, field=None, nest=True, h=True)
    h = dict(h)
    check(m.dtype.kind == "f" and m.dtype.itemsize == 4 and m.shape == (3, 12 * NSIDE**2), f"f32 shape/dtype {m.shape} {m.dtype}")
    d = max(np.max(np.abs(m[i] - exp[i].astype(np.float32))) for i in range(3))
    check(d == 0.0, f"f32 nest values exact (max diff {d})")
    for k, v in [("PIXTYPE", "HEALPIX"), ("ORDERING", "NESTED"), ("NSIDE", NSIDE),
                 ("INDXSCHM", "IMPLICIT"), ("OBJECT", "FULLSKY"), ("FIRSTPIX", 0),
                 ("LASTPIX", 12 * NSIDE**2 - 1), ("TTYPE1", "TEMPERATURE"),
                 ("TTYPE2", "Q_POLARISATION"), ("TTYPE3", "U_POLARISATION"),
                 ("TFORM1", "E"), ("TUNIT1", "K"), ("TUNIT3", "K"), ("NDET", 12),
                 ("NGOOD", 10), ("OPERATOR", "TOAST MapMaker"), ("VERSION", "3.0.6"),
                 ("START", 1.8e9), ("STOP", 1.8e9 + 3600.0)]:
        check(h.get(k) == v, f"header {k} = {h.get(k)!r} (expected {v!r})")
    check(isinstance(h.get("CREATED"), float), f"CREATED = {h.get('CREATED')!r}")

    # float64, RING on disk: ask healpy for nest=True, compare with reorder
    f = os.path.join(out, "rs_map_f64_ring.fits")
    m = hp.read_map(f, field=None, nest=True)
    check(m.dtype.kind == "f" and m.dtype.itemsize == 8, f"f64 dtype {m.dtype}")
    d = max(np.max(np.abs(m[i] - hp.reorder(exp[i], r2n=True))) for i in range(3))
    check(d == 0.0, f"f64 ring->nest values exact (max diff {d})")
    m = hp.read_map(f, field=None, nest=False)
    d = max(np.max(np.abs(m[i] - exp[i])) for i in range(3))
    check(d == 0.0, f"f64 ring values exact (max diff {d})")

    # hits: one int32 column named T
    f = os.path.join(out, "rs_hits_nest.fits")
    m = hp.read_map(f, field=None, nest=True)
    check(m.dtype.kind == "i" and m.dtype.itemsize == 4 and np.array_equal(m, hits), f"hits int32 exact ({m.dtype})")
    with fits.open(f) as hl:
        cols = hl[1].columns
        check(cols.names == ["T"] and cols.formats == ["J"], f"hits column {cols.names} {cols.formats}")
        check(len(hl) == 2 and hl[0].header["NAXIS"] == 0, "empty primary + one extension")
    # astropy's own verification of the FITS structure
    for name in ["rs_map_f32_nest.fits", "rs_map_f64_ring.fits", "rs_hits_nest.fits"]:
        with fits.open(os.path.join(out, name)) as hl:
            try:
                hl.verify("exception")
                check(True, f"astropy verify {name}")
            except Exception as e:  # noqa: BLE001
                check(False, f"astropy verify {name}: {e}")
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
