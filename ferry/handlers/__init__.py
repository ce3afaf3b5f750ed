"""The handler contract (TorchServe's), its context, loader and built-in handlers.

Nothing here imports the web layer: handlers see requests only as ``data`` and ``context``.
"""

from ferry.handlers.base_handler import BaseHandler
from ferry.handlers.context import Context
from ferry.handlers.exceptions import PredictionException

__all__ = ["BaseHandler", "Context", "PredictionException"]
