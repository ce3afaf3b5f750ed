"""TorchServe compatibility: ``ts.torch_handler.request_envelope.kservev2``."""

from ferry.handlers.torchserve.request_envelope import KServev2Envelope

__all__ = ["KServev2Envelope"]
