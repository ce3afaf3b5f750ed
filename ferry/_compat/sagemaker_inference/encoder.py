"""``sagemaker_inference.encoder``: ``encode(array_like, content_type)``."""

from ferry.handlers.sagemaker.toolkit import SUPPORTED_CONTENT_TYPES, encode

__all__ = ["SUPPORTED_CONTENT_TYPES", "encode"]
