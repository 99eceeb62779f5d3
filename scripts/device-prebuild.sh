#!/usr/bin/env bash
# device-prebuild.sh: run HERE before a call: builds lumen and test_cuda for the GPU machine in
# build-carrybuild and packs them into build-carry/bins.tar.xz (the fat binaries are mostly PTX
# text and shrink ~5x), which the call carries (`carry: ["build-carry", ".deps"]`) so that the
# GPU machine's time is not spent compiling. CPU code targets x86-64-v3 (AVX2/FMA/F16C), not
# -march=native: the GPU machine's CPU may differ. device-run.sh falls back to building there if
# the binaries do not run.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-carrybuild -DLM_WERROR=OFF -DLM_NATIVE=OFF -DCMAKE_C_FLAGS=-march=x86-64-v3 \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-carrybuild -j 2 --target lumen test_cuda
rm -rf build-carry && mkdir -p build-carry/bin
cp build-carrybuild/lumen build-carrybuild/tests/test_cuda build-carry/bin/
strip --strip-debug build-carry/bin/lumen build-carry/bin/test_cuda
pwd > build-carry/bin/srcdir.txt
tar -C build-carry -cJf build-carry/bins.tar.xz bin && rm -rf build-carry/bin
ls -la build-carry
