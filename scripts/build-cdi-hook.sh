#!/usr/bin/env bash
# Build NVIDIA's nvidia-cdi-hook from the toolkit's Go module pinned in cdi/hook
# (never our code: the hooks our CDI specs name are NVIDIA's own), once, into a
# cache outside the work tree keyed by the module's go.mod/go.sum. cgo is on, as
# the toolkit needs (the binary links only libc). Prints the binary path on
# stdout; the plugin image ships it and the tests put its directory on PATH.
# Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/cdi/hook"
pkg="github.com/NVIDIA/nvidia-container-toolkit"
version="$(awk -v m="$pkg" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$mod/go.mod")"
[ -n "$version" ] || { echo "cannot read the $pkg version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bin="$cache/cdi-hook-$version-$key/nvidia-cdi-hook"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
command -v cc >/dev/null || { echo "no C compiler: nvidia-cdi-hook needs cgo (Debian: apt-get install gcc libc6-dev)" >&2; exit 1; }
mkdir -p "$(dirname "$bin")"
exec 9>"$(dirname "$bin").lock"
flock 9
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
tmp="$bin.tmp.$$"
trap 'rm -f "$tmp"' EXIT
# `--version` names the release (the toolkit's Makefile sets the same variable).
( cd "$mod" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -trimpath \
    -ldflags "-s -w -X $pkg/internal/info.version=${version#v}" \
    -o "$tmp" "$pkg/cmd/nvidia-cdi-hook" ) >&2
"$tmp" --version >/dev/null
mv "$tmp" "$bin"
echo "$bin"
