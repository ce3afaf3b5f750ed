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

A spare answers the spec it is handed (``SpecTaken``) before it loads the model. One that
does not within ``SPARE_TAKES_WITHIN`` seconds (stopped, hung, or still importing on a
machine far too busy) is killed and the worker starts in a new process instead: a worker
never waits on a stuck spare for its whole ``startupTimeout``. A spare that dies before a
worker takes it is logged, with its exit status.

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

SPARE_TAKES_WITHIN = 10.0
"""Seconds a spare has to answer its spec. Importing torch's compiler takes about 1.6 s
on 2 cores and a spare is handed work once it has started: a new process takes ~10 s to
be ready, so a spare slower than that is no spare."""


@dataclass
class Spare:
    """A started worker process with no spec yet, and the frontend's end of its socket.
    ``relay``: its output relayed (as ``[spare pid N]``) until a worker takes it over."""

    process: asyncio.subprocess.Process
    parent_sock: socket.socket
    relay: asyncio.Task[None] | None = None
    taken: bool = False
    """A worker took it over, or the server discarded it: its exit is not a spare's death."""

    async def hand_over(self) -> None:
        """Stop relaying its output: the worker it becomes relays it under its own name."""
        if self.relay is not None:
            self.relay.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.relay
            self.relay = None

    def discard(self) -> None:
        self.taken = True
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
        if spare.process.returncode is not None:  # it died waiting (logged as it died)
            spare.discard()
            return None
        spare.taken = True
        return spare

    def replenish(self, gpu_id: int | None) -> None:
        """Start a spare for ``gpu_id`` unless one is there (or the server is stopping)."""
        if not self._closed and gpu_id not in self._spares:
            self._spares[gpu_id] = asyncio.ensure_future(self._started(gpu_id))

    async def _started(self, gpu_id: int | None) -> Spare:
        try:
            spare = await self._spawn(gpu_id)
        except Exception as error:  # no spare: workers start as they would without one
            log.warning("no spare worker process for compiled models: %s", error)
            raise
        watch = asyncio.ensure_future(spare.process.wait())
        watch.add_done_callback(lambda _: self._exited(spare, gpu_id))
        return spare

    def _exited(self, spare: Spare, gpu_id: int | None) -> None:
        if spare.taken or self._closed:
            return
        log.warning(
            "spare worker process pid %s (%s) exited with status %s before a worker took "
            "it; the next worker of a compiled model starts in a new process",
            spare.process.pid,
            "CPU" if gpu_id is None else f"GPU {gpu_id}",
            spare.process.returncode,
        )

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
