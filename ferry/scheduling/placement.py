"""Which GPUs a model's workers use: worker ``i`` of a model gets ``gpus[i % len(gpus)]``.

Without ``deviceIds`` each model starts where the previous one left off, so models with one
worker each spread over the GPUs (TorchServe hands GPUs out round-robin across all workers
the same way) instead of piling onto GPU 0.
"""

from __future__ import annotations

import logging

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


def model_gpu_count(usable: int, device_type: str | None, device_ids: tuple[int, ...]) -> int:
    """How many GPUs ``model_gpus`` gives the model (it alone says whether ids are valid).

    >>> model_gpu_count(8, None, ()), model_gpu_count(8, None, (1,)), model_gpu_count(8, "cpu", ())
    (8, 1, 0)
    """
    if device_type == "cpu" or usable == 0:
        return 0
    return len(device_ids) if device_ids else usable


def worker_gpu(gpus: tuple[int, ...], worker_index: int) -> int | None:
    """The GPU of a model's ``worker_index``-th worker (None: CPU)."""
    return gpus[worker_index % len(gpus)] if gpus else None
