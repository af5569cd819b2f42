"""NVML access and the inventory: what the node has, and what it publishes.

NVML (:mod:`.nvml`, :mod:`.nvmlerrors`, :mod:`.nvmlmonitor`) -> :mod:`.discovery`
(plus sysfs, :mod:`.topology`) -> :mod:`.inventory` (plain data) -> published
devices (:mod:`.devices`, named by :mod:`.naming`; dynamic MIG's partitions in
:mod:`.partitions`; the ``--consumable-gpus``/``--mps-slots`` values in
:mod:`.consumable`).

May import: :mod:`dra_driver.gpu.host` and the plugin layer's plain types
(:mod:`dra_driver.plugin.resources`). Never CDI, claims, sharing or health.
"""
