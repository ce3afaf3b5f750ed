"""The device path: pass-through on CPU; on a GPU, uploads on one stream and inference on
another. CI has no GPU, so the CUDA path runs here against a stand-in for ``torch.cuda``
(``tests/fixtures/fake_cuda.py``) that records which stream each step ran on and reports
a read on one stream of what another wrote without a wait between them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.device import CudaPath, HostPath, device_path_for
from ferry.handlers.builtin.optimize import Optimizations
from ferry.handlers.contract.context import Context
from ferry.worker.pipeline import PipelineSettings, StagePipeline
from tests.fixtures.fake_cuda import FakeCuda


def _cuda_path(cuda: FakeCuda) -> CudaPath:
    def pin(tensor: torch.Tensor) -> torch.Tensor:
        cuda.log("pin")
        return tensor.clone()

    return CudaPath(torch.device("cpu"), cuda=cuda, pin=pin)


def test_host_path_passes_tensors_through() -> None:
    path = device_path_for(torch.device("cpu"))
    assert isinstance(path, HostPath)
    batch = torch.ones(2, 3)
    assert path.upload(batch) is batch
    assert torch.equal(path.upload(batch, lambda t: t * 2), batch * 2)
    assert path.on_upload_stream(lambda: 7) == 7
    with path.compute():
        pass


def test_cuda_path_uploads_pinned_on_its_stream_and_waits_for_that_stream_only() -> None:
    cuda = FakeCuda()
    path = _cuda_path(cuda)

    def normalise(tensor: torch.Tensor) -> torch.Tensor:
        cuda.log("normalise")
        return tensor.float() / 255

    out = path.upload(torch.full((1, 3), 255, dtype=torch.uint8), normalise)
    assert out.tolist() == [[1.0, 1.0, 1.0]]
    assert [(what, stream) for what, stream, _ in cuda.events] == [
        ("upload waits for default", "default"),  # what the caller queued comes first
        ("pin", "upload"),
        ("normalise", "upload"),  # follow-up work stays on the upload stream
        ("sync upload", "default"),  # then the caller waits for that stream, not the device
    ]


def test_cuda_path_runs_inference_on_the_compute_stream_and_syncs_even_on_error() -> None:
    cuda = FakeCuda()
    path = _cuda_path(cuda)
    with path.compute():
        cuda.log("model")
    with pytest.raises(RuntimeError), path.compute():
        raise RuntimeError("model failed")
    assert [(what, stream) for what, stream, _ in cuda.events] == [
        ("compute waits for default", "default"),
        ("model", "compute"),
        ("sync compute", "default"),
        ("compute waits for default", "default"),
        ("sync compute", "default"),
    ]


class _Logged(torch.nn.Module):
    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.fake_cuda = cuda  # not ``self.cuda``: that would hide nn.Module.cuda()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake_cuda.log("model")
        return x.sum(1, keepdim=True)


def test_pipeline_uploads_in_preprocess_threads_and_infers_on_the_compute_stream() -> None:
    cuda = FakeCuda()
    handler = BaseHandler()
    handler.device = torch.device("cpu")
    handler._device_path = _cuda_path(cuda)
    handler.model = _Logged(cuda)
    pipeline = StagePipeline(handler, PipelineSettings(2, 2, 1))
    context = Context("m", ".", {"model": {}}, 6, None)
    context.start_batch([str(i) for i in range(6)], [{} for _ in range(6)])
    results = pipeline.handle([[float(i), 1.0] for i in range(6)], context)
    pipeline.close()
    assert results == [[float(i) + 1] for i in range(6)]
    pins = [(stream, thread) for what, stream, thread in cuda.events if what == "pin"]
    models = [(stream, thread) for what, stream, thread in cuda.events if what == "model"]
    assert len(pins) == 3 and all(s == "upload" and t.startswith("pre") for s, t in pins)
    assert len(models) == 3 and all(s == "compute" and t == "MainThread" for s, t in models)
    # Each micro-batch's inference is synchronised before its postprocess can read it.
    events = [what for what, _, _ in cuda.events]
    assert events.count("sync compute") == 3


def test_handler_device_path_follows_the_device_a_torchserve_handler_sets() -> None:
    handler = BaseHandler()
    assert isinstance(handler.device_path, HostPath)
    handler.device = torch.device("meta")
    assert handler.device_path.device == torch.device("meta")
    assert handler.to_device(torch.ones(2)).device.type == "meta"


def test_handler_preprocess_goes_through_the_device_path() -> None:
    cuda = FakeCuda()
    handler = BaseHandler()
    handler.device = torch.device("cpu")
    handler._device_path = _cuda_path(cuda)
    out: Any = handler.preprocess([[1, 2], [3, 4]])  # type: ignore[list-item]
    assert out.tolist() == [[1, 2], [3, 4]]
    assert [what for what, _, _ in cuda.events] == [
        "upload waits for default",
        "pin",
        "sync upload",
    ]


# --- stream ordering ---------------------------------------------------------------------


def test_the_stand_in_reports_a_read_without_a_wait() -> None:
    """The checks below can fail: a read on one stream of what another wrote, unordered."""
    cuda = FakeCuda()
    other = cuda.Stream()
    batch = torch.ones(1)
    cuda.write(batch, "preprocess")
    with cuda.stream(other):
        cuda.read(batch, "model")
    assert cuda.races == ["model on upload reads what preprocess wrote on default"]
    other.wait_stream(cuda.default_stream())
    with cuda.stream(other):
        cuda.read(batch, "model")
    assert len(cuda.races) == 1


def test_inference_waits_for_what_the_handler_queued_on_its_stream() -> None:
    """A TorchServe-style preprocess that moves and normalises its batch on the default
    stream (``.to(device, non_blocking=True)``): the compute stream must wait for it."""
    cuda = FakeCuda()
    path = _cuda_path(cuda)
    batch = torch.ones(2, 3)
    cuda.write(batch, "preprocess")
    with path.compute():
        cuda.read(batch, "model")
    assert cuda.races == []


def test_follow_up_work_on_a_batch_already_on_the_device_waits_for_its_writer() -> None:
    cuda = FakeCuda()
    path = _cuda_path(cuda)
    on_device = torch.empty(2, 3, device="meta")
    cuda.write(on_device, "preprocess")

    def normalise(tensor: torch.Tensor) -> torch.Tensor:
        cuda.read(tensor, "normalise")
        return tensor

    assert path.upload(on_device, normalise) is on_device
    assert cuda.races == []
    # Run on the upload stream, and finished before the batch is handed on.
    assert [(w, s) for w, s, _ in cuda.events if w in ("normalise", "sync upload")] == [
        ("normalise", "upload"),
        ("sync upload", "default"),
    ]


class _DefaultStreamPreprocess(BaseHandler):
    """Preprocess queues its own device work on the thread's current stream."""

    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.fake_cuda = cuda

    def preprocess(self, data: list[Any]) -> torch.Tensor:
        batch = torch.tensor(data, dtype=torch.float32)
        self.fake_cuda.write(batch, "preprocess")
        return batch


class _Reading(torch.nn.Module):
    def __init__(self, cuda: FakeCuda) -> None:
        super().__init__()
        self.fake_cuda = cuda

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fake_cuda.read(x, "model")
        return x.sum(1, keepdim=True)


def test_pipelined_inference_waits_for_preprocess_on_another_thread() -> None:
    cuda = FakeCuda()
    handler = _DefaultStreamPreprocess(cuda)
    handler.device = torch.device("cpu")
    handler._device_path = _cuda_path(cuda)
    handler.model = _Reading(cuda)
    pipeline = StagePipeline(handler, PipelineSettings(2, 2, 1))
    context = Context("m", ".", {"model": {}}, 6, None)
    context.start_batch([str(i) for i in range(6)], [{} for _ in range(6)])
    results = pipeline.handle([[float(i), 1.0] for i in range(6)], context)
    pipeline.close()
    assert results == [[float(i) + 1] for i in range(6)]
    assert cuda.races == []


# --- CUDA graph trees ----------------------------------------------------------------------


class _GraphTreeLike(torch.nn.Module):
    """What ``compile: reduce-overhead`` gives on a GPU: every call writes its output into
    the same static buffer, so the previous call's output is overwritten."""

    def __init__(self) -> None:
        super().__init__()
        self.static_output = torch.zeros(1, 1)
        self.calls = 0
        self.called = threading.Condition()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.static_output.copy_(x.sum(1, keepdim=True))
        with self.called:
            self.calls += 1
            self.called.notify_all()
        return self.static_output


class _LaggingPostprocess(BaseHandler):
    """Postprocess reads micro-batch i's output only once inference i+1 ran (the stage
    pipeline's overlap, made certain)."""

    def __init__(self, model: _GraphTreeLike, micro_batches: int) -> None:
        super().__init__()
        self.model = model
        self.device = torch.device("cpu")
        self.micro_batches = micro_batches
        self.seen = 0
        self.lock = threading.Lock()

    def postprocess(self, data: Any) -> list[Any]:
        with self.lock:
            self.seen += 1
            index = self.seen
        with self.model.called:
            next_call = min(index + 1, self.micro_batches)
            assert self.model.called.wait_for(lambda: self.model.calls >= next_call, 30)
        return list(data.tolist())


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_graph_tree_outputs_survive_the_next_micro_batch(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: steps.append(1))
    model = _GraphTreeLike()
    handler = _LaggingPostprocess(model, micro_batches=4)
    handler.optimizations = Optimizations.from_model_config({"optimization": {"compile": mode}})
    pipeline = StagePipeline(handler, PipelineSettings(1, 1, 1))
    context = Context("m", ".", {"model": {}}, 4, None)
    context.start_batch([str(i) for i in range(4)], [{} for _ in range(4)])
    results = pipeline.handle([[float(i), 1.0] for i in range(4)], context)
    pipeline.close()
    assert results == [[float(i) + 1] for i in range(4)]
    assert len(steps) == 4  # a new graph-tree step before each call
