"""TorchServe compatibility: ``ts.torch_handler.request_envelope.json``."""

from ferry.handlers.torchserve.request_envelope import JSONEnvelope

__all__ = ["JSONEnvelope"]
