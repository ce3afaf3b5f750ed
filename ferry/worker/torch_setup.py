"""Process-wide torch settings: applied by each worker, and by benchmarks that mimic one."""

from __future__ import annotations


def configure_torch(threads: int) -> None:
    """Intra-op threads for this process: a worker's share of the cores."""
    import torch

    torch.set_num_threads(threads)
