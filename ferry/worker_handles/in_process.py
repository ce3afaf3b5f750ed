"""A worker in the frontend's own process, on a thread of its own: a Ray replica's, when
its user does not need process isolation (``ray_handler_in_replica``).

The thread speaks the worker protocol over a socket pair exactly as a worker process does
(``ferry.worker.main.serve``), so queues, batch policies, deadlines, cancellation and
restarts are the same; what goes is a process hop per batch (and a process per replica).
What goes with it is isolation:

- A crash in the handler (a segfault, an ``os._exit``) ends the replica's process; Ray
  starts another.
- A thread cannot be stopped: a worker killed while its handler still runs (a hung
  batch, past its response timeout) ends the process ``KILL_GRACE_S`` later, once the
  service has answered what it held; Ray starts another replica.
- A GPU context the handler broke ends the process too (it is the process's).

The thread's side is ``ferry.worker.in_thread.run_worker``, handed in by whoever wires
workers (``ferry.apis``): this side only speaks the protocol, as for a process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.connection import WorkerConnection, raise_start_failure
from ferry.worker_handles.handle import WorkerInfo

log = logging.getLogger("ferry.worker")

KILL_GRACE_S = 5.0
"""How long a killed worker's thread may take to finish its batch before the process
ends instead (the service answers the batch's requests meanwhile)."""
HUNG_EXIT = 70
"""The process's exit status when a killed worker's handler did not return."""

ThreadBody = Callable[[socket.socket, Callable[[int], None], Callable[[int], None]], None]
"""The worker's life on its thread: its socket, a callback for its exit status, and how
to end the process (``ferry.worker.in_thread.run_worker``)."""


def exit_process(status: int) -> None:
    """End this process now: what a killed worker whose thread cannot stop comes to."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


class InProcessWorker(WorkerConnection):
    """One worker on a thread of this process; a ``WorkerHandle``."""

    def __init__(
        self,
        spec: WorkerSpec,
        thread: threading.Thread,
        exited: asyncio.Future[Any],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        grace_s: float,
        end_process: Callable[[int], None],
    ) -> None:
        super().__init__(spec, os.getpid(), reader, writer)
        self.thread = thread
        self.exited = exited
        self._grace_s = grace_s
        self._end_process = end_process
        self._killed = False

    @property
    def info(self) -> WorkerInfo:
        return self.worker_info()

    @classmethod
    async def start(
        cls,
        spec: WorkerSpec,
        startup_timeout: float,
        *,
        run: ThreadBody,
        grace_s: float = KILL_GRACE_S,
        end_process: Callable[[int], None] = exit_process,
    ) -> InProcessWorker:
        """Start the thread (``run``), send it its spec, and wait until it has loaded its
        handler. Raises ``WorkerStartFailed``, as a worker process's start does."""
        front, back = socket.socketpair()
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[Any] = loop.create_future()

        def on_exit(status: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, exited, status)

        thread = threading.Thread(
            target=run,
            args=(back, on_exit, end_process),
            name=f"worker {spec.model.model_name} {spec.worker_id}",
            daemon=True,  # a hung handler must not keep the process from ending
        )
        thread.start()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=front)
        except BaseException:
            front.close()  # the thread, still waiting for its spec, ends
            raise
        worker = cls(spec, thread, exited, reader, writer, grace_s, end_process)
        try:
            await asyncio.wait_for(worker._handshake(spec), startup_timeout)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                # Not wanted any more (its replica stops): its thread finishes the load,
                # finds the socket closed and ends.
                worker.let_go()
            else:
                worker.kill()
            raise_start_failure(exc)
        return worker

    def let_go(self) -> None:
        """Close its socket; its thread ends once it is done with what it runs."""
        self._writer.close()

    def kill(self) -> None:
        """Close its socket: the thread ends once its handler returns. If it has not
        within the grace period, the handler hangs, and the process ends."""
        self.let_go()
        if self._killed or self.exited.done():
            return
        self._killed = True
        asyncio.get_running_loop().call_later(self._grace_s, self._end_if_still_running)

    def _end_if_still_running(self) -> None:
        if self.exited.done():
            return
        log.error(
            "%s %s: its handler did not return %.0f s after the worker was stopped; "
            "ending this process (a thread cannot be stopped), Ray starts another replica",
            self.spec.model.model_name,
            self.spec.worker_id,
            self._grace_s,
        )
        self._end_process(HUNG_EXIT)


def _settle(exited: asyncio.Future[Any], status: int) -> None:
    if not exited.done():
        exited.set_result(status)
