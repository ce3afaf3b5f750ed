"""TorchServe compatibility: ``ts.handler_utils.preprocess.dali``."""

from ferry.handlers.torchserve.dali import get_dali_pipeline

__all__ = ["get_dali_pipeline"]
