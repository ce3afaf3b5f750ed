"""``sagemaker_inference`` and ``sagemaker_pytorch_serving_container`` as an inference.py
imports them: Ferry's shims, in this process over the fixture model folders."""

from __future__ import annotations

import doctest
import importlib
import io
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ferry.handlers.contract.context import Context
from ferry.handlers.sagemaker import toolkit
from ferry.handlers.sagemaker.handler import SageMakerHandler
from ferry.handlers.sagemaker.toolkit_handlers import (
    DefaultInferenceHandler,
    DefaultPytorchInferenceHandler,
)
from tests.fixtures.sagemaker_models import scripted_model, toolkit_model, toolkit_net


@pytest.fixture(autouse=True)
def _fresh_modules() -> Iterator[None]:
    before = list(sys.path)
    yield
    for name in list(sys.modules):
        if name == "inference" or name.startswith(toolkit.SHIMMED_PACKAGES):
            del sys.modules[name]
    sys.path[:] = before


def _answers(folder: Path, requests: list[tuple[bytes, dict[str, str]]]) -> list[tuple[int, Any]]:
    context = Context("model", str(folder), {}, batch_size=4, gpu=None)
    handler = SageMakerHandler()
    handler.initialize(context)
    context.start_batch([f"r{i}" for i in range(len(requests))], [h for _, h in requests])
    answers = handler.handle([{"body": body} for body, _ in requests], context)
    return [(context.get_response_status(i)[0], a) for i, a in enumerate(answers)]


def test_an_inference_py_importing_the_toolkits_is_served_unchanged(tmp_path: Path) -> None:
    images = torch.rand(2, 784)
    stream = io.BytesIO()
    np.save(stream, images.numpy())
    csv = {"content-type": "text/csv", "accept": "text/csv"}
    answers = _answers(
        toolkit_model(tmp_path / "m"),
        [
            (json.dumps(images.tolist()).encode(), {"content-type": "application/json"}),
            (stream.getvalue(), {"content-type": "application/x-npy", "accept": "text/csv"}),
            (b"\x89PNG", {"content-type": "image/png"}),
            (
                json.dumps(images[:1].tolist()).encode(),
                {"content-type": "application/json", "accept": "text/html"},
            ),
            ("\n".join(",".join(map(str, row)) for row in images.tolist()).encode(), csv),
        ],
    )
    with torch.no_grad():
        expected = torch.log_softmax(toolkit_net()(images), dim=1).numpy()
    assert [status for status, _ in answers] == [200, 200, 415, 500, 200]
    assert np.allclose(json.loads(answers[0][1]), expected, atol=1e-5)
    assert np.allclose(np.loadtxt(io.StringIO(answers[1][1]), delimiter=","), expected, atol=1e-5)
    assert answers[2][1] == "image/png is not read here"  # GenericInferenceToolkitError
    assert answers[3][1].startswith("Content type text/html is not supported")
    assert np.allclose(np.loadtxt(io.StringIO(answers[4][1]), delimiter=","), expected, atol=1e-5)


def test_the_shims_are_ferrys_toolkit_module() -> None:
    toolkit.add_shims()
    errors = importlib.import_module("sagemaker_inference.errors")
    encoder = importlib.import_module("sagemaker_inference.encoder")
    handlers = importlib.import_module(
        "sagemaker_pytorch_serving_container.default_pytorch_inference_handler"
    )
    assert errors.BaseInferenceToolkitError is toolkit.BaseInferenceToolkitError
    assert encoder.encode is toolkit.encode
    assert handlers.DefaultPytorchInferenceHandler is DefaultPytorchInferenceHandler
    toolkit.add_shims()
    assert sys.path.count(str(toolkit.SHIM_ROOT)) == 1


def test_the_codecs_keep_the_toolkits_shapes() -> None:
    assert doctest.testmod(toolkit).failed == 0
    assert toolkit.encode([1, 2], "text/csv") == "1\n2\n"  # str, as the toolkit's
    npy = toolkit.encode(np.arange(3), "application/x-npy")
    assert isinstance(npy, bytes) and np.load(io.BytesIO(npy)).tolist() == [0, 1, 2]
    with pytest.raises(toolkit.UnsupportedFormatError, match="Content type text/xml"):
        toolkit.encode([1], "text/xml")
    with pytest.raises(toolkit.UnsupportedFormatError, match="Content type image/png"):
        toolkit.decode(b"x", "image/png")
    error = toolkit.GenericInferenceToolkitError(400)
    assert (error.status_code, error.message, error.phrase) == (
        400,
        "Invalid Request",
        "Invalid Request",
    )
    assert toolkit.parse_accept("application/json, text/csv") == ["application/json", "text/csv"]
    assert toolkit.retrieve_content_type_header({"Accept": "a", "ContentType": "b"}) == "b"
    assert toolkit.remove_crlf("a\r\nb") == "a  b"


def test_npz_needs_scipy_as_in_the_toolkit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy", None)  # not installed
    with pytest.raises(toolkit.UnsupportedFormatError, match="add scipy to code/requirements"):
        toolkit.decode(b"PK", "application/x-npz")


def test_npz_is_read_by_scipy_where_the_model_installed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[bytes] = []

    def load_npz(stream: io.BytesIO) -> str:
        read.append(stream.read())
        return "matrix"

    sparse = types.ModuleType("scipy.sparse")
    sparse.load_npz = load_npz  # type: ignore[attr-defined]
    scipy = types.ModuleType("scipy")
    scipy.sparse = sparse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "scipy", scipy)
    monkeypatch.setitem(sys.modules, "scipy.sparse", sparse)
    assert toolkit.decode(b"PK\x03\x04", "application/x-npz") == "matrix"
    assert read == [b"PK\x03\x04"]


def test_the_default_handler_classes(tmp_path: Path) -> None:
    bare = DefaultInferenceHandler()
    with pytest.raises(NotImplementedError):
        bare.default_model_fn(str(tmp_path))
    assert bare.default_output_fn([1.5], "text/html, application/json") == (
        "[1.5]",
        "application/json",
    )
    scripted = scripted_model(tmp_path / "m")
    pytorch = DefaultPytorchInferenceHandler()
    model = pytorch.default_model_fn(str(tmp_path / "m"))
    data = pytorch.default_input_fn("[[1, 2, 3, 4]]", "application/json")
    prediction = pytorch.default_predict_fn(data, model)
    expected = scripted(torch.tensor([[1.0, 2.0, 3.0, 4.0]])).tolist()
    assert np.allclose(
        json.loads(pytorch.default_output_fn(prediction, "application/json")), expected
    )
    csv = pytorch.default_output_fn(prediction, "text/csv")
    assert isinstance(csv, bytes) and np.allclose(
        np.loadtxt(io.BytesIO(csv), delimiter=","), expected[0]
    )
    with pytest.raises(toolkit.UnsupportedFormatError):
        pytorch.default_output_fn(prediction, "text/html")
