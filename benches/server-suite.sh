#!/usr/bin/env bash
# llama.cpp's own server test suite (pytest, tools/server/tests in the
# llama.cpp that the `llama-cpp-python` sdist on PyPI vendors) against
# `lamina serve`, on SmolLM2, and the passed / failed counts.
#
# The suite starts LLAMA_SERVER_BIN_PATH with llama-server's flags and a
# model from Hugging Face; benches/llama-server-shim.py stands in for that
# binary: it points the model flags at the local SmolLM2 file and passes the
# rest to `lamina serve` (see its header for the flags Lamina refuses).
#
#   benches/server-suite.sh                       # the suite, less its slow tests
#   benches/server-suite.sh unit/test_completion.py -k n_probs
#   LAMINA_BIN=target/debug/lamina benches/server-suite.sh
#   SLOW_TESTS=1 benches/server-suite.sh          # the slow ones too
#   PEER=llama-server benches/server-suite.sh     # llama.cpp's llama-server instead
#   PORT=18081 REPORT_TAG=b benches/server-suite.sh # beside another run
#   benches/server-suite-compare.py               # what one passes and the other not
#
# PEER=llama-server runs the same suite, through the same shim and on the
# same model file, against llama.cpp's own llama-server built from the same
# sdist (LLAMA_SERVER_BIN, by default the CPU build benches/peer.sh makes,
# to which this adds the llama-server target when it is missing): only the
# model mapping applies, no flag is dropped. Each server's report, failure
# list and JUnit XML go to their own files in the cache (report.txt,
# failures.txt, junit.xml for Lamina; report-llama-server.txt, ... for the
# peer), which benches/server-suite-compare.py compares.
#
# Needs Python 3 with venv and pip, and network for pip (the sdist and the
# suite's requirements, once: both are cached). Not part of scripts/test.sh:
# it takes many minutes, and most of the failures it counts are features
# Lamina does not have yet (issue 10 lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
SHA256=${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}
CACHE=${LAMINA_SUITE_CACHE:-$HOME/.cache/lamina/server-suite-$VERSION}
MODELS=${LAMINA_MODELS:-$HOME/.cache/lamina/models}
MODEL=${LAMINA_SUITE_MODEL:-$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf}
# Off llama-server's 8080, so a server already running there is left alone.
PORT=${PORT:-18080}

log() { echo "server-suite: $*" >&2; }

[ -f "$MODEL" ] || { log "$MODEL is missing: run scripts/fetch-models.sh"; exit 1; }

# The suite and the chat templates its tests name by relative path
# (../../../models/templates), in llama.cpp's own layout.
tree="$CACHE/llama.cpp"
tests="$tree/tools/server/tests"
if [ ! -f "$tests/utils.py" ] || [ ! -d "$tree/models/templates" ]; then
  mkdir -p "$CACHE"
  tarball="$CACHE/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -f "$tarball" ]; then
    log "downloading llama-cpp-python $VERSION (sdist) with pip"
    # --no-binary for this one package only: `:all:` would also build pip's
    # build dependencies (cmake among them) from source, for many minutes,
    # just to read the sdist's metadata.
    python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$VERSION" -d "$CACHE/pip"
    mv "$CACHE/pip/llama_cpp_python-$VERSION.tar.gz" "$tarball"
  fi
  echo "$SHA256  $tarball" | sha256sum -c --quiet -
  tmp="$CACHE/extract"
  rm -rf "$tmp" "$tree"
  mkdir -p "$tmp"
  top="llama_cpp_python-$VERSION/vendor/llama.cpp"
  tar xzf "$tarball" -C "$tmp" "$top/tools/server/tests" "$top/models/templates"
  mv "$tmp/$top" "$tree"
  rm -rf "$tmp"
fi

venv="$CACHE/venv"
if [ ! -x "$venv/bin/pytest" ]; then
  log "installing pytest and the suite's requirements into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -r "$tests/requirements.txt"
fi

PEER=${PEER:-}
case "$PEER" in
"")
  suffix=
  LAMINA_BIN=${LAMINA_BIN:-$ROOT/target/release/lamina}
  if [ ! -x "$LAMINA_BIN" ]; then
    log "building $LAMINA_BIN"
    cargo build --release -p lamina
  fi
  LAMINA_BIN=$(realpath "$LAMINA_BIN")
  server=$LAMINA_BIN
  export LAMINA_BIN
  unset PEER_BIN
  ;;
llama-server)
  suffix=-llama-server
  # benches/peer.sh's CPU build of the same sdist: its source and build tree.
  peer_cache=${LLAMA_CPP_CACHE:-$HOME/.cache/lamina/llama.cpp-$VERSION}
  LLAMA_SERVER_BIN=${LLAMA_SERVER_BIN:-$peer_cache/build-cpu/bin/llama-server}
  if [ ! -x "$LLAMA_SERVER_BIN" ]; then
    if [ ! -f "$peer_cache/src/CMakeLists.txt" ] || [ ! -d "$peer_cache/build-cpu" ]; then
      log "no $LLAMA_SERVER_BIN: run SKIP_GPU=1 benches/peer.sh once (it builds llama.cpp), or set LLAMA_SERVER_BIN"
      exit 1
    fi
    log "building llama-server in $peer_cache/build-cpu"
    cmake -S "$peer_cache/src" -B "$peer_cache/build-cpu" -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_BUILD_TOOLS=ON >"$peer_cache/build-server.log" 2>&1
    cmake --build "$peer_cache/build-cpu" --target llama-server -j "${JOBS:-$(nproc)}" \
      >>"$peer_cache/build-server.log" 2>&1 ||
      { tail -30 "$peer_cache/build-server.log"; exit 1; }
  fi
  server=$(realpath "$LLAMA_SERVER_BIN")
  export PEER_BIN=$server
  ;;
*)
  log "PEER=$PEER: only PEER=llama-server is known"
  exit 1
  ;;
esac

# REPORT_TAG keeps the files of runs side by side apart (report-TAG.txt, ...).
suffix=$suffix${REPORT_TAG:+-$REPORT_TAG}
report="$CACHE/report$suffix.txt"
failures="$CACHE/failures$suffix.txt"
junit="$CACHE/junit$suffix.xml"
log "running the suite against $server (log: $report)"
cd "$tests"
marks=()
[ "${SLOW_TESTS:-0}" = 1 ] || marks=(-m "not slow")
set +e
LLAMA_SERVER_BIN_PATH="$ROOT/benches/llama-server-shim.py" \
  LAMINA_SUITE_MODEL="$(realpath "$MODEL")" PORT="$PORT" \
  "$venv/bin/pytest" -q -rfE -p no:cacheprovider --junitxml="$junit" \
  "${marks[@]}" "${@:-unit}" >"$report" 2>&1
set -e
grep -E '^(FAILED|ERROR) ' "$report" >"$failures" || true
summary=$(tail -n 1 "$report")
echo "$summary"
passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | cut -d' ' -f1)
failed=$(grep -oE '[0-9]+ failed' <<<"$summary" | cut -d' ' -f1)
errors=$(grep -oE '[0-9]+ errors?' <<<"$summary" | cut -d' ' -f1)
echo "passed ${passed:-0}, failed ${failed:-0}, errors ${errors:-0} (failures listed in $failures)"
