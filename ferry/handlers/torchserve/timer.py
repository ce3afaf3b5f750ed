"""``timed``: a handler method's time as a metric (``ts.handler_utils.timer``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ferry.handlers.contract.metrics import MetricTypes

Method = TypeVar("Method", bound=Callable[..., Any])


def timed(method: Method) -> Method:
    """Record each call's time, in ms, as a gauge named after the method, through the
    handler's ``self.context.metrics``. Calls made without a context (a copy of the
    handler in a preprocess process, or before ``initialize``) are not recorded.

    Example::

        class Handler(BaseHandler):
            @timed
            def preprocess(self, data): ...
    """

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            elapsed_ms = (time.perf_counter() - start) * 1000
            metrics = getattr(getattr(self, "context", None), "metrics", None)
            if metrics is not None:
                metrics.add_metric(method.__name__, elapsed_ms, "ms", metric_type=MetricTypes.GAUGE)

    return wrapper  # type: ignore[return-value]
