"""Process-wide torch settings: applied by each worker, and by benchmarks that mimic one."""

from __future__ import annotations

from collections.abc import Mapping

GLIBC_MALLOC_SETTINGS = {
    # glibc serves large blocks with mmap and hands freed heap tops back to the OS, so every
    # batch's activation buffers were page-faulted in afresh: ResNet-18 batches on CPU ran
    # ~13% faster once freed memory stays in the heap for the next batch. The cost: a
    # worker keeps up to 1 GiB of freed heap instead of returning it to the OS.
    "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),
    "MALLOC_TRIM_THRESHOLD_": str(2**30),
}


def worker_environment(base: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker process starts with; the user's own values win."""
    return {**GLIBC_MALLOC_SETTINGS, **base, "PYTHONUNBUFFERED": "1"}


def configure_torch(threads: int) -> None:
    """Intra-op threads for this process: a worker's share of the cores."""
    import torch

    torch.set_num_threads(threads)
