"""Streamed answers over HTTP: a TorchServe streaming handler, unchanged, answers with a
chunked response whose chunks are its parts, in order, then its last answer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.load import closed_loop
from tests.fixtures.models import HANDLERS, write_config
from tests.fixtures.server import RunningServer, ferry_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("streaming")
    store = tmp / "store"
    store.mkdir()
    scratch = tmp / "src"
    scratch.mkdir()
    spec = ArchiveSpec(
        model_name="words",
        handler=str(HANDLERS / "ts_streaming_handler.py"),
        config_file=write_config(scratch, {"minWorkers": 1, "batchSize": 4, "maxBatchDelay": 100}),
    )
    archive = write_archive(spec, store, force=True).name
    with ferry_server(store, [f"words={archive}"], tmp) as running:
        yield running


def test_parts_arrive_as_chunks_in_order_then_the_last_answer(server: RunningServer) -> None:
    with (
        server.client() as client,
        client.stream("POST", "/predictions/words", content=b"one two three") as response,
    ):
        chunks = [chunk for chunk in response.iter_raw() if chunk]
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
        assert response.headers["x-request-id"]
    assert b"".join(chunks) == b"one two three"


def test_an_answer_without_parts_is_one_plain_response(server: RunningServer) -> None:
    with server.client() as client:
        response = client.post("/predictions/words", content=b"solo")
    assert response.status_code == 200
    assert response.content == b"solo"
    assert response.headers["content-length"] == "4"
    assert "transfer-encoding" not in response.headers


def test_a_failure_after_parts_went_out_ends_the_stream_with_the_error(
    server: RunningServer,
) -> None:
    """The status was sent with the first part; the error body is the last chunk."""
    with server.client() as client:
        response = client.post("/predictions/words", content=b"alpha beta FAIL")
    assert response.status_code == 200
    assert response.content.startswith(b"alpha beta ")
    error = json.loads(response.content[len(b"alpha beta ") :])
    assert error["code"] == 500
    assert "the model failed mid-answer" in error["message"]
    with server.client() as client:  # the worker carries on
        assert client.post("/predictions/words", content=b"still here").content == b"still here"


def test_requests_batched_together_each_get_only_their_own_parts(server: RunningServer) -> None:
    sentences = [f"request {i} says {'word ' * (i % 4)}end".encode() for i in range(24)]
    result = closed_loop(server, "words", sentences, concurrency=8)
    assert result.statuses == {200: 24}
    answers = {index: body for index, _, body in result.bodies}
    assert answers == {i: b" ".join(s.split()) for i, s in enumerate(sentences)}
