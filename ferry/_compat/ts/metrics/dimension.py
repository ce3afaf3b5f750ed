"""TorchServe compatibility: ``ts.metrics.dimension``."""

from ferry.handlers.metrics import Dimension

__all__ = ["Dimension"]
