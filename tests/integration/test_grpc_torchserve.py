"""TorchServe's gRPC APIs on a real server, called through stubs generated from Ferry's
.proto files: the calls TorchServe's own gRPC clients make."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2

from ferry.grpc.auth import DENIED
from ferry.grpc.generated import ferry_torchserve_inference_pb2 as inference
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as inference_grpc
from ferry.grpc.generated import ferry_torchserve_management_pb2 as management
from ferry.grpc.generated import ferry_torchserve_management_pb2_grpc as management_grpc
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.cli import FERRY, serve_args
from tests.fixtures.models import (
    HANDLERS,
    digest_archive,
    echo_store,
    ts_style_archive,
    write_config,
)
from tests.fixtures.server import RunningServer, ferry_server

TIMEOUT = 60.0
Code = grpc.StatusCode


def _streaming_archive(store: Path, scratch: Path) -> str:
    scratch.mkdir()
    spec = ArchiveSpec(
        model_name="words",
        handler=str(HANDLERS / "ts_streaming_handler.py"),
        config_file=write_config(scratch, {"minWorkers": 1}),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """doubler (TorchServe-style), words (streams its words); the model API on, no keys;
    ``spare.mar`` in the store for registration."""
    tmp = tmp_path_factory.mktemp("grpc")
    store = tmp / "store"
    store.mkdir()
    models = [
        f"doubler={ts_style_archive(store)}",
        f"words={_streaming_archive(store, tmp / 'words-src')}",
    ]
    digest_archive(store, "spare")
    with ferry_server(store, models, tmp, "--enable-model-api") as running:
        yield running


def _inference_stub(channel: grpc.Channel) -> Any:
    return inference_grpc.InferenceAPIsServiceStub(channel)  # type: ignore[no-untyped-call]


def _management_stub(channel: grpc.Channel) -> Any:
    return management_grpc.ManagementAPIsServiceStub(channel)  # type: ignore[no-untyped-call]


def _target(url: str) -> str:
    assert url.startswith("grpc://"), url
    return url.removeprefix("grpc://")


@pytest.fixture(scope="module")
def infer(server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(_target(server.grpc_url)) as channel:
        yield _inference_stub(channel)


@pytest.fixture(scope="module")
def manage(server: RunningServer) -> Iterator[Any]:
    with grpc.insecure_channel(_target(server.grpc_management_url)) as channel:
        yield _management_stub(channel)


def _predict(stub: Any, model: str, data: bytes, **fields: Any) -> Any:
    request = inference.PredictionsRequest(model_name=model, input={"data": data}, **fields)
    return stub.Predictions(request, timeout=TIMEOUT)


def _error(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


# --- inference -------------------------------------------------------------------------


def test_ping_answers_torchserves_health_json(infer: Any) -> None:
    answer = infer.Ping(empty_pb2.Empty(), timeout=TIMEOUT)
    assert answer.health == '{\n  "status": "Healthy"\n}'


def test_predictions_runs_the_handler_on_the_input_map(infer: Any) -> None:
    answer = _predict(infer, "doubler", b"[1, 2.5, -3]")
    assert json.loads(answer.prediction) == [2, 5, -6]
    versioned = _predict(infer, "doubler", b"[4]", model_version="1.0")
    assert json.loads(versioned.prediction) == [8]


def test_stream_predictions_sends_each_part_then_the_last(infer: Any) -> None:
    request = inference.PredictionsRequest(model_name="words", input={"data": b"one two three"})
    parts = [reply.prediction for reply in infer.StreamPredictions(request, timeout=TIMEOUT)]
    assert parts == [b"one ", b"two ", b"three"]


def test_unary_predictions_of_a_streaming_handler_joins_its_parts(infer: Any) -> None:
    assert _predict(infer, "words", b"a b c").prediction == b"a b c"


def test_an_unknown_model_is_internal_as_in_torchserve(infer: Any) -> None:
    error = _error(lambda: _predict(infer, "nobody", b"[1]"))
    assert error.code() == Code.INTERNAL
    assert "nobody" in (error.details() or "")
    stream = _error(
        lambda: list(
            infer.StreamPredictions(
                inference.PredictionsRequest(model_name="nobody"), timeout=TIMEOUT
            )
        )
    )
    assert stream.code() == Code.INTERNAL


def test_a_misspelt_model_name_is_answered_with_the_close_one(infer: Any) -> None:
    """Issue 51: the same message as REST's 404 body."""
    error = _error(lambda: _predict(infer, "dubler", b"[1]"))
    assert error.code() == Code.INTERNAL
    assert error.details() == "Model not found: dubler (did you mean 'doubler'?)"


def test_a_long_unknown_name_is_echoed_cut(infer: Any) -> None:
    """Issue 47, item 7: a 60 KB name in the status details went past gRPC's metadata
    limit, and the client got RESOURCE_EXHAUSTED ("Stream removed") instead."""
    error = _error(lambda: _predict(infer, "m" * 60_000, b"[1]"))
    assert error.code() == Code.INTERNAL
    details = error.details() or ""
    assert details.startswith("Model not found: mmm") and len(details) < 2_000
    assert details.endswith("... (60017 characters)")


def test_a_missing_model_name_is_refused_with_torchserves_words(infer: Any) -> None:
    error = _error(lambda: infer.Predictions(inference.PredictionsRequest(), timeout=TIMEOUT))
    assert error.code() == Code.INTERNAL
    assert error.details() == "Parameter model_name is required."


def test_bad_input_takes_the_handlers_status_through_torchserves_table(infer: Any) -> None:
    """The handler raises ``PredictionException(..., 422)``: another 4xx, FAILED_PRECONDITION."""
    error = _error(lambda: _predict(infer, "doubler", b'{"a": 1}'))
    assert error.code() == Code.FAILED_PRECONDITION
    assert "expected a JSON list of numbers" in (error.details() or "")


def test_a_failure_mid_stream_ends_the_stream_with_an_error(infer: Any) -> None:
    request = inference.PredictionsRequest(model_name="words", input={"data": b"x y FAIL"})
    received: list[bytes] = []

    def consume() -> None:
        for reply in infer.StreamPredictions(request, timeout=TIMEOUT):
            received.append(reply.prediction)

    error = _error(consume)
    assert error.code() == Code.INTERNAL
    assert received == [b"x ", b"y "]


def test_stream_predictions2_answers_each_message_in_order(infer: Any) -> None:
    """On a model without sequences too (the sequence's own rules are in
    test_stateful_sequences.py)."""
    requests = iter(
        [
            inference.PredictionsRequest(
                model_name="doubler", sequence_id="s1", input={"data": json.dumps([n]).encode()}
            )
            for n in (1, 2, 3)
        ]
    )
    answers = list(infer.StreamPredictions2(requests, timeout=TIMEOUT))
    assert [json.loads(a.prediction) for a in answers] == [[2.0], [4.0], [6.0]]
    assert {a.sequence_id for a in answers} == {"s1"}


# --- management ------------------------------------------------------------------------


def _msg(call: Any, request: Any) -> str:
    return str(call(request, timeout=TIMEOUT).msg)


def test_describe_and_list_answer_the_rest_json(manage: Any) -> None:
    described = json.loads(
        _msg(manage.DescribeModel, management.DescribeModelRequest(model_name="doubler"))
    )
    assert [d["modelName"] for d in described] == ["doubler"]
    assert described[0]["modelVersion"] == "1.0" and described[0]["workers"]
    listed = json.loads(_msg(manage.ListModels, management.ListModelsRequest(limit=100)))
    assert [m["modelName"] for m in listed["models"]] == ["doubler", "words"]
    paged = json.loads(_msg(manage.ListModels, management.ListModelsRequest(limit=1)))
    assert len(paged["models"]) == 1 and paged["nextPageToken"] == "1"
    last = management.ListModelsRequest(limit=1, next_page_token=1)
    assert [m["modelName"] for m in json.loads(_msg(manage.ListModels, last))["models"]] == [
        "words"
    ]
    capped = json.loads(_msg(manage.ListModels, management.ListModelsRequest(limit=-1)))
    assert len(capped["models"]) == 2  # out of 0..100: 100, as TorchServe pages


def test_list_models_without_a_limit_is_an_empty_page_as_in_torchserve(manage: Any) -> None:
    """proto3 sends no limit as 0, and TorchServe's gRPC ListModels pages 0 models then
    (``ApiUtils.getModelList``), though its proto's comment promises 100."""
    unset = json.loads(_msg(manage.ListModels, management.ListModelsRequest()))
    assert unset == {"models": []}
    later = management.ListModelsRequest(next_page_token=1)
    assert json.loads(_msg(manage.ListModels, later)) == {"models": []}


def test_describe_an_unknown_model_is_not_found(manage: Any) -> None:
    request = management.DescribeModelRequest(model_name="nobody")
    assert _error(lambda: manage.DescribeModel(request, timeout=TIMEOUT)).code() == Code.NOT_FOUND
    customized = management.DescribeModelRequest(model_name="nobody", customized=True)
    error = _error(lambda: manage.DescribeModel(customized, timeout=TIMEOUT))
    assert error.code() == Code.INTERNAL


def test_register_scale_set_default_and_unregister(manage: Any, infer: Any) -> None:
    registered = _msg(
        manage.RegisterModel,
        management.RegisterModelRequest(url="spare.mar", initial_workers=1, synchronous=True),
    )
    assert registered == 'Model "spare" Version: 1.0 registered with 1 initial workers'
    assert _predict(infer, "spare", b"hello").prediction  # it answers
    again = _error(
        lambda: manage.RegisterModel(
            management.RegisterModelRequest(url="spare.mar", synchronous=True), timeout=TIMEOUT
        )
    )
    assert again.code() == Code.ABORTED  # 409 in REST
    scaled = _msg(
        manage.ScaleWorker,
        management.ScaleWorkerRequest(model_name="spare", min_worker=2, synchronous=True),
    )
    assert scaled == "Workers scaled to 2 for model: spare"
    described = json.loads(
        _msg(manage.DescribeModel, management.DescribeModelRequest(model_name="spare"))
    )
    assert described[0]["minWorkers"] == 2
    assert (
        _msg(manage.ScaleWorker, management.ScaleWorkerRequest(model_name="spare"))
        == "Processing worker updates..."
    )
    set_default = _msg(
        manage.SetDefault, management.SetDefaultRequest(model_name="spare", model_version="1.0")
    )
    assert set_default == 'Default version successfully updated for model "spare" to "1.0"'
    unregistered = _msg(
        manage.UnregisterModel, management.UnregisterModelRequest(model_name="spare")
    )
    assert unregistered == 'Model "spare" unregistered'
    gone = _error(
        lambda: manage.UnregisterModel(
            management.UnregisterModelRequest(model_name="spare"), timeout=TIMEOUT
        )
    )
    assert gone.code() == Code.NOT_FOUND


def test_management_errors_take_torchserves_codes(manage: Any) -> None:
    no_url = _error(
        lambda: manage.RegisterModel(management.RegisterModelRequest(), timeout=TIMEOUT)
    )
    assert no_url.code() == Code.INVALID_ARGUMENT
    assert no_url.details() == "Parameter url is required."
    missing = _error(
        lambda: manage.RegisterModel(
            management.RegisterModelRequest(url="absent.mar", synchronous=True), timeout=TIMEOUT
        )
    )
    assert missing.code() == Code.NOT_FOUND
    unknown = management.ScaleWorkerRequest(model_name="nobody", synchronous=True)
    scale = _error(lambda: manage.ScaleWorker(unknown, timeout=TIMEOUT))
    assert scale.code() == Code.NOT_FOUND
    version = management.SetDefaultRequest(model_name="doubler", model_version="9.9")
    assert _error(lambda: manage.SetDefault(version, timeout=TIMEOUT)).code() == Code.NOT_FOUND


# --- malformed requests ---------------------------------------------------------------


def _raw(channel: grpc.Channel, method: str, streamed: bool = False) -> grpc.RpcError:
    """``method`` called with bytes that are no protobuf message at all."""
    if streamed:
        replies: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(method)
        return _error(lambda: list(replies(b"\xff\xff\xff", timeout=TIMEOUT)))
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
    return _error(lambda: call(b"\xff\xff\xff", timeout=TIMEOUT))


@pytest.mark.parametrize(
    ("method", "message", "streamed"),
    [
        ("Predictions", "PredictionsRequest", False),
        ("StreamPredictions", "PredictionsRequest", True),
        ("Ping", "Empty", False),
    ],
)
def test_a_malformed_inference_message_is_invalid_argument(
    server: RunningServer, method: str, message: str, streamed: bool
) -> None:
    with grpc.insecure_channel(_target(server.grpc_url)) as channel:
        error = _raw(
            channel, f"/org.pytorch.serve.grpc.inference.InferenceAPIsService/{method}", streamed
        )
    assert error.code() == Code.INVALID_ARGUMENT
    assert error.details() == f"the request is not a valid {message} message"
    assert "DecodeError" not in server.log()


def test_a_malformed_management_message_is_invalid_argument(server: RunningServer) -> None:
    method = "/org.pytorch.serve.grpc.management.ManagementAPIsService/RegisterModel"
    with grpc.insecure_channel(_target(server.grpc_management_url)) as channel:
        error = _raw(channel, method)
    assert error.code() == Code.INVALID_ARGUMENT
    assert error.details() == "the request is not a valid RegisterModelRequest message"


# --- auth ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Keys on, the gRPC inference API beyond loopback (so it needs the inference key)."""
    tmp = tmp_path_factory.mktemp("grpc-auth")
    store = tmp / "store"
    store.mkdir()
    models = [f"doubler={ts_style_archive(store)}"]
    with ferry_server(
        store, models, tmp, "--grpc-inference-address", "0.0.0.0", auth=True
    ) as running:
        yield running


def _keys(server: RunningServer) -> dict[str, str]:
    key_file = Path(server.log_path).parent / "key_file.json"
    document = json.loads(key_file.read_text())
    return {api: document[api]["key"] for api in ("inference", "management")}


def _bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def test_keys_are_checked_as_torchserve_checks_them(keyed_server: RunningServer) -> None:
    keys = _keys(keyed_server)
    port = keyed_server.grpc_url.rsplit(":", 1)[1]
    request = inference.PredictionsRequest(model_name="doubler", input={"data": b"[2]"})
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = _inference_stub(channel)
        denied = _error(lambda: stub.Predictions(request, timeout=TIMEOUT))
        assert denied.code() == Code.PERMISSION_DENIED and denied.details() == DENIED
        wrong = _error(
            lambda: stub.Predictions(request, timeout=TIMEOUT, metadata=_bearer(keys["management"]))
        )
        assert wrong.code() == Code.PERMISSION_DENIED
        streamed = _error(lambda: list(stub.StreamPredictions(request, timeout=TIMEOUT)))
        assert streamed.code() == Code.PERMISSION_DENIED
        answer = stub.Predictions(request, timeout=TIMEOUT, metadata=_bearer(keys["inference"]))
        assert json.loads(answer.prediction) == [4]
        assert "Healthy" in stub.Ping(empty_pb2.Empty(), timeout=TIMEOUT).health  # open
    with grpc.insecure_channel(_target(keyed_server.grpc_management_url)) as channel:
        manage = _management_stub(channel)
        listing = management.ListModelsRequest(limit=10)
        refused = _error(lambda: manage.ListModels(listing, timeout=TIMEOUT))
        assert refused.code() == Code.PERMISSION_DENIED
        inference_key = _bearer(keys["inference"])
        refused = _error(
            lambda: manage.ListModels(listing, timeout=TIMEOUT, metadata=inference_key)
        )
        assert refused.code() == Code.PERMISSION_DENIED
        listed = manage.ListModels(listing, timeout=TIMEOUT, metadata=_bearer(keys["management"]))
        assert json.loads(listed.msg)["models"][0]["modelName"] == "doubler"


def test_the_model_api_switch_is_permission_denied(keyed_server: RunningServer) -> None:
    keys = _keys(keyed_server)
    with grpc.insecure_channel(_target(keyed_server.grpc_management_url)) as channel:
        manage = _management_stub(channel)
        request = management.UnregisterModelRequest(model_name="doubler")
        error = _error(
            lambda: manage.UnregisterModel(
                request, timeout=TIMEOUT, metadata=_bearer(keys["management"])
            )
        )
        assert error.code() == Code.PERMISSION_DENIED
        assert "--enable-model-api" in (error.details() or "")


# --- start-up --------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["inference", "management"])
def test_a_grpc_port_in_use_stops_start_up_in_one_line(tmp_path: Path, api: str) -> None:
    store = echo_store(tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        argv = [
            *FERRY,
            *serve_args(store, "--disable-token-auth", f"--grpc-{api}-port", str(port)),
        ]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    line = (
        f"ferry serve: cannot listen on grpc://127.0.0.1:{port} "
        f"(grpc_{api}_address, grpc_{api}_port): address already in use"
    )
    assert line in result.stderr.splitlines(), result.stderr
    assert "Traceback" not in result.stderr


def _certificate(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key: ``NAME.pem``, ``NAME.key``."""
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_grpc_over_tls_with_the_https_certificate(tmp_path: Path) -> None:
    store = echo_store(tmp_path)
    cert, key = _certificate(tmp_path, "cert")
    tls = ["--enable-grpc-ssl", "true", "--certificate-file", str(cert)]
    with ferry_server(store, [], tmp_path, *tls, "--private-key-file", str(key)) as running:
        assert running.grpc_url.startswith("grpcs://127.0.0.1:")
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        target = running.grpc_url.removeprefix("grpcs://")
        with grpc.secure_channel(target, credentials) as channel:
            health = _inference_stub(channel).Ping(empty_pb2.Empty(), timeout=TIMEOUT).health
        assert json.loads(health) == {"status": "Healthy"}
        with grpc.insecure_channel(target) as plain:
            refused = _error(lambda: _inference_stub(plain).Ping(empty_pb2.Empty(), timeout=5))
        assert refused.code() == Code.UNAVAILABLE


def test_a_key_that_is_not_the_certificates_stops_start_up_saying_so(tmp_path: Path) -> None:
    """gRPC fails such a pair as if the port were taken; Ferry names the pair (exit 2)."""
    store = echo_store(tmp_path)
    cert, _ = _certificate(tmp_path, "cert")
    _, other_key = _certificate(tmp_path, "other")
    tls = ["--enable-grpc-ssl", "true", "--certificate-file", str(cert)]
    argv = [
        *FERRY,
        *serve_args(store, "--disable-token-auth", *tls, "--private-key-file", str(other_key)),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "the private key does not match the certificate" in result.stderr, result.stderr
    assert str(other_key) in result.stderr and str(cert) in result.stderr
    assert "address already in use" not in result.stderr
    assert "Traceback" not in result.stderr
