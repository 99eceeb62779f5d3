#!/usr/bin/env bash
# The README's main command: builds lumen, serves the embedded tiny Qwen3 model on a free local
# port (writing its request records to build/demo-records.jsonl), and profiles it with
# `lumen profile` on 8 two-turn MT-Bench conversations (2 in flight), verifying every request
# against the server's records. The run folder (report.html, summary.json, ...) goes under runs/;
# per-request records also to build/profile.jsonl. The server is always stopped on exit.
# Usage: scripts/demo.sh [lumen profile options...]   (build output and progress go to stderr,
# the summary to stdout)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -DLM_WERROR=ON >&2  # the same configuration as scripts/test.sh: no rebuild between them
cmake --build build -j"$(nproc)" >&2

# A free TCP port: ask the kernel (bind to port 0) when python3 is there, else probe upward.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    return
  fi
  local p=$((20000 + RANDOM % 20000))
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

port=$(free_port)
url="http://127.0.0.1:$port"
log=build/demo-server.log
server_pid=""
stop_server() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
}
trap stop_server EXIT
trap 'exit 130' INT TERM

echo "demo: starting lumen serve on $url (log: $log)" >&2
records=build/demo-records.jsonl
rm -f "$records"
build/lumen serve --model models/tiny-qwen3 --port "$port" --records "$records" >"$log" 2>&1 &
server_pid=$!

# GET /health answers 200 (curl when installed, else bash's /dev/tcp).
health_ok() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsS -m 2 "$url/health" >/dev/null 2>&1
    return
  fi
  (exec 3<>"/dev/tcp/127.0.0.1/$port" &&
    printf 'GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 &&
    head -n 1 <&3 | grep -q ' 200') 2>/dev/null
}

timeout_s=120
for ((i = 0; i < timeout_s * 10; i++)); do
  if health_ok; then break; fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "demo: lumen serve exited before answering $url/health; its log:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
if ! health_ok; then
  echo "demo: lumen serve did not answer $url/health within ${timeout_s} s; its log:" >&2
  cat "$log" >&2
  exit 1
fi

build/lumen profile --url "$url" --dataset mt_bench --conversations 8 --concurrency 2 \
  --max-tokens 64 --think-time-ms 100 --output build/profile.jsonl \
  --tokenizer models/tiny-qwen3 --server-records "$records" "$@"
