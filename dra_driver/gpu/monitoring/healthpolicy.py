"""How NVML facts become faults and taints: the Xid classes and the health policy.

Apart from :mod:`dra_driver.gpu.monitoring.health` so the daemon's flag parsing can build a
:class:`HealthPolicy` without importing the GPU layer (inventory, naming, the
book), which the daemon loads only after its sockets are served.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type only: every command's flag parser imports this module
    from dra_driver.plugin.resources import TaintEffect

DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
"""Application-caused Xids (graphics/compute exceptions, page faults, preemptive
cleanup, video decoder exceptions, context-switch timeouts): the GPU is fine."""
INFORMATIONAL_XIDS: frozenset[int] = frozenset({63, 64, 92, 94})
"""Row remapping / page retirement recorded, high single-bit ECC rate, contained ECC
error: worth seeing on the device, no reason to avoid it (NVML's recovery action
says when one of them does need a reset)."""
FATAL_XIDS: frozenset[int] = frozenset({48, 79, 95, 119, 120, 140})
"""Double-bit ECC, fallen off the bus, uncontained ECC, GSP RPC timeout / error,
unrecovered ECC: the GPU cannot run work until it is reset."""


class Severity(enum.IntEnum):
    INFO = 1
    UNUSABLE = 2
    FATAL = 3


@dataclass(frozen=True)
class HealthPolicy:
    """How NVML facts become faults and taints, and when they clear."""

    ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS
    """Xids that are logged and counted but leave the device healthy."""
    healthy_period_s: float = 60.0
    """Seconds a GPU must pass every check, with no recovery action pending, before its
    faults clear."""
    check_interval_s: float = 5.0
    """Seconds between periodic checks (what events cannot report: off the bus,
    recovery action pending, ECC counters)."""
    fatal_effect: TaintEffect = "NoSchedule"
    """Effect of fatal faults: ``NoExecute`` (opt-in) also evicts running pods."""

    def xid_severity(self, xid: int) -> Severity | None:
        """None for ignored Xids; every Xid not known to be harmless makes the GPU unusable."""
        if xid in self.ignored_xids:
            return None
        if xid in INFORMATIONAL_XIDS:
            return Severity.INFO
        return Severity.FATAL if xid in FATAL_XIDS else Severity.UNUSABLE

    def effect(self, severity: Severity) -> TaintEffect:
        if severity is Severity.INFO:
            return "None"
        return self.fatal_effect if severity is Severity.FATAL else "NoSchedule"
