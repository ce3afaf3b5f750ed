"""What ``sweep`` and ``tune`` print as each measurement ends: the point, and the time left."""

from __future__ import annotations

import time
from typing import Any


class Eta:
    """Elapsed time and the time left, from the measurements done so far."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.start = time.monotonic()
        self.done = 0

    def step(self) -> str:
        self.done += 1
        elapsed = time.monotonic() - self.start
        left = elapsed / self.done * max(0, self.total - self.done)
        return f"{_clock(elapsed)} elapsed, at most {_clock(left)} left"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def row_line(row: dict[str, Any]) -> str:
    label = (
        f"batch {row['Batch size']} delay {row['Batch delay']} workers {row['Workers']} "
        f"{row['Precision']} c{row['Concurrency']}"
    )
    if row.get("Error"):
        return f"{label}: failed: {row['Error']}"
    return f"{label}: {row['Throughput']} req/s, p99 {row['Latency P99']} ms"
