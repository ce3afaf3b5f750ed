"""TorchServe compatibility: ``ts.metrics.metric``."""

from ferry.handlers.metrics import Metric

__all__ = ["Metric"]
