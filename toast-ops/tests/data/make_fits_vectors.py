#!/usr/bin/env python3
"""Write small healpy-made HEALPix FITS files for toast-ops/tests/fits_io.rs.

    env/bin/python toast-ops/tests/data/make_fits_vectors.py

Values are a deterministic function of the RING pixel index r and field f, so
the Rust test recomputes them:
  float maps:   v = 100 * sin(0.37 r + 1.3 f)
  integer maps: v = (7 r + 1000 f) % 30000 - 15000
Partial-sky file: pixels with r % 3 == 0 are missing (UNSEEN).
"""
import os
import warnings

import healpy as hp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
warnings.simplefilter("ignore")


def fvals(nside, nfield):
    r = np.arange(12 * nside**2, dtype=np.float64)
    return [100.0 * np.sin(0.37 * r + 1.3 * f) for f in range(nfield)]


def ivals(nside, nfield):
    r = np.arange(12 * nside**2, dtype=np.int64)
    return [(7 * r + 1000 * f) % 30000 - 15000 for f in range(nfield)]


def out(name):
    return os.path.join(HERE, name)


def to_nest(maps):
    return [hp.reorder(m, r2n=True) for m in maps]


# float32, RING, healpy default fits_IDL=True -> TFORM '1024E', 3 rows
hp.write_map(out("hp_iqu_ring_1024E_n16.fits"), fvals(16, 3), nest=False,
             dtype=np.float32, overwrite=True)
# float64, NEST, one pixel per row, units and an extra card
hp.write_map(out("hp_iqu_nest_D_n8.fits"), to_nest(fvals(8, 3)), nest=True,
             dtype=np.float64, fits_IDL=False, column_units="K", coord="G",
             extra_header=[("TESTKEY", 42, "a test card")], overwrite=True)
# single int32 map, RING (healpy names the column 'T')
hp.write_map(out("hp_i_ring_J_n8.fits"), ivals(8, 1)[0].astype(np.int32),
             nest=False, dtype=np.int32, fits_IDL=False, overwrite=True)
# single int64 map, NEST
hp.write_map(out("hp_i_nest_K_n8.fits"), to_nest(ivals(8, 1))[0], nest=True,
             dtype=np.int64, fits_IDL=False, overwrite=True)
# two int16 maps, RING
hp.write_map(out("hp_2_ring_I_n8.fits"), [m.astype(np.int16) for m in ivals(8, 2)],
             nest=False, dtype=np.int16, fits_IDL=False,
             column_names=["A", "B"], overwrite=True)
# partial sky, NEST, float64
maps = to_nest(fvals(8, 3))
ring = np.arange(12 * 64)
nest_of_ring = hp.ring2nest(8, ring)
for m in maps:
    m[nest_of_ring[ring % 3 == 0]] = hp.UNSEEN
hp.write_map(out("hp_iqu_nest_partial_D_n8.fits"), maps, nest=True, partial=True,
             dtype=np.float64, overwrite=True)
print("done")
