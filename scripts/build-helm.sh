#!/usr/bin/env bash
# Build the Helm CLI used by the chart tests from the Go module pinned in
# tests/go/helm (helm.sh/helm/v4), once, into a cache outside the work tree
# keyed by go.mod/go.sum. Prints the binary's path. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/helm"
version="$(awk '{for (i = 1; i < NF; i++) if ($i == "helm.sh/helm/v4") {print $(i+1); exit}}' "$mod/go.mod")"
[ -n "$version" ] || { echo "cannot read helm.sh/helm/v4 version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/helm-$version-$key"
bin="$dir/helm"

if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "building helm $version into $dir (cold: ~5-10 min on 2 cores)" >&2
ld="-s -w -X helm.sh/helm/v4/internal/version.version=$version"
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/helm" helm.sh/helm/v4/cmd/helm) >&2
"$tmp/helm" version >&2
rm -rf "$dir"; mv "$tmp" "$dir"
echo "$bin"
