"""Device capabilities: frozen models, lazy probes and named profiles."""

from .models import DeviceCapabilities, GridLimits, Toolchain, Vendor
from .probe import clear_cache, interpreter_enabled, probe, toolchain
from .profiles import PROFILES, profile

__all__ = [
    "DeviceCapabilities", "GridLimits", "Toolchain", "Vendor", "PROFILES", "profile", "probe",
    "toolchain", "interpreter_enabled", "clear_cache",
]
