#!/usr/bin/env python3
"""Compare the toast-ops synthetic sky with TOAST's benchmark input sky.

    env/bin/python toast-ops/tests/data/check_sky_vs_toast.py [WORKDIR]

1. Makes TOAST's map with toast.scripts.benchmarking_utilities.create_input_maps
   (healpy.synfast, nside 1024, 151 MB) in WORKDIR unless already there.
2. Runs `cargo run --release --example benchmark_sky -- 1024 WORKDIR`
   (prints the synthesis time) which writes rs_input_sky_nside1024.fits.
3. Compares the full-sky RMS of I, Q, U (different realisations: expect
   agreement within a few %), the RMS predicted from the spectra with healpy's
   full lmax (3 nside - 2), and the binned angular power spectra (anafast) of
   both maps against C_l B_l^2 (TT, EE; BB must be ~0).

TOAST 3.0.6 writes healpy's RING-ordered synfast output with nest=True, so its
file says ORDERING='NESTED' over RING-ordered data. Its spectra are therefore
computed here from the raw file order taken as RING (and, for illustration,
from the data as labelled, which is a pixel-scrambled, white-spectrum sky).
"""
import os
import subprocess
import sys
import time

import healpy as hp
import numpy as np

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NSIDE = 1024


class Log:
    def info(self, msg):
        print(msg)


def spectra():
    ell = np.arange(3 * NSIDE - 1, dtype=np.float64)
    tt = 2000.0 / (50.0 * np.sqrt(2 * np.pi)) * np.exp(-0.5 * (ell - 30.0) ** 2 / 50.0**2)
    ee = 1.0 / (100.0 * np.sqrt(2 * np.pi)) * np.exp(-0.5 * (ell - 500.0) ** 2 / 100.0**2)
    b = hp.gauss_beam(np.radians(3.0 / 60.0), lmax=len(ell) - 1, pol=True)
    return ell, tt * b[:, 0] ** 2, ee * b[:, 1] ** 2


def main():
    work = sys.argv[1] if len(sys.argv) > 1 else "/tmp"
    toast_map = os.path.join(work, f"fake_input_sky_nside{NSIDE}.fits")
    if not os.path.isfile(toast_map):
        from toast.scripts.benchmarking_utilities import create_input_maps
        t = time.time()
        create_input_maps(toast_map, NSIDE, 0, Log())
        print(f"TOAST create_input_maps took {time.time() - t:.1f} s")
    subprocess.run(["nice", "-n", "10", "cargo", "run", "--release", "-j2", "-q", "-p", "toast-ops",
                    "--example", "benchmark_sky", "--", str(NSIDE), work],
                   cwd=REPO, check=True)
    ours = hp.read_map(os.path.join(work, f"rs_input_sky_nside{NSIDE}.fits"), field=None,
                       nest=True, dtype=np.float64)
    ref = hp.read_map(toast_map, field=None, nest=True, dtype=np.float64)

    ell, ctt, cee = spectra()
    f = (2 * ell + 1) / (4 * np.pi)
    pred = [np.sqrt(np.sum(f[1:] * ctt[1:])), np.sqrt(0.5 * np.sum(f[2:] * cee[2:]))]
    pred = [pred[0], pred[1], pred[1]]
    ok = True
    print(f"{'':3} {'ours std':>12} {'TOAST std':>12} {'ratio':>8} {'predicted':>12} "
          f"{'ours/pred':>9} {'TOAST/pred':>10}")
    for name, a, b, p in zip("IQU", ours, ref, pred):
        ra, rb = np.std(a), np.std(b)
        print(f"{name:3} {ra:12.5f} {rb:12.5f} {ra / rb:8.4f} {p:12.5f} {ra / p:9.4f} {rb / p:10.4f}")
        ok &= abs(ra / rb - 1) < 0.05 and abs(ra / p - 1) < 0.05
    for name, a, b in zip("IQU", ours, ref):
        print(f"{name}: mean ours {np.mean(a): .5f} TOAST {np.mean(b): .5f}; "
              f"rms (incl. mean) ours {np.sqrt(np.mean(a**2)):.5f} TOAST {np.sqrt(np.mean(b**2)):.5f}")

    lmax = 1300
    t = time.time()
    cl_ours = hp.anafast(hp.reorder(ours, n2r=True), lmax=lmax, pol=True)
    cl_ref = hp.anafast(ref, lmax=lmax, pol=True)  # raw file order is really RING
    cl_lab = hp.anafast(hp.reorder(ref, n2r=True), lmax=300, pol=True)  # as labelled
    print(f"anafast x3 took {time.time() - t:.1f} s")
    w = 2 * ell[2:300] + 1
    print("TOAST file read as labelled (NESTED): TT(2-300) / input = "
          f"{np.sum(w * cl_lab[0][2:300]) / np.sum(w * ctt[2:300]):.3f}, "
          f"BB/EE_peak = {np.mean(cl_lab[2][2:300]) / cee.max():.1e}  (scrambled)")
    edges = [2, 20, 40, 60, 100, 200, 300, 400, 500, 600, 700, 800, 1000, 1200]
    print("binned C_l / (C_l B_l^2) [TT ours, TT TOAST | EE ours, EE TOAST] and BB/EE_peak")
    for lo, hi in zip(edges[:-1], edges[1:]):
        sl = slice(lo, hi)
        w = 2 * ell[sl] + 1
        tt_in, ee_in = np.sum(w * ctt[sl]), np.sum(w * cee[sl])
        row = f"l {lo:4d}-{hi:4d}: "
        row += f"TT {np.sum(w * cl_ours[0][sl]) / tt_in:7.3f} {np.sum(w * cl_ref[0][sl]) / tt_in:7.3f}" \
            if tt_in > 1e-6 * np.sum(w * ctt[sl].max()) and ctt[sl].max() > 1e-8 * ctt.max() else " " * 19
        if cee[sl].max() > 1e-6 * cee.max():
            row += f" | EE {np.sum(w * cl_ours[1][sl]) / ee_in:7.3f} {np.sum(w * cl_ref[1][sl]) / ee_in:7.3f}"
        row += f" | BB/EEpk {np.mean(cl_ours[2][sl]) / cee.max():.1e} {np.mean(cl_ref[2][sl]) / cee.max():.1e}"
        print(row)
    bb = np.max(np.abs(cl_ours[2][2:])) / cee.max()
    ok &= bb < 1e-6
    sl = slice(100, 1000)
    w = 2 * ell[sl] + 1
    for name, cl in (("ours", cl_ours), ("TOAST (raw as RING)", cl_ref)):
        r = np.sum(w * cl[1][sl]) / np.sum(w * cee[sl])
        print(f"{name}: EE(100-1000) / input = {r:.4f}")
        ok &= abs(r - 1) < 0.02
    print("ALL OK" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
