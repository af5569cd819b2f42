"""The GPU driver as the plugin layer sees it: discovery + devices + claim preparation.

:class:`GpuDriver` implements :class:`~dra_driver.plugin.backend.DeviceBackend`.
It holds the current :class:`Inventory` (replaced whole by :meth:`refresh`,
never mutated), derives the published pool from it, and delegates claims to
:class:`~dra_driver.gpu.preparing.ClaimPreparer`, which reads the same
inventory through a callable so a prepare always sees the latest discovery.

Re-discovery (:meth:`refresh`) keeps the previous inventory when discovery as
a whole fails (NVML briefly unavailable must not empty the pool); a GPU that
is gone simply is not in the new inventory, so it leaves the pool with the
next slice generation. It also reports device health to the kubelet: devices
published with the degraded taint (``--taint-degraded``) are Unhealthy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from dra_driver.gpu.devices import build_pool
from dra_driver.gpu.discovery import DiscoveryError
from dra_driver.gpu.hostpaths import HostPaths
from dra_driver.gpu.inventory import Inventory
from dra_driver.gpu.preparing import ClaimPreparer
from dra_driver.gpu.sharing import GpuTools
from dra_driver.plugin.backend import DeviceHealth, PreparedDevice
from dra_driver.plugin.claims import Claim, ClaimRef
from dra_driver.plugin.resources import Pool


class GpuDriver:
    """DeviceBackend for NVIDIA GPUs; thread-safe."""

    supports_parallel_claims = ClaimPreparer.supports_parallel_claims

    def __init__(
        self,
        *,
        driver_name: str,
        discover: Callable[[], Inventory],
        host: HostPaths,
        cdi_dir: Path,
        state_dir: Path,
        tools: GpuTools,
        logger: logging.Logger,
        pool_name: str,
        taint_degraded: bool = False,
        runtime_host: HostPaths | None = None,
    ) -> None:
        """Runs the first discovery now, so a node without a usable driver fails at start.

        ``runtime_host`` is how the container runtime names the host's paths when
        this process sees them elsewhere (see :class:`~dra_driver.gpu.cdiedits.EditsBuilder`).
        """
        self._driver_name = driver_name
        self._pool_name = pool_name
        self._discover = discover
        self._log = logger
        self._taint_degraded = taint_degraded
        self._lock = threading.Lock()
        self._inventory = discover()
        self._pool = self._build(self._inventory)
        self._preparer = ClaimPreparer(
            driver_name=driver_name,
            inventory=self.inventory,
            host=host,
            cdi_dir=cdi_dir,
            state_dir=state_dir,
            logger=logger,
            tools=tools,
            runtime_host=runtime_host,
        )

    def _build(self, inventory: Inventory) -> Pool:
        return build_pool(
            inventory, driver_name=self._driver_name, taint_degraded=self._taint_degraded
        )

    def inventory(self) -> Inventory:
        with self._lock:
            return self._inventory

    def refresh(self) -> bool:
        """Discover again; True when the published pool changed (caller republishes)."""
        try:
            inventory = self._discover()
        except DiscoveryError as exc:
            self._log.error("re-discovery failed; keeping the previous inventory: %s", exc)
            return False
        pool = self._build(inventory)
        with self._lock:
            changed = pool != self._pool
            self._inventory, self._pool = inventory, pool
        if changed:
            self._log.info("pool changed", extra={"devices": len(pool.devices)})
        return changed

    # ---- DeviceBackend ----
    def pool(self) -> Pool:
        with self._lock:
            return self._pool

    def prepare(self, claim: Claim) -> list[PreparedDevice]:
        return self._preparer.prepare(claim)

    def unprepare(self, claim: ClaimRef) -> None:
        self._preparer.unprepare(claim)

    def prepared_claims(self) -> list[ClaimRef]:
        return self._preparer.prepared_claims()

    # ---- HealthReporter ----
    def device_health(self) -> list[DeviceHealth]:
        """Published devices are Healthy unless published tainted as degraded."""
        return [
            DeviceHealth(
                self._pool_name,
                d.name,
                "Unhealthy" if d.taints else "Healthy",
                "GPU degraded: an NVML query failed" if d.taints else "",
            )
            for d in self.pool().devices
        ]
