"""Handlers: the contract (``contract``: the context, errors, streaming, metrics and how a
handler is found, TorchServe's), the built-in handlers (``builtin``), and TorchServe's
handler utilities (``torchserve``; the ``ts.*`` shims are ``ferry._compat``).

Nothing here imports the web layer or the worker: handlers see requests only as ``data``
and ``context``.
"""

from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.contract.context import Context
from ferry.handlers.contract.exceptions import PredictionException

__all__ = ["BaseHandler", "Context", "PredictionException"]
