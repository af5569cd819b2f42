"""kube-scheduler scoring extender: GPU fragmentation from a watched view (docs/trace-replay.md)."""
