#!/usr/bin/env bash
# Build the CEL oracle (tests/go/celoracle: the scheduler's own CEL
# selector code over stdin/stdout) once, into a cache outside
# the work tree keyed by its go.mod, go.sum and sources.
# Prints the path of the binary on stdout. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/celoracle"
key="$(cd "$mod" && cat go.mod go.sum $(ls ./*.go | sort) | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/celoracle-$key"
bin="$dir/celoracle"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "building the CEL oracle into $dir (~1 min warm)" >&2
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/celoracle" .) >&2
[ -x "$tmp/celoracle" ] || { echo "build did not produce celoracle" >&2; exit 1; }
rm -rf "$dir"; mv "$tmp" "$dir"
echo "$bin"
