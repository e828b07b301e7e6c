#!/usr/bin/env python3
# Copyright (c) toast-rs contributors. BSD-2-Clause.
"""Regenerate the TOAST 3.0.6 compiled-kernel reference cases.

Every case calls the real compiled extension ``toast._libtoast`` of the PyPI
wheel ``toast==3.0.6`` (CPU path, ``use_accel=False``, one OpenMP thread) on
deterministic, seeded inputs, and writes ``<kernel>_<case>.npz`` plus a
``manifest.json`` in the schema described in FORMAT.md.

Usage:  OMP_NUM_THREADS=1 python generate_cases.py OUTDIR

``regenerate.sh`` beside this file sets up a virtual environment with the
right toast and runs this script.  The layout of every case (names, dtypes,
shapes, special directions, sentinel ``_in`` values, flag patterns, interval
shapes, offset-template call replay arrays) follows FORMAT.md; the random
values come from ``numpy.random.default_rng`` seeded from the case name, so a
run is reproducible bit for bit with the same numpy, toast and libm.
"""

import json
import math
import os
import subprocess
import sys
import zlib

# The kernels must run with one OpenMP thread (sequential summation order in
# template_offset_project_signal).  OMP_NUM_THREADS is read when libgomp
# initialises, i.e. on the first import of toast._libtoast.
if os.environ.get("OMP_NUM_THREADS") not in (None, "1"):
    sys.exit("generate_cases.py: run with OMP_NUM_THREADS=1 (it is %r)" % os.environ["OMP_NUM_THREADS"])
os.environ["OMP_NUM_THREADS"] = "1"
# filter_polynomial and filter_poly2D solve with LAPACK dgelss from the OpenBLAS
# that the wheel links statically (DYNAMIC_ARCH).  Its BLAS kernels, chosen at
# start-up from the CPU, round differently (FMA, unrolled sums), so the cases of
# those kernels are made in a child process (``--pinned``) with the core type
# pinned to the baseline x86-64 one and one thread: the same bits on every
# machine.  OpenBLAS reads these when it loads, so they are set before the
# imports.  (numpy's own OpenBLAS reads them too, which is why the other cases
# are not made under the pin: it would change their numpy-made inputs.)
PINNED_ENV = {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "1"}
if sys.argv[1:2] == ["--pinned"]:
    for _k, _v in PINNED_ENV.items():
        if os.environ.get(_k) not in (None, _v):
            sys.exit(f"generate_cases.py --pinned: {_k} must be {_v} (it is {os.environ[_k]!r})")
        os.environ[_k] = _v

import numpy as np  # noqa: E402

import toast  # noqa: E402
from toast import _libtoast as lt  # noqa: E402
from toast.intervals import interval_dtype  # noqa: E402

TOAST_VERSION = "3.0.6"
SAMPLE_RATE = 10.0  # Hz: only used for the (unused by the kernels) start/stop times
T0 = 1.0e9
BASE_SEED = 20240606


# ---------------------------------------------------------------------------
# helpers


def rng_for(name):
    """A generator seeded from the case name (stable across runs and Pythons)."""
    return np.random.default_rng([BASE_SEED, zlib.crc32(name.encode("ascii"))])


def make_intervals(spans):
    """(structured interval array for the kernel, dict of the four npz fields)."""
    iv = np.zeros(len(spans), dtype=interval_dtype)
    for i, (first, last) in enumerate(spans):
        iv[i]["first"] = first
        iv[i]["last"] = last
        iv[i]["start"] = T0 + first / SAMPLE_RATE
        iv[i]["stop"] = T0 + max(last - 1, first) / SAMPLE_RATE
    fields = {
        "intervals_first": np.ascontiguousarray(iv["first"], dtype=np.int64),
        "intervals_last": np.ascontiguousarray(iv["last"], dtype=np.int64),
        "intervals_start": np.ascontiguousarray(iv["start"], dtype=np.float64),
        "intervals_stop": np.ascontiguousarray(iv["stop"], dtype=np.float64),
    }
    return iv, fields


def random_quats(rng, shape):
    """Unit quaternions [x, y, z, w], uniformly distributed on S3."""
    q = rng.normal(size=tuple(shape) + (4,))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return np.ascontiguousarray(q)


def qmult(p, q):
    """Hamilton product p * q of [x, y, z, w] quaternions (numpy broadcasting)."""
    p0, p1, p2, p3 = (p[..., i] for i in range(4))
    q0, q1, q2, q3 = (q[..., i] for i in range(4))
    return np.stack(
        [
            p0 * q3 + p1 * q2 - p2 * q1 + p3 * q0,
            -p0 * q2 + p1 * q3 + p2 * q0 + p3 * q1,
            p0 * q1 - p1 * q0 + p2 * q3 + p3 * q2,
            -p0 * q0 - p1 * q1 - p2 * q2 + p3 * q3,
        ],
        axis=-1,
    )


def axis_angle(axis, angle):
    axis = np.asarray(axis, dtype=np.float64)
    s = math.sin(0.5 * angle)
    return np.array([axis[0] * s, axis[1] * s, axis[2] * s, math.cos(0.5 * angle)])


def dir_quat(theta, phi, psi):
    """Quaternion Rz(phi) Ry(theta) Rz(psi): rotates z-hat to (theta, phi)."""
    return qmult(
        qmult(axis_angle([0, 0, 1], phi), axis_angle([0, 1, 0], theta)),
        axis_angle([0, 0, 1], psi),
    )


def rotate_toast(q, v):
    """TOAST's un-normalised rotation of vector v by quaternion(s) q (same op order)."""
    x, y, z, w = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    xw = w * x
    yw = w * y
    zw = w * z
    x2 = -x * x
    xy = x * y
    xz = x * z
    y2 = -y * y
    yz = y * z
    z2 = -z * z
    v0, v1, v2 = v
    return np.stack(
        [
            2 * ((y2 + z2) * v0 + (xy - zw) * v1 + (yw + xz) * v2) + v0,
            2 * ((zw + xy) * v0 + (x2 + z2) * v1 + (yz - xw) * v2) + v1,
            2 * ((xz - yw) * v0 + (xw + yz) * v1 + (x2 + y2) * v2) + v2,
        ],
        axis=-1,
    )


THETA_SPECIAL = [
    math.acos(2.0 / 3.0),
    math.acos(-2.0 / 3.0),
    math.acos(2.0 / 3.0) + 1e-12,
    math.acos(2.0 / 3.0) - 1e-12,
    1e-9,
    math.pi - 1e-9,
    0.5 * math.pi,
]
PHI_SPECIAL = [0.0, 1e-17, -1e-17, 2 * math.pi - 1e-15, 0.25 * math.pi, 1.5 * math.pi, math.pi]
N_SPECIAL = 6 + len(THETA_SPECIAL) * len(PHI_SPECIAL)  # 55


def special_quats(rng):
    """The 55 special pointing quaternions of FORMAT.md (poles, equator, z=+-2/3, phi~0/2pi)."""
    s = 1.0 / math.sqrt(2.0)
    out = [
        [0.0, 0.0, 0.0, 1.0],  # identity: north pole
        [1.0, 0.0, 0.0, 0.0],  # 180 deg about x: south pole
        [0.0, s, 0.0, s],  # +90 about y: equator, phi = 0
        [-s, 0.0, 0.0, s],  # -90 about x: equator, phi = pi/2
        [0.0, -s, 0.0, s],  # -90 about y: equator, phi = pi
        [s, 0.0, 0.0, s],  # +90 about x: equator, phi = -pi/2
    ]
    for theta in THETA_SPECIAL:
        for phi in PHI_SPECIAL:
            out.append(dir_quat(theta, phi, rng.uniform(0, 2 * math.pi)))
    q = np.array(out, dtype=np.float64)
    assert q.shape == (N_SPECIAL, 4)
    return q


def find_nan_quat(rng):
    """A quaternion (a, b, 0, 0) whose TOAST-rotated z-hat has z < -1 by rounding."""
    for _ in range(1_000_000):
        t = rng.uniform(0, 2 * math.pi)
        q = np.array([math.cos(t), math.sin(t), 0.0, 0.0])
        vz = rotate_toast(q, (0.0, 0.0, 1.0))[2]
        if vz < -1.0:
            return q
    raise RuntimeError("no quaternion with rotated z < -1 found")


def u8(x):
    return np.asarray(x, dtype=np.uint8)


class Case:
    def __init__(self, kernel, case, function, description):
        self.kernel = kernel
        self.case = case
        self.function = function
        self.description = description
        self.fields = {}
        self.scalars = {}
        self.extra = None

    @property
    def file(self):
        return f"{self.kernel}_{self.case}.npz"

    def add(self, **arrays):
        for k, v in arrays.items():
            a = np.asarray(v)
            if a.dtype.kind == "b":
                raise TypeError(f"{k}: booleans are stored as uint8")
            self.fields[k] = np.ascontiguousarray(a)

    def scalar(self, name, value, dtype):
        self.fields[name] = np.array(value, dtype=dtype)
        self.scalars[name] = value.item() if hasattr(value, "item") else value

    def manifest(self):
        m = {
            "file": self.file,
            "kernel": self.kernel,
            "case": self.case,
            "libtoast_function": self.function,
            "description": self.description,
            "omp_num_threads": 1,
            "fields": {
                k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in self.fields.items()
            },
            "scalars": self.scalars,
        }
        if self.extra is not None:
            m["extra"] = self.extra
        return m


# ---------------------------------------------------------------------------
# 1. pointing_detector


def pointing_replica(focalplane, boresight, quat_index, quats, spans, flags, mask):
    out = quats.copy()
    use_flags = flags.shape[0] == boresight.shape[0]
    ident = np.array([0.0, 0.0, 0.0, 1.0])
    for i, row in enumerate(quat_index):
        for first, last in spans:
            b = boresight[first:last].copy()
            if use_flags:
                b[(flags[first:last] & mask) != 0] = ident
            out[row, first:last] = qmult(b, focalplane[i][None, :])
    return out


def case_pointing_detector(name, n_samp, spans, with_flags, description):
    c = Case("pointing_detector", name, "pointing_detector", description)
    rng = rng_for(c.file)
    n_rows = 5
    quat_index = np.array([2, 0, 4, 1], dtype=np.int32)  # row 3 never written
    focalplane = random_quats(rng, (4,))
    boresight = random_quats(rng, (n_samp,))
    quats_in = random_quats(rng, (n_rows, n_samp))
    if with_flags:
        flags = np.where(rng.random(n_samp) < 0.25, rng.integers(1, 256, n_samp), 0).astype(np.uint8)
    else:
        flags = np.zeros(1, dtype=np.uint8)
    mask = 5
    iv, ivf = make_intervals(spans)
    quats = quats_in.copy()
    lt.pointing_detector(focalplane, boresight, quat_index, quats, iv, flags, mask, False)
    c.add(focalplane=focalplane, boresight=boresight, quat_index=quat_index)
    c.add(quats_in=quats_in, quats_out=quats, shared_flags=flags)
    c.scalar("shared_flag_mask", mask, np.uint8)
    c.add(**ivf)
    rep = pointing_replica(focalplane, boresight, quat_index, quats_in, spans, flags, mask)
    c.extra = {"numpy_replica_bitexact": bool(np.array_equal(rep, quats))}
    return c


# ---------------------------------------------------------------------------
# 2. pixels_healpix

PIX_SPANS = [(0, 300), (300, 301), (450, 1200), (1300, 1300), (1500, 2000)]


def pixels_inputs():
    """Quats, flags and indices shared by the six pixels_healpix cases."""
    rng = rng_for("pixels_healpix_inputs")
    n_samp = 2000
    quats = random_quats(rng, (4, n_samp))
    for row in range(4):
        quats[row, :N_SPECIAL] = special_quats(rng)
    flags = np.zeros(n_samp, dtype=np.uint8)
    flags[rng.random(n_samp) < 0.09] |= 2  # masked (mask 3)
    flags[rng.random(n_samp) < 0.09] |= 16  # present but not in the mask
    return quats, flags


def add_pixels_fields(c, quat_index, quats, flags, mask, pixel_index, pixels, hits, n_pix_submap,
                      nside, nest, ivf):
    """The fields of a pixels_healpix case; pixels and hits are (in, out) pairs."""
    c.add(quat_index=quat_index, quats=quats, shared_flags=flags)
    c.scalar("shared_flag_mask", mask, np.uint8)
    c.add(pixel_index=pixel_index, pixels_in=pixels[0], pixels_out=pixels[1])
    c.add(hit_submaps_in=hits[0], hit_submaps_out=hits[1])
    c.scalar("n_pix_submap", n_pix_submap, np.int64)
    c.scalar("nside", nside, np.int64)
    c.scalar("nest", 1 if nest else 0, np.uint8)
    c.add(**ivf)


def case_pixels_healpix(nest, nside, quats, flags):
    n_submap = 192 if nside <= 64 else 3072
    n_pix_submap = 12 * nside * nside // n_submap
    order = "NEST" if nest else "RING"
    c = Case(
        "pixels_healpix",
        f"{'nest' if nest else 'ring'}_nside{nside}",
        "pixels_healpix",
        f"{order} ordering, nside={nside}, n_submap={n_submap}; 3 dets (quat/pixel index "
        "permuted, pixel row 3 never written), first 55 samples of each quat row are special "
        "directions (exact poles, phi=0/pi/2/pi/-pi/2 on the equator, z=+-2/3 boundary, "
        "phi~2pi); shared flags mask 3 (bit 16 present but unmasked); flagged samples -> "
        "pixel -1 and no hit; hit_submaps_in has submaps 0 and last pre-set to 1",
    )
    n_samp = quats.shape[1]
    quat_index = np.array([3, 0, 1], dtype=np.int32)
    pixel_index = np.array([1, 2, 0], dtype=np.int32)
    pixels_in = np.full((4, n_samp), -7, dtype=np.int64)
    hits_in = np.zeros(n_submap, dtype=np.uint8)
    hits_in[0] = 1
    hits_in[-1] = 1
    mask = 3
    iv, ivf = make_intervals(PIX_SPANS)
    pixels = pixels_in.copy()
    hits = hits_in.copy()
    lt.pixels_healpix(
        quat_index, quats, flags, mask, pixel_index, pixels, iv, hits, n_pix_submap, nside, nest, False
    )
    add_pixels_fields(c, quat_index, quats, flags, mask, pixel_index, (pixels_in, pixels),
                      (hits_in, hits), n_pix_submap, nside, nest, ivf)
    c.extra = healpy_check(quats, flags, mask, quat_index, pixel_index, pixels, nside, nest)
    return c


def healpy_check(quats, flags, mask, quat_index, pixel_index, pixels, nside, nest):
    """Compare with healpy.vec2pix on TOAST's (un-normalised) direction vectors."""
    try:
        import healpy
    except ImportError:
        return {"healpy_available": False}
    total = 0
    bad = 0
    bad_random = 0
    for i in range(len(quat_index)):
        for first, last in PIX_SPANS:
            s = np.arange(first, last)
            s = s[(flags[s] & mask) == 0]
            if s.size == 0:
                continue
            v = rotate_toast(quats[quat_index[i], s], (0.0, 0.0, 1.0))
            hp = healpy.vec2pix(nside, v[:, 0], v[:, 1], v[:, 2], nest=bool(nest))
            diff = hp != pixels[pixel_index[i], s]
            total += s.size
            bad += int(diff.sum())
            bad_random += int(diff[s >= N_SPECIAL].sum())
    return {
        "healpy_vec2pix_mismatches": bad,
        "healpy_compared": total,
        "healpy_mismatches_random_dirs": bad_random,
    }


# ---------------------------------------------------------------------------
# 2b. boundary directions: pointing_detector then pixels_healpix at every nside
#
# Directions whose pixel is decided by the last bit of an intermediate value:
# the rotated z exactly 2/3 (the cap/belt boundary: 0.75*nside*z is then
# exactly nside/2), one ulp either side of it, the nearest values to -2/3
# (-2/3 itself is not reachable: TOAST's z = 1 + 2(-x^2 - y^2) has a zero
# last bit there), z = 0, and the poles; each at phi (as glibc's atan2
# returns it) exactly on the quadrant seams 0, pi/2, pi, -pi/2 and halfway
# between them (+-pi/4, +-3pi/4), and one ulp either side.  These are found by
# perturbing the last bits of a quaternion's components and keeping one whose
# direction, computed with TOAST's operation order (rotate_toast), hits the
# target exactly; the reference pixels then come from TOAST's compiled
# kernels.  The quaternions are made by TOAST's pointing_detector from a
# boresight and two focal-plane offsets (the identity and a tilted detector),
# the boresight searched so that the product lands on the target.

BOUNDARY_NSIDES = [1 << k for k in range(30)]  # every power of two up to 2^29
# every change of -3..3 ulps to each of the 4 components (7^4 candidates)
_ULP_STEPS = np.stack(np.meshgrid(*[np.arange(-3.0, 4.0)] * 4, indexing="ij"), axis=-1).reshape(-1, 4)


def boundary_targets():
    """(label, z, phi_lo, phi_hi): z exactly, atan2's phi in [phi_lo, phi_hi]."""
    z23 = 2.0 / 3.0
    zs = [
        ("z+2/3", z23),
        ("z+2/3+ulp", float(np.nextafter(z23, 2.0))),
        ("z+2/3-ulp", float(np.nextafter(z23, 0.0))),
        ("z-2/3-ulp", -float(np.nextafter(z23, 2.0))),
        ("z-2/3+ulp", -float(np.nextafter(z23, 0.0))),
        ("z0", 0.0),
    ]
    seams = [(f"phi{k}pi/4", k * math.pi / 4) for k in (0, 1, 2, 3, 4, -3, -2, -1)]
    out = []
    for zl, z in zs:
        for pl, phi in seams:
            out.append((f"{zl},{pl}", z, phi, phi))
    # one ulp either side of each seam, on the boundary and on the equator;
    # beside 0, a tiny phi of either sign (TOAST snaps |phi| < 10 eps to 0)
    for zl, z in (zs[0], zs[3], zs[5]):
        for pl, phi in seams:
            if phi == 0.0:
                out.append((f"{zl},{pl}+tiny", z, 1e-300, 1e-15))
                out.append((f"{zl},{pl}-tiny", z, -1e-15, -1e-300))
                continue
            if phi != math.pi:
                hi = float(np.nextafter(phi, 4.0))
                out.append((f"{zl},{pl}+ulp", z, hi, hi))
            lo = float(np.nextafter(phi, -4.0))
            out.append((f"{zl},{pl}-ulp", z, lo, lo))
    return out


def boundary_search(rng, z, phi_lo, phi_hi, fp):
    """A boresight b: rotate_toast(b * fp) has exactly z and atan2 in [phi_lo, phi_hi]."""
    for attempt in range(64):
        psi = rng.uniform(0, 2 * math.pi)
        want = dir_quat(math.acos(z), 0.5 * (phi_lo + phi_hi), psi)
        fp_conj = np.array([-fp[0], -fp[1], -fp[2], fp[3]])
        base = qmult(want, fp_conj)
        cand = base[None, :] + _ULP_STEPS * np.spacing(np.abs(base))[None, :]
        v = rotate_toast(qmult(cand, fp[None, :]), (0.0, 0.0, 1.0))
        best = None
        for i in np.nonzero(v[:, 2] == z)[0]:
            if phi_lo <= math.atan2(v[i, 1], v[i, 0]) <= phi_hi:
                err = abs(float(np.dot(cand[i], cand[i])) - 1.0)
                if best is None or err < best[0]:
                    best = (err, cand[i].copy())
        if best is not None:
            return best[1]
    raise RuntimeError(f"no boresight reaches z={z!r} phi in [{phi_lo!r}, {phi_hi!r}]")


BOUNDARY_FOCALPLANE = [
    np.array([0.0, 0.0, 0.0, 1.0]),  # on the boresight
    dir_quat(0.05, 1.0, 0.3),  # a detector 0.05 rad off axis
]


def boundary_boresight():
    """Boresight (S, 4) per focal-plane detector, and the sample labels."""
    rng = rng_for("boundary_directions")
    targets = boundary_targets()
    labels = ["north pole", "south pole", "south pole (y)"] + [t[0] for t in targets]
    labels += [f"dir_quat(acos({zs}2/3), {k}pi/4, random psi)" for zs in "+-" for k in range(8)]
    bores = []
    for fp in BOUNDARY_FOCALPLANE:
        fp_conj = np.array([-fp[0], -fp[1], -fp[2], fp[3]])
        poles = ([0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0])
        rows = [qmult(np.array(p), fp_conj) for p in poles]
        rows += [boundary_search(rng, z, lo, hi, fp) for _, z, lo, hi in targets]
        # as a pointing pipeline makes them: no search, the last bits as they come
        for zsign in (1.0, -1.0):
            for k in range(8):
                psi = rng.uniform(0, 2 * math.pi)
                rows.append(qmult(dir_quat(math.acos(zsign * 2.0 / 3.0), k * math.pi / 4, psi), fp_conj))
        bores.append(np.array(rows))
    return bores, labels


def case_pointing_boundary():
    """pointing_detector making the boundary quaternions: one call, 2 dets, 2S samples.

    Samples [0, S) carry the boresights searched for detector 0 and [S, 2S) those
    for detector 1, so quats_out[0, :S] and quats_out[1, S:] point at the targets.
    """
    bores, labels = boundary_boresight()
    n = len(labels)
    c = Case(
        "pointing_detector",
        "boundary",
        "pointing_detector",
        f"2 dets (focal-plane offsets: the identity and 0.05 rad off axis), {2 * n} samples: "
        f"boresights searched so that det 0's quats at samples [0,{n}) and det 1's at "
        f"[{n},{2 * n}) point exactly at HEALPix boundary directions (poles, z=2/3, z one ulp "
        "either side of +-2/3, z=0, phi on and one ulp off 0, +-pi/4, +-pi/2, +-3pi/4, pi) as "
        "TOAST's rotation computes them; they feed the pixels_healpix boundary cases",
    )
    focalplane = np.ascontiguousarray(np.array(BOUNDARY_FOCALPLANE))
    boresight = np.ascontiguousarray(np.concatenate(bores))
    quat_index = np.array([0, 1], dtype=np.int32)
    quats_in = np.full((2, 2 * n, 4), -7.0)
    flags = np.zeros(1, dtype=np.uint8)
    iv, ivf = make_intervals([(0, 2 * n)])
    quats = quats_in.copy()
    lt.pointing_detector(focalplane, boresight, quat_index, quats, iv, flags, 0, False)
    c.add(focalplane=focalplane, boresight=boresight, quat_index=quat_index)
    c.add(quats_in=quats_in, quats_out=quats, shared_flags=flags)
    c.scalar("shared_flag_mask", 0, np.uint8)
    c.add(**ivf)
    rep = pointing_replica(focalplane, boresight, quat_index, quats_in, [(0, 2 * n)], flags, 0)
    # the targets are hit by TOAST's own product, not only by the replica
    hit = []
    for det, (lo, hi) in enumerate(((0, n), (n, 2 * n))):
        v = rotate_toast(quats[det, lo:hi], (0.0, 0.0, 1.0))
        for (_, z, lo, hi), vv in zip(boundary_targets(), v[3 : 3 + len(boundary_targets())]):
            hit.append(bool(vv[2] == z and lo <= math.atan2(vv[1], vv[0]) <= hi))
    c.extra = {
        "numpy_replica_bitexact": bool(np.array_equal(rep, quats)),
        "targets_hit_bitexact": bool(all(hit)),
        "sample_labels": labels,
    }
    boundary = np.concatenate([quats[0, :n], quats[1, n:]])
    return c, boundary


def case_pixels_boundary(nest, nside, boundary, labels):
    """pixels_healpix on the boundary quats; sample i comes from det i % 2 of pointing."""
    order = "nest" if nest else "ring"
    n = boundary.shape[0] // 2
    idx = np.arange(n)
    quats = np.where((idx % 2 == 0)[:, None], boundary[:n], boundary[n:])[None, :, :]
    quats = np.ascontiguousarray(quats)
    quat_index = np.array([0], dtype=np.int32)
    pixel_index = np.array([0], dtype=np.int32)
    n_pix_submap = nside * nside
    hits_in = np.zeros(12, dtype=np.uint8)
    flags = np.zeros(1, dtype=np.uint8)
    dropped = []
    while True:
        n = quats.shape[1]
        pixels_in = np.full((1, n), -7, dtype=np.int64)
        iv, ivf = make_intervals([(0, n)])
        pixels = pixels_in.copy()
        hits = hits_in.copy()
        lt.pixels_healpix(
            quat_index, quats, flags, 0, pixel_index, pixels, iv, hits, n_pix_submap, nside, nest, False
        )
        # TOAST's pixel can fall outside the sphere here (RING, nside 2, z = 2/3 one ulp
        # below phi = 3pi/4: the belt formula gives ring 0 and pixel -1); toast-rs refuses
        # such a pixel as an error, so the sample is left out and named in the manifest.
        bad = np.nonzero((pixels[0] < 0) | (pixels[0] >= 12 * nside * nside))[0]
        if bad.size == 0:
            break
        for b in bad:
            dropped.append({"sample": labels[b], "toast_pixel": int(pixels[0, b])})
        keep = np.setdiff1d(np.arange(n), bad)
        quats = np.ascontiguousarray(quats[:, keep])
        labels = [labels[i] for i in keep]
    c = Case(
        "pixels_healpix",
        f"boundary_{order}_nside{nside}",
        "pixels_healpix",
        f"{order.upper()} ordering, nside={nside}=2^{nside.bit_length() - 1}, 12 submaps; 1 det, "
        f"{n} samples on HEALPix boundaries (the sample labels of pointing_detector_boundary; "
        "even samples from its det 0, odd from det 1): poles, z exactly 2/3, z one ulp either "
        "side of +-2/3, z=0, at phi exactly 0, +-pi/4, +-pi/2, +-3pi/4, pi and one ulp either "
        "side, and dir_quat(acos(+-2/3), k pi/4, psi) unsearched; no flags"
        + (f"; {len(dropped)} left out (TOAST's pixel is off the sphere, see extra)" if dropped else ""),
    )
    if dropped:
        c.extra = {"left_out": dropped}
    add_pixels_fields(c, quat_index, quats, flags, 0, pixel_index, (pixels_in, pixels),
                      (hits_in, hits), n_pix_submap, nside, nest, ivf)
    return c


# ---------------------------------------------------------------------------
# 3. stokes_weights_I


def case_stokes_I(name, n_samp, spans, description):
    c = Case("stokes_weights_I", name, "stokes_weights_I", description)
    rng = rng_for(c.file)
    weight_index = np.array([2, 0, 1], dtype=np.int32)
    weights_in = rng.uniform(-5, 5, (3, n_samp))
    cal = rng.uniform(0.7, 1.5, 3)
    iv, ivf = make_intervals(spans)
    weights = weights_in.copy()
    lt.stokes_weights_I(weight_index, weights, iv, cal, False)
    c.add(weight_index=weight_index, weights_in=weights_in, weights_out=weights, cal=cal)
    c.add(**ivf)
    return c


# ---------------------------------------------------------------------------
# 4. stokes_weights_IQU


def iqu_replica(quats, quat_index, weight_index, weights_in, hwp, spans, eps, gamma, cal, iau):
    out = weights_in.copy()
    n_samp = weights_in.shape[1]
    use_hwp = hwp.shape[0] == n_samp
    u_sign = -1.0 if iau else 1.0
    for i in range(len(quat_index)):
        eta = (1.0 - eps[i]) / (1.0 + eps[i])
        for first, last in spans:
            for s in range(first, last):
                q = quats[quat_index[i], s]
                vd = rotate_toast(q, (0.0, 0.0, 1.0))
                vo = rotate_toast(q, (1.0, 0.0, 0.0))
                ang_xy = math.atan2(vd[1], vd[0])
                vmx = vd[2] * math.cos(ang_xy)
                vmy = vd[2] * math.sin(ang_xy)
                arg = 1.0 - vd[2] * vd[2]
                vmz = -math.sqrt(arg) if arg >= 0 else math.nan
                ay = (
                    vd[0] * (vmy * vo[2] - vmz * vo[1])
                    - vd[1] * (vmx * vo[2] - vmz * vo[0])
                    + vd[2] * (vmx * vo[1] - vmy * vo[0])
                )
                ax = vmx * vo[0] + vmy * vo[1] + vmz * vo[2]
                alpha = math.atan2(ay, ax)
                w = out[weight_index[i], s]
                w[0] = cal[i]
                if use_hwp:
                    ang = 2.0 * (2.0 * (gamma[i] - hwp[s]) - alpha)
                    w[1] = math.cos(ang) * eta * cal[i]
                    w[2] = -math.sin(ang) * eta * cal[i] * u_sign
                else:
                    ang = 2.0 * alpha
                    w[1] = math.cos(ang) * eta * cal[i]
                    w[2] = math.sin(ang) * eta * cal[i] * u_sign
    return out


def case_stokes_IQU(name, n_samp, spans, use_hwp, iau, special, description):
    c = Case("stokes_weights_IQU", name, "stokes_weights_IQU", description)
    rng = rng_for(c.file)
    quat_index = np.array([1, 3, 0, 2], dtype=np.int32)
    weight_index = np.array([4, 2, 0, 1], dtype=np.int32)  # row 3 never written
    quats = random_quats(rng, (4, n_samp))
    extra = {}
    if special:
        for row in range(4):
            quats[row, :N_SPECIAL] = special_quats(rng)
        nan_q = find_nan_quat(rng)
        quats[:, 60] = nan_q
        extra["nan_sample"] = 60
    weights_in = rng.uniform(-9, 9, (5, n_samp, 3))
    hwp = rng.uniform(0, 2 * math.pi, n_samp) if use_hwp else np.zeros(1)
    epsilon = np.array([0.0, 0.01, 0.2, -0.05])
    gamma = rng.uniform(0, math.pi, 4)
    cal = np.array([1.0, 0.9, 1.1, 2.0])
    return run_stokes_IQU(c, quat_index, quats, weight_index, weights_in, hwp, spans,
                          epsilon, gamma, cal, iau, extra)


def run_stokes_IQU(c, quat_index, quats, weight_index, weights_in, hwp, spans, epsilon, gamma, cal,
                   iau, extra):
    """Run TOAST's stokes_weights_IQU on these inputs into case c, with the numpy
    replica's agreement in c.extra (beside `extra`)."""
    iv, ivf = make_intervals(spans)
    weights = weights_in.copy()
    lt.stokes_weights_IQU(
        quat_index, quats, weight_index, weights, hwp, iv, epsilon, gamma, cal, bool(iau), False
    )
    c.add(quat_index=quat_index, quats=quats, weight_index=weight_index)
    c.add(weights_in=weights_in, weights_out=weights, hwp=hwp, epsilon=epsilon, gamma=gamma, cal=cal)
    c.scalar("IAU", 1 if iau else 0, np.uint8)
    c.add(**ivf)
    rep = iqu_replica(quats, quat_index, weight_index, weights_in, hwp, spans, epsilon, gamma, cal, iau)
    same = np.array_equal(rep, weights, equal_nan=True)
    diff = np.abs(rep - weights)
    extra["numpy_replica_bitexact"] = bool(same)
    extra["numpy_replica_maxabsdiff"] = float(np.nanmax(diff)) if np.any(~np.isnan(diff)) else 0.0
    c.extra = extra
    return c


def seam_quats():
    """Pointings at the seams of stokes_weights_IQU's angles (FORMAT.md, section 4):
    rotations by pi about the axes and diagonals (w = 0 and w = cos(pi/2) = 6.1e-17),
    the poles at orientations k pi/4, the equator at phi = k pi/4 with orientations
    k pi/4, and directions 1e-8 and 1e-12 rad from the poles."""
    h = math.sqrt(0.5)
    out = []
    for ax in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (h, h, 0), (h, -h, 0), (h, 0, h), (0, h, -h)]:
        out.append([ax[0], ax[1], ax[2], 0.0])
        out.append([ax[0], ax[1], ax[2], math.cos(math.pi / 2)])
    for k in range(8):
        t = k * math.pi / 4
        out.append([0.0, 0.0, math.sin(t / 2), math.cos(t / 2)])  # north pole, orientation t
        out.append([math.cos(t / 2), math.sin(t / 2), 0.0, 0.0])  # south pole
    for kp in range(8):
        for ko in (0, 1, 2, 6):
            out.append(dir_quat(math.pi / 2, kp * math.pi / 4, ko * math.pi / 4))
    for theta in (1e-8, 1e-12, math.pi - 1e-8, math.pi - 1e-12):
        for kp in (0, 1, 2, 4):
            out.append(dir_quat(theta, kp * math.pi / 4, kp * math.pi / 2))
    q = np.array(out, dtype=np.float64)
    assert q.shape == (SEAM_QUATS, 4)
    return q


SEAM_QUATS = 14 + 16 + 32 + 16  # 78


def case_stokes_IQU_seams(name, use_hwp, iau, description):
    """stokes_weights_IQU at the seams of its angles: seam_quats() on every detector,
    detector angles gamma on multiples of pi/8, HWP angles on multiples of pi/16 and
    their neighbours one ulp away, so that 2 alpha and the HWP angle fall on (or one
    ulp beside) multiples of pi/2, where a device's sin and cos must give glibc's bits
    for the weights to match."""
    c = Case("stokes_weights_IQU", name, "stokes_weights_IQU", description)
    rng = rng_for(c.file)
    quat_index = np.array([1, 3, 0, 2], dtype=np.int32)
    weight_index = np.array([4, 2, 0, 1], dtype=np.int32)  # row 3 never written
    seams = seam_quats()
    n_samp = 3 * SEAM_QUATS
    quats = np.empty((4, n_samp, 4))
    for row in range(4):
        quats[row] = np.tile(seams, (3, 1))
    weights_in = rng.uniform(-9, 9, (5, n_samp, 3))
    if use_hwp:
        base = np.array([k * math.pi / 16 for k in range(n_samp)]) % (2 * math.pi)
        hwp = np.array([[b, math.nextafter(b, 9.0), math.nextafter(b, -9.0)][s % 3]
                        for s, b in enumerate(base)])
    else:
        hwp = np.zeros(1)
    epsilon = np.array([0.0, 0.01, 0.2, -0.05])
    gamma = np.array([0.0, math.pi / 8, math.pi / 4, math.pi / 2])
    cal = np.array([1.0, 0.9, 1.1, 2.0])
    return run_stokes_IQU(c, quat_index, quats, weight_index, weights_in, hwp, [(0, n_samp)],
                          epsilon, gamma, cal, iau, {})


def seam_cases():
    """The stokes_weights_IQU cases at the seams of its angles (generate_cases.py --seams)."""
    yield case_stokes_IQU_seams("seams_nohwp_cosmo", False, False,
                                "seam pointings (poles, rotations by pi, equator at k pi/4), no HWP, COSMO")
    yield case_stokes_IQU_seams("seams_nohwp_iau", False, True,
                                "seam pointings, no HWP, IAU convention")
    yield case_stokes_IQU_seams("seams_hwp_cosmo", True, False,
                                "seam pointings, HWP angles k pi/16 and one ulp beside, gamma k pi/8, COSMO")
    yield case_stokes_IQU_seams("seams_hwp_iau", True, True,
                                "seam pointings, HWP angles k pi/16 and one ulp beside, gamma k pi/8, IAU")


# ---------------------------------------------------------------------------
# 5. scan_map

SCAN_SPANS = [(0, 150), (150, 152), (300, 300), (310, 600)]


def local_submap_layout(rng, n_global, n_local):
    """global2local with n_local randomly chosen, permuted local submaps; -1 elsewhere."""
    g2l = np.full(n_global, -1, dtype=np.int64)
    chosen = np.sort(rng.choice(n_global, n_local, replace=False))
    g2l[chosen] = rng.permutation(n_local)
    return g2l, chosen


def random_pixels(rng, shape, chosen, n_pix_submap, frac_bad):
    sub = rng.choice(chosen, size=shape)
    pix = sub * n_pix_submap + rng.integers(0, n_pix_submap, size=shape)
    pix[rng.random(shape) < frac_bad] = -1
    return pix.astype(np.int64)


SCAN_FUNCS = {
    "f64": ("ops_scan_map_float64", np.float64),
    "f32": ("ops_scan_map_float32", np.float32),
    "i64": ("ops_scan_map_int64", np.int64),
    "i32": ("ops_scan_map_int32", np.int32),
}


def case_scan_map(name, dt, nnz, scale, zero, subtract, do_scale):
    func, dtype = SCAN_FUNCS[dt]
    c = Case(
        "scan_map",
        name,
        func,
        f"mapdata dtype {np.dtype(dtype).name}, nnz={nnz} ({'3-D' if nnz > 1 else '2-D'} weights), "
        f"data_scale={scale}, should_zero={zero}, should_subtract={subtract}, "
        f"should_scale={do_scale}; 20 of 48 submaps local (global2local permuted, -1 for "
        "non-local); pixels -1 for ~10% samples and for all of pixel row 1; det_data row 1 "
        "never written",
    )
    rng = rng_for(c.file)
    n_samp, n_pix_submap = 600, 64
    g2l, chosen = local_submap_layout(rng, 48, 20)
    if dtype in (np.float64, np.float32):
        mapdata = rng.normal(size=(20, n_pix_submap, nnz)).astype(dtype)
    else:
        mapdata = rng.integers(-1000, 1000, size=(20, n_pix_submap, nnz)).astype(dtype)
    det_data_in = rng.normal(size=(4, n_samp))
    data_index = np.array([2, 3, 0], dtype=np.int32)
    pixels = random_pixels(rng, (4, n_samp), chosen, n_pix_submap, 0.1)
    pixels[1] = -1
    pixel_index = np.array([0, 1, 3], dtype=np.int32)
    if nnz == 1:
        weights = rng.normal(size=(4, n_samp))
    else:
        weights = rng.normal(size=(4, n_samp, nnz))
    weight_index = np.array([3, 0, 2], dtype=np.int32)
    iv, ivf = make_intervals(SCAN_SPANS)
    det_data = det_data_in.copy()
    getattr(lt, func)(
        g2l,
        n_pix_submap,
        mapdata,
        det_data,
        data_index,
        pixels,
        pixel_index,
        weights.reshape((4, n_samp, nnz)),
        weight_index,
        iv,
        scale,
        bool(zero),
        bool(subtract),
        bool(do_scale),
        False,
    )
    c.add(global2local=g2l)
    c.scalar("n_pix_submap", n_pix_submap, np.int64)
    c.add(mapdata=mapdata, det_data_in=det_data_in, det_data_out=det_data, data_index=data_index)
    c.add(pixels=pixels, pixel_index=pixel_index, weights=weights, weight_index=weight_index)
    c.scalar("data_scale", float(scale), np.float64)
    c.scalar("should_zero", int(zero), np.uint8)
    c.scalar("should_subtract", int(subtract), np.uint8)
    c.scalar("should_scale", int(do_scale), np.uint8)
    c.add(**ivf)
    return c


# ---------------------------------------------------------------------------
# 6. build_noise_weighted

BNW_SPANS = [(0, 400), (400, 401), (700, 700), (800, 1500)]


def bnw_replica(g2l, zmap_in, pixel_index, pixels, weight_index, weights, data_index, det_data,
                flag_index, det_flags, det_scale, det_mask, spans, shared_flags, shared_mask):
    zmap = zmap_in.copy()
    nps = zmap.shape[1]
    n_samp = pixels.shape[1]
    use_det = det_flags.shape[1] == n_samp
    use_shared = shared_flags.shape[0] == n_samp
    w3 = weights.reshape((weights.shape[0], weights.shape[1], -1))
    for i in range(len(pixel_index)):
        for first, last in spans:
            for s in range(first, last):
                if use_det and (det_flags[flag_index[i], s] & det_mask) != 0:
                    continue
                if use_shared and (shared_flags[s] & shared_mask) != 0:
                    continue
                pix = pixels[pixel_index[i], s]
                if pix < 0:
                    continue
                g = pix // nps
                scaled = det_data[data_index[i], s] * det_scale[i]
                for k in range(zmap.shape[2]):
                    zmap[g2l[g], pix - g * nps, k] += scaled * w3[weight_index[i], s, k]
    return zmap


def case_bnw(name, nnz, with_flags, description):
    c = Case("build_noise_weighted", name, "build_noise_weighted", description)
    rng = rng_for(c.file)
    n_samp, nps, n_rows = 1500, 16, 5
    g2l, chosen = local_submap_layout(rng, 48, 12)
    zmap_in = rng.normal(size=(12, nps, nnz))
    pixel_index = np.array([4, 0, 2, 1], dtype=np.int32)
    pixels = random_pixels(rng, (n_rows, n_samp), chosen, nps, 0.05)
    weight_index = np.array([0, 4, 1, 3], dtype=np.int32)
    weights = rng.normal(size=(n_rows, n_samp)) if nnz == 1 else rng.normal(size=(n_rows, n_samp, nnz))
    data_index = np.array([1, 2, 4, 0], dtype=np.int32)
    det_data = rng.normal(size=(n_rows, n_samp))
    det_scale = np.array([1.5, 0.25, 3.0, 0.001])
    det_mask, shared_mask = 5, 2
    if with_flags:
        flag_index = np.array([3, 1, 0, 4], dtype=np.int32)
        det_flags = np.zeros((n_rows, n_samp), dtype=np.uint8)
        for bit, p in ((1, 0.08), (4, 0.3), (8, 0.08)):  # bit 8 is not in the mask
            det_flags[rng.random((n_rows, n_samp)) < p] |= bit
        det_flags[flag_index[1]] |= np.where(rng.random(n_samp) < 0.5, 1, 4).astype(np.uint8)
        shared_flags = np.zeros(n_samp, dtype=np.uint8)
        shared_flags[rng.random(n_samp) < 0.09] |= 1  # not in the mask
        shared_flags[rng.random(n_samp) < 0.09] |= 2
    else:
        flag_index = np.full(4, -1, dtype=np.int32)
        det_flags = np.zeros((1, 1), dtype=np.uint8)
        shared_flags = np.zeros(1, dtype=np.uint8)
    iv, ivf = make_intervals(BNW_SPANS)
    zmap = zmap_in.copy()
    lt.build_noise_weighted(
        g2l, zmap, pixel_index, pixels, weight_index, weights.reshape((n_rows, n_samp, nnz)),
        data_index, det_data, flag_index, det_flags, det_scale, det_mask, iv, shared_flags,
        shared_mask, False,
    )
    c.add(global2local=g2l, zmap_in=zmap_in, zmap_out=zmap, pixel_index=pixel_index, pixels=pixels)
    c.add(weight_index=weight_index, weights=weights, data_index=data_index, det_data=det_data)
    c.add(flag_index=flag_index, det_flags=det_flags, det_scale=det_scale)
    c.scalar("det_flag_mask", det_mask, np.uint8)
    c.add(shared_flags=shared_flags)
    c.scalar("shared_flag_mask", shared_mask, np.uint8)
    c.add(**ivf)
    rep = bnw_replica(g2l, zmap_in, pixel_index, pixels, weight_index, weights, data_index,
                      det_data, flag_index, det_flags, det_scale, det_mask, BNW_SPANS,
                      shared_flags, shared_mask)
    c.extra = {"sequential_replica_bitexact": bool(np.array_equal(rep, zmap))}
    return c


# ---------------------------------------------------------------------------
# 7. noise_weight


def case_noise_weight(name, n_samp, spans, description):
    c = Case("noise_weight", name, "noise_weight", description)
    rng = rng_for(c.file)
    det_data_in = rng.normal(size=(5, n_samp))
    data_index = np.array([3, 1, 4, 0], dtype=np.int32)  # row 2 never written
    weights = np.array([2.0, 0.5, 1.0e4, -1.0])
    iv, ivf = make_intervals(spans)
    det_data = det_data_in.copy()
    lt.noise_weight(det_data, data_index, iv, weights, False)
    c.add(det_data_in=det_data_in, det_data_out=det_data, data_index=data_index, detector_weights=weights)
    c.add(**ivf)
    return c


# ---------------------------------------------------------------------------
# 8-10. template_offset_*


def offset_layout(spans, step, n_det, lead=3, trail=2):
    n_amp_views = np.array([-(-(last - first) // step) for first, last in spans], dtype=np.int64)
    per_det = int(n_amp_views.sum())
    amp_offset = np.array([lead + d * per_det for d in range(n_det)], dtype=np.int64)
    n_amp = lead + n_det * per_det + trail
    return n_amp_views, amp_offset, n_amp


OFFSET_SETUPS = {
    7: [(0, 50), (60, 83), (90, 90), (100, 101), (150, 400)],
    40: [(3, 13), (13, 53), (100, 300)],
}
CALL_DATA_INDEX = np.array([4, 0, 2, 1], dtype=np.int32)  # det_data row 3 never touched


def case_offset_add(name, step, description):
    c = Case("template_offset_add_to_signal", name, "template_offset_add_to_signal", description)
    rng = rng_for(c.file)
    spans = OFFSET_SETUPS[step]
    n_amp_views, amp_offset, n_amp = offset_layout(spans, step, 4)
    amplitudes = rng.normal(size=n_amp)
    amp_flags = (rng.random(n_amp) < 0.15).astype(np.uint8)
    det_data_in = rng.normal(size=(5, 400))
    iv, ivf = make_intervals(spans)
    det_data = det_data_in.copy()
    for d in range(4):
        lt.template_offset_add_to_signal(
            step, int(amp_offset[d]), n_amp_views, amplitudes, amp_flags, int(CALL_DATA_INDEX[d]),
            det_data, iv, False,
        )
    c.scalar("step_length", step, np.int64)
    c.add(n_amp_views=n_amp_views, amplitudes=amplitudes, amplitude_flags=amp_flags)
    c.add(call_data_index=CALL_DATA_INDEX, call_amp_offset=amp_offset)
    c.add(det_data_in=det_data_in, det_data_out=det_data)
    c.add(**ivf)
    return c


def case_offset_project(name, step, with_flags, description):
    c = Case("template_offset_project_signal", name, "template_offset_project_signal", description)
    rng = rng_for(c.file)
    spans = OFFSET_SETUPS[step]
    n_amp_views, amp_offset, n_amp = offset_layout(spans, step, 4)
    det_data = rng.normal(size=(5, 400))
    mask = 3
    if with_flags:
        call_flag_index = np.array([1, 3, 0, 4], dtype=np.int32)
        flag_data = np.zeros((5, 400), dtype=np.uint8)
        for bit, p in ((1, 0.2), (2, 0.08), (4, 0.2)):  # bit 4 is not in the mask
            flag_data[rng.random((5, 400)) < p] |= bit
    else:
        call_flag_index = np.full(4, -1, dtype=np.int32)
        flag_data = np.zeros(1, dtype=np.uint8)
    amplitudes_in = rng.normal(size=n_amp)
    amp_flags = (rng.random(n_amp) < 0.12).astype(np.uint8)
    iv, ivf = make_intervals(spans)
    amplitudes = amplitudes_in.copy()
    for d in range(4):
        lt.template_offset_project_signal(
            int(CALL_DATA_INDEX[d]), det_data, int(call_flag_index[d]), flag_data, mask, step,
            int(amp_offset[d]), n_amp_views, amplitudes, amp_flags, iv, False,
        )
    c.add(call_data_index=CALL_DATA_INDEX, det_data=det_data, call_flag_index=call_flag_index)
    c.add(flag_data=flag_data)
    c.scalar("flag_mask", mask, np.uint8)
    c.scalar("step_length", step, np.int64)
    c.add(call_amp_offset=amp_offset, n_amp_views=n_amp_views, amplitudes_in=amplitudes_in)
    c.add(amplitudes_out=amplitudes, amplitude_flags=amp_flags)
    c.add(**ivf)
    return c


def case_precond(name, n_amp, frac_flagged, description):
    c = Case("template_offset_apply_diag_precond", name, "template_offset_apply_diag_precond", description)
    rng = rng_for(c.file)
    offset_var = rng.uniform(0.1, 2.0, n_amp)
    amps_in = rng.normal(size=n_amp)
    flagged = rng.random(n_amp) < frac_flagged
    if frac_flagged >= 1.0:
        flagged[:] = True
    # Any non-zero value counts as flagged; flagged entries carry NaN that must never be read.
    amp_flags = np.where(flagged, rng.integers(1, 256, n_amp), 0).astype(np.uint8)
    offset_var[flagged] = np.nan
    amps_in[flagged] = np.nan
    out_in = rng.normal(scale=1.0e6, size=n_amp)  # garbage, to show it is overwritten
    out = out_in.copy()
    lt.template_offset_apply_diag_precond(offset_var, amps_in, amp_flags, out, False)
    c.add(offset_var=offset_var, amplitudes_in=amps_in, amplitude_flags=amp_flags)
    c.add(amplitudes_out_in=out_in, amplitudes_out_out=out)
    return c


# ---------------------------------------------------------------------------


def all_cases():
    yield case_pointing_detector(
        "flags", 1000, [(0, 137), (200, 531), (600, 601), (700, 1000)], True,
        "4 dets, 5 quat rows (row 3 never written), 4 intervals incl. a 1-sample one, random "
        "shared flags with mask 5 (flagged samples use identity boresight)",
    )
    yield case_pointing_detector(
        "noflags_empty", 777, [(10, 10), (0, 50), (400, 777), (60, 61)], False,
        "shared_flags has length 1 (!= n_samp) so flags are ignored; includes an empty interval "
        "(first==last) and unsorted intervals",
    )
    quats, flags = pixels_inputs()
    for nside in (64, 8192, 1048576):
        for nest in (True, False):
            yield case_pixels_healpix(nest, nside, quats, flags)
    pointing, boundary = case_pointing_boundary()
    yield pointing
    for nside in BOUNDARY_NSIDES:
        for nest in (True, False):
            yield case_pixels_boundary(nest, nside, boundary, pointing.extra["sample_labels"])
    yield case_stokes_I("basic", 500, [(0, 100), (150, 151), (300, 500)],
                        "3 dets, weight_index permuted, 3 intervals")
    yield case_stokes_I("empty_full", 257, [(5, 5), (0, 257)],
                        "empty interval followed by an interval covering everything")
    yield case_stokes_IQU("nohwp_cosmo", 800, [(0, 100), (100, 350), (500, 800)], False, False, False,
                          "no HWP (hwp array length 1), COSMO convention")
    yield case_stokes_IQU("hwp_iau", 800, [(20, 21), (40, 700)], True, True, False,
                          "HWP angle per sample, IAU convention (U sign flipped)")
    yield case_stokes_IQU(
        "hwp_cosmo_special", 300, [(0, 300), (7, 7)], True, False, True,
        "HWP, COSMO; quats include exact poles (identity = what flagged samples get from "
        "pointing_detector), z=+-2/3 boundaries, and at sample 60 a unit quaternion (a,b,0,0) "
        "whose rotated z has z<-1 by rounding, which makes the compiled kernel produce NaN Q/U",
    )
    yield from seam_cases()
    yield case_scan_map("f64_nnz3_add", "f64", 3, 1.0, 0, 0, 0)
    yield case_scan_map("f64_nnz3_zero_subtract", "f64", 3, 2.5, 1, 1, 0)
    yield case_scan_map("f32_nnz1_scale", "f32", 1, 0.5, 0, 0, 1)
    yield case_scan_map("i64_nnz3_zero", "i64", 3, 1.0, 1, 0, 0)
    yield case_scan_map("i32_nnz1_add", "i32", 1, -3.0, 0, 0, 0)
    yield case_bnw(
        "nnz3_flags", 3, True,
        "nnz=3, det flags (mask 5, bit 8 unmasked) and shared flags (mask 2, bit 1 unmasked), "
        "detector 1 fully flagged, ~5% pixels -1, zmap starts non-zero (kernel accumulates), "
        "n_pix_submap=16 so pixels are hit many times",
    )
    yield case_bnw(
        "nnz1_noflags", 1, False,
        "nnz=1 with 2-D weights, det_flags shape (1,1) + flag_index all -1 and shared_flags "
        "length 1 -> no flagging at all",
    )
    yield case_noise_weight("basic", 700, [(0, 100), (120, 121), (300, 700)],
                            "4 dets, data_index permuted with an untouched extra row")
    yield case_noise_weight(
        "empty_overlap", 300, [(50, 50), (0, 200), (150, 250)],
        "empty interval; intervals [0,200) and [150,250) OVERLAP, so samples 150..199 are "
        "multiplied twice (kernel does not de-duplicate)",
    )
    yield case_offset_add(
        "step7_multidet", 7,
        "step_length 7, 5 views incl. empty and 1-sample views, partial last step in each view; "
        "4 detectors called in sequence; n_amp=201 (3 unused leading, 2 unused trailing)",
    )
    yield case_offset_add(
        "step40_short_views", 40,
        "step_length 40 longer than the first view (1 amplitude covering 10 samples); 4 "
        "detectors; n_amp=33 (3 unused leading, 2 unused trailing)",
    )
    yield case_offset_project(
        "step7_flags", 7, True,
        "step_length 7, det flags with flag_mask 3 (bit 4 unmasked), 4 detectors called in "
        "sequence; n_amp=201; amplitudes_in non-zero (kernel accumulates)",
    )
    yield case_offset_project(
        "step40_noflags", 40, False,
        "flag_index = -1 (flag_data is a dummy length-1 array and is never read), step 40 > "
        "first view length; n_amp=33; amplitudes_in non-zero (kernel accumulates)",
    )
    yield case_precond("basic", 257, 0.2,
                       "~20% flagged; flagged entries have NaN in amplitudes_in and offset_var, "
                       "and still give exactly 0.0")
    yield case_precond("allflagged", 31, 1.0, "every amplitude flagged -> output all 0.0")
    yield case_precond("empty", 0, 0.2, "n_amp = 0")
    yield from cov_apply_cases()
    yield from amp_cases()
    yield from fused_cases()
    yield from noise_cases()
    yield from cov_timestream_cases()
    yield from solver_flags_cases()


# ---------------------------------------------------------------------------
# 15. cov_apply_diag (libtoast map_cov): vec <- mat vec per pixel.  No LAPACK,
# so made in the main process with the other cases.

def cov_apply_replica(nsub, nsubpix, nnz, mat, vec_in):
    out = vec_in.copy()
    if nsub < 1 or nsubpix < 1:
        return out
    block = nnz * (nnz + 1) // 2
    for p in range(nsub * nsubpix):
        t = [0.0] * nnz
        off = p * block
        v = out[p * nnz:(p + 1) * nnz].copy()
        for j in range(nnz):
            for k in range(j, nnz):
                t[j] += mat[off] * v[k]
                if k != j:
                    t[k] += mat[off] * v[j]
                off += 1
        out[p * nnz:(p + 1) * nnz] = t
    return out


def case_cov_apply(name, nsub, nsubpix, nnz, description):
    c = Case("cov_apply_diag", name, "cov_apply_diag", description)
    rng = rng_for(c.file)
    block = nnz * (nnz + 1) // 2
    npix = max(nsub, 2) * nsubpix
    mat = rng.uniform(-2.0, 2.0, npix * block)
    vec_in = rng.uniform(-5.0, 5.0, npix * nnz)
    if nsub >= 1:
        # a pixel cut by the rcond threshold: a zero matrix gives exactly 0
        mat[:block] = 0.0
        # a diagonal matrix (off-diagonal terms exactly 0)
        diag = [j * nnz - j * (j - 1) // 2 for j in range(nnz)]
        m1 = np.zeros(block)
        m1[diag] = rng.uniform(0.5, 1.5, nnz)
        mat[block:2 * block] = m1
    vec = vec_in.copy()
    lt.cov_apply_diag(nsub, nsubpix, nnz, mat, vec)
    c.scalar("nsub", nsub, np.int64)
    c.scalar("nsubpix", nsubpix, np.int64)
    c.scalar("nnz", nnz, np.int64)
    c.add(mat=mat, vec_in=vec_in, vec_out=vec)
    rep = cov_apply_replica(nsub, nsubpix, nnz, mat, vec_in)
    c.extra = {"numpy_replica_bitexact": bool(np.array_equal(rep, vec))}
    return c


def cov_apply_cases():
    yield case_cov_apply(
        "nnz3", 5, 8, 3,
        "nnz=3 (block 6: II IQ IU QQ QU UU), 5 submaps of 8 pixels, random packed matrices "
        "(not necessarily positive definite: the kernel does not care); pixel 0 has a zero "
        "matrix (a cut pixel: exactly 0 out), pixel 1 a diagonal one",
    )
    yield case_cov_apply(
        "nnz1", 3, 16, 1,
        "nnz=1: vec <- mat * vec per pixel; pixel 0 zero",
    )
    yield case_cov_apply(
        "nnz6", 2, 4, 6,
        "nnz=6 (block 21): the generic loop beyond the common sizes",
    )
    yield case_cov_apply(
        "nsub0", 0, 4, 3,
        "nsub=0: the kernel returns before reading anything, vec unchanged (the arrays have 2 "
        "submaps of room)",
    )


# ---------------------------------------------------------------------------
# 16-17. amp_dot, amp_axpby: the PCG solver's vector kernels.  Not TOAST
# registry kernels (TOAST's solver does this work in numpy on the host), so the
# reference is plain Python / numpy arithmetic in the order FORMAT.md section
# 16 states: the partial sums in index order with Python floats (IEEE doubles),
# y <- (alpha x) + (beta y) with numpy's separate multiply and add (y <- alpha x
# when beta = 0).

def amp_dot_reference(n, nblock, a, b, flags):
    chunk = -(-n // nblock) if n > 0 else 0
    out = np.zeros(nblock)
    for k in range(nblock):
        lo = min(k * chunk, n)
        hi = min(lo + chunk, n)
        s = 0.0
        for i in range(lo, hi):
            if flags[i] == 0:
                s += float(a[i]) * float(b[i])
        out[k] = s
    return out


def case_amp_dot(name, n, nblock, frac_flagged, description):
    c = Case("amp_dot", name, "none (PCG dot product, numpy reference)", description)
    rng = rng_for(c.file)
    a = rng.uniform(-3.0, 3.0, n)
    b = rng.uniform(-3.0, 3.0, n)
    flags = u8(rng.uniform(size=n) < frac_flagged)
    # flagged entries are skipped, not multiplied: NaN there never reaches a sum
    a[flags != 0] = np.nan
    c.scalar("n", n, np.int64)
    c.scalar("nblock", nblock, np.int64)
    c.add(a=a, b=b, flags=flags, partials=amp_dot_reference(n, nblock, a, b, flags))
    return c


def case_amp_axpby(name, n, alpha, beta, description):
    c = Case("amp_axpby", name, "none (PCG vector update, numpy reference)", description)
    rng = rng_for(c.file)
    x = rng.uniform(-4.0, 4.0, n)
    y_in = rng.uniform(-4.0, 4.0, n)
    if beta == 0.0:
        # y is not read (BLAS): NaN there does not reach y_out
        y_in[::7] = np.nan
        y_out = np.multiply(alpha, x)
    else:
        y_out = np.multiply(alpha, x) + np.multiply(beta, y_in)
    c.scalar("n", n, np.int64)
    c.scalar("alpha", alpha, np.float64)
    c.scalar("beta", beta, np.float64)
    c.add(x=x, y_in=y_in, y_out=y_out)
    return c


def amp_cases():
    yield case_amp_dot(
        "blocks7", 1000, 7, 0.2,
        "n=1000 in 7 blocks of 143 (the last 142); ~20% flagged, NaN in a there (skipped)",
    )
    yield case_amp_dot(
        "one_block", 257, 1, 0.1,
        "one block: the plain sequential flagged dot product (the CPU solver's)",
    )
    yield case_amp_dot(
        "blocks_past_end", 5, 8, 0.0,
        "n=5 in 8 blocks of 1: blocks 5-7 are empty and hold 0.0",
    )
    yield case_amp_dot("empty", 0, 3, 0.0, "n=0: every partial is 0.0")
    yield case_amp_axpby("x_plus_alpha_d", 300, 0.7310585786300049, 1.0,
                         "x += alpha d: alpha, beta = 1")
    yield case_amp_axpby("r_minus_alpha_q", 300, -0.7310585786300049, 1.0,
                         "r -= alpha q: -alpha, beta = 1 (the same bits as r - alpha q)")
    yield case_amp_axpby("d_beta_plus_s", 300, 1.0, 0.2689414213699951,
                         "d <- beta d + s: alpha = 1, beta")
    yield case_amp_axpby("copy_beta0", 120, 1.0, 0.0,
                         "beta = 0: y <- alpha x without reading y (NaN in y_in every 7th "
                         "entry); alpha = 1: an exact copy (r = b, d = s)")
    yield case_amp_axpby("empty", 0, 2.0, 3.0, "n=0: nothing is read or written")


# ---------------------------------------------------------------------------
# 11-14. cov_accum_diag_hits, cov_accum_diag_invnpp (libtoast map_cov),
# filter_polynomial and filter_poly2D (libtoast tod_filter).  Made by the pinned
# child process (see PINNED_ENV) into OUTDIR/.pinned/, then merged into OUTDIR
# and its manifest (after the other cases) by main().

PINNED_KERNELS = ("cov_accum_diag_hits", "cov_accum_diag_invnpp", "filter_polynomial",
                   "filter_poly2D")


def local_pixel_indices(rng, n_samp, nsub, nsubpix, frac_nonlocal, frac_bad):
    """(submap, subpix) int64 per sample as mapmaker_utils makes them: the local
    submap (-1 for a submap not local to this process, global2local = -1) and
    the pixel in it (-1 for flagged samples / bad pointing)."""
    submap = rng.integers(0, nsub, n_samp).astype(np.int64)
    submap[rng.random(n_samp) < frac_nonlocal] = -1
    # a few submaps get most of the samples, so pixels are hit many times
    subpix = rng.integers(0, nsubpix, n_samp).astype(np.int64)
    subpix[rng.random(n_samp) < frac_bad] = -1
    return submap, subpix


def case_cov_hits(name, nsub, nsubpix, n_samp, description):
    c = Case("cov_accum_diag_hits", name, "cov_accum_diag_hits", description)
    rng = rng_for(c.file)
    nsub_alloc = max(nsub, 2)
    submap, subpix = local_pixel_indices(rng, n_samp, nsub_alloc, nsubpix, 0.1, 0.1)
    hits_in = rng.integers(0, 5, nsub_alloc * nsubpix).astype(np.int64)
    hits_in[: nsubpix // 2] = 0  # a stretch of unobserved pixels that stays 0
    if nsub > 0:
        # submap 1 is never hit: every sample there is non-local
        submap[submap == 1] = -1
    hits = hits_in.copy()
    nnz = 3
    lt.cov_accum_diag_hits(nsub, nsubpix, nnz, submap, subpix, hits, False)
    c.scalar("nsub", nsub, np.int64)
    c.scalar("nsubpix", nsubpix, np.int64)
    c.scalar("nnz", nnz, np.int64)
    c.add(submap=submap, subpix=subpix, hits_in=hits_in, hits_out=hits)
    rep = hits_in.copy()
    if nsub >= 1:
        for sm, px in zip(submap, subpix):
            if sm >= 0 and px >= 0:
                rep[sm * nsubpix + px] += 1
    c.extra = {"numpy_replica_bitexact": bool(np.array_equal(rep, hits))}
    return c


def invnpp_replica(nsub, nsubpix, nnz, submap, subpix, weights, scale, invnpp_in):
    out = invnpp_in.copy()
    if nsub < 1:
        return out
    block = nnz * (nnz + 1) // 2
    w = weights.reshape(-1, nnz)
    for i, (sm, px) in enumerate(zip(submap, subpix)):
        if sm < 0 or px < 0:
            continue
        off = (sm * nsubpix + px) * block
        for j in range(nnz):
            sw = w[i, j] * scale
            for k in range(j, nnz):
                out[off] += w[i, k] * sw
                off += 1
    return out


def case_cov_invnpp(name, nsub, nsubpix, nnz, n_samp, scale, zero_start, description):
    c = Case("cov_accum_diag_invnpp", name, "cov_accum_diag_invnpp", description)
    rng = rng_for(c.file)
    block = nnz * (nnz + 1) // 2
    submap, subpix = local_pixel_indices(rng, n_samp, nsub, nsubpix, 0.1, 0.08)
    submap[submap == nsub - 1] = -1  # the last submap is never hit (zero covariance)
    weights = rng.uniform(-1.0, 1.0, (n_samp, nnz))
    weights[:, 0] = 1.0  # I weight, as stokes_weights_IQU makes it
    weights = np.ascontiguousarray(weights.reshape(-1))  # the operator passes wts.reshape(-1)
    if zero_start:
        invnpp_in = np.zeros(nsub * nsubpix * block)
    else:
        invnpp_in = rng.uniform(-2.0, 2.0, nsub * nsubpix * block)
    invnpp = invnpp_in.copy()
    lt.cov_accum_diag_invnpp(nsub, nsubpix, nnz, submap, subpix, weights, scale, invnpp, False)
    c.scalar("nsub", nsub, np.int64)
    c.scalar("nsubpix", nsubpix, np.int64)
    c.scalar("nnz", nnz, np.int64)
    c.add(submap=submap, subpix=subpix, weights=weights)
    c.scalar("scale", scale, np.float64)
    c.add(invnpp_in=invnpp_in, invnpp_out=invnpp)
    rep = invnpp_replica(nsub, nsubpix, nnz, submap, subpix, weights, scale, invnpp_in)
    c.extra = {"numpy_replica_bitexact": bool(np.array_equal(rep, invnpp))}
    return c


def case_filter_polynomial(name, order, n_samp, spans, description, n_signal=3):
    c = Case("filter_polynomial", name, "filter_polynomial", description)
    rng = rng_for(c.file)
    t = np.linspace(-1.0, 1.0, n_samp)
    signals_in = np.empty((n_signal, n_samp))
    for k in range(n_signal):
        coef = rng.normal(0.0, 3.0, 4)
        signals_in[k] = (
            100.0 * (k + 1) + coef[0] * t + coef[1] * t**2 + coef[2] * np.sin(7 * t)
            + rng.normal(0.0, 0.5, n_samp)
        )
    flags = np.zeros(n_samp, dtype=np.uint8)
    flags[rng.random(n_samp) < 0.15] = 1
    flags[rng.random(n_samp) < 0.05] = 128  # any nonzero value flags: there is no mask
    starts = np.array([s for s, _ in spans], dtype=np.int64)
    stops = np.array([e for _, e in spans], dtype=np.int64)
    # per-span flag patterns named in the span list
    for (s, e), kind in zip(spans, [k for k in description_kinds(description, len(spans))]):
        lo, hi = max(s, 0), min(e, n_samp)
        if kind == "allflagged":
            flags[lo:hi] = 1
        elif kind == "fewgood":
            flags[lo:hi] = 1
            flags[lo + 1 : hi : max(1, (hi - lo) // 3)] = 0
        elif kind == "clean":
            flags[lo:hi] = 0
    signals = signals_in.copy()
    lt.filter_polynomial(order, flags, [signals[k] for k in range(n_signal)], starts, stops, False)
    c.scalar("order", order, np.int64)
    c.add(flags=flags, signals_in=signals_in, signals_out=signals, starts=starts, stops=stops)
    c.extra = {"norder_per_scan": [
        int(min(int(np.sum(flags[max(s, 0):min(e, n_samp)] == 0)), order + 1))
        if min(e, n_samp) >= max(s, 0) else 0
        for s, e in spans
    ]}
    return c


def description_kinds(description, n):
    """The flag pattern of each span, from the `[kinds: a,b,...]` tag of a description."""
    tag = description.split("[kinds: ")[1].split("]")[0].split(",")
    assert len(tag) == n, (tag, n)
    return tag


def poly2d_templates(x, y, order, square=False):
    """The 2-D polynomial templates x^i y^j, i + j <= order; with `square`, every
    i, j <= order in PolyFilter2D's own order (i slowest: (order + 1)^2 modes)."""
    cols = []
    for i in range(order + 1):
        for j in range(order + 1 if square else order + 1 - i):
            cols.append(x**i * y**j)
    return np.ascontiguousarray(np.stack(cols, axis=1))


def case_filter_poly2D(name, n_samp, n_det, n_group, order, description, masked_dets=(),
                       ungrouped=(), starve=None, square=False, extent=1.0):
    c = Case("filter_poly2D", name, "filter_poly2D", description)
    rng = rng_for(c.file)
    x = rng.uniform(-extent, extent, n_det)
    y = rng.uniform(-extent, extent, n_det)
    templates = poly2d_templates(x, y, order, square)
    n_mode = templates.shape[1]
    det_groups = (np.arange(n_det) % n_group).astype(np.int32)
    for d in ungrouped:
        det_groups[d] = -1  # in no group: never used
    masks = (rng.random((n_samp, n_det)) > 0.15).astype(np.uint8)
    masks[masks == 1] = rng.integers(1, 256, int(np.sum(masks == 1))).astype(np.uint8)
    for d in masked_dets:
        masks[:, d] = 0
    if starve is not None:
        # group `g`: every detector masked at samples [a, b), and only `k` good ones
        # (fewer than the modes: a rank-deficient system) at samples [b, e)
        g, a, b, e, k = starve
        members = np.nonzero(det_groups == g)[0]
        masks[a:b, members] = 0
        masks[b:e, members] = 0
        masks[b:e, members[:k]] = 1
    true_coeff = rng.normal(0.0, 1.0, (n_samp, n_group, n_mode))
    signals = np.empty((n_samp, n_det))
    for d in range(n_det):
        g = max(det_groups[d], 0)
        signals[:, d] = true_coeff[:, g, :] @ templates[d] + rng.normal(0.0, 0.05, n_samp)
    # masked samples carry garbage: the kernel multiplies it by a 0.0 mask
    signals[masks == 0] = rng.uniform(-1e3, 1e3, int(np.sum(masks == 0)))
    coeff_in = rng.uniform(-9.0, 9.0, (n_samp, n_group, n_mode))
    coeff = coeff_in.copy()
    lt.filter_poly2D(det_groups, templates, signals, masks, coeff, False)
    c.add(det_groups=det_groups, templates=templates, signals=signals, masks=masks,
          coeff_in=coeff_in, coeff_out=coeff)
    # Distance of the rank decision from dgelss's cut: the singular values of the
    # normal matrix relative to rcond * largest, over every (sample, group).
    ratios = []
    for s in range(n_samp):
        for g in range(n_group):
            sel = det_groups == g
            m = (masks[s, sel] != 0).astype(np.float64)
            t = templates[sel]
            a = (t * m[:, None]).T @ t
            sv = np.linalg.svd(a, compute_uv=False)
            if sv[0] > 0:
                r = sv / (1e-6 * sv[0])
                ratios.extend(float(v) for v in r if v > 0)
    closest = min((abs(math.log10(v)) for v in ratios), default=None)
    c.extra = {"n_mode": int(n_mode), "closest_singular_value_to_rcond_cut_log10": closest}
    return c


def pinned_cases():
    yield case_cov_hits(
        "basic", 6, 16, 3000,
        "nsub=6 local submaps of 16 pixels, 3000 samples; ~10% samples in a non-local submap "
        "(submap -1, global2local -1) and ~10% flagged (subpix -1); submap 1 never hit; hits_in "
        "non-zero (kernel accumulates) except a stretch of unobserved zeros; nnz=3 is unused",
    )
    yield case_cov_hits(
        "nsub0", 0, 8, 50,
        "nsub=0: the kernel returns before reading anything, hits unchanged (hits has 2 "
        "submaps of room and the samples point into them)",
    )
    yield case_cov_invnpp(
        "nnz3", 5, 8, 3, 2500, 0.37, False,
        "nnz=3 (block 6, lower triangle row by row: II IQ IU QQ QU UU), scale 0.37, 5 submaps "
        "of 8 pixels; ~10% non-local submap (-1), ~8% subpix -1; last submap never hit; "
        "invnpp_in random (kernel accumulates)",
    )
    yield case_cov_invnpp(
        "nnz1_zero_start", 4, 16, 1, 1500, 2.5e-3,
        True,
        "nnz=1, scale 2.5e-3, invnpp_in all zero as the operator starts; unhit pixels "
        "(the last submap and others) stay exactly 0 (zero covariance, cut by rcond later)",
    )
    poly_spans = [(0, 200), (200, 203), (210, 210), (215, 340), (340, 420), (420, 600)]
    poly_kinds = "[kinds: random,clean,random,random,allflagged,fewgood]"
    for order in (0, 1, 2, 5, 10):
        yield case_filter_polynomial(
            f"order{order}", order, 600, poly_spans,
            f"order {order}, 3 signals, common flags (any nonzero value flags, ~20%); scans "
            "[0,200), a 3-sample clean scan (shorter than the order for order >= 3: norder "
            "= ngood), an empty scan, [215,340), an all-flagged scan (skipped, signal kept), and "
            "[420,600) with only 3 good samples (norder = 3); samples [203,215) are in no scan "
            "and keep their values "
            + poly_kinds,
        )
    # Order 40 on scans of ~1000 samples: a uniform grid keeps the Legendre basis of
    # degree n well-conditioned only for about n^2 samples or more, and the normal
    # equations of the ports square its condition number (FORMAT.md, section 13).
    yield case_filter_polynomial(
        "order40", 40, 3000, [(0, 1200), (1200, 1203), (1210, 1210), (1215, 2200),
                              (2200, 2400), (2400, 3000)],
        "order 40 (41 templates: more than a device thread holds in private memory), "
        "n = 3000, 3 signals, ~20% flagged; scans [0,1200) and [1215,2200) fit 41 templates, "
        "a 3-sample clean scan (norder 3), an empty scan, an all-flagged scan and [2400,3000) "
        "with 3 good samples (norder 3); [1203,1215) is in no scan "
        + poly_kinds,
    )
    yield case_filter_polynomial(
        "order3_overlap_clamp", 3, 400, [(-20, 150), (100, 260), (240, 260), (300, 450)],
        "order 3; scans overlap ([100,260) refits samples already filtered by [-20,150), "
        "sequentially with one thread) and are clamped (start -20 -> 0, stop 450 -> n=400); a "
        "20-sample scan inside another; samples [260,300) are in no scan and keep their values "
        "[kinds: random,random,random,random]",
    )
    yield case_filter_poly2D(
        "groups3_order2", 120, 30, 3, 2,
        "30 dets in 3 groups (det % 3), 6 modes (x^i y^j, i+j<=2), 120 samples; masks ~15% "
        "zero, nonzero values other than 1 also mean good; det 4 masked everywhere, dets 7 and "
        "20 in no group (-1); group 2 fully masked at samples [10,20) (A = 0: coeff 0) and with "
        "only 4 good dets at [20,30) (rank-deficient: the minimum-norm solution); masked "
        "samples carry garbage signal",
        masked_dets=(4,), ungrouped=(7, 20), starve=(2, 10, 20, 30, 4),
    )
    yield case_filter_poly2D(
        "onegroup_order0", 40, 6, 1, 0,
        "one group, one mode (order 0: the masked mean of each sample); det 2 masked "
        "everywhere; samples with every det masked give 0",
        masked_dets=(2,), starve=(0, 5, 8, 8, 0),
    )
    yield case_filter_poly2D(
        "groups2_order3", 60, 16, 2, 3,
        "16 dets in 2 groups, 10 modes (order 3): 8 dets per group, so a group with a masked "
        "det is rank-deficient and dgelss's rcond 1e-6 cut decides the rank",
    )
    yield case_filter_poly2D(
        "square_order7_64modes", 50, 14, 2, 7,
        "TOAST's test_polyfilter2D sizes: 14 dets in 2 groups (det % 2, as its two "
        "wafers), 64 modes x^i y^j with i, j <= 7 (PolyFilter2D's own templates, "
        "norder = 8), positions within +-0.05 (focal-plane angles), 50 samples; 7 dets "
        "per group for 64 modes: rank-deficient everywhere, dgelss's rcond 1e-6 cut "
        "decides the rank; det 3 masked everywhere",
        masked_dets=(3,), square=True, extent=0.05,
    )


# ---------------------------------------------------------------------------
# 17. The map-maker's fused kernels (ABI minor 4; not TOAST registry kernels):
# compact_expand_pointing, fused_accumulate, fused_project.  The reference is
# TOAST's own UNFUSED sequence on the same inputs: pointing_detector ->
# pixels_healpix -> stokes_weights_IQU (the pointing; the compact pixels are
# its pixels narrowed to int32), then template_offset_add_to_signal on a
# zeroed timestream (F a) or the signal, build_noise_weighted (accumulate);
# or scan_map (subtract) -> noise_weight -> template_offset_project_signal
# into zeroed amplitudes (project).  The kept form reads TOAST's pixels and
# weights (exact); the compact form rebuilds the weights (within
# FUSED_COMPACT_RTOL of the toast-rs runner, FORMAT.md section 17).

FUSED_SPANS = [(0, 300), (300, 301), (500, 500), (520, 1200)]
FUSED_STEP = 37


def fused_pointing(rng, n_det, n_samp, spans, use_hwp, iau):
    """TOAST's pointing of n_det detectors: (inputs dict, pixels, weights)."""
    nside, nps = 8, 16
    focalplane = random_quats(rng, (n_det,))
    boresight = random_quats(rng, (n_samp,))
    flags = np.zeros(n_samp, dtype=np.uint8)
    flags[rng.random(n_samp) < 0.05] |= 1  # cuts the boresight (pointing_flag_mask 1)
    flags[rng.random(n_samp) < 0.08] |= 2  # cuts the binning (shared_flag_mask 2)
    iv, ivf = make_intervals(spans)
    index = np.arange(n_det, dtype=np.int32)
    quats = np.zeros((n_det, n_samp, 4))
    lt.pointing_detector(focalplane, boresight, index, quats, iv, flags, 1, False)
    pixels = np.full((n_det, n_samp), -1, dtype=np.int64)
    hits = np.zeros(12 * nside * nside // nps, dtype=np.uint8)
    lt.pixels_healpix(index, quats, flags, 1, index, pixels, iv, hits, nps, nside, True, False)
    epsilon = rng.uniform(-0.05, 0.2, n_det)
    gamma = rng.uniform(0, math.pi, n_det)
    cal = rng.uniform(0.8, 1.2, n_det)
    hwp = rng.uniform(0, 2 * math.pi, n_samp) if use_hwp else np.zeros(0)
    weights = np.zeros((n_det, n_samp, 3))
    lt.stokes_weights_IQU(index, quats, index, weights, hwp if use_hwp else np.zeros(1), iv,
                          epsilon, gamma, cal, bool(iau), False)
    inputs = dict(
        pixel_index=index, weight_index=index, focalplane=focalplane, epsilon=epsilon,
        gamma=gamma, cal=cal, compact=pixels.astype(np.int32), boresight=boresight,
        pointing_flags=flags, hwp=hwp, pixels=pixels, weights=weights,
    )
    return inputs, ivf, iv, nps, 12 * nside * nside // nps


def fused_values(rng, c, n_det, n_samp, spans, iv, signal):
    """The offset layout and amplitudes, the signal (or none: F a), and the
    timestream TOAST's unfused sequence starts from."""
    n_amp_views, amp_offset, n_amp = offset_layout(spans, FUSED_STEP, n_det)
    amp_offset[1] = -1  # a detector without amplitudes
    amplitudes = rng.normal(size=n_amp)
    amp_flags = (rng.random(n_amp) < 0.15).astype(np.uint8)
    index = np.arange(n_det, dtype=np.int32)
    if signal:
        det_data = rng.normal(size=(n_det, n_samp))
        t = det_data.copy()
    else:
        det_data = np.zeros((0, n_samp))
        t = np.zeros((n_det, n_samp))
        for d in range(n_det):
            if amp_offset[d] >= 0:
                lt.template_offset_add_to_signal(
                    FUSED_STEP, int(amp_offset[d]), n_amp_views, amplitudes, amp_flags, d, t, iv,
                    False,
                )
    c.scalar("step_length", FUSED_STEP, np.int64)
    c.add(n_amp_views=n_amp_views, amp_offset=amp_offset, amplitudes=amplitudes,
          amplitude_flags=amp_flags, data_index=index, det_data=det_data)
    return t, (n_amp_views, amp_offset, amplitudes, amp_flags)


def fused_flags(rng, n_det, n_samp, without):
    """Detector flags; with `without`, detector 2 has none (flag_index -1,
    which template_offset_project_signal takes but build_noise_weighted
    does not: there it reads a row of zeros instead)."""
    det_flags = np.zeros((n_det + 1, n_samp), dtype=np.uint8)
    for bit, p in ((1, 0.06), (4, 0.1)):  # bit 4 is not in the mask
        det_flags[:n_det][rng.random((n_det, n_samp)) < p] |= bit
    flag_index = np.arange(n_det, dtype=np.int32)
    flag_index[2] = -1 if without else n_det
    return flag_index, det_flags, 1


def case_compact_expand(name, use_hwp, iau, description):
    c = Case("compact_expand_pointing", name, "pointing_detector+pixels_healpix+stokes_weights_IQU",
             description)
    rng = rng_for(c.file)
    n_det, n_samp = 4, 1200
    inputs, ivf, _, _, _ = fused_pointing(rng, n_det, n_samp, FUSED_SPANS, use_hwp, iau)
    c.add(**inputs)
    c.scalar("pointing_flag_mask", 1, np.uint8)
    c.scalar("iau", 1 if iau else 0, np.uint8)
    c.add(**ivf)
    return c


def case_fused(kernel, name, compact, signal, use_hwp, description):
    seq = ("build_noise_weighted" if kernel == "fused_accumulate"
           else "scan_map+noise_weight+template_offset_project_signal")
    c = Case(kernel, name, "unfused: " + seq, description)
    rng = rng_for(c.file)
    n_det, n_samp = 4, 1200
    inputs, ivf, iv, nps, n_submap = fused_pointing(rng, n_det, n_samp, FUSED_SPANS, use_hwp, False)
    c.add(**inputs)
    c.scalar("pointing_flag_mask", 1, np.uint8)
    c.scalar("iau", 0, np.uint8)
    c.scalar("compact_form", 1 if compact else 0, np.uint8)
    c.add(**ivf)
    t, (n_amp_views, amp_offset, _, amp_flags) = fused_values(rng, c, n_det, n_samp, FUSED_SPANS,
                                                              iv, signal)
    flag_index, det_flags, mask = fused_flags(rng, n_det, n_samp, kernel == "fused_project")
    det_scale = rng.uniform(0.5, 2.0, n_det)
    g2l = rng.permutation(n_submap).astype(np.int64)
    index = np.arange(n_det, dtype=np.int32)
    pixels, weights = inputs["pixels"], inputs["weights"]
    c.add(flag_index=flag_index, det_flags=det_flags, det_scale=det_scale, global2local=g2l)
    c.scalar("det_flag_mask", mask, np.uint8)
    c.scalar("n_pix_submap", nps, np.int64)
    if kernel == "fused_accumulate":
        zmap_in = np.zeros((n_submap, nps, 3))
        zmap = zmap_in.copy()
        lt.build_noise_weighted(g2l, zmap, index, pixels, index, weights, index, t, flag_index,
                                det_flags, det_scale, mask, iv, inputs["pointing_flags"], 2, False)
        c.scalar("shared_flag_mask", 2, np.uint8)
        c.add(finite=np.ones(n_det, dtype=np.uint8), zmap_in=zmap_in, zmap_out=zmap)
    else:
        mapdata = rng.normal(size=(n_submap, nps, 3))
        lt.ops_scan_map_float64(g2l, nps, mapdata, t, index, pixels, index, weights, index, iv, 1.0,
                                False, True, False, False)
        lt.noise_weight(t, index, iv, det_scale, False)
        n_amp = len(amp_flags)
        out_in = np.zeros(n_amp)
        out = out_in.copy()
        for d in range(n_det):
            if amp_offset[d] >= 0:
                lt.template_offset_project_signal(
                    d, t, int(flag_index[d]), det_flags, mask, FUSED_STEP, int(amp_offset[d]),
                    n_amp_views, out, amp_flags, iv, False,
                )
        c.add(mapdata=mapdata, amplitudes_out_in=out_in, amplitudes_out_out=out)
    return c


def fused_cases():
    yield case_compact_expand("iqu", False, False, "4 detectors, flagged boresight samples")
    yield case_compact_expand("iqu_iau", False, True, "IAU convention (U sign flipped)")
    yield case_compact_expand("iqu_hwp", True, False, "with a HWP angle (the kernel's formula)")
    for kernel in ("fused_accumulate", "fused_project"):
        for compact in (True, False):
            form = "compact" if compact else "kept"
            yield case_fused(kernel, f"{form}_signal", compact, True, False,
                             f"{form} pointing, a timestream")
            yield case_fused(kernel, f"{form}_amplitudes", compact, False, False,
                             f"{form} pointing, F a of offset amplitudes (one detector without)")
        yield case_fused(kernel, "compact_amplitudes_hwp", True, False, True,
                         "compact pointing with a HWP angle, F a")


# ---------------------------------------------------------------------------
# 18. sim_noise (ABI minor 5; TOAST's tod_sim_noise_timestream per detector,
# added to its row of det_data).  The reference is TOAST's compiled
# tod_sim_noise_timestream with TOAST's keys (oversample 2, so the FFT length
# is the smallest power of two above 2 n_samp); the kernel takes the Fourier
# amplitudes instead of the PSD, computed here from the same PSD with the
# C++'s interpolation (python floats, libm), so they agree with TOAST's own
# to an ulp or so (FORMAT.md section 18, NOISE_RTOL).

NOISE_RATE = 100.0


def noise_psd(net, fknee, fmin, alpha, nfreq=60):
    """An analytic 1/f PSD on a log grid from 1e-6 Hz to Nyquist."""
    nyq = NOISE_RATE / 2
    freq = np.logspace(-6, math.log10(nyq), nfreq)
    freq[-1] = nyq
    if fknee == 0.0:
        return freq, np.full(nfreq, net * net)
    fa = freq ** alpha
    return freq, net * net * (fa + fknee ** alpha) / (fa + fmin ** alpha)


def noise_amplitudes(freq, psd, fftlen):
    """tod_sim_noise_psd_interp's amplitudes sqrt(P norm), A_0 = 0."""
    npsd = fftlen // 2 + 1
    norm = NOISE_RATE * (npsd - 1)
    increment = NOISE_RATE / (fftlen - 1)
    logfreq = [math.log10(f + increment) for f in freq]
    stepinv = [1.0 / (b - a) for a, b in zip(logfreq, logfreq[1:])]
    psdmin = min([p for p in psd if p != 0.0] + [1e30])
    shift = 0.01 * psdmin
    logpsd = [math.log10(math.sqrt(p * norm) + shift) for p in psd]
    out = np.zeros(npsd)
    ibin = 0
    nb = len(freq)
    for i in range(npsd):
        lf = math.log10(increment * i + increment)
        while ibin < nb - 2 and logfreq[ibin + 1] < lf:
            ibin += 1
        r = (lf - logfreq[ibin]) * stepinv[ibin]
        out[i] = 10.0 ** (logpsd[ibin] + r * (logpsd[ibin + 1] - logpsd[ibin])) - shift
    out[0] = 0.0
    return out


def case_noise(name, n_samp, first, models, dets, n_rows, description):
    """dets: (model index, row, realization, telescope, component, session,
    detector) per detector."""
    c = Case("sim_noise", name, "tod_sim_noise_timestream", description)
    rng = rng_for(c.file)
    fftlen = 2
    while fftlen <= 2 * n_samp:
        fftlen *= 2
    psds = [noise_psd(*m) for m in models]
    amps = np.array([noise_amplitudes(f, p, fftlen) for f, p in psds])
    det_in = rng.normal(size=(n_rows, n_samp))
    det_out = det_in.copy()
    keys = np.zeros((len(dets), 2), dtype=np.uint64)
    m64 = (1 << 64) - 1
    for i, (m, row, real, tel, comp, sess, det) in enumerate(dets):
        noise = np.zeros(n_samp)
        f, p = psds[m]
        lt.tod_sim_noise_timestream(real, tel, comp, sess, det, NOISE_RATE, first, 2,
                                    f.astype(np.float64), p.astype(np.float64), noise)
        det_out[row] += noise
        keys[i, 0] = (real * (1 << 32) + tel * (1 << 16) + comp) & m64
        keys[i, 1] = (sess * (1 << 32) + det) & m64
    c.scalar("n_samp", n_samp, np.int64)
    c.scalar("fft_len", fftlen, np.int64)
    c.scalar("counter0", first * 2, np.int64)
    c.add(data_index=np.array([d[1] for d in dets], dtype=np.int32),
          filter_index=np.array([d[0] for d in dets], dtype=np.int32),
          keys=keys.view(np.int64), amplitudes=amps, det_data_in=det_in, det_data_out=det_out)
    return c


def noise_cases():
    bench = (0.0002, 0.05, 1.0e-5, 1.0)  # net [K s^0.5], fknee, fmin [Hz], alpha
    other = (0.0005, 0.2, 2.0e-5, 1.5)
    tel, sess = 3126093837 & 0xFFFF, 1949512818
    yield case_noise("benchmark_model", 1000, 0, [bench, other],
                     [(0, 2, 0, tel, 0, sess, 2371234811), (1, 0, 0, tel, 0, sess, 1200341),
                      (0, 3, 0, tel, 0, sess, 4012388733)], 4,
                     "3 detectors, 2 models, rows permuted, row 1 untouched; N = 2048")
    yield case_noise("first_sample", 37, 5000, [other],
                     [(0, 1, 7, 12, 3, 99, 5), (0, 0, 7, 12, 3, 99, 6)], 2,
                     "odd n_samp = 37 (N = 128), first sample 5000 (counter0 = 10000), "
                     "realization 7, component 3")
    yield case_noise("white_pow2", 512, 0, [(0.0003, 0.0, 0.0, 1.0)],
                     [(0, 0, 0, 1, 0, 2, 3)], 1,
                     "white noise (fknee = 0), n_samp a power of two (N = 2048)")
    yield case_noise("wrapping_keys", 300, 123456789, [bench],
                     [(0, 0, 70000, 65535, 65535, 4294967295, 4294967295)], 1,
                     "key words near 2^64 (key2 = 2^64 - 1), a counter beyond 2^32")
# 19. cov_accum_timestream (ABI minor 5; not a TOAST registry kernel): the
# hit map and the inverse covariance from the timestream's pointing.  The
# reference is TOAST 3.0.6's BuildHitMap and BuildInverseCovariance: their
# _exec loops replayed here (detector, view: the pixels of the view,
# flags = shared & shared_flag_mask | det & det_flag_mask, TOAST's
# PixelDistribution.global_pixel_to_submap, flagged samples' local pixel set
# to -1, then TOAST's compiled cov_accum_diag_hits / cov_accum_diag_invnpp
# with the detector weight as scale), on TOAST's own PixelDistribution.
# Hits exact; invnpp exact on the CPU, within ACCUM_RTOL on the devices.

COV_SPANS = [(0, 300), (300, 301), (500, 500), (520, 1200)]


def cov_timestream_case(name, nnz, hits, invnpp, det_flags_on, shared_on, accumulate,
                        description):
    from toast.pixels import PixelDistribution

    c = Case("cov_accum_timestream", name,
             "BuildHitMap+BuildInverseCovariance (global_pixel_to_submap, "
             "cov_accum_diag_hits, cov_accum_diag_invnpp)", description)
    rng = rng_for(c.file)
    n_det, n_samp, nside, nps = 4, 1200, 8, 16
    n_pix = 12 * nside * nside
    n_submap = n_pix // nps
    # Pixels in a band of the sky (a few submaps), about 6% negative (cut
    # by the pointing).
    pixels = rng.integers(5 * nps, 19 * nps, size=(n_det + 1, n_samp)).astype(np.int64)
    pixels[rng.random((n_det + 1, n_samp)) < 0.06] = -1
    pixel_index = np.array([0, 1, 4, 2], dtype=np.int32)  # row 3 unused, row 4 used
    used = np.unique(pixels[pixel_index][pixels[pixel_index] >= 0] // nps)
    # The local submaps: the hit ones and two more, in a shuffled order.
    local = np.concatenate([used, [0, n_submap - 1]])
    rng.shuffle(local)
    dist = PixelDistribution(n_pix=n_pix, n_submap=n_submap, local_submaps=local)
    nsub = dist.n_local_submap
    g2l = np.ascontiguousarray(np.array(dist.global_submap_to_local, dtype=np.int64))
    weight_index = np.array([3, 0, 1, 2], dtype=np.int32)
    weights = rng.normal(size=(n_det, n_samp, nnz))
    if nnz == 3:
        weights[..., 0] = 1.0
    det_flags = np.zeros((n_det + 1, n_samp), dtype=np.uint8)
    for bit, p in ((1, 0.07), (4, 0.1)):  # bit 4 is not in the mask
        det_flags[rng.random((n_det + 1, n_samp)) < p] |= bit
    flag_index = np.array([4, 3, 2, 1], dtype=np.int32)
    shared_flags = np.zeros(n_samp, dtype=np.uint8)
    shared_flags[rng.random(n_samp) < 0.05] |= 1  # not in the mask
    shared_flags[rng.random(n_samp) < 0.08] |= 2
    det_scale = rng.uniform(0.5, 2.0, n_det)
    det_mask, shared_mask = (1 if det_flags_on else 0), (2 if shared_on else 0)
    iv, ivf = make_intervals(COV_SPANS)
    block = nnz * (nnz + 1) // 2
    hits_in = np.zeros((nsub if hits else 0, nps), dtype=np.int64)
    invnpp_in = np.zeros((nsub if invnpp else 0, nps, block))
    if accumulate:
        hits_in[:] = rng.integers(0, 5, size=hits_in.shape)
        invnpp_in[:] = rng.normal(size=invnpp_in.shape)
    hits_out = hits_in.copy()
    invnpp_out = invnpp_in.copy()
    for d in range(n_det):
        for first, last in COV_SPANS:
            n = last - first
            pix = pixels[pixel_index[d], first:last]
            flgs = (shared_flags[first:last] & shared_mask) if shared_on else \
                np.zeros(n, dtype=np.uint8)
            if det_flags_on:
                flgs = flgs | (det_flags[flag_index[d], first:last] & det_mask)
            local_sm, local_pix = dist.global_pixel_to_submap(pix)
            local_sm = np.asarray(local_sm, dtype=np.int64).copy()
            local_pix = np.asarray(local_pix, dtype=np.int64).copy()
            local_pix[flgs != 0] = -1
            if hits:
                h = hits_out.reshape(-1)
                lt.cov_accum_diag_hits(nsub, nps, 1, local_sm, local_pix, h, False)
            if invnpp:
                w = np.ascontiguousarray(weights[weight_index[d], first:last].reshape(-1))
                o = invnpp_out.reshape(-1)
                lt.cov_accum_diag_invnpp(nsub, nps, nnz, local_sm, local_pix, w,
                                         float(det_scale[d]), o, False)
    c.add(global2local=g2l, pixel_index=pixel_index, pixels=pixels,
          weight_index=weight_index,
          weights=weights if invnpp else np.zeros((0, n_samp, nnz)),
          flag_index=flag_index,
          det_flags=det_flags if det_flags_on else np.zeros((0, n_samp), dtype=np.uint8),
          shared_flags=shared_flags if shared_on else np.zeros(0, dtype=np.uint8),
          det_scale=det_scale)
    c.scalar("n_pix_submap", nps, np.int64)
    c.scalar("nnz", nnz, np.int64)
    c.scalar("det_flag_mask", det_mask, np.uint8)
    c.scalar("shared_flag_mask", shared_mask, np.uint8)
    c.add(**ivf)
    c.add(hits_in=hits_in, hits_out=hits_out, invnpp_in=invnpp_in, invnpp_out=invnpp_out)
    return c


def cov_timestream_cases():
    yield cov_timestream_case("iqu", 3, True, True, True, True, False,
                              "4 detectors (rows permuted), IQU, detector and shared flags, "
                              "hits and inverse covariance")
    yield cov_timestream_case("iqu_invnpp_accumulate", 3, False, True, True, False, True,
                              "inverse covariance alone into an existing map, detector flags "
                              "only")
    yield cov_timestream_case("hits_only", 1, True, False, False, True, True,
                              "hit map alone (no weights) into an existing map, shared flags "
                              "only")
    yield cov_timestream_case("i_noflags", 1, True, True, False, False, False,
                              "intensity only (nnz 1), no flags")


# 20. solver_flags (ABI minor 6; not a TOAST registry kernel): the
# destriping solver's sample flags.  The reference replays TOAST 3.0.6's
# MapMaker: _prepare_flagging_ob (per view of the solve: 1 where the
# shared flags & shared_flag_mask or the detector flags & det_flag_mask are
# non-zero), then ScanMask with det_flags_value 4 and the rcond mask
# (PixelData of uint8, 1 in the poorly conditioned pixels) through TOAST's
# own PixelDistribution.global_pixel_to_submap, and _count_cut_data's
# counts.  Departures of ours, all outside what the solve reads: samples
# outside the view get cut_bit (TOAST leaves them 0; no pass reads them),
# and a sample whose pixel is negative or in a submap that is not local
# gets no mask bit (TOAST's numpy would read index -1 of the mask there).
# Flags are OR-ed into flags_in; counts are added to counts_in.  Exact.

FLAG_SPANS = [(0, 150), (100, 260), (400, 400), (420, 700)]


def solver_flags_case(name, det_on, shared_on, mask_on, accumulate, description):
    from toast.pixels import PixelDistribution

    c = Case("solver_flags", name,
             "MapMaker._prepare_flagging_ob, ScanMask, _count_cut_data", description)
    rng = rng_for(c.file)
    n_det, n_samp, nside, nps = 3, 800, 4, 12
    n_pix = 12 * nside * nside
    n_submap = n_pix // nps
    pixels = rng.integers(0, n_pix, size=(n_det + 1, n_samp)).astype(np.int64)
    pixels[rng.random((n_det + 1, n_samp)) < 0.05] = -1
    local = np.array([s for s in range(n_submap) if s % 3 != 1], dtype=np.int64)
    rng.shuffle(local)
    dist = PixelDistribution(n_pix=n_pix, n_submap=n_submap, local_submaps=local)
    nsub = dist.n_local_submap
    g2l = np.ascontiguousarray(np.array(dist.global_submap_to_local, dtype=np.int64))
    pixel_mask = (rng.random((nsub, nps)) < 0.3).astype(np.uint8)
    det_flags = np.zeros((n_det + 1, n_samp), dtype=np.uint8)
    for bit, p in ((1, 0.06), (8, 0.1)):  # bit 8 is not in the mask
        det_flags[rng.random((n_det + 1, n_samp)) < p] |= bit
    shared_flags = np.zeros(n_samp, dtype=np.uint8)
    shared_flags[rng.random(n_samp) < 0.05] |= 1  # not in the mask
    shared_flags[rng.random(n_samp) < 0.07] |= 2
    flag_index = np.array([3, 0, 2], dtype=np.int32)
    pixel_index = np.array([1, 3, 0], dtype=np.int32)
    out_index = np.array([2, 0, 3], dtype=np.int32)  # row 1 untouched
    det_mask, shared_mask = (1 if det_on else 0), (2 if shared_on else 0)
    cut_bit, mask_bit = (0 if mask_on else 1), (4 if mask_on else 0)
    iv, ivf = make_intervals(FLAG_SPANS)
    flags_in = np.zeros((n_det + 1, n_samp), dtype=np.uint8)
    counts_in = np.zeros(2, dtype=np.int64)
    if accumulate:
        flags_in[rng.random(flags_in.shape) < 0.1] |= 16
        counts_in[:] = [5, 17]
    flags = flags_in.copy()
    counts = counts_in.copy()
    inside = np.zeros(n_samp, dtype=bool)
    for first, last in FLAG_SPANS:
        inside[first:last] = True
    for d in range(n_det):
        row = flags[out_index[d]]
        row[~inside] |= cut_bit
        for first, last in FLAG_SPANS:
            n = last - first
            # _prepare_flagging_ob, per view.
            start = np.zeros(n, dtype=np.uint8)
            if shared_on:
                start[:] = np.where((shared_flags[first:last] & shared_mask) > 0, 1, 0)
            if det_on:
                start |= np.where((det_flags[flag_index[d], first:last] & det_mask) > 0,
                                  1, 0).astype(np.uint8)
            v = np.where(start != 0, cut_bit, 0).astype(np.uint8)
            if mask_on:
                # ScanMask on TOAST's distribution (only pixels >= 0 in a
                # local submap: see above).
                pix = pixels[pixel_index[d], first:last]
                local_sm, local_pix = dist.global_pixel_to_submap(pix)
                local_sm = np.asarray(local_sm, dtype=np.int64)
                local_pix = np.asarray(local_pix, dtype=np.int64)
                ok = (pix >= 0) & (local_sm >= 0)
                masked = np.zeros(n, dtype=bool)
                masked[ok] = (pixel_mask[local_sm[ok], local_pix[ok]] & 1) != 0
                v[masked] |= mask_bit
            row[first:last] |= v
            # _count_cut_data, per view.
            counts[0] += np.count_nonzero(row[first:last])
            counts[1] += n
    c.add(global2local=g2l if mask_on else np.zeros(0, dtype=np.int64),
          flag_index=flag_index if det_on else np.zeros(0, dtype=np.int32),
          det_flags=det_flags if det_on else np.zeros((0, n_samp), dtype=np.uint8),
          shared_flags=shared_flags if shared_on else np.zeros(0, dtype=np.uint8),
          pixel_index=pixel_index if mask_on else np.zeros(0, dtype=np.int32),
          pixels=pixels if mask_on else np.zeros((0, n_samp), dtype=np.int64),
          pixel_mask=pixel_mask.reshape(-1) if mask_on else np.zeros(0, dtype=np.uint8),
          out_index=out_index)
    c.scalar("n_pix_submap", nps, np.int64)
    c.scalar("det_flag_mask", det_mask, np.uint8)
    c.scalar("shared_flag_mask", shared_mask, np.uint8)
    c.scalar("cut_bit", cut_bit, np.uint8)
    c.scalar("mask_bit", mask_bit, np.uint8)
    c.add(**ivf)
    c.add(flags_in=flags_in, flags_out=flags, counts_in=counts_in, counts_out=counts)
    return c


def solver_flags_cases():
    yield solver_flags_case("selection", True, True, False, False,
                            "5a: detector and shared flags, overlapping views and a gap, "
                            "rows permuted (one untouched)")
    yield solver_flags_case("selection_det_only", True, False, False, True,
                            "5a into existing flags and counts, detector flags only")
    yield solver_flags_case("selection_none", False, False, False, False,
                            "5a with no flags: only the samples outside the view")
    yield solver_flags_case("rcond_mask", False, False, True, True,
                            "5c: the rcond mask scanned (a third of the submaps not local, "
                            "negative pixels) into existing flags")


def write_cases(outdir, cases, problems):
    os.makedirs(outdir, exist_ok=True)
    entries = []
    for c in cases:
        np.savez(os.path.join(outdir, c.file), **c.fields)
        entries.append(c.manifest())
        for key, val in (c.extra or {}).items():
            if key.endswith("bitexact") and val is not True:
                problems.append(f"{c.file}: {key} is {val}")
        print(f"wrote {c.file}")
    manifest = {"toast_version": toast.__version__, "numpy_version": np.__version__, "cases": entries}
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"{len(entries)} cases and manifest.json in {outdir}")


def merge_cases(src, outdir):
    """Move the cases of src (and its manifest entries) into outdir."""
    with open(os.path.join(src, "manifest.json")) as f:
        extra = json.load(f)["cases"]
    with open(os.path.join(outdir, "manifest.json")) as f:
        manifest = json.load(f)
    for e in extra:
        os.replace(os.path.join(src, e["file"]), os.path.join(outdir, e["file"]))
    manifest["cases"] += extra
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    os.remove(os.path.join(src, "manifest.json"))
    os.rmdir(src)
    print(f"{len(extra)} pinned cases merged into {outdir}")


def main(argv):
    if toast.__version__ != TOAST_VERSION:
        sys.exit(f"generate_cases.py: needs toast {TOAST_VERSION}, found {toast.__version__}")
    problems = []
    if len(argv) == 3 and argv[1] == "--seams":
        write_cases(argv[2], seam_cases(), problems)
    elif len(argv) == 3 and argv[1] == "--pinned":
        write_cases(argv[2], pinned_cases(), problems)
    elif len(argv) == 3 and argv[1] == "--fused":
        write_cases(argv[2], fused_cases(), problems)
    elif len(argv) == 3 and argv[1] == "--noise":
        write_cases(argv[2], noise_cases(), problems)
    elif len(argv) == 3 and argv[1] == "--cov-timestream":
        write_cases(argv[2], cov_timestream_cases(), problems)
    elif len(argv) == 3 and argv[1] == "--solver-flags":
        write_cases(argv[2], solver_flags_cases(), problems)
    elif len(argv) == 2:
        outdir = argv[1]
        write_cases(outdir, all_cases(), problems)
        env = dict(os.environ, **PINNED_ENV)
        pinned = os.path.join(outdir, ".pinned")
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--pinned", pinned],
            env=env,
        )
        if child.returncode != 0:
            problems.append(f"the --pinned child exited with {child.returncode}")
        else:
            merge_cases(pinned, outdir)
    else:
        sys.exit("usage: generate_cases.py OUTDIR  (or: generate_cases.py --pinned|--seams|--fused|--noise|--cov-timestream|--solver-flags OUTDIR)")
    for p in problems:
        print(f"WARNING: self-check failed: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
