"""GPU memory and utilisation, read through NVML when ``pynvml`` (nvidia-ml-py) is installed.

The frontend never initialises CUDA (workers own the devices), so it asks the driver
directly. Without NVML or without GPUs this reports nothing.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
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


def read_gpus(
    nvml: ModuleType | None = None, environ: Mapping[str, str] = os.environ
) -> list[GpuReading]:
    """A reading per GPU the server uses, by the server's index: under a
    ``CUDA_VISIBLE_DEVICES`` of its own, the GPUs it names, in its order (NVML counts every
    GPU of the machine, by its physical index)."""
    nvml = nvml if nvml is not None else _nvml()
    if nvml is None:
        return []
    readings = []
    try:
        for index, handle in enumerate(_visible_handles(nvml, environ)):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            readings.append(
                GpuReading(index, int(memory.used), int(memory.total), float(rates.gpu))
            )
    finally:
        nvml.nvmlShutdown()
    return readings


def _visible_handles(nvml: ModuleType, environ: Mapping[str, str]) -> list[object]:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit():
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
        elif entry:  # GPU-<uuid> or MIG-<uuid>
            handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
        else:
            break  # CUDA stops at the first entry it cannot read
    return handles
