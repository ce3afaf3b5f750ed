"""TorchServe's ``ts.*`` surface as user handlers import it: ``MicroBatching``, ``timed``,
the custom-metrics API, and the attributes ``BaseHandler.initialize`` sets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.load import closed_loop
from tests.fixtures.models import DOUBLING_MODEL, HANDLERS, Doubler, write_config
from tests.fixtures.server import RunningServer, ferry_server
from tests.integration.test_metrics import _value


def _archive(store: Path, name: str, handler_file: str, **config: object) -> str:
    """``handler_file`` (one of the handler fixtures) over the eager Doubler model."""
    scratch = store / f".{name}-src"
    scratch.mkdir(parents=True, exist_ok=True)
    weights = scratch / "doubler.pt"
    torch.save(Doubler().state_dict(), weights)
    model_file = scratch / "doubler_model.py"
    model_file.write_text(DOUBLING_MODEL)
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / handler_file),
        serialized_file=weights,
        model_file=model_file,
        config_file=write_config(scratch, {"minWorkers": 1, **config}),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def surface_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ts-surface")
    store = tmp / "store"
    store.mkdir()
    micro = {"micro_batch_size": 2, "parallelism": {"preprocess": 2, "postprocess": 2}}
    models = [
        "metered="
        + _archive(store, "metered", "ts_metrics_handler.py", handler={"scale": 3}, batchSize=4),
        "micro="
        + _archive(
            store,
            "micro",
            "ts_micro_batching_handler.py",
            batchSize=8,
            maxBatchDelay=50,
            handler={"micro_batching": micro},
        ),
    ]
    with ferry_server(store, models, tmp) as server:
        yield server


def test_micro_batching_handle_runs_on_the_stage_pipeline(surface_server: RunningServer) -> None:
    payloads = [json.dumps([i, -i]).encode() for i in range(48)]
    result = closed_loop(surface_server, "micro", payloads, concurrency=16)
    assert result.statuses == {200: 48}
    answers = [json.loads(body) for _, _, body in sorted(result.bodies)]
    assert [a["values"] for a in answers] == [[2.0 * i, -2.0 * i] for i in range(48)]
    assert all(a["rows"] <= 2 for a in answers)  # micro-batches of micro_batch_size
    assert all(a["thread"].startswith("post") for a in answers)  # the pipeline's pool


def test_initialize_sets_torchserve_attributes(surface_server: RunningServer) -> None:
    with surface_server.client() as client:
        response = client.post("/predictions/metered", content=b"[1, 2]")
    assert response.status_code == 200, response.text
    assert response.json() == {"values": [6.0, 12.0], "labelled": {"first": 6.0}}
    info = json.loads(response.headers["x-handler-info"])
    assert info == {
        "scale": 3,
        "map_location": "cpu",
        "device": "cpu",
        "model_pt_path": "doubler.pt",
        "model_dir": True,
        "manifest": "metered",
        "initialized": True,
        "describe": None,
    }


def test_custom_metrics_reach_the_metrics_page(surface_server: RunningServer) -> None:
    before = surface_server.metrics()
    with surface_server.client() as client:
        for i in range(3):
            response = client.post("/predictions/metered", content=f"[{i}]".encode())
            assert response.status_code == 200, response.text
    text = surface_server.metrics()

    def grew(name: str, by: float, **labels: str) -> bool:
        return _value(text, name, **labels) >= _value(before, name, **labels) + by

    # TorchServe's labels: the metric's dimensions, then Hostname (no model or unit label).
    assert grew("BatchRows", 3, stage="preprocess", ModelName="metered", Level="Model")
    assert grew("RowsSeen", 3, source="request")
    assert _value(text, "LastBatchSize", ModelName="metered", Level="Model") >= 1
    assert 'RowsSeen{source="cache",Hostname="' in text
    for stage in ("preprocess", "inference", "postprocess"):  # @timed, in ms
        assert f"# TYPE {stage} gauge" in text or f"# TYPE handler_{stage} gauge" in text
    assert "unit: ms." in text  # the unit is in the family's help, as TorchServe's
