#!/usr/bin/env bash
# Build the Kueue controller manager from the Go module pinned in tests/go/kueue
# (sigs.k8s.io/kueue), once, into a cache outside the work tree keyed by
# go.mod/go.sum. Next to the binary go Kueue's own CRDs and webhook
# configurations, taken from that same module version (nothing is committed):
#
#   bin/kueue      the manager (controllers and webhooks)
#   crds/*.yaml    config/components/crd/bases of the module
#   webhook.yaml   config/components/webhook/manifests.yaml of the module
#
# Prints the directory. Fails loudly; never skips. Cold: see docs/testing.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go/kueue"
version="$(awk '$1 == "require" && $2 == "sigs.k8s.io/kueue" {print $3; exit} $1 == "sigs.k8s.io/kueue" {print $2; exit}' "$mod/go.mod")"
[ -n "$version" ] || { echo "cannot read sigs.k8s.io/kueue version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/kueue-$version-$key"

complete() { [ -x "$dir/bin/kueue" ] && [ -s "$dir/webhook.yaml" ] && ls "$dir"/crds/*.yaml >/dev/null 2>&1; }
if complete; then
  echo "$dir"
  exit 0
fi

# One build per key at a time: a concurrent caller waits, then reuses it.
mkdir -p "$cache"
exec 9>"$dir.lock"
flock 9
if complete; then
  echo "$dir"
  exit 0
fi

tmp="$dir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp/bin" "$tmp/crds"
trap 'rm -rf "$tmp"' EXIT
echo "building kueue $version into $dir" >&2
(
  cd "$mod"
  ld="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
  CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/bin/kueue" sigs.k8s.io/kueue/cmd/kueue
  src="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  [ -d "$src/config/components/crd/bases" ] || { echo "no CRDs in $src" >&2; exit 1; }
  cp "$src"/config/components/crd/bases/*.yaml "$tmp/crds/"
  cp "$src/config/components/webhook/manifests.yaml" "$tmp/webhook.yaml"
  chmod -R u+w "$tmp"
) >&2
"$tmp/bin/kueue" --help >/dev/null 2>&1 || { echo "the built kueue does not start (--help)" >&2; exit 1; }
rm -rf "$dir"; mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
