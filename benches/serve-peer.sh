#!/usr/bin/env bash
# Lamina's server beside llama-server under the same load, in one run,
# alternating: each round starts llama-server, measures it, stops it, then
# does the same for `lamina serve`. Both serve the same file on the CPU with
# the same slots, context and threads; one neutral client measures both
# (`lamina bench serve --server HOST:PORT`: streaming chat completions,
# temperature 0, a different short prompt per request), and the table gives
# aggregate generated tokens/s and time-to-first-token p99 per level, with
# the ratios.
#
#   benches/serve-peer.sh                          # SmolLM2, 1/4/8 clients, 2 rounds
#   REPS=3 CLIENTS=1,8 benches/serve-peer.sh
#   MODEL=path/to/file.gguf benches/serve-peer.sh
#   CONVERSATION=1 CLIENTS=4 PARALLEL=1 REQUESTS=6 MAX_TOKENS=64 benches/serve-peer.sh
#       # each client one conversation of REQUESTS turns (bench serve
#       # --conversation): more conversations than slots, so what each
#       # server's host prompt cache (--cache-ram) keeps decides how much of
#       # a history is prefilled again
#
# llama-server is built from the `llama-cpp-python` sdist's llama.cpp (the
# CPU build of benches/peer.sh, with the server target added). Run on a quiet
# machine: both servers' threads lose most of their speed when anything else
# runs.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
MODEL=${MODEL:-$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf}
REPS=${REPS:-2}
CLIENTS=${CLIENTS:-1,4,8}
REQUESTS=${REQUESTS:-4}
MAX_TOKENS=${MAX_TOKENS:-32}
THREADS=${THREADS:-$(nproc)}
JOBS=${JOBS:-$(nproc)}
PARALLEL=${PARALLEL:-$(tr , '\n' <<<"$CLIENTS" | sort -n | tail -1)}
CONVERSATION=${CONVERSATION:-0}
CONV_FLAG=
TURNS=1
if [ "$CONVERSATION" = 1 ]; then
  CONV_FLAG=--conversation
  TURNS=$REQUESTS
fi
# The context both get: what `lamina bench serve` gives its own server.
CTX=${CTX:-$((PARALLEL * (MAX_TOKENS + 256) * TURNS))}
PORT=${PORT:-18090}

log() { echo "serve-peer: $*" >&2; }

[ -f "$MODEL" ] || bash scripts/fetch-models.sh >/dev/null
[ -x target/release/lamina ] || cargo build --release --locked --bin lamina
LAMINA=$PWD/target/release/lamina

# llama.cpp's source and CPU build (with peer.sh's AMX check), then its server.
SKIP_GPU=1 BUILD_ONLY=1 bash benches/peer.sh
server_bin="$CACHE/build-cpu/bin/llama-server"
if [ ! -x "$server_bin" ]; then
  log "building llama-server with $JOBS jobs"
  cmake -S "$CACHE/src" -B "$CACHE/build-cpu" -DLLAMA_BUILD_SERVER=ON \
    >>"$CACHE/build-cpu.log" 2>&1
  cmake --build "$CACHE/build-cpu" --target llama-server -j "$JOBS" \
    >>"$CACHE/build-cpu.log" 2>&1 || { tail -30 "$CACHE/build-cpu.log"; exit 1; }
fi

pid=
stop() {
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  pid=
}
trap stop EXIT

# Waits until /health answers 200 (both servers answer 503 while loading).
wait_ready() {
  python3 - "$PORT" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(600):
    try:
        if urllib.request.urlopen(url, timeout=2).status == 200:
            sys.exit(0)
    except Exception:
        pass
    time.sleep(0.2)
sys.exit("the server did not become ready in 120 s")
PY
}

# One measurement of the server on $PORT: "tokens/s ttft_p99_ms" per level.
measure() {
  "$LAMINA" bench serve --server "127.0.0.1:$PORT" --clients "$CLIENTS" \
    --requests-per-client "$REQUESTS" --max-tokens "$MAX_TOKENS" $CONV_FLAG --json |
    python3 -c '
import json, sys
v = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(" ".join("%s %s" % (l["tokens_per_s"], l["ttft_p99_ms"]) for l in v["levels"]))'
}

out=$(mktemp)
for round in $(seq "$REPS"); do
  log "round $round: llama-server"
  "$server_bin" -m "$MODEL" -ngl 0 -t "$THREADS" -np "$PARALLEL" -c "$CTX" \
    --host 127.0.0.1 --port "$PORT" >/dev/null 2>&1 &
  pid=$!
  wait_ready
  echo "llama $(measure)" >>"$out"
  stop
  log "round $round: lamina serve"
  "$LAMINA" serve -m "$MODEL" -t "$THREADS" --parallel "$PARALLEL" -c "$CTX" \
    --host 127.0.0.1 --port "$PORT" >/dev/null 2>&1 &
  pid=$!
  wait_ready
  echo "lamina $(measure)" >>"$out"
  stop
done

python3 - "$out" "$CLIENTS" "$MODEL" <<'PY'
import sys, os
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
levels = [int(c) for c in sys.argv[2].split(",")]
def mean(who, i):
    v = [float(r[1 + i]) for r in rows if r[0] == who]
    return sum(v) / len(v)
print(f"{os.path.basename(sys.argv[3])}, CPU; mean of {len(rows) // 2} alternating runs each")
print("| clients | Lamina tokens/s | llama-server tokens/s | ratio | Lamina TTFT p99 ms | llama-server TTFT p99 ms |")
print("| --- | --- | --- | --- | --- | --- |")
for j, c in enumerate(levels):
    lt, st = mean("lamina", 2 * j), mean("llama", 2 * j)
    lf, sf = mean("lamina", 2 * j + 1), mean("llama", 2 * j + 1)
    print(f"| {c} | {lt:.1f} | {st:.1f} | {lt / st:.2f}x | {lf:.0f} | {sf:.0f} |")
PY
rm -f "$out"
