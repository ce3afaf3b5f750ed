"""ONNX models through ONNX Runtime, called like a torch module (tensor in, tensor out).

``onnxruntime`` is optional (``pip install ferry-serve[onnx]``, or ``onnxruntime-gpu``);
CUDA's execution provider is used when the worker has a GPU and the provider is present.
A batch is cast to the element type the model declares (``optimization: precision``
casts inputs for torch models; an fp32 ONNX file still wants fp32), and a batch already
on the GPU is bound where it lies (I/O binding) instead of being copied to the host for
ONNX Runtime to copy back.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ferry.errors import ArchiveError

ONNX_TYPES = {
    "tensor(float)": torch.float32,
    "tensor(float16)": torch.float16,
    "tensor(double)": torch.float64,
    "tensor(int64)": torch.int64,
    "tensor(int32)": torch.int32,
    "tensor(uint8)": torch.uint8,
    "tensor(bool)": torch.bool,
}
"""ONNX's element types (as ``NodeArg.type`` words them) and torch's."""

NUMPY_TYPES = {
    torch.float32: np.float32,
    torch.float16: np.float16,
    torch.float64: np.float64,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}


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
        self.providers = self.session.get_providers()
        self._setup(device)

    @classmethod
    def over(cls, session: Any, device: torch.device) -> OnnxModel:
        """A model over an existing ``session`` (a test's stand-in)."""
        model = cls.__new__(cls)
        model.session = session
        model.providers = session.get_providers()
        model._setup(device)
        return model

    def _setup(self, device: torch.device) -> None:
        declared = self.session.get_inputs()[0]
        self.input_name: str = declared.name
        self.input_dtype = ONNX_TYPES.get(declared.type)
        """The torch dtype of the model's input (None: one torch has no name for)."""
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.on_gpu = device.type == "cuda" and "CUDAExecutionProvider" in self.providers

    def __call__(self, batch: torch.Tensor) -> Any:
        batch = batch.detach()
        if self.input_dtype is not None and batch.dtype != self.input_dtype:
            batch = batch.to(self.input_dtype)
        if self.on_gpu and batch.is_cuda and batch.dtype in NUMPY_TYPES:
            outputs = self._run_bound(batch.contiguous())
        else:
            outputs = self.session.run(None, {self.input_name: batch.cpu().numpy()})
        tensors = tuple(torch.from_numpy(output) for output in outputs)
        return tensors[0] if len(tensors) == 1 else tensors

    def _run_bound(self, batch: torch.Tensor) -> list[Any]:
        """Run on a batch in GPU memory, read in place; outputs come back to the host."""
        binding = self.session.io_binding()
        binding.bind_input(
            name=self.input_name,
            device_type="cuda",
            device_id=batch.device.index or 0,
            element_type=NUMPY_TYPES[batch.dtype],
            shape=tuple(batch.shape),
            buffer_ptr=batch.data_ptr(),
        )
        for name in self.output_names:
            binding.bind_output(name)
        torch.cuda.current_stream(batch.device).synchronize()  # ORT reads on its own stream
        self.session.run_with_iobinding(binding)
        outputs: list[Any] = binding.copy_outputs_to_cpu()
        return outputs

    def to(self, *args: Any, **kwargs: Any) -> OnnxModel:
        return self  # the session owns its device; inputs are copied per call

    def eval(self) -> OnnxModel:
        return self
