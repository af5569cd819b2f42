"""NVML return codes and the one exception type our NVML adapter raises."""

from __future__ import annotations

# NVML return codes discovery distinguishes (nvml.h).
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NvmlError(Exception):
    """An NVML call failed; ``code`` is the NVML return code, ``function`` the wrapper called."""

    def __init__(self, function: str, code: int, message: str) -> None:
        super().__init__(f"{function}: {message} (NVML error {code})")
        self.function = function
        self.code = code

    @property
    def not_supported(self) -> bool:
        """The GPU or driver lacks the feature: an absent value, not a fault."""
        return self.code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)

    @property
    def insufficient_resources(self) -> bool:
        """A MIG placement is taken (or the profile's instance count is reached)."""
        return self.code == NVML_ERROR_INSUFFICIENT_RESOURCES

    @property
    def gpu_lost(self) -> bool:
        return self.code == NVML_ERROR_GPU_IS_LOST
