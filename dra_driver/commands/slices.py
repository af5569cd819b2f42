"""``dra-driver slices``: the exact ResourceSlices the kubelet plugin would publish.

Discovery (real or ``--emulate``) -> :func:`dra_driver.gpu.hardware.devices.build_pool`
-> the plugin layer's own validation, splitting and conversion
(:mod:`dra_driver.plugin.slices`), so the output is byte-for-byte what the
publisher sends, except ``ownerReferences``, which needs the Node's UID
(``--node-uid``; omitted without it).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from dra_driver.commands.discover import add_host_arguments, gpu_host
from dra_driver.settings import host_settings

if TYPE_CHECKING:
    from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
    from dra_driver.gpu.hardware.devices import NumaAttributeForm
    from dra_driver.gpu.hardware.inventory import Inventory
    from dra_driver.gpu.hardware.partitions import MigMode, PlacementAttributes


logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-name", required=True, help="node the slices belong to; also the pool name"
    )
    parser.add_argument(
        "--driver-name", default="gpu.nvidia.com", help="DRA driver name (default %(default)s)"
    )
    parser.add_argument(
        "--node-uid", default=None, help="the Node's UID for ownerReferences (omitted if unset)"
    )
    parser.add_argument(
        "--generation", type=int, default=1, help="pool generation to print (default 1)"
    )
    parser.add_argument(
        "--taint-degraded",
        action="store_true",
        help="publish degraded GPUs with a NoSchedule taint instead of leaving them out",
    )
    parser.add_argument(
        "--numa-attribute-form",
        choices=("scalar", "list"),
        default="scalar",
        help="form of resource.kubernetes.io/numaNode: scalar (int) or list (ints; needs the "
        "DRAListTypeAttributes gate) (default %(default)s)",
    )
    parser.add_argument(
        "--mig-mode",
        choices=("static", "dynamic"),
        default="static",
        help="static: MIG-mode GPUs publish the instances that exist; dynamic: every profile "
        "and placement through shared counters, created at prepare (default %(default)s)",
    )
    parser.add_argument(
        "--dynamic-mig-attributes",
        choices=("full", "compact"),
        default="full",
        help="what each dynamic MIG device carries: full or compact (default %(default)s)",
    )
    parser.add_argument(
        "--consumable-gpus",
        type=consumable_gpus,
        default="none",
        help="GPUs published for sharing: none, all, or product names and GPU UUIDs "
        "separated by commas (default none)",
    )
    parser.add_argument(
        "--mps-slots",
        type=mps_slots,
        default="none",
        help="GPUs split into N equal MPS slots: none, or <product name or GPU UUID>=<N> "
        "separated by commas, N 2-64 (default none)",
    )
    add_host_arguments(parser)
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="default %(default)s"
    )


def consumable_gpus(text: str) -> ConsumableGpus:
    """argparse type of ``--consumable-gpus``."""
    from dra_driver.gpu.hardware.consumable import ConsumableGpus

    try:
        return ConsumableGpus.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def mps_slots(text: str) -> MpsSlots:
    """argparse type of ``--mps-slots``."""
    from dra_driver.gpu.hardware.consumable import MpsSlots

    try:
        return MpsSlots.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def resource_slices(
    inventory: Inventory,
    *,
    driver_name: str,
    node_name: str,
    node_uid: str | None = None,
    generation: int = 1,
    taint_degraded: bool = False,
    numa_attribute_form: NumaAttributeForm = "scalar",
    mig_mode: MigMode = "static",
    placement_attributes: PlacementAttributes = "full",
    consumable: ConsumableGpus | None = None,
    slots: MpsSlots | None = None,
) -> list[dict[str, Any]]:
    """The ResourceSlice objects for ``inventory``; raises SliceValidationError if invalid."""
    from dra_driver.gpu.hardware.consumable import ConsumableGpus, MpsSlots
    from dra_driver.gpu.hardware.devices import build_pool
    from dra_driver.gpu.sharing.slots import fractional_pool
    from dra_driver.plugin.slices import slice_object, split_pool, validate_names, validate_pool

    validate_names(driver_name, node_name)
    pool = build_pool(
        inventory,
        driver_name=driver_name,
        taint_degraded=taint_degraded,
        numa_attribute_form=numa_attribute_form,
        mig_mode=mig_mode,
        placement_attributes=placement_attributes,
    )
    pool = fractional_pool(pool, inventory, consumable or ConsumableGpus(), slots or MpsSlots())
    validate_pool(pool)
    contents = split_pool(pool)
    objects = [
        slice_object(
            driver=driver_name,
            node_name=node_name,
            node_uid=node_uid or "",
            index=i,
            generation=generation,
            count=len(contents),
            content=content,
        )
        for i, content in enumerate(contents)
    ]
    if node_uid is None:
        for obj in objects:
            del obj["metadata"]["ownerReferences"]
    return objects


def run(args: argparse.Namespace) -> int:
    from dra_driver.gpu.hardware.discovery import discover
    from dra_driver.plugin.slices import SliceValidationError

    try:
        with gpu_host(host_settings(args)) as (host, _node):
            inventory = discover(host, logger)
        objects = resource_slices(
            inventory,
            driver_name=args.driver_name,
            node_name=args.node_name,
            node_uid=args.node_uid,
            generation=args.generation,
            taint_degraded=args.taint_degraded,
            numa_attribute_form=args.numa_attribute_form,
            mig_mode=args.mig_mode,
            placement_attributes=args.dynamic_mig_attributes,
            consumable=args.consumable_gpus,
            slots=args.mps_slots,
        )
    except (SliceValidationError, FileExistsError) as exc:
        print(f"dra-driver slices: {exc}", file=sys.stderr)
        return 1
    if args.output == "json":
        body = {"apiVersion": "v1", "kind": "List", "items": objects}
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
    else:
        import yaml

        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    return 0
