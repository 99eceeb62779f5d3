#!/usr/bin/env bash
# device-run.sh STEP...: one call on the GPU machine (see docs/perf-notes.md). Logs go to $OUT.
# Steps, in order given: env (machine facts), test (test_cuda), bench (lumen cudabench on a
# synthetic Qwen3-0.6B: floor, tg128, pp512, batched 1..256), micro (GEMV kernels), variants
# (graphs / PDL / rows per warp), ncu (per-kernel times under Nsight Compute).
# Uses the binaries carried in build-carry/ when they run here, else builds with device-build.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh
OUT=${OUT:-/tmp/lumen-out}
mkdir -p "$OUT"
# The carried test binary has this checkout's path compiled in (LM_SOURCE_DIR) for its data.
[ -f build-carry/bins.tar.xz ] && [ ! -d build-carry/bin ] && tar -C build-carry -xJf build-carry/bins.tar.xz
SRC=$(cat build-carry/bin/srcdir.txt 2>/dev/null)
if [ -n "$SRC" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$LM_ROOT" "$SRC"; fi
LUMEN=build-carry/bin/lumen TEST=build-carry/bin/test_cuda
if ! $LUMEN version >"$OUT/carried.log" 2>&1; then
  echo "carried binaries do not run here ($(head -c 300 "$OUT/carried.log")): building"
  t0=$(date +%s)
  scripts/device-build.sh build-dev >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  LUMEN=build-dev/lumen TEST=build-dev/tests/test_cuda
fi
for step in "$@"; do
  t0=$(date +%s)
  case $step in
  env)
    { nvidia-smi; nvidia-smi -q -d CLOCK | head -40; nproc; lscpu | head -20; ldconfig -p | grep -E 'gnutls|curl|jansson|pcre2|ssl|utf8proc|microhttpd|cublas'; } >"$OUT/env.log" 2>&1
    grep -E "H200|Driver|MiB" "$OUT/env.log" | head -5 ;;
  test)
    timeout 300 $TEST >"$OUT/test_cuda.log" 2>&1; rc=$?
    echo "test_cuda exit $rc"; grep -E "failed|worst|model:|checks" "$OUT/test_cuda.log" | head -40 ;;
  synth)
    [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1 || tail -5 "$OUT/synth.log" ;;
  bench)
    [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1
    timeout 300 $LUMEN cudabench --model /tmp/q06 ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
  micro)
    [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1
    timeout 200 $LUMEN cudabench --model /tmp/q06 -p 0 --batches 8 --micro --variants 2>&1 | tee "$OUT/micro.log" ;;
  ncu)
    # Per-kernel GPU times of batch-1 decode steps (kernels serialised: no PDL overlap).
    [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    timeout 240 $NCU --clock-control none --csv --print-units base --metrics gpu__time_duration.sum --launch-count ${NCU_COUNT:-1200} \
      $LUMEN cudabench --model /tmp/q06 -n 8 -r 1 -p 0 --batches "${NCU_BATCHES:-}" >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    python3 scripts/ncu-summary.py "$OUT/ncu.csv" | tee "$OUT/ncu.txt" | head -30 ;;
  ncuattn)
    # One decode attention launch and one q/k/v GEMV under Nsight Compute's full section set.
    [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for k in k_attention k_gemv; do
      timeout 120 $NCU --clock-control none --set full -k regex:$k --launch-skip 60 --launch-count 1 \
        $LUMEN cudabench --model /tmp/q06 -n 8 -r 1 -p 0 --batches "" >"$OUT/ncu_$k.txt" 2>&1
      grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|Memory Throughput|L2 Hit|Stall|stall|Block Limit" "$OUT/ncu_$k.txt" | head -24
    done ;;
  *) echo "unknown step $step" ;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
