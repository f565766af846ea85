#!/usr/bin/env bash
# Runs Lamina's main job on the default model (SmolLM2-135M-Instruct Q4_1),
# fetching it first. Extra arguments go to `lamina inspect`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(bash scripts/fetch-models.sh | tail -n 1)
cargo run --release --locked -p lamina -- inspect "$dir/SmolLM2-135M-Instruct.Q4_1.gguf" "$@"
