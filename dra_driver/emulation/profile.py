"""Emulated node profiles: which GPUs a fake node has, loaded from YAML.

A profile is a built-in name (``dgx-a100``, files in ``profiles/``) or a path
to a YAML file of the same shape. GPU models (figures NVML would report, MIG
tables) live in ``profiles/models.yaml``; a profile may define its own
``models:`` mapping to add or override models. Every field is checked here, so
a typo in a profile fails with the field path instead of surfacing later as an
odd NVML answer.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from dra_driver.emulation.hardware import (
    ARCHITECTURES,
    BRANDS,
    DRIVER_LAYOUTS,
    GI_PROFILES,
    REALISTIC_CALL_DELAYS,
    EmulatedFabric,
    EmulatedGpu,
    EmulatedMigInstance,
    EmulatedMigProfile,
    EmulatedModel,
    EmulatedProfile,
    ProfileError,
)
from dra_driver.yamlfiles import safe_load

BUILTIN_PROFILES: tuple[str, ...] = (
    "dgx-a100",
    "dgx-a100-mig",
    "dgx-a100-mig-on",
    "dgx-h100",
    "h100-l4-mixed",
    "h200",
    "l4-x4",
    "t4",
    "a100-pcie-nvlink",
    "hgx-h100-fabric",
    "hgx-h100-fabric-clique8",
    "hgx-h100-no-clique",
)

# Deterministic UUIDs: the same profile always yields the same GPU UUIDs.
_UUID_NAMESPACE = uuidlib.UUID("5b0c6f3e-2a43-4c1e-9a1e-6d0f2f6b9a10")


def _get(data: dict[str, Any], key: str, where: str, kind: type, default: Any = ...) -> Any:
    if key not in data:
        if default is ...:
            raise ProfileError(f"{where}.{key}: required field missing")
        return default
    value = data[key]
    if kind is int and isinstance(value, bool):
        raise ProfileError(f"{where}.{key}: expected an integer, got {value!r}")
    if not isinstance(value, kind):
        raise ProfileError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _mig_profile(data: Any, where: str) -> EmulatedMigProfile:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping")
    keys = {
        "name", "nvmlProfile", "id", "slices", "instances", "multiprocessors", "copyEngines",
        "decoders", "encoders", "jpegEngines", "ofaEngines", "memoryMiB", "placements",
        "placementSize",
    }  # fmt: skip
    _check_keys(data, keys, where)
    nvml_profile = str(_get(data, "nvmlProfile", where, (str, int)))  # type: ignore[arg-type]
    if nvml_profile not in GI_PROFILES:
        raise ProfileError(f"{where}.nvmlProfile: {nvml_profile!r} not one of {list(GI_PROFILES)}")
    placements = _get(data, "placements", where, list)
    if not all(isinstance(p, int) and 0 <= p < 8 for p in placements):
        raise ProfileError(
            f"{where}.placements: expected memory-slice starts 0..7, got {placements}"
        )
    return EmulatedMigProfile(
        name=_get(data, "name", where, str),
        nvml_profile=nvml_profile,
        id=_get(data, "id", where, int),
        slices=_get(data, "slices", where, int),
        instances=_get(data, "instances", where, int),
        multiprocessors=_get(data, "multiprocessors", where, int),
        copy_engines=_get(data, "copyEngines", where, int),
        decoders=_get(data, "decoders", where, int),
        encoders=_get(data, "encoders", where, int),
        jpeg_engines=_get(data, "jpegEngines", where, int),
        ofa_engines=_get(data, "ofaEngines", where, int),
        memory_mib=_get(data, "memoryMiB", where, int),
        placements=tuple(placements),
        placement_size=_get(data, "placementSize", where, int),
    )


def _model(data: Any, where: str) -> EmulatedModel:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping")
    keys = {
        "productName", "brand", "architecture", "computeCapability", "memoryMiB", "reservedMiB",
        "multiprocessors", "coresPerMultiprocessor", "pciDeviceId", "pciSubSystemId",
        "pcieGeneration", "pcieLinkWidth", "ecc", "migProfiles", "nvlinks",
    }  # fmt: skip
    _check_keys(data, keys, where)
    brand = _get(data, "brand", where, str)
    if brand not in BRANDS:
        raise ProfileError(f"{where}.brand: {brand!r} not one of {list(BRANDS)}")
    arch = _get(data, "architecture", where, str)
    if arch not in ARCHITECTURES:
        raise ProfileError(f"{where}.architecture: {arch!r} not one of {list(ARCHITECTURES)}")
    cc = str(_get(data, "computeCapability", where, (str, float)))  # type: ignore[arg-type]
    major, _, minor = cc.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        raise ProfileError(f"{where}.computeCapability: expected 'MAJOR.MINOR', got {cc!r}")
    migs = _get(data, "migProfiles", where, list, [])
    return EmulatedModel(
        product_name=_get(data, "productName", where, str),
        brand=brand,
        architecture=arch,
        compute_capability=(int(major), int(minor)),
        memory_mib=_get(data, "memoryMiB", where, int),
        reserved_mib=_get(data, "reservedMiB", where, int, 0),
        multiprocessors=_get(data, "multiprocessors", where, int),
        cores_per_multiprocessor=_get(data, "coresPerMultiprocessor", where, int),
        pci_device_id=_get(data, "pciDeviceId", where, int),
        pci_subsystem_id=_get(data, "pciSubSystemId", where, int, 0),
        pcie_generation=_get(data, "pcieGeneration", where, int),
        pcie_link_width=_get(data, "pcieLinkWidth", where, int),
        ecc=_get(data, "ecc", where, bool, True),
        mig_profiles=tuple(
            _mig_profile(m, f"{where}.migProfiles[{i}]") for i, m in enumerate(migs)
        ),
        nvlinks=_get(data, "nvlinks", where, int, 0),
    )


def _normalise_bus_id(bus_id: str, where: str) -> str:
    parts = bus_id.lower().replace(".", ":").split(":")
    if len(parts) != 4 or not all(p and all(c in "0123456789abcdef" for c in p) for p in parts):
        raise ProfileError(f"{where}.busId: expected 'dddd:bb:dd.f', got {bus_id!r}")
    dom, bus, dev, fn = (int(p, 16) for p in parts)
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def _gpu(data: Any, index: int, models: dict[str, EmulatedModel], name: str) -> EmulatedGpu:
    where = f"gpus[{index}]"
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping")
    keys = {"model", "busId", "pcieRoot", "numaNode", "minor", "uuid", "migEnabled",
            "migInstances", "faults"}  # fmt: skip
    _check_keys(data, keys, where)
    model_name = _get(data, "model", where, str)
    if model_name not in models:
        raise ProfileError(f"{where}.model: {model_name!r} unknown; known: {sorted(models)}")
    model = models[model_name]
    bus_id = _normalise_bus_id(_get(data, "busId", where, str), where)
    gpu_uuid = _get(data, "uuid", where, str, "") or "GPU-" + str(
        uuidlib.uuid5(_UUID_NAMESPACE, f"{name}/{bus_id}")
    )
    mig_enabled = _get(data, "migEnabled", where, bool, False)
    instances = []
    for i, inst in enumerate(_get(data, "migInstances", where, list, [])):
        iwhere = f"{where}.migInstances[{i}]"
        if not isinstance(inst, dict):
            raise ProfileError(f"{iwhere}: expected a mapping")
        _check_keys(inst, {"profile", "start", "giId", "ciId"}, iwhere)
        pname = _get(inst, "profile", iwhere, str)
        profile = model.mig_profile(pname)
        if profile is None:
            known = [p.name for p in model.mig_profiles]
            raise ProfileError(
                f"{iwhere}.profile: {pname!r} not a MIG profile of {model_name}: {known}"
            )
        start = _get(inst, "start", iwhere, int)
        if start not in profile.placements:
            raise ProfileError(
                f"{iwhere}.start: {start} not a placement of {pname}: {profile.placements}"
            )
        gi_id, ci_id = _get(inst, "giId", iwhere, int), _get(inst, "ciId", iwhere, int, 0)
        instances.append(
            EmulatedMigInstance(
                profile=profile,
                start=start,
                gi_id=gi_id,
                ci_id=ci_id,
                uuid="MIG-" + str(uuidlib.uuid5(_UUID_NAMESPACE, f"{gpu_uuid}/{gi_id}/{ci_id}")),
            )
        )
    if instances and not mig_enabled:
        raise ProfileError(f"{where}.migInstances: MIG instances need migEnabled: true")
    if mig_enabled and not model.mig_profiles:
        raise ProfileError(f"{where}.migEnabled: model {model_name} is not MIG capable")
    used: set[int] = set()
    for inst in instances:
        slices = set(range(inst.start, inst.start + inst.profile.placement_size))
        if used & slices:
            raise ProfileError(
                f"{where}.migInstances: {inst.profile.name}@{inst.start} overlaps another"
            )
        used |= slices
    faults = _get(data, "faults", where, dict, {})
    if not all(isinstance(k, str) and isinstance(v, int) for k, v in faults.items()):
        raise ProfileError(f"{where}.faults: expected C function name -> NVML return code")
    return EmulatedGpu(
        index=index,
        model=model,
        bus_id=bus_id,
        pcie_root=_get(data, "pcieRoot", where, str),
        numa_node=_get(data, "numaNode", where, int, -1),
        minor=_get(data, "minor", where, int, index),
        uuid=gpu_uuid,
        mig_enabled=mig_enabled,
        mig_instances=tuple(instances),
        faults=dict(faults),
    )


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ProfileError(f"{where}: expected seconds >= 0, got {value!r}")
    return float(value)


def call_delays(value: Any, where: str = "callDelays") -> dict[str, float]:
    """``realistic`` (:data:`REALISTIC_CALL_DELAYS`), ``none``, or C function -> seconds."""
    if value in ("realistic", "none"):
        return dict(REALISTIC_CALL_DELAYS) if value == "realistic" else {}
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: expected 'realistic', 'none' or C function -> seconds")
    out = {}
    for fn, seconds in value.items():
        if not isinstance(fn, str) or not fn.startswith("nvml"):
            raise ProfileError(f"{where}: {fn!r} is not an NVML C function name")
        out[fn] = _seconds(seconds, f"{where}.{fn}")
    return out


def _builtin_text(name: str) -> str:
    return resources.files("dra_driver.emulation").joinpath("profiles", name).read_text()


def load_models(extra: dict[str, Any] | None = None) -> dict[str, EmulatedModel]:
    raw = safe_load(_builtin_text("models.yaml"))  # libyaml: ~60 -> 16 ms
    raw.update(extra or {})
    return {name: _model(data, f"models.{name}") for name, data in raw.items()}


def parse_profile(text: str, origin: str = "<profile>") -> EmulatedProfile:
    """Build a profile from YAML text; errors name ``origin`` and the field."""
    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{origin}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: expected a mapping at the top level")
    try:
        _check_keys(
            data,
            {"name", "driverVersion", "cudaDriverVersion", "models", "gpus", "nvlinkBridges",
             "fabric", "numaDistances", "callDelays", "deviceNodeDelay", "driverLayout",
             "driverLoaded"},
            "profile",
        )  # fmt: skip
        name = _get(data, "name", "profile", str)
        models = load_models(_get(data, "models", "profile", dict, {}))
        gpus = tuple(
            _gpu(g, i, models, name) for i, g in enumerate(_get(data, "gpus", "profile", list))
        )
        minors = [g.minor for g in gpus]
        if len(set(minors)) != len(minors):
            raise ProfileError(f"profile.gpus: minor numbers must be unique, got {minors}")
        gpus = _with_bridges(gpus, _get(data, "nvlinkBridges", "profile", list, []))
        gpus = _with_fabric(gpus, _get(data, "fabric", "profile", dict, None))
        return EmulatedProfile(
            name=name,
            driver_version=str(_get(data, "driverVersion", "profile", str)),
            cuda_driver_version=_get(data, "cudaDriverVersion", "profile", int),
            gpus=gpus,
            source=text,
            numa_distances=_numa_distances(_get(data, "numaDistances", "profile", list, []), gpus),
            call_delays=call_delays(data.get("callDelays", {}), "profile.callDelays"),
            device_node_delay=_seconds(data.get("deviceNodeDelay", 0), "profile.deviceNodeDelay"),
            driver_layout=_layout(data),
            driver_loaded=_get(data, "driverLoaded", "profile", bool, True),
        )
    except ProfileError as exc:
        raise ProfileError(f"{origin}: {exc}") from None


def _layout(data: dict[str, Any]) -> str:
    layout = _get(data, "driverLayout", "profile", str, "debian")
    if layout not in DRIVER_LAYOUTS:
        raise ProfileError(f"profile.driverLayout: {layout!r} is not one of {list(DRIVER_LAYOUTS)}")
    return str(layout)


def _with_bridges(gpus: tuple[EmulatedGpu, ...], bridges: list[Any]) -> tuple[EmulatedGpu, ...]:
    """NVLink bridges between GPU pairs (PCIe boards): ``{gpus: [a, b], links: n}``."""
    peers: dict[int, list[tuple[int, int]]] = {g.index: [] for g in gpus}
    for i, bridge in enumerate(bridges):
        where = f"profile.nvlinkBridges[{i}]"
        if not isinstance(bridge, dict):
            raise ProfileError(f"{where}: expected a mapping")
        _check_keys(bridge, {"gpus", "links"}, where)
        pair = _get(bridge, "gpus", where, list)
        links = _get(bridge, "links", where, int)
        if len(pair) != 2 or not all(isinstance(p, int) and 0 <= p < len(gpus) for p in pair):
            raise ProfileError(f"{where}.gpus: expected two GPU indexes 0..{len(gpus) - 1}")
        for a, b in (pair, pair[::-1]):
            start = len(peers[a])
            if start + links > gpus[a].model.nvlinks:
                raise ProfileError(
                    f"{where}.links: GPU {a} ({gpus[a].model.product_name}) has "
                    f"{gpus[a].model.nvlinks} NVLink ports, {start + links} bridged"
                )
            peers[a] += [(start + k, b) for k in range(links)]
    return tuple(replace(g, nvlink_peers=tuple(peers[g.index])) for g in gpus)


def _with_fabric(
    gpus: tuple[EmulatedGpu, ...], data: dict[str, Any] | None
) -> tuple[EmulatedGpu, ...]:
    """Every GPU joins one fabric clique: ``{clusterUuid: <uuid>, cliqueId: n}``."""
    if data is None:
        return gpus
    _check_keys(data, {"clusterUuid", "cliqueId", "state"}, "profile.fabric")
    raw = _get(data, "clusterUuid", "profile.fabric", str)
    try:
        cluster = str(uuidlib.UUID(raw))
    except ValueError:
        raise ProfileError(f"profile.fabric.clusterUuid: {raw!r} is not a UUID") from None
    fabric = EmulatedFabric(
        cluster_uuid=cluster,
        clique_id=_get(data, "cliqueId", "profile.fabric", int),
        state=_get(data, "state", "profile.fabric", int, 3),
    )
    for g in gpus:
        if g.nvlink_peers or not g.model.nvlinks:
            raise ProfileError(
                f"profile.fabric: GPU {g.index} must have NVLink ports and no bridges"
            )
    return tuple(replace(g, fabric=fabric) for g in gpus)


def _numa_distances(rows: list[Any], gpus: tuple[EmulatedGpu, ...]) -> tuple[tuple[int, ...], ...]:
    """SLIT table; default: 10 to itself, 21 to every other node the GPUs use."""
    if not rows:
        count = max((g.numa_node for g in gpus), default=-1) + 1
        return tuple(tuple(10 if a == b else 21 for b in range(count)) for a in range(count))
    if not all(
        isinstance(r, list) and len(r) == len(rows) and all(isinstance(v, int) for v in r)
        for r in rows
    ):
        raise ProfileError("profile.numaDistances: expected a square list of integer rows")
    if any(g.numa_node >= len(rows) for g in gpus):
        raise ProfileError("profile.numaDistances: fewer rows than the GPUs' NUMA nodes")
    return tuple(tuple(r) for r in rows)


def load_profile(profile: str | Path) -> EmulatedProfile:
    """A built-in profile by name, or a YAML file by path."""
    if isinstance(profile, str) and profile in BUILTIN_PROFILES:
        return parse_profile(_builtin_text(f"{profile}.yaml"), origin=profile)
    path = Path(profile)
    if not path.is_file():
        raise ProfileError(
            f"emulation profile {str(profile)!r}: neither a built-in profile "
            f"({', '.join(BUILTIN_PROFILES)}) nor a readable YAML file"
        )
    return parse_profile(path.read_text(), origin=str(path))
