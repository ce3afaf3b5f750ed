"""Dynamic batching through real HTTP: right answers to the right requests, no idle waiting."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest

from tests.fixtures.load import closed_loop
from tests.fixtures.models import digest_archive
from tests.fixtures.server import RunningServer, ferry_server

PATIENT_DELAY_MS = 10_000
"""A max_batch_delay far beyond what answering one request takes, even on a busy machine."""


def test_every_answer_matches_its_request_under_concurrency(main_server: RunningServer) -> None:
    payloads = [f"request-{i}-{'x' * (i % 97)}".encode() for i in range(1000)]
    result = closed_loop(main_server, "digest", payloads, concurrency=32)
    assert result.statuses == {200: 1000}
    batch_sizes = []
    for index, _status, body in result.bodies:
        answer = json.loads(body)
        assert answer["digest"] == hashlib.sha256(payloads[index]).hexdigest()
        batch_sizes.append(answer["batch"])
    assert max(batch_sizes) > 1, "requests queued behind a busy worker should share batches"
    assert max(batch_sizes) <= 8


def test_single_client_is_not_held_back_by_max_batch_delay(tmp_path: Path) -> None:
    # batch_size 8 and max_batch_delay 10 s: a batcher that waited for company would hold
    # every lone request for the whole delay. So each answer must come before the delay
    # is out: a bound set by the configuration, not by how fast this machine is.
    store = tmp_path / "store"
    store.mkdir()
    archive = digest_archive(store, "patient", batchSize=8, maxBatchDelay=PATIENT_DELAY_MS)
    with ferry_server(store, [archive], tmp_path) as server, server.client() as client:
        for i in range(60):
            try:
                response = client.post(
                    "/predictions/patient", content=b"alone", timeout=PATIENT_DELAY_MS / 1000
                )
            except httpx.ReadTimeout:
                pytest.fail(f"request {i} was held back for the whole max_batch_delay")
            assert response.status_code == 200
            assert response.json()["batch"] == 1
