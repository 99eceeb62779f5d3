#!/usr/bin/env bash
# device-prebuild.sh [BUILD_DIR [CARRY_DIR]]: run HERE before a call: builds lumen and test_cuda for
# the GPU machine in BUILD_DIR (default build-carrybuild) and packs them into
# CARRY_DIR/bins.tar.xz (default build-carry) (the fat binaries are mostly PTX
# text and shrink ~5x), which the call carries (`carry: ["build-carry", ".deps"]`) so that the
# GPU machine's time is not spent compiling. CPU code targets x86-64-v3 (AVX2/FMA/F16C), not
# -march=native: the GPU machine's CPU may differ. device-run.sh falls back to building there if
# the binaries do not run.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-build-carrybuild} C=${2:-build-carry}
cmake -S . -B "$B" -DLM_WERROR=OFF -DLM_NATIVE=OFF -DCMAKE_C_FLAGS=-march=x86-64-v3 \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j 2 --target lumen ${LM_PREBUILD_TARGETS:-test_cuda}
rm -rf "$C" && mkdir -p "$C/bin"
cp "$B/lumen" "$C/bin/"
for t in ${LM_PREBUILD_TARGETS:-test_cuda}; do cp "$B/tests/$t" "$C/bin/"; done
# The CPU matmul probe (scripts/cpu-mmbench.c) on the same libraries, for device-run.sh's cpu step.
if [ "${LM_PREBUILD_MMBENCH:-0}" = 1 ]; then
  cc -O2 -march=x86-64-v3 -Isrc scripts/cpu-mmbench.c "$B/liblm_backend.a" "$B/liblm_base.a" -lm -lpthread \
    -o "$C/bin/cpu-mmbench"
fi
strip --strip-debug "$C"/bin/*
pwd > "$C/bin/srcdir.txt"
tar -C "$C" -cJf "$C/bins.tar.xz" bin && rm -rf "$C/bin"
ls -la "$C"
