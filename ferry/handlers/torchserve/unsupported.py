"""The error a TorchServe feature Ferry does not provide raises when a handler uses it."""


class NotSupportedByFerry(RuntimeError):
    """A TorchServe feature a handler used that Ferry does not provide; the message says
    which, and why, in one line (a model's ``loadError`` reads ``NotSupportedByFerry: ...``)."""
