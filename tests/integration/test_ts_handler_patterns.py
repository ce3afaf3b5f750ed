"""TorchServe handler patterns served end to end: its micro-batching example (an
``ImageClassifier`` whose ``__init__`` skips ``super().__init__()``), a module-level
handler streaming through ``ts.handler_utils.utils``, and the ``text_classifier``
built-in packaged by ``ferry archive --handler text_classifier``."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.fixtures.cli import run_ferry
from tests.fixtures.load import closed_loop
from tests.fixtures.server import RunningServer, ferry_server
from tests.unit.test_ts_handler_patterns import (
    BAG_MODEL,
    BLUE,
    COLOUR_MODEL,
    COLOURS,
    GREEN,
    RED,
    SMALL_IMAGES,
    _BagNet,
    colour_weights,
    label_files,
    package,
)


def _text_classifier_archive(tmp: Path, store: Path) -> str:
    """The text classifier packaged with ``ferry archive``, by its built-in name."""
    source = tmp / "text-src"
    source.mkdir()
    model = _BagNet()
    with torch.no_grad():
        model.embedding.weight.copy_(torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0, 0]]))
    torch.save(model.state_dict(), source / "model.pt")
    (source / "model.py").write_text(BAG_MODEL)
    vocab = io.BytesIO()
    torch.save({"<unk>": 0, "good": 1, "bad": 2}, vocab)
    (source / "source_vocab.pt").write_bytes(vocab.getvalue())
    (source / "index_to_name.json").write_bytes(
        label_files({"0": "pos", "1": "neg"})["index_to_name.json"]
    )
    extra = f"{source / 'index_to_name.json'},{source / 'source_vocab.pt'}"
    done = run_ferry(
        "archive",
        "--model-name",
        "text",
        "--handler",
        "text_classifier",
        "--model-file",
        str(source / "model.py"),
        "--serialized-file",
        str(source / "model.pt"),
        "--extra-files",
        extra,
        "--export-path",
        str(store),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no "neither a .py file nor a built-in" warning
    return "text.mar"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    tmp = tmp_path_factory.mktemp("ts-patterns")
    store = tmp / "store"
    store.mkdir()
    micro = {"micro_batch_size": 2, "parallelism": {"preprocess": 2, "postprocess": 2}}
    classifier = package(
        tmp,
        "ts_mb_classifier_handler.py",
        name="mb",
        weights=colour_weights(tmp),
        model_source=COLOUR_MODEL,
        files=label_files(COLOURS),
        config={
            "minWorkers": 1,
            "batchSize": 8,
            "maxBatchDelay": 50,
            "micro_batching": micro,
            **SMALL_IMAGES,
        },
    )
    streaming = package(tmp, "ts_intermediate_handler.py", name="stream", config={"minWorkers": 1})
    models = [
        f"mb={classifier.name}",
        f"stream={streaming.name}",
        f"text={_text_classifier_archive(tmp, store)}",
    ]
    with ferry_server(store, models, tmp) as running:
        yield running


def test_torchserves_micro_batching_example_serves(server: RunningServer) -> None:
    images = [RED, GREEN, BLUE] * 8
    result = closed_loop(server, "mb", images, concurrency=8)
    assert result.statuses == {200: 24}
    answers = {index: json.loads(body) for index, _, body in result.bodies}
    assert [next(iter(answers[i])) for i in range(24)] == ["red", "green", "blue"] * 8
    with server.client() as client:
        broken = client.post("/predictions/mb", content=b"not an image")
    assert broken.status_code == 400 and "cannot decode image" in broken.text


def test_handler_utils_streams_intermediate_parts(server: RunningServer) -> None:
    with (
        server.client() as client,
        client.stream("POST", "/predictions/stream", content=b"go") as response,
    ):
        chunks = [chunk for chunk in response.iter_raw() if chunk]
        assert response.status_code == 200
        assert response.headers["transfer-encoding"] == "chunked"
    assert b"".join(chunks) == b"part 0part 1part 2done"


def test_the_text_classifier_built_in(server: RunningServer) -> None:
    with server.client() as client:
        good = client.post("/predictions/text", content=b"good good bad")
        bad = client.post("/predictions/text", content=b"bad film")
    assert good.status_code == 200 and bad.status_code == 200, good.text + bad.text
    assert max(good.json().items(), key=lambda kv: kv[1])[0] == "pos"
    assert max(bad.json().items(), key=lambda kv: kv[1])[0] == "neg"
