"""Compile a tree's package to bytecode, as ``pip install`` does in the plugin image.

The image installs the wheel, and pip writes ``.pyc`` files at install time (also
under ``PYTHONDONTWRITEBYTECODE=1``, which the image sets and this machine's
environment sets too). A benchmark that starts the daemon from a source tree in
such an environment would otherwise compile every module on every start: ~140 ms
of the start to the registration socket that no installed plugin pays. The
files go to ``__pycache__`` next to the sources (ignored by git).
"""

from __future__ import annotations

import compileall
from pathlib import Path


def compile_package(tree: Path) -> None:
    """Write up-to-date bytecode for ``tree/dra_driver``; raises if a module fails."""
    if not compileall.compile_dir(tree / "dra_driver", quiet=1, workers=1):
        raise SystemExit(f"{tree}: compileall failed")
