#!/usr/bin/env bash
# Build the Go reference kubelet plugin (sigs.k8s.io/dra-example-driver,
# cmd/dra-example-kubeletplugin) that bench/reference_plugin.py measures side by
# side with ours, from the module pinned in tests/go/exampledriver, once, into a
# cache outside the work tree keyed by go.mod/go.sum. Benchmark tooling only:
# no test needs it (so it is not a scripts/build-*.sh, which `make test` runs). Prints the binary's path. Fails loudly; never skips.
#
# The proxy serves exact versions but refuses the version list, so the version
# is pinned (v0.4.0, which requires k8s.io/* v0.36.x): about 5 min cold on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/bench/go/referenceplugin"
version="$(awk '{for (i = 1; i < NF; i++) if ($i == "sigs.k8s.io/dra-example-driver") {print $(i+1); exit}}' "$mod/go.mod")"
[ -n "$version" ] || { echo "cannot read sigs.k8s.io/dra-example-driver version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/dra-example-driver-$version-$key"
bin="$dir/dra-example-kubeletplugin"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "building dra-example-kubeletplugin $version into $dir (cold: ~5 min on 2 cores)" >&2
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/" \
  sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin) >&2
[ -x "$tmp/dra-example-kubeletplugin" ] || { echo "build did not produce dra-example-kubeletplugin" >&2; exit 1; }
rm -rf "$dir"; mv "$tmp" "$dir"
echo "$bin"
