"""``sagemaker_inference.default_inference_handler``: ``DefaultInferenceHandler``."""

from ferry.handlers.sagemaker.toolkit_handlers import DefaultInferenceHandler

__all__ = ["DefaultInferenceHandler"]
