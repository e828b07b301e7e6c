#!/usr/bin/env bash
# gpu-bundle.sh [--heldout DIR] [BUNDLE_DIR] -- make the folder that is
# copied to a GPU machine to run scripts/gpu-check.sh there: the release
# build (stripped), the plugins, the emulated drivers, the reference cases
# and the scripts, in one folder (default: .gpu in the repository root,
# which git ignores), about 15 MiB. On the GPU machine:
#
#   .gpu/gpu-check.sh OUTDIR            # the report: OUTDIR/gpu-check.md
#   .gpu/gpu-check.sh --emulated OUTDIR # the same on the emulated drivers
#
# Layout (what gpu-check.sh looks for beside itself):
#   BUNDLE              the commit, the date and the toolchain of the build
#   gpu-check.sh        the check
#   gpu-compilers.sh    how --emulated finds NVRTC and hiprtc
#   bin/toast-cli       the binary; the plugins beside it
#   bin/libtoast_backend_{cpu,cuda,hip,opencl}.so   (toast-cli loads the
#                       plugins of its own directory)
#   emu/cuda/libcuda.so.1, emu/cuda/libcuda.so, emu/hip/libamdhip64.so
#                       the emulated drivers (toast-gpu-emu), for --emulated
#   cases/*.npz         the shipped reference cases
#   heldout/*.npz       more TOAST cases, with --heldout DIR (verified too)
#
# Builds the README's release build first (cargo build --release); an
# existing BUNDLE_DIR is replaced. Exit status 0, or 2 with the reason
# (the build failed, --heldout has no cases, the bundle is over 64 MiB).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac

heldout=
dir=
while [ $# -gt 0 ]; do
  case "$1" in
    --heldout) heldout=${2:?--heldout needs a directory}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "gpu-bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) dir=$1 ;;
  esac
  shift
done
dir=${dir:-$root/.gpu}
if [ -n "$heldout" ] && ! ls "$heldout"/*.npz >/dev/null 2>&1; then
  echo "gpu-bundle.sh: --heldout $heldout: no *.npz cases there" >&2
  exit 2
fi

cargo build --release --quiet --manifest-path "$root/Cargo.toml" || {
  echo "gpu-bundle.sh: the release build failed" >&2
  exit 2
}

rel="$target/release"
# Stripped when strip is installed (the debug information is most of the
# size), copied as they are otherwise.
put() {
  mkdir -p "$(dirname "$2")"
  if command -v strip >/dev/null 2>&1; then strip -o "$2" "$1"; else cp "$1" "$2"; fi
}
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/cases"
put "$rel/toast-cli" "$dir/bin/toast-cli"
for b in cpu cuda hip opencl; do
  put "$rel/libtoast_backend_$b.so" "$dir/bin/libtoast_backend_$b.so"
done
put "$rel/libtoast_emu_cuda.so" "$dir/emu/cuda/libcuda.so.1"
cp "$dir/emu/cuda/libcuda.so.1" "$dir/emu/cuda/libcuda.so"
put "$rel/libtoast_emu_hip.so" "$dir/emu/hip/libamdhip64.so"
cp "$root"/tests/data/toast-kernels/cases/*.npz "$dir/cases/"
if [ -n "$heldout" ]; then
  mkdir -p "$dir/heldout"
  cp "$heldout"/*.npz "$dir/heldout/"
fi
cp "$root/scripts/gpu-check.sh" "$root/scripts/gpu-compilers.sh" "$dir/"
{
  echo "commit: $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "built: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname 2>/dev/null)"
  echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
} >"$dir/BUNDLE"

kib=$(du -sk "$dir" | cut -f1)
echo "gpu-bundle.sh: $dir: $((kib / 1024)) MiB ($(sed -n 's/^commit: //p' "$dir/BUNDLE")); run $dir/gpu-check.sh [--emulated] OUTDIR"
if [ "$kib" -gt $((64 * 1024)) ]; then
  echo "gpu-bundle.sh: $dir is over 64 MiB" >&2
  exit 2
fi
