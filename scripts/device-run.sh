#!/usr/bin/env bash
# device-run.sh STEP...: one call on the GPU machine (see docs/perf-notes.md). Logs go to $OUT.
# Steps, in order given: env (machine facts), test (test_cuda), bench (lumen cudabench on a
# synthetic Qwen3-0.6B: floor, tg128, pp512, batched 1..256), micro (GEMV kernels), variants
# (graphs / PDL / rows per warp), ncu (per-kernel times under Nsight Compute), engtest
# (test_cuda_engine: the serving engine on the GPU), perf (lumen perf --device cuda: pp512, tg128,
# batched decode), q8 (the same on a Q8_0 GGUF, quants on and off), q8big (bf16 against Q8_0 on
# a larger shape), longctx (perf decode at depths 0/1000/4000, split-KV on and off), serve (lumen serve --device cuda on the synthetic 0.6B plus lumen profile on
# ShareGPT at each concurrency of $PROFILE_CONC (default 64), verified against the server's
# records; the summary and the server log land in $OUT, the run folders in /tmp), cpu (the CPU
# kernels' tests and lumen perf on the machine's Xeon, bf16 path off and on),
# ncubatch (per-kernel times of batched decode steps, $NCU_BATCHES), ncugraph (where warps stall
# in one whole decode step, by stall reason: Nsight Compute's sampling of the step's graph), trace (cudabench's block
# timelines of a batch-1 step and of decode steps of $TRACE_BATCHES sequences), arrow
# (scripts/arrow-bench.cu: what a dependency costs beside a weight stream; perf-notes v13, v17;
# ARROW_ARGS=6: the kernel-chain table alone, 7: what follows the chain's waits), copynode
# (scripts/copy-node-bench.cu: what a graph's copy nodes cost; perf-notes v35), linkbench
# (scripts/link-bench.cu: a chain link's cost by launch shape; perf-notes v36), ab
# (lumen perf at batch 1, 2, 4 under alternated environment settings: AB_ENVS, AB_Q8).
# Uses the binaries carried in $LM_CARRY (default build-carry/) when they run here, else builds
# with device-build.sh. The device tool brings back at most 8 files from $OUT (more are left out
# without an error): write step traces and the like to /tmp and copy the one you need.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device-env.sh
OUT=${OUT:-/tmp/lumen-out}
mkdir -p "$OUT"
# The carried test binary has this checkout's path compiled in (LM_SOURCE_DIR) for its data.
CARRY=${LM_CARRY:-build-carry}
[ -f $CARRY/bins.tar.xz ] && [ ! -d $CARRY/bin ] && tar -C $CARRY -xJf $CARRY/bins.tar.xz
SRC=$(cat $CARRY/bin/srcdir.txt 2>/dev/null)
if [ -n "$SRC" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$LM_ROOT" "$SRC"; fi
# Shared test data carried beside the binaries (e.g. llama.cpp's tiny Q8_0 GGUF, which
# test_cuda_engine reads from ../shared/models/tiny-qwen3-gguf when present).
if [ -n "$SRC" ] && ls $CARRY/*.gguf >/dev/null 2>&1; then
  G="$(dirname "$SRC")/shared/models/tiny-qwen3-gguf"
  mkdir -p "$G" && for f in $CARRY/*.gguf; do [ -e "$G/$(basename $f)" ] || ln -s "$PWD/$f" "$G/"; done
fi
LUMEN=$CARRY/bin/lumen TEST=$CARRY/bin/test_cuda TEST_ENG=$CARRY/bin/test_cuda_engine
if ! $LUMEN version >"$OUT/carried.log" 2>&1; then
  echo "carried binaries do not run here ($(head -c 300 "$OUT/carried.log")): building"
  t0=$(date +%s)
  scripts/device-build.sh build-dev >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
  LUMEN=build-dev/lumen TEST=build-dev/tests/test_cuda TEST_ENG=build-dev/tests/test_cuda_engine
fi
# The synthetic Qwen3-0.6B (/tmp/q06) and its Q8_0 GGUF (/tmp/q06-q8.gguf), made once a machine.
need_q06() {
  [ -d /tmp/q06 ] || $LUMEN synth --shape qwen3-0.6b --out /tmp/q06 >"$OUT/synth.log" 2>&1 || tail -5 "$OUT/synth.log"
}
need_q8() {
  need_q06
  [ -f /tmp/q06-q8.gguf ] || $LUMEN build --model /tmp/q06 --out /tmp/q06-q8.gguf --dtype q8_0 \
    >"$OUT/build-q8.log" 2>&1 || tail -5 "$OUT/build-q8.log"
}
# Nsight Compute's command line tool (on PATH, or where the CUDA toolkit installs it).
ncu_bin() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1; }
for step in "$@"; do
  t0=$(date +%s)
  case $step in
  env)
    { nvidia-smi; nvidia-smi -q -d CLOCK | head -40; nproc; lscpu | head -20; ldconfig -p | grep -E 'gnutls|curl|jansson|pcre2|ssl|utf8proc|microhttpd|cublas'; } >"$OUT/env.log" 2>&1
    grep -E "H200|Driver|MiB" "$OUT/env.log" | head -5 ;;
  test)
    timeout ${TEST_TIMEOUT:-300} $TEST >"$OUT/test_cuda.log" 2>&1; rc=$?
    echo "test_cuda exit $rc"; grep -E "failed|worst|model:|checks" "$OUT/test_cuda.log" | head -40 ;;
  synth)
    need_q06 ;;
  trace)
    # lumen cudabench's timelines (perf-notes v17, v22, v23): a batch-1 step's blocks (k_gemm_tc's
    # where the model takes tc_decode, else the GEMV's and the MLP kernel's), then a decode step of
    # each batch size in $TRACE_BATCHES (default 16,64) with its GEMV, MLP and k_gemm_tc blocks (LM_CUDA_TRACE_SYNC=1: when a GEMM block passed its cluster barrier
    # instead of when its last slice of x landed).
    need_q06
    timeout 200 $LUMEN cudabench --model /tmp/q06 -p 0 -n 16 --batches= -r 1 --trace \
      --trace-batches "${TRACE_BATCHES:-16,64}" >"$OUT/trace.log" 2>&1
    grep -E "^\| +[0-9m]|^step|^timeline|^co-residency" "$OUT/trace.log" | grep -v -- "---" ;;
  bench)
    need_q06
    timeout 300 $LUMEN cudabench --model /tmp/q06 ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
  micro)
    need_q06
    timeout 200 $LUMEN cudabench --model /tmp/q06 -p 0 --batches 8 --micro --variants 2>&1 | tee "$OUT/micro.log" ;;
  ncu)
    # Per-kernel GPU times of batch-1 decode steps (kernels serialised: no PDL overlap).
    need_q06
    NCU=$(ncu_bin)
    timeout 240 $NCU --clock-control none --csv --print-units base --metrics gpu__time_duration.sum --launch-count ${NCU_COUNT:-1200} \
      $LUMEN cudabench --model /tmp/q06 -n 8 -r 1 -p 0 --batches "${NCU_BATCHES:-}" >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    python3 scripts/ncu-summary.py "$OUT/ncu.csv" | tee "$OUT/ncu.txt" | head -30 ;;
  ncugraph)
    # Where warps stall in one whole decode step (perf-notes v31): Nsight Compute samples the step's
    # CUDA graph as one workload, the kernels' overlap kept (the profiler slows the step ~1.7x).
    # Launch $NCU_SKIP (default 320) of `lumen perf -n 128 --batch $NCU_GRAPH_BATCH` (default 1) is a
    # decode graph; the first steps run eagerly. Outputs: ncugraph.txt (scripts/ncu-stalls.py, with
    # $NCU_DETAIL's regions, default k_gemm_tc) and ncugraph.csv.xz (the source page, every SASS
    # instruction's samples by stall reason).
    need_q06
    NCU=$(ncu_bin)
    timeout 300 $NCU --graph-profiling graph --clock-control none --cache-control none --launch-skip ${NCU_SKIP:-320} \
      --launch-count 1 --section WarpStateStats --section SourceCounters -o /tmp/ncugraph -f \
      $LUMEN perf --device cuda --model /tmp/q06 -p 0 -n 128 -r 1 --no-bw --batch ${NCU_GRAPH_BATCH:-1} >"$OUT/ncugraph.log" 2>&1
    $NCU -i /tmp/ncugraph.ncu-rep --page source --csv --print-source sass >/tmp/ncugraph.csv 2>>"$OUT/ncugraph.log"
    python3 scripts/ncu-stalls.py /tmp/ncugraph.csv --kernel "${NCU_DETAIL:-k_gemm_tc}" >"$OUT/ncugraph.txt" 2>&1
    grep -a "==PROF== Profiling" "$OUT/ncugraph.log" | head -2; head -40 "$OUT/ncugraph.txt"
    xz -T4 -c /tmp/ncugraph.csv >"$OUT/ncugraph.csv.xz" ;;
  ncubatch)
    # Per-kernel GPU times of batched decode under Nsight Compute (serialised), one table per batch
    # in $NCU_BATCHES (default 16,32,64): cudabench's throughput test with 64-token prompts and 6
    # decode steps (the prompts' prefill kernels show with their own grids). Tables: ncu-b<B>.txt.
    need_q06
    NCU=$(ncu_bin)
    for b in $(echo ${NCU_BATCHES:-16,32,64} | tr , ' '); do
      echo "== batch $b"
      timeout 200 $NCU --clock-control none --csv --print-units base --metrics gpu__time_duration.sum --launch-count 6000 \
        $LUMEN cudabench --model /tmp/q06 -n 0 -r 1 -p 0 --batches $b --in 64 --out 6 >/tmp/ncu-b$b.csv 2>"$OUT/ncu-b$b.err"
      python3 scripts/ncu-summary.py /tmp/ncu-b$b.csv >"$OUT/ncu-b$b.txt"; head -24 "$OUT/ncu-b$b.txt"
    done ;;
  ncuattn)
    # One decode attention launch and one q/k/v GEMV under Nsight Compute's full section set.
    need_q06
    NCU=$(ncu_bin)
    for k in ${NCU_KERNELS:-k_attn_dec k_gemv}; do  # v7: batch-1 decode attention is k_attn_dec
      timeout 120 $NCU --clock-control none --set full -k regex:$k --launch-skip 60 --launch-count 1 \
        $LUMEN cudabench --model /tmp/q06 -n 8 -r 1 -p 0 --batches "" >"$OUT/ncu_$k.txt" 2>&1
      grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc|Memory Throughput|L2 Hit|Stall|stall|Block Limit" "$OUT/ncu_$k.txt" | head -24
    done ;;
  engtest)
    timeout ${TEST_TIMEOUT:-300} $TEST_ENG >"$OUT/test_cuda_engine.log" 2>&1; rc=$?
    echo "test_cuda_engine exit $rc"; grep -vE "^$" "$OUT/test_cuda_engine.log" | tail -25 ;;
  longctx)
    # decode at depth, split-KV attention on (1) and off (0): lumen perf --device cuda -d D
    need_q06
    for d in ${LONG_DEPTHS:-0 1000 4000}; do for sk in 1 0; do
      echo "depth $d, LM_CUDA_SPLIT_KV=$sk"
      LM_CUDA_SPLIT_KV=$sk timeout 200 $LUMEN perf --device cuda --model /tmp/q06 -p 0 -n 64 -d $d -r 3 \
        --no-bw --batch ${LONG_BATCH:-1,8} 2>&1 | grep -E " tg[0-9]"
    done; done 2>&1 | tee "$OUT/longctx.log" ;;
  q8)
    # The synthetic 0.6B as a Q8_0 GGUF (lumen build): lumen perf --device cuda with the GEMV
    # reading the quants, then reading the bf16 copy (LM_CUDA_Q8=0), for A/B.
    need_q8
    timeout 300 $LUMEN perf --device cuda --model /tmp/q06-q8.gguf -p 512 -n 128 -r ${PERF_REPS:-5} --no-bw \
      --batch ${PERF_BATCH:-1,8,32,64,128,256} 2>&1 | tee "$OUT/perf-q8.log"
    echo "LM_CUDA_Q8=0 (bf16 copy):"
    LM_CUDA_Q8=0 timeout 300 $LUMEN perf --device cuda --model /tmp/q06-q8.gguf -p 0 -n 128 -r ${PERF_REPS:-5} \
      --no-bw --batch ${Q8_OFF_BATCH:-1,4} 2>&1 | grep -E " tg[0-9]|weights" | tee "$OUT/perf-q8-off.log" ;;
  ab)
    # A/B of environment settings, alternated: AB_ENVS lists them separated by "|" (default
    # "LM_CUDA_MLP1=0|LM_CUDA_MLP1=1"; a setting may hold several VAR=value words), AB_ROUNDS
    # rounds (default 2), on the synthetic 0.6B or with AB_Q8=1 its Q8_0 GGUF: lumen perf --device
    # cuda -p 0 -n 128 -r $PERF_REPS at batches $AB_BATCH (default 1,2,4).
    M=/tmp/q06
    if [ "${AB_Q8:-0}" = 1 ]; then need_q8; M=/tmp/q06-q8.gguf; else need_q06; fi
    IFS='|' read -ra envs <<<"${AB_ENVS:-LM_CUDA_MLP1=0|LM_CUDA_MLP1=1}"
    for r in $(seq ${AB_ROUNDS:-2}); do for e in "${envs[@]}"; do
      echo "== $e ($(basename $M), round $r)"
      env $e timeout 200 $LUMEN perf --device cuda --model $M -p 0 -n 128 -r ${PERF_REPS:-5} --no-bw \
        --batch ${AB_BATCH:-1,2,4} 2>&1 | grep -E " tg[0-9]|rror"
    done; done 2>&1 | tee -a "$OUT/ab.log" ;;
  q8big)
    # A larger shape ($Q8_SHAPE, default qwen3-1.7b), where a step's DRAM time outweighs its
    # latency chain: lumen perf --device cuda on the bf16 folder, then on its Q8_0 GGUF with the
    # GEMV reading the quants and (LM_CUDA_Q8=0) the bf16 copy.
    SH=${Q8_SHAPE:-qwen3-1.7b}; D=/tmp/$SH
    [ -d $D ] || $LUMEN synth --shape $SH --out $D >"$OUT/synth-$SH.log" 2>&1 || tail -5 "$OUT/synth-$SH.log"
    [ -f $D-q8.gguf ] || $LUMEN build --model $D --out $D-q8.gguf --dtype q8_0 >"$OUT/build-$SH.log" 2>&1 \
      || tail -5 "$OUT/build-$SH.log"
    for run in "bf16 $D" "q8_0 $D-q8.gguf" "q8_0-bf16copy $D-q8.gguf"; do
      set -- $run; echo "== $SH $1"
      env $( [ $1 = q8_0-bf16copy ] && echo LM_CUDA_Q8=0 ) timeout 300 $LUMEN perf --device cuda --model $2 -p 512 -n 128 \
        -r ${PERF_REPS:-3} --no-bw --batch ${Q8_BATCH:-1,4,64} 2>&1 | grep -E " (pp|tg)[0-9]|^weights"
    done 2>&1 | tee "$OUT/q8big.log" ;;
  arrow)
    nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/arrow-bench scripts/arrow-bench.cu &&
      timeout 300 /tmp/arrow-bench ${ARROW_ARGS:-} 2>&1 | tee "$OUT/arrow.log" ;;
  copynode)
    # scripts/copy-node-bench.cu: a decode graph's input and output copy nodes against kernels
    # (perf-notes v35)
    nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/copy-node-bench scripts/copy-node-bench.cu &&
      timeout 120 /tmp/copy-node-bench 2>&1 | tee "$OUT/copy-node.log" ;;
  linkbench)
    # scripts/link-bench.cu: one link of the kernel chain by launch shape (perf-notes v36)
    nvcc -O3 -std=c++17 -arch=sm_90a -Isrc -o /tmp/link-bench scripts/link-bench.cu &&
      timeout 120 /tmp/link-bench 2>&1 | tee "$OUT/link-bench.log" ;;
  cpu)
    # The CPU kernels on this machine's Xeon (AVX-512 with VNNI and BF16): the carried
    # test_kernels, test_bf16_act and test_quant (LM_PREBUILD_TARGETS), then lumen perf on the
    # bf16 0.6B with $CPU_THREADS threads, bf16 path off (LM_CPU_BF16_ACT=0, the default) and
    # on; CPU_TESTS names the tests to run. Before them, the matmul alone on 1 and 2 threads
    # (scripts/cpu-mmbench.c, carried when the prebuild had LM_PREBUILD_MMBENCH=1).
    if [ -x $CARRY/bin/cpu-mmbench ]; then for t in 1 2; do $CARRY/bin/cpu-mmbench $t; done | tee "$OUT/cpu-mmbench.log"; fi
    for t in ${CPU_TESTS:-test_kernels test_bf16_act test_quant}; do
      [ -x $CARRY/bin/$t ] || continue
      LM_CPU_BF16_ACT=0 timeout 600 $CARRY/bin/$t >"$OUT/$t.log" 2>&1; echo "$t exit $?"
      grep -E "failed|checked|top-1|matmul bf16 act \(avx512bf16, 2" "$OUT/$t.log" | head -12
    done
    need_q06
    for a in 0 1; do echo "== LM_CPU_BF16_ACT=$a"
      LM_CPU_BF16_ACT=$a timeout 280 $LUMEN perf --model /tmp/q06 -t ${CPU_THREADS:-2} -p ${CPU_P:-512} \
        -n ${CPU_N:-64} -r ${CPU_REPS:-2} --batch ${CPU_BATCH:-1,16} 2>&1 | tee "$OUT/cpu-perf-$a.log"
    done ;;
  perf)
    need_q06
    timeout 300 $LUMEN perf --device cuda --model /tmp/q06 -p 512 -n 128 -r ${PERF_REPS:-5} --no-bw \
      --batch ${PERF_BATCH:-1,8,32,64,128,256} 2>&1 | tee "$OUT/perf.log" ;;
  serve)
    # For each concurrency in $PROFILE_CONC (default 64): lumen serve --device cuda (fresh), then
    # lumen profile (ShareGPT, 2 turns, greedy, 128 tokens) verified against the server's records;
    # SIGTERM; the shutdown line. Outputs: serve-c<C>$PROFILE_TAG.log, profile-c<C>$PROFILE_TAG.txt.
    # PROFILE_EXTRA: a JSON object merged into every request (e.g. '{"min_p":1e-9}' makes the
    # engine sample on the host from copied logits, for comparison).
    # SERVE_Q8=1 serves the synthetic model's Q8_0 GGUF instead. SERVE_SPEC: a speculative config
    # for lumen serve (--speculative-config JSON). PROFILE_DATASET: default sharegpt.
    SM=/tmp/q06
    if [ "${SERVE_Q8:-0}" = 1 ]; then need_q8; SM=/tmp/q06-q8.gguf; else need_q06; fi
    for conc in $(echo ${PROFILE_CONC:-64} | tr , ' '); do
      rm -rf /tmp/lumen-records.jsonl /tmp/lumen-profile-c$conc
      $LUMEN serve --device cuda --model $SM --port 8123 --ctx-size 4096 --max-seqs ${SERVE_SEQS:-256} \
        --max-batch-tokens ${SERVE_BATCH:-2048} --kv-size ${SERVE_KV:-16G} --max-queue 1024 \
        ${SERVE_SPEC:+--speculative-config "$SERVE_SPEC"} --records /tmp/lumen-records.jsonl >"$OUT/serve-c$conc${PROFILE_TAG:-}.log" 2>&1 &
      spid=$!
      for i in $(seq 1 120); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 0.5; done
      curl -s http://127.0.0.1:8123/v1/models; echo
      timeout 400 $LUMEN profile --url http://127.0.0.1:8123 --dataset ${PROFILE_DATASET:-sharegpt} --context-tokens 4096 \
        --concurrency $conc --conversations ${PROFILE_CONVS:-256} --max-tokens 128 \
        --model-dir /tmp/q06 --server-records /tmp/lumen-records.jsonl ${PROFILE_EXTRA:+--extra-body "$PROFILE_EXTRA"} \
        --artifact-dir /tmp/lumen-profile-c$conc --quiet >"$OUT/profile-c$conc${PROFILE_TAG:-}.txt" 2>&1
      echo "profile (concurrency $conc) exit $?"
      cat "$OUT/profile-c$conc${PROFILE_TAG:-}.txt"
      kill -TERM $spid; wait $spid; echo "serve exit $?"
      grep -a "^lumen serve:" "$OUT/serve-c$conc${PROFILE_TAG:-}.log" | grep -av "^lumen serve: [A-Z]* /"
    done ;;
  *) echo "unknown step $step" ;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
