"""``sagemaker_pytorch_serving_container.default_pytorch_inference_handler``."""

from ferry.handlers.sagemaker.defaults import ModelLoadError
from ferry.handlers.sagemaker.toolkit_handlers import DefaultPytorchInferenceHandler

__all__ = ["DefaultPytorchInferenceHandler", "ModelLoadError"]
