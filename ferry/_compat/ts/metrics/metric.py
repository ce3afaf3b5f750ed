"""TorchServe compatibility: ``ts.metrics.metric``."""

from ferry.handlers.contract.metrics import Metric

__all__ = ["Metric"]
