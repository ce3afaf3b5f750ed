"""Settings of how the server runs: limits, metrics, logs and traces, start-up and
shut-down.

Each field is one setting, declared once (``ferry.config.settings.declare``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ferry.config import values as v
from ferry.config.image_limits import DEFAULT_IMAGE_FORMATS, DEFAULT_MAX_IMAGE_PIXELS
from ferry.config.settings.declare import setting
from ferry.config.value_types import TORCHSERVE_MODEL_METRICS, ModelMetric

RESOURCE_LIMITS = ("Resource limits", "security.md#resource-limits")
_LIMITS = ("HTTP limits", "security.md#http-limits")
_OBSERVE = ("Observe", "metrics.md")
_BACKGROUND = (
    "Running in the background",
    "configuration.md#running-in-the-background-torchserves---start----stop",
)


@dataclass(frozen=True)
class LimitSettings:
    """What one request, response or archive may take."""

    max_request_size: int = setting(
        6_553_500, v.BYTES, "Largest request body accepted (413 beyond)."
    )
    max_response_size: int = setting(
        6_553_500, v.BYTES, "Largest response body a handler may return (500 beyond)."
    )
    max_tensor_elements: int | None = setting(
        None,
        v.integer(1),
        "Most elements the tensors of one Open Inference Protocol request (REST or gRPC) "
        "may hold together, judged from their shapes before any is decoded (413, gRPC "
        "`RESOURCE_EXHAUSTED`, beyond).",
        default_note="`max_request_size`",
    )
    """Each element becomes a Python object in the handler's lists, so this bounds
    what a request costs the worker once decoded. The default, one element per byte of the
    largest body, is what binary BOOL or UINT8 data reaches."""
    max_header_size: int = setting(
        65_536,
        v.integer(1024, "BYTES", "bytes"),
        "Largest request head, and separately the largest chunked trailer (431 beyond).",
        see=_LIMITS,
    )
    max_headers: int = setting(
        100, v.integer(1), "Most header fields in one request (431 beyond).", see=_LIMITS
    )
    header_timeout: float = setting(
        20.0,
        v.SECONDS,
        "Time a request head may take from its first byte to its end (408 beyond).",
        see=_LIMITS,
    )
    """Counted from the connection's start when nothing came yet; a connection that
    sent nothing is closed without an answer."""
    body_read_timeout: float = setting(
        60.0,
        v.SECONDS,
        "Time a pending request body may go without a byte arriving (408 beyond).",
        see=_LIMITS,
    )
    max_unpacked_size: int = setting(
        4 << 30,
        v.BYTES,
        "Largest size an archive may unpack to; a larger one is refused.",
        default_note="4 GiB",
        see=RESOURCE_LIMITS,
    )
    limit_max_image_pixels: int | None = setting(
        DEFAULT_MAX_IMAGE_PIXELS,
        v.PIXEL_LIMIT,
        "Largest width x height the built-in vision handlers decode, judged from the image "
        "header (400 beyond); `true`: the default, `false`: only PIL's own limit.",
        see=RESOURCE_LIMITS,
    )
    """None (``false``) turns Ferry's check off."""
    allowed_image_formats: tuple[str, ...] = setting(
        DEFAULT_IMAGE_FORMATS,
        v.IMAGE_FORMATS,
        "Image formats (PIL's names) the built-in vision handlers decode; others get 400.",
        see=RESOURCE_LIMITS,
    )

    @property
    def tensor_element_limit(self) -> int:
        """``max_tensor_elements``, or its default."""
        return self.max_tensor_elements or self.max_request_size


@dataclass(frozen=True)
class ObservabilitySettings:
    """Metrics, logs and traces."""

    enable_metrics_api: bool = setting(
        True, v.BOOLEAN, "Collect metrics and serve them on `metrics_address`.", see=_OBSERVE
    )
    model_metrics: tuple[ModelMetric, ...] = setting(
        TORCHSERVE_MODEL_METRICS,
        v.METRICS_CONFIG,
        "TorchServe's metrics.yaml: its `model_metrics` are declared for handlers' "
        "`context.metrics.get_metric(name, type)`; its `ts_metrics` are not read.",
        key="metrics_config",
        default_note="TorchServe's default",
        see=("Handler metrics", "metrics.md#handler-metrics-and-metrics_config"),
    )
    """TorchServe's default ones (``HandlerTime``, ``PredictionTime``) without a
    metrics_config."""
    max_handler_metric_series: int = setting(
        2000,
        v.integer(1),
        "Series one handler metric may have, all models together; values with new dimension "
        "values beyond it are dropped and counted.",
        see=_OBSERVE,
    )
    """Dropped values are counted in ``ferry_handler_metric_values_dropped_total`` and
    warned about once per metric, so a handler that puts a request's data in a dimension
    cannot grow the scrape without end."""
    metric_time_interval: float = setting(
        60.0,
        v.SECONDS,
        "Time between two sets of system metrics lines in `ts_metrics.log`.",
        see=_BACKGROUND,
    )
    disable_system_metrics: bool = setting(
        False, v.BOOLEAN, "No system metrics lines in `ts_metrics.log`."
    )
    log_level: str = setting(
        "INFO", v.choice("DEBUG", "INFO", "WARNING", "ERROR"), "Least severe log lines written."
    )
    log_format: str = setting(
        "plain", v.choice("plain", "json"), "`plain` lines, or `json`: one object per line."
    )
    log_location: Path | None = setting(
        None,
        v.PATH,
        "Folder for TorchServe's log files (`ts_log.log`, `access_log.log`, "
        "`model_log.log`, ...) instead of stderr.",
        default_note="stderr; `logs` with `--start`",
        see=_BACKGROUND,
    )
    access_log: bool = setting(
        True, v.BOOLEAN, "One log line per inference request (logger `ferry.access`)."
    )
    enable_tracing: bool = setting(
        False,
        v.BOOLEAN,
        "OpenTelemetry spans of every request and batch, exported as the `OTEL_*` variables "
        "say (the `otel` extra).",
        see=("Traces", "metrics.md#traces"),
    )
    """``ferry.tracing``."""


@dataclass(frozen=True)
class LifecycleSettings:
    """Start-up and shut-down."""

    ready_file: Path | None = setting(
        None,
        v.PATH,
        "A JSON file with the bound addresses, written once the models are loaded.",
        default_note="none",
    )
    drain_delay: float = setting(
        0.0,
        v.SECONDS_OR_ZERO,
        "Time a stopping server keeps serving, readiness answering 503, before its "
        "listeners close: what a load balancer needs to take it out.",
        see=("Behind a load balancer", "management.md#behind-a-load-balancer-or-on-kubernetes"),
    )
    """Meanwhile readiness (``/ping``, ``/ping/MODEL``, ``/v2/health/ready``) answers
    503 ``Draining`` and every response closes its connection."""
