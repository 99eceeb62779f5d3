#!/usr/bin/env bash
# Builds lumen (warnings as errors) and runs every test. Usage: scripts/test.sh [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
# The OpenAI Node SDK for tests/test_node_sdk.c (skipped when node or the SDK is missing).
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  npm ci --prefix tests/node --no-audit --no-fund --silent ||
    echo "scripts/test.sh: npm ci --prefix tests/node failed; test_node_sdk will be skipped" >&2
fi
cmake -S . -B build -DLM_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
