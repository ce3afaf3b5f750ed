"""GPU metrics read through NVML name the GPUs by the server's index."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from ferry.metrics.gpu import GpuReading, read_gpus


class FakeNvml:
    """Four GPUs, told apart by their memory in use (index 0: 100 bytes ... 3: 400)."""

    def __init__(self) -> None:
        self.shut_down = False

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        return {"GPU-aaaa": 2, "MIG-bbbb": 3}[uuid]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=(handle + 1) * 100, total=1000)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=10.0 * handle)

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def _used(readings: list[GpuReading]) -> list[tuple[int, int]]:
    return [(r.index, r.memory_used_bytes) for r in readings]


def test_every_gpu_by_its_index_without_cuda_visible_devices() -> None:
    nvml = FakeNvml()
    readings = read_gpus(nvml, {})  # type: ignore[arg-type]
    assert _used(readings) == [(0, 100), (1, 200), (2, 300), (3, 400)]
    assert nvml.shut_down


def test_the_visible_gpus_in_their_order_by_the_servers_index() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "3,1"}
    assert _used(read_gpus(FakeNvml(), environ)) == [(0, 400), (1, 200)]  # type: ignore[arg-type]
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,MIG-bbbb"}
    assert _used(read_gpus(FakeNvml(), environ)) == [(0, 300), (1, 400)]  # type: ignore[arg-type]
    assert read_gpus(FakeNvml(), {"CUDA_VISIBLE_DEVICES": ""}) == []  # type: ignore[arg-type]


class PartialNvml(FakeNvml):
    """A MIG instance: no utilisation; UUID prefixes unknown to NVML."""

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        if handle == 3:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return super().nvmlDeviceGetUtilizationRates(handle)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        if uuid == "GPU-aa":
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return super().nvmlDeviceGetHandleByUUID(uuid)


def test_what_nvml_cannot_read_is_left_out_not_raised() -> None:
    readings = read_gpus(PartialNvml(), {"CUDA_VISIBLE_DEVICES": "1,MIG-bbbb"})  # type: ignore[arg-type]
    assert _used(readings) == [(0, 200), (1, 400)]
    assert math.isnan(readings[1].utilization_percent)
    # CUDA stops at the first entry it cannot read: "-1" hides every GPU, and so here.
    assert read_gpus(PartialNvml(), {"CUDA_VISIBLE_DEVICES": "-1,0"}) == []  # type: ignore[arg-type]
    # A UUID prefix (CUDA takes them, NVML does not): not read, not raised.
    assert read_gpus(PartialNvml(), {"CUDA_VISIBLE_DEVICES": "0,GPU-aa"}) != []  # type: ignore[arg-type]
