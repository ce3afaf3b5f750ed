"""Arrival times for open-loop load, from a seeded random source: Poisson at a fixed mean
rate, on/off bursts, and step changes of rate. Each yields seconds from the start."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence


def poisson_offsets(rate: float, rng: random.Random) -> Iterator[float]:
    """Seconds from the start of each arrival: exponential gaps with mean ``1 / rate``."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        yield offset


def bursty_offsets(rate: float, on_s: float, off_s: float, rng: random.Random) -> Iterator[float]:
    """Poisson at ``rate`` for ``on_s`` seconds, then silence for ``off_s``, repeated: the
    mean rate is ``rate * on_s / (on_s + off_s)``, the peaks ``rate``."""
    if on_s <= 0 or off_s < 0:
        raise ValueError("bursts need a positive on time and a non-negative off time")
    period = on_s + off_s
    for busy in poisson_offsets(rate, rng):  # time counted while on only
        cycles, into = divmod(busy, on_s)
        yield cycles * period + into


def step_offsets(steps: Sequence[tuple[float, float]], rng: random.Random) -> Iterator[float]:
    """Poisson at each ``(rate, seconds)`` step in turn; ends after the last step."""
    start = 0.0
    for rate, seconds in steps:
        if seconds <= 0:
            raise ValueError("each step needs a positive duration")
        for offset in poisson_offsets(rate, rng):
            if offset >= seconds:
                break
            yield start + offset
        start += seconds


def step_of(offset: float, steps: Sequence[tuple[float, float]]) -> int:
    """The index of the step an arrival at ``offset`` seconds belongs to."""
    end = 0.0
    for index, (_, seconds) in enumerate(steps):
        end += seconds
        if offset < end:
            return index
    return len(steps) - 1
