"""Generic kubelet DRA plugin layer: knows Kubernetes and the kubelet, not GPUs.

Drivers implement :class:`dra_driver.plugin.backend.DeviceBackend` and describe
their devices with :mod:`dra_driver.plugin.resources`; this package registers
with the kubelet, serves the DRA gRPC services, fetches and filters claims
(:mod:`dra_driver.plugin.claims`) and keeps ResourceSlices in line.
"""
