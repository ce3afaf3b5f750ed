"""``sagemaker_inference.errors``: errors answered with their ``status_code``."""

from ferry.handlers.sagemaker.toolkit import (
    BaseInferenceToolkitError,
    GenericInferenceToolkitError,
    UnsupportedFormatError,
)

__all__ = ["BaseInferenceToolkitError", "GenericInferenceToolkitError", "UnsupportedFormatError"]
