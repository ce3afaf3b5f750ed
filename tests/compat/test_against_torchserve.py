"""The same archives and requests sent to TorchServe 0.12 and to Ferry: the answers must
match, except where the README's "Where Ferry deliberately differs" says otherwise.

Both servers read one model store. Needs TorchServe in its own virtual environment
(``scripts/torchserve-venv.sh``, or ``FERRY_TORCHSERVE_VENV``) and Java; skipped without.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch

from benchmarks.common import detailed_photo
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures import raw_http
from tests.fixtures.models import (
    DOUBLING_MODEL,
    HANDLERS,
    Doubler,
    stateful_archive,
    ts_style_archive,
    write_config,
)
from tests.fixtures.server import RunningServer, ferry_server
from tests.fixtures.torchserve import VENV_VARIABLE, torchserve_available, torchserve_server
from tests.fixtures.vision_compat import digit_png, mnist_archive
from tests.fixtures.workflows import pipeline_war, tensor_war

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        torchserve_available() is None,
        reason=f"no TorchServe 0.12 environment (run scripts/torchserve-venv.sh or set "
        f"{VENV_VARIABLE}) or no java",
    ),
]

FERRY_DESCRIBE_EXTRAS = {
    "ready",
    "loadError",
    "jobQueueSize",
    "deviceIds",
    "batchPolicy",
    "deadlineAction",
}
"""Fields Ferry's describe adds to TorchServe's (docs/management.md, "Health and readiness")."""
FERRY_WORKER_EXTRAS = {
    "device",
    "restarts",
    "lastError",
    "modelMemory",
    "modelGpuMemory",
    "sharedWeights",
    "sharedProcess",
}


@dataclass
class Pair:
    torchserve: RunningServer
    ferry: RunningServer


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.status} {self.headers.get('content-type')} {self.body!r}"


def _doubler_archive(store: Path, name: str, handler_file: str, **config: object) -> str:
    """``handler_file`` over the eager Doubler model, as tests/integration/test_ts_surface.py
    builds them."""
    scratch = store / f".{name}-src"
    scratch.mkdir(parents=True, exist_ok=True)
    handler = HANDLERS / handler_file
    weights = scratch / "doubler.pt"
    torch.save(Doubler().state_dict(), weights)
    model_file = scratch / "doubler_model.py"
    model_file.write_text(DOUBLING_MODEL)
    spec = ArchiveSpec(
        model_name=name,
        handler=str(handler),
        serialized_file=weights,
        model_file=model_file,
        config_file=write_config(scratch, {"minWorkers": 1, **config}),
    )
    return write_archive(spec, store, force=True).name


def _plain_archive(store: Path, name: str, handler_file: str) -> str:
    """``handler_file`` with no model file or weights (its handler sets itself up)."""
    scratch = store / f".{name}-src"
    scratch.mkdir(parents=True, exist_ok=True)
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / handler_file),
        config_file=write_config(scratch, {"minWorkers": 1}),
    )
    return write_archive(spec, store, force=True).name


CLASSIFIER_MODEL = """
from torch import nn


class TinyClassifier(nn.Sequential):
    def __init__(self):
        super().__init__(
            nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
            nn.Linear(128, 10),
        )
"""


SEGMENTER_MODEL = """
from torch import nn


class TinySegmenter(nn.Module):
    def __init__(self):
        super().__init__()
        self.classes = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return {"out": self.classes(x)}
"""


def _vision_archive(
    store: Path,
    name: str,
    handler: str,
    source: str = CLASSIFIER_MODEL,
    **config: object,
) -> str:
    """``handler`` (a built-in name or a handler of tests/fixtures/handlers) over the one
    model class in ``source`` with random weights, labels in index_to_name.json: what
    TorchServe's image classification tutorial archives hold."""
    scratch = store / f".{name}-src"
    scratch.mkdir(parents=True, exist_ok=True)
    (scratch / f"{name}_model.py").write_text(source)
    namespace: dict[str, object] = {}
    exec(source, namespace)  # the archive's own class, for its state dict
    torch.manual_seed(0)
    model_class = next(v for k, v in namespace.items() if k.startswith("Tiny"))
    assert isinstance(model_class, type) and issubclass(model_class, torch.nn.Module)
    torch.save(model_class().state_dict(), scratch / f"{name}.pt")
    labels = {str(i): f"class{i}" for i in range(10)}
    (scratch / "index_to_name.json").write_text(json.dumps(labels))
    spec = ArchiveSpec(
        model_name=name,
        handler=handler if handler.isidentifier() else str(HANDLERS / handler),
        serialized_file=scratch / f"{name}.pt",
        model_file=scratch / f"{name}_model.py",
        extra_files=(scratch / "index_to_name.json",),
        config_file=write_config(scratch, {"minWorkers": 1, **config}),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("compat")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"doubler={ts_style_archive(store)}",
        f"mnist={mnist_archive(store)}",
        "metered="
        + _doubler_archive(store, "metered", "ts_metrics_handler.py", handler={"scale": 3}),
        f"streaming={_plain_archive(store, 'streaming', 'ts_streaming_handler.py')}",
        f"describing={_plain_archive(store, 'describing', 'describing_handler.py')}",
        f"tensors={_plain_archive(store, 'tensors', 'ts_tensor_handler.py')}",
        f"raising={_plain_archive(store, 'raising', 'ts_raising_handler.py')}",
        f"classifier={_vision_archive(store, 'classifier', 'image_classifier')}",
        "segmenter=" + _vision_archive(store, "segmenter", "image_segmenter", SEGMENTER_MODEL),
        # TorchServe's micro-batching example: ImageClassifier with MicroBatching(self).
        "microbatched="
        + _vision_archive(
            store,
            "microbatched",
            "ts_mb_classifier_handler.py",
            batchSize=4,
            micro_batching={"micro_batch_size": 2, "parallelism": {"preprocess": 2}},
        ),
        f"stateful={stateful_archive(store)}",
    ]
    # Registered through the management API by the tests, not loaded at start-up.
    ts_style_archive(store, name="second")
    stateful_archive(store, "stateful_registered")  # minWorkers 2, maxWorkers 2
    pipeline_war(store)
    tensor_war(store)
    (tmp / "ts").mkdir()
    (tmp / "ferry").mkdir()
    # Ferry caps worker processes of all models together (docs/security.md, "Resource limits":
    # twice the cores, at least 8); TorchServe has no cap. Nine workers are running once the
    # workflow's four nodes join, so the cap is raised to compare answers, not limits.
    ferry_flags = ["--enable-model-api", "--max-workers-total", "32"]
    with (
        torchserve_server(store, models, tmp / "ts") as torchserve,
        ferry_server(store, models, tmp / "ferry", *ferry_flags) as ferry,
    ):
        yield Pair(torchserve, ferry)


Files = dict[str, tuple[str, bytes, str]]


def _ask(
    server: RunningServer,
    method: str,
    path: str,
    *,
    api: str = "inference",
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    files: Files | None = None,
) -> Answer:
    base = server.url if api == "inference" else server.management_url
    response = httpx.request(
        method,
        f"{base}{path}",
        content=content,
        headers=headers,
        params=params,
        files=files,
        timeout=120,
    )
    return Answer(response.status_code, response.headers, response.content)


def _both(
    pair: Pair,
    method: str,
    path: str,
    *,
    api: str = "inference",
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    files: Files | None = None,
) -> tuple[Answer, Answer]:
    """The same request to TorchServe, then to Ferry."""
    torchserve, ferry = (
        _ask(
            server,
            method,
            path,
            api=api,
            content=content,
            headers=headers,
            params=params,
            files=files,
        )
        for server in (pair.torchserve, pair.ferry)
    )
    return torchserve, ferry


def _parsed(answer: Answer) -> object:
    try:
        return answer.json()
    except ValueError:
        return answer.body


def _media_type(answer: Answer) -> str | None:
    value = answer.headers.get("content-type")
    return value.split(";")[0].strip().lower() if value else None


def assert_same(torchserve: Answer, ferry: Answer) -> None:
    """Same status and body (JSON-equal where both bodies are JSON, byte-equal otherwise),
    and the same media type where TorchServe names one: clients choose their decoder by it.

    TorchServe 0.12 sends no Content-Type with a handler's answer at all (and pretty-prints
    JSON); Ferry's ``application/json`` / ``text/plain`` there is reported in
    benchmarks/results/torchserve_compat.md rather than failed on.
    """
    detail = f"\nTorchServe: {torchserve}\nFerry:      {ferry}"
    assert ferry.status == torchserve.status, detail
    assert _parsed(ferry) == _parsed(torchserve), detail
    if _media_type(torchserve) is not None:
        assert _media_type(ferry) == _media_type(torchserve), detail


# -- inference ---------------------------------------------------------------------------


def test_ping_answers_the_same(pair: Pair) -> None:
    assert_same(*_both(pair, "GET", "/ping"))


@pytest.mark.parametrize("headers", [{}, {"content-type": "application/json"}], ids=["raw", "json"])
def test_ts_style_handler_answers_the_same(pair: Pair, headers: dict[str, str]) -> None:
    torchserve, ferry = _both(
        pair, "POST", "/predictions/doubler", content=b"[1, 2]", headers=headers
    )
    assert torchserve.status == 200, torchserve
    assert_same(torchserve, ferry)


def test_prediction_exception_keeps_its_code_and_type(pair: Pair) -> None:
    torchserve, ferry = _both(
        pair,
        "POST",
        "/predictions/doubler",
        content=b'{"not": "a list"}',
        headers={"content-type": "application/json"},
    )
    assert torchserve.status == 422, torchserve
    assert ferry.status == torchserve.status, f"TorchServe: {torchserve}\nFerry: {ferry}"
    error_ts, error_ferry = torchserve.json(), ferry.json()
    assert isinstance(error_ts, dict) and isinstance(error_ferry, dict)
    fields = ("code", "type")
    assert {k: error_ferry.get(k) for k in fields} == {k: error_ts.get(k) for k in fields}


def test_unknown_model_answers_the_same(pair: Pair) -> None:
    assert_same(*_both(pair, "POST", "/predictions/nope", content=b"[1]"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mnist_style_image_classifier_answers_the_same(pair: Pair, seed: int) -> None:
    image = digit_png(seed)
    torchserve, ferry = _both(
        pair, "POST", "/predictions/mnist", content=image, headers={"content-type": "image/png"}
    )
    assert torchserve.status == 200, torchserve
    assert_same(torchserve, ferry)
    # The form upload TorchServe's tutorial uses: curl -F data=@digit.png
    files = {"data": ("digit.png", image, "image/png")}
    assert_same(*_both(pair, "POST", "/predictions/mnist", files=files))


def test_custom_metrics_handler_answers_the_same(pair: Pair) -> None:
    torchserve, ferry = _both(pair, "POST", "/predictions/metered", content=b"[1, 2]")
    assert torchserve.status == 200, torchserve
    assert_same(torchserve, ferry)


@pytest.mark.parametrize(
    ("size", "fmt"), [((1000, 667), "JPEG"), ((720, 720), "PNG"), ((667, 1000), "JPEG")]
)
def test_the_builtin_image_classifier_answers_the_same(
    pair: Pair, size: tuple[int, int], fmt: str
) -> None:
    """TorchServe's image_classifier with torchvision's transforms against Ferry's: the
    same top-5 labels, probabilities within 1e-5."""
    image = detailed_photo(*size, seed=size[0], fmt=fmt)
    torchserve, ferry = _both(pair, "POST", "/predictions/classifier", content=image)
    assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
    theirs, ours = torchserve.json(), ferry.json()
    assert isinstance(theirs, dict) and isinstance(ours, dict)
    assert list(ours) == list(theirs), f"{theirs}\n{ours}"
    assert all(abs(ours[label] - theirs[label]) < 1e-5 for label in theirs), f"{theirs}\n{ours}"


def test_the_builtin_image_segmenter_answers_the_same(pair: Pair) -> None:
    """Every pixel's class and probability (TorchServe's image_segmenter answer), on a
    JPEG and a PNG: the same classes, probabilities within 1e-5."""
    for size, fmt in (((1000, 667), "JPEG"), ((720, 720), "PNG")):
        image = detailed_photo(*size, seed=size[1], fmt=fmt)
        torchserve, ferry = _both(pair, "POST", "/predictions/segmenter", content=image)
        assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
        theirs = torch.tensor(torchserve.json())
        ours = torch.tensor(ferry.json())
        assert ours.shape == theirs.shape == (224, 224, 2)
        assert torch.equal(ours[..., 0], theirs[..., 0]), f"{fmt}: classes differ"
        assert (ours[..., 1] - theirs[..., 1]).abs().max() < 1e-5, fmt


def test_torchserves_micro_batching_example_answers_the_same(pair: Pair) -> None:
    """An ImageClassifier subclass whose __init__ only sets MicroBatching(self)."""
    image = detailed_photo(640, 480, seed=7, fmt="JPEG")
    torchserve, ferry = _both(pair, "POST", "/predictions/microbatched", content=image)
    assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
    theirs, ours = torchserve.json(), ferry.json()
    assert isinstance(theirs, dict) and isinstance(ours, dict)
    assert list(ours) == list(theirs), f"{theirs}\n{ours}"
    assert all(abs(ours[label] - theirs[label]) < 1e-5 for label in theirs), f"{theirs}\n{ours}"


def _sequence(server: RunningServer, name: str, numbers: list[int]) -> list[str]:
    with server.client() as client:
        return [
            client.post(
                "/predictions/stateful",
                content=str(number).encode(),
                headers={"ts_request_sequence_id": name},
            ).text
            for number in numbers
        ]


def test_stateful_sequences_answer_the_same(pair: Pair) -> None:
    """TorchServe's own test of its sequence-batching example: two sequences at once."""
    for server in (pair.torchserve, pair.ferry):
        answers: dict[str, list[str]] = {}

        def send(name: str, numbers: list[int], into: dict[str, list[str]] = answers) -> None:
            into[name] = _sequence(server, name, numbers)  # noqa: B023

        threads = [
            threading.Thread(target=send, args=("seq_0", [1, 3, 5, 7, 9])),
            threading.Thread(target=send, args=("seq_1", [2, 4, 6, 8, 10])),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert answers == {
            "seq_0": ["1", "4", "9", "16", "25"],
            "seq_1": ["2", "6", "12", "20", "30"],
        }, server.url
    # Without an id, each request is a sequence of its own, named by the server.
    assert_same(*_both(pair, "POST", "/predictions/stateful", content=b"5"))
    assert_same(*_both(pair, "POST", "/predictions/stateful", content=b"5"))


@pytest.fixture(scope="module")
def kservev2_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """The built-in image_classifier on TorchServe with ``service_envelope=kservev2`` (how
    its KServe integration runs) and on Ferry with no setting: Ferry's V2 route reads
    the kservev2 envelope by itself."""
    tmp = tmp_path_factory.mktemp("compat_v2")
    store = tmp / "store"
    store.mkdir()
    models = [f"classifier={_vision_archive(store, 'classifier', 'image_classifier')}"]
    (tmp / "ts").mkdir()
    (tmp / "ferry").mkdir()
    envelope = {"service_envelope": "kservev2"}
    with (
        torchserve_server(store, models, tmp / "ts", properties=envelope) as torchserve,
        ferry_server(store, models, tmp / "ferry") as ferry,
    ):
        yield Pair(torchserve, ferry)


def test_a_v2_bytes_request_of_shape_minus_one_answers_the_same(kservev2_pair: Pair) -> None:
    """TorchServe's own KServe sample (mnist_v2_bytes.json): one base64 image, shape [-1]."""
    image = detailed_photo(640, 480, seed=5, fmt="JPEG")
    encoded = base64.b64encode(image).decode()
    request = {
        "id": "d3b15cad-50a2-4eaf-80ce-8b0a428bd298",
        "inputs": [{"name": "image", "shape": [-1], "datatype": "BYTES", "data": [encoded]}],
    }
    body = json.dumps(request).encode()
    torchserve, ferry = _both(
        kservev2_pair,
        "POST",
        "/v2/models/classifier/infer",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
    theirs, ours = torchserve.json(), ferry.json()
    assert isinstance(theirs, dict) and isinstance(ours, dict)
    classes_theirs = theirs["outputs"][0].pop("data")
    classes_ours = ours["outputs"][0].pop("data")
    # id, model name and version, output name, shape and type: BYTES, the answer's object
    assert ours == theirs
    assert len(classes_ours) == len(classes_theirs) == 1
    top_theirs, top_ours = classes_theirs[0], classes_ours[0]
    assert isinstance(top_ours, dict) and isinstance(top_theirs, dict)
    assert list(top_ours) == list(top_theirs)
    assert all(abs(top_ours[k] - top_theirs[k]) < 1e-5 for k in top_theirs), f"{theirs}\n{ours}"


def test_a_tensor_answer_is_the_same_torch_saved_tensor(pair: Pair) -> None:
    torchserve, ferry = _both(pair, "POST", "/predictions/tensors", content=b"[1.5, 2.0]")
    assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
    for answer in (torchserve, ferry):
        tensor = torch.load(io.BytesIO(answer.body), weights_only=True)
        assert torch.equal(tensor, torch.tensor([4.5, 6.0])), answer


def test_a_raising_handler_is_the_documented_difference(pair: Pair) -> None:
    # README, "Where Ferry deliberately differs": TorchServe answers 503 "Prediction
    # failed"; Ferry 500 with the exception's message. Checked so the claim stays true.
    torchserve, ferry = _both(pair, "POST", "/predictions/raising", content=b"x")
    assert torchserve.status == 503, torchserve
    assert ferry.status == 500, ferry
    error = ferry.json()
    assert isinstance(error, dict) and error["type"] == "InternalServerException"
    assert "weights do not fit" in error["message"]


def test_base_handler_initialize_sets_the_same_attributes(pair: Pair) -> None:
    # What BaseHandler.initialize set, as the metrics handler reports it in a header.
    # Documented difference (docs/handlers.md, "Handlers"): Ferry also sets ``self.model_dir``,
    # which TorchServe 0.12 keeps in a local variable; every other attribute is the same.
    torchserve, ferry = _both(pair, "POST", "/predictions/metered", content=b"[1, 2]")
    header = "x-handler-info"
    info_ts, info_ferry = json.loads(torchserve.headers[header]), json.loads(ferry.headers[header])
    assert (info_ts.pop("model_dir"), info_ferry.pop("model_dir")) == (False, True)
    assert info_ferry == info_ts, (
        f"POST /predictions/metered [1, 2], {header}:\n{info_ts=}\n{info_ferry=}"
    )


def test_streaming_handler_streams_the_same_answer(pair: Pair) -> None:
    body = b"one two three four"
    torchserve, ferry = _both(pair, "POST", "/predictions/streaming", content=body)
    assert torchserve.status == 200, torchserve
    for answer in (torchserve, ferry):
        assert answer.headers.get("transfer-encoding") == "chunked", answer.headers
    assert_same(torchserve, ferry)
    assert ferry.body == b"one two three four"


def test_streaming_failure_mid_answer_is_the_documented_difference(pair: Pair) -> None:
    body = b"one two FAIL"
    # TorchServe cuts the connection after the parts it sent (README, "Where Ferry
    # deliberately differs"); checked here so the documented claim stays true.
    with pytest.raises(httpx.TransportError):
        _ask(pair.torchserve, "POST", "/predictions/streaming", content=body)
    # Ferry ends the stream with the JSON error body as its last chunk instead.
    ferry = _ask(pair.ferry, "POST", "/predictions/streaming", content=body)
    assert ferry.status == 200, ferry
    assert ferry.body.startswith(b"one two ")
    error = json.loads(ferry.body[len(b"one two ") :])
    assert (error["code"], error["type"]) == (500, "InternalServerException")
    # Both workers carry on.
    assert_same(*_both(pair, "POST", "/predictions/streaming", content=b"still here"))


# -- management --------------------------------------------------------------------------


def test_customized_describe_gives_the_same_metadata(pair: Pair) -> None:
    torchserve, ferry = _both(
        pair, "GET", "/models/describing", api="management", params={"customized": "true"}
    )
    assert torchserve.status == ferry.status == 200, f"{torchserve}\n{ferry}"
    described_ts, described_ferry = torchserve.json(), ferry.json()
    assert isinstance(described_ts, list) and isinstance(described_ferry, list)
    assert described_ferry[0]["customizedMetadata"] == described_ts[0]["customizedMetadata"]


def test_describe_has_torchserve_field_names(pair: Pair) -> None:
    torchserve, ferry = _both(pair, "GET", "/models/doubler", api="management")
    assert torchserve.status == ferry.status == 200
    described_ts, described_ferry = torchserve.json(), ferry.json()
    assert isinstance(described_ts, list) and isinstance(described_ferry, list)
    keys_ts, keys_ferry = set(described_ts[0]), set(described_ferry[0])
    # Values differ by nature (worker ids, start times, pids); the names must not, beyond
    # the fields Ferry documents as its additions.
    assert {"missing": keys_ts - keys_ferry, "added": keys_ferry - keys_ts} == {
        "missing": set(),
        "added": FERRY_DESCRIBE_EXTRAS,
    }
    workers_ts, workers_ferry = described_ts[0]["workers"], described_ferry[0]["workers"]
    assert workers_ts and workers_ferry
    worker_ts, worker_ferry = set(workers_ts[0]), set(workers_ferry[0])
    assert {"missing": worker_ts - worker_ferry, "added": worker_ferry - worker_ts} == {
        "missing": set(),
        "added": FERRY_WORKER_EXTRAS,
    }


def test_list_models_has_the_same_shape(pair: Pair) -> None:
    torchserve, ferry = _both(pair, "GET", "/models", api="management")
    assert torchserve.status == ferry.status == 200
    # Same models, same order, same fields: the tests that register undo it before they end.
    assert_same(torchserve, ferry)
    # Pagination: nextPageToken where more models follow.
    assert_same(*_both(pair, "GET", "/models", api="management", params={"limit": "2"}))


def test_register_and_unregister_answer_the_same(pair: Pair) -> None:
    steps: list[tuple[str, str, dict[str, str]]] = [
        ("POST", "/models", {"url": "second.mar", "initial_workers": "1"}),
        ("POST", "/models", {"url": "second.mar", "initial_workers": "1"}),  # 409: it exists
        ("GET", "/models/second", {}),
        ("DELETE", "/models/second", {}),
        ("DELETE", "/models/second", {}),  # 404: gone
    ]
    for method, path, params in steps:
        torchserve, ferry = _both(pair, method, path, api="management", params=params)
        request = f"{method} {path} {params}"
        assert ferry.status == torchserve.status, (
            f"{request}\nTorchServe: {torchserve}\nFerry: {ferry}"
        )
        if method != "GET":  # describe's values differ by nature (see above)
            assert_same(torchserve, ferry)


def test_an_archives_worker_pair_wins_over_initial_workers(pair: Pair) -> None:
    """Issue 50: TorchServe's stateful example (minWorkers 2, maxWorkers 2) registered
    with ``initial_workers=1``: both start 2 (TorchServe's ApiUtils.handleRegister)."""
    params = {"url": "stateful_registered.mar", "initial_workers": "1", "synchronous": "true"}
    registered = _both(pair, "POST", "/models", api="management", params=params)
    try:
        assert_same(*registered)
        described = _both(pair, "GET", "/models/stateful_registered", api="management")
        counts = []
        for answer in described:
            body = answer.json()
            assert isinstance(body, list), body
            counts.append(len(body[0]["workers"]))
        assert counts == [2, 2], counts
    finally:
        _both(pair, "DELETE", "/models/stateful_registered", api="management")


def test_an_unread_body_then_an_error_is_used_as_torchserve_uses_the_connection(
    pair: Pair,
) -> None:
    """Issue 50, item 6 (newman kept two connections open and ran on): a POST to an
    unknown model, its photo-sized body sent in two halves. Both servers answer only once
    the whole body is in, 404 with ``Connection: close``, and close the connection."""
    body = b"\xff\xd8" + b"j" * (300 * 1024 - 2)
    for server in (pair.torchserve, pair.ferry):
        with raw_http.connect(server.url) as sock:
            head = raw_http.request_head("POST", "/predictions/absent", len(body))
            sock.sendall(head + body[: len(body) // 2])
            assert raw_http.nothing_arrives(sock), f"{server.url}: answered mid-body"
            sock.sendall(body[len(body) // 2 :])
            status, answer_head, _ = raw_http.read_answer(sock)
            assert status == 404, server.url
            assert b"connection: close" in answer_head.lower(), server.url
            assert raw_http.closed(sock), server.url


# -- workflows ---------------------------------------------------------------------------


def test_a_workflow_passing_tensors_answers_the_same(pair: Pair) -> None:
    """Nodes that hand tensors on (torch.save'd, as TorchServe's densenet workflow)."""
    registered = _both(pair, "POST", "/workflows", api="management", params={"url": "tensors.war"})
    assert_same(*registered)
    try:
        torchserve, ferry = _both(pair, "POST", "/wfpredict/tensors", content=b"[1.0, 2.0]")
        assert torchserve.status == 200, torchserve
        assert_same(torchserve, ferry)
    finally:
        assert_same(*_both(pair, "DELETE", "/workflows/tensors", api="management"))


def test_workflow_answers_the_same(pair: Pair) -> None:
    registered = _both(pair, "POST", "/workflows", api="management", params={"url": "pipeline.war"})
    assert_same(*registered)
    try:
        torchserve, ferry = _both(pair, "POST", "/wfpredict/pipeline", content=b"[1, 2]")
        assert torchserve.status == 200, torchserve
        assert_same(torchserve, ferry)
        assert_same(*_both(pair, "GET", "/workflows", api="management"))
        # Unlike a model's, a workflow's description holds no run-time values.
        assert_same(*_both(pair, "GET", "/workflows/pipeline", api="management"))
        assert_same(*_both(pair, "POST", "/wfpredict/nope", content=b"[1, 2]"))
    finally:
        assert_same(*_both(pair, "DELETE", "/workflows/pipeline", api="management"))
