"""``sagemaker_inference.decoder``: ``decode(obj, content_type)``."""

from ferry.handlers.sagemaker.toolkit import decode

__all__ = ["decode"]
