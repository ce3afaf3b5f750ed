"""The device path: pass-through on CPU; on a GPU, uploads on one stream and inference on
another. CI has no GPU, so the CUDA path runs here against a stand-in for ``torch.cuda``
that records which stream each step ran on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.device import CudaPath, HostPath, device_path_for
from ferry.handlers.contract.context import Context
from ferry.worker.pipeline import PipelineSettings, StagePipeline


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def synchronize(self) -> None:
        self.cuda.log(f"sync {self.name}")


class FakeCuda:
    """Enough of ``torch.cuda`` for CudaPath: streams, a per-thread current stream."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._names = iter(["upload", "compute"])

    def Stream(self, device: torch.device) -> FakeStream:
        return FakeStream(self, next(self._names))

    @contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        previous = getattr(self._local, "stream", "default")
        self._local.stream = stream.name
        try:
            yield
        finally:
            self._local.stream = previous

    def current(self) -> str:
        return str(getattr(self._local, "stream", "default"))

    def log(self, what: str) -> None:
        with self._lock:
            self.events.append((what, self.current(), threading.current_thread().name))


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
        ("model", "compute"),
        ("sync compute", "default"),
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
    assert [what for what, _, _ in cuda.events] == ["pin", "sync upload"]
