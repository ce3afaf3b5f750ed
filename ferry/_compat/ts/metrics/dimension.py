"""TorchServe compatibility: ``ts.metrics.dimension``."""

from ferry.handlers.contract.metrics import Dimension

__all__ = ["Dimension"]
