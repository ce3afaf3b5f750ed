"""The types some settings' values take: a listener's address and a model metric that a
metrics_config file declares. Below both the settings and their parsers
(``ferry.config.values``), which build them."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ferry.errors import ConfigError


@dataclass(frozen=True)
class ModelMetric:
    """One model metric a metrics_config file declares (its ``model_metrics`` section):
    handlers get it with ``context.metrics.get_metric(name, metric_type)``, and its
    values take one value per dimension name, in this order."""

    name: str
    unit: str
    metric_type: str
    """``counter``, ``gauge`` or ``histogram``."""
    dimensions: tuple[str, ...] = ()


TORCHSERVE_MODEL_METRICS = (
    ModelMetric("HandlerTime", "ms", "gauge", ("ModelName", "Level")),
    ModelMetric("PredictionTime", "ms", "gauge", ("ModelName", "Level")),
)
"""The model metrics of TorchServe's default metrics.yaml: what handlers get without a
metrics_config."""


@dataclass(frozen=True)
class Address:
    """Where a listener binds: a host and port (port 0 asks the OS for a free one), or a
    Unix socket's path (``unix:/run/ferry.sock``, TorchServe's form)."""

    host: str
    port: int
    scheme: str = "http"
    """``http``, ``https`` or ``unix``."""
    path: str = ""
    """The socket file of a ``unix`` address."""

    @classmethod
    def parse(cls, text: str, *, key: str) -> Address:
        """Accept TorchServe's ``http(s)://host:port``, ``unix:/path`` or a bare
        ``host:port``."""
        if text.startswith("unix:"):
            path = text.removeprefix("unix:").removeprefix("//")
            if not path.startswith("/"):
                raise ConfigError(f"{key}: expected unix:/ABSOLUTE/PATH, got {text!r}")
            return cls("", 0, "unix", path)
        url = urlsplit(text if "://" in text else f"http://{text}")
        if url.scheme not in ("http", "https"):
            raise ConfigError(f"{key}: expected http://, https:// or unix:, got {text!r}")
        try:
            port = url.port
        except ValueError:
            port = None
        if url.hostname is None or port is None:
            raise ConfigError(f"{key}: expected http://HOST:PORT, got {text!r}")
        return cls(url.hostname, port, url.scheme)

    def url(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def is_loopback(self) -> bool:
        """Reachable from this machine only (a Unix socket's file permissions decide who)."""
        return (
            self.scheme == "unix"
            or self.host in ("localhost", "::1")
            or self.host.startswith("127.")
        )
