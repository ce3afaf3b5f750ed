"""Process-wide torch settings: applied by each worker, and by benchmarks that mimic one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def worker_torch_mode(threads: int, gpu_id: int | None) -> Iterator[None]:
    """Thread count and TorchScript execution mode for a worker's whole life.

    On CPU, TorchScript's profiling executor re-optimises a graph for the first input shapes
    it sees, and that specialised graph ran 10-20% slower than the plain one for ResNet-18
    on our 2-core machines (whichever batch size it specialised for), so CPU workers run
    graphs as written. GPU workers keep torch's default, where its fusers pay.
    """
    import torch

    torch.set_num_threads(threads)
    with torch.jit.optimized_execution(gpu_id is not None):  # type: ignore[attr-defined]
        yield
