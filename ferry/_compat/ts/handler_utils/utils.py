"""TorchServe compatibility: ``ts.handler_utils.utils``."""

from ferry.handlers.torchserve.ts_utils import import_class

__all__ = ["import_class"]
