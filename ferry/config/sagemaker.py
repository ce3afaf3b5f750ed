"""SageMaker's container settings as Ferry's: what ``ferry sagemaker-serve`` (the image's
``serve``) reads from the ``SAGEMAKER_*`` variables the toolkits read, and the settings
their TorchServe configuration fixed.

Each becomes a ``FERRY_<KEY>`` variable unless that variable is set already, so a source
the operator chose wins: ``FERRY_*`` over ``SAGEMAKER_*``, both over ``TS_*`` and the
config file (``ferry.config.sources``).

=====================================  ==================================================
SageMaker (toolkit default)            Ferry
=====================================  ==================================================
``SAGEMAKER_BIND_TO_PORT`` (8080)      ``inference_address`` ``http://0.0.0.0:PORT``
``SAGEMAKER_SAFE_PORT_RANGE``          management and metrics on loopback, on its first
                                       two ports (else 8081 and 8082)
``SAGEMAKER_MODEL_SERVER_WORKERS``     ``default_workers_per_model``
``SAGEMAKER_MODEL_SERVER_TIMEOUT``     ``default_response_timeout`` (60, the toolkit's;
(``..._TIMEOUT_SECONDS`` wins)         ``..._SECONDS`` is the MMS toolkit's spelling)
``SAGEMAKER_MAX_PAYLOAD_IN_MB``        ``max_request_size`` (MiB to bytes)
``SAGEMAKER_BASE_DIR`` (/opt/ml)       ``model_store``; the model is its ``model`` folder
``SAGEMAKER_TS_BATCH_SIZE``,           the model's ``models`` JSON entry (``batchSize``,
``..._MAX_BATCH_DELAY``, ``..._MIN_``  ``maxBatchDelay``, ``minWorkers``, ``maxWorkers``,
``WORKERS``, ``..._MAX_WORKERS``,      ``responseTimeout``; the unset ones at the
``..._RESPONSE_TIMEOUT``               toolkit's defaults 1, 100, 1, 1, 60)
``SAGEMAKER_MULTI_MODEL=true``         no start-up model; models loaded by SageMaker's
                                       ``POST /models``, on demand, under a memory budget
=====================================  ==================================================

Fixed, as the toolkit's ``config.properties``: token authorization off, TorchServe's
``TS_*`` variables read (``enable_envvars_config``), ``code/requirements.txt`` installed
(``install_py_dep_per_model``); gRPC off (SageMaker speaks HTTP on one port). Multi-model:
the model API on, models loaded on demand, and a host memory budget of three quarters of
the container's memory (``model_memory_budget_mb``) so that a load that cannot fit is
refused with 507 (``ferry.service.multi_model``).

``SAGEMAKER_PROGRAM`` and ``SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT`` are read where they
apply, by the handler in the worker (``ferry.handlers.sagemaker``).
``SAGEMAKER_SUBMIT_DIRECTORY`` (set by SageMaker's Python SDK) is not read, as the PyTorch
toolkit does not read it: the code is the model's ``code/`` folder. One that names code
elsewhere (``s3://``) while that folder lacks the module stops the start
(``check_code_is_local``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ferry.errors import ConfigError

DEFAULT_BASE_DIR = "/opt/ml"
DEFAULT_PORT = 8080
DEFAULT_TIMEOUT = "60"
"""Seconds: the toolkit always writes ``default_response_timeout``, 60 unless told."""
MODEL_NAME = "model"
MODEL_VERSION = "1.0"
MEMORY_SHARE = 0.75
"""The share of the container's memory the models of a multi-model endpoint may hold."""
FALLBACK_PORTS = (8081, 8082, 8083)

BATCHING_VARIABLES = {
    # variable: (models JSON key, the toolkit's default)
    "SAGEMAKER_TS_BATCH_SIZE": ("batchSize", 1),
    "SAGEMAKER_TS_MAX_BATCH_DELAY": ("maxBatchDelay", 100),
    "SAGEMAKER_TS_MIN_WORKERS": ("minWorkers", 1),
    "SAGEMAKER_TS_MAX_WORKERS": ("maxWorkers", 1),
    "SAGEMAKER_TS_RESPONSE_TIMEOUT": ("responseTimeout", 60),
}
"""The PyTorch toolkit's per-model variables: any of them set (single model only) writes
all five for the model, the unset ones at its defaults."""


@dataclass(frozen=True)
class SageMakerStart:
    """How a SageMaker container starts Ferry."""

    multi_model: bool
    settings: dict[str, str]
    """Settings by config.properties key, as text."""
    notes: list[str] = field(default_factory=list)
    """What to log at start: variables read differently from the toolkit, or not at all."""

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``environ`` with a ``FERRY_<KEY>`` variable per setting, unless it has one."""
        defaults = {f"FERRY_{key.upper()}": value for key, value in self.settings.items()}
        return {**defaults, **environ}


def sagemaker_start(environ: Mapping[str, str], memory_bytes: int = 0) -> SageMakerStart:
    """The settings ``environ``'s ``SAGEMAKER_*`` variables ask for; ``memory_bytes``: what
    the container may use (0: unknown, no budget). ``ConfigError`` names a bad value."""
    multi_model = environ.get("SAGEMAKER_MULTI_MODEL", "false").strip().lower() == "true"
    port = _integer(environ, "SAGEMAKER_BIND_TO_PORT", DEFAULT_PORT, minimum=0)
    if port > 65535:
        raise ConfigError(f"SAGEMAKER_BIND_TO_PORT: {port} is not a port")
    management, metrics = _side_ports(environ.get("SAGEMAKER_SAFE_PORT_RANGE"), port)
    settings = {
        "inference_address": f"http://0.0.0.0:{port}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "enable_grpc": "false",
        "disable_token_authorization": "true",
        "enable_envvars_config": "true",
        "install_py_dep_per_model": "true",
        "model_store": environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR,
        "default_response_timeout": str(_timeout(environ)),
    }
    workers = environ.get("SAGEMAKER_MODEL_SERVER_WORKERS")
    if workers:
        settings["default_workers_per_model"] = str(
            _integer(environ, "SAGEMAKER_MODEL_SERVER_WORKERS", 1, minimum=1)
        )
    if environ.get("SAGEMAKER_MAX_PAYLOAD_IN_MB"):
        megabytes = _integer(environ, "SAGEMAKER_MAX_PAYLOAD_IN_MB", 6, minimum=1)
        settings["max_request_size"] = str(megabytes << 20)
    notes = _unread(environ, multi_model)
    if multi_model:
        settings.update(enable_model_api="true", load_models_on_demand="true")
        if memory_bytes > 0:
            settings["model_memory_budget_mb"] = str(int(memory_bytes * MEMORY_SHARE) >> 20)
    else:
        settings["load_models"] = f"{MODEL_NAME}={MODEL_NAME}"
        batching = _batching(environ)
        if batching:
            settings["models"] = json.dumps({MODEL_NAME: {MODEL_VERSION: batching}})
    return SageMakerStart(multi_model, settings, notes)


def check_code_is_local(environ: Mapping[str, str], model_dir: Path) -> None:
    """``ConfigError`` when ``SAGEMAKER_SUBMIT_DIRECTORY`` names code elsewhere (an
    ``s3://`` ``sourcedir.tar.gz``) and the model has no ``code/`` module of
    ``SAGEMAKER_PROGRAM``'s name: Ferry fetches nothing, so the model would be served by
    the default functions instead of the user's. With the module there it is only noted
    (``SageMakerStart.notes``), as the PyTorch toolkit ignores the variable too."""
    submit = environ.get("SAGEMAKER_SUBMIT_DIRECTORY", "").strip()
    scheme, separator, _ = submit.partition("://")
    if not separator or scheme == "file":
        return
    program = environ.get("SAGEMAKER_PROGRAM", "").strip() or "inference.py"
    module = model_dir / "code" / (program if program.endswith(".py") else f"{program}.py")
    if not module.is_file():
        raise ConfigError(
            f"SAGEMAKER_SUBMIT_DIRECTORY={submit}: Ferry does not fetch code from "
            f"{scheme}://, and {module} is missing. Put {module.name} (and the modules it "
            "imports) in a code/ folder inside model.tar.gz, as SageMaker's PyTorch "
            "containers require too"
        )


def _integer(environ: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{name}: expected a whole number, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{name}: expected at least {minimum}, got {value}")
    return value


def _timeout(environ: Mapping[str, str]) -> int:
    if environ.get("SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", "").strip():
        return _integer(environ, "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS", 60, minimum=1)
    return _integer(environ, "SAGEMAKER_MODEL_SERVER_TIMEOUT", int(DEFAULT_TIMEOUT), minimum=1)


def _side_ports(safe_range: str | None, inference: int) -> tuple[int, int]:
    """The management and metrics ports: the first two of ``SAGEMAKER_SAFE_PORT_RANGE``
    (``LOW-HIGH``) other than the inference port, else of 8081, 8082, 8083."""
    candidates: list[int] = list(FALLBACK_PORTS)
    if safe_range and safe_range.strip():
        low, dash, high = safe_range.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ConfigError(
                f"SAGEMAKER_SAFE_PORT_RANGE: expected LOW-HIGH, got {safe_range!r}"
            ) from None
        if not 0 < first <= last <= 65535:
            raise ConfigError(f"SAGEMAKER_SAFE_PORT_RANGE: {safe_range!r} is no port range")
        candidates = list(range(first, min(last, first + 2) + 1))
    ports = [port for port in candidates if port != inference]
    if len(ports) < 2:
        raise ConfigError(
            f"SAGEMAKER_SAFE_PORT_RANGE {safe_range!r} leaves no two ports beside "
            f"SAGEMAKER_BIND_TO_PORT {inference} for the management and metrics APIs"
        )
    return ports[0], ports[1]


def _batching(environ: Mapping[str, str]) -> dict[str, int]:
    """The model's batching and workers, when any ``SAGEMAKER_TS_*`` variable is set."""
    if not any(environ.get(name, "").strip() for name in BATCHING_VARIABLES):
        return {}
    return {
        key: _integer(environ, name, default, minimum=1 if key != "maxBatchDelay" else 0)
        for name, (key, default) in BATCHING_VARIABLES.items()
    }


def _unread(environ: Mapping[str, str], multi_model: bool) -> list[str]:
    notes = []
    submit = environ.get("SAGEMAKER_SUBMIT_DIRECTORY", "").strip()
    base = environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR
    if submit and Path(submit.removeprefix("file://")) != Path(base) / MODEL_NAME / "code":
        notes.append(
            f"SAGEMAKER_SUBMIT_DIRECTORY={submit} is not read (nor by SageMaker's PyTorch "
            "toolkit): the code is imported from the model's code/ folder; package it there"
        )
    if multi_model and any(environ.get(name, "").strip() for name in BATCHING_VARIABLES):
        notes.append(
            "SAGEMAKER_TS_* variables apply to a single-model endpoint only (as in the "
            "toolkit); ignored with SAGEMAKER_MULTI_MODEL=true"
        )
    return notes
