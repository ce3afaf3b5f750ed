"""The frontend's side of the fork server (``ferry.worker.forks``): CPU workers forked
from one process that has imported torch, instead of each started afresh.

``ForkServer.spawn`` answers a ``ForkedProcess``, which the rest of the frontend uses as
it uses an ``asyncio.subprocess.Process``: its ``pid``, its output (``stdout``), ``wait``
for its exit status and ``kill``. The exit status comes from the fork server, the
worker's parent. If the fork server itself dies, its workers die with it (their parent
death signal) and each is reported ended by ``SIGKILL``; the next spawn starts a new fork
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
from typing import Any

from ferry.worker_handles.output_relay import relay_output
from ferry.worker_handles.spawning import spawn_module

log = logging.getLogger("ferry.workers")

FORK_TIMEOUT = 30.0
"""Seconds the fork server has to answer a request: a fork takes milliseconds."""


class ForkedProcess:
    """A worker forked by the fork server, with the ``asyncio.subprocess.Process`` surface
    the frontend uses."""

    def __init__(self, pid: int, stdout: asyncio.StreamReader) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def ended(self, status: int) -> None:
        if not self._ended.done():
            self.returncode = status
            self._ended.set_result(status)

    def send_signal(self, number: int) -> None:
        if self.returncode is not None:
            raise ProcessLookupError(self.pid)  # as asyncio's: never a reused pid
        os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class ForkServer:
    """Starts the fork server on first use; one per frontend."""

    def __init__(self, environment: dict[str, str]) -> None:
        self.environment = environment
        """The environment the fork server starts with: that of every worker it forks."""
        self._process: asyncio.subprocess.Process | None = None
        self._control: socket.socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._relay: asyncio.Future[None] | None = None
        self._answers: asyncio.Queue[int] = asyncio.Queue()
        self._children: dict[int, ForkedProcess] = {}
        self._early_exits: dict[int, int] = {}
        self._lock = asyncio.Lock()

    async def spawn(self, env: dict[str, str], *args: str) -> tuple[ForkedProcess, socket.socket]:
        """A forked worker and the frontend's end of its socket; ``OSError`` when the fork
        server cannot be started or does not answer."""
        async with self._lock:
            control = await self._started()
            parent_sock, child_sock = socket.socketpair()
            read_fd, write_fd = os.pipe()
            try:
                request = json.dumps({"env": env, "args": list(args)}).encode()
                socket.send_fds(control, [request], [child_sock.fileno(), write_fd])
                pid = await asyncio.wait_for(self._answers.get(), FORK_TIMEOUT)
            except BaseException:
                parent_sock.close()
                os.close(read_fd)
                raise
            finally:
                child_sock.close()
                os.close(write_fd)
            stdout = await _reader_of(read_fd)
            process = ForkedProcess(pid, stdout)
            self._children[pid] = process
            if pid in self._early_exits:
                process.ended(self._early_exits.pop(pid))
            return process, parent_sock

    async def _started(self) -> socket.socket:
        if self._control is not None and self._reader is not None and not self._reader.done():
            return self._control
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = await spawn_module("ferry.worker.forks", theirs, self.environment)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        self._control = ours
        self._answers = asyncio.Queue()
        assert self._process.stdout is not None
        pid = self._process.pid
        self._relay = asyncio.ensure_future(
            relay_output(self._process.stdout, f"[fork server pid {pid}]")
        )
        self._reader = asyncio.ensure_future(self._read(ours))
        log.info("fork server pid %s started: CPU workers are forked from it", pid)
        return ours

    async def _read(self, control: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await loop.sock_recv(control, 65536)
                if not data:
                    break
                message: dict[str, Any] = json.loads(data)
                if "forked" in message:
                    self._answers.put_nowait(int(message["forked"]))
                elif "exited" in message:
                    self._exited(int(message["exited"]), int(message["status"]))
        except (OSError, ValueError) as exc:
            log.warning("fork server connection lost: %s", exc)
        finally:
            self._lost()

    def _exited(self, pid: int, status: int) -> None:
        child = self._children.pop(pid, None)
        if child is None:
            self._early_exits[pid] = status  # ended before its spawn returned
        else:
            child.ended(status)

    def _lost(self) -> None:
        """The fork server ended: its workers die with it (parent death signal)."""
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        for pid, child in list(self._children.items()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            child.ended(-signal.SIGKILL)
        self._children.clear()
        if self._control is not None:
            self._control.close()
        self._control = None

    async def close(self) -> None:
        """End the fork server (and any worker it still has)."""
        if self._reader is not None:  # its pending receive holds the socket open
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._control is not None:
            # shutdown, not only close: the fork server sees the end at once, whatever
            # still refers to this socket (the event loop's poll of it among them).
            with contextlib.suppress(OSError):
                self._control.shutdown(socket.SHUT_RDWR)
            self._control.close()
            self._control = None
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._process.wait(), 10)
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()


async def _reader_of(fd: int) -> asyncio.StreamReader:
    """An ``asyncio.StreamReader`` over the read end of a pipe."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader
