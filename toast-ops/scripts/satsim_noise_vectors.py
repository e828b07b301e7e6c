#!/usr/bin/env python3
"""Reference noise data from TOAST 3.0.6 for toast-ops/src/sim/noise.rs.

Writes toast-ops/tests/data/satsim/noise_vectors.txt with records:

* "u64 k1 k2 c1 c2 | v0 v1 v2 v3": TOAST rng uniform_uint64 (Threefry2x64-20
  output word 0 for counters c2, c2+1, ...).
* "u01 k1 k2 c1 c2 | ...": uniform_01, "gauss k1 k2 c1 c2 | ...": gaussian.
* "psd rate net fknee fmin alpha | freqs... ; psds...": AnalyticNoise grid.
* "sim real tele comp sess det rate first n stride | values": the compiled
  tod_sim_noise_timestream (SimNoise's serial path) for the benchmark PSD,
  every `stride`-th sample of an `n`-sample stream.
* "stat <det> <uid> | var b1 b2 b3": statistics of one detector-hour
  (360000 samples at 100 Hz, observation 0 session key) for 16 detectors:
  sample variance / (NET^2 rate), and the periodogram |X_k|^2 / (N rate)
  (TOAST's PSD normalisation: variance = rate * mean PSD) averaged over the
  bins of three bands divided by the model PSD averaged over the same bins.

Run with the TOAST environment:

    env/bin/python toast-ops/scripts/satsim_noise_vectors.py
"""

import os

import numpy as np
import toast.rng as rng
from astropy import units as u
from scipy.special import erfinv
from toast._libtoast import tod_sim_noise_timestream
from toast.noise_sim import AnalyticNoise
from toast.utils import AlignedF64, name_UID

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "tests",
    "data",
    "satsim",
    "noise_vectors.txt",
)

RATE = 100.0
NET = 50.0e-6
FKNEE = 0.05
FMIN = 1.0e-5
ALPHA = 1.0
TELESCOPE = int(name_UID("satellite"))
# Session UID of observation 0 of the benchmark (see satellite_obs.txt).
SESSION0 = 1949512818

BANDS = [(0.001, 0.03), (0.05, 0.5), (10.0, 50.0)]


def fmt(values):
    return " ".join(f"{float(x):.17e}" for x in np.ravel(values))


def model():
    det = "D00A-150"
    nse = AnalyticNoise(
        detectors=[det],
        rate={det: RATE * u.Hz},
        fmin={det: FMIN * u.Hz},
        fknee={det: FKNEE * u.Hz},
        alpha={det: ALPHA},
        NET={det: NET * u.K * np.sqrt(1.0 * u.second)},
    )
    freq = nse.freq(det).to_value(u.Hz)
    psd = nse.psd(det).to_value(u.K**2 * u.second)
    wt = nse.detector_weight(det).to_value(1.0 / u.K**2)
    return freq, psd, wt


def sim(freq, psd, sess, det, first, n, real=0, comp=0):
    out = AlignedF64(n)
    tod_sim_noise_timestream(
        real, TELESCOPE, comp, sess, det, RATE, first, 2, freq, psd, out
    )
    return np.array(out.array())


def band_stats(x):
    n = len(x)
    spec = np.fft.rfft(x)
    f = np.fft.rfftfreq(n, 1.0 / RATE)
    pgram = np.abs(spec) ** 2 / (n * RATE)
    model_psd = NET**2 * (f**ALPHA + FKNEE**ALPHA) / (f**ALPHA + FMIN**ALPHA)
    res = []
    for lo, hi in BANDS:
        sel = (f >= lo) & (f < hi)
        res.append(np.mean(pgram[sel]) / np.mean(model_psd[sel]))
    return res


def main():
    lines = []
    for key, ctr in [
        ((0, 0), (0, 0)),
        ((123456789012345, 987654321098765), (0, 1000)),
        ((7977811 * 65536, SESSION0 * 4294967296 + 13695585), (0, 0)),
    ]:
        head = f"{key[0]} {key[1]} {ctr[0]} {ctr[1]}"
        v = rng.random(4, key=key, counter=ctr, sampler="uniform_uint64").array()
        lines.append(f"u64 {head} | " + " ".join(str(int(x)) for x in v))
        v = rng.random(8, key=key, counter=ctr, sampler="uniform_01").array()
        lines.append(f"u01 {head} | {fmt(v)}")
        v = rng.random(8, key=key, counter=ctr, sampler="gaussian").array()
        lines.append(f"gauss {head} | {fmt(v)}")

    # TOAST's erfinv (Giles) tail branch: document how it compares with an
    # accurate erfinv where -log(1 - x^2) >= 16.
    key = (1, 2)
    n = 1 << 24
    u01 = rng.random(n, key=key, counter=(0, 0), sampler="uniform_01").array()
    x = 2.0 * u01 - 1.0
    w = -np.log((1.0 - np.abs(x)) * (1.0 + np.abs(x)))
    idx = np.nonzero(w >= 16.0)[0]
    for i in idx[:4]:
        g = rng.random(1, key=key, counter=(0, int(i)), sampler="gaussian").array()[0]
        print(
            f"tail sample {i}: x={x[i]!r} toast={g!r} "
            f"accurate={np.sqrt(2) * erfinv(x[i])!r}"
        )

    freq, psd, wt = model()
    lines.append(f"psd {RATE} {NET} {FKNEE} {FMIN} {ALPHA} {wt:.17e} | {fmt(freq)} ; {fmt(psd)}")

    cases = [
        (SESSION0, int(name_UID("D00A-150")), 0, 4000, 4),
        (SESSION0, int(name_UID("D02B-150")), 0, 5000, 5),
        (12345, 67890, 1000, 3000, 3),
    ]
    for sess, det, first, n, stride in cases:
        x = sim(freq, psd, sess, det, first, n)
        lines.append(
            f"sim 0 {TELESCOPE} 0 {sess} {det} {RATE} {first} {n} {stride} | {fmt(x[::stride])}"
        )

    # Statistics of detector-hours.
    names = [f"D{p:02d}{ab}-150" for p in range(8) for ab in "AB"]
    var_ratio = []
    bands = []
    for name in names:
        uid = int(name_UID(name))
        x = sim(freq, psd, SESSION0, uid, 0, 360000)
        var_ratio.append(np.var(x) / (NET**2 * RATE))
        bands.append(band_stats(x))
        lines.append(
            f"stat {name} {uid} | {var_ratio[-1]:.12f} "
            + " ".join(f"{b:.12f}" for b in bands[-1])
        )
    bands = np.mean(np.array(bands), axis=0)
    print(f"TOAST {len(names)} detector-hours: var/(NET^2 rate) = {np.mean(var_ratio):.5f}")
    for (lo, hi), b in zip(BANDS, bands):
        print(f"  band {lo}-{hi} Hz: <periodogram>/<model> = {b:.4f}")

    with open(OUT, "w") as f:
        f.write("# Generated by toast-ops/scripts/satsim_noise_vectors.py (TOAST 3.0.6)\n")
        for line in lines:
            f.write(line + "\n")
    print(f"wrote {len(lines)} records to {OUT}")


if __name__ == "__main__":
    main()
