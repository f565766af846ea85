#!/usr/bin/env bash
# Installs what the test suite needs on a Debian 12 machine: a software Vulkan
# device (lavapipe) for the GPU tests, and the Python packages used to build
# reference fixtures. Idempotent; prints what it does and why.
#
# Lavapipe comes from bookworm-backports when it can (Mesa 25: ~3x faster
# compute than bookworm's Mesa 22.3, Vulkan 1.4, and the memory-budget
# extension), and an older Mesa already installed is upgraded to it. The
# backports source is derived from the machine's own Debian source entry with
# the suite changed, so no package host is written here.
set -euo pipefail

# The Mesa the suite is written for (bookworm-backports'). Bookworm's own
# 22.3 runs, but its lavapipe has no VK_EXT_memory_budget and is slower.
MESA_WANT=25

have_vulkan_icd() {
  ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 \
    || ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1
}

# The installed mesa-vulkan-drivers version; empty when not installed.
mesa_version() {
  { dpkg-query -W -f='${db:Status-Abbrev}${Version}' mesa-vulkan-drivers 2>/dev/null || true; } \
    | sed -n 's/^ii *//p'
}

mesa_is_old() { # version
  [ -n "$1" ] && dpkg --compare-versions "$1" lt "$MESA_WANT~"
}

# What a Mesa older than MESA_WANT leaves out, said where it cannot be fixed.
warn_old_mesa() { # version
  cat >&2 <<EOF
install-deps: mesa-vulkan-drivers $1 is older than the Mesa $MESA_WANT the suite is written for.
  Its lavapipe may lack VK_EXT_memory_budget (22.3 does): \`lamina devices\` then
  says free memory is "not reported by the driver", and -ngl auto fits to a
  fixed guess instead of the free memory. Its compute is about 3x slower, so
  the GPU tests take that much longer.
EOF
}

install_lavapipe() {
  local had now
  had=$(mesa_version)
  if have_vulkan_icd && ldconfig -p | grep -q libvulkan.so.1 && ! mesa_is_old "$had"; then
    echo "install-deps: a Vulkan driver is already installed${had:+ (mesa-vulkan-drivers $had)}"
    return
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    if mesa_is_old "$had"; then
      warn_old_mesa "$had"
      echo "  To upgrade, run scripts/install-deps.sh as root on Debian 12." >&2
    else
      echo "install-deps: no Vulkan driver found. Install Mesa's lavapipe as root:" >&2
      echo "  apt-get install mesa-vulkan-drivers libvulkan1" >&2
    fi
    return
  fi
  local src=/etc/apt/sources.list.d/debian.sources
  local bpo=/etc/apt/sources.list.d/lamina-backports.sources
  local target=()
  if [ -f "$src" ] && grep -q '^Suites: bookworm' "$src" && [ ! -f "$bpo" ]; then
    # First stanza of the machine's Debian entry, suite swapped for backports.
    awk 'BEGIN{RS="";ORS="\n\n"} NR==1' "$src" \
      | sed -E 's/^Suites:.*/Suites: bookworm-backports/' >"$bpo"
  fi
  [ -f "$bpo" ] && target=(-t bookworm-backports)
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  if ! apt-get install -y -qq "${target[@]}" mesa-vulkan-drivers libvulkan1 >/dev/null; then
    echo "install-deps: backports Mesa failed, falling back to the release one" >&2
    apt-get install -y -qq mesa-vulkan-drivers libvulkan1 >/dev/null
  fi
  now=$(mesa_version)
  if [ -z "$had" ]; then
    echo "install-deps: installed mesa-vulkan-drivers $now"
  elif [ "$had" != "$now" ]; then
    echo "install-deps: upgraded mesa-vulkan-drivers $had to $now (the suite is written for Mesa $MESA_WANT)"
  else
    echo "install-deps: apt offers no newer mesa-vulkan-drivers than $now"
  fi
  if mesa_is_old "$now"; then
    warn_old_mesa "$now"
  fi
}

install_python() {
  # gguf: llama.cpp's own reader and dequantizers, the independent reference.
  if ! python3 -c 'import gguf, numpy' 2>/dev/null; then
    python3 -m pip install -q 'gguf>=0.17' numpy
  fi
  # openai: the official client, driven against `lamina serve` in the tests.
  if ! python3 -c 'import openai' 2>/dev/null; then
    python3 -m pip install -q openai
  fi
  # anthropic: the official client, driven against the Messages API.
  if ! python3 -c 'import anthropic' 2>/dev/null; then
    python3 -m pip install -q anthropic
  fi
  # ollama: the official client, driven against the Ollama API.
  if ! python3 -c 'import ollama' 2>/dev/null; then
    python3 -m pip install -q ollama
  fi
  # huggingface_hub: its cache is the one `lamina pull` shares; the tests
  # check that a file it downloaded is found without a download.
  if ! python3 -c 'import huggingface_hub' 2>/dev/null; then
    python3 -m pip install -q huggingface_hub
  fi
  # selenium drives Chromium for the chat page test; kubernetes-validate and
  # checkov check the manifests and the Dockerfile under deploy/.
  if ! python3 -c 'import selenium' 2>/dev/null; then
    python3 -m pip install -q selenium
  fi
  if ! python3 -c 'import kubernetes_validate' 2>/dev/null; then
    python3 -m pip install -q kubernetes-validate
  fi
  if ! command -v checkov >/dev/null; then
    python3 -m pip install -q checkov
  fi
}

# Debian packages the suite's checks run: Chromium and its driver for the
# chat page test, shellcheck for the scripts, systemd-analyze for the unit.
install_tools() {
  local want=() cmd pkg
  for cmd in chromium:chromium chromedriver:chromium-driver \
    shellcheck:shellcheck systemd-analyze:systemd; do
    pkg=${cmd#*:}
    command -v "${cmd%%:*}" >/dev/null || want+=("$pkg")
  done
  [ ${#want[@]} -eq 0 ] && return
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "install-deps: missing ${want[*]}; install them as root with apt-get" >&2
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${want[@]}" >/dev/null
  echo "install-deps: installed ${want[*]}"
}

install_lavapipe
install_tools
install_python
