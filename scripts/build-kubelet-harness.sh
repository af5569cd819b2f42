#!/usr/bin/env bash
# Build the kubelet harness (tests/go/kubelet: the kubelet's own plugin
# manager and DRA manager driven over stdin/stdout) once, into a cache outside
# the work tree keyed by its go.mod, go.sum and sources.
# Prints the path of the binary on stdout. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/kubelet"
key="$(cd "$mod" && cat go.mod go.sum $(ls ./*.go | sort) | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/kubelet-harness-$key"
bin="$dir/kubelet-harness"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "building the kubelet harness into $dir (cold: ~10 min on 2 cores, warm after the control plane: ~1-2 min)" >&2
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/kubelet-harness" .) >&2
[ -x "$tmp/kubelet-harness" ] || { echo "build did not produce kubelet-harness" >&2; exit 1; }
rm -rf "$dir"; mv "$tmp" "$dir"
echo "$bin"
