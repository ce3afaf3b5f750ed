"""``BaseEnvelope``: TorchServe's request envelope, a wrapper that turns a protocol's request
format into the handler's rows and its answers back (``ts.torch_handler.request_envelope``).

Ferry decodes its protocols (TorchServe REST, KServe) in the frontend, so it ships no
concrete envelopes; this base class lets handlers that define their own keep working.
"""

from __future__ import annotations

from typing import Any

from ferry.handlers.context import Context
from ferry.handlers.loader import EntryPoint


class BaseEnvelope:
    """Subclass it with ``parse_input`` and ``format_output``; ``handle`` runs
    ``parse_input → handle_fn → format_output``."""

    def __init__(self, handle_fn: EntryPoint) -> None:
        self._handle_fn = handle_fn
        self.context: Context | None = None

    def handle(self, data: Any, context: Context) -> Any:
        self.context = context
        rows = self.parse_input(data)
        return self.format_output(self._handle_fn(rows, context))

    def parse_input(self, data: Any) -> Any:
        raise NotImplementedError

    def format_output(self, data: Any) -> Any:
        raise NotImplementedError
