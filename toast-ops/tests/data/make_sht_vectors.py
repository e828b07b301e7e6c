#!/usr/bin/env python3
"""healpy.alm2map reference values for toast-ops/tests/sht_vectors.rs.

    env/bin/python toast-ops/tests/data/make_sht_vectors.py

The a_lm are a deterministic formula (alm_formula below, mirrored in the Rust
test), so only sampled map values are committed: every pixel of the first and
last rings (where the Legendre recurrence underflows) plus random pixels.
Columns: ring_pixel T Q U (RING ordering).
"""
import os

import healpy as hp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def alm_formula(lmax, which):
    l, m = hp.Alm.getlm(lmax)
    l = l.astype(np.float64)
    m = m.astype(np.float64)
    damp = 1.0 / (1.0 + 0.01 * l)
    if which == "T":
        a = np.sin(1.7 * l + 2.3 * m + 0.3) + 1j * np.cos(0.9 * l - 1.1 * m + 0.2)
    elif which == "E":
        a = np.cos(1.3 * l + 0.5 * m) + 1j * np.sin(2.1 * l + 0.7 * m + 1.0)
    else:
        a = np.sin(0.6 * l - 1.9 * m + 0.4) + 1j * np.cos(1.1 * l + 0.3 * m)
    a = a * damp
    a[m == 0] = a[m == 0].real
    if which != "T":
        a[l < 2] = 0
    return a.astype(np.complex128)


def sample_pixels(nside, nrand, rng):
    npix = 12 * nside**2
    first = np.arange(0, 2 * 3 * (3 + 1))  # rings 1..3 (4+8+12 = 24 pixels)
    last = np.arange(npix - 24, npix)
    eq = hp.ringinfo(nside, np.array([2 * nside]))[0][0] + np.arange(0, 4 * nside, 7)
    rnd = rng.choice(npix, size=nrand, replace=False)
    return np.unique(np.concatenate([first, last, eq, rnd]))


def case(name, nside, lmax_t, lmax_p, nrand, rng):
    t = alm_formula(lmax_t, "T")
    e = alm_formula(lmax_p, "E")
    b = alm_formula(lmax_p, "B")
    tmap = hp.alm2map(t, nside, lmax=lmax_t, pixwin=False)
    z = np.zeros_like(e)
    _, qmap, umap = hp.alm2map([z, e, b], nside, lmax=lmax_p, pol=True, pixwin=False)
    pix = sample_pixels(nside, nrand, rng)
    with open(os.path.join(HERE, f"sht_{name}.txt"), "w") as f:
        f.write(f"# nside {nside} lmax_t {lmax_t} lmax_p {lmax_p}\n")
        f.write(f"# maxabs {float(np.abs(tmap).max())!r} {float(np.abs(qmap).max())!r} {float(np.abs(umap).max())!r}\n")
        for p in pix:
            f.write(f"{p} {float(tmap[p])!r} {float(qmap[p])!r} {float(umap[p])!r}\n")
    return len(pix)


def main():
    rng = np.random.default_rng(7)
    print(case("n64", 64, 191, 191, 1500, rng))
    print(case("n256", 256, 767, 767, 1500, rng))
    # lmax above 3 nside - 1 (aliasing onto short polar rings), different T / pol lmax
    print(case("n32_alias", 32, 150, 200, 800, rng))


if __name__ == "__main__":
    main()
