#!/usr/bin/env bash
# Every low-bit type on the GPU, on real models: requantizes both real
# models with llama.cpp's own `llama-quantize` (an importance matrix from
# `llama-imatrix` over this repository's docs, which the IQ1/IQ2 types
# require) into each lattice and ternary type, then runs the same greedy
# prompt through `lamina run --ngl 0`, `lamina run --ngl all` and llama.cpp's
# `llama-completion`, and prints whether Lamina's CPU and GPU agree and how
# many leading words llama.cpp shares. llama.cpp rounds activations to 8
# bits for these dot products, Lamina keeps them in f32: on files this
# noisy (a 4-bit file requantized to 2 bits) they part at near-ties.
#
#   benches/requant.sh                    # both models, every type
#   TYPES="IQ3_S IQ2_XXS" N=16 benches/requant.sh
#
# Builds llama.cpp's CPU tools through benches/peer.sh's cache (see there).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
TYPES=${TYPES:-IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S TQ1_0 TQ2_0}
N=${N:-10}
PROMPT=${PROMPT:-The capital of France is}
WORK=${WORK:-$CACHE/requant}

SKIP_GPU=1 BUILD_ONLY=1 bash benches/peer.sh
BIN="$CACHE/build-cpu/bin"
cmake --build "$CACHE/build-cpu" --target llama-quantize llama-imatrix llama-completion \
  -j "$(nproc)" >>"$CACHE/build-cpu.log" 2>&1
[ -x target/release/lamina ] || cargo build --release --locked
mkdir -p "$WORK"
cat README.md ARCHITECTURE.md >"$WORK/calibration.txt"
llama() { LD_LIBRARY_PATH="$BIN" "$BIN/$1" "${@:2}"; }
first_words() { tr '\n' ' ' | sed 's/  */ /g; s/^ //' | cut -c1-80; }

echo "| model | type | Lamina CPU = GPU | words shared with llama.cpp | Lamina (GPU) | llama.cpp |"
echo "| --- | --- | --- | --- | --- | --- |"
for model in SmolLM2-135M-Instruct.Q4_1 gemma-3-270m-q4_k_m; do
  src="$MODELS/$model.gguf"
  imatrix="$WORK/$model.imatrix.gguf"
  [ -f "$imatrix" ] || llama llama-imatrix -m "$src" -f "$WORK/calibration.txt" -o "$imatrix" \
    -c 256 --chunks 8 -t "$(nproc)" >"$WORK/$model.imatrix.log" 2>&1
  for ty in $TYPES; do
    out="$WORK/$model.$ty.gguf"
    [ -f "$out" ] || llama llama-quantize --allow-requantize --imatrix "$imatrix" "$src" "$out" \
      "$ty" >"$WORK/$model.$ty.log" 2>&1
    cpu=$(target/release/lamina run -m "$out" -p "$PROMPT" -n "$N" --temp 0 --ngl 0 2>/dev/null | first_words)
    gpu=$(target/release/lamina run -m "$out" -p "$PROMPT" -n "$N" --temp 0 --ngl all 2>/dev/null | first_words)
    peer=$(llama llama-completion -m "$out" -p "$PROMPT" -n "$N" --temp 0 -no-cnv \
      --no-display-prompt --simple-io -t "$(nproc)" </dev/null 2>/dev/null | first_words)
    shared=$(python3 -c 'import sys
a, b = sys.argv[1].split(), sys.argv[2].split()
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
print(f"{n} of {min(len(a), len(b))}")' "$gpu" "$peer")
    same=no
    [ "$cpu" = "$gpu" ] && same=yes
    echo "| $model | $ty | $same | $shared | $gpu | $peer |"
  done
done
