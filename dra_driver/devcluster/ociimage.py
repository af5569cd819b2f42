"""OCI image archives from local files, for a node with no registry and no Docker.

``ctr images import`` reads an OCI image layout packed as a tar (``oci-layout``,
``index.json``, ``blobs/sha256/...``); this writes one, with each layer built
from host files or a whole directory tree. Layers are reproducible (sorted
entries, owner root, mtime 0), so the same inputs give the same image digest
and containerd keeps its unpacked snapshot across runs. Standard library only:
``scripts/build-node.sh`` runs it before the virtualenv's packages matter::

    python -m dra_driver.devcluster.ociimage --out busybox.tar \\
        --ref localhost/dra-node/busybox:1 --entrypoint /bin/sh \\
        --file /bin/busybox=/bin/busybox --link /bin/sh=busybox
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import stat
import sys
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
EPOCH = "1970-01-01T00:00:00Z"
BASE_DIRS = {"dev": 0o755, "proc": 0o755, "sys": 0o755, "etc": 0o755, "tmp": 0o1777}
"""Mount points runc expects to exist in every root filesystem."""


class ImageError(ValueError):
    """An image input is unusable; the message names it."""


@dataclass(frozen=True)
class ImageConfig:
    """The runtime part of the image config (what ``docker inspect`` shows as Config)."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/bin:/usr/bin:/bin",)
    working_dir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


class LayerBuilder:
    """One layer's tar, entries kept sorted and owned by root."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tarfile.TarInfo, bytes | None]] = {}
        for name, mode in BASE_DIRS.items():
            self.directory(name, mode)

    @staticmethod
    def _name(path: str) -> str:
        pure = PurePosixPath("/", path)
        if ".." in pure.parts:
            raise ImageError(f"image path {path!r} must not contain '..'")
        return str(pure).lstrip("/")

    def _parents(self, name: str) -> None:
        parts = PurePosixPath(name).parts[:-1]
        for i in range(1, len(parts) + 1):
            parent = "/".join(parts[:i])
            if parent not in self._entries:
                self.directory(parent)

    def _add(self, info: tarfile.TarInfo, data: bytes | None = None) -> None:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        self._parents(info.name)
        self._entries[info.name] = (info, data)

    def directory(self, path: str, mode: int = 0o755) -> None:
        info = tarfile.TarInfo(self._name(path))
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self._add(info)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        info = tarfile.TarInfo(self._name(path))
        info.size = len(data)
        info.mode = mode
        self._add(info, data)

    def symlink(self, path: str, target: str) -> None:
        info = tarfile.TarInfo(self._name(path))
        info.type = tarfile.SYMTYPE
        info.linkname = target
        self._add(info)

    def host_file(self, source: Path, path: str) -> None:
        """Copy a host file (following links), keeping its permission bits."""
        try:
            data = source.read_bytes()
            mode = stat.S_IMODE(source.stat().st_mode)
        except OSError as err:
            raise ImageError(f"cannot read {source}: {err.strerror}") from err
        self.file(path, data, mode)

    def tree(self, root: Path, prefix: str = "/") -> None:
        """Copy a directory tree as it is: files, links and dirs (no device nodes)."""
        if not root.is_dir():
            raise ImageError(f"{root} is not a directory")
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            base = Path(dirpath)
            rel = base.relative_to(root)
            for name in sorted(dirnames) + sorted(filenames):
                source = base / name
                inside = str(PurePosixPath(prefix, rel.as_posix(), name))
                st = source.lstat()
                if stat.S_ISLNK(st.st_mode):
                    self.symlink(inside, str(source.readlink()))
                elif stat.S_ISDIR(st.st_mode):
                    self.directory(inside, stat.S_IMODE(st.st_mode))
                elif stat.S_ISREG(st.st_mode):
                    self.file(inside, source.read_bytes(), stat.S_IMODE(st.st_mode))
                # sockets, fifos and device nodes have no place in an image

    def tar(self) -> bytes:
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as out:
            for name in sorted(self._entries):
                info, data = self._entries[name]
                out.addfile(info, io.BytesIO(data) if data is not None else None)
        return raw.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def write_archive(
    out: Path, ref: str, layers: Sequence[bytes], config: ImageConfig, arch: str = "amd64"
) -> str:
    """Write an OCI layout tar for ``ref`` (``name:tag``); returns the manifest digest."""
    if ":" not in ref.rsplit("/", 1)[-1]:
        raise ImageError(f"image reference {ref!r} needs a tag (name:tag)")
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, Any]:
        digest = _digest(data)
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_descs = [blob(gzip.compress(layer, mtime=0), LAYER_MEDIA_TYPE) for layer in layers]
    image_config: dict[str, Any] = {
        "created": EPOCH,
        "architecture": arch,
        "os": "linux",
        "config": {
            "Env": list(config.env),
            "WorkingDir": config.working_dir,
            **({"Entrypoint": list(config.entrypoint)} if config.entrypoint else {}),
            **({"Cmd": list(config.cmd)} if config.cmd else {}),
            **({"Labels": dict(config.labels)} if config.labels else {}),
        },
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer) for layer in layers]},
        "history": [{"created": EPOCH, "created_by": "dra_driver.devcluster.ociimage"}],
    }
    config_desc = blob(json.dumps(image_config, sort_keys=True).encode(), CONFIG_MEDIA_TYPE)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": config_desc,
        "layers": layer_descs,
    }
    manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode(), MANIFEST_MEDIA_TYPE)
    manifest_desc["annotations"] = {
        "io.containerd.image.name": ref,
        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
    }
    manifest_desc["platform"] = {"architecture": arch, "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": INDEX_MEDIA_TYPE, "manifests": [manifest_desc]}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as archive:

        def put(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))

        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in sorted(blobs.items()):
            put(f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
    tmp.replace(out)
    return str(manifest_desc["digest"])


def _pairs(items: Iterable[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        left, sep, right = item.partition("=")
        if not sep or not left or not right:
            raise ImageError(f"{flag} {item!r}: expected SOURCE=TARGET")
        pairs.append((left, right))
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ociimage", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="archive to write")
    parser.add_argument("--ref", required=True, help="image name:tag")
    parser.add_argument("--entrypoint", nargs="+", default=[], help="entry point argv")
    parser.add_argument("--file", action="append", default=[], help="HOST=PATH_IN_IMAGE")
    parser.add_argument("--link", action="append", default=[], help="PATH_IN_IMAGE=TARGET")
    parser.add_argument("--tree", action="append", default=[], help="HOST_DIR=PREFIX")
    args = parser.parse_args(argv)
    try:
        layer = LayerBuilder()
        for source, path in _pairs(args.tree, "--tree"):
            layer.tree(Path(source), path)
        for source, path in _pairs(args.file, "--file"):
            layer.host_file(Path(source), path)
        for path, target in _pairs(args.link, "--link"):
            layer.symlink(path, target)
        digest = write_archive(
            args.out, args.ref, [layer.tar()], ImageConfig(entrypoint=args.entrypoint)
        )
    except ImageError as err:
        print(f"ociimage: {err}", file=sys.stderr)
        return 1
    print(f"{args.out} {args.ref} {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
