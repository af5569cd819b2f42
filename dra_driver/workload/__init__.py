"""A GPU workload trace (Alibaba's v2023 columns) and how each sharing mode publishes its
GPUs and writes its claims: shared by the trace replay (``bench.trace_replay``, the real
scheduler) and ``dra-driver plan`` (our allocator). Tooling: the daemon never imports it.
"""
