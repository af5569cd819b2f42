"""Replay of Alibaba's GPU-sharing trace through the real kube-scheduler (docs/trace-replay.md)."""
