"""The worker's stage pipeline: order, error isolation, bounded look-ahead, configuration."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from ferry.errors import ConfigError
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.contract.context import Context
from ferry.worker.pipeline import PipelineSettings, StagePipeline, staged_handler
from tests.fixtures.handler_inputs import batch_context, png


class Recorder:
    """A staged handler that squares numbers and records how far preprocessing ran ahead."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ready = 0
        self.most_ready = 0
        self.threads: set[str] = set()

    def preprocess(self, rows: list[dict[str, Any]]) -> torch.Tensor:
        values = [row["body"] for row in rows]
        if "bad" in values:
            raise ValueError("cannot preprocess 'bad'")
        with self.lock:
            self.threads.add(threading.current_thread().name)
            self.ready += 1
            self.most_ready = max(self.most_ready, self.ready)
        return torch.tensor(values, dtype=torch.float32)

    def inference(self, batch: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.ready -= 1
        return batch * batch

    def postprocess(self, output: torch.Tensor) -> list[float]:
        return output.tolist()

    def handle(self, data: Any, context: Context) -> Any:
        raise AssertionError("the pipeline calls the stages, not handle")


def test_results_come_back_in_order_from_several_threads() -> None:
    handler = Recorder()
    pipeline = StagePipeline(handler, PipelineSettings(3, 2, 2))
    rows = [{"body": i} for i in range(50)]
    context = batch_context(50)
    assert pipeline.handle(rows, context) == [float(i * i) for i in range(50)]
    assert handler.threads and all(name.startswith("pre") for name in handler.threads)
    assert handler.most_ready <= 2 + 1  # never more than parallelism + 1 micro-batches ahead
    assert {"preprocess", "inference", "postprocess"} <= set(context.stage_ms)
    pipeline.close()


def test_an_error_fails_only_its_micro_batch() -> None:
    pipeline = StagePipeline(Recorder(), PipelineSettings(2, 2, 1))
    rows = [{"body": v} for v in (1, 2, "bad", 4, 5, 6)]
    results = pipeline.handle(rows, batch_context(6))
    assert results[:2] == [1.0, 4.0] and results[4:] == [25.0, 36.0]
    assert all(isinstance(r, ValueError) for r in results[2:4])
    pipeline.close()


class PreparesNothing(Recorder):
    """TorchServe's dog-breed workflow pattern: ``preprocess`` may return None, and
    ``inference`` and ``postprocess`` still answer each request."""

    def preprocess(self, rows: list[dict[str, Any]]) -> Any:
        self.rows = len(rows)
        return None

    def inference(self, batch: Any) -> Any:
        assert batch is None
        return ["nothing"] * self.rows

    def postprocess(self, output: Any) -> list[Any]:
        return list(output)


def test_a_none_batch_still_goes_through_inference_and_postprocess() -> None:
    pipeline = StagePipeline(PreparesNothing(), PipelineSettings(2, 1, 1))
    assert pipeline.handle([{"body": i} for i in range(3)], batch_context(3)) == ["nothing"] * 3
    pipeline.close()


def test_image_classifier_keeps_per_request_decode_errors_in_the_pipeline(tmp_path: Any) -> None:
    handler = ImageClassifier()
    context = Context(
        "m",
        str(tmp_path),
        {"model": {}},
        8,
        None,
        model_yaml_config={"image_classifier": {"resize": 16, "crop": 16, "topk": 2}},
    )
    handler.initialize(context)
    handler.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 3))
    assert staged_handler(handler.handle) is handler
    pipeline = StagePipeline(handler, PipelineSettings(2, 2, 1))
    rows = [
        {"body": bytearray(png((255, 0, 0)))},
        {"body": bytearray(b"junk")},
        {"body": bytearray(png((0, 0, 255)))},
        {"body": bytearray(png((0, 255, 0)))},
        {"body": bytearray(b"junk")},
    ]
    results = pipeline.handle(rows, batch_context(5))
    assert [isinstance(r, Exception) for r in results] == [False, True, False, False, True]
    assert all(isinstance(r, dict) and len(r) == 2 for r in (results[0], results[2], results[3]))
    pipeline.close()


def test_configuration() -> None:
    assert PipelineSettings.from_model_config({}) is None
    settings = PipelineSettings.from_model_config(
        {"micro_batching": {"micro_batch_size": 4, "parallelism": {"preprocess": 3}}}
    )
    assert settings == PipelineSettings(4, 3, 1)
    in_processes = PipelineSettings.from_model_config({"micro_batching": {"pool": "Process"}})
    assert in_processes == PipelineSettings(1, 1, 1, preprocess_in_processes=True)
    for bad in (
        {"micro_batching": {"micro_batch_size": 0}},
        {"micro_batching": {"micro_batch_size": "x"}},
        {"micro_batching": [1]},
        {"micro_batching": {"pool": "fibers"}},
    ):
        with pytest.raises(ConfigError, match="micro_batching"):
            PipelineSettings.from_model_config(bad)
    assert staged_handler(lambda data, context: data) is None


def test_torch_helpers_leave_the_core_of_each_micro_batchs_inference() -> None:
    from ferry.worker import helper_threads
    from tests.fixtures.thread_controls import FakeControls, placement_that_found

    # The handler's thread wakes for each micro-batch's preprocessed input, perhaps on
    # another core: the helpers are placed again before its inference (and before the
    # batch: the first core).
    controls = FakeControls([0, 0, 1, 0], {0, 1}, live={11})
    helper_threads.install(placement_that_found(controls, {11}))
    pipeline = StagePipeline(Recorder(), PipelineSettings(2, 2, 1))
    try:
        assert pipeline.handle([{"body": i} for i in range(6)], batch_context(6)) == [
            float(i * i) for i in range(6)
        ]
    finally:
        helper_threads.forget_placement()
        pipeline.close()
    assert controls.moves == [(11, [1]), (11, [0]), (11, [1])]


class ThreadStarter(Recorder):
    """Its first inference "starts" a thread (in the fake controls' view)."""

    def __init__(self, controls: Any) -> None:
        super().__init__()
        self.controls = controls

    def inference(self, batch: torch.Tensor) -> torch.Tensor:
        if 11 not in self.controls.live:
            self.controls.live = {*self.controls.live, 11}
        return super().inference(batch)


@pytest.mark.parametrize("rows", [2, 6])
def test_while_helpers_are_sought_each_inference_runs_with_the_stage_threads_idle(
    rows: int,
) -> None:
    from ferry.worker import helper_threads
    from ferry.worker.helper_threads import HelperPlacement
    from tests.fixtures.thread_controls import FakeControls

    # Three micro-batches: no preprocess runs ahead of the inference that starts the team.
    controls = FakeControls([0, 0], {0, 1}, live={1})
    placement = HelperPlacement(2, controls)
    helper_threads.install(placement)
    handler = ThreadStarter(controls)
    pipeline = StagePipeline(handler, PipelineSettings(2, 2, 1))
    try:
        assert pipeline.handle([{"body": i} for i in range(rows)], batch_context(rows)) == [
            float(i * i) for i in range(rows)
        ]
    finally:
        helper_threads.forget_placement()
        pipeline.close()
    assert placement.helpers == [11]
    assert handler.most_ready == 1
