"""CDI spec model, the minimum-version rule, validation and the atomic writer.

Container runtimes (containerd, CRI-O) load every ``*.json``/``*.yaml`` file in
their CDI directories with the reference Go library, which rejects a spec whose
``cdiVersion`` is unknown to it or lower than what the content needs. Runtimes
bundle old library versions, so we declare the *minimum* version our content
needs (newest wins: 0.7.0 additionalGids, 0.6.0 annotations or a dot in the
class, 0.5.0 a device name starting with a digit or a deviceNode hostPath,
0.4.0 a mount type, else 0.3.0).

Names follow the reference parser: vendor/class start with a letter and end
with a letter or digit; device names start and end with a letter or digit and
may contain ``_.:-`` in between. We validate before writing so a bad spec never
reaches a runtime (where it would invalidate only itself, silently).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.gpu.host.files import (
    CdiError as CdiError,  # raised here too; callers catch cdi.CdiError
)
from dra_driver.gpu.host.files import (
    Opener,
    default_opener,
    os_reason,
    temp_files_for,
    write_atomic,
)

SPEC_FILE_MODE = 0o644
"""Runtimes read the file as root; hooks in it run as root, so never group/world writable."""

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)

_VENDOR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_ENV = re.compile(r"^[^=]+=")


@dataclass(frozen=True)
class DeviceNode:
    path: str
    """Path inside the container."""
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        for key, value in (
            ("hostPath", self.host_path),
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("fileMode", self.file_mode),
            ("permissions", self.permissions),
            ("uid", self.uid),
            ("gid", self.gid),
        ):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.options:
            out["options"] = list(self.options)
        if self.type:
            out["type"] = self.type
        return out


@dataclass(frozen=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()

    def is_empty(self) -> bool:
        return not (
            self.env or self.device_nodes or self.mounts or self.hooks or self.additional_gids
        )

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits(
            env=self.env + other.env,
            device_nodes=self.device_nodes + other.device_nodes,
            mounts=self.mounts + other.mounts,
            hooks=self.hooks + other.hooks,
            additional_gids=self.additional_gids + other.additional_gids,
        )

    @functools.cached_property
    def problem(self) -> str:
        """What makes these edits invalid (a path suffix and the reason), "" when they
        are valid; checked once per object (they are frozen)."""
        for env in self.env:
            if not _ENV.match(env):
                return f".env: {env!r} must be NAME=value"
        for node in self.device_nodes:
            if not node.path:
                return ".deviceNodes: path must not be empty"
            if node.type not in (None, "", "b", "c", "u", "p"):
                return f".deviceNodes[{node.path}].type {node.type!r}: use b, c, u or p"
            perms = node.permissions
            if perms and perms != "none" and set(perms) - set("rwm"):
                return f".deviceNodes[{node.path}].permissions {perms!r}: r, w, m or none"
        for mount in self.mounts:
            if not mount.host_path or not mount.container_path:
                return ".mounts: hostPath and containerPath are required"
        for hook in self.hooks:
            if hook.hook_name not in HOOK_NAMES:
                return f".hooks: hookName {hook.hook_name!r} not one of {sorted(HOOK_NAMES)}"
            if not hook.path.startswith("/"):
                return f".hooks[{hook.hook_name}].path must be absolute"
        return ""

    @functools.cached_property
    def version_floor(self) -> tuple[int, int, int]:
        """The lowest ``cdiVersion`` these edits can be written in (see
        :func:`minimum_version`); once per object."""
        if self.additional_gids:
            return (0, 7, 0)
        if any(n.host_path is not None for n in self.device_nodes):
            return (0, 5, 0)
        if any(m.type for m in self.mounts):
            return (0, 4, 0)
        return (0, 3, 0)

    @functools.cached_property
    def json_text(self) -> str:
        """:meth:`to_json` as compact JSON, made once per object: the node's common
        edits (every driver library) are the same object in every claim's spec."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_json() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_json() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_json() for h in self.hooks]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out


@dataclass(frozen=True)
class CdiDevice:
    name: str
    edits: ContainerEdits
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    kind: str
    devices: tuple[CdiDevice, ...]
    edits: ContainerEdits = field(default_factory=ContainerEdits)
    annotations: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The file content, with the minimum ``cdiVersion`` the content needs."""
        out = self._head()
        if not self.edits.is_empty():
            out["containerEdits"] = self.edits.to_json()
        return out

    def json_bytes(self) -> bytes:
        """:meth:`to_json` as compact JSON (the file's bytes), with the spec-level edits'
        JSON made once per edits object (:attr:`ContainerEdits.json_text`)."""
        text = json.dumps(self._head(), separators=(",", ":"))
        if not self.edits.is_empty():
            text = f'{text[:-1]},"containerEdits":{self.edits.json_text}}}'
        return (text + "\n").encode()

    def _head(self) -> dict[str, Any]:
        """Everything but the spec-level edits, which come last."""
        out: dict[str, Any] = {"cdiVersion": minimum_version(self), "kind": self.kind}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        devices: list[dict[str, Any]] = []
        for dev in self.devices:
            entry: dict[str, Any] = {"name": dev.name}
            if dev.annotations:
                entry["annotations"] = dict(dev.annotations)
            entry["containerEdits"] = dev.edits.to_json()
            devices.append(entry)
        out["devices"] = devices
        return out


def claim_kind(driver_name: str) -> str:
    """``gpu.nvidia.com`` -> ``k8s.gpu.nvidia.com/claim``: per-claim specs never clash
    with the static ``nvidia.com/gpu`` specs nvidia-ctk writes."""
    return f"k8s.{driver_name}/claim"


def qualified_name(kind: str, device: str) -> str:
    return f"{kind}={device}"


def transient_spec_path(cdi_dir: Path, kind: str, transient_id: str) -> Path:
    """``<vendor>-<class>_<id>.json`` as the reference library names transient specs."""
    vendor, cls = kind.split("/", 1)
    return cdi_dir / f"{vendor}-{cls}_{transient_id.replace('/', '_')}.json"


def minimum_version(spec: Spec) -> str:
    """The lowest ``cdiVersion`` that can express the spec (docs/cdi.md section 1):
    additional GIDs need 0.7.0; annotations or a dotted class 0.6.0; a device name
    starting with a digit or a device node's host path 0.5.0; a mount type 0.4.0."""
    floor = max(e.version_floor for e in (spec.edits, *(d.edits for d in spec.devices)))
    if spec.annotations or any(d.annotations for d in spec.devices):
        floor = max(floor, (0, 6, 0))
    if "." in spec.kind.split("/", 1)[-1]:
        floor = max(floor, (0, 6, 0))
    if any(d.name[:1].isdigit() for d in spec.devices):
        floor = max(floor, (0, 5, 0))
    return ".".join(map(str, floor))


def validate_kind(kind: str) -> None:
    vendor, sep, cls = kind.partition("/")
    if not sep or "/" in cls:
        raise CdiError(f"kind {kind!r}: must be <vendor>/<class> with exactly one '/'")
    if not _VENDOR_CLASS.match(vendor) or len(vendor) > 253:
        raise CdiError(
            f"kind {kind!r}: vendor must start with a letter, end with a letter or digit, "
            "contain only [A-Za-z0-9_.-] and be at most 253 characters"
        )
    if not _VENDOR_CLASS.match(cls) or len(cls) > 63:
        raise CdiError(
            f"kind {kind!r}: class must start with a letter, end with a letter or digit, "
            "contain only [A-Za-z0-9_.-] and be at most 63 characters"
        )


def validate_device_name(name: str) -> None:
    if not _DEVICE.match(name):
        raise CdiError(
            f"device name {name!r}: must start and end with a letter or digit "
            "and contain only [A-Za-z0-9_.:-]"
        )


def _validate_edits(edits: ContainerEdits, where: str) -> None:
    if edits.problem:
        raise CdiError(f"{where}{edits.problem}")


def validate(spec: Spec) -> None:
    """The reference loader's rules (plus the length limits the SPEC prose adds)."""
    validate_kind(spec.kind)
    if not spec.devices:
        raise CdiError("devices: a spec needs at least one device")
    seen: set[str] = set()
    for dev in spec.devices:
        validate_device_name(dev.name)
        if dev.name in seen:
            raise CdiError(f"devices: duplicate device name {dev.name!r}")
        seen.add(dev.name)
        if dev.edits.is_empty():
            raise CdiError(f"devices[{dev.name}].containerEdits: must not be empty")
        _validate_edits(dev.edits, f"devices[{dev.name}].containerEdits")
    _validate_edits(spec.edits, "containerEdits")


def encode(spec: Spec) -> bytes:
    """Compact JSON: a spec is read by runtimes on every container start (and ``jq``
    formats it for people); indenting cost more than everything else in a prepare."""
    validate(spec)
    return spec.json_bytes()


def write_spec(
    cdi_dir: Path, transient_id: str, spec: Spec, *, opener: Opener = default_opener
) -> Path:
    """Validate and atomically write one transient spec; returns its path."""
    data = encode(spec)
    target = transient_spec_path(cdi_dir, spec.kind, transient_id)
    if not cdi_dir.is_dir():  # a stat, not a mkdir that fails on every prepare
        try:
            cdi_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise CdiError(f"create CDI dir {cdi_dir}: {os_reason(exc)}") from exc
    write_atomic(target, data, mode=SPEC_FILE_MODE, opener=opener)
    return target


def remove_spec(cdi_dir: Path, kind: str, transient_id: str) -> None:
    """Delete the spec and any temp file of an interrupted write; missing is fine."""
    target = transient_spec_path(cdi_dir, kind, transient_id)
    for path in [target, *temp_files_for(target)]:
        if not (path.exists() or path.is_symlink()):
            continue  # unlink on a read-only fs fails even for missing files
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise CdiError(f"remove {path}: {os_reason(exc)}") from exc
