#!/usr/bin/env bash
# Build the CDI harness (tests/go/cdi: the real tags.cncf.io/container-device-interface
# library driven the way containerd drives it) once, into a cache outside the work
# tree keyed by the module's content. Prints the binary path on stdout. Fails loudly.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/cdi"
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod"/*.go | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bin="$cache/cdi-$key/cdi-harness"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$(dirname "$bin")"
tmp="$bin.tmp.$$"
( cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp" . ) >&2
mv "$tmp" "$bin"
echo "$bin"
