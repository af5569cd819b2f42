"""Host discovery of NVIDIA device nodes and driver files, turned into CDI edits, and
a claim's CDI spec built from them (:class:`ClaimSpecs`).

What a container needs to use a GPU, and why each piece is there:

- ``/dev/nvidiactl`` (+ ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset``):
  control nodes every CUDA process opens; spec-level edits because they are the
  same for every device of the claim.
- ``/dev/nvidia<minor>`` per full GPU; a MIG device gets its parent's node plus
  the two capability nodes ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU and
  compute instance. Without those caps the container cannot open the MIG
  device; with only its own caps it sees exactly that MIG device.
- Driver libraries (every ``*.so.<driver version>`` file), tools and GSP firmware,
  read-only, each at its host path relative to the driver root (NVIDIA's
  convention: ``usr/lib64/libcuda.so.<v>`` of a RHEL host is
  ``/usr/lib64/libcuda.so.<v>`` in the container). No image's loader is expected to
  search there by itself: NVIDIA's hooks (:mod:`.cdihook`) make the SONAME and
  ``libcuda.so`` links and add the dirs to the container's ld cache, on Debian,
  RHEL/UBI and distroless images alike.

Every device node is *fully specified* (type, major, minor, fileMode) from the
host (majors from ``/proc/devices``), so a runtime creates it even where the
host path is missing, and never has to stat it.

Environment, at spec level: ``NVIDIA_VISIBLE_DEVICES=void`` stops the legacy
nvidia-container-runtime hook from adding devices on top of ours, and
``NVIDIA_CTK_LIBCUDA_DIR`` names libcuda's dir, as NVIDIA's specs do. We
deliberately set no ``CUDA_VISIBLE_DEVICES``: the container already sees only
its device nodes (CUDA enumerates what it can open), and a second claim in
the same container would otherwise overwrite the first claim's value.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dra_driver.gpu.cdi import spec as cdi
from dra_driver.gpu.cdi.hooks import TOOLKIT_HOOK, driver_hooks
from dra_driver.gpu.cdi.spec import CdiError, ContainerEdits, DeviceNode, Mount
from dra_driver.gpu.checkpoint import Unit
from dra_driver.gpu.hardware.inventory import Gpu, Inventory, MigInstance
from dra_driver.gpu.host.files import read_whole
from dra_driver.gpu.host.hostpaths import BIN_DIRS, LIB_DIRS, HostPaths
from dra_driver.gpu.planning import SharingStrategy, Target
from dra_driver.gpu.sharing.strategies.base import Materializes

BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
RO_MOUNT = ("ro", "nosuid", "nodev", "rbind", "rprivate")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "firmware/nvidia")
"""GSP firmware under a driver root: distro layout, then the GKE layout."""
DEFAULT_NODE_MODE = 0o666
DEFAULT_CAP_MODE = 0o444

_MODE_LINE = re.compile(r"^DeviceFileMode:\s*(\d+)\s*$", re.MULTILINE)
_MINOR_LINE = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)


def read_majors(host: HostPaths) -> dict[str, int]:
    """Character-device majors by driver name from ``/proc/devices``."""
    return parse_majors(read_proc_devices(host.proc("devices")))


def read_proc_devices(path: Path) -> bytes:
    """``/proc/devices`` as it is now (read on every prepare: a module may load late)."""
    try:
        return read_whole(path)
    except OSError as exc:
        raise CdiError(f"read {path}: {exc.strerror}") from exc


def _links_to(libdir: Path, entries: list[Path], libs: set[str]) -> list[tuple[str, str]]:
    """``(link name, its target)`` for the links in ``libdir`` that lead, within the
    dir, to one of ``libs``: the SONAME and ``.so`` links the driver install made."""
    out = []
    for entry in entries:
        if not entry.is_symlink():
            continue
        target = name = str(entry.readlink())
        for _ in range(8):  # a chain: libcuda.so -> libcuda.so.1 -> libcuda.so.<v>
            if "/" in name or name in libs:
                break
            try:
                name = str((libdir / name).readlink())
            except OSError:
                break
        if "/" not in target and name in libs:
            out.append((entry.name, target))
    return out


def parse_majors(data: bytes) -> dict[str, int]:
    """Character-device majors by driver name, from ``/proc/devices``' content."""
    text = data.decode(errors="replace")
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
            continue
        if line.startswith("Block devices"):
            in_char = False
            continue
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


@dataclass(frozen=True)
class _CapInfo:
    minor: int
    mode: int


class EditsBuilder:
    """Builds container edits from one host view; the common part is computed once.

    ``host`` is where this process reads the host; ``runtime_host`` is how the
    container runtime on the node names the same places (they differ when the
    plugin runs in a pod with the driver root mounted at ``/driver-root``).
    ``hook`` is the ``nvidia-cdi-hook`` binary as the runtime finds it on the host.
    """

    def __init__(
        self,
        *,
        host: HostPaths,
        driver_version: str,
        hook: Path,
        runtime_host: HostPaths | None = None,
        majors: dict[str, int] | None = None,
    ) -> None:
        self._host = host
        self._view = runtime_host or host
        self._dev = host.dev()
        self._pci = host.sys("bus", "pci", "devices")
        self._roots = ((host.driver_root, self._view.driver_root), (host.root, self._view.root))
        self._version = driver_version
        self._hook = str(hook)
        self._majors = majors if majors is not None else read_majors(host)
        self._common: ContainerEdits | None = None

    def _nvidia_major(self) -> int:
        for name in ("nvidia", "nvidia-frontend"):
            if name in self._majors:
                return self._majors[name]
        raise CdiError(
            f"{self._host.proc('devices')}: no 'nvidia' or 'nvidia-frontend' character device; "
            "is the NVIDIA kernel module loaded?"
        )

    def _runtime_path(self, path: Path) -> str:
        """Rewrite a path we read into the path the runtime must use."""
        for ours, theirs in self._roots:
            try:
                return str(theirs / path.relative_to(ours))
            except ValueError:
                continue
        return str(path)

    def _node(
        self, name: str, major: int, minor: int, *, default_mode: int = DEFAULT_NODE_MODE
    ) -> DeviceNode:
        host_path = self._dev / name
        mode, gid = default_mode, None
        try:
            st = host_path.lstat()
        except OSError:
            pass
        else:
            mode = stat.S_IMODE(st.st_mode)
            gid = st.st_gid or None
        return DeviceNode(
            path=f"/dev/{name}",
            host_path=self._runtime_path(host_path),
            type="c",
            major=major,
            minor=minor,
            file_mode=mode,
            permissions="rwm",
            gid=gid,
        )

    def common(self) -> ContainerEdits:
        """Spec-level edits shared by every device of every claim on this node."""
        if self._common is None:
            mounts, links, lib_dirs = self._driver_files()
            env = ["NVIDIA_VISIBLE_DEVICES=void"]
            cuda_dirs = sorted({c.rsplit("/", 1)[0] for c in mounts if "/libcuda.so." in c})
            if cuda_dirs:
                env.append(f"NVIDIA_CTK_LIBCUDA_DIR={':'.join(cuda_dirs)}")
            self._common = ContainerEdits(
                env=tuple(env),
                device_nodes=self._control_nodes(),
                mounts=tuple(
                    Mount(host_path=self._runtime_path(p), container_path=c, options=RO_MOUNT)
                    for c, p in sorted(mounts.items())
                ),
                hooks=driver_hooks(
                    self._hook, driver_version=self._version, links=links, lib_dirs=lib_dirs
                ),
            )
        return self._common

    def _control_nodes(self) -> tuple[DeviceNode, ...]:
        nvidia = self._nvidia_major()
        nodes = [self._node("nvidiactl", nvidia, 255)]
        if self._host.dev("nvidia-modeset").exists():
            nodes.append(self._node("nvidia-modeset", nvidia, 254))
        uvm = self._majors.get("nvidia-uvm")
        if uvm is not None:
            nodes.append(self._node("nvidia-uvm", uvm, 0))
            nodes.append(self._node("nvidia-uvm-tools", uvm, 1))
        return tuple(nodes)

    def _driver_files(self) -> tuple[dict[str, Path], list[tuple[str, str]], list[str]]:
        """What the driver root gives a container: mounts (container path -> host file),
        the links the ``create-symlinks`` hook makes (target, container path) and the
        library dirs ``update-ldcache`` adds, all at host paths relative to the root."""
        root = self._host.driver_root
        found: dict[str, Path] = {}
        links: dict[str, str] = {}
        lib_dirs: list[str] = []
        suffix = f".so.{self._version}"
        for rel in LIB_DIRS:
            for libdir in (root / rel, root / rel / "vdpau"):
                if not libdir.is_dir() or libdir.is_symlink():
                    continue
                entries = sorted(libdir.iterdir())
                libs = {
                    e.name for e in entries if e.name.endswith(suffix) and e.is_file()
                    and not e.is_symlink()
                }  # fmt: skip
                if not libs:
                    continue
                where = "/" + str(libdir.relative_to(root))
                lib_dirs.append(where)
                for name in sorted(libs):
                    found.setdefault(f"{where}/{name}", libdir / name)
                for link, target in _links_to(libdir, entries, libs):
                    links.setdefault(f"{where}/{link}", target)
                if any(n.startswith("libcuda.so.") for n in libs):
                    # Many programs dlopen "libcuda.so" (NVIDIA's specs always add it).
                    links.setdefault(f"{where}/libcuda.so", "libcuda.so.1")
        for rel in BIN_DIRS:
            for name in BINARIES:
                exe = root / rel / name
                if exe.is_file() and not any(c.endswith(f"/{name}") for c in found):
                    found[f"/{rel}/{name}"] = exe
        for rel in FIRMWARE_DIRS:
            fw = root / rel / self._version
            if fw.is_dir():
                for blob in sorted(fw.glob("gsp*.bin")):
                    found.setdefault(f"/{rel}/{self._version}/{blob.name}", blob)
        return found, [(t, c) for c, t in links.items()], lib_dirs

    def gpu(self, gpu: Gpu) -> ContainerEdits:
        """The GPU's own node, plus its DRI nodes when the host has them."""
        nodes = [self._node(f"nvidia{gpu.minor}", self._nvidia_major(), gpu.minor)]
        drm = self._pci / gpu.pci.bus_id / "drm"
        drm_major = self._majors.get("drm")
        if drm_major is not None and drm.is_dir():
            for entry in sorted(drm.iterdir()):
                m = re.fullmatch(r"(card|renderD)(\d+)", entry.name)
                if m:
                    nodes.append(self._node(f"dri/{entry.name}", drm_major, int(m.group(2))))
        return ContainerEdits(device_nodes=tuple(nodes))

    def mig(self, mig: MigInstance) -> ContainerEdits:
        """Parent node plus GI and CI capability nodes (fully specified)."""
        caps_major = self._majors.get("nvidia-caps")
        if caps_major is None:
            raise CdiError(f"{self._host.proc('devices')}: no 'nvidia-caps' character device")
        parent = self._node(f"nvidia{mig.parent_minor}", self._nvidia_major(), mig.parent_minor)
        base = (
            "driver",
            "nvidia",
            "capabilities",
            f"gpu{mig.parent_minor}",
            "mig",
            f"gi{mig.gi_id}",
        )
        gi = self._cap(self._host.proc(*base, "access"), mig.gi_cap_minor)
        ci = self._cap(self._host.proc(*base, f"ci{mig.ci_id}", "access"), mig.ci_cap_minor)
        caps = tuple(
            DeviceNode(
                path=f"/dev/nvidia-caps/nvidia-cap{c.minor}",
                host_path=self._runtime_path(self._dev / "nvidia-caps" / f"nvidia-cap{c.minor}"),
                type="c",
                major=caps_major,
                minor=c.minor,
                file_mode=c.mode,
                permissions="rwm",
            )
            for c in (gi, ci)
        )
        return ContainerEdits(device_nodes=(parent, *caps))

    def _cap(self, access: Path, known_minor: int | None) -> _CapInfo:
        try:
            text = access.read_text()
        except OSError as exc:
            if known_minor is None:
                raise CdiError(f"read MIG capability {access}: {exc.strerror}") from exc
            return _CapInfo(known_minor, DEFAULT_CAP_MODE)
        minor = _MINOR_LINE.search(text)
        mode = _MODE_LINE.search(text)
        if minor is None and known_minor is None:
            raise CdiError(f"{access}: no 'DeviceFileMinor:' line")
        return _CapInfo(
            known_minor if known_minor is not None else int(minor.group(1)),  # type: ignore[union-attr]
            int(mode.group(1)) if mode else DEFAULT_CAP_MODE,
        )


class ClaimSpecs:
    """A claim's CDI spec: each device's edits from the inventory (or from the device a
    strategy created for it), plus its units' additions."""

    def __init__(
        self,
        *,
        kind: str,
        host: HostPaths,
        runtime_host: HostPaths | None = None,
        hook: Path = TOOLKIT_HOOK,
    ) -> None:
        """``runtime_host``: how the container runtime names host paths, when this
        process sees them elsewhere (see :class:`EditsBuilder`);
        ``hook``: the ``nvidia-cdi-hook`` the specs' hooks run
        (:mod:`~dra_driver.gpu.cdi.hooks`)."""
        self.kind = kind
        self._host = host
        self._runtime_host = runtime_host
        self._hook = hook
        self._proc_devices = host.proc("devices")
        self._cache: tuple[tuple[str, bytes], EditsBuilder] | None = None

    def warm(self, inventory: Inventory) -> None:
        """Build the node's common edits now (at start), not in the first claim's prepare;
        a host not ready for them yet fails that prepare instead, clearly, as before."""
        try:
            self._builder(inventory).common()
        except CdiError:
            self._cache = None

    def _builder(self, inventory: Inventory) -> EditsBuilder:
        """Rebuilt when the driver version or ``/proc/devices`` changes (a module that
        loads late, like nvidia-uvm on first CUDA use, adds a major)."""
        key = (inventory.driver_version, read_proc_devices(self._proc_devices))
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
