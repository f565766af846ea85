#!/usr/bin/env bash
# RoPE scaling beside llama.cpp: a synthetic llama in SmolLM2's shape with
# f32 weights and Llama 3.2's per-pair frequency factors (rope_freqs.weight,
# factor 32), read by llama-server and by `lamina serve` at each placement
# in NGLS, and the top-8 log-probabilities of the token after a 150-token
# prompt from each (the native /completion API with n_probs). Random
# weights move those log-probabilities only a little with the angles, so
# the script also runs the file with the factors dropped (--llama3-rope 0
# gives the same weights without rope_freqs.weight) to show the size of
# the effect being matched. Then the same for a phi3 with LongRoPE
# (`lamina synth --long-rope`: long and short factor sets, a trained
# context of 512) at -c 256 (the short set) and -c 1024 (the long one).
# Then YaRN (`lamina synth --yarn 4`: rope.scaling.type yarn, factor 4, an
# original context of 2048) beside the same weights unscaled.
#
#   benches/rope-peer.sh
#   NGLS="0" benches/rope-peer.sh     # where there is no GPU adapter
#   CASES="yarn" benches/rope-peer.sh # some of llama3, phi3, yarn
#
# Builds llama.cpp's CPU tools through benches/peer.sh's cache (see there).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
NGLS=${NGLS:-0 all}
CASES=${CASES:-llama3 phi3 yarn}
PORT=${PORT:-18131}
WORK=${WORK:-$CACHE/rope-peer}

SKIP_GPU=1 BUILD_ONLY=1 bash benches/peer.sh
BIN="$CACHE/build-cpu/bin"
[ -x target/release/lamina ] || cargo build --release --locked
LAMINA=target/release/lamina
mkdir -p "$WORK"
for f in 32 0; do
  [ -f "$WORK/rope-$f.gguf" ] || "$LAMINA" synth --shape smollm2 --type F32 --llama3-rope "$f" \
    --vocab-from "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$WORK/rope-$f.gguf" >/dev/null
done

# The top-8 log-probabilities of the next token, as "token logprob" lines.
top8() {
  python3 - "$PORT" <<'EOF'
import json, sys, time, urllib.request
port = sys.argv[1]
text = " ".join(["The history of the printing press begins in the fifteenth century, "
                 "when movable type changed how books were made and read across Europe."] * 6)
body = json.dumps({"prompt": text, "n_predict": 1, "n_probs": 8, "temperature": 0,
                   "cache_prompt": False}).encode()
for _ in range(120):
    try:
        r = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/completion", data=body,
            headers={"Content-Type": "application/json"}), timeout=600)
        break
    except OSError:
        time.sleep(1)
d = json.load(r)
for t in d["completion_probabilities"][0]["top_logprobs"]:
    print(json.dumps(t["token"]), t["logprob"])
EOF
}

serve() { # name command...
  "${@:2}" >"$WORK/$1.log" 2>&1 &
  local pid=$!
  top8 >"$WORK/$1.top8"
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null || true
}

has() { case " $CASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

runs=()
if has llama3; then
  LD_LIBRARY_PATH="$BIN" serve llama-server "$BIN/llama-server" -m "$WORK/rope-32.gguf" \
    --port "$PORT" -t "$(nproc)" -ctk f32 -ctv f32 -c 1024 -np 1
  for ngl in $NGLS; do
    serve "lamina-$ngl" "$LAMINA" serve -m "$WORK/rope-32.gguf" --port "$PORT" \
      -ctk f32 -ctv f32 -c 1024 -np 1 --ngl "$ngl"
    runs+=("lamina-$ngl")
  done
  serve lamina-nofactors "$LAMINA" serve -m "$WORK/rope-0.gguf" --port "$PORT" \
    -ctk f32 -ctv f32 -c 1024 -np 1 --ngl 0
  runs+=(lamina-nofactors)
fi

if has phi3; then
  [ -f "$WORK/phi3-longrope.gguf" ] || "$LAMINA" synth --shape phi3-tiny --type F32 --long-rope \
    --vocab-from "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$WORK/phi3-longrope.gguf" >/dev/null
  for c in 256 1024; do
    LD_LIBRARY_PATH="$BIN" serve "llama-server-phi3-$c" "$BIN/llama-server" \
      -m "$WORK/phi3-longrope.gguf" --port "$PORT" -t "$(nproc)" -ctk f32 -ctv f32 -c "$c" -np 1
    for ngl in $NGLS; do
      serve "lamina-phi3-$c-$ngl" "$LAMINA" serve -m "$WORK/phi3-longrope.gguf" --port "$PORT" \
        -ctk f32 -ctv f32 -c "$c" -np 1 --ngl "$ngl"
    done
  done
fi

if has yarn; then
  # The same weights as rope-0.gguf (the same shape and seed), with YaRN.
  [ -f "$WORK/yarn-4.gguf" ] || "$LAMINA" synth --shape smollm2 --type F32 --llama3-rope 0 \
    --yarn 4 --vocab-from "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$WORK/yarn-4.gguf" >/dev/null
  LD_LIBRARY_PATH="$BIN" serve llama-server-yarn "$BIN/llama-server" -m "$WORK/yarn-4.gguf" \
    --port "$PORT" -t "$(nproc)" -ctk f32 -ctv f32 -c 1024 -np 1
  for ngl in $NGLS; do
    serve "lamina-yarn-$ngl" "$LAMINA" serve -m "$WORK/yarn-4.gguf" --port "$PORT" \
      -ctk f32 -ctv f32 -c 1024 -np 1 --ngl "$ngl"
  done
  serve lamina-yarn-dropped "$LAMINA" serve -m "$WORK/rope-0.gguf" --port "$PORT" \
    -ctk f32 -ctv f32 -c 1024 -np 1 --ngl 0
fi

python3 - "$WORK" "$NGLS" "$CASES" "${runs[@]}" <<'EOF'
import sys
work, ngls, cases, runs = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4:]
def read(name):
    return [(l.rsplit(" ", 1)[0], float(l.rsplit(" ", 1)[1])) for l in open(f"{work}/{name}.top8")]
def row(label, mine, peer):
    same = [a[0] for a in mine] == [b[0] for b in peer]
    diff = max(abs(a[1] - b[1]) for a, b in zip(mine, peer))
    print(f"| {label} | {'yes' if same else 'no'} | {diff:.2e} |")
print("| run | same top-8 tokens in order | largest log-prob difference from llama-server |")
print("| --- | --- | --- |")
if "llama3" in cases:
    peer = read("llama-server")
    for r in runs:
        label = "llama, factors dropped, --ngl 0" if r == "lamina-nofactors" else f"llama, --ngl {r[7:]}"
        row(label, read(r), peer)
if "phi3" in cases:
    for c in (256, 1024):
        peer = read(f"llama-server-phi3-{c}")
        for ngl in ngls:
            row(f"phi3 LongRoPE, -c {c}, --ngl {ngl}", read(f"lamina-phi3-{c}-{ngl}"), peer)
        other = 1280 - c
        row(f"phi3 LongRoPE: llama-server's own -c {other} against -c {c}",
            read(f"llama-server-phi3-{other}"), peer)
if "yarn" in cases:
    peer = read("llama-server-yarn")
    for ngl in ngls:
        row(f"llama YaRN x4, --ngl {ngl}", read(f"lamina-yarn-{ngl}"), peer)
    row("llama, YaRN dropped, --ngl 0", read("lamina-yarn-dropped"), peer)
EOF
