#!/usr/bin/env bash
# Build the real-node tier's components from the Go modules pinned in tests/go,
# once, into a cache outside the work tree keyed by their go.mod/go.sum and
# sources. Prints the node directory on stdout:
#
#   bin/   kubelet, cri-reset (tests/go/node: k8s.io/kubernetes + our CRI client)
#          containerd, containerd-shim-runc-v2, ctr (tests/go/containerd: its own
#          module, so containerd's dependencies never move Kubernetes')
#   cni/   bridge, host-local (tests/go/cni)
#   images/pause.tar, busybox.tar: OCI image archives built locally (no registry,
#          no Docker): our static pause binary, and the host's static busybox
#
# runc is Debian's (scripts/setup-host.sh installs it; `make` runs that).
# Fails loudly; never skips. Measured: see docs/testing.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
go_dir="$here/tests/go"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  python="$here/.venv/bin/python"
  [ -x "$python" ] || python="python3"
fi
busybox="$(command -v busybox || true)"
[ -n "$busybox" ] || { echo "busybox is not installed: run scripts/setup-host.sh (Debian: busybox-static)" >&2; exit 1; }
if ! "$busybox" --help >/dev/null 2>&1 || ldd "$busybox" >/dev/null 2>&1; then
  echo "$busybox is not a static busybox (Debian: apt-get install busybox-static)" >&2
  exit 1
fi

version_of() {  # version_of MODULE_DIR MODULE_PATH
  awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1/go.mod"
}
k8s_version="$(version_of "$go_dir/node" k8s.io/kubernetes)"
containerd_version="$(version_of "$go_dir/containerd" github.com/containerd/containerd/v2)"
cni_version="$(version_of "$go_dir/cni" github.com/containernetworking/plugins)"
for v in k8s_version containerd_version cni_version; do
  [ -n "${!v}" ] || { echo "cannot read $v from tests/go/*/go.mod" >&2; exit 1; }
done

key="$(
  {
    cd "$go_dir"
    cat node/go.mod node/go.sum node/cmd/*/*.go containerd/go.mod containerd/go.sum \
      cni/go.mod cni/go.sum "$here/dra_driver/devcluster/ociimage.py"
    "$busybox" --help 2>&1 | sed -n 1p
  } | sha256sum | cut -c1-12
)"
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
dir="$cache/node-$k8s_version-containerd-$containerd_version-$key"
wanted=(bin/kubelet bin/cri-reset bin/containerd bin/containerd-shim-runc-v2 bin/ctr
        cni/bridge cni/host-local images/pause.tar images/busybox.tar)

complete() {
  local f
  for f in "${wanted[@]}"; do [ -s "$dir/$f" ] || return 1; done
}
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
rm -rf "$tmp"
mkdir -p "$tmp/bin" "$tmp/cni" "$tmp/images"
trap 'rm -rf "$tmp"' EXIT
step() { printf '[build-node %s] %s\n' "$(date +%T)" "$*" >&2; }

minor="${k8s_version#v1.}"; minor="${minor%%.*}"
ld=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
step "kubelet $k8s_version, cri-reset, pause (warm after the control plane: ~1-2 min)"
(
  cd "$go_dir/node"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ld" -o "$tmp/bin/" \
    k8s.io/kubernetes/cmd/kubelet ./cmd/cri-reset ./cmd/pause
) >&2

step "containerd $containerd_version, shim, ctr (cold: ~5 min on 2 cores)"
# cgo off drops only the btrfs snapshotter; overlayfs is what CRI uses here.
(
  cd "$go_dir/containerd"
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
      -o "$tmp/bin/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd"
  done
) >&2

step "CNI plugins $cni_version: bridge, host-local"
(
  cd "$go_dir/cni"
  for p in main/bridge ipam/host-local; do
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/cni/${p#*/}" \
      "github.com/containernetworking/plugins/plugins/$p"
  done
) >&2

step "OCI image archives: pause, busybox"
mv "$tmp/bin/pause" "$tmp/images/pause"
PYTHONPATH="$here" "$python" -m dra_driver.devcluster.ociimage \
  --out "$tmp/images/pause.tar" --ref localhost/dra-node/pause:1 --entrypoint /pause \
  --file "$tmp/images/pause=/pause" >&2
rm "$tmp/images/pause"
links=()
for applet in sh ls cat env grep sort head tail stat test echo sleep id tr wc mount true; do
  links+=(--link "/bin/$applet=busybox")
done
PYTHONPATH="$here" "$python" -m dra_driver.devcluster.ociimage \
  --out "$tmp/images/busybox.tar" --ref localhost/dra-node/busybox:1 --entrypoint /bin/sh \
  --file "$busybox=/bin/busybox" "${links[@]}" >&2

"$tmp/bin/kubelet" --version >&2
"$tmp/bin/containerd" --version >&2
for f in "${wanted[@]}"; do [ -s "$tmp/$f" ] || { echo "build did not produce $f" >&2; exit 1; }; done
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
