"""YAML documents read the one way the daemon and the emulation both want.

PyYAML is imported on first use, not with this module: the daemon's in-cluster
config and JSON kubeconfigs never need it (~20 ms of the start to the socket).
"""

from __future__ import annotations

from typing import Any


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with libyaml's loader where PyYAML was built with it (~15x
    faster than the pure one), else the pure one. Raises ``yaml.YAMLError``."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
