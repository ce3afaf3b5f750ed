"""Handler loading rules, the batch runner, payload encoding and the built-in classifier."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ferry.errors import ArchiveError
from ferry.handlers.builtin.formats import load_model
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.model_loading import select_device
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.loader import load_entry_point
from ferry.wire.messages import InputPart, PredictBatch, RequestItem
from ferry.worker.payloads import encode_output, request_row
from ferry.worker.runner import BatchRunner
from tests.fixtures.handler_inputs import png
from tests.fixtures.models import DOUBLING_MODEL, Doubler, save_torchscript


def _context(model_dir: Path, manifest: dict[str, Any] | None = None, **yaml: Any) -> Context:
    return Context("m", str(model_dir), manifest or {"model": {}}, 4, None, model_yaml_config=yaml)


def _module(tmp: Path, name: str, source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp))


def test_function_entry_point_is_initialised_with_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(
        tmp_path,
        "fn_handler",
        "calls = []\ndef handle(data, context):\n"
        "    calls.append(data)\n    return data and [len(data)]\n",
        monkeypatch,
    )
    entry = load_entry_point("fn_handler.py", _context(tmp_path))
    assert entry([{"body": b""}], _context(tmp_path)) == [1]
    import fn_handler  # type: ignore[import-not-found]

    assert fn_handler.calls[0] is None


def test_named_function_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _module(
        tmp_path,
        "named_handler",
        "def go(data, context):\n    return data and ['go']\n",
        monkeypatch,
    )
    entry = load_entry_point("named_handler:go", _context(tmp_path))
    assert entry([{}], _context(tmp_path)) == ["go"]


def test_single_class_is_instantiated_and_initialised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(
        tmp_path,
        "cls_handler",
        "class H:\n    def initialize(self, ctx):\n        self.ready = True\n"
        "    def handle(self, data, ctx):\n        return [self.ready] * len(data)\n",
        monkeypatch,
    )
    entry = load_entry_point("cls_handler", _context(tmp_path))
    assert entry([{}, {}], _context(tmp_path)) == [True, True]


def test_two_classes_and_unknown_handlers_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _module(tmp_path, "two_handler", "class A: pass\nclass B: pass\n", monkeypatch)
    with pytest.raises(ArchiveError, match="exactly one class"):
        load_entry_point("two_handler", _context(tmp_path))
    with pytest.raises(ArchiveError, match="neither a file"):
        load_entry_point("no_such_handler", _context(tmp_path))
    _module(tmp_path, "needs_missing", "import surely_not_installed_pkg\n", monkeypatch)
    with pytest.raises(ModuleNotFoundError, match="surely_not_installed_pkg"):
        load_entry_point("needs_missing", _context(tmp_path))


def _item(rid: str, body: bytes, content_type: str = "application/octet-stream") -> RequestItem:
    return RequestItem(rid, {}, [InputPart("body", content_type, body)])


def test_payload_decoding_by_content_type() -> None:
    assert request_row(_item("a", b'{"x": 1}', "application/json")) == {"body": {"x": 1}}
    assert request_row(_item("a", b"hi", "text/plain; charset=utf-8")) == {"body": "hi"}
    row = request_row(_item("a", b"\x00"))
    assert row == {"body": bytearray(b"\x00")} and isinstance(row["body"], bytearray)
    form = RequestItem(
        "f", {}, [InputPart("data", "image/png", b"p"), InputPart("k", "text/plain", b"v")]
    )
    assert request_row(form) == {"data": bytearray(b"p"), "k": "v"}


def test_output_encoding() -> None:
    assert encode_output(b"raw", None) == (b"raw", "application/octet-stream")
    assert encode_output("txt", None) == (b"txt", "text/plain; charset=utf-8")
    assert encode_output({"t": torch.tensor([1, 2])}, None) == (
        b'{"t": [1, 2]}',
        "application/json",
    )
    assert encode_output([1], "application/x-custom")[1] == "application/x-custom"


def test_a_tensor_answer_is_torch_saved_as_torchserve_sends_it() -> None:
    """TorchServe's workflows pass tensors between nodes this way (its densenet example
    ``torch.load``s its parent's answer); JSON broke them."""
    body, content_type = encode_output(torch.arange(6.0).reshape(2, 3), None)
    assert content_type == "application/octet-stream"
    loaded = torch.load(io.BytesIO(body), weights_only=True)
    assert torch.equal(loaded, torch.arange(6.0).reshape(2, 3))


def _runner(entry: Any) -> BatchRunner:
    return BatchRunner(entry, Context("m", "/", {}, 4, None))


def test_runner_isolates_a_request_that_breaks_its_batch() -> None:
    def handle(data: list[dict[str, Any]], context: Context) -> list[Any]:
        if any(row["body"] == b"bad" for row in data):
            raise ValueError("bad row")
        context.set_response_status(201, "Created", 0)
        return [bytes(row["body"]).upper() for row in data]

    batch = PredictBatch(1, [_item("a", b"x"), _item("b", b"bad"), _item("c", b"z")])
    results = _runner(handle).run(batch).results
    assert [r.request_id for r in results] == ["a", "b", "c"]
    assert [r.body for r in results] == [b"X", b"", b"Z"]
    assert results[1].error_kind == "handler" and "bad row" in results[1].message
    assert results[0].status == 201


def test_runner_drains_handler_metrics_every_batch() -> None:
    def handle(data: list[Any], context: Context) -> list[Any]:
        context.metrics.add_counter("Seen", len(data), None, {"model": "m"})
        return ["ok"] * len(data)

    runner = _runner(handle)
    first = runner.run(PredictBatch(1, [_item("a", b"x"), _item("b", b"y")])).metrics
    second = runner.run(PredictBatch(2, [_item("c", b"z")])).metrics
    # TorchServe's default dimensions join the handler's own.
    dimensions = {"model": "m", "ModelName": "m", "Level": "Model"}
    assert [(m.name, m.value, m.dimensions) for m in first] == [("Seen", 2.0, dimensions)]
    assert [m.value for m in second] == [1.0]


def test_runner_reports_wrong_length_and_bad_json_input() -> None:
    results = (
        _runner(lambda data, ctx: [1])
        .run(PredictBatch(1, [_item("a", b"1"), _item("b", b"2")]))
        .results
    )
    assert all("1 results for a batch of 2" in r.message for r in results)
    mixed = PredictBatch(2, [_item("a", b"{", "application/json"), _item("b", b"ok")])
    results = _runner(lambda data, ctx: ["fine"] * len(data)).run(mixed).results
    assert results[0].error_kind == "invalid_input" and results[1].body == b"fine"


def test_runner_passes_headers_and_returns_response_headers() -> None:
    def handle(data: list[Any], context: Context) -> list[Any]:
        context.set_response_header(0, "X-Echo", context.get_request_header(0, "X-In") or "")
        context.set_response_content_type(0, "text/csv")
        return ["a,b"]

    item = RequestItem("r", {"x-in": "hello"}, [InputPart("body", "text/plain", b"")])
    (result,) = _runner(handle).run(PredictBatch(1, [item])).results
    assert result.headers == {"x-echo": "hello"} and result.content_type == "text/csv"


@pytest.mark.parametrize("weights_format", ["torchscript", "eager", "pt2"])
def test_model_formats_load_and_run_batched(tmp_path: Path, weights_format: str) -> None:
    model_file = None
    if weights_format == "torchscript":
        save_torchscript(Doubler(), tmp_path / "m.pt")
        serialized = "m.pt"
    elif weights_format == "eager":
        torch.save(Doubler().state_dict(), tmp_path / "m.pt")
        (tmp_path / "eager_model.py").write_text(DOUBLING_MODEL)
        serialized, model_file = "m.pt", "eager_model.py"
    else:
        batch = torch.export.Dim("batch", min=1, max=64)
        program = torch.export.export(Doubler(), (torch.ones(2, 3),), dynamic_shapes=({0: batch},))
        torch.export.save(program, str(tmp_path / "m.pt2"))
        serialized = "m.pt2"
    model = load_model(tmp_path, serialized, model_file, select_device(None))
    assert model is not None
    with torch.inference_mode():
        for size in (1, 5):
            assert torch.equal(model(torch.ones(size, 3)), torch.full((size, 3), 2.0))


def test_eager_weights_are_loaded_with_weights_only(tmp_path: Path) -> None:
    # A pickle that is not a plain state_dict is refused by torch.load(weights_only=True).
    torch.save({"weight": Doubler()}, tmp_path / "m.pt")
    (tmp_path / "eager_model2.py").write_text("import torch\nclass M(torch.nn.Module):\n    pass\n")
    with pytest.raises(Exception, match=r"[Ww]eights only"):
        load_model(tmp_path, "m.pt", "eager_model2.py", select_device(None))


class _ColourModel(torch.nn.Module):
    """Class 0 for red images, class 1 for blue ones."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (
            torch.stack([x[:, 0].mean((1, 2)), x[:, 2].mean((1, 2)), torch.zeros(len(x))], dim=1)
            * 10
        )


def test_image_classifier_batch_with_one_undecodable_image(tmp_path: Path) -> None:
    (tmp_path / "index_to_name.json").write_text(json.dumps({"0": "red", "1": "blue", "2": "none"}))
    handler = ImageClassifier()
    context = _context(tmp_path, image_classifier={"resize": 16, "crop": 16, "topk": 2})
    handler.initialize(context)
    handler.model = _ColourModel()
    rows: list[dict[str, Any]] = [
        {"body": bytearray(png((255, 0, 0), size=(40, 30)))},
        {"data": bytearray(b"garbage")},
        {"body": base64.b64encode(png((0, 0, 255), size=(40, 30))).decode()},
    ]
    context.start_batch(["a", "b", "c"], [{}, {}, {}])
    red, broken, blue = handler.handle(rows, context)
    assert max(red, key=red.get) == "red" and len(red) == 2
    assert isinstance(broken, Exception) and "cannot decode image" in str(broken)
    assert max(blue, key=blue.get) == "blue"


def test_base_handler_keeps_torchserve_loading_helpers(tmp_path: Path) -> None:
    from ferry.handlers.builtin.base_handler import BaseHandler

    save_torchscript(Doubler(), tmp_path / "m.pt")
    torch.save(Doubler().state_dict(), tmp_path / "w.pt")
    (tmp_path / "helper_model.py").write_text(DOUBLING_MODEL)
    handler = BaseHandler()
    scripted = handler._load_torchscript_model(str(tmp_path / "m.pt"))
    eager = handler._load_pickled_model(str(tmp_path), "helper_model.py", str(tmp_path / "w.pt"))
    for model in (scripted, eager):
        assert torch.equal(model(torch.ones(2, 1)), torch.full((2, 1), 2.0))


def test_explanations_without_captum_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from ferry.handlers.builtin.insights import IntegratedGradients
    from ferry.handlers.contract.exceptions import PredictionException

    real_import = builtins.__import__

    def no_captum(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("captum"):
            raise ImportError("No module named 'captum'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_captum)
    monkeypatch.delitem(sys.modules, "captum.attr", raising=False)
    monkeypatch.delitem(sys.modules, "captum", raising=False)
    with pytest.raises(PredictionException) as raised:
        IntegratedGradients(torch.nn.Linear(2, 2)).attribute(torch.ones(1, 2), 0)
    assert raised.value.error_code == 501
    assert "pip install 'ferry-serve[explain]'" in raised.value.message


def test_explanations_run_on_the_input_the_served_model_takes(tmp_path: Path) -> None:
    """With ``precision`` and ``batch_buckets``, attributions come from the cast input
    (bf16 weights refused fp32 input before) and padded rows are dropped."""
    pytest.importorskip("captum")
    handler = ImageClassifier()
    config = {"optimization": {"precision": "bf16", "batch_buckets": [4]}}
    handler.initialize(
        Context("m", str(tmp_path), {"model": {}}, 4, None, model_yaml_config=config)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 3))
    handler.model = model.to(torch.bfloat16).eval()
    attributions = handler.get_insights(torch.rand(2, 3, 8, 8), None, 1)
    assert len(attributions) == 2
    assert torch.tensor(attributions).shape == (2, 3, 8, 8)
