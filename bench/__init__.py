"""Benchmarks (figures in docs/benchmarks.md); none is a test.

Most start our plugin as a host process, which installs NVIDIA's ``nvidia-cdi-hook``
from ``PATH`` at start (the image has it in ``/usr/local/bin``) and prepares nothing
without it. Importing any benchmark puts the hook built from its pinned Go module
(``scripts/build-cdi-hook.sh``, cached) on this process's ``PATH`` first, so every
``python -m bench.<name>`` runs as the tests do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

if shutil.which("nvidia-cdi-hook") is None:
    _built = subprocess.run(
        [str(Path(__file__).resolve().parents[1] / "scripts" / "build-cdi-hook.sh")],
        stdout=subprocess.PIPE, text=True, check=True,
    ).stdout.strip().splitlines()[-1]  # fmt: skip
    os.environ["PATH"] = f"{Path(_built).parent}{os.pathsep}{os.environ.get('PATH', '')}"
