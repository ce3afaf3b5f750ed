"""What every gRPC servicer reads off a call: its metadata as request headers, and when the
client goes away."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grpc import aio

if TYPE_CHECKING:  # generic only in the stubs
    Context = aio.ServicerContext[Any, Any]


def request_headers(context: Context) -> dict[str, str]:
    """The call's text metadata, lower-cased, as HTTP headers; never the API key."""
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        name = key.lower()
        if isinstance(value, str) and name != "authorization" and not name.startswith(":"):
            headers[name] = value
    return headers


def on_hang_up(context: Context) -> Callable[[Callable[[], None]], None]:
    """The service's hang-up registrar: gRPC calls it once the call is over, however it
    ended; a job already answered ignores it."""

    def register(callback: Callable[[], None]) -> None:
        # The stubs type the callback as a private class; any callable taking the context works.
        context.add_done_callback(lambda _call: callback())  # type: ignore[arg-type]

    return register
