"""Waiting for a wake-up or a moment, whichever comes first, without losing a cancel."""

from __future__ import annotations

import asyncio


async def wake_or_time_out(waiter: asyncio.Future[None], wake_at: float | None, now: float) -> None:
    """Until ``waiter`` is set or the clock reaches ``wake_at`` (None: no limit).

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancel that arrives while the
    waiter is already set and returns as if woken. A batch take cancelled that way (its
    worker died the moment a request woke it) went on as a taker nobody reads: it took
    the next request, which then waited forever. ``asyncio.timeout`` delivers the cancel.
    """
    if wake_at is None:
        await waiter
        return
    try:
        async with asyncio.timeout(max(0.0, wake_at - now)):
            await waiter
    except TimeoutError:
        pass
