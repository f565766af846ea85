#!/usr/bin/env bash
# Runs Lamina's main job on the default model (SmolLM2-135M-Instruct Q4_1),
# fetching it first: the OpenAI-compatible server on http://127.0.0.1:8080
# (LAMINA_PORT and the other LAMINA_* variables change it). Extra arguments
# go to `lamina serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(bash scripts/fetch-models.sh | tail -n 1)
cargo run --release --locked -p lamina -- serve -m "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
