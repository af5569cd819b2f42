#!/usr/bin/env bash
# Build Prometheus and promtool from the Go module pinned in tests/go/prometheus
# (github.com/prometheus/prometheus), once, into a cache outside the work tree
# keyed by go.mod/go.sum. Only the two commands, without any service-discovery
# plugin (tag remove_all_sd: the tests scrape static loopback targets) and
# without the web UI's assets (the HTTP API is all the tests use). Prints the
# bin directory. Fails loudly; never skips. Cold: see docs/testing.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/prometheus"
version="$(awk '$1 == "require" && $2 == "github.com/prometheus/prometheus" {print $3; exit} $1 == "github.com/prometheus/prometheus" {print $2; exit}' "$mod/go.mod")"
[ -n "$version" ] || { echo "cannot read github.com/prometheus/prometheus version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bindir="$cache/prometheus-$version-$key/bin"
bins=(prometheus promtool)

complete() {
  local b
  for b in "${bins[@]}"; do [ -x "$bindir/$b" ] || return 1; done
}
if complete; then
  echo "$bindir"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/prometheus-$version-$key.lock"
flock 9
if complete; then
  echo "$bindir"
  exit 0
fi

tmp="$bindir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
echo "building prometheus and promtool $version into $bindir" >&2
ld="-s -w -X github.com/prometheus/common/version.Version=$version"
(
  cd "$mod"
  CGO_ENABLED=0 go build -trimpath -tags remove_all_sd -ldflags "$ld" -o "$tmp/" \
    github.com/prometheus/prometheus/cmd/prometheus \
    github.com/prometheus/prometheus/cmd/promtool
) >&2
for b in "${bins[@]}"; do "$tmp/$b" --version >/dev/null || { echo "the built $b does not run" >&2; exit 1; }; done
rm -rf "$bindir"; mkdir -p "$(dirname "$bindir")"; mv "$tmp" "$bindir"
trap - EXIT
echo "$bindir"
