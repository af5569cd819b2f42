#!/usr/bin/env bash
# Host set-up that `make test`, `make demo` and CI run first: the Debian
# packages the container tiers need, installed with apt when missing, and the
# toolchains checked. Warm runs only check (no apt). Says exactly what is
# missing and how to get it when it cannot install it.
#
#   runc            OCI runtime for containerd's shim and the runc tier
#   busybox-static  the test containers' image (scripts/build-node.sh packs it)
#   iproute2        `ip`: the real node's network namespace and bridge
#   util-linux      unshare, nsenter, mount (present on every Debian)
#   gcc, libc6-dev  cgo for NVIDIA's nvidia-cdi-hook (scripts/build-cdi-hook.sh) and the
#                   tests' cudaprobe (tests/images.py)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
packages=(runc busybox-static iproute2 util-linux gcc libc6-dev)
say() { printf '[setup-host] %s\n' "$*" >&2; }

missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    say "missing ${missing[*]} and no apt-get here: install them with your package manager"
    exit 1
  fi
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo="sudo"
    else
      say "missing Debian packages ${missing[*]}; run as root: apt-get install ${missing[*]}"
      exit 1
    fi
  fi
  say "apt-get install ${missing[*]}"
  if ! { $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2; then
    say "could not install ${missing[*]} with apt-get (no access to Debian's package registry?)"
    exit 1
  fi
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  say "need Python >= 3.11 as \$PYTHON or python3 (found: $("$python" --version 2>&1 || echo none))"
  exit 1
fi
if ! command -v go >/dev/null; then
  say "need the Go toolchain >= $(awk '$1=="go"{print $2}' tests/go/go.mod) on PATH (https://go.dev/dl/)"
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  say "warning: not root; the real-node and runc tiers (and the demo) need root"
fi
say "ok: ${packages[*]} installed; $("$python" --version), $(go version | cut -d' ' -f3)"
