"""ONNX models through ONNX Runtime, called like a torch module (tensor in, tensor out).

``onnxruntime`` is optional (``pip install ferry-serve[onnx]``, or ``onnxruntime-gpu``);
CUDA's execution provider is used when the worker has a GPU and the provider is present.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

from ferry.errors import ArchiveError


class OnnxModel:
    def __init__(self, path: Path, device: torch.device) -> None:
        try:
            ort = importlib.import_module("onnxruntime")
        except ImportError as exc:
            raise ArchiveError(
                f"{path.name} is an ONNX model: install onnxruntime (pip install ferry-serve[onnx])"
            ) from exc
        available = ort.get_available_providers()
        providers: list[Any] = ["CPUExecutionProvider"]
        if device.type == "cuda" and "CUDAExecutionProvider" in available:
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(str(path), options, providers=providers)
        self.input_name = self.session.get_inputs()[0].name
        self.providers = self.session.get_providers()

    def __call__(self, batch: torch.Tensor) -> Any:
        outputs = self.session.run(None, {self.input_name: batch.detach().cpu().numpy()})
        tensors = tuple(torch.from_numpy(output) for output in outputs)
        return tensors[0] if len(tensors) == 1 else tensors

    def to(self, *args: Any, **kwargs: Any) -> OnnxModel:
        return self  # the session owns its device; inputs are copied per call

    def eval(self) -> OnnxModel:
        return self
