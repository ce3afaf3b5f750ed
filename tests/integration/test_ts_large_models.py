"""TorchServe's large-model examples on a real server: a DeepSpeed-style handler is refused
at load with one line saying why (registration's error, describe's ``loadError``); a
streaming handler built on ``TextIteratorStreamerBatch`` streams each request its own text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.fixtures.models import handler_archive
from tests.fixtures.polling import wait_until
from tests.fixtures.responses import assert_error
from tests.fixtures.server import RunningServer, ferry_server

REFUSAL = (
    "NotSupportedByFerry: DeepSpeed tensor parallelism (BaseDeepSpeedHandler, get_ds_engine) "
    "is not supported: Ferry runs each worker as one process and does not launch torchrun "
    "multi-process workers"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("large-models")
    store = tmp / "store"
    store.mkdir()
    torchrun = {"nproc-per-node": 2}  # TorchServe's keys for its torchrun launch
    handler_archive(
        store, "sharded", "ts_deepspeed_style_handler.py", parallelType="tp", torchrun=torchrun
    )
    streamer = handler_archive(
        store, "upper", "ts_batch_streamer_handler.py", batchSize=2, maxBatchDelay=300
    )
    with ferry_server(store, [f"upper={streamer}"], tmp, "--enable-model-api") as running:
        yield running


def test_a_deepspeed_handler_is_refused_at_registration_saying_why(
    server: RunningServer,
) -> None:
    with server.management() as api:
        registered = api.post(
            "/models",
            params={"url": "sharded.mar", "initial_workers": 1, "synchronous": "true"},
        )
        message = assert_error(registered, 500, "InternalServerException")
        assert REFUSAL in message and "\n" not in message
        assert api.get("/models/sharded").status_code == 404  # a failed registration is undone
    # The worker's log has the traceback; the line above is all a client needs.
    assert "handler failed to load" in server.log()


def test_a_deepspeed_handler_loading_in_the_background_shows_why_in_describe(
    server: RunningServer,
) -> None:
    with server.management() as api:
        registered = api.post(
            "/models",
            params={"url": "sharded.mar", "model_name": "sharded_async", "initial_workers": 0},
        )
        assert registered.status_code == 200, registered.text
        assert api.put("/models/sharded_async", params={"min_worker": 1}).status_code == 202

        def load_error() -> str:
            document: dict[str, Any] = api.get("/models/sharded_async").json()[0]
            return str(document["loadError"] or "")

        wait_until("the load to fail", lambda: bool(load_error()), process=server.process)
        assert load_error().startswith(REFUSAL) and "\n" not in load_error()
        assert api.delete("/models/sharded_async").status_code == 200


def parts(body: bytes) -> list[str]:
    """The ``{"text": ...}`` parts of a streamed body, in order."""
    decoder, texts, at = json.JSONDecoder(), [], 0
    text = body.decode()
    while at < len(text):
        part, at = decoder.raw_decode(text, at)
        texts.append(part["text"])
    return texts


def test_batch_streamer_parts_reach_each_request_as_chunks(server: RunningServer) -> None:
    def ask(prompt: bytes) -> tuple[int, list[bytes]]:
        with (
            server.client() as client,
            client.stream("POST", "/predictions/upper", content=prompt) as response,
        ):
            return response.status_code, [chunk for chunk in response.iter_raw() if chunk]

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, [b"hello streaming world", b"good day"]))
    for (status, chunks), expected in zip(
        answers, ["HELLO STREAMING WORLD", "GOOD DAY"], strict=True
    ):
        assert status == 200
        assert "".join(parts(b"".join(chunks))) == expected
        assert len(chunks) > 1
