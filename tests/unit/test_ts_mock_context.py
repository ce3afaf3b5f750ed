"""A handler unit test as a TorchServe user writes it: ``MockContext`` from the ``ts`` shim.

The ``ts`` modules are imported by name (``ts_module``) because mypy does not see the shim.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from ferry.worker.loading import SHIM_ROOT
from tests.fixtures.models import DOUBLING_MODEL, Doubler, save_torchscript


@pytest.fixture
def ts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ``ts`` shim importable, as in a worker; forgotten afterwards."""
    monkeypatch.syspath_prepend(str(SHIM_ROOT))
    yield
    for name in [m for m in sys.modules if m == "ts" or m.startswith("ts.")]:
        del sys.modules[name]


def ts_module(name: str) -> Any:
    """``ts.NAME``, as ``from ts.NAME import ...`` would find it in a worker."""
    return importlib.import_module(f"ts.{name}")


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    torch.save(Doubler().state_dict(), tmp_path / "doubler.pt")
    (tmp_path / "doubler_model.py").write_text(DOUBLING_MODEL)
    save_torchscript(Doubler(), tmp_path / "doubler.torchscript.pt")
    (tmp_path / "model-config.yaml").write_text(yaml.safe_dump({"handler": {"scale": 5}}))
    return tmp_path


def _context(model_dir: Path, **kwargs: Any) -> Any:
    MockContext = ts_module("torch_handler.unit_tests.test_utils.mock_context").MockContext

    arguments = {"model_pt_file": "doubler.pt", "model_file": "doubler_model.py", **kwargs}
    return MockContext(model_dir=str(model_dir), **arguments)


@pytest.mark.usefixtures("ts")
def test_a_handler_initialises_and_handles_with_a_mock_context(model_dir: Path) -> None:
    Context = ts_module("context").Context
    BaseHandler = ts_module("torch_handler.base_handler").BaseHandler

    context = _context(model_dir, model_yaml_config_file="model-config.yaml")
    assert isinstance(context, Context)
    handler = BaseHandler()
    handler.initialize(context)
    assert handler.initialized and handler.model is not None
    assert handler.model_yaml_config == {"handler": {"scale": 5}}
    assert handler.model_pt_path == str(model_dir / "doubler.pt")
    assert handler.model_dir == str(model_dir)
    assert (handler.map_location, handler.manifest["model"]["modelName"]) == ("cpu", "mnist")
    assert handler.describe_handle() is None
    assert handler.handle([[1.0, 2.0]], context) == [[2.0, 4.0]]
    handler_time = [m for m in context.metrics.drain() if m.name == "HandlerTime"]
    assert len(handler_time) == 1 and handler_time[0].unit == "ms"
    assert set(context.stage_ms) == {"preprocess", "inference", "postprocess"}


@pytest.mark.usefixtures("ts")
def test_model_loading_helpers(model_dir: Path) -> None:
    BaseHandler = ts_module("torch_handler.base_handler").BaseHandler

    handler = BaseHandler()
    handler.initialize(_context(model_dir, model_pt_file=None, model_file=None))
    assert handler.model is None and handler.model_pt_path is None
    eager = handler._load_pickled_model(
        str(model_dir), "doubler_model.py", str(model_dir / "doubler.pt")
    )
    scripted = handler._load_torchscript_model(str(model_dir / "doubler.torchscript.pt"))
    for model in (eager, scripted):
        assert not model.training
        assert model(torch.tensor([3.0])).tolist() == [6.0]


@pytest.mark.usefixtures("ts")
def test_explain_calls_get_insights_when_the_request_asks(model_dir: Path) -> None:
    BaseHandler = ts_module("torch_handler.base_handler").BaseHandler
    PredictionException = ts_module("utils.util").PredictionException

    class Explained(BaseHandler):  # type: ignore[valid-type,misc]
        def get_insights(self, tensor: Any, inputs: Any, target: int) -> list[Any]:
            return [{"inputs": inputs, "target": target, "rows": len(tensor)}]

    context = _context(model_dir)
    context.start_batch(["r0"], [{"explain": "True"}])
    explained = Explained()
    explained.initialize(context)
    rows: Any = [[1.0]]
    assert explained.handle(rows, context) == [{"inputs": None, "target": 0, "rows": 1}]
    assert explained._is_explain() and explained.explain
    plain = BaseHandler()
    plain.initialize(context)
    with pytest.raises(PredictionException) as raised:
        plain.handle(rows, context)
    assert raised.value.error_code == 501
    context.start_batch(["r1"], [{}])
    assert not plain._is_explain()


@pytest.mark.usefixtures("ts")
def test_streamed_parts_are_kept_on_the_context_in_a_unit_test(model_dir: Path) -> None:
    send_intermediate_predict_response = ts_module(
        "protocol.otf_message_handler"
    ).send_intermediate_predict_response

    context = _context(model_dir)
    send_intermediate_predict_response(["part"], context.request_ids, "ok", 200, context)
    assert [(r.output, r.status) for r in context.intermediate_responses] == [("part", 200)]


@pytest.mark.usefixtures("ts")
def test_every_documented_ts_module_imports() -> None:
    MicroBatching = ts_module("handler_utils.micro_batching").MicroBatching
    timed = ts_module("handler_utils.timer").timed
    import_class = ts_module("handler_utils.utils").import_class
    Dimension = ts_module("metrics.dimension").Dimension
    Metric = ts_module("metrics.metric").Metric
    MetricTypes = ts_module("metrics.metric_type_enum").MetricTypes
    BaseEnvelope = ts_module("torch_handler.request_envelope.base").BaseEnvelope
    TextClassifier = ts_module("torch_handler.text_classifier").TextClassifier
    get_yaml_config = ts_module("utils.util").get_yaml_config
    list_classes_from_module = ts_module("utils.util").list_classes_from_module
    load_label_mapping = ts_module("utils.util").load_label_mapping

    names = [MicroBatching, timed, import_class, Dimension, Metric, MetricTypes, BaseEnvelope]
    names += [TextClassifier, get_yaml_config, list_classes_from_module, load_label_mapping]
    assert all(names)
    assert json.dumps([t.name for t in MetricTypes]) == '["COUNTER", "GAUGE", "HISTOGRAM"]'
