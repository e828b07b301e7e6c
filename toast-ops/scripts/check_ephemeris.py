#!/usr/bin/env python3
"""Reference Earth barycentric positions for toast-ops/src/ephemeris.rs.

TOAST's SpaceSite (toast/instrument.py) takes the satellite position and
velocity from astropy's builtin ephemeris:

    astropy.coordinates.get_body_barycentric_posvel("earth", Time(t, format="unix"))

This script evaluates it every 12 hours over all of 2027 (the benchmark
mission starts 2027-01-01 00:00 UTC and lasts 6 months) and writes

    toast-ops/tests/data/satsim/ephemeris_astropy.txt

with one line per epoch: unix time (UTC), position x y z (km), velocity
vx vy vz (km/s), ICRS. The Rust test `ephemeris::tests::matches_astropy_over_2027`
reads it and checks the direction error (< 10", currently 0.31").

Run with the TOAST environment (astropy + ERFA):

    env/bin/python toast-ops/scripts/check_ephemeris.py
"""

import os

import numpy as np
from astropy import units as u
from astropy.coordinates import get_body_barycentric_posvel, solar_system_ephemeris
from astropy.time import Time

OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "tests",
    "data",
    "satsim",
    "ephemeris_astropy.txt",
)


def main():
    start = Time("2027-01-01T00:00:00", scale="utc").unix
    stop = Time("2028-01-01T00:00:00", scale="utc").unix
    unix = np.arange(start, stop + 1.0, 12 * 3600.0)
    times = Time(unix, format="unix")
    with solar_system_ephemeris.set("builtin"):
        p, v = get_body_barycentric_posvel("earth", times)
    pos = p.xyz.to_value(u.km).T
    vel = v.xyz.to_value(u.km / u.s).T
    with open(OUT, "w") as f:
        f.write("# astropy builtin get_body_barycentric_posvel('earth'), ICRS\n")
        f.write("# unix_utc x_km y_km z_km vx_km_s vy_km_s vz_km_s\n")
        for t, pp, vv in zip(unix, pos, vel):
            f.write(
                f"{t:.1f} {pp[0]:.6f} {pp[1]:.6f} {pp[2]:.6f} "
                f"{vv[0]:.9f} {vv[1]:.9f} {vv[2]:.9f}\n"
            )
    print(f"wrote {len(unix)} epochs to {OUT}")


if __name__ == "__main__":
    main()
