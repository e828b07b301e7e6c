# gpu-compilers.sh -- sourced (bash) by .ci/run and scripts/emulated-gpu.sh:
# where the GPU run-time compilers come from on a machine without a GPU, and
# how to find them. Defines NVRTC_WHEEL, NVRTC_DIR and the function
# toast_find_gpu_compilers; installs nothing (.ci/run does that).
#
# NVRTC: the PyPI wheel nvidia-cuda-nvrtc-cu12 (pinned), installed with
#   `pip install --target "$NVRTC_DIR"`; hiprtc: Debian's libamdhip64-dev
#   (ROCm 5.2, hiprtc inside libamdhip64.so.5), or ROCm 6's libhiprtc.so.

NVRTC_WHEEL='nvidia-cuda-nvrtc-cu12==12.9.86'
NVRTC_DIR="${NVRTC_DIR:-$HOME/.cache/toast-ci/nvrtc-12.9.86}"

# Export TOAST_NVRTC_LIB and TOAST_HIPRTC_LIB (each unless already set) to
# the library files found; a compiler not found is left unset and named on
# stderr when the first argument is `--report`.
toast_find_gpu_compilers() {
  local f
  if [ -z "${TOAST_NVRTC_LIB:-}" ]; then
    f="$(ls "$NVRTC_DIR"/nvidia/cuda_nvrtc/lib/libnvrtc.so.* 2>/dev/null | head -n 1 || true)"
    if [ -n "$f" ]; then
      export TOAST_NVRTC_LIB="$f"
    elif [ "${1:-}" = --report ]; then
      echo "note: NVRTC not found in $NVRTC_DIR (pip install --target \"$NVRTC_DIR\" '$NVRTC_WHEEL'," \
        "or set TOAST_NVRTC_LIB); the plugin will look for libnvrtc.so itself" >&2
    fi
  fi
  if [ -z "${TOAST_HIPRTC_LIB:-}" ]; then
    f="$( (ldconfig -p 2>/dev/null || true) | awk '/libhiprtc\.so |libamdhip64\.so\.[0-9]+ / {print $NF; exit}')"
    if [ -n "$f" ]; then
      export TOAST_HIPRTC_LIB="$f"
    elif [ "${1:-}" = --report ]; then
      echo "note: hiprtc not found by ldconfig (apt-get install libamdhip64-dev, or set" \
        "TOAST_HIPRTC_LIB); the plugin will look for it itself" >&2
    fi
  fi
}
