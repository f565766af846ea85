#!/usr/bin/env bash
# Checks deploy/ and the shell scripts with the tools their ecosystems use:
# the Kubernetes manifests against the API schemas (kubernetes-validate) and
# a policy scanner (checkov, which also reads the Dockerfile), the systemd
# unit with systemd-analyze, every shell script with shellcheck. Any finding
# fails the suite. The tools are installed by scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

kubernetes-validate --strict deploy/kubernetes/*.yaml

# The GPU folder holds a strategic-merge patch over the Deployment, not a
# whole resource: scanned alone it lacks every field the base sets (probes,
# limits, security context), so the scanner reads the base only.
checkov -d deploy --skip-path deploy/kubernetes/gpu --compact --quiet 2>/dev/null

# systemd-analyze also checks that ExecStart's binary exists; the unit names
# where an install puts it, which a test machine lacks, so the check runs on
# a copy that points at a binary every machine has. Every directive and
# sandboxing option is still parsed.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's#/usr/local/bin/lamina#/bin/true#' deploy/systemd/lamina.service >"$tmp/lamina.service"
out=$(systemd-analyze verify "$tmp/lamina.service" 2>&1 || true)
if [ -n "$out" ]; then
  echo "$out" >&2
  echo "check-deploy: systemd-analyze found problems in deploy/systemd/lamina.service" >&2
  exit 1
fi

shellcheck scripts/*.sh benches/*.sh .ci/run
echo "check-deploy: manifests, Dockerfile, unit and shell scripts pass"
