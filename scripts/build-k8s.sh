#!/usr/bin/env bash
# Build the real Kubernetes control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager) and etcd from the Go modules pinned in tests/go,
# once, into a cache outside the work tree keyed by version and go.sum.
# Prints the bin directory on stdout. Fails loudly; never skips.
#
# Version: v1.37.1, the newest patch the Go module proxy serves (v1.37.2 is
# tagged, but proxy.golang.org answers its .zip with 403 "This module version is
# not available", checked 2026-11-22). etcd v3.7.0 is what k8s v1.37's go.mod
# requires. Measured cold: 7m16s wall, 648 CPU-s, 2.7 GB peak RSS on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$here/tests/go"
k8s_version="$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")"
[ -n "$k8s_version" ] || { echo "cannot read k8s.io/kubernetes version from $mod/go.mod" >&2; exit 1; }
key="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/cmd/etcd/main.go" | sha256sum | cut -c1-12)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
bindir="$cache/k8s-$k8s_version-$key/bin"
bins=(kube-apiserver kube-scheduler kube-controller-manager etcd)

complete() {
  local b
  for b in "${bins[@]}"; do [ -x "$bindir/$b" ] || return 1; done
}
if complete; then
  echo "$bindir"
  exit 0
fi

# One build at a time per key: a second caller (another test run) waits and
# then reuses the result instead of racing on the same directory.
mkdir -p "$cache"
exec 9>"$cache/k8s-$k8s_version-$key.lock"
flock 9
if complete; then
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
echo "building Kubernetes $k8s_version control plane and etcd into $bindir (cold: ~7 min on 2 cores)" >&2
(
  cd "$mod"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ld" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    ./cmd/etcd
) >&2
for b in "${bins[@]}"; do [ -x "$tmp/$b" ] || { echo "build did not produce $b" >&2; exit 1; }; done
for b in kube-apiserver kube-scheduler kube-controller-manager; do
  got="$("$tmp/$b" --version)"
  [ "$got" = "Kubernetes $k8s_version" ] || { echo "$b --version says '$got', want 'Kubernetes $k8s_version'" >&2; exit 1; }
done
echo "built: Kubernetes $k8s_version, $("$tmp/etcd" --version | head -1)" >&2
rm -rf "$bindir"; mv "$tmp" "$bindir"
echo "$bindir"
