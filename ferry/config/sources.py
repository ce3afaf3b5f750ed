"""Fill ``ServerSettings`` from its sources, in this order of precedence (highest first):

1. command-line flags (``--inference-address``, TorchServe's ``--models`` ...);
2. ``FERRY_<KEY>`` environment variables (``FERRY_JOB_QUEUE_SIZE=200``);
3. TorchServe's ``TS_<KEY>`` environment variables, only when ``enable_envvars_config`` is true;
4. the config file, TorchServe's ``config.properties`` (``--ts-config FILE``);
5. the defaults in ``ServerSettings``.

Every option is listed once, in ``OPTIONS``: its config.properties key names its flag and
environment variables. Unknown keys warn; invalid values stop start-up naming the key.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ferry.config.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from ferry.config.settings import (
    ENVELOPES,
    METRIC_TYPES,
    TORCHSERVE_MODEL_METRICS,
    Address,
    ModelMetric,
    ServerSettings,
)
from ferry.errors import ConfigError

log = logging.getLogger("ferry.config")

Parser = Callable[[str, str], Any]


def _integer(minimum: int) -> Parser:
    def parse(key: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {text!r}") from None
        if value < minimum:
            raise ConfigError(f"{key}: must be at least {minimum}, got {value}")
        return value

    return parse


def _finite(unit: str, *, zero_allowed: bool) -> Parser:
    """A finite number of ``unit``: positive, or also 0 when ``zero_allowed``."""
    bound = "a finite number >= 0" if zero_allowed else f"a positive number of {unit}"

    def parse(key: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{key}: expected a number of {unit}, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
            raise ConfigError(f"{key}: must be {bound}, got {text}")
        return value

    return parse


_seconds = _finite("seconds", zero_allowed=False)
_milliseconds = _finite("milliseconds", zero_allowed=True)
_seconds_or_zero = _finite("seconds", zero_allowed=True)


def _boolean(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"{key}: expected true or false, got {text!r}")
    return lowered == "true"


def _address(key: str, text: str) -> Address:
    return Address.parse(text.strip(), key=key)


def _host(key: str, text: str) -> str:
    """A bare host name or IP address, TorchServe's form for the gRPC addresses."""
    value = text.strip().removeprefix("[").removesuffix("]")
    if not value or any(c in value for c in "/ ") or (":" in value and not _is_ipv6(value)):
        raise ConfigError(
            f"{key}: expected a host name or IP address (the port is a setting of its own), "
            f"got {text!r}"
        )
    return value


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _port(key: str, text: str) -> int:
    value = int(_integer(0)(key, text))
    if value > 65535:
        raise ConfigError(f"{key}: must be a port number up to 65535, got {value}")
    return value


def _path(key: str, text: str) -> Path:
    return Path(text.strip()).expanduser()


def _api_key(key: str, text: str) -> str:
    value = text.strip()
    if not value or not all(33 <= ord(c) <= 126 for c in value):
        # The value is a secret: the message never repeats it.
        raise ConfigError(f"{key}: expected visible ASCII characters without spaces")
    return value


def _index_url(key: str, text: str) -> str:
    """A package index for pip: an http(s):// or file:// URL."""
    value = text.strip()
    url = urlsplit(value)
    if url.scheme not in ("http", "https", "file") or not (url.netloc or url.path):
        raise ConfigError(f"{key}: expected an http://, https:// or file:// URL, got {text!r}")
    if any(c.isspace() for c in value):
        raise ConfigError(f"{key}: a URL has no spaces, got {text!r}")
    return value


def _list(key: str, text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _envelope(key: str, text: str) -> str:
    """TorchServe's request envelopes; empty means none (KServe sets the variable empty)."""
    value = text.strip().lower()
    if value and value not in ENVELOPES:
        raise ConfigError(f"{key}: expected one of {', '.join(ENVELOPES)} or nothing, got {text!r}")
    return value


def _choice(*choices: str) -> Parser:
    def parse(key: str, text: str) -> str:
        value = text.strip()
        matches = [c for c in choices if c.lower() == value.lower()]
        if not matches:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {text!r}")
        return matches[0]

    return parse


def _pixel_limit(key: str, text: str) -> int | None:
    """A number of pixels; TorchServe's ``true`` (the default limit) or ``false`` (none)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return DEFAULT_MAX_IMAGE_PIXELS if lowered == "true" else None
    return int(_integer(1)(key, text))


def _image_formats(key: str, text: str) -> tuple[str, ...]:
    return tuple(name.upper() for name in _list(key, text))


def _models_json(key: str, text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """TorchServe's ``models={"name": {"1.0": {"minWorkers": 1, ...}}}``."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{key}: invalid JSON: {exc}") from None
    valid = isinstance(document, dict) and all(
        isinstance(versions, dict) and all(isinstance(v, dict) for v in versions.values())
        for versions in document.values()
    )
    if not valid:
        raise ConfigError(f'{key}: expected {{"model": {{"version": {{...settings}}}}}}')
    return document  # type: ignore[no-any-return]


def read_model_metrics(path: Path) -> tuple[ModelMetric, ...]:
    """The ``model_metrics`` section of a TorchServe metrics.yaml: under each type
    (``counter``, ``gauge``, ``histogram``) a list of ``{name, unit, dimensions}``. As in
    TorchServe the section must declare something; ``ts_metrics`` (the frontend's) and the
    ``dimensions`` aliases are not read here (YAML resolves the aliases)."""
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"metrics_config: cannot read {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"metrics_config: {path} is not valid YAML: {exc}") from None
    section = document.get("model_metrics") if isinstance(document, dict) else None
    if not section:
        raise ConfigError(f"metrics_config: {path} has no model_metrics section")
    if not isinstance(section, dict):
        raise ConfigError(f"metrics_config: {path}: model_metrics must map metric types to lists")
    declared: dict[tuple[str, str], ModelMetric] = {}
    for metric_type, entries in section.items():
        if metric_type not in METRIC_TYPES:
            raise ConfigError(
                f"metrics_config: {path}: metric type {metric_type!r} is not one of "
                f"{', '.join(METRIC_TYPES)}"
            )
        if not isinstance(entries, list | type(None)):
            raise ConfigError(f"metrics_config: {path}: model_metrics.{metric_type} is not a list")
        for entry in entries or ():
            metric = _model_metric(entry, metric_type, f"metrics_config: {path}: {metric_type}")
            declared[(metric_type, metric.name)] = metric  # a later one wins, as in TorchServe
    return tuple(declared.values())


def _model_metric(entry: object, metric_type: str, where: str) -> ModelMetric:
    if not isinstance(entry, dict) or not {"name", "unit", "dimensions"} <= entry.keys():
        raise ConfigError(f"{where}: each metric needs name, unit and dimensions, got {entry!r}")
    name, unit, dimensions = entry["name"], entry["unit"], entry["dimensions"] or []
    if not isinstance(name, str) or not name or not isinstance(unit, str):
        raise ConfigError(f"{where}: name and unit must be text, got {entry!r}")
    if not isinstance(dimensions, list) or not all(isinstance(d, str) for d in dimensions):
        raise ConfigError(f"{where}: {name}: dimensions must be a list of names")
    if len(set(dimensions)) != len(dimensions):
        raise ConfigError(f"{where}: {name}: a dimension is named twice in {dimensions}")
    return ModelMetric(name, unit, metric_type, tuple(dimensions))


def _metrics_config(key: str, text: str) -> tuple[ModelMetric, ...]:
    """A metrics.yaml's model metrics; nothing named: TorchServe's default ones."""
    if not text.strip():
        return TORCHSERVE_MODEL_METRICS
    return read_model_metrics(_path(key, text))


@dataclass(frozen=True)
class Option:
    key: str
    """config.properties key; the flag is ``--key-with-dashes`` unless ``flag`` says otherwise."""
    field: str
    parse: Parser
    flag: str | None = None
    switch: bool = False
    """A flag without a value that sets the option to true."""

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")


OPTIONS = (
    Option("inference_address", "inference_address", _address),
    Option("management_address", "management_address", _address),
    Option("metrics_address", "metrics_address", _address),
    Option("certificate_file", "certificate_file", _path),
    Option("private_key_file", "private_key_file", _path),
    Option("enable_grpc", "enable_grpc", _boolean),
    Option("grpc_inference_address", "grpc_inference_address", _host),
    Option("grpc_inference_port", "grpc_inference_port", _port),
    Option("grpc_management_address", "grpc_management_address", _host),
    Option("grpc_management_port", "grpc_management_port", _port),
    Option("enable_grpc_ssl", "enable_grpc_ssl", _boolean),
    Option("model_store", "model_store", _path),
    Option("workflow_store", "workflow_store", _path),
    Option("load_models", "models", _list, flag="--models"),
    Option("models", "model_overrides", _models_json, flag="--models-config"),
    Option("default_workers_per_model", "default_workers_per_model", _integer(0)),
    Option("job_queue_size", "job_queue_size", _integer(1)),
    Option("max_request_size", "max_request_size", _integer(1)),
    Option("max_tensor_elements", "max_tensor_elements", _integer(1)),
    Option("max_response_size", "max_response_size", _integer(1)),
    Option("max_header_size", "max_header_size", _integer(1024)),
    Option("max_headers", "max_headers", _integer(1)),
    Option("header_timeout", "header_timeout", _seconds),
    Option("body_read_timeout", "body_read_timeout", _seconds),
    Option("default_response_timeout", "default_response_timeout", _seconds),
    Option("drain_delay", "drain_delay", _seconds_or_zero),
    Option("stream_timeout", "stream_timeout", _seconds_or_zero),
    Option("cancel_grace", "cancel_grace", _seconds),
    Option("default_batch_size", "default_batch_size", _integer(1)),
    Option("default_max_batch_delay", "default_max_batch_delay_ms", _milliseconds),
    Option("number_of_gpu", "number_of_gpu", _integer(0)),
    Option("allowed_urls", "allowed_urls", _list),
    Option("enable_metrics_api", "enable_metrics_api", _boolean),
    Option("max_handler_metric_series", "max_handler_metric_series", _integer(1)),
    Option("metrics_config", "model_metrics", _metrics_config),
    Option("metric_time_interval", "metric_time_interval", _seconds),
    Option("disable_system_metrics", "disable_system_metrics", _boolean),
    Option("enable_model_api", "enable_model_api", _boolean, switch=True),
    Option("install_py_dep_per_model", "install_py_dep_per_model", _boolean),
    Option("pip_index_url", "pip_index_url", _index_url),
    Option("pip_find_links", "pip_find_links", _path),
    Option(
        "disable_token_authorization",
        "disable_token_authorization",
        _boolean,
        flag="--disable-token-auth",
        switch=True,
    ),
    Option("key_file", "key_file", _path),
    Option("management_key", "management_key", _api_key),
    Option("inference_key", "inference_key", _api_key),
    Option("enable_envvars_config", "enable_envvars_config", _boolean, switch=True),
    Option("service_envelope", "service_envelope", _envelope),
    Option("log_format", "log_format", _choice("plain", "json")),
    Option("enable_tracing", "enable_tracing", _boolean),
    Option("access_log", "access_log", _boolean),
    Option("cpu_pinning", "cpu_pinning", _boolean),
    Option("spare_worker_for_compiled_models", "spare_worker_for_compiled_models", _boolean),
    Option("log_level", "log_level", _choice("DEBUG", "INFO", "WARNING", "ERROR")),
    Option("ready_file", "ready_file", _path),
    Option("log_location", "log_location", _path),
    Option("config_snapshots", "config_snapshots", _boolean),
    Option("max_workers_total", "max_workers_total", _integer(0)),
    Option("load_models_on_demand", "load_models_on_demand", _boolean),
    Option("model_memory_budget_mb", "model_memory_budget_mb", _integer(0)),
    Option("gpu_memory_budget_mb", "gpu_memory_budget_mb", _integer(0)),
    Option("ray_pool_replicas", "ray_pool_replicas", _integer(1)),
    Option("ray_models_per_replica", "ray_models_per_replica", _integer(1)),
    Option("ray_direct_routes", "ray_direct_routes", _boolean),
    Option("ray_handler_in_replica", "ray_handler_in_replica", _boolean),
    Option(
        "share_worker_processes",
        "share_worker_processes",
        _choice("auto", "always", "never"),
    ),
    Option("max_unpacked_size", "max_unpacked_size", _integer(1)),
    Option("limit_max_image_pixels", "limit_max_image_pixels", _pixel_limit),
    Option("allowed_image_formats", "allowed_image_formats", _image_formats),
    Option("cors_allowed_origin", "cors_allowed_origin", _list),
    Option("cors_allowed_methods", "cors_allowed_methods", _list),
    Option("cors_allowed_headers", "cors_allowed_headers", _list),
)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}

# TorchServe's documented config.properties keys Ferry accepts without using them, each with
# why; the warning quotes it. Never a key of OPTIONS (tests/unit/test_sources.py checks).
_NO_JVM = "Ferry has no JVM or Netty"
IGNORED_TORCHSERVE_KEYS: dict[str, str] = {
    "vmargs": _NO_JVM,
    "number_of_netty_threads": _NO_JVM,
    "netty_client_threads": _NO_JVM,
    "prefer_direct_buffer": _NO_JVM,
    "async_logging": "Ferry's logging never blocks a request",
    "keystore": "use certificate_file and private_key_file",
    "keystore_pass": "use certificate_file and private_key_file",
    "keystore_type": "use certificate_file and private_key_file",
    "default_service_handler": "each archive names its handler",
    "decode_input_request": "handlers get each request body as bytes, undecoded",
    "snapshot_store": "snapshots are files in log_location/config (config_snapshots)",
    "workflow_store_path": "not a TorchServe setting; use workflow_store",
    "blacklist_env_vars": "workers inherit Ferry's environment",
    "unregister_model_timeout": "unregistering drains workers within DRAIN_SECONDS",
    "model_server_home": "paths are relative to the working directory",
    "metrics_mode": "metrics are always Prometheus text on metrics_address",
    "metrics_format": "metrics are always Prometheus text on metrics_address",
    "model_metrics_auto_detect": "handler metrics are always served, declared in "
    "metrics_config or not",
    "system_metrics_cmd": "Ferry reads system metrics itself (ts_metrics.log)",
    "grpc_inference_max_connection_age_ms": "gRPC connections live as long as clients keep them",
    "grpc_management_max_connection_age_ms": "gRPC connections live as long as clients keep them",
    "grpc_inference_max_connection_age_grace_ms": "see grpc_inference_max_connection_age_ms",
    "grpc_management_max_connection_age_grace_ms": "see grpc_management_max_connection_age_ms",
    "use_native_io": _NO_JVM,
    "io_ratio": _NO_JVM,
    "tsConfigFile": "name the file with --ts-config or TS_CONFIG_FILE",
    "initial_worker_port": "workers talk to Ferry over pipes, not ports",
    "max_request_size_bytes": "use max_request_size",
    "use_env_allowed_urls": "use enable_envvars_config",
    "plugins_path": "Ferry loads no Java plugins",
}


def read_properties(path: Path) -> dict[str, str]:
    """Java .properties: ``key=value`` or ``key: value``, ``#``/``!`` comments, ``\\``
    continuations (the ``models`` JSON usually spans lines)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    values: dict[str, str] = {}
    pending = ""
    for raw in lines:
        line = raw.strip()
        if not pending and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        separator = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if separator < 0:
            raise ConfigError(f"{path.name}: cannot parse line {raw!r}")
        values[line[:separator].strip()] = line[separator + 1 :].strip()
    return values


def _warn_unknown(keys: list[str], source: str) -> None:
    for key in keys:
        if key in IGNORED_TORCHSERVE_KEYS:
            reason = IGNORED_TORCHSERVE_KEYS[key]
            log.warning(
                "%s: %s is a TorchServe setting Ferry does not use (%s); ignored",
                source,
                key,
                reason,
            )
        elif key not in OPTIONS_BY_KEY and key != MODEL_SNAPSHOT:
            log.warning("%s: unknown setting %s; ignored", source, key)


MODEL_SNAPSHOT = "model_snapshot"
"""TorchServe's ``model_snapshot`` JSON (KServe's config.properties lists the models to
load in it): ``{"models": {"name": {"1.0": {"marName": ..., "minWorkers": ...}}}}``."""


def _models_from_snapshot(merged: dict[str, str]) -> None:
    """``model_snapshot`` names the models to load and their settings, as TorchServe reads
    it, unless ``load_models`` or ``models`` say otherwise."""
    text = merged.pop(MODEL_SNAPSHOT, None)
    if text is None or "load_models" in merged or "models" in merged:
        return
    try:
        snapshot = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{MODEL_SNAPSHOT}: invalid JSON: {exc}") from None
    models = snapshot.get("models") if isinstance(snapshot, dict) else None
    if not isinstance(models, dict):
        expected = '{"models": {"name": {"version": {...}}}}'
        raise ConfigError(f"{MODEL_SNAPSHOT}: expected {expected}")
    if models:
        merged["models"] = json.dumps(models)
        merged["load_models"] = ",".join(models)


def _from_environment(environ: Mapping[str, str], prefix: str) -> dict[str, str]:
    return {
        option.key: environ[prefix + option.key.upper()]
        for option in OPTIONS
        if prefix + option.key.upper() in environ
    }


def load_settings(
    flags: Mapping[str, str], environ: Mapping[str, str], config_file: Path | None
) -> ServerSettings:
    """Merge the sources (see the module docstring) and parse every value once."""
    from_file = read_properties(config_file) if config_file is not None else {}
    _warn_unknown(list(from_file), config_file.name if config_file else "config")
    merged: dict[str, str] = dict(from_file)
    ferry_env = _from_environment(environ, "FERRY_")
    envvars_enabled = {**from_file, **ferry_env, **flags}.get("enable_envvars_config", "false")
    if _boolean("enable_envvars_config", envvars_enabled):
        merged.update(_from_environment(environ, "TS_"))
    merged.update(ferry_env)
    merged.update(flags)
    _models_from_snapshot(merged)
    values = {
        OPTIONS_BY_KEY[key].field: OPTIONS_BY_KEY[key].parse(key, text)
        for key, text in merged.items()
        if key in OPTIONS_BY_KEY
    }
    return ServerSettings(**values)
