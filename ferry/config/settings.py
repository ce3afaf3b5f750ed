"""Server settings: the single source of truth for how Ferry runs.

Command-line flags fill this model (later issues add environment variables and
``config.properties`` as further sources); nothing reads the environment at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ferry.errors import ConfigError


@dataclass(frozen=True)
class Address:
    """Where a listener binds. Port 0 asks the OS for a free port."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, key: str) -> Address:
        """Accept TorchServe's ``http://host:port`` or a bare ``host:port``."""
        url = urlsplit(text if "://" in text else f"http://{text}")
        if url.scheme != "http":
            raise ConfigError(f"{key}: only http:// addresses are supported, got {text!r}")
        if url.hostname is None or url.port is None:
            raise ConfigError(f"{key}: expected http://HOST:PORT, got {text!r}")
        return cls(url.hostname, url.port)

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server needs to start."""

    model_store: Path | None = None
    """Folder holding model archives (``--model-store``)."""

    models: tuple[str, ...] = ()
    """Models to load at start-up: ``all`` or ``NAME=FILE`` entries (``--models``)."""

    inference_address: Address = field(default_factory=lambda: Address("127.0.0.1", 8080))
    """Inference API listener; loopback unless told otherwise."""

    management_address: Address = field(default_factory=lambda: Address("127.0.0.1", 8081))
    """Management API listener; loopback unless told otherwise."""

    enable_model_api: bool = False
    """Allow registering and unregistering models through the management API."""

    allowed_urls: tuple[str, ...] = ()
    """Regular expressions a remote archive URL must match in full; none by default."""

    default_workers_per_model: int = 0
    """Workers per model when the model does not say; 0 derives it from the cores."""

    job_queue_size: int = 100
    """Requests a model version may hold waiting; beyond it requests get 503 at once."""

    max_request_size: int = 6_553_500
    """Largest request body accepted, in bytes (413 beyond)."""

    default_response_timeout: float = 120.0
    """Seconds a worker may take for one batch before it is killed and replaced."""

    default_batch_size: int = 1
    default_max_batch_delay_ms: float = 100.0

    ready_file: Path | None = None
    """If set, a JSON file with the bound addresses is written here once models are loaded."""

    log_level: str = "INFO"


def available_cores() -> int:
    """Cores this process may run on (respects CPU affinity, e.g. in containers)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def default_workers_per_model(cores: int, gpus: int) -> int:
    """One worker per GPU; on CPU one worker, since torch already uses every core."""
    return gpus if gpus > 0 else 1


def threads_per_worker(cores: int, workers: int) -> int:
    """Split the cores between a model's workers so they do not oversubscribe the CPU."""
    return max(1, cores // max(1, workers))
