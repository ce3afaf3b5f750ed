"""TorchServe compatibility: ``ts.handler_utils.timer``."""

from ferry.handlers.torchserve.timer import timed

__all__ = ["timed"]
