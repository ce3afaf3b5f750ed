"""Arrival times for open-loop load: a Poisson process at a fixed mean rate."""

from __future__ import annotations

import random
from collections.abc import Iterator


def poisson_offsets(rate: float, rng: random.Random) -> Iterator[float]:
    """Seconds from the start of each arrival: exponential gaps with mean ``1 / rate``."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        yield offset
