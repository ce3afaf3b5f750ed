"""TorchServe compatibility: ``ts.metrics.metric_type_enum``."""

from ferry.handlers.metrics import MetricTypes

__all__ = ["MetricTypes"]
