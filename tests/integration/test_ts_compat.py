"""A handler written for TorchServe (``ts.*`` imports) loads and serves unchanged."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.fixtures.load import closed_loop
from tests.fixtures.server import RunningServer


def test_torchserve_style_handler_serves(main_server: RunningServer) -> None:
    with main_server.client() as client:
        response = client.post("/predictions/doubler", content=b"[1, 2.5, -3]")
        assert response.status_code == 200, response.text
        assert response.json() == [2.0, 5.0, -6.0]
        assert response.headers["x-first-request"]
        form = client.post("/predictions/doubler", files={"data": ("x.json", b"[4]")})
        assert form.status_code == 200 and form.json() == [8.0]
        refused = client.post("/predictions/doubler", content=b'{"a": 1}')
        assert refused.status_code == 422  # PredictionException's own code


def test_torchserve_style_handler_batches(main_server: RunningServer) -> None:
    answers = _answers_under_load(main_server, "doubler", [[i, i + 1] for i in range(64)])
    assert answers == [[2.0 * i, 2.0 * (i + 1)] for i in range(64)]


def _answers_under_load(
    server: RunningServer, model: str, rows: list[list[int]]
) -> list[list[float]]:
    """Each row sent once at concurrency 16; the answers in request order (all must be 200)."""
    payloads = [json.dumps(row).encode() for row in rows]
    result = closed_loop(server, model, payloads, concurrency=16)
    assert result.statuses == {200: len(rows)}
    return [json.loads(body) for _, _, body in sorted(result.bodies)]


def test_ferry_installs_no_top_level_ts_package() -> None:
    assert importlib.util.find_spec("ts") is None


@pytest.mark.parametrize("model", ["pipelined", "in_processes"])
def test_micro_batching_pipeline_serves_a_plain_handler_unchanged(
    main_server: RunningServer, model: str
) -> None:
    """In threads, or in processes (the ts.* imports and the model folder resolve there too,
    and PredictionException keeps its status)."""
    with main_server.client() as client:
        refused = client.post(f"/predictions/{model}", content=b'{"a": 1}')
        assert refused.status_code == 422
    answers = _answers_under_load(main_server, model, [[i, -i] for i in range(96)])
    assert answers == [[2.0 * i, -2.0 * i] for i in range(96)]
    if model == "in_processes":
        assert "preprocess runs in 2 processes" in main_server.log()
    assert "stage pipeline on" in main_server.log()
