#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer test corpus: the vocabulary-only
# `ggml-vocab-*.gguf` files of its models/ folder with their `.gguf.inp`
# inputs and `.gguf.out` expected ids, from the `llama-cpp-python` sdist on
# PyPI (which vendors llama.cpp), verified by sha256. Second runs reuse the
# cache and only check it.
#
#   LAMINA_VOCABS        corpus directory (default: ~/.cache/lamina/vocabs)
#   LAMINA_SUITE_CACHE   where benches/server-suite.sh keeps the same sdist;
#                        a tarball there is used instead of downloading
#
# Prints the directory on the last line of stdout.
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TARBALL=llama_cpp_python-$VERSION.tar.gz

dir="${LAMINA_VOCABS:-$HOME/.cache/lamina/vocabs}"
cache="$HOME/.cache/lamina/sdist"
suite_cache="${LAMINA_SUITE_CACHE:-$HOME/.cache/lamina/server-suite-$VERSION}"
# Written last, so a directory with it holds a complete extraction.
stamp="$dir/.llama-cpp-python-$VERSION"

log() { echo "fetch-vocabs: $*" >&2; }

verify() { # file
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  if [ "$got" != "$SHA256" ]; then
    log "$1: sha256 $got, expected $SHA256"
    return 1
  fi
}

if [ -f "$stamp" ] && compgen -G "$dir/ggml-vocab-*.gguf.inp" >/dev/null; then
  echo "$dir"
  exit 0
fi

tarball=""
for candidate in "$cache/$TARBALL" "$suite_cache/$TARBALL"; do
  if [ -f "$candidate" ] && verify "$candidate" 2>/dev/null; then
    tarball=$candidate
    break
  fi
done

if [ -z "$tarball" ]; then
  log "downloading llama-cpp-python $VERSION (sdist) with pip"
  mkdir -p "$cache"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # --no-binary for this one package only: `:all:` would also build pip's
  # build dependencies from source just to read the sdist's metadata.
  python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$work" >&2
  verify "$work/$TARBALL"
  mv "$work/$TARBALL" "$cache/$TARBALL"
  tarball="$cache/$TARBALL"
fi

mkdir -p "$dir"
top="llama_cpp_python-$VERSION/vendor/llama.cpp/models"
tar xzf "$tarball" -C "$dir" --strip-components=4 --wildcards \
  "$top/ggml-vocab-*.gguf" "$top/ggml-vocab-*.gguf.inp" "$top/ggml-vocab-*.gguf.out"
n=$(find "$dir" -maxdepth 1 -name 'ggml-vocab-*.gguf' | wc -l)
if [ "$n" -eq 0 ]; then
  log "no ggml-vocab-*.gguf in $tarball"
  exit 1
fi
log "$n vocabularies in $dir"
touch "$stamp"
echo "$dir"
