"""ComputeDomains: multi-node NVLink (IMEX) channels, in the API NVIDIA's driver defined.

``names`` is the contract between the controller (cluster side), the
``compute-domain.nvidia.com`` kubelet plugin and the per-node IMEX daemon (node side).
"""
