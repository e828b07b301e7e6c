#!/usr/bin/env bash
# emulated-gpu.sh <toast-cli args> -- run any toast-cli command with the
# CUDA and HIP plugins on the emulated drivers of toast-gpu-emu (the shared
# device kernels compiled for the host, run over the launch grid), on a
# machine without a GPU. The plugins are the real ones: real NVRTC / hiprtc
# compilation, real driver calls, answered by the emulators.
#
#   scripts/emulated-gpu.sh backends
#   scripts/emulated-gpu.sh verify --backend cuda
#   scripts/emulated-gpu.sh verify --backend hip --cases DIR
#   scripts/emulated-gpu.sh run --backend hip --n-det 4
#
# Builds (release) what it needs, installs nothing outside the repository's
# target/ (CARGO_TARGET_DIR if set): the emulators are linked there as
# target/emulated-gpu/cuda/libcuda.so{,.1} and target/emulated-gpu/hip/
# libamdhip64.so, which go first on LD_LIBRARY_PATH. NVRTC and hiprtc are
# found as CI finds them (scripts/gpu-compilers.sh); without them the
# backend is reported unavailable by toast-cli (verify exits 3). The exit
# status is toast-cli's. TOAST_EMU_THREADS=N runs each launch's blocks on N
# host threads (default 1: sequential); TOAST_EMU_TRACE=1 prints every
# failing emulated call with its reason. Device faults on demand (see
# toast-gpu-emu's crate documentation): TOAST_EMU_FAIL=KIND:N fails the Nth
# call of KIND (alloc, copy, launch, sync), KIND:N+ that one and every later; TOAST_EMU_COUNTS=FILE writes the
# calls of each kind made so far; TOAST_EMU_MEMORY=BYTES (K/M/G suffixes)
# sets the device's memory (default 16 GiB).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac

# The README's build (every default member: toast-cli, the plugins, the
# emulators). Building a subset instead would resolve other features for the
# shared crates and rebuild them, here and again in the next full build.
cargo build --release --quiet --manifest-path "$root/Cargo.toml"

emu="$target/emulated-gpu"
mkdir -p "$emu/cuda" "$emu/hip"
ln -sfn ../../release/libtoast_emu_cuda.so "$emu/cuda/libcuda.so.1"
ln -sfn ../../release/libtoast_emu_cuda.so "$emu/cuda/libcuda.so"
ln -sfn ../../release/libtoast_emu_hip.so "$emu/hip/libamdhip64.so"

# shellcheck source=gpu-compilers.sh
. "$root/scripts/gpu-compilers.sh"
toast_find_gpu_compilers --report

export LD_LIBRARY_PATH="$emu/cuda:$emu/hip${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$target/release/toast-cli" "$@"
