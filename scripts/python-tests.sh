#!/usr/bin/env bash
# The toast_rs Python package (python/): build and install it into a venv
# with TOAST 3.0.6, lint its Rust crate, run its own tests, then TOAST's own
# unit tests of the operators behind our kernels with our kernels installed,
# on cpu and on opencl. Needs the plugins built (`cargo build --release`).
# Usage: scripts/python-tests.sh [BACKEND...] [-- MODULE...]
#   (default: cpu opencl, every module run_toast_tests.py lists)
# A BACKEND of the form accel:NAME runs TOAST's accelerator tests with
# toast-rs as TOAST's accelerator (install(NAME, accel=True)):
#   accel:opencl   toast.tests.accelerator and the use_accel tests of the
#                  pointing, pixel and map-maker-utility operators and the
#                  offset template (the CI subset: ops_mapmaker and
#                  template_periodic take 8 and 6 minutes on this machine;
#                  `-- ops_mapmaker` runs them, or no `--` list with
#                  run_toast_tests.py --accel runs every accel module)
#   accel:cuda-emu the same on the CUDA plugin and the emulated driver
#                  (toast-gpu-emu's libcuda.so.1 first on LD_LIBRARY_PATH,
#                  NVRTC as scripts/gpu-compilers.sh finds it; as
#                  scripts/emulated-gpu.sh does)
# TOAST_RS_PY_VENV: the venv to use (default ~/.cache/toast-ci/py-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac

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

accel_modules=(accelerator ops_pointing_detector ops_pixels_healpix ops_pointing_healpix
  ops_mapmaker_utils template_offset)

# The emulated CUDA driver, as scripts/emulated-gpu.sh sets it up.
emulated_cuda() {
  local emu="$target/emulated-gpu"
  mkdir -p "$emu/cuda"
  ln -sfn ../../release/libtoast_emu_cuda.so "$emu/cuda/libcuda.so.1"
  ln -sfn ../../release/libtoast_emu_cuda.so "$emu/cuda/libcuda.so"
  # shellcheck source=gpu-compilers.sh
  . "$root/scripts/gpu-compilers.sh"
  toast_find_gpu_compilers --report >&2
  emu_ld="$emu/cuda"
}

for b in "${backends[@]}"; do
  case "$b" in
    accel:cuda-emu)
      emulated_cuda
      if [ $# -gt 0 ]; then mods=("$@"); else mods=("${accel_modules[@]}"); fi
      LD_LIBRARY_PATH="$emu_ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$venv/bin/python" python/tests/run_toast_tests.py --backend cuda --accel "${mods[@]}"
      ;;
    accel:*)
      if [ $# -gt 0 ]; then mods=("$@"); else mods=("${accel_modules[@]}"); fi
      "$venv/bin/python" python/tests/run_toast_tests.py --backend "${b#accel:}" --accel "${mods[@]}"
      ;;
    *)
      "$venv/bin/python" python/tests/run_toast_tests.py --backend "$b" "$@"
      ;;
  esac
done
