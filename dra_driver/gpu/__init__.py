"""GPU layer: what the node's GPUs are, and how a claim on them is prepared.

Knows nothing about gRPC or the kubelet wire; it plugs into the generic plugin
layer through :class:`dra_driver.plugin.backend.DeviceBackend`
(:class:`driver.GpuDriver`). Data flows one way: NVML -> inventory -> published
devices; claim -> plan -> prepared devices -> CDI spec + checkpoint.

The claim flow sits here, where a reader enters: :mod:`.driver` (what the plugin
layer sees), :mod:`.preparing`, :mod:`.unpreparing`, :mod:`.statefile` (the
checkpoint on disk), :mod:`.cdiedits` (a claim's CDI spec), :mod:`.planning`
(claim -> plan, and the strategy protocols), :mod:`.checkpoint` (the format),
:mod:`.config` (opaque configs). The rooms, each importing only downward
(``[tool.importlinter]`` in ``pyproject.toml``; ``docs/architecture.md``)::

    driver
    preparing | monitoring/       health, taints, usage, metrics
    unpreparing
    statefile | cdiedits
    sharing/                      strategies, MPS daemons, MIG instances, shares, slots
    planning
    checkpoint | config
    hardware/ | cdi/              NVML and the inventory | CDI spec and hooks
    host/                         host paths, files and node locks
"""
