from ferry.handlers.torchserve.request_envelope import BaseEnvelope

__all__ = ["BaseEnvelope"]
