"""Text a client sent, echoed back bounded: in a log line or an answer, never in full.

A request path, a model name or version from a URL, an error message holding one: each
is the client's, and as long as the client likes. Echoed in full, a 60 KB path made a
120 KB access line (path and model name) and a 60 KB 404 body. So what is echoed is cut
to a bound, and says so, with the length of what was sent:

    >>> capped("x" * 1000, limit=8)
    'xxxxxxxx... (1000 characters)'

``ECHO_LIMIT`` bounds one value (a path, a name) in an access line; ``MESSAGE_LIMIT``
bounds an error's whole message where a transport answers with it (HTTP bodies, gRPC
status details), whichever value of the client's the message holds. Both are far above
any name or message Ferry writes itself, so only what a client made long is cut.
"""

from __future__ import annotations

ECHO_LIMIT = 256
"""Characters of one client value (a path, a model name, a version) in a log line."""
MESSAGE_LIMIT = 1024
"""Characters of an error message in an answer (the HTTP body, the gRPC details)."""


def capped(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` as it is when it has at most ``limit`` characters; else its first
    ``limit``, "..." and how many characters it had."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def capped_message(message: str) -> str:
    """An error's message as a transport answers it (at most ``MESSAGE_LIMIT`` characters
    of it)."""
    return capped(message, MESSAGE_LIMIT)


__all__ = ["ECHO_LIMIT", "MESSAGE_LIMIT", "capped", "capped_message"]
