"""Compile a tree's package to bytecode, as the plugin image has it.

The image installs the wheel, and pip writes ``.pyc`` files at install time (also
under ``PYTHONDONTWRITEBYTECODE=1``, which the image sets and this machine's
environment sets too); the Dockerfile then compiles optimized bytecode for all
of site-packages and runs the plugin with ``PYTHONOPTIMIZE=2`` (:data:`PLUGIN_ENV`).
A benchmark that starts the daemon from a source tree in such an environment
would otherwise compile every module on every start: ~140 ms of the start to the
registration socket that no installed plugin pays. The files go to
``__pycache__`` next to the sources (ignored by git) and, optimized, next to the
interpreter's libraries (once; later calls find them up to date).
"""

from __future__ import annotations

import compileall
import importlib.util
import re
import sysconfig
from pathlib import Path

from dra_driver.demo.pluginimage import NOT_COMPILED

PLUGIN_ENV = {"PYTHONOPTIMIZE": "2"}
"""What the image's ``ENV`` sets for the plugin's interpreter (Dockerfile); benches
that start our daemon start it with this."""
_DAEMON_LIBRARIES = ("grpc", "google.protobuf", "pynvml", "yaml")
_TESTS = re.compile(NOT_COMPILED)


def compile_package(tree: Path) -> None:
    """Write up-to-date bytecode for ``tree/dra_driver`` (plain and optimized) and
    optimized bytecode for the libraries it imports; raises if a module fails."""
    if not compileall.compile_dir(tree / "dra_driver", quiet=1, workers=1, optimize=[0, 2]):
        raise SystemExit(f"{tree}: compileall failed")
    for lib in _libraries():
        if lib.is_dir():
            compileall.compile_dir(lib, quiet=2, workers=0, optimize=2, rx=_TESTS)
        else:
            compileall.compile_file(lib, quiet=2, optimize=2)


def _libraries() -> list[Path]:
    """The standard library and the third-party packages the daemon imports."""
    found = [Path(sysconfig.get_paths()["stdlib"])]
    for name in _DAEMON_LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        if spec.submodule_search_locations:
            found += [Path(p) for p in spec.submodule_search_locations]
        elif spec.origin:
            found.append(Path(spec.origin))
    return found
