#!/usr/bin/env bash
# Generate the Python gRPC stubs for our own .proto files in proto/.
#
# The protos are compiled as if they lived at dra_driver/plugin/_proto/ so the
# generated *_pb2_grpc.py files import their messages by absolute package path
# (grpcio-tools has no relative-import mode) and every file gets a unique name
# in the protobuf descriptor pool (health v1 and DRA v1 never clash).
#
# Usage: scripts/gen-proto.sh [OUTPUT_DIR]   (default: dra_driver/plugin/_proto)
# The staleness test calls it with a temp dir and compares the result.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$here/dra_driver/plugin/_proto}"
python="${PYTHON:-$here/.venv/bin/python}"
pkgpath="dra_driver/plugin/_proto"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/$pkgpath" "$work/out"
cp "$here"/proto/*.proto "$work/src/$pkgpath/"

(
  cd "$work/src"
  "$python" -m grpc_tools.protoc -I . \
    --python_out="$work/out" --pyi_out="$work/out" --grpc_python_out="$work/out" \
    "$pkgpath"/*.proto
)

mkdir -p "$out"
rm -f "$out"/*_pb2.py "$out"/*_pb2.pyi "$out"/*_pb2_grpc.py
cp "$work/out/$pkgpath"/* "$out/"
[ -f "$out/__init__.py" ] || printf '"""Generated gRPC stubs; regenerate with scripts/gen-proto.sh."""\n' >"$out/__init__.py"
