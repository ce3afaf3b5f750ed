"""Ferry's side of the ``ts.*`` surface: label mapping, ``import_class``, ``timed``, the
custom-metrics API, ``MicroBatching``, ``TextClassifier`` and ``BaseEnvelope``."""

from __future__ import annotations

import collections
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.text_classifier import TextClassifier
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.metrics import Dimension, HandlerMetrics, MetricTypes
from ferry.handlers.torchserve.mock_context import MockContext
from ferry.handlers.torchserve.request_envelope import BaseEnvelope
from ferry.handlers.torchserve.timer import timed
from ferry.handlers.torchserve.ts_utils import import_class, map_class_to_label
from ferry.worker.micro_batching import MicroBatching


def test_map_class_to_label() -> None:
    probs = [[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]]
    assert map_class_to_label(probs) == [
        {"0": 0.7, "1": 0.2, "2": 0.1},
        {"0": 0.1, "1": 0.1, "2": 0.8},
    ]
    mapping = {"0": "cat", "2": "dog"}
    assert map_class_to_label([[0.9, 0.1]], mapping, [[2, 1]]) == [{"dog": 0.9, "1": 0.1}]
    with pytest.raises(TypeError, match="mapping must be a dict"):
        map_class_to_label(probs, ["cat"])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        map_class_to_label(probs, None, [[0, 1, 2]])


def test_import_class() -> None:
    assert import_class("collections.OrderedDict") is collections.OrderedDict
    assert import_class("OrderedDict", module_prefix="collections") is collections.OrderedDict
    assert import_class("metrics.Dimension", module_prefix="ferry.handlers.contract") is Dimension
    with pytest.raises(ImportError, match="not found in module 'collections'"):
        import_class("collections.NoSuchClass")
    with pytest.raises(ImportError, match="names no module"):
        import_class("OrderedDict")
    with pytest.raises(ModuleNotFoundError):
        import_class("no_such_module.Thing")


class _Timed:
    def __init__(self, context: Context | None) -> None:
        self.context = context

    @timed
    def preprocess(self, data: list[int]) -> list[int]:
        """Doubles."""
        return [2 * x for x in data]

    @timed
    def inference(self, data: list[int]) -> list[int]:
        raise RuntimeError("boom")


def test_timed_records_each_call_in_ms_under_the_method_name() -> None:
    context = MockContext(model_pt_file=None)
    handler = _Timed(context)
    assert handler.preprocess([1, 2]) == [2, 4]
    assert _Timed.preprocess.__doc__ == "Doubles."
    with pytest.raises(RuntimeError):
        handler.inference([1])
    recorded = context.metrics.drain()
    assert [(m.name, m.unit, m.kind) for m in recorded] == [
        ("preprocess", "ms", "gauge"),
        ("inference", "ms", "gauge"),  # recorded even when the method raises
    ]
    assert all(m.value >= 0 for m in recorded)
    assert _Timed(None).preprocess([1]) == [2]  # no context: nothing to record into


def test_custom_metrics_api() -> None:
    metrics = HandlerMetrics("m")
    metrics.add_metric("Hits", 2, "count", None, [Dimension("route", "a")])
    metrics.add_metric("Temp", 41.5, "C", metric_type=MetricTypes.GAUGE)
    metrics.get_metric("Hits").add_or_update(3, ["b", "m", "Model"])
    declared = metrics.add_metric_to_cache("Lat", "ms", ["op"], MetricTypes.HISTOGRAM)
    declared.add_or_update(7, ["read"])
    declared.update(8, dimensions=[Dimension("op", "write")])
    metrics.get_metric("Unknown", MetricTypes.GAUGE).add_or_update(1)
    metrics.add_time("T", 5, metric_type=MetricTypes.COUNTER)
    metrics.add_counter("C", dimensions={"k": "v"})
    recorded = [(m.name, m.value, m.unit, m.kind, m.dimensions) for m in metrics.drain()]
    model = (("Level", "Model"), ("ModelName", "m"))  # TorchServe's default dimensions
    assert recorded == [
        ("Hits", 2.0, "count", "counter", (*model, ("route", "a"))),
        ("Temp", 41.5, "C", "gauge", model),
        ("Hits", 3.0, "count", "counter", (*model, ("route", "b"))),
        ("Lat", 7.0, "ms", "histogram", (("op", "read"),)),
        ("Lat", 8.0, "ms", "histogram", (("op", "write"),)),
        ("Unknown", 1.0, "count", "gauge", ()),
        ("T", 5.0, "ms", "counter", model),
        ("C", 1.0, "count", "counter", (*model, ("k", "v"))),
    ]
    # As in TorchServe, a value with the wrong number of dimension values is dropped.
    declared.add_or_update(1, [])
    assert metrics.drain() == []


class _Staged(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.handle = MicroBatching(self, micro_batch_size=2)  # type: ignore[method-assign]

    def preprocess(self, data: list[Any]) -> Any:
        if -1 in data:
            raise ValueError("bad row")
        return list(data)

    def inference(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return [x * 10 for x in data]

    def postprocess(self, data: Any) -> list[Any]:
        return [(x, len(data), threading.current_thread().name) for x in data]


def test_micro_batching_delegates_to_the_stage_pipeline() -> None:
    handler = _Staged()
    handle = handler.handle
    assert isinstance(handle, MicroBatching) and handle.__self__ is handler
    handle.parallelism = {"preprocess": 2, "postprocess": 3}
    assert handle.parallelism == {"preprocess": 2, "inference": 1, "postprocess": 3}
    context = MockContext(model_pt_file=None)
    answers = handle([1, 2, 3, 4, 5], context)
    assert [a[:2] for a in answers] == [(10, 2), (20, 2), (30, 2), (40, 2), (50, 1)]
    assert all(a[2].startswith("post") for a in answers)
    handle.micro_batch_size = 5
    failed = handle([1, -1, 3], context)
    assert all(isinstance(a, ValueError) for a in failed)
    handle.shutdown()
    with pytest.raises(ValueError):
        handle.parallelism = {"decode": 1}
    with pytest.raises(ValueError):
        handle.micro_batch_size = 0


class _BagModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(4, 2, mode="sum")
        with torch.no_grad():
            self.bag.weight.copy_(torch.tensor([[0, 0], [5, 0], [0, 5], [0, 0]]))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bag(ids, offsets)  # type: ignore[no-any-return]


def test_text_classifier_with_a_vocabulary(tmp_path: Path) -> None:
    torch.save(["<unk>", "good", "bad", "meh"], tmp_path / "source_vocab.pt")
    (tmp_path / "index_to_name.json").write_text('{"0": "positive", "1": "negative"}')
    handler = TextClassifier()
    handler.initialize(MockContext(model_pt_file=None, model_dir=str(tmp_path)))
    handler.model = _BagModel()
    rows: Any = [{"data": b"Good good"}, {"body": "bad unknown"}]
    answers = handler.handle(rows, MockContext(model_pt_file=None, model_dir=str(tmp_path)))
    assert answers[0]["positive"] > 0.99 and answers[1]["negative"] > 0.99


def test_text_classifier_without_a_vocabulary_passes_the_texts(tmp_path: Path) -> None:
    handler = TextClassifier()
    handler.initialize(MockContext(model_pt_file=None, model_dir=str(tmp_path)))
    assert handler.preprocess([{"data": bytearray(b"hello")}, {"body": "world"}]) == [
        "hello",
        "world",
    ]


def test_base_envelope_wraps_a_handle_function() -> None:
    class Listed(BaseEnvelope):
        def parse_input(self, data: Any) -> Any:
            return [row["x"] for row in data]

        def format_output(self, data: Any) -> Any:
            return [{"y": y} for y in data]

    envelope = Listed(lambda rows, context: [r + 1 for r in rows])
    context = MockContext(model_pt_file=None)
    assert envelope.handle([{"x": 1}, {"x": 2}], context) == [{"y": 2}, {"y": 3}]
    with pytest.raises(NotImplementedError):
        BaseEnvelope(lambda rows, context: rows).handle([{"x": 1}], context)
    # As TorchServe's: an empty batch is neither parsed nor formatted.
    assert BaseEnvelope(lambda rows, context: rows).handle([], context) == []


def test_metrics_survive_a_copy_into_a_preprocess_process() -> None:
    metrics = HandlerMetrics()
    metric = metrics.add_metric_to_cache("Hits", "count")
    copy = pickle.loads(pickle.dumps(metric))
    copy.add_or_update(2)
    assert [m.value for m in copy._sink.drain()] == [2.0]
