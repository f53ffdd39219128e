"""Hardware descriptions as data: named presets and JSON files written by calibration."""

from kvsim.hardware.spec import HardwareSpec, load_hardware

__all__ = ["HardwareSpec", "load_hardware"]
