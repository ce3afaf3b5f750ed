"""How batches reach the model's device, and where inference runs on it.

On a CPU every step is a pass-through. On a GPU (``CudaPath``):

- ``upload`` runs in a preprocess thread: the batch is copied into page-locked (pinned) host
  memory, sent with a non-blocking copy on the worker's *upload stream*, and any follow-up
  work (normalising uint8 pixels, say) runs on that stream too; the thread then waits for
  its own stream only, so the tensor it returns is complete and any stream may read it.
- ``compute`` wraps the model call in the inference thread: kernels go to the worker's
  *compute stream*, which the copies above never wait for, so with the stage pipeline the
  next micro-batch's upload overlaps this one's inference. The stream is synchronised on
  leaving, so postprocess (in another thread, on another stream) sees finished outputs, and
  no input block is handed back to the caching allocator while a kernel still reads it.

The rule wherever work crosses streams: a stream made with ``torch.cuda.Stream`` never
waits for another by itself, so before work goes to the upload or compute stream, that
stream waits for the calling thread's current stream. A handler's own ``preprocess`` may
have queued device work there (a ``.to(device, non_blocking=True)``, normalising on the
GPU) that the model must not read before it is done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import torch

Transform = Callable[[torch.Tensor], torch.Tensor]


class DevicePath(Protocol):
    device: torch.device

    def upload(self, batch: torch.Tensor, then: Transform | None = None) -> torch.Tensor:
        """``batch`` on the device, with ``then`` applied there; complete when returned."""
        ...

    def on_upload_stream(self, work: Callable[[], Any]) -> Any:
        """Run ``work`` (device work of a preprocess thread) and wait for it to finish."""
        ...

    def compute(self) -> AbstractContextManager[None]:
        """Context for the model call."""
        ...


class HostPath:
    """CPU: tensors stay where they are; nothing to overlap."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")

    def upload(self, batch: torch.Tensor, then: Transform | None = None) -> torch.Tensor:
        batch = batch.to(self.device)
        return then(batch) if then is not None else batch

    def on_upload_stream(self, work: Callable[[], Any]) -> Any:
        return work()

    def compute(self) -> AbstractContextManager[None]:
        return nullcontext()


class CudaPath:
    """GPU: pinned, non-blocking uploads on one stream, inference on another.

    ``cuda`` and ``pin`` are ``torch.cuda`` and ``Tensor.pin_memory`` unless a test
    injects stand-ins (CI has no GPU).
    """

    def __init__(
        self,
        device: torch.device,
        cuda: Any = None,
        pin: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.device = device
        self._cuda = cuda if cuda is not None else torch.cuda
        self._pin = pin if pin is not None else _pin_memory
        self.upload_stream = self._cuda.Stream(device=device)
        self.compute_stream = self._cuda.Stream(device=device)

    def upload(self, batch: torch.Tensor, then: Transform | None = None) -> torch.Tensor:
        if batch.device.type != "cpu":
            if then is None:
                return batch
            done: torch.Tensor = self.on_upload_stream(lambda: then(batch))
            return done

        def send() -> torch.Tensor:
            on_device = self._pin(batch).to(self.device, non_blocking=True)
            return then(on_device) if then is not None else on_device

        result: torch.Tensor = self.on_upload_stream(send)
        return result

    def on_upload_stream(self, work: Callable[[], Any]) -> Any:
        self.upload_stream.wait_stream(self._cuda.current_stream(self.device))
        with self._cuda.stream(self.upload_stream):
            result = work()
        # Waits for this stream only: inference on the compute stream carries on meanwhile.
        self.upload_stream.synchronize()
        return result

    @contextmanager
    def compute(self) -> Iterator[None]:
        self.compute_stream.wait_stream(self._cuda.current_stream(self.device))
        try:
            with self._cuda.stream(self.compute_stream):
                yield
        finally:
            self.compute_stream.synchronize()


def _pin_memory(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_pinned() else tensor.pin_memory()


def device_path_for(device: torch.device) -> DevicePath:
    if device.type == "cuda":
        return CudaPath(device)
    return HostPath(device)
