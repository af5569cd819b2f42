"""The kube-scheduler's DRA allocation rules in Python, for ``simulate`` and ``explain``.

Tooling only: the kubelet plugin never allocates, and an import contract keeps
this package out of the daemon.
"""
