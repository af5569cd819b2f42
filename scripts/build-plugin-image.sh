#!/usr/bin/env bash
# Build the plugin's container image without Docker or a registry
# (dra_driver/demo/pluginimage.py: the Dockerfile's contents over a Python 3.11
# base made from Debian packages), once per input hash, into the cache outside
# the work tree. Prints "ARCHIVE REF" on stdout. Fails loudly; never skips.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || { echo "no virtualenv python at $python: run 'make venv' first" >&2; exit 1; }
cache="${DRA_DRIVER_CACHE:-$HOME/.cache/dra-driver}"
mkdir -p "$cache"
# One build at a time: a concurrent caller waits, then finds the result cached.
exec 9>"$cache/plugin-image.lock"
flock 9
cd "$here"
"$python" -m dra_driver.demo.pluginimage "$here" "$cache"
