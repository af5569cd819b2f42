"""GPU layer: NVML discovery, inventory, devices, CDI, sharing, checkpoint.

Knows nothing about gRPC or the kubelet wire; it plugs into the generic
plugin layer through :class:`dra_driver.plugin.backend.DeviceBackend`.
Data flows one way: NVML -> :mod:`inventory` -> published devices; claim ->
prepared devices -> CDI spec + checkpoint.
"""
