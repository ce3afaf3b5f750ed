"""What loading a model costs its process: measured around the load, not guessed.

The process's own resident memory from ``/proc`` (anonymous and shared-memory pages:
what it alone holds) and, on a GPU, the memory torch's allocator holds; both as the
difference across the load. Weights mapped from a file (``shared_weights``) are the
page cache's, shared with the model's other workers: they are reported apart, by file,
so the model's footprint counts them once. In a process
that hosts several models (``ferry.worker.host``) the loads run one at a time, so the
difference is this model's, give or take what its neighbours allocate meanwhile.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ferry.handlers.builtin.shared_weights import KEPT_PREFIX, mapped_weights


def _gpu_allocated() -> int:
    """Bytes torch's CUDA allocator holds, 0 when CUDA is not in use (never initialises it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.memory_allocated())


def resident_pages(status: Path = Path("/proc/self/status")) -> tuple[int, int]:
    """This process's anonymous and shared-memory resident bytes (``RssAnon``,
    ``RssShmem``); zeros when they cannot be read."""
    anon = shmem = 0
    try:
        for line in status.read_text().splitlines():
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssShmem:"):
                shmem = int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        return 0, 0
    return anon, shmem


def own_resident_bytes(status: Path = Path("/proc/self/status")) -> int:
    """This process's anonymous and shared-memory resident pages (``RssAnon`` +
    ``RssShmem``): its resident memory less the files it maps (libraries, weights)."""
    return sum(resident_pages(status))


@dataclass(frozen=True)
class Footprint:
    resident_bytes: int
    gpu_bytes: int
    shared_bytes: int = 0
    """The weights files the load mapped (their size: a served model reads every page)."""
    shared_key: str = ""


class FootprintMeter:
    """``FootprintMeter()`` before the load, ``.measured()`` after it."""

    def __init__(self, status: Path = Path("/proc/self/status")) -> None:
        self._status = status
        self._anon, self._shmem = resident_pages(status)
        self._gpu = _gpu_allocated()
        self._mapped = {weights.path for weights in mapped_weights()}

    def measured(self) -> Footprint:
        """What the load added. A CPU weights keeper's copy (shared memory) is the
        keeper's: the shared-memory pages the load touched count as this process's only
        beyond its size."""
        mapped = [weights for weights in mapped_weights() if weights.path not in self._mapped]
        kept = sum(w.size for w in mapped if w.path.startswith(f"{KEPT_PREFIX}cpu:"))
        anon, shmem = resident_pages(self._status)
        own = (anon - self._anon) + max(0, shmem - self._shmem - kept)
        return Footprint(
            max(0, own),
            max(0, _gpu_allocated() - self._gpu),
            sum(weights.size for weights in mapped),
            "|".join(sorted(weights.path for weights in mapped)),
        )
