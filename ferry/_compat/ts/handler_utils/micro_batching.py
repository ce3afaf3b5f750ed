"""TorchServe compatibility: ``ts.handler_utils.micro_batching``."""

from ferry.worker.micro_batching import MicroBatching

__all__ = ["MicroBatching"]
