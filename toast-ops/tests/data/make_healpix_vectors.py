#!/usr/bin/env python3
"""Generate HEALPix test vectors with healpy for toast-ops/tests/healpix_vectors.rs.

Run from anywhere with a Python that has healpy and numpy, e.g.
    env/bin/python toast-ops/tests/data/make_healpix_vectors.py
It (re)writes healpix_*.txt next to this script. Floats are written with
repr() (17 significant digits), so the Rust side parses them exactly.
"""
import os

import healpy as hp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NSIDES = [1, 2, 4, 64, 1024, 2**20, 2**29]
rng = np.random.default_rng(20240611)


def fmt(v):
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    return str(int(v))


def write(name, header, rows):
    with open(os.path.join(HERE, name), "w") as f:
        f.write("# " + header + "\n")
        for r in rows:
            f.write(" ".join(fmt(v) for v in r) + "\n")


def angles(n):
    """Random directions plus edge cases: poles, near-pole, the z=±2/3 cap
    boundary, phi on face boundaries and just around 0 / 2pi."""
    th = list(np.arccos(rng.uniform(-1, 1, n)))
    ph = list(rng.uniform(-2 * np.pi, 4 * np.pi, n))
    edge_th = [0.0, 1e-12, 1e-6, 0.005, 0.0099999, 0.01, 0.0100001, 0.2,
               np.arccos(2 / 3), np.arccos(2 / 3) + 1e-13, np.arccos(2 / 3) - 1e-13,
               np.pi / 2, np.arccos(-2 / 3), np.pi - 0.01, np.pi - 0.005,
               np.pi - 1e-9, np.pi]
    edge_ph = [0.0, -1e-17, -1e-300, 1e-300, np.pi / 4, np.pi / 2, np.pi,
               3 * np.pi / 2, 2 * np.pi, 2 * np.pi - 1e-15, -np.pi / 2, 10.0]
    for t in edge_th:
        for p in edge_ph:
            th.append(t)
            ph.append(p)
    return np.array(th), np.array(ph)


ang_rows, vec_rows, pix_rows, ring_rows = [], [], [], []
for nside in NSIDES:
    npix = 12 * nside * nside
    th, ph = angles(60)
    nest = hp.ang2pix(nside, th, ph, nest=True)
    ring = hp.ang2pix(nside, th, ph, nest=False)
    for t, p, a, b in zip(th, ph, nest, ring):
        ang_rows.append((nside, t, p, a, b))

    v = rng.normal(size=(80, 3)) * rng.uniform(0.1, 10.0, size=(80, 1))
    v = np.concatenate([v, [[0, 0, 1], [0, 0, -2], [1e-3, 0, 1], [0, -1e-7, -1],
                            [1, 0, 0], [-1, 0, 0], [0, 1, 0], [1, 1, 0.5],
                            [3, -1e-20, 0.1]]])
    nest = hp.vec2pix(nside, v[:, 0], v[:, 1], v[:, 2], nest=True)
    ring = hp.vec2pix(nside, v[:, 0], v[:, 1], v[:, 2], nest=False)
    for vv, a, b in zip(v, nest, ring):
        vec_rows.append((nside, vv[0], vv[1], vv[2], a, b))

    pix = np.unique(np.concatenate([
        rng.integers(0, npix, size=min(npix, 120)),
        [0, 1, npix - 1, npix - 2, npix // 2, npix // 12, 2 * nside * (nside - 1),
         max(0, 2 * nside * (nside - 1) - 1), npix - 2 * nside * (nside - 1)],
    ]).astype(np.int64))
    pix = pix[(pix >= 0) & (pix < npix)]
    tn, pn = hp.pix2ang(nside, pix, nest=True)
    tr, pr = hp.pix2ang(nside, pix, nest=False)
    vn = np.array(hp.pix2vec(nside, pix, nest=True)).T
    vr = np.array(hp.pix2vec(nside, pix, nest=False)).T
    n2r = hp.nest2ring(nside, pix)
    r2n = hp.ring2nest(nside, pix)
    for i, p in enumerate(pix):
        pix_rows.append((nside, p, n2r[i], r2n[i], tn[i], pn[i], tr[i], pr[i],
                         *vn[i], *vr[i]))

    nr = 4 * nside - 1
    rings = np.unique(np.concatenate([
        [1, 2, nside - 1, nside, nside + 1, 2 * nside, 3 * nside - 1, 3 * nside,
         3 * nside + 1, nr - 1, nr],
        rng.integers(1, nr + 1, size=min(nr, 20))]))
    rings = rings[(rings >= 1) & (rings <= nr)]
    start, npr, cth, sth, shifted = hp.ringinfo(nside, rings)
    t0, p0 = hp.pix2ang(nside, start, nest=False)
    for i, r in enumerate(rings):
        ring_rows.append((nside, r, start[i], npr[i], cth[i], sth[i], int(shifted[i]),
                          t0[i], p0[i]))

write("healpix_ang2pix.txt", "nside theta phi nest ring", ang_rows)
write("healpix_vec2pix.txt", "nside x y z nest ring", vec_rows)
write("healpix_pix2ang.txt",
      "nside pix nest2ring ring2nest theta_n phi_n theta_r phi_r xn yn zn xr yr zr",
      pix_rows)
write("healpix_rings.txt",
      "nside ring startpix npix costheta sintheta shifted theta_firstpix phi_firstpix",
      ring_rows)
print(len(ang_rows), len(vec_rows), len(pix_rows), len(ring_rows))
