"""GPU memory and utilisation, read through NVML when ``pynvml`` (nvidia-ml-py) is installed.

The frontend never initialises CUDA (workers own the devices), so it asks the driver
directly. Without NVML or without GPUs this reports nothing.
"""

from __future__ import annotations

import importlib
import math
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
            reading = _read(nvml, index, handle)
            if reading is not None:
                readings.append(reading)
    except Exception:  # NVML failing as a whole (a driver gone): nothing to report
        return readings
    finally:
        nvml.nvmlShutdown()
    return readings


def _read(nvml: ModuleType, index: int, handle: object) -> GpuReading | None:
    """One GPU's reading; None if NVML cannot read its memory. Utilisation NVML cannot
    read (a MIG instance) is NaN, not a made-up 0."""
    try:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception:
        return None
    try:
        utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:
        utilization = math.nan
    return GpuReading(index, int(memory.used), int(memory.total), utilization)


def _visible_handles(nvml: ModuleType, environ: Mapping[str, str]) -> list[object]:
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        # CUDA stops at the first entry it cannot read ("-1" hides every GPU); so do we,
        # and at one NVML cannot resolve (CUDA takes UUID prefixes, NVML whole UUIDs).
        try:
            if entry.isdigit():
                handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
            elif entry.startswith(("GPU-", "MIG-")):
                handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
            else:
                break
        except Exception:
            break
    return handles
