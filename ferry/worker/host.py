"""A worker process that hosts several models: one torch runtime (and, on a GPU, one CUDA
context) under many handlers.

Started by the frontend as ``python -P -m ferry.worker.host --fd N --threads T``. Its
control socket carries one thing: the sockets of the models it is to host, passed as file
descriptors (``SCM_RIGHTS``). Each model's socket is served by a thread of its own
exactly as in a worker of its own (``ferry.worker.main.serve``: its spec first, then its
batches), so the frontend talks to a hosted model as to any worker; the handlers' code,
every model's, runs on one handler thread (``on_the_handler_thread``). Loads run one at a
time, which keeps each model's measured footprint its own and lets a model import files named like a
neighbour's: the modules a load imports from the model's folder are taken out of
``sys.modules`` again (the handler keeps them), so the next model's ``model.py`` is its own.

The process ends when the frontend closes the control socket, when a model's GPU context
fails (every neighbour shares it), or when it is killed: a hung handler cannot be stopped
on its own, so the frontend kills the host and restarts every model it held.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from ferry.wire import log_forward
from ferry.wire.messages import DEVICE_FAILED_EXIT, HOST_READY
from ferry.wire.spec import HandlerSpec, WorkerSpec
from ferry.worker.inbox import Inbox
from ferry.worker.lifetime import die_with_parent, ignore_interrupts
from ferry.worker.main import read_spec, serve
from ferry.worker.torch_setup import configure_torch

log = logging.getLogger("ferry.worker")

_loads = threading.Lock()
_handler_thread = ThreadPoolExecutor(1, thread_name_prefix="handlers")
T = TypeVar("T")


def on_the_handler_thread(work: Callable[[], T]) -> T:
    """Run ``work`` on the one thread that runs every hosted model's handler code.

    Torch's CPU threads are OpenMP teams, one per thread that calls torch: thirty model
    threads made thirty teams, more threads than cores, and GNU OpenMP then stops its
    helpers' short spin between operations, so every operation woke them afresh: a
    ResNet-18 took 19-21 ms instead of 14 on two cores. One handler thread keeps one
    team, as in a worker of its own. The cost: the models of a process run their batches
    one at a time. (Torch's helpers are not moved off this thread's core, as a worker of
    its own does: measured, it made a hosted ResNet-18 slower, 27 ms instead of 18.)"""
    return _handler_thread.submit(work).result()


@contextlib.contextmanager
def loading_alone(spec: HandlerSpec) -> Iterator[None]:
    """One load at a time; the modules it imported from the model's folder are forgotten
    afterwards (and the folder leaves ``sys.path``), so that neighbours with files of the
    same name each import their own. Its installed packages (``package_dirs``) stay
    imported and importable: a package's lazy imports at request time must find it, and
    a native extension cannot be initialised twice in one process."""
    folders = (str(Path(spec.model_dir).resolve()),)
    with _loads:
        try:
            yield
        finally:
            _forget_modules_under(folders)
            sys.path[:] = [p for p in sys.path if str(Path(p).resolve()) not in folders]


def _forget_modules_under(folders: tuple[str, ...]) -> None:
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and str(Path(file).resolve()).startswith(tuple(f + os.sep for f in folders)):
            del sys.modules[name]


def host_model(fd: int) -> None:
    """Serve one model on the socket ``fd`` until the frontend closes it, then let it go."""
    with socket.socket(fileno=fd) as sock:
        inbox = Inbox(sock)
        spec = read_spec(inbox)
        if spec is None:
            return
        status = 0
        with log_forward.source(f"{spec.model.model_name} {spec.worker_id}"), _let_go(spec):
            status = serve(
                sock,
                inbox,
                spec,
                loading=loading_alone(spec.model),
                unload=True,
                handler_thread=on_the_handler_thread,
            )
    if status == DEVICE_FAILED_EXIT:
        # The CUDA context is the whole process's: every model in it is lost.
        log.error("exiting: the GPU context is unusable; every model of this process goes")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(DEVICE_FAILED_EXIT)
    gc.collect()  # the handler and its weights, now that nothing refers to them
    _give_back_freed_memory()


@contextlib.contextmanager
def _let_go(spec: WorkerSpec) -> Iterator[None]:
    """The frontend closed the model's socket while it loaded (scaled away, unregistered):
    its answer has nowhere to go, and the model is done."""
    try:
        yield
    except OSError as error:
        log.info("%s let go while loading (%s)", spec.model.model_name, error)


def _give_back_freed_memory() -> None:
    """Return freed heap to the system (glibc keeps it otherwise) and, on a GPU, the
    cached blocks torch's allocator holds, so an unloaded model's memory is free again."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)


def run_host(control: socket.socket) -> None:
    """Start a thread per model socket that arrives, until the control socket closes."""
    control.sendall(HOST_READY)
    while True:
        message, fds, _, _ = socket.recv_fds(control, 1, 1)
        if not message:
            for fd in fds:
                os.close(fd)
            return
        for fd in fds:
            threading.Thread(target=host_model, args=(fd,), name=f"model-{fd}").start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-worker-host")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent()
    ignore_interrupts()
    log_forward.install(logging.INFO)
    configure_torch(args.threads)
    # What is imported now lives as long as the process: out of the collector's sight, an
    # unloaded model's collection (``host_model``) costs ~1 ms instead of ~66.
    gc.freeze()
    with socket.socket(fileno=args.fd) as control:
        run_host(control)
    # The frontend let go of the host: models still running are being unloaded anyway.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
