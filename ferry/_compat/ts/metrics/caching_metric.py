"""TorchServe compatibility: ``ts.metrics.caching_metric``."""

from ferry.handlers.contract.metrics import Metric as CachingMetric

__all__ = ["CachingMetric"]
