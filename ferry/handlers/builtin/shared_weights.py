"""One copy of a model's weights per machine on the CPU, however many workers serve it.

Each worker is a process of its own, and until now each held its own copy of the model's
weights: N workers of a 400 MB model cost N x 400 MB (TorchServe's and Triton's answer
too). Here a worker's parameters and buffers are tensors over a *file mapping* of the
weights (``torch.load(mmap=True)``): the pages are the kernel's page cache of that file,
read once from disk and shared by every process that maps it, so the model's workers
hold one copy between them (docs/architecture.md, "One copy of the weights").

Which file is mapped:

- An eager model (``modelFile`` + a state dict saved by ``torch.save``): the state dict
  itself, where the server unpacked it (its own work folder, never written to while
  served). The module is built on torch's ``meta`` device (no memory, no random
  initialisation) and given the mapped tensors (``load_state_dict(assign=True)``); a
  model of the store given as a folder, whose files the operator may rewrite in place,
  gets a copy in the model's shared folder first.
- TorchScript: the first worker of a model splits the file once, into the model's
  shared folder: its weights (a ``torch.save`` file) and its code with empty weights.
  Every worker loads that small skeleton and hands it the mapped weights.
- A ``torch.export`` program: loaded as before, then its state dict moves onto a mapped
  file the first worker wrote (memory at the load is unchanged; what stays is shared).

Where a model cannot be given mapped weights exactly (a module whose construction needs
real tensors, a state dict whose dtypes differ from the module's, a legacy pickle file,
a TorchScript module whose weights are folded into its code), it loads as before, and
nothing is shared: never an approximation.

The mapping is private (``MAP_PRIVATE``, torch's default): a handler that writes into
its weights in place (``param.mul_(2)``) gets its own copy of the pages it writes, and
neither the file nor any other worker sees the change. A worker that dies or is
recycled takes nothing with it: the file stays, in the model's shared folder, which the
server removes with the model (a new version is a new folder, so a new copy). GPU
workers load as before (their weights live in GPU memory), unless the model has a
weights keeper (``optimization: weights_keeper``): then the mapped file is what the
keeper loads, once per GPU, and the worker imports the keeper's copy in its place
(``ferry.handlers.builtin.kept_weights``).

The model's shared folder is named by the worker for the duration of a load
(``sharing_weights``); loads with none (an in-process worker, tests) share nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.kept_weights import keeper

log = logging.getLogger("ferry.worker")

_FOLDER: ContextVar[Path | None] = ContextVar("ferry_shared_weights_folder", default=None)
SUBFOLDER = "weights"
"""Under the model's shared folder (the one its compile cache is in)."""


@dataclass(frozen=True)
class MappedWeights:
    """A weights file this process maps, for the footprint: counted once per model."""

    path: str
    """The file's path, or ``keeper:KIND:PATH`` for a weights keeper's copy of it."""
    size: int


KEPT_PREFIX = "keeper:"
"""How a keeper's copy is named for the footprint: ``keeper:KIND:PATH`` (its device type)."""

_mapped: dict[str, MappedWeights] = {}
"""What this process maps (``mapped_weights``); a host process's several models add up."""


@contextlib.contextmanager
def sharing_weights(folder: Path | None) -> Iterator[None]:
    """Loads inside share the model's weights through ``folder`` (None: nothing shared)."""
    token = _FOLDER.set(folder)
    try:
        yield
    finally:
        _FOLDER.reset(token)


def mapped_weights() -> list[MappedWeights]:
    """The weights files this process has mapped so far."""
    return list(_mapped.values())


def _folder(device: torch.device) -> Path | None:
    """The shared folder of the model being loaded, if its weights are to be shared: on
    the CPU, or on the device of this worker's weights keeper."""
    folder = _FOLDER.get()
    client = keeper()
    kept = client is not None and client.kind == device.type
    return folder if folder is not None and (device.type == "cpu" or kept) else None


def _mapped_state(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = torch.load(
        path, map_location="cpu", weights_only=True, mmap=True
    )
    return state


def _shared_state(path: Path, device: torch.device) -> dict[str, torch.Tensor]:
    """The state dict of ``path`` as this worker shares it: the keeper's copy when the
    worker has a keeper of ``device``'s type, else the file mapped."""
    client = keeper()
    if client is None or client.kind != device.type:
        return _mapped_state(path)
    state, nbytes = client.share(path)
    _imported[str(path.resolve())] = nbytes
    return state


_imported: dict[str, int] = {}
"""Weights files whose keeper's copy this process imported: their size there."""


def _record(path: Path, module_tensors: list[torch.Tensor]) -> None:
    """The module's weights are shared: counted once, and a keeper's copy watched."""
    resolved = str(path.resolve())
    client = keeper()
    if resolved in _imported and client is not None:  # the keeper's copy (``_shared_state``)
        key = f"{KEPT_PREFIX}{client.kind}:{resolved}"
        _mapped[resolved] = MappedWeights(key, _imported[resolved])
        client.watch(path, module_tensors)
        return
    _mapped[resolved] = MappedWeights(resolved, path.stat().st_size)


# --- eager models --------------------------------------------------------------------------


def eager_on_mapped_weights(
    build: Callable[[], torch.nn.Module], weights: Path, device: torch.device
) -> torch.nn.Module | None:
    """``build()``'s module with the state dict of ``weights`` mapped, or None where that
    cannot be done exactly (the caller then builds and loads as before)."""
    folder = _folder(device)
    if folder is None or not zipfile.is_zipfile(weights):  # torch.save's legacy format: no mmap
        return None
    try:
        with torch.device("meta"):
            model = build()
    except Exception:  # a constructor that needs real tensors: built as before
        return None
    source = _server_owned(weights, folder)
    state = _shared_state(source, device)
    if not _fits(model, state):
        return None
    model.load_state_dict(state, assign=True)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        return None  # a buffer the state dict does not hold (non-persistent): built as before
    _record(source, list(model.state_dict(keep_vars=True).values()))
    return model


def _fits(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    """Every key the module expects, of its dtype: otherwise ``load_state_dict`` would
    convert (not assign), or fail; the ordinary load gives the same answer or error."""
    expected = model.state_dict(keep_vars=True)
    if expected.keys() != state.keys():
        return False
    return all(state[key].dtype == tensor.dtype for key, tensor in expected.items())


def _server_owned(weights: Path, folder: Path) -> Path:
    """``weights`` itself when the server unpacked it (beside the shared folder, in the
    server's work folder); else a copy in the shared folder, made once: a store folder's
    file may be rewritten in place, which would change a mapping's pages under it."""
    if weights.resolve().is_relative_to(folder.resolve().parent):
        return weights
    stat = weights.stat()
    entry = _entry(folder, weights, stat)
    copy = entry / "state_dict.pt"
    with _locked(entry):
        if not copy.is_file():
            partial = entry / "state_dict.pt.partial"
            shutil.copyfile(weights, partial)
            partial.replace(copy)
    return copy


# --- TorchScript ---------------------------------------------------------------------------


def torchscript_on_mapped_weights(path: Path, device: torch.device) -> Any | None:
    """The TorchScript model of ``path`` with its weights mapped, or None (no shared
    folder, or its weights are not all in its parameters and buffers)."""
    folder = _folder(device)
    if folder is None:
        return None
    entry = _entry(folder, path, path.stat())
    skeleton, weights = entry / "skeleton.pt", entry / "weights.pt"
    with _locked(entry):
        if not weights.is_file():
            _split(path, skeleton, weights)
    model = torch.jit.load(str(skeleton), map_location="cpu")  # type: ignore[no-untyped-call]
    if not _assign(model, _shared_state(weights, device)):
        return None
    _record(weights, list(model.state_dict(keep_vars=True).values()))
    return model


def _split(path: Path, skeleton: Path, weights: Path) -> None:
    """``path`` as its weights and its code with empty weights; the weights file last, so
    its presence says both are complete."""
    model = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    tensors = model.state_dict(keep_vars=True)
    partial = weights.with_suffix(".partial")
    torch.save({key: tensor.detach() for key, tensor in tensors.items()}, partial)
    for tensor in tensors.values():
        tensor.data = torch.empty(0, dtype=tensor.dtype)
    model.save(str(skeleton))
    partial.replace(weights)
    log.info("weights of %s shared from %s", path.name, weights.parent)


def _assign(model: Any, state: dict[str, torch.Tensor]) -> bool:
    """Each of the module's parameters and buffers given its mapped tensor, in place (the
    module's code keeps the same tensor objects); False if the names differ."""
    tensors = model.state_dict(keep_vars=True)
    if tensors.keys() != state.keys():
        return False
    for key, tensor in tensors.items():
        if tensor.dtype != state[key].dtype:
            return False
    for key, tensor in tensors.items():
        tensor.data = state[key]
    return True


# --- torch.export programs -----------------------------------------------------------------


def share_loaded(model: torch.nn.Module, source: Path, device: torch.device) -> None:
    """A module loaded whole (a ``torch.export`` program's) moved onto mapped weights:
    the first worker writes them, every worker maps them; its own copy is then freed."""
    folder = _folder(device)
    if folder is None:
        return
    entry = _entry(folder, source, source.stat())
    weights = entry / "weights.pt"
    with _locked(entry):
        if not weights.is_file():
            partial = weights.with_suffix(".partial")
            state = model.state_dict()
            torch.save({key: tensor.detach() for key, tensor in state.items()}, partial)
            partial.replace(weights)
    if _assign(model, _shared_state(weights, device)):
        _record(weights, list(model.state_dict(keep_vars=True).values()))


# --- the shared folder ---------------------------------------------------------------------


def _entry(folder: Path, source: Path, stat: os.stat_result) -> Path:
    """The shared files of one source file: named by its name, size and change time, so a
    changed file is never matched with the weights of its former self."""
    safe = "".join(c if c.isalnum() or c in ".-_" else "_" for c in source.name)
    entry = folder / SUBFOLDER / f"{safe}-{stat.st_size}-{stat.st_mtime_ns}"
    entry.mkdir(parents=True, exist_ok=True)
    return entry


@contextlib.contextmanager
def _locked(entry: Path) -> Iterator[None]:
    """One worker of the model writes the shared files; the others wait, then map them."""
    with open(entry / "writing.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        yield
