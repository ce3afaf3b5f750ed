"""TorchServe compatibility: ``ts.handler_utils.micro_batching``."""

from ferry.handlers.micro_batching import MicroBatching

__all__ = ["MicroBatching"]
