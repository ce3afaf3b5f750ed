"""GPU memory and utilisation, read through NVML when ``pynvml`` (nvidia-ml-py) is installed.

The frontend never initialises CUDA (workers own the devices), so it asks the driver
directly. Without NVML or without GPUs this reports nothing.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class GpuReading:
    index: int
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: float


def _nvml() -> ModuleType | None:
    try:
        module = importlib.import_module("pynvml")
        module.nvmlInit()
    except Exception:  # not installed, no driver, no device: nothing to report
        return None
    return module


def read_gpus() -> list[GpuReading]:
    nvml = _nvml()
    if nvml is None:
        return []
    readings = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            readings.append(
                GpuReading(index, int(memory.used), int(memory.total), float(rates.gpu))
            )
    finally:
        nvml.nvmlShutdown()
    return readings
