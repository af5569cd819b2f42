#!/bin/sh
# Entry point of the plugin image: make the host driver's NVML library
# loadable, and nothing else from the host. pynvml loads "libnvidia-ml.so.1"
# by name; putting the whole host library dir (mounted at /driver-root) on
# LD_LIBRARY_PATH would also pull the host's libc into our Python. So only a
# symlink to libnvidia-ml.so.1 goes into a private dir on the search path.
set -eu
root="${DRIVER_ROOT:-/driver-root}"
libdir="${TMPDIR:-/tmp}/dra-driver-nvml"
mkdir -p "$libdir"
for dir in usr/lib/x86_64-linux-gnu usr/lib64 lib/x86_64-linux-gnu lib64 usr/lib/aarch64-linux-gnu usr/lib; do
  if [ -e "$root/$dir/libnvidia-ml.so.1" ]; then
    ln -sfn "$root/$dir/libnvidia-ml.so.1" "$libdir/libnvidia-ml.so.1"
    break
  fi
done
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec dra-driver "$@"
