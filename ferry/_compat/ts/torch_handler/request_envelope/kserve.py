"""TorchServe compatibility: ``ts.torch_handler.request_envelope.kserve``."""

from ferry.handlers.torchserve.request_envelope import KServeEnvelope

__all__ = ["KServeEnvelope"]
