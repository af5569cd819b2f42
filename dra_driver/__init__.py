"""Kubernetes DRA kubelet plugin for NVIDIA GPUs.

Two layers: :mod:`dra_driver.plugin` is a generic kubelet-plugin toolkit
(registration, gRPC, ResourceSlice publishing) with no GPU knowledge;
:mod:`dra_driver.gpu` discovers GPUs and prepares them, with no gRPC knowledge.
:mod:`dra_driver.cli` is the one place where both are wired together.
"""

__version__ = "0.1.0"
