from ferry.handlers.request_envelope import BaseEnvelope

__all__ = ["BaseEnvelope"]
