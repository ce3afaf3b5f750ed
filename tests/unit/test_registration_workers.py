"""Which workers a registered model starts: TorchServe's rule (``ApiUtils.handleRegister``):
the archive's minWorkers/maxWorkers when it sets both validly, else ``initial_workers``,
else none."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.config.model_config import parse_model_config
from ferry.service.archives import as_registered
from ferry.service.types import RegisterRequest
from ferry.store.archive import ModelArchive
from ferry.store.manifest import Manifest


def _archive(document: dict[str, int]) -> ModelArchive:
    manifest = Manifest("m", "1.0", "handler.py", None, None, None, {})
    config = parse_model_config(document, source="model-config.yaml")
    return ModelArchive("m", "1.0", Path("/nonexistent"), manifest, config, "m.mar")


@pytest.mark.parametrize(
    ("document", "initial_workers", "workers"),
    [
        # TorchServe's stateful example: minWorkers 2, maxWorkers 2, registered with 1.
        ({"minWorkers": 2, "maxWorkers": 2}, 1, 2),
        ({"minWorkers": 2, "maxWorkers": 2}, None, 2),
        ({"minWorkers": 1, "maxWorkers": 3}, 0, 1),
        ({}, 3, 3),
        ({}, None, 0),  # TorchServe registers with no workers unless asked
        # No valid pair: initial_workers decides (TorchServe ignores a lone minWorkers;
        # Ferry keeps it when nothing else is asked: the README's table).
        ({"minWorkers": 2}, 1, 1),
        ({"minWorkers": 2}, None, 2),
    ],
)
def test_who_sets_a_registered_models_workers(
    document: dict[str, int], initial_workers: int | None, workers: int
) -> None:
    request = RegisterRequest(url="m.mar", initial_workers=initial_workers)
    assert as_registered(_archive(document), request).config.min_workers == workers
