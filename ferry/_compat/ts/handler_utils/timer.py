"""TorchServe compatibility: ``ts.handler_utils.timer``."""

from ferry.handlers.timer import timed

__all__ = ["timed"]
