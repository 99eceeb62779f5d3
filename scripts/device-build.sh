#!/usr/bin/env bash
# device-build.sh [BUILD_DIR]: builds `lumen` and test_cuda with the CUDA backend on the GPU machine
# (default build dir build-dev), using the packages of .deps/ (see device-env.sh). Ninja when present.
set -euo pipefail
source "$(dirname "$0")/device-env.sh"
cd "$LM_ROOT"
B=${1:-build-dev}
args=(-S . -B "$B" -DLM_WERROR=${LM_WERROR:-OFF} -DCMAKE_BUILD_TYPE=Release -DPKG_CONFIG_EXECUTABLE="$LM_PKG_CONFIG")
if command -v ninja >/dev/null 2>&1; then args+=(-G Ninja); fi
cmake "${args[@]}"
cmake --build "$B" -j "$(nproc)" --target lumen test_cuda
