#!/usr/bin/env bash
# Regenerates packaging/compose/fleet/envoy.yaml, the bootstrap both Envoys
# of the fleet stack run: `atenet-router envoy-config` with the routers'
# flags from compose.yaml (the `- --flag[=value]` lines of its x-router
# block) and then envoy-config.flags (--routers), like `make
# k8s-fleet-envoy-config` does for Kubernetes.
#
#   packaging/compose/fleet/envoy-config.sh [BIN_DIR]   (default: $ATENET_BIN_DIR, else
#                                                        /var/tmp/atenet-router-target/release)
#   packaging/compose/fleet/envoy-config.sh --flags     prints the flags it passes, one a line
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The x-router block: from `x-router: &router` to the next top-level key.
mapfile -t flags < <(sed -n '/^x-router:/,/^[a-z]/p' "$here/compose.yaml" \
  | sed -n 's/^ *- \(--[a-z-]*\(=.*\)\{0,1\}\)$/\1/p'; grep -v '^ *$' "$here/envoy-config.flags")
if [ "${1:-}" = "--flags" ]; then
  printf '%s\n' "${flags[@]}"
  exit 0
fi
bin=${1:-${ATENET_BIN_DIR:-/var/tmp/atenet-router-target/release}}
"$bin/atenet-router" envoy-config "${flags[@]}" > "$here/envoy.yaml.tmp"
mv "$here/envoy.yaml.tmp" "$here/envoy.yaml"
echo "wrote $here/envoy.yaml"
