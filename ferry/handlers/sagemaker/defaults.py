"""The PyTorch toolkit's default functions, for a model whose ``inference.py`` leaves them
out (or that has none).

- ``model_fn``: the TorchScript file ``model.pt``, or else the one ``.pt``/``.pth`` file at
  the top of the model folder (two or none: an error naming them). An eager model (a
  state dict, or a pickled module) needs a ``model_fn`` of its own, as on SageMaker.
- ``input_fn``: JSON, CSV or NPY (``codecs``) into a tensor on the worker's device,
  ``float32`` from JSON and CSV, the array's own dtype from NPY.
- ``predict_fn``: the model in eval mode on the input, without gradients.
- ``output_fn``: a tensor as a list, written as the first type of ``Accept`` the
  encoders know (``UnsupportedFormat`` when none).

The device is the worker's GPU (``context.system_properties["gpu_id"]``) when CUDA is
available, else the CPU; the toolkit uses ``cuda`` (the first GPU) in every worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ferry.handlers.sagemaker import codecs
from ferry.handlers.sagemaker.functions import Defaults

DEFAULT_MODEL_FILE = "model.pt"
MODEL_SUFFIXES = (".pt", ".pth")


class ModelLoadError(Exception):
    """The model file is not TorchScript (or cannot be read)."""


def worker_device(gpu_id: int | None) -> torch.device:
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device("cuda", gpu_id)
    return torch.device("cpu")


def model_file(model_dir: Path) -> Path:
    """``model.pt``, else the only ``.pt``/``.pth`` file at the top of ``model_dir``."""
    default = model_dir / DEFAULT_MODEL_FILE
    if default.exists():
        return default
    found = sorted(
        p.name for p in model_dir.iterdir() if p.is_file() and p.suffix in MODEL_SUFFIXES
    )
    if len(found) != 1:
        raise ValueError(
            f"the default model_fn loads one .pt or .pth file from {model_dir}, found "
            f"{found or 'none'}; keep one, or define model_fn in inference.py"
        )
    return model_dir / found[0]


def pytorch_defaults(device: torch.device) -> Defaults:
    """The default functions, running on ``device``."""

    def model_fn(model_dir: str) -> Any:
        path = model_file(Path(model_dir))
        try:
            model = torch.jit.load(str(path), map_location=device)  # type: ignore[no-untyped-call]
        except RuntimeError as exc:
            raise ModelLoadError(
                f"{path.name} is not a TorchScript model ({exc}); save it with "
                "torch.jit.save, or define model_fn in inference.py to load it"
            ) from exc
        return model.to(device)

    def input_fn(data: bytes | str, content_type: str) -> torch.Tensor:
        array = codecs.decode(data, content_type)
        if codecs.media_type(content_type) in codecs.TEXT_TYPES:
            return torch.tensor(array, dtype=torch.float32, device=device)
        return torch.from_numpy(array).to(device)

    def predict_fn(data: torch.Tensor, model: Any) -> Any:
        with torch.no_grad():
            model = model.to(device)
            model.eval()
            return model(data.to(device))

    def output_fn(prediction: Any, accept: str) -> tuple[bytes, str]:
        if isinstance(prediction, torch.Tensor):
            prediction = prediction.detach().cpu().numpy().tolist()
        chosen = codecs.choose_accept(accept)
        return codecs.encode(prediction, chosen), chosen

    return Defaults(
        model_fn=model_fn, input_fn=input_fn, predict_fn=predict_fn, output_fn=output_fn
    )
