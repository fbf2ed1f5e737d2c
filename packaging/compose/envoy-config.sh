#!/usr/bin/env bash
# Regenerates packaging/compose/envoy.yaml: `atenet-router envoy-config` with
# the router's flags from compose.yaml (the `- --flag[=value]` lines of the
# router service), like `make k8s-envoy-config` does for Kubernetes.
#
#   packaging/compose/envoy-config.sh [BIN_DIR]   (default: $ATENET_BIN_DIR, else
#                                                  /var/tmp/atenet-router-target/release)
#   packaging/compose/envoy-config.sh --flags     prints the flags it reads, one a line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The router service's block: from `  router:` to the next two-space key.
mapfile -t flags < <(sed -n '/^  router:$/,/^  [a-z]/p' "$here/compose.yaml" \
  | sed -n 's/^ *- \(--[a-z-]*\(=.*\)\{0,1\}\)$/\1/p')
if [ "${1:-}" = "--flags" ]; then
  printf '%s\n' "${flags[@]}"
  exit 0
fi
bin=${1:-${ATENET_BIN_DIR:-/var/tmp/atenet-router-target/release}}
"$bin/atenet-router" envoy-config "${flags[@]}" > "$here/envoy.yaml.tmp"
mv "$here/envoy.yaml.tmp" "$here/envoy.yaml"
echo "wrote $here/envoy.yaml"
