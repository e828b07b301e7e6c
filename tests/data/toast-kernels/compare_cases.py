#!/usr/bin/env python3
# Copyright (c) toast-rs contributors. BSD-2-Clause.
"""Compare two directories of reference cases structurally.

Usage: python compare_cases.py DIR_A DIR_B

Checks that both hold the same set of .npz files, that every file has the same
field names (in the same order), dtypes and shapes, and that the manifests
agree on file, kernel, case, libtoast_function, fields and scalars.  Reports
which files are byte-identical and which only structurally equal.  Exit
status 0 when everything is structurally equal, 1 otherwise.
"""

import hashlib
import json
import os
import sys

import numpy as np


def npz_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".npz"))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv):
    if len(argv) != 3:
        sys.exit("usage: compare_cases.py DIR_A DIR_B")
    a_dir, b_dir = argv[1], argv[2]
    errors = []
    fa, fb = npz_files(a_dir), npz_files(b_dir)
    for f in sorted(set(fa) ^ set(fb)):
        errors.append(f"{f}: only in {a_dir if f in fa else b_dir}")
    identical, structural, content_equal = [], [], []
    for f in sorted(set(fa) & set(fb)):
        za, zb = np.load(os.path.join(a_dir, f)), np.load(os.path.join(b_dir, f))
        if za.files != zb.files:
            errors.append(f"{f}: fields {za.files} != {zb.files}")
            continue
        ok = True
        same_values = True
        for k in za.files:
            x, y = za[k], zb[k]
            if x.dtype != y.dtype or x.shape != y.shape:
                errors.append(f"{f}:{k}: {x.dtype}{list(x.shape)} != {y.dtype}{list(y.shape)}")
                ok = False
            elif not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                same_values = False
        if not ok:
            continue
        if digest(os.path.join(a_dir, f)) == digest(os.path.join(b_dir, f)):
            identical.append(f)
        elif same_values:
            content_equal.append(f)
        else:
            structural.append(f)
    ma = json.load(open(os.path.join(a_dir, "manifest.json")))
    mb = json.load(open(os.path.join(b_dir, "manifest.json")))
    for key in ("toast_version",):
        if ma.get(key) != mb.get(key):
            errors.append(f"manifest {key}: {ma.get(key)} != {mb.get(key)}")
    ca = {c["file"]: c for c in ma["cases"]}
    cb = {c["file"]: c for c in mb["cases"]}
    if [c["file"] for c in ma["cases"]] != [c["file"] for c in mb["cases"]]:
        errors.append("manifest: case lists differ (names or order)")
    for f in sorted(set(ca) & set(cb)):
        for key in ("kernel", "case", "libtoast_function", "omp_num_threads", "fields", "scalars"):
            if ca[f].get(key) != cb[f].get(key):
                errors.append(f"manifest {f}: {key} differs: {ca[f].get(key)} != {cb[f].get(key)}")
        if set(ca[f]) != set(cb[f]):
            errors.append(f"manifest {f}: keys {sorted(ca[f])} != {sorted(cb[f])}")
        if set(ca[f].get("extra", {})) != set(cb[f].get("extra", {})):
            errors.append(f"manifest {f}: extra keys differ")
    print(f"byte-identical: {len(identical)}")
    for f in identical:
        print(f"  {f}")
    print(f"same values, different bytes: {len(content_equal)}")
    for f in content_equal:
        print(f"  {f}")
    print(f"structurally equal (names, dtypes, shapes), different values: {len(structural)}")
    for f in structural:
        print(f"  {f}")
    for e in errors:
        print(f"MISMATCH: {e}")
    n = len(identical) + len(content_equal) + len(structural)
    print(f"{n} structurally equal, {len(errors)} mismatches")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
