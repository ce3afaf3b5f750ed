"""What loading a model costs its process: measured around the load, not guessed.

Resident memory from ``/proc`` (what the kernel charges the process) and, on a GPU, the
memory torch's allocator holds; both as the difference across the load. In a process
that hosts several models (``ferry.worker.host``) the loads run one at a time, so the
difference is this model's, give or take what its neighbours allocate meanwhile.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ferry.procinfo import resident_bytes


def _gpu_allocated() -> int:
    """Bytes torch's CUDA allocator holds, 0 when CUDA is not in use (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.memory_allocated())


@dataclass(frozen=True)
class Footprint:
    resident_bytes: int
    gpu_bytes: int


class FootprintMeter:
    """``FootprintMeter()`` before the load, ``.measured()`` after it."""

    def __init__(self) -> None:
        self._rss = resident_bytes(os.getpid())
        self._gpu = _gpu_allocated()

    def measured(self) -> Footprint:
        rss = resident_bytes(os.getpid()) - self._rss
        return Footprint(max(0, rss), max(0, _gpu_allocated() - self._gpu))
