"""Node scoring by GPU fragmentation, shared by ``dra-driver plan`` and the scheduler
extender (pure functions over plain dataclasses; no Kubernetes objects)."""
