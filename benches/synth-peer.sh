#!/usr/bin/env bash
# Architectures no real test model has (mixtures of experts, phi3) beside
# llama.cpp, on synthetic files both read.
#
# Writes qwen3moe, qwen2moe and phi3 files with `lamina synth` (random
# weights, SmolLM2's vocabulary), then:
#   1. agreement: the same greedy prompt through `lamina run --ngl 0` and
#      `--ngl all` (a mixture's blocks split, routed experts on the CPU, the
#      rest on the GPU; NGLS=0 where there is no GPU adapter) and llama.cpp's
#      `llama-completion`, with f32 weights (no rounding on either
#      side: the tokens must agree) and Q8_0 weights (llama.cpp rounds the
#      activations to 8 bits for its dot products, Lamina keeps f32, so on
#      random weights they part at the first near-tie); prints the words the
#      two outputs share;
#   2. speed: `lamina bench model --ngl 0` beside `llama-bench -ngl 0` on a
#      small qwen3moe (32 experts, 4 a token, 0.4 B expert weights), REPS
#      rounds alternating. Run it on a quiet machine.
#
#   benches/synth-peer.sh
#   REPS=3 TYPE=Q4_0 benches/synth-peer.sh
#
# Builds llama.cpp's CPU tools through benches/peer.sh's cache (see there).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
N=${N:-32}
REPS=${REPS:-2}
TYPE=${TYPE:-Q4_0}
THREADS=${THREADS:-$(nproc)}
PROMPT=${PROMPT:-The capital of France is}
WORK=${WORK:-$CACHE/synth-peer}

SKIP_GPU=1 BUILD_ONLY=1 bash benches/peer.sh
BIN="$CACHE/build-cpu/bin"
cmake --build "$CACHE/build-cpu" --target llama-completion llama-bench \
  -j "$(nproc)" >>"$CACHE/build-cpu.log" 2>&1
[ -x target/release/lamina ] || cargo build --release --locked
LAMINA=target/release/lamina
mkdir -p "$WORK"
llama() { LD_LIBRARY_PATH="$BIN" "$BIN/$1" "${@:2}"; }
words() { tr '\n' ' ' | sed 's/  */ /g; s/^ //'; }
synth() { # shape type out
  [ -f "$3" ] || "$LAMINA" synth --shape "$1" --type "$2" \
    --vocab-from "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" -o "$3" >/dev/null
}

NGLS=${NGLS:-0 all}
echo "| shape | weights | --ngl | words shared with llama.cpp (of $N tokens) | Lamina | llama.cpp |"
echo "| --- | --- | --- | --- | --- | --- |"
for shape in qwen3moe-tiny qwen2moe-tiny phi3-tiny; do
  for ty in F32 Q8_0; do
    for ngl in $NGLS; do
      f="$WORK/$shape-$ty.gguf"
      synth "$shape" "$ty" "$f"
      ours=$("$LAMINA" run -m "$f" -p "$PROMPT" -n "$N" --temp 0 --ngl "$ngl" \
        -ctk f32 -ctv f32 2>/dev/null | words)
      peer=$(llama llama-completion -m "$f" -p "$PROMPT" -n "$N" --temp 0 -no-cnv \
        --no-warmup -t "$THREADS" -ctk f32 -ctv f32 2>/dev/null | words)
      peer=${peer#"$PROMPT"}
      peer=${peer# }
      ours=${ours# }
      shared=0
      read -r -a a <<<"$ours"
      read -r -a b <<<"$peer"
      while [ "$shared" -lt "${#a[@]}" ] && [ "$shared" -lt "${#b[@]}" ] &&
        [ "${a[$shared]}" = "${b[$shared]}" ]; do
        shared=$((shared + 1))
      done
      echo "| $shape | $ty | $ngl | $shared of ${#a[@]} | ${ours:0:60} | ${peer:0:60} |"
    done
  done
done

f="$WORK/qwen3moe-small-$TYPE.gguf"
synth qwen3moe-small "$TYPE" "$f"
echo
echo "qwen3moe-small $TYPE, CPU, $THREADS threads (tokens/s, pp128 / tg32):"
for r in $(seq "$REPS"); do
  l=$(llama llama-bench -m "$f" -ngl 0 -t "$THREADS" -p 128 -n 32 -r 1 -o json 2>/dev/null |
    python3 -c '
import json, sys
rows = json.load(sys.stdin)
pp = [x["avg_ts"] for x in rows if x["n_prompt"] > 0 and x["n_gen"] == 0]
tg = [x["avg_ts"] for x in rows if x["n_gen"] > 0 and x["n_prompt"] == 0]
print("%.1f / %.1f" % (pp[0], tg[0]))')
  ours=$("$LAMINA" bench model -m "$f" --ngl 0 -t "$THREADS" -p 128 -n 32 -r 1 --json 2>/dev/null |
    python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
print("%.1f / %.1f" % (r["pp"]["tokens_per_second"], r["tg"]["tokens_per_second"]))')
  echo "round $r: llama.cpp $l, Lamina $ours"
done
