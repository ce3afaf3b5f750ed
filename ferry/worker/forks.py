"""The fork server: one process that has imported torch and the worker's code, and forks
CPU workers from itself (the ``fork_workers`` setting; the frontend's side is
``ferry.worker_handles.fork_server``).

A worker started with ``exec`` imports Python and torch afresh: about 2.5 s on 2 cores and
155 MB of memory of its own, for every worker. A forked one shares those pages with the
fork server, copy on write: about 20 MB of its own, measured on this machine
(benchmarks/results/shared_weights.md), and a scale-up's worker is ready in 0.13 s. With
the weights mapped (``ferry.handlers.builtin.shared_weights``), a model's second worker
then costs little more than its own activations.

The fork server never runs a torch operator, never starts a thread, and never touches a
GPU, so a fork copies no thread pool, no lock held by another thread, no CUDA context.
Only CPU workers Ferry does not pin to cores are forked: pinning and GPU binding are read
from the environment when the libraries load, which for a forked worker was before it
knew its cores or its GPU.

Its control socket (``SOCK_SEQPACKET``) carries, one JSON message each way per event:
``{"env": {...}, "args": [...]}`` with two descriptors (the worker's socket, the write end
of its output pipe) asks for a worker; ``{"forked": pid}`` answers it, and
``{"exited": pid, "status": returncode}`` says a worker ended (a signal as its negative
number, as ``subprocess`` does). The fork server ends when the frontend closes the
socket, killing the workers still running; the workers also die with it (their parent).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import selectors
import signal
import socket
import sys
from typing import Any

MAX_MESSAGE = 1 << 20


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


class ForkServer:
    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.children: set[int] = set()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)

    def serve(self) -> None:
        """Fork on request, report exits, until the frontend closes the socket."""
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the fd
        selector = selectors.DefaultSelector()
        selector.register(self.control, selectors.EVENT_READ)
        selector.register(self.wake_read, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self.control:
                        if not self._request():
                            return
                    else:
                        os.read(self.wake_read, 4096)
                self._reap()
        finally:
            for pid in self.children:
                _kill(pid)

    def _request(self) -> bool:
        """One request answered; False once the frontend is gone."""
        try:
            data, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE, 2)
        except OSError:
            return False
        if not data:
            return False
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            self._become_worker(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        self._send({"forked": pid})
        return True

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self._send({"exited": pid, "status": _returncode(status)})

    def _send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # the frontend is gone: the next read ends the loop
            self.control.send(json.dumps(message).encode())

    def _become_worker(self, request: dict[str, Any], fds: list[int]) -> None:
        worker_sock, output = fds
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.control.close()
        os.close(self.wake_read)
        os.close(self.wake_write)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        for fd in (null, output):
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        random.seed()  # a spawned process seeds from the OS: so does each fork
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        status = 1
        try:
            from ferry.worker.main import main

            status = main(["--fd", str(worker_sock), *request["args"]])
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # a worker's crash, reported as a spawned one's would be
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-fork-server")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    from ferry.worker.lifetime import die_with_parent, ignore_interrupts

    die_with_parent()
    ignore_interrupts()
    # What every worker imports before it knows its model: shared with each fork.
    import torch  # noqa: F401

    import ferry.worker.main  # noqa: F401

    # Out of the collector's sight: a fork's collections would otherwise write to (and so
    # copy) every page of these objects.
    gc.freeze()
    control = socket.socket(fileno=args.fd)
    ForkServer(control).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
