#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU machine that has the NVIDIA driver and CUDA's
# libraries but none of Debian's: kc and the GPU tests (stripped), the shared libraries they
# load from Debian (lib/), this machine's C and C++ runtime as a fallback for a machine whose
# own is older (sys/), and the training data (data/). CUDA itself is not packed: the driver,
# cuBLAS and NVRTC are loaded at run time from the GPU machine.
#
#   bench/gpu/bundle.sh [BUNDLE]      (default .gpu-bundle, which .gitignore keeps out of git)
#
# Builds the release tree's targets first. Also packs the bundle into BUNDLE.tgz (about 28 MB:
# OpenBLAS alone is 36 MB unpacked), which is what travels; run.sh unpacks it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUNDLE=${1:-.gpu-bundle}
BUILD=${BUILD:-build/release}
cmake --build "$BUILD" --target kc kc_cuda_kernels_gpu_test kc_cuda_gpt_gpu_test
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/sys" "$BUNDLE/data"
for b in apps/kc/kc tests/hal/kc_cuda_kernels_gpu_test tests/parallel/kc_cuda_gpt_gpu_test; do
  strip -o "$BUNDLE/bin/$(basename "$b")" "$BUILD/$b"
done
# The C library, the C++ runtime and the loader go to sys/ (used only when the GPU machine's
# own are too old); everything else to lib/.
ldd "$BUNDLE"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' |
  sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libstdc++.so.*|libgcc_s.so.*)
        cp -L "$lib" "$BUNDLE/sys/" ;;
      *) cp -L "$lib" "$BUNDLE/lib/" ;;
    esac
  done
chmod u+w "$BUNDLE"/lib/* "$BUNDLE"/sys/*
strip --strip-unneeded "$BUNDLE"/lib/*
if [[ ! -f data/fortunes/manifest.json ]]; then
  "$BUILD/apps/kc/kc" data prepare --out data/fortunes --doc-separator % /usr/share/games/fortunes
fi
cp -r data/fortunes "$BUNDLE/data/"
tar -C "$(dirname "$BUNDLE")" -czf "$BUNDLE.tgz" "$(basename "$BUNDLE")"
du -sh "$BUNDLE" "$BUNDLE"/* "$BUNDLE.tgz"
