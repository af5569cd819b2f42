#!/usr/bin/env bash
# Build the real Kubernetes control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager) and etcd from the Go modules pinned in tests/go,
# once, into a cache outside the work tree keyed by version and go.sum.
# Prints the bin directory on stdout. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go"
k8s_version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")"
[ -n "$k8s_version" ] || { echo "cannot read k8s.io/kubernetes version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/cmd/etcd/main.go" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bindir="$cache/k8s-$k8s_version-$key/bin"
bins=(kube-apiserver kube-scheduler kube-controller-manager etcd)

complete=1
for b in "${bins[@]}"; do [ -x "$bindir/$b" ] || complete=0; done
if [ "$complete" = 1 ]; then
  echo "$bindir"
  exit 0
fi

minor="${k8s_version#v1.}"; minor="${minor%%.*}"
ld=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

tmp="$bindir.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
echo "building Kubernetes $k8s_version control plane and etcd into $bindir (cold: ~15-25 min on 2 cores)" >&2
(
  cd "$mod"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ld" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    ./cmd/etcd
) >&2
for b in "${bins[@]}"; do [ -x "$tmp/$b" ] || { echo "build did not produce $b" >&2; exit 1; }; done
"$tmp/kube-apiserver" --version >&2
rm -rf "$bindir"; mv "$tmp" "$bindir"
echo "$bindir"
