#!/usr/bin/env python3
"""Reference satellite pointing and focalplanes from TOAST for toast-ops.

Builds the focalplane and schedule exactly as toast_benchmark_satellite does
(make_focalplane + create_satellite_schedule, mission start 2027-01-01 00:00
UTC, 1-hour observations at 100 Hz, precession 65 deg / 50 min, spin
30 deg / 10 min) and writes, under toast-ops/tests/data/satsim/:

* focalplane_tiny.txt, focalplane_xsmall.txt: one line per detector (12 and
  138 detectors): name uid pixel quat(x y z w) gamma psi_pol pol_angle.
* satellite_obs.txt: for observations 0, 1 and 2 (SimSatellite on a 3-scan
  schedule) and 2000 and 4319 (TOAST's satellite_scanning helper called
  directly with the observation's global sample offset, as SimSatellite does
  inside the 4320-scan benchmark schedule):
    "obs <index> <name> <uid> <session_name> <session_uid> <n_samples>
     <sample_offset> <first_time>"
  followed by sample lines
    "s <sample> <time> <qx> <qy> <qz> <qw> <px> <py> <pz> <vx> <vy> <vz>"
  (boresight_radec quaternion, position km, velocity km/s) every 7200
  samples and at the last sample.

Run with the TOAST 3.0.6 environment:

    env/bin/python toast-ops/scripts/satsim_satellite_vectors.py
"""

import argparse
import os
import types
from datetime import datetime, timezone

import numpy as np
import toast
import toast.qarray as qa
from astropy import units as u
from toast.instrument_sim import fake_hexagon_focalplane  # noqa: F401
from toast.ops.sim_satellite import satellite_scanning
from toast.schedule_sim_satellite import create_satellite_schedule
from toast.scripts.benchmarking_utilities import make_focalplane
from toast.utils import Logger

OUTDIR = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "satsim"
)
RATE = 100.0
OBS_SAMPLES = 360000
STEP = 7200


def focalplane(n_det):
    args = types.SimpleNamespace(
        n_detector=n_det,
        width=10,
        sample_rate=RATE,
        psd_net=50.0e-6,
        psd_fmin=1.0e-5,
    )
    return make_focalplane(args, None, Logger.get())


def write_focalplane(fp, path):
    with open(path, "w") as f:
        f.write("# TOAST 3.0.6 make_focalplane: name uid pixel qx qy qz qw gamma psi_pol pol_angle\n")
        f.write(f"# field_of_view_deg {fp.field_of_view.to_value(u.degree):.17e}\n")
        for row in fp.detector_data:
            q = np.asarray(row["quat"], dtype=np.float64)
            f.write(
                f"{row['name']} {int(row['uid'])} {row['pixel']} "
                + " ".join(f"{x:.17e}" for x in q)
                + f" {row['gamma'].to_value(u.rad):.17e}"
                + f" {row['psi_pol'].to_value(u.rad):.17e}"
                + f" {row['pol_angle'].to_value(u.rad):.17e}\n"
            )


def write_obs(f, index, name, uid, ses_name, ses_uid, offset, times, quats, pos, vel):
    n = len(times)
    f.write(
        f"obs {index} {name} {uid} {ses_name} {ses_uid} {n} {offset} {times[0]:.6f}\n"
    )
    samples = list(range(0, n, STEP))
    if samples[-1] != n - 1:
        samples.append(n - 1)
    for i in samples:
        vals = [times[i]] + list(quats[i]) + list(pos[i]) + list(vel[i])
        f.write(f"s {i} " + " ".join(f"{x:.17e}" for x in vals) + "\n")


def main():
    parser = argparse.ArgumentParser()
    parser.parse_args()

    fp_tiny = focalplane(12)
    write_focalplane(fp_tiny, os.path.join(OUTDIR, "focalplane_tiny.txt"))
    write_focalplane(focalplane(138), os.path.join(OUTDIR, "focalplane_xsmall.txt"))

    mission_start = datetime(2027, 1, 1, 0, 0, 0, tzinfo=timezone.utc)
    site = toast.instrument.SpaceSite("space")
    telescope = toast.instrument.Telescope("satellite", focalplane=fp_tiny, site=site)

    # Full SimSatellite on the first three scans of the benchmark schedule.
    schedule = create_satellite_schedule(
        prefix="",
        mission_start=mission_start,
        observation_time=60 * u.minute,
        num_observations=3,
        prec_period=50.0 * u.minute,
        spin_period=10.0 * u.minute,
    )
    data = toast.Data(comm=toast.Comm())
    sim = toast.ops.SimSatellite(
        name="sim_satellite", detset_key="pixel", telescope=telescope, schedule=schedule
    )
    sim.apply(data)

    out = open(os.path.join(OUTDIR, "satellite_obs.txt"), "w")
    out.write("# TOAST 3.0.6 SimSatellite boresight_radec, position (km), velocity (km/s)\n")
    out.write(f"# telescope satellite uid {telescope.uid}\n")
    for k, ob in enumerate(data.obs):
        write_obs(
            out,
            k,
            ob.name,
            ob.uid,
            ob.session.name,
            ob.session.uid,
            k * OBS_SAMPLES,
            ob.shared["times"].data,
            ob.shared["boresight_radec"].data,
            ob.shared["position"].data,
            ob.shared["velocity"].data,
        )

    # Later observations of the 4320-scan schedule: replicate SimSatellite's
    # per-scan set-up and call its scanning helper with the global offset.
    full = create_satellite_schedule(
        prefix="",
        mission_start=mission_start,
        observation_time=60 * u.minute,
        num_observations=4320,
        prec_period=50.0 * u.minute,
        spin_period=10.0 * u.minute,
    )
    incr = 1.0 / RATE
    t0 = full.scans[0].start
    starts, samples, offsets = [], [], []
    off = 0
    for scan in full.scans:
        ffirst = RATE * (scan.start - t0).total_seconds()
        first = int(ffirst)
        if ffirst - first > 1.0e-3 * incr:
            first += 1
        start = first * incr + t0.timestamp()
        ns = 1 + int(RATE * (scan.stop.timestamp() - start))
        starts.append(start)
        samples.append(ns)
        offsets.append(off)
        off += ns
    for k in (2000, 4319):
        scan = full.scans[k]
        ns = samples[k]
        start_time = starts[k]
        stop_time = start_time + float(ns - 1) / RATE
        stamps = np.linspace(start_time, stop_time, num=ns, endpoint=True)
        position, velocity = site.position_velocity(stamps)
        pos_norm = 1.0 / np.sqrt((position * position).sum(axis=1)).reshape(-1, 1)
        q_prec = qa.from_vectors(
            np.tile(np.array([0.0, 0.0, 1.0]), ns).reshape(-1, 3), pos_norm * position
        )
        ses_name = f"{scan.name}_{int(start_time):10d}"
        ses_end = start_time + float(ns - 1) / RATE
        session = toast.instrument.Session(
            ses_name,
            start=datetime.fromtimestamp(start_time).astimezone(timezone.utc),
            end=datetime.fromtimestamp(ses_end).astimezone(timezone.utc),
        )
        ob = toast.Observation(
            data.comm,
            telescope,
            ns,
            name=f"{scan.name}_{int(scan.start.timestamp())}",
            uid=toast.utils.name_UID(scan.name),
            session=session,
        )
        ob.shared.create_column("times", shape=(ns,), dtype=np.float64)
        ob.shared["times"].set(stamps, offset=(0,), fromrank=0)
        satellite_scanning(
            ob,
            "boresight_radec",
            sample_offset=offsets[k],
            q_prec=q_prec,
            spin_period=scan.spin_period,
            spin_angle=30.0 * u.degree,
            prec_period=scan.prec_period,
            prec_angle=65.0 * u.degree,
        )
        write_obs(
            out,
            k,
            ob.name,
            ob.uid,
            ses_name,
            session.uid,
            offsets[k],
            stamps,
            ob.shared["boresight_radec"].data,
            position,
            velocity,
        )
    out.close()
    print("wrote focalplanes and satellite_obs.txt to", OUTDIR)


if __name__ == "__main__":
    main()
