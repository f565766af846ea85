#!/usr/bin/env bash
# Lamina beside llama.cpp on this machine, in one run, alternating.
#
# Builds llama.cpp's `llama-bench` (CPU and Vulkan backends) from the source
# that the `llama-cpp-python` sdist on PyPI vendors, into a cache, then for
# each real model runs, REPS times in turn:
#   llama-bench (Vulkan) -ngl 99   and   lamina bench model --ngl all
#   llama-bench (CPU)    -ngl 0    and   lamina bench model --ngl 0
# and prints tokens/s for both and the ratio. Both see the same Vulkan device
# (GGML_VK_VISIBLE_DEVICES / the first wgpu adapter: lavapipe on a machine
# without a GPU). Run on a quiet machine: llama.cpp's spinning threads lose
# most of their speed when anything else runs.
#
#   benches/peer.sh                 # both models, pp128 / tg32, 2 rounds
#   REPS=3 N_GEN=64 benches/peer.sh
#   SKIP_GPU=1 benches/peer.sh      # CPU rows only
#   SKIP_CPU=1 PEER_MODELS=SmolLM2-135M-Instruct.Q4_1.gguf benches/peer.sh
#                                   # one model's Vulkan rows only
#   BUILD_ONLY=1 benches/peer.sh    # fill the cache and stop
#
# Needs cmake, a C++ compiler, glslc and the Vulkan headers (apt: cmake g++
# glslc libvulkan-dev spirv-headers; installed when run as root), and a release build of
# Lamina (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
SHA256=${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}
CACHE=${LAMINA_PEER_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
REPS=${REPS:-2}
N_PROMPT=${N_PROMPT:-128}
N_GEN=${N_GEN:-32}
THREADS=${THREADS:-$(nproc)}
JOBS=${JOBS:-$(nproc)}
PEER_TIMEOUT=${PEER_TIMEOUT:-300}

log() { echo "peer: $*" >&2; }

install_tools() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v g++ >/dev/null || missing+=(g++)
  if [ -z "${SKIP_GPU:-}" ]; then
    command -v glslc >/dev/null || missing+=(glslc)
    [ -f /usr/include/vulkan/vulkan.hpp ] || missing+=(libvulkan-dev)
    # ggml-vulkan's CMake asks for SPIRV-Headers' package config.
    [ -d /usr/share/cmake/SPIRV-Headers ] || missing+=(spirv-headers)
  fi
  [ ${#missing[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ]; then
    log "missing ${missing[*]}: install them (apt-get install ${missing[*]})"
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The sdist, by PyPI's JSON API (its file URLs may be relative to it).
fetch_source() {
  local src="$CACHE/src"
  [ -f "$src/CMakeLists.txt" ] && return
  mkdir -p "$CACHE"
  local tarball="$CACHE/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$tarball" ]; then
    # pip first: it goes through whatever index or mirror pip is configured
    # for; PyPI's JSON API is the fallback where pip is missing. --no-binary
    # for this package only: `:all:` would also build pip's own build
    # dependencies (cmake among them) from source before saving the sdist.
    if python3 -m pip --version >/dev/null 2>&1; then
      log "downloading llama-cpp-python $VERSION (sdist) with pip"
      python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$VERSION" -d "$CACHE/pip" >/dev/null 2>&1 || true
      [ -f "$CACHE/pip/llama_cpp_python-$VERSION.tar.gz" ] &&
        mv "$CACHE/pip/llama_cpp_python-$VERSION.tar.gz" "$tarball"
    fi
  fi
  if [ ! -f "$tarball" ]; then
    local api="https://pypi.org/pypi/llama-cpp-python/$VERSION/json"
    local url
    url=$(curl -fsSL "$api" | python3 -c '
import json, sys, urllib.parse
api = sys.argv[1]
for u in json.load(sys.stdin)["urls"]:
    if u["packagetype"] == "sdist":
        print(urllib.parse.urljoin(api, u["url"]))
        break
' "$api")
    log "downloading $url"
    curl -fsSL -o "$tarball.part" "$url"
    mv "$tarball.part" "$tarball"
  fi
  echo "$SHA256  $tarball" | sha256sum -c --quiet -
  local tmp="$CACHE/extract"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  tar xzf "$tarball" -C "$tmp"
  mv "$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp" "$src"
  rm -rf "$tmp"
  # Debian 12's Vulkan headers (1.3.239) predate VK_EXT_layer_settings. The
  # block that uses it only turns on the validation layer's best-practice
  # checks (when that layer is installed); without it the instance is the
  # same.
  python3 - "$src/ggml/src/ggml-vulkan/ggml-vulkan.cpp" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
start = s.index("    VkBool32 enable_best_practice = layer_settings;")
end = s.index("&layer_setting_info);", start) + len("&layer_setting_info);")
s = s[:start] + ("    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, "
                 "&app_info, layers, extensions);") + s[end:]
s = s.replace('extensions.push_back("VK_EXT_layer_settings");', "")
open(p, "w").write(s)
PY
}

build() { # name, cmake flags...
  local name=$1
  shift
  local dir="$CACHE/build-$name"
  [ -x "$dir/bin/llama-bench" ] && return
  log "building llama-bench ($name) with $JOBS jobs"
  cmake -S "$CACHE/src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DGGML_NATIVE=ON "$@" >"$dir.log" 2>&1 || { tail -30 "$dir.log"; exit 1; }
  cmake --build "$dir" --target llama-bench -j "$JOBS" >>"$dir.log" 2>&1 ||
    { tail -30 "$dir.log"; exit 1; }
}

# llama.cpp's AMX kernels die with SIGILL on some machines that list AMX
# (seen on a virtual machine: tinygemm_kernel_amx at tilezero, though a
# small program there configures and zeroes tiles fine). A -march=native
# CPU build that cannot run one step on SmolLM2 is rebuilt without AMX.
cpu_runs() {
  "$CACHE/build-cpu/bin/llama-bench" -m "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" \
    -ngl 0 -t 1 -p 8 -n 1 -r 1 >/dev/null 2>&1
}

# tokens/s of one llama-bench run: "pp tg" ("nan nan" if it failed or ran
# past PEER_TIMEOUT seconds: llama.cpp's Vulkan backend on lavapipe can take
# many minutes per Gemma 3 run).
llama_run() { # build, model, ngl
  local bin="$CACHE/build-$1/bin/llama-bench"
  GGML_VK_VISIBLE_DEVICES=0 timeout "$PEER_TIMEOUT" "$bin" -m "$2" -ngl "$3" -t "$THREADS" \
    -p "$N_PROMPT" -n "$N_GEN" -r 1 -o json 2>/dev/null | python3 -c '
import json, sys
try:
    rows = json.load(sys.stdin)
except ValueError:
    print("nan nan")
    sys.exit()
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
print(pp[0], tg[0])'
}

lamina_run() { # model, ngl
  ./target/release/lamina bench model -m "$1" --ngl "$2" -t "$THREADS" -p "$N_PROMPT" \
    -n "$N_GEN" -r 1 --json 2>/dev/null | python3 -c '
import json, sys
r = json.loads(sys.stdin.read().strip().splitlines()[-1])
print(r["pp"]["tokens_per_second"], r["tg"]["tokens_per_second"])'
}

install_tools
fetch_source
[ -f "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" ] || bash scripts/fetch-models.sh >/dev/null
build cpu -DGGML_VULKAN=OFF
if ! cpu_runs; then
  log "the CPU build fails on this machine (AMX?): rebuilding it without AMX"
  rm -rf "$CACHE/build-cpu"
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  build cpu -DGGML_VULKAN=OFF "-DCMAKE_C_FLAGS=$no_amx" "-DCMAKE_CXX_FLAGS=$no_amx"
fi
[ -z "${SKIP_GPU:-}" ] && build vulkan -DGGML_VULKAN=ON
[ -n "${BUILD_ONLY:-}" ] && exit 0
[ -x target/release/lamina ] || cargo build --release -p lamina

results=$(mktemp)
placements=()
[ -z "${SKIP_GPU:-}" ] && placements+=("vulkan 99 all")
[ -z "${SKIP_CPU:-}" ] && placements+=("cpu 0 0")
for model in ${PEER_MODELS:-SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf}; do
  for p in "${placements[@]}"; do
    read -r backend ngl lngl <<<"$p"
    for rep in $(seq "$REPS"); do
      log "$model $backend round $rep"
      echo "$model $backend llama.cpp $(llama_run "$backend" "$MODELS/$model" "$ngl")" >>"$results"
      echo "$model $backend lamina $(lamina_run "$MODELS/$model" "$lngl")" >>"$results"
    done
  done
done

python3 - "$results" "$N_PROMPT" "$N_GEN" "$REPS" <<'PY'
import collections, statistics, sys
path, n_prompt, n_gen, reps = sys.argv[1:]
runs = collections.defaultdict(list)
for line in open(path):
    model, backend, who, pp, tg = line.split()
    runs[(model, backend, who)].append((float(pp), float(tg)))
print(f"tokens/s, mean of {reps} alternating runs each (pp{n_prompt}, tg{n_gen})")
print("| model | placement | Lamina pp | llama.cpp pp | ratio | Lamina tg | llama.cpp tg | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for (model, backend, who) in sorted({k for k in runs if k[2] == "lamina"}):
    me = runs[(model, backend, "lamina")]
    peer = runs[(model, backend, "llama.cpp")]
    mean = lambda v: statistics.mean(v) if v else float("nan")
    fin = lambda v: [x for x in v if x == x]  # runs that finished
    mp, mt = mean([r[0] for r in me]), mean([r[1] for r in me])
    pp, pt = mean(fin([r[0] for r in peer])), mean(fin([r[1] for r in peer]))
    f = lambda x: "timed out" if x != x else f"{x:.2f}"
    ratio = lambda a, b: "-" if a != a or b != b else f"{a / b:.2f}x"
    where = "GPU, all layers (Vulkan)" if backend == "vulkan" else "CPU"
    print(f"| {model} | {where} | {f(mp)} | {f(pp)} | {ratio(mp, pp)} | {f(mt)} | {f(pt)} | {ratio(mt, pt)} |")
PY
rm -f "$results"
