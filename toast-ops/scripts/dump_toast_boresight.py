#!/usr/bin/env python3
"""TOAST 3.0.6's satellite boresight for the benchmark's observation, sample
by sample, for toast-ops's bit-for-bit test.

Runs `toast.ops.SimSatellite` exactly as `toast_benchmark_satellite` does for
its tiny and xsmall cases (one 60-minute observation from 2027-01-01 00:00:00
UTC at 100 Hz, precession 65 deg / 50 min, spin 30 deg / 10 min, telescope
"satellite" on a SpaceSite, detset_key "pixel"; the boresight does not depend
on the detectors) and writes

    toast-ops/tests/data/satsim/boresight_obs0.txt

with a header line "obs <name> <n_samples>" and then, every STRIDE-th sample
(a prime, so that samples fall at all phases of the scan) and at the last
sample:

    "<sample> <time> <qx> <qy> <qz> <qw> <px> <py> <pz> <vx> <vy> <vz>"

(boresight_radec quaternion, position km, velocity km/s, ICRS), with 17
significant digits (exact round trip). The Rust test
`satellite::tests::boresight_bit_identical_to_toast` compares every value.

    env/bin/python toast-ops/scripts/dump_toast_boresight.py [--stride 997]
"""

import argparse
import os
import types
from datetime import datetime, timezone

import numpy as np
import toast
from astropy import units as u
from toast.schedule_sim_satellite import create_satellite_schedule
from toast.scripts.benchmarking_utilities import make_focalplane
from toast.utils import Logger

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "satsim", "boresight_obs0.txt")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=997)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()

    fp = make_focalplane(
        types.SimpleNamespace(
            n_detector=12, width=10, sample_rate=100.0, psd_net=50.0e-6, psd_fmin=1.0e-5
        ),
        None,
        Logger.get(),
    )
    site = toast.instrument.SpaceSite("space")
    telescope = toast.instrument.Telescope("satellite", focalplane=fp, site=site)
    schedule = create_satellite_schedule(
        prefix="",
        mission_start=datetime(2027, 1, 1, 0, 0, 0, tzinfo=timezone.utc),
        observation_time=60 * u.minute,
        num_observations=1,
        prec_period=50.0 * u.minute,
        spin_period=10.0 * u.minute,
    )
    data = toast.Data(comm=toast.Comm())
    toast.ops.SimSatellite(
        name="sim_satellite", detset_key="pixel", telescope=telescope, schedule=schedule
    ).apply(data)
    ob = data.obs[0]
    times = ob.shared["times"].data
    quats = ob.shared["boresight_radec"].data
    pos = ob.shared["position"].data
    vel = ob.shared["velocity"].data
    n = len(times)
    samples = list(range(0, n, a.stride))
    if samples[-1] != n - 1:
        samples.append(n - 1)
    with open(a.out, "w") as f:
        f.write(
            f"# TOAST {toast.__version__} SimSatellite boresight_radec of the benchmark's "
            f"first observation, every {a.stride}th sample and the last\n"
        )
        f.write("# sample time qx qy qz qw px py pz (km) vx vy vz (km/s)\n")
        f.write(f"obs {ob.name} {n}\n")
        for i in samples:
            vals = [times[i]] + list(quats[i]) + list(pos[i]) + list(vel[i])
            f.write(f"{i} " + " ".join(f"{x:.17e}" for x in vals) + "\n")
    print(f"wrote {len(samples)} samples of {n} to {a.out}")


if __name__ == "__main__":
    main()
