"""``SageMakerHandler`` in this process, over the fixture model folders: what each
request's functions receive, and the toolkit's answers to failures."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ferry.handlers.contract.context import Context
from ferry.handlers.sagemaker.handler import SageMakerHandler
from ferry.store.manifest import Manifest
from tests.fixtures.sagemaker_handlers import (  # noqa: F401 (an autouse fixture)
    fresh_inference_module,
    loaded_handler,
)
from tests.fixtures.sagemaker_models import (
    functions_model,
    mnist_model,
    scripted_model,
    transform_model,
)


def _loaded(folder: Path) -> tuple[SageMakerHandler, Context]:
    return loaded_handler(folder, batch_size=4)


def _run(
    handler: SageMakerHandler, context: Context, requests: list[tuple[Any, dict[str, str]]]
) -> list[Any]:
    context.start_batch([f"r{i}" for i in range(len(requests))], [h for _, h in requests])
    return handler.handle([{"body": body} for body, _ in requests], context)


def test_the_defaults_serve_a_torchscript_file_in_json_csv_and_npy(tmp_path: Path) -> None:
    scripted = scripted_model(tmp_path / "m")
    handler, context = _loaded(tmp_path / "m")
    rows = [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]]
    expected = scripted(torch.tensor(rows)).tolist()
    stream = io.BytesIO()
    np.save(stream, np.array(rows, dtype=np.float32))
    outputs = _run(
        handler,
        context,
        [
            (json.dumps(rows).encode(), {"content-type": "application/json"}),
            (b"1,2,3,4\n0,-1,0.5,2\n", {"content-type": "text/csv", "accept": "text/csv"}),
            (
                stream.getvalue(),
                {"content-type": "application/x-npy", "accept": "application/x-npy"},
            ),
        ],
    )
    assert np.allclose(json.loads(outputs[0]), expected, atol=1e-6)
    assert np.allclose(np.loadtxt(io.StringIO(outputs[1].decode()), delimiter=","), expected)
    assert np.allclose(np.load(io.BytesIO(outputs[2])), expected, atol=1e-6)
    types = [context.get_response_content_type(i) for i in range(3)]
    assert types == ["application/json", "text/csv", "application/x-npy"]


def test_model_fn_alone_leaves_input_predict_and_output_to_the_defaults(tmp_path: Path) -> None:
    handler, context = _loaded(mnist_model(tmp_path / "m"))
    images = torch.rand(2, 1, 28, 28)
    (output,) = _run(
        handler, context, [(json.dumps(images.tolist()), {"content-type": "application/json"})]
    )
    with torch.no_grad():
        expected = handler.model.eval()(images)
    assert np.allclose(json.loads(output), expected.tolist(), atol=1e-5)


def test_each_request_of_a_batch_reads_its_own_headers_and_custom_attributes(
    tmp_path: Path,
) -> None:
    handler, context = _loaded(functions_model(tmp_path / "m", factor=2.0))
    attributes = "X-Amzn-SageMaker-Custom-Attributes"
    outputs = _run(
        handler,
        context,
        [
            (
                b'{"values": [1, 2]}',
                {"content-type": "application/json", attributes.lower(): "a=1"},
            ),
            (b'{"values": [5]}', {"content-type": "application/json", attributes.lower(): "b=2"}),
        ],
    )
    assert [json.loads(o) for o in outputs] == [
        {"scaled": [2.0, 4.0], "accept": "application/json", "attributes": "a=1"},
        {"scaled": [10.0], "accept": "application/json", "attributes": "b=2"},
    ]
    assert handler.model.gpu_id is None  # model_fn got the context too


def test_a_failure_answers_500_with_its_message_and_spares_the_batch(tmp_path: Path) -> None:
    handler, context = _loaded(functions_model(tmp_path / "m"))
    outputs = _run(
        handler,
        context,
        [
            (b"1,2", {"content-type": "text/csv"}),  # this model's input_fn reads JSON only
            (b'{"values": [1]}', {"content-type": "application/json"}),
        ],
    )
    assert outputs[0] == "this model reads application/json, not text/csv"
    assert context.get_response_status(0) == (500, outputs[0])
    assert context.get_response_content_type(0) == "text/plain; charset=utf-8"
    assert context.get_response_status(1)[0] == 200
    assert json.loads(outputs[1])["scaled"] == [3.0]


def test_an_unsupported_content_type_or_accept_is_a_500_naming_it(tmp_path: Path) -> None:
    scripted_model(tmp_path / "m")
    handler, context = _loaded(tmp_path / "m")
    outputs = _run(
        handler,
        context,
        [
            (b"\x89PNG", {"content-type": "image/png"}),
            (b"[[1, 2, 3, 4]]", {"content-type": "application/json", "accept": "application/xml"}),
        ],
    )
    assert "'image/png'" in outputs[0] and "'application/xml'" in outputs[1]
    assert [context.get_response_status(i)[0] for i in range(2)] == [500, 500]


def test_an_error_with_a_status_code_is_answered_with_it(tmp_path: Path) -> None:
    handler, context = _loaded(transform_model(tmp_path / "m"))
    outputs = _run(
        handler,
        context,
        [
            (b"abc", {"content-type": "text/csv"}),
            (bytearray(b"\x01\x02"), {"content-type": "application/octet-stream"}),
        ],
    )
    assert context.get_response_status(0) == (415, "send application/octet-stream, not text/csv")
    assert outputs[0] == "send application/octet-stream, not text/csv"
    assert json.loads(outputs[1]) == {"bytes": 2, "sum": 3.0}


def test_a_body_parsed_on_the_way_in_reaches_input_fn_as_json_text(tmp_path: Path) -> None:
    handler, context = _loaded(functions_model(tmp_path / "m"))
    context.start_batch(["r0"], [{"content-type": "application/json"}])
    (output,) = handler.handle([{"body": {"values": [2]}}], context)  # as /predictions decodes
    assert json.loads(output)["scaled"] == [6.0]


def test_sagemaker_program_picks_another_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = transform_model(tmp_path / "m")
    (folder / "code" / "inference.py").rename(folder / "code" / "serve_sm_test.py")
    monkeypatch.setenv("SAGEMAKER_PROGRAM", "serve_sm_test.py")
    try:
        handler, context = _loaded(folder)
        outputs = _run(handler, context, [(b"\x05", {"content-type": "application/octet-stream"})])
        assert json.loads(outputs[0]) == {"bytes": 1, "sum": 5.0}
    finally:
        sys.modules.pop("serve_sm_test", None)


def test_loading_fails_on_two_weight_files_or_an_eager_one(tmp_path: Path) -> None:
    scripted_model(tmp_path / "two", "a.pt")
    torch.save({"w": torch.ones(1)}, tmp_path / "two" / "b.pth")
    with pytest.raises(ValueError, match=r"found \['a.pt', 'b.pth'\]"):
        _loaded(tmp_path / "two")
    (tmp_path / "eager").mkdir()
    torch.save({"w": torch.ones(1)}, tmp_path / "eager" / "weights.pth")
    with pytest.raises(Exception, match="not a TorchScript model"):
        _loaded(tmp_path / "eager")


def test_a_folder_in_sagemakers_layout_reads_as_the_built_in_handlers_model(tmp_path: Path) -> None:
    folder = mnist_model(tmp_path / "m")
    (folder / "code" / "requirements.txt").write_text("numpy\n")
    manifest = Manifest.read(folder)
    assert (manifest.model_name, manifest.model_version) == ("model", "1.0")
    assert manifest.handler == "sagemaker_pytorch"
    assert manifest.requirements_file == "code/requirements.txt"
    scripted_model(tmp_path / "bare")
    assert Manifest.read(tmp_path / "bare").handler == "sagemaker_pytorch"
    (tmp_path / "neither").mkdir()
    with pytest.raises(Exception, match="no MAR-INF"):
        Manifest.read(tmp_path / "neither")
    # A TorchServe model folder that lost its manifest (a handler beside its weights) is
    # not taken for SageMaker's layout: it keeps its error.
    torchserve_like = tmp_path / "lost_manifest"
    scripted_model(torchserve_like)
    (torchserve_like / "handler.py").write_text("def handle(data, context):\n    return data\n")
    with pytest.raises(Exception, match="no MAR-INF"):
        Manifest.read(torchserve_like)
