"""``sagemaker_inference.content_types``: the media types the toolkit names."""

from ferry.handlers.sagemaker.toolkit import ANY, CSV, JSON, NPY, NPZ, OCTET_STREAM, UTF8_TYPES

__all__ = ["ANY", "CSV", "JSON", "NPY", "NPZ", "OCTET_STREAM", "UTF8_TYPES"]
