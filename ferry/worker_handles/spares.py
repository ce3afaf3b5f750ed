"""Spare worker processes for models that compile as they load.

A worker of such a model that starts after the first (a restart, a scale-up) loads the
graphs the first compiled (``ferry.handlers.builtin.precompile``), but first imports
torch's compiler, Dynamo and Inductor: about 1.6 s on 2 cores, most of what that worker
costs beyond a TorchScript one. So while such a model is served, one process waits
ready: started with ``--preload-compiler``, it imports them, logs that it is ready (its
output relayed as ``[spare pid N]`` until a worker takes it over) and then waits for a
spec on its socket like any new worker. The next worker of a compiling model on that GPU (or on
the CPU) starts in it, and another spare is started once that worker is ready (not
before: on a small machine it would compete with the load).

A spare holds no model: its environment is a worker's before it knows its model (only
the GPU it is bound to matters), which is why it can serve any of them. Workers Ferry
pins to cores (``cpu_pinning``) are started with their cores in their environment, so
they never take a spare. The cost: one idle process per GPU in use (and one for the
CPU), with torch and its compiler in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger("ferry.workers")


@dataclass
class Spare:
    """A started worker process with no spec yet, and the frontend's end of its socket.
    ``relay``: its output relayed (as ``[spare pid N]``) until a worker takes it over."""

    process: asyncio.subprocess.Process
    parent_sock: socket.socket
    relay: asyncio.Task[None] | None = None

    async def hand_over(self) -> None:
        """Stop relaying its output: the worker it becomes relays it under its own name."""
        if self.relay is not None:
            self.relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.relay
            self.relay = None

    def discard(self) -> None:
        if self.relay is not None:
            self.relay.cancel()
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.parent_sock.close()


SpareSpawner = Callable[[int | None], Awaitable[Spare]]
"""Starts a spare bound to a GPU (None: the CPU)."""


class SpareProcesses:
    """At most one spare per GPU (None: the CPU), started on request, taken once."""

    def __init__(self, spawn: SpareSpawner) -> None:
        self._spawn = spawn
        self._spares: dict[int | None, asyncio.Task[Spare]] = {}
        self._closed = False

    def take(self, gpu_id: int | None) -> Spare | None:
        """The spare for ``gpu_id``, if one has started and is alive (it may still be
        importing: the worker's handshake waits for it); None otherwise."""
        task = self._spares.get(gpu_id)
        if task is None or not task.done():  # still spawning: it waits for the next
            return None
        del self._spares[gpu_id]
        if task.exception() is not None:
            return None
        spare = task.result()
        if spare.process.returncode is not None:  # it died waiting
            spare.discard()
            return None
        return spare

    def replenish(self, gpu_id: int | None) -> None:
        """Start a spare for ``gpu_id`` unless one is there (or the server is stopping)."""
        if not self._closed and gpu_id not in self._spares:
            self._spares[gpu_id] = asyncio.ensure_future(self._started(gpu_id))

    async def _started(self, gpu_id: int | None) -> Spare:
        try:
            return await self._spawn(gpu_id)
        except Exception as error:  # no spare: workers start as they would without one
            log.warning("no spare worker process for compiled models: %s", error)
            raise

    async def close(self) -> None:
        """Stop every spare (a server's shutdown)."""
        self._closed = True
        tasks = list(self._spares.values())
        self._spares.clear()
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, Spare):
                outcome.discard()
                await outcome.process.wait()
