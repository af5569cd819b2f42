"""Flags of the kubelet plugin for health, metrics, usage and claim status (each with its
``DRA_*`` variable, :mod:`dra_driver.envflags`), and what they turn into: the health
policy (:mod:`dra_driver.gpu.monitoring.healthpolicy`, which imports none of the rest of the GPU
layer: the daemon loads that only after its sockets are served).

Kept apart from the command's other flags so the daemon's composition root stays short.
"""

from __future__ import annotations

import argparse

from dra_driver import envflags
from dra_driver.gpu.monitoring.healthpolicy import DEFAULT_IGNORED_XIDS, HealthPolicy

_DEFAULT_IGNORED = ",".join(map(str, sorted(DEFAULT_IGNORED_XIDS)))


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in envflags.TRUE_WORDS:
        return True
    if value in envflags.FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean: use true or false")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _positive(text: str) -> float:
    value = _seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def _xids(text: str) -> frozenset[int]:
    try:
        values = frozenset(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of Xid numbers, e.g. {_DEFAULT_IGNORED}"
        ) from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: Xids are positive numbers")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("health, metrics and claim status")
    group.add_argument(
        "--health-monitor", type=boolean, default="true",
        help="watch GPUs through NVML events and checks and taint faulty devices "
        "(default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--ignored-xids", type=_xids, default=_DEFAULT_IGNORED,
        help="Xids that are application errors, logged but never tainted "
        "(default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--healthy-period", type=_seconds, default="60",
        help="seconds a GPU must answer every check, with no NVML recovery action pending, "
        "before its taints clear (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--health-check-interval", type=_positive, default="5",
        help="seconds between checks of what NVML events cannot report: GPU off the bus, "
        "recovery action, ECC counters (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--fatal-taint-effect", choices=("NoSchedule", "NoExecute"),
        default="NoSchedule",
        help="taint effect of fatal faults (Xid 48/79/95/..., double-bit ECC, lost GPU, reset "
        "pending); NoExecute also evicts running pods (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--numa-attribute-form", choices=("scalar", "list"),
        default="scalar",
        help="form of resource.kubernetes.io/numaNode: scalar (int) or list (ints; needs the "
        "DRAListTypeAttributes gate) (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--metrics", type=boolean, default="true",
        help="serve Prometheus /metrics on the health port (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--usage-interval", type=_seconds, default="10",
        help="seconds between per-claim GPU usage samples for /metrics; 0 = off "
        "(default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--claim-status", type=boolean, default="true",
        help="write our devices into ResourceClaim status.devices (KEP-4817) "
        "(default %(default)s)",
    )  # fmt: skip


def health_policy(args: argparse.Namespace) -> HealthPolicy | None:
    """None when health monitoring is off."""
    if not args.health_monitor:
        return None
    return HealthPolicy(
        ignored_xids=args.ignored_xids,
        healthy_period_s=args.healthy_period,
        check_interval_s=args.health_check_interval,
        fatal_effect=args.fatal_taint_effect,
    )
