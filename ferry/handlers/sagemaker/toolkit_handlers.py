"""The toolkits' default-handler classes, which an ``inference.py`` may call or subclass:
``sagemaker_inference.default_inference_handler.DefaultInferenceHandler`` and
``sagemaker_pytorch_serving_container.default_pytorch_inference_handler.
DefaultPytorchInferenceHandler`` (re-exported by the shims under ``ferry/_compat``).

The PyTorch one runs Ferry's default functions (``ferry.handlers.sagemaker.defaults``) on
the toolkit's device, ``cuda`` when CUDA is available, else the CPU; its
``default_output_fn`` gives the body alone, JSON as ``str``, CSV and NPY as bytes, as the
toolkit's does.
"""

from __future__ import annotations

from typing import Any

import torch

from ferry.handlers.sagemaker import toolkit
from ferry.handlers.sagemaker.defaults import pytorch_defaults


class DefaultInferenceHandler:
    """The toolkit's bare defaults: decode the input, encode the output; ``model_fn`` and
    ``predict_fn`` are the model's to write."""

    def default_model_fn(self, model_dir: str, context: Any = None) -> Any:
        raise NotImplementedError("Please provide a model_fn implementation.")

    def default_input_fn(self, input_data: Any, content_type: str, context: Any = None) -> Any:
        return toolkit.decode(input_data, content_type)

    def default_predict_fn(self, data: Any, model: Any, context: Any = None) -> Any:
        raise NotImplementedError("Please provide a predict_fn implementation.")

    def default_output_fn(self, prediction: Any, accept: str, context: Any = None) -> Any:
        """``(body, content_type)`` for the first type of ``accept`` the encoder writes."""
        for content_type in toolkit.parse_accept(accept):
            if content_type in toolkit.SUPPORTED_CONTENT_TYPES:
                return toolkit.encode(prediction, content_type), content_type
        raise toolkit.UnsupportedFormatError(accept)


class DefaultPytorchInferenceHandler(DefaultInferenceHandler):
    """The PyTorch toolkit's defaults: a TorchScript ``model.pt`` (or the one ``.pt`` or
    ``.pth`` file), tensors in, the model in eval mode without gradients."""

    VALID_CONTENT_TYPES = (toolkit.JSON, toolkit.NPY)

    def __init__(self) -> None:
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._defaults = pytorch_defaults(self.device)

    def default_model_fn(self, model_dir: str, context: Any = None) -> Any:
        return self._defaults.model_fn(model_dir)

    def default_input_fn(self, input_data: Any, content_type: str, context: Any = None) -> Any:
        """A ``float32`` tensor from JSON or CSV, the array's dtype from NPY."""
        array = toolkit.decode(input_data, content_type)
        if content_type in toolkit.UTF8_TYPES:
            return torch.tensor(array, dtype=torch.float32, device=self.device)
        return torch.from_numpy(array).to(self.device)

    def default_predict_fn(self, data: Any, model: Any, context: Any = None) -> Any:
        return self._defaults.predict_fn(data, model)

    def default_output_fn(self, prediction: Any, accept: str, context: Any = None) -> Any:
        if isinstance(prediction, torch.Tensor):
            prediction = prediction.detach().cpu().numpy().tolist()
        for content_type in toolkit.parse_accept(accept):
            if content_type in toolkit.SUPPORTED_CONTENT_TYPES:
                encoded = toolkit.encode(prediction, content_type)
                if content_type == toolkit.CSV and isinstance(encoded, str):
                    return encoded.encode("utf-8")
                return encoded
        raise toolkit.UnsupportedFormatError(accept)
