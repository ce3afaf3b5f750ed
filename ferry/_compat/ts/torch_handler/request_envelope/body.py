"""TorchServe compatibility: ``ts.torch_handler.request_envelope.body``."""

from ferry.handlers.torchserve.request_envelope import BodyEnvelope

__all__ = ["BodyEnvelope"]
