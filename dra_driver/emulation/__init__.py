"""Emulated NVIDIA GPU nodes, below the NVML boundary.

Nothing in discovery or preparation knows it runs on emulated hardware: the
NVML C library is replaced by :class:`EmulatedNvmlLibrary` (installed as
``pynvml.nvmlLib``) and ``/sys``, ``/proc``, ``/dev`` and the driver root are a
file tree under a temporary root (:class:`HostPaths`). Profiles are built-in
names (:data:`BUILTIN_PROFILES`) or YAML files; see ``profiles/``.
"""

from dra_driver.emulation.hardware import EmulatedProfile, ProfileError
from dra_driver.emulation.library import EmulatedNvmlLibrary
from dra_driver.emulation.node import EmulatedNode
from dra_driver.emulation.profile import BUILTIN_PROFILES, load_profile

__all__ = [
    "BUILTIN_PROFILES",
    "EmulatedNode",
    "EmulatedNvmlLibrary",
    "EmulatedProfile",
    "ProfileError",
    "load_profile",
]
