"""TorchServe compatibility: ``ts.handler_utils.utils``."""

from ferry.handlers.torchserve.ts_utils import import_class, send_intermediate_predict_response

__all__ = ["import_class", "send_intermediate_predict_response"]
