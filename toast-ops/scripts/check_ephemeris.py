#!/usr/bin/env python3
"""Reference Earth barycentric states for toast-ops/src/astro/ephemeris.rs.

TOAST's SpaceSite (toast/instrument.py) takes the satellite position and
velocity, one scalar time at a time, from astropy's builtin ephemeris:

    p, v = get_body_barycentric_posvel("earth", Time(t, format="unix"))
    p.xyz.to_value(u.km), v.xyz.to_value(u.km / u.s)

This script does the same (one Time per epoch, as TOAST) every 12 hours over
all of 2027 (the benchmark mission starts 2027-01-01 00:00 UTC and lasts
6 months), at the first sparse ephemeris times of the benchmark's first
observation, and at epochs around the leap second of 2016-12-31, and writes

    toast-ops/tests/data/satsim/ephemeris_astropy.txt

with one line per epoch: unix time (UTC), the TDB Julian date astropy hands
to ERFA epv00 (jd1 jd2), position x y z (km), velocity vx vy vz (km/s), ICRS,
all with 17 significant digits (exact round trip). The Rust test
`ephemeris::tests::matches_astropy_bit_for_bit` requires every value to be
identical.

Run with the TOAST environment (astropy + pyerfa):

    env/bin/python toast-ops/scripts/check_ephemeris.py
"""

import os

import astropy
import erfa
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
    unix = list(np.arange(start, stop + 1.0, 12 * 3600.0))
    # The sparse times SpaceSite uses for the first benchmark observation.
    unix += list(np.linspace(start, start + 3599.99, num=6, endpoint=True))
    # Around the leap second at the end of 2016-12-31 (TAI-UTC 36 s -> 37 s).
    leap = Time("2017-01-01T00:00:00", scale="utc").unix
    unix += [leap + d for d in (-86400.0, -43200.0, -1.5, -0.25, 0.0, 0.75, 43200.0)]
    with solar_system_ephemeris.set("builtin"):
        rows = []
        for t in unix:
            t = np.float64(t)
            atime = Time(t, format="unix")
            p, v = get_body_barycentric_posvel("earth", atime)
            tdb = atime.tdb
            rows.append(
                [t, float(tdb.jd1), float(tdb.jd2)]
                + list(p.xyz.to_value(u.km))
                + list(v.xyz.to_value(u.km / u.s))
            )
    with open(OUT, "w") as f:
        f.write(
            "# astropy builtin get_body_barycentric_posvel('earth', Time(t, format='unix')), ICRS"
            f" (astropy {astropy.__version__}, pyerfa {erfa.__version__})\n"
        )
        f.write("# unix_utc tdb_jd1 tdb_jd2 x_km y_km z_km vx_km_s vy_km_s vz_km_s\n")
        for r in rows:
            f.write(" ".join(f"{x:.17e}" for x in r) + "\n")
    print(f"wrote {len(rows)} epochs to {OUT}")


if __name__ == "__main__":
    main()
