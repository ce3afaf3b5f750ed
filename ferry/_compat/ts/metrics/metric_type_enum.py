"""TorchServe compatibility: ``ts.metrics.metric_type_enum``."""

from ferry.handlers.contract.metrics import MetricTypes

__all__ = ["MetricTypes"]
