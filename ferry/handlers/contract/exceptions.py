"""Errors a handler raises (or returns for a single request of a batch)."""

from __future__ import annotations

from ferry.errors import InvalidInput


class PredictionException(Exception):
    """TorchServe's handler exception: ``error_code`` becomes the response status."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.error_code = error_code

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"

    def __reduce__(self) -> tuple[type[PredictionException], tuple[str, int]]:
        # Keeps error_code when raised in a preprocess process.
        return type(self), (self.message, self.error_code)


class RequestCancelled(Exception):
    """Raised by ``send_intermediate_predict_response`` (``context.send_intermediate``)
    once every request of the batch has lost its client: nobody reads the stream any more,
    so the handler stops. A handler may catch it to clean up; the worker answers nobody.
    Parts for a request whose client alone went away are dropped without it (its
    batch-mates still stream); ``context.is_cancelled(request_id)`` tells a handler that
    checks for itself."""


__all__ = ["InvalidInput", "PredictionException", "RequestCancelled"]
