"""TorchServe compatibility: ``ts.torch_handler.request_envelope.body``."""

from ferry.handlers.request_envelope import BodyEnvelope

__all__ = ["BodyEnvelope"]
