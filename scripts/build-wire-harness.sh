#!/usr/bin/env bash
# Build the kubelet-wire harness (tests/go/wire, its own Go module using the
# official k8s.io/kubelet API clients) once into a cache keyed by its sources.
# Prints the binary path on stdout. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/wire"
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod"/*.go | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bin="$cache/wire-$key/wire"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
tmp="$bin.tmp.$$"
mkdir -p "$(dirname "$bin")"
echo "building kubelet-wire harness into $bin" >&2
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -o "$tmp" .) >&2
mv "$tmp" "$bin"
echo "$bin"
