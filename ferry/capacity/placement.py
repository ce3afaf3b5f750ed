"""Which GPUs a model's workers use: worker ``i`` of a model gets ``gpus[i % len(gpus)]``.

Without ``deviceIds`` each model starts where the previous one left off, so models with one
worker each spread over the GPUs (TorchServe hands GPUs out round-robin across all workers
the same way) instead of piling onto GPU 0.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ferry.errors import ConfigError

log = logging.getLogger("ferry.scheduling")


def model_gpus(
    usable: int, device_type: str | None, device_ids: tuple[int, ...], first: int
) -> tuple[int, ...]:
    """The GPU ids a model's workers take in turn; () means CPU.

    ``usable`` is the number of visible GPUs Ferry may use (``number_of_gpu`` caps it);
    ``first`` is where round-robin placement starts for this model.
    """
    if device_type == "cpu":
        return ()
    if usable == 0:
        if device_type == "gpu" or device_ids:
            log.warning("the model asks for a GPU but none is usable; its workers run on CPU")
        return ()
    if device_ids:
        outside = [gpu for gpu in device_ids if not 0 <= gpu < usable]
        if outside:
            raise ConfigError(
                f"deviceIds {outside} are not usable GPUs (ids 0 to {usable - 1} are)"
            )
        return device_ids
    return tuple((first + offset) % usable for offset in range(usable))


def least_committed_gpu(usable: int, committed: Mapping[str, int], after: int) -> int:
    """The GPU to start a model's workers on: the one whose models hold the least memory
    (``committed``, bytes by ``cuda:N``: what each measured at its load, an estimate before
    one), ties going round-robin from ``after`` (the GPU after the last model's).

    >>> least_committed_gpu(3, {"cuda:0": 5, "cuda:1": 2, "cuda:2": 9}, 0)
    1
    >>> least_committed_gpu(3, {}, 2)
    2
    """
    order = [(after + offset) % usable for offset in range(usable)]
    return min(order, key=lambda gpu: committed.get(f"cuda:{gpu}", 0))


def model_gpu_count(usable: int, device_type: str | None, device_ids: tuple[int, ...]) -> int:
    """How many GPUs ``model_gpus`` gives the model (it alone says whether ids are valid).

    >>> model_gpu_count(8, None, ()), model_gpu_count(8, None, (1,)), model_gpu_count(8, "cpu", ())
    (8, 1, 0)
    """
    if device_type == "cpu" or usable == 0:
        return 0
    return len(device_ids) if device_ids else usable


def gpu_memory_refusal(
    gpu_ids: tuple[int, ...], workers: int, weights_bytes: int, free_bytes: Mapping[int, int]
) -> str | None:
    """Why a model's ``workers`` cannot fit on their GPUs, or None: each worker needs at
    least its weights (``weights_bytes``, the serialized file), which a GPU with less free
    memory (``free_bytes``, by the server's index; GPUs missing there are not checked)
    cannot hold. A lower bound only: activations come on top.

    >>> gpu_memory_refusal((0, 1), 3, 2 << 30, {0: 3 << 30, 1: 8 << 30})
    '2 workers need at least 4.0 GiB on GPU 0 for their weights; it has 3.0 GiB free'
    >>> gpu_memory_refusal((0, 1), 2, 2 << 30, {0: 3 << 30, 1: 8 << 30})
    """
    needed: dict[int, int] = {}
    for index in range(workers):
        gpu = worker_gpu(gpu_ids, index)
        if gpu is not None:
            needed[gpu] = needed.get(gpu, 0) + 1
    for gpu, count in needed.items():
        free = free_bytes.get(gpu)
        if free is not None and count * weights_bytes > free:
            return (
                f"{count} worker{'s need' if count > 1 else ' needs'} at least "
                f"{count * weights_bytes / 2**30:.1f} GiB on GPU {gpu} for their weights; "
                f"it has {free / 2**30:.1f} GiB free"
            )
    return None


def worker_gpu(gpus: tuple[int, ...], worker_index: int) -> int | None:
    """The GPU of a model's ``worker_index``-th worker (None: CPU)."""
    return gpus[worker_index % len(gpus)] if gpus else None
