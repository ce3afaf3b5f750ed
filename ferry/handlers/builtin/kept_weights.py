"""A worker's side of a weights keeper: its model's weights imported from the one copy a
keeper process holds on the worker's device (``ferry.worker.weights_keeper``).

On a GPU each worker is a process with its own CUDA context, and until now each put its
own copy of the weights in GPU memory. With ``optimization: weights_keeper`` the model's
workers on one GPU import one copy instead, by CUDA IPC, from a keeper: a small process
per (model version, GPU) that runs no handler code. The copy is the keeper's, so a worker
that crashes or meets a sticky CUDA error takes nothing with it; its replacement imports
the same copy (docs/architecture.md, "One copy of the weights").

The protocol, over the keeper's Unix socket: frames of msgpack behind a 4-byte length,
file descriptors (the CPU stand-in's shared memory) passed beside the frame::

    worker -> keeper   [1, "share", PATH]        the weights file (a torch.save state dict
                                                 the CPU path maps) wanted on the device
    keeper -> worker   [1, "shared", KIND, HANDLE, [[NAME, DTYPE, SHAPE, OFFSET], ...]]
                       [1, "refused", MESSAGE]
    worker -> keeper   [1, "written", PATH]      a handler wrote into the copy: the keeper
                                                 exits, and its workers are replaced

Weights are read-only to workers, and a write fails loudly: the imported memory is the
keeper's, so a write would reach every worker (and a private copy per worker on the GPU
would be the memory this saves). Each worker notes its shared tensors' version counters
(bumped by every in-place operation torch sees) and checks them after its load and each
batch (``written``); a write ends the worker (its batch unanswered, as a crash) and the
keeper, whose copy is no longer the file's, and the model's workers come back on a fresh
copy. A write torch does not count (through ``.data``, ``numpy()`` or a raw pointer)
goes unseen.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import torch

from ferry.handlers.builtin.tensor_export import KeptTensor, exporter_for, views

log = logging.getLogger("ferry.worker")

KEEPER_PROTOCOL = 1
HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 28
MAX_FDS = 4


class KeeperError(Exception):
    """The keeper refused, broke the protocol, or went away."""


def send_frame(sock: socket.socket, document: list[Any], fds: list[int] | None = None) -> None:
    payload: bytes = msgpack.packb(document, use_bin_type=True)
    data = HEADER.pack(len(payload)) + payload
    sent = socket.send_fds(sock, [data], fds) if fds else 0
    sock.sendall(data[sent:])


def receive_frame(sock: socket.socket) -> tuple[list[Any], list[int]]:
    """The next frame and the descriptors that came with it; ``EOFError`` at the end."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, MAX_FDS)
    if not data:
        raise EOFError("the peer closed its socket")
    while len(data) < HEADER.size:
        data += _more(sock)
    (length,) = HEADER.unpack(data[: HEADER.size])
    if length > MAX_FRAME:
        raise KeeperError(f"frame of {length} bytes exceeds the limit")
    while len(data) < HEADER.size + length:
        data += _more(sock)
    document = msgpack.unpackb(data[HEADER.size : HEADER.size + length], raw=False)
    if not isinstance(document, list) or not document or document[0] != KEEPER_PROTOCOL:
        raise KeeperError(f"not a frame of the keeper's protocol {KEEPER_PROTOCOL}")
    return document, list(fds)


def _more(sock: socket.socket) -> bytes:
    chunk = sock.recv(1 << 20)
    if not chunk:
        raise EOFError("the peer closed its socket mid-frame")
    return chunk


@dataclass
class _Watched:
    path: str
    tensors: list[tuple[torch.Tensor, int]] = field(default_factory=list)


class KeeperClient:
    """One worker's connection to its keeper, open while the worker lives."""

    def __init__(self, address: str, kind: str) -> None:
        self.address = address
        self.kind = kind
        """The device type of the keeper's copy: ``cuda``, or ``cpu`` for the stand-in."""
        self._sock: socket.socket | None = None
        self._watched: list[_Watched] = []

    def close(self) -> None:
        """End the connection (a worker keeps its own open while it lives)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connection(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.address)
            except OSError as exc:
                sock.close()
                raise KeeperError(
                    f"cannot reach the weights keeper at {self.address}: {exc}"
                ) from exc
            self._sock = sock
        return self._sock

    def share(self, path: Path) -> tuple[dict[str, torch.Tensor], int]:
        """The keeper's copy of the state dict in ``path``: the tensors (views of one
        imported buffer) and that buffer's size."""
        sock = self._connection()
        try:
            send_frame(sock, [KEEPER_PROTOCOL, "share", str(path)])
            answer, fds = receive_frame(sock)
        except (OSError, EOFError, ValueError) as exc:
            raise KeeperError(f"the weights keeper went away: {exc}") from exc
        if answer[1] != "shared":
            raise KeeperError(f"the weights keeper refused {path.name}: {answer[2:]}")
        kind, handle, entries = answer[2], answer[3], answer[4]
        if kind != self.kind:
            for fd in fds:
                os.close(fd)
            raise KeeperError(f"the weights keeper holds its copy on {kind}, not {self.kind}")
        flat = exporter_for(kind).import_flat(handle, fds)
        layout = [KeptTensor(name, dtype, tuple(shape), at) for name, dtype, shape, at in entries]
        tensors = dict(zip((entry.name for entry in layout), views(flat, layout), strict=True))
        return tensors, flat.numel()

    def watch(self, path: Path, tensors: list[torch.Tensor]) -> None:
        """Note these tensors (the module's own, over the imported copy) as they are now."""
        self._watched.append(_Watched(str(path), [(t, t._version) for t in tensors]))

    def written(self) -> str | None:
        """The file whose shared copy a watched tensor was written into since, if any."""
        for watched in self._watched:
            if any(tensor._version != version for tensor, version in watched.tensors):
                return watched.path
        return None

    def report_written(self, path: str) -> None:
        """Tell the keeper its copy is spoilt (it exits); quietly if it is gone already."""
        with contextlib.suppress(OSError, KeeperError):
            send_frame(self._connection(), [KEEPER_PROTOCOL, "written", path])


_client: KeeperClient | None = None
"""This worker's keeper, if its spec names one (``use_keeper``)."""


def use_keeper(address: str, kind: str) -> None:
    """Take the weights of this process's loads on ``kind`` (``cuda``, ``cpu``) from the
    keeper at ``address`` ("": none)."""
    global _client
    _client = KeeperClient(address, kind) if address else None


def keeper() -> KeeperClient | None:
    return _client


def written_weights() -> str | None:
    """The weights file whose shared copy this worker wrote into, or None."""
    return _client.written() if _client is not None else None


def report_written(path: str) -> None:
    if _client is not None:
        _client.report_written(path)
