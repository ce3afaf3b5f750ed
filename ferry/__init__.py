"""Ferry: a model server for PyTorch models, drop-in for TorchServe users."""

__version__ = "0.1.0"

__all__ = ["__version__"]
