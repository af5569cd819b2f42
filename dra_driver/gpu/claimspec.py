"""A claim's CDI spec: each device's edits from the inventory (or from the device a
strategy created for it), plus its units' additions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from dra_driver.gpu import cdi
from dra_driver.gpu.cdiedits import EditsBuilder, parse_majors, read_proc_devices
from dra_driver.gpu.cdihook import TOOLKIT_HOOK
from dra_driver.gpu.hostpaths import HostPaths
from dra_driver.gpu.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.strategies.base import Materializes, SharingStrategy, Target, Unit


class ClaimSpecs:
    def __init__(
        self,
        *,
        kind: str,
        host: HostPaths,
        runtime_host: HostPaths | None = None,
        hook: Path = TOOLKIT_HOOK,
    ) -> None:
        """``runtime_host``: how the container runtime names host paths, when this
        process sees them elsewhere (see :class:`~dra_driver.gpu.cdiedits.EditsBuilder`);
        ``hook``: the ``nvidia-cdi-hook`` the specs' hooks run (:mod:`~dra_driver.gpu.cdihook`)."""
        self.kind = kind
        self._host = host
        self._runtime_host = runtime_host
        self._hook = hook
        self._cache: tuple[tuple[str, bytes], EditsBuilder] | None = None

    def _builder(self, inventory: Inventory) -> EditsBuilder:
        """Rebuilt when the driver version or ``/proc/devices`` changes (a module that
        loads late, like nvidia-uvm on first CUDA use, adds a major)."""
        key = (inventory.driver_version, read_proc_devices(self._host))
        if self._cache is None or self._cache[0] != key:
            builder = EditsBuilder(
                host=self._host,
                driver_version=inventory.driver_version,
                hook=self._hook,
                runtime_host=self._runtime_host,
                majors=parse_majors(key[1]),
            )
            self._cache = (key, builder)
        return self._cache[1]

    def build(
        self,
        claim_uid: str,
        targets: Sequence[Target],
        units: Sequence[Unit],
        inventory: Inventory,
        strategy: Callable[[str], SharingStrategy],
    ) -> cdi.Spec:
        """One CDI device ``<claim uid>-<device name>`` per allocated device."""
        builder = self._builder(inventory)
        devices: dict[str, cdi.CdiDevice] = {}
        for target in targets:
            if target.name in devices:
                continue
            mine = [u for u in units if target.name in u.devices]
            obj = target.device
            for unit in mine:
                maker = strategy(unit.strategy)
                if isinstance(maker, Materializes):
                    obj = maker.concrete(unit, target)
            if not isinstance(obj, Gpu | MigInstance):
                raise cdi.CdiError(f"device {target.name}: no strategy created it")
            edits = builder.gpu(obj) if isinstance(obj, Gpu) else builder.mig(obj)
            for unit in mine:
                edits = strategy(unit.strategy).edits(unit, target.name, edits)
            devices[target.name] = cdi.CdiDevice(name=f"{claim_uid}-{target.name}", edits=edits)
        return cdi.Spec(kind=self.kind, devices=tuple(devices.values()), edits=builder.common())
