#!/usr/bin/env bash
# device-prebuild.sh: run HERE before a call: builds lumen and test_cuda for the GPU machine in
# build-carrybuild (no -march=native: the GPU machine's CPU may differ) and copies the two binaries
# to build-carry/, which the call carries (`carry: ["build-carry", ".deps"]`) so the GPU machine's
# time is not spent compiling. device-run.sh falls back to building there if they do not run.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-carrybuild -DLM_WERROR=OFF -DLM_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-carrybuild -j 2 --target lumen test_cuda
mkdir -p build-carry
cp build-carrybuild/lumen build-carrybuild/tests/test_cuda build-carry/
pwd > build-carry/srcdir.txt
echo "source dir compiled in: $(pwd)"
ls -la build-carry
