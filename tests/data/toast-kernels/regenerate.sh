#!/usr/bin/env bash
# Regenerate the TOAST 3.0.6 reference cases from the real compiled kernels.
#
# usage: regenerate.sh [--venv DIR] [--overwrite-repo-copy | OUTDIR]
#
#   OUTDIR                 where to write the cases (default: a new temp dir)
#   --overwrite-repo-copy  write into cases/ beside this script (the copy the
#                          tests use); nothing else ever touches it
#   --venv DIR             virtual environment to create or reuse
#                          (default: $TMPDIR/toast-3.0.6-venv)
#
# Creates the venv with `$PYTHON -m venv` (PYTHON defaults to python3; pick a
# CPython that PyPI has toast 3.0.6 wheels for, e.g. 3.11), installs
# toast==3.0.6 and numpy from PyPI, runs generate_cases.py with
# OMP_NUM_THREADS=1, then compares the result structurally with the repo copy
# (compare_cases.py).
#
# The cases of cov_accum_diag_hits, cov_accum_diag_invnpp, filter_polynomial
# and filter_poly2D (FORMAT.md, sections 11-14): generate_cases.py makes them
# in a child process with OPENBLAS_CORETYPE=Prescott and one OpenBLAS
# thread: filter_polynomial and filter_poly2D solve with the OpenBLAS LAPACK in
# the wheel, whose kernels round differently per CPU; pinned, those files are
# the same bits on any x86-64, and merges them into OUTDIR and its manifest.
#
# The cases include the 61 boundary-direction cases (pointing_detector_boundary,
# pixels_healpix_boundary_{nest,ring}_nside1..536870912; FORMAT.md). Their
# quaternions are searched against TOAST's own pointing_detector and their
# pixels come from TOAST's pixels_healpix, both run by generate_cases.py.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${TMPDIR:-/tmp}/toast-3.0.6-venv"
out=""
overwrite=0
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) venv="$2"; shift 2 ;;
        --overwrite-repo-copy) overwrite=1; shift ;;
        -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
        -*) echo "regenerate.sh: unknown option $1" >&2; exit 2 ;;
        *) out="$1"; shift ;;
    esac
done
if [ "$overwrite" = 1 ]; then
    [ -z "$out" ] || { echo "regenerate.sh: give OUTDIR or --overwrite-repo-copy, not both" >&2; exit 2; }
    out="$here/cases"
elif [ -z "$out" ]; then
    out="$(mktemp -d "${TMPDIR:-/tmp}/toast-cases.XXXXXX")"
elif [ "$(cd "$out" 2>/dev/null && pwd)" = "$here/cases" ]; then
    echo "regenerate.sh: refusing to write into the repo copy without --overwrite-repo-copy" >&2
    exit 2
fi

if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import toast, numpy, sys; sys.exit(toast.__version__ != "3.0.6")' 2>/dev/null; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "toast==3.0.6" numpy
fi

mkdir -p "$out"
export OMP_NUM_THREADS=1
"$venv/bin/python" "$here/generate_cases.py" "$out"
if [ "$overwrite" = 0 ]; then
    "$venv/bin/python" "$here/compare_cases.py" "$here/cases" "$out" || true
fi
echo "cases written to $out"
