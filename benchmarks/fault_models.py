"""The newer paths for ``fault_load.py``: models loaded on demand and a compiled model.

- ``od0`` and ``od1``: ``loadOnDemand: true`` and nothing else (no ``minWorkers``),
  registered through the management API with no ``initial_workers`` (issue 47: such a
  model's requests used to wait forever). Each holds ``BALLAST_MB`` of memory, and the
  server's budget is set so that loading one evicts the other once it is idle: one client
  alternates between them every ``SWITCH_EVERY`` requests, so the run loads and evicts
  them over and over. They share a worker process, as on-demand models do.
- ``affine``: an eager model (``y = 2x + 1``) with ``optimization: compile`` and a
  warm-up, so its workers load graphs the first one compiled (and restarted ones start in
  the spare process); every answer is checked against the input it was sent for.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from benchmarks.protocols_benchmark import (
    BadAnswer,
    Client,
    TorchServeRest,
    Workload,
)
from ferry.store.writer import ArchiveSpec, write_archive

BALLAST_MB = 48
BUDGET_MB = 64
"""The server's ``--model-memory-budget-mb``: one on-demand model fits, two do not."""
SWITCH_EVERY = 200
ON_DEMAND = ("od0", "od1")

BALLAST_HANDLER = """
import os

BALLAST_MB = {mb}


class Ballast:
    def initialize(self, context):
        self.ballast = bytearray(os.urandom(1 << 20)) * BALLAST_MB  # touched: resident
        self.name = context.model_name

    def handle(self, data, context):
        return [self.name for _ in data]
"""

AFFINE_MODEL = """
import torch
from torch import nn


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(1, 1)

    def forward(self, x):
        return self.lin(x)
"""

AFFINE_HANDLER = """
import torch
from ts.torch_handler.base_handler import BaseHandler


class AffineHandler(BaseHandler):
    def preprocess(self, data):
        rows = []
        for row in data:
            value = row.get("data") or row.get("body")  # text/plain arrives as text
            rows.append(float(value.decode() if isinstance(value, bytes) else value))
        self.inputs = rows
        return torch.tensor(rows, dtype=torch.float32).unsqueeze(1)

    def postprocess(self, data):
        return [f"{x:g}->{y:g}" for x, y in zip(self.inputs, data.squeeze(1).tolist())]
"""


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def on_demand_archives(store: Path) -> list[str]:
    """``od0.mar`` and ``od1.mar`` in ``store``; their file names."""
    folder = store / ".on-demand-src"
    folder.mkdir(parents=True, exist_ok=True)
    handler = _write(folder, "ballast_handler.py", BALLAST_HANDLER.format(mb=BALLAST_MB))
    config = _write(
        folder,
        "model-config.yaml",
        yaml.safe_dump({"loadOnDemand": True, "batchSize": 4, "maxBatchDelay": 5}),
    )
    return [
        write_archive(ArchiveSpec(name, str(handler), config_file=config), store, force=True).name
        for name in ON_DEMAND
    ]


def affine_archive(store: Path) -> str:
    """``affine.mar``: ``y = 2x + 1`` compiled once (``optimization: compile``)."""
    folder = store / ".affine-src"
    folder.mkdir(parents=True, exist_ok=True)
    model_file = _write(folder, "affine_model.py", AFFINE_MODEL)
    handler = _write(folder, "affine_handler.py", AFFINE_HANDLER)
    weights = folder / "affine.pt"
    torch.save({"lin.weight": torch.tensor([[2.0]]), "lin.bias": torch.tensor([1.0])}, weights)
    config = {
        "minWorkers": 1,
        "batchSize": 4,
        "maxBatchDelay": 5,
        "startupTimeout": 600,
        "optimization": {
            "compile": "default",
            "warmup": {"input_shape": [1], "batch_sizes": [1, 4]},
        },
    }
    spec = ArchiveSpec(
        "affine",
        str(handler),
        serialized_file=weights,
        model_file=model_file,
        config_file=_write(folder, "model-config.yaml", yaml.safe_dump(config)),
    )
    return write_archive(spec, store, force=True).name


def _named(expected: str):  # type: ignore[no-untyped-def]
    def check(answer: bytes) -> str:
        if answer.decode(errors="replace") != expected:
            raise BadAnswer(f"expected {expected!r}, got {answer[:60]!r}")
        return expected

    return check


def _affine_answer(answer: bytes) -> str:
    text = answer.decode(errors="replace")
    x, _, y = text.partition("->")
    try:
        right = float(y) == 2 * float(x) + 1
    except ValueError:
        right = False
    if not right:
        raise BadAnswer(f"not 2x + 1: {text[:60]!r}")
    return text


def affine_workload(store: Path, archive: str) -> Workload:
    inputs = [str(n).encode() for n in range(-3, 5)]
    return Workload(
        "compiled",
        "affine",
        store / archive,
        4,
        5,
        inputs,
        bytes.decode,
        "text/plain",
        _affine_answer,
    )


def on_demand_workload(store: Path, archive: str, model: str) -> Workload:
    return Workload(
        "on demand", model, store / archive, 4, 5, [b"x"], bytes.decode, "text/plain", _named(model)
    )


class Alternating(Client):
    """One closed-loop client over several models: ``SWITCH_EVERY`` requests to each in
    turn, so the one it left goes idle and the next load evicts it."""

    def __init__(self, name: str, clients: list[Client]) -> None:
        super().__init__(name, clients[0].workload)
        self._clients = clients

    async def call(self, index: int) -> str:
        client = self._clients[(index // SWITCH_EVERY) % len(self._clients)]
        return await client.call(index)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()


def on_demand_client(name: str, store: Path, archives: list[str], url: str) -> Alternating:
    clients: list[Client] = [
        TorchServeRest(f"{name}/{model}", on_demand_workload(store, archive, model), url)
        for model, archive in zip(ON_DEMAND, archives, strict=True)
    ]
    return Alternating(name, clients)
