"""Generated gRPC stubs; regenerate with scripts/gen-proto.sh."""
