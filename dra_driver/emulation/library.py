"""An emulated ``libnvidia-ml.so``: the object ``pynvml`` calls instead of the C library.

``pynvml`` looks every C function up by name on its module-level ``nvmlLib``
and calls it with ctypes arguments (``byref`` out-integers and structs,
``create_string_buffer`` out-strings, opaque handle pointers). This class
answers those calls from an :class:`EmulatedProfile`, filling the ctypes
out-arguments and returning NVML return codes, so every line of ``pynvml`` and
of our discovery runs exactly as on a GPU node. Functions it does not know
behave like symbols missing from an old driver (``NVML_ERROR_FUNCTION_NOT_FOUND``).

Handles are small integers stored in the opaque pointers: the kind in the high
bits, the GPU's profile slot and instance number below. A GPU removed with
:meth:`EmulatedNvmlLibrary.remove_gpu` vanishes from the count and its old
handles answer ``NVML_ERROR_GPU_IS_LOST``, as a GPU that fell off the bus does.

Faults are injected per GPU and C function name (``*`` for every function),
from the profile (``faults:``) or at run time with :meth:`inject_fault`.
Hardware events and state (Xids, ECC errors, recovery actions, a GPU lost or
reset, running processes) are control operations (:mod:`.runtime`), applied
with :meth:`apply` or read from the node's control file.
"""

from __future__ import annotations

from dra_driver.emulation.nvmlcore import LibraryCore
from dra_driver.emulation.nvmldevice import DeviceCalls
from dra_driver.emulation.nvmlhealth import HealthCalls
from dra_driver.emulation.nvmllink import LinkCalls
from dra_driver.emulation.nvmlmig import MigCalls
from dra_driver.emulation.nvmlusage import UsageCalls

__all__ = ["EmulatedNvmlLibrary", "LibraryCore"]


class EmulatedNvmlLibrary(DeviceCalls, MigCalls, HealthCalls, LinkCalls, UsageCalls):
    """Stands in for the loaded NVML shared library; install as ``pynvml.nvmlLib``."""
