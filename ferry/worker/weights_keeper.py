"""A weights keeper: the process that holds one copy of a model version's weights on one
device and hands it to that version's workers there (``optimization: weights_keeper``).

Started by the frontend (``ferry.worker_handles.weight_keepers``) as ``python -P -m
ferry.worker.weights_keeper --fd N --socket PATH --root DIR [--gpu I]``, with the
environment of the model's workers on that GPU. It runs no handler code and no operator
of the model: it listens on PATH, and for each weights file a worker names (a
``torch.save`` state dict under DIR, the server's work folder: the file the worker would
map on the CPU) it loads the tensors once (``weights_only``), packs them into one
buffer on its device and exports that buffer (``ferry.handlers.builtin.tensor_export``:
CUDA IPC on a GPU, shared memory on the CPU). It says it is listening with one byte on
its frontend socket, and exits when that socket closes, when the frontend dies, or when
a worker reports that it wrote into the copy (``ferry.handlers.builtin.kept_weights``):
then the copy is no longer the file's, and the frontend replaces the workers on it.

CUDA frees exported memory when the exporter exits, so the keeper must outlive its
workers: the frontend stops it only after the version's last worker on the GPU has gone.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.kept_weights import (
    KEEPER_PROTOCOL,
    KeeperError,
    receive_frame,
    send_frame,
)
from ferry.handlers.builtin.tensor_export import TensorExporter, exporter_for, fill, pack
from ferry.wire import log_forward
from ferry.wire.environment import handler_gpu
from ferry.worker.lifetime import die_with_parent, ignore_interrupts

log = logging.getLogger("ferry.worker")

LISTENING = b"L"
"""The byte the keeper sends on its frontend socket once workers can connect."""
COPY_WRITTEN_EXIT = 72
"""The keeper's exit status after a worker wrote into its copy."""


class WeightsKeeper:
    """The copies this keeper holds, by weights file, and the answers that hand them out."""

    def __init__(self, exporter: TensorExporter, root: Path) -> None:
        self._exporter = exporter
        self._root = root.resolve()
        self._copies: dict[Path, tuple[torch.Tensor, list[list[Any]]]] = {}
        self._lock = threading.Lock()

    def answer(self, request: list[Any]) -> tuple[list[Any], list[int]]:
        """The answer to a ``share`` request, with the descriptors to pass along."""
        if len(request) != 3 or request[1] != "share" or not isinstance(request[2], str):
            return [KEEPER_PROTOCOL, "refused", f"not a share request: {request[1:2]}"], []
        try:
            flat, layout = self.copy_of(Path(request[2]))
            handle, fds = self._exporter.export(flat)
        except Exception as exc:  # the worker's load fails with the reason
            log.exception("cannot share %s", request[2])
            return [KEEPER_PROTOCOL, "refused", f"{type(exc).__name__}: {exc}"], []
        return [KEEPER_PROTOCOL, "shared", self._exporter.kind, handle, layout], fds

    def copy_of(self, path: Path) -> tuple[torch.Tensor, list[list[Any]]]:
        """The buffer holding ``path``'s tensors on this keeper's device, loaded once."""
        resolved = path.resolve()
        if not resolved.is_relative_to(self._root):
            raise PermissionError(f"{path} is outside the server's work folder")
        with self._lock:
            if resolved not in self._copies:
                self._copies[resolved] = self._load(resolved)
            return self._copies[resolved]

    def _load(self, path: Path) -> tuple[torch.Tensor, list[list[Any]]]:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(state, dict) or not all(
            isinstance(t, torch.Tensor) for t in state.values()
        ):
            raise ValueError(f"{path.name} is not a state dict of tensors")
        layout, nbytes = pack(state)
        flat = self._exporter.allocate(nbytes)
        fill(flat, layout, state)
        log.info(
            "keeping %s: %d tensors, %.1f MiB on %s",
            path.name,
            len(layout),
            nbytes / 2**20,
            flat.device,
        )
        entries = [[e.name, e.dtype, list(e.shape), e.offset] for e in layout]
        return flat, entries


def serve_worker(keeper: WeightsKeeper, conn: socket.socket) -> None:
    """Answer one worker until it goes; a report of a write ends the keeper."""
    with conn:
        while True:
            try:
                request, fds = receive_frame(conn)
            except (EOFError, OSError, KeeperError, ValueError):
                return
            for fd in fds:  # a worker sends none
                os.close(fd)
            if len(request) > 1 and request[1] == "written":
                log.error(
                    "a worker wrote into the shared weights of %s: exiting, so the model's "
                    "workers come back on a fresh copy",
                    request[2:3],
                )
                _exit(COPY_WRITTEN_EXIT)
            answer, out = keeper.answer(request)  # descriptors the storage keeps open
            try:
                send_frame(conn, answer, out)
            except OSError:
                return


def accept_workers(keeper: WeightsKeeper, listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_worker, args=(keeper, conn), daemon=True).start()


def _exit(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ferry-weights-keeper")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--socket", required=True, help="the Unix socket workers connect to")
    parser.add_argument("--root", required=True, help="the folder weights files must be in")
    parser.add_argument("--gpu", type=int, default=None, help="the GPU (none: the CPU)")
    args = parser.parse_args(argv)
    die_with_parent()
    ignore_interrupts()
    log_forward.install(logging.INFO)
    gpu = handler_gpu(args.gpu, os.environ)
    if gpu is None:
        exporter = exporter_for("cpu")
    else:
        exporter = exporter_for("cuda", torch.device("cuda", gpu))
    keeper = WeightsKeeper(exporter, Path(args.root))
    with socket.socket(fileno=args.fd) as control:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(args.socket)
        listener.listen()
        threading.Thread(target=accept_workers, args=(keeper, listener), daemon=True).start()
        control.sendall(LISTENING)
        while control.recv(1):  # the frontend sends nothing: its end closing stops the keeper
            pass
    _exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
