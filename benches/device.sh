#!/usr/bin/env bash
# Lamina on a real GPU in one short run (a few minutes), from a stripped
# release binary built on another machine: the target needs no Rust, only the
# Vulkan loader (libvulkan1) and its GPU's driver.
#
#   # where Lamina builds:
#   BUILD_ONLY=1 benches/device.sh      # target/device/{lamina,vocab.gguf}
#   # on the GPU machine, from the repository root:
#   BW_GBS=4800 benches/device.sh       # BW_GBS: the device's memory bandwidth
#   SHAPES=smollm2 TYPES=Q4_0 N_PROMPT=16 N_GEN=8 KERNEL_ITERS=2 MATMUL_COLS=0 \
#     benches/device.sh                 # a smoke run on a software device
#
# Steps: the adapter; the CPU and the GPU decode the same synthetic model
# (SmolLM2's shape, Q4_0 and Q8_0, SmolLM2's tokenizer) to the same tokens;
# `bench kernels` at the models' shapes, and the mat-mul kernels at 16, 64
# and 512 columns (where small-N and tiled cross); `bench model --ngl all` on synthetic
# 1B and 8B llamas (Q4_0, Q4_K), each decode rate also as weight bytes per
# second and as a share of BW_GBS; a synthetic mixture of experts with its
# experts on the GPU, routed there (`--n-cpu-moe 0`), alone and eight at
# once, with the submissions a token takes; the server under load (`bench
# serve`, one client and eight), greedy and sampled (the default top-k chain,
# whose candidates the GPU selects). Synthetic files are written on
# the spot (`lamina synth`), so nothing large travels. Prints markdown
# tables.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=target/device
BIN=${LAMINA_BIN:-$DIR/lamina}
WORK=${WORK:-$(mktemp -d)}
N_PROMPT=${N_PROMPT:-512}
N_GEN=${N_GEN:-128}
BW_GBS=${BW_GBS:-}
SHAPES=${SHAPES:-1b 8b}
MOE_SHAPES=${MOE_SHAPES:-qwen3moe-small}
TYPES=${TYPES:-Q4_0 Q4_K}
KERNEL_ITERS=${KERNEL_ITERS:-50}
MATMUL_COLS=${MATMUL_COLS:-16,64,512}

if [ -n "${BUILD_ONLY:-}" ]; then
  cargo build --release --locked -p lamina
  mkdir -p "$DIR"
  strip -o "$DIR/lamina" target/release/lamina
  models=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
  "$DIR/lamina" synth --vocab-only --vocab-from "$models/SmolLM2-135M-Instruct.Q4_1.gguf" \
    -o "$DIR/vocab.gguf"
  ls -la "$DIR"
  exit 0
fi

log() { echo "device: $*" >&2; }

"$BIN" devices

# 1. The same tokens from the CPU and the GPU (greedy, and sampled with a
# seed), on a synthetic SmolLM2-shaped model per type.
echo
echo "| check | type | tokens equal |"
echo "| --- | --- | --- |"
for ty in Q4_0 Q8_0; do
  f="$WORK/smollm2-$ty.gguf"
  "$BIN" synth --shape smollm2 --type "$ty" --vocab-from "$DIR/vocab.gguf" -o "$f" >/dev/null
  for mode in "--temp 0" "--temp 1 --seed 7"; do
    toks() {
      # shellcheck disable=SC2086
      "$BIN" run -m "$f" -p "The quick brown fox" -n 32 $mode --ngl "$1" --json 2>/dev/null |
        sed 's/.*"tokens":\[\([0-9,]*\)\].*/\1/'
    }
    a=$(toks 0)
    b=$(toks all)
    same=$(paste -d' ' <(tr ',' '\n' <<<"$a") <(tr ',' '\n' <<<"$b") |
      awk '$1 != $2 { exit } { n++ } END { print n + 0 }')
    echo "| CPU vs GPU, $mode | $ty | $same / 32 |"
  done
done

# 2. Kernels at the models' shapes.
echo
"$BIN" bench kernels --gpu-only --model-shapes --iters "$KERNEL_ITERS" --matmul-cols "$MATMUL_COLS"

# 3. Whole models at realistic size.
echo
echo "| model | weights GiB | pp$N_PROMPT tok/s | tg$N_GEN tok/s | weight GB/s | share of $BW_GBS GB/s |"
echo "| --- | --- | --- | --- | --- | --- |"
for shape in $SHAPES; do
  for ty in $TYPES; do
    f="$WORK/$shape-$ty.gguf"
    log "writing $shape $ty"
    "$BIN" synth --shape "$shape" --type "$ty" -o "$f" >/dev/null
    bytes=$(stat -c %s "$f")
    out=$("$BIN" bench model -m "$f" --ngl all -p "$N_PROMPT" -n "$N_GEN" -r 2 2>/dev/null)
    pp=$(awk -F'|' -v t="pp$N_PROMPT" '$5 ~ t { split($6, v, " "); print v[1] }' <<<"$out")
    tg=$(awk -F'|' -v t="tg$N_GEN" '$5 ~ t { split($6, v, " "); print v[1] }' <<<"$out")
    awk -v s="$shape $ty" -v b="$bytes" -v pp="$pp" -v tg="$tg" -v bw="$BW_GBS" 'BEGIN {
      gbs = b * tg / 1e9
      share = bw == "" ? "-" : sprintf("%.0f%%", 100 * gbs / bw)
      printf "| %s | %.2f | %s | %s | %.1f | %s |\n", s, b / 2^30, pp, tg, gbs, share
    }'
    rm -f "$f"
  done
done

# 4. A mixture of experts, its experts on the GPU and routed there: a step
# reads nothing back (before, one wait for the device per block and step).
echo
echo "| mixture | pp$N_PROMPT tok/s | tg$N_GEN tok/s | tg$N_GEN ×8 tok/s | submits per token |"
echo "| --- | --- | --- | --- | --- |"
for shape in $MOE_SHAPES; do
  f="$WORK/$shape.gguf"
  log "writing $shape Q4_0"
  "$BIN" synth --shape "$shape" --type Q4_0 -o "$f" >/dev/null
  out=$("$BIN" bench model -m "$f" --ngl all --n-cpu-moe 0 --npl 8 -p "$N_PROMPT" -n "$N_GEN" -r 2 2>&1)
  cell() {
    awk -F'|' -v t="$1" '{ c = $5; gsub(/^ +| +$/, "", c) } c == t { split($6, v, " "); print v[1] }' <<<"$out"
  }
  subs=$(sed -n 's/.* \([0-9.]*\) submits.*/\1/p' <<<"$out" | head -1)
  echo "| $shape Q4_0 | $(cell "pp$N_PROMPT") | $(cell "tg$N_GEN") | $(cell "tg$N_GEN ×8") | $subs |"
  rm -f "$f"
done

# 5. The server under load on the synthetic SmolLM2-shaped model: one client
# and eight, greedy (each step reads back picks) and sampled at 0.8 with the
# default chain (each step reads back top-40 candidates selected on the GPU).
SERVE_REQUESTS=${SERVE_REQUESTS:-4}
SERVE_TOKENS=${SERVE_TOKENS:-64}
f="$WORK/serve-smollm2.gguf"
"$BIN" synth --shape smollm2 --type Q4_0 --vocab-from "$DIR/vocab.gguf" -o "$f" >/dev/null
echo
echo "| server, smollm2 Q4_0 | 1 client tok/s | 8 clients tok/s | ratio |"
echo "| --- | --- | --- | --- |"
for temp in 0 0.8; do
  out=$("$BIN" bench serve -m "$f" --ngl all --clients 1,8 \
    --requests-per-client "$SERVE_REQUESTS" --max-tokens "$SERVE_TOKENS" --temperature "$temp" 2>/dev/null)
  rate() { awk -F'|' -v c="$1" '{ x = $2; gsub(/ /, "", x) } x == c { gsub(/ /, "", $7); print $7 }' <<<"$out"; }
  one=$(rate 1)
  eight=$(rate 8)
  awk -v t="$temp" -v a="$one" -v b="$eight" 'BEGIN {
    printf "| temperature %s | %s | %s | %s |\n", t, a, b, (a > 0 ? sprintf("%.2f×", b / a) : "-")
  }'
done
