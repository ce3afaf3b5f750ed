"""Dynamic batching through real HTTP: right answers to the right requests, no idle waiting."""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics

from ferry.bench.load import run_closed_loop
from tests.fixtures.server import RunningServer


def test_every_answer_matches_its_request_under_concurrency(main_server: RunningServer) -> None:
    payloads = [f"request-{i}-{'x' * (i % 97)}".encode() for i in range(1000)]
    result = asyncio.run(
        run_closed_loop(
            f"{main_server.url}/predictions/digest",
            payloads,
            concurrency=32,
            requests=len(payloads),
            keep_bodies=True,
        )
    )
    assert result.statuses == {200: 1000}
    batch_sizes = []
    for index, _status, body in result.bodies:
        answer = json.loads(body)
        assert answer["digest"] == hashlib.sha256(payloads[index]).hexdigest()
        batch_sizes.append(answer["batch"])
    assert max(batch_sizes) > 1, "requests queued behind a busy worker should share batches"
    assert max(batch_sizes) <= 8


def test_single_client_is_not_held_back_by_max_batch_delay(main_server: RunningServer) -> None:
    # batch_size 8 and max_batch_delay 50 ms: a fixed timer would add ~50 ms to each request.
    result = asyncio.run(
        run_closed_loop(
            f"{main_server.url}/predictions/digest",
            [b"alone"],
            concurrency=1,
            requests=60,
            keep_bodies=True,
        )
    )
    assert result.statuses == {200: 60}
    assert all(json.loads(body)["batch"] == 1 for _, _, body in result.bodies)
    assert statistics.median(result.latencies_ms) < 25, result.latencies_ms
