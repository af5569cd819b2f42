"""Health and usage: watching the GPUs while they run.

:mod:`.monitor` watches NVML and keeps the :mod:`.health` book (policy in
:mod:`.healthpolicy`), which becomes taints and claim status (:mod:`.devicestatus`);
:mod:`.migholders` ties dynamic MIG faults to the claim holding the instance;
:mod:`.usage` maps NVML process data to pods; :mod:`.metrics` holds the GPU
layer's Prometheus metrics.

May import: sharing (dynamic MIG's records), planning and below. The claim pipeline
never imports it; only :mod:`dra_driver.gpu.driver` wires it in.
"""
