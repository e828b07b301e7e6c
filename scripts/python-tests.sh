#!/usr/bin/env bash
# The toast_rs Python package (python/): build and install it into a venv
# with TOAST 3.0.6, lint its Rust crate, run its own tests, then TOAST's own
# unit tests of the operators behind our kernels with our kernels installed,
# on cpu and on opencl. Needs the plugins built (`cargo build --release`).
# Usage: scripts/python-tests.sh [BACKEND...] [-- MODULE...]
#   (default: cpu opencl, every module run_toast_tests.py lists)
# TOAST_RS_PY_VENV: the venv to use (default ~/.cache/toast-ci/py-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${TOAST_RS_PY_VENV:-$HOME/.cache/toast-ci/py-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# pip is quiet when everything is there already.
"$venv/bin/pip" install --quiet "toast==3.0.6" healpy maturin pytest
# The extension's crate is its own workspace (no Python needed by the main
# build): the same lints as the workspace's.
(cd python && cargo fmt -- --check && cargo clippy --release --all-targets -- -D warnings)
"$venv/bin/pip" install --quiet ./python

"$venv/bin/python" -m pytest -q python/tests/test_toast_rs.py
backends=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do backends+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#backends[@]} -gt 0 ] || backends=(cpu opencl)
for b in "${backends[@]}"; do
  "$venv/bin/python" python/tests/run_toast_tests.py --backend "$b" "$@"
done
