"""Fill ``ServerSettings`` from its sources, in this order of precedence (highest first):

1. command-line flags (``--inference-address``, TorchServe's ``--models`` ...);
2. ``FERRY_<KEY>`` environment variables (``FERRY_JOB_QUEUE_SIZE=200``);
3. TorchServe's ``TS_<KEY>`` environment variables, only when ``enable_envvars_config`` is true;
4. the config file, TorchServe's ``config.properties`` (``--ts-config FILE``);
5. the defaults in ``ServerSettings``.

Every setting is declared once, as a ``ServerSettings`` field (``ferry.config.settings``;
``ferry.config.options`` lists them): its config.properties key names its flag and
environment variables. Unknown keys warn, naming a close known one ("did you mean ...?");
invalid values stop start-up naming the key.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from ferry.config.options import GROUPS, OPTIONS, OPTIONS_BY_KEY, Option
from ferry.config.settings import ServerSettings
from ferry.config.values import parse_boolean, read_model_metrics
from ferry.errors import ConfigError
from ferry.suggest import did_you_mean

__all__ = [
    "GROUPS",
    "IGNORED_TORCHSERVE_KEYS",
    "OPTIONS",
    "OPTIONS_BY_KEY",
    "Option",
    "load_settings",
    "read_model_metrics",
    "read_properties",
]

log = logging.getLogger("ferry.config")


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
            hint = did_you_mean(key, [*OPTIONS_BY_KEY, MODEL_SNAPSHOT])
            log.warning("%s: unknown setting %s; ignored%s", source, key, hint)


def _warn_misspelt_variables(environ: Mapping[str, str]) -> None:
    """A ``FERRY_*`` variable that is no setting's but looks like one is almost surely a
    typo (other ``FERRY_*`` names, e.g. those Ferry sets for its workers, are left alone)."""
    known = {option.env_name for option in OPTIONS}
    for name in environ:
        if name.startswith("FERRY_") and name not in known:
            hint = did_you_mean(name, known)
            if hint:
                log.warning("environment: unknown setting variable %s; ignored%s", name, hint)


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
    _warn_misspelt_variables(environ)
    envvars_enabled = {**from_file, **ferry_env, **flags}.get("enable_envvars_config", "false")
    if parse_boolean("enable_envvars_config", envvars_enabled):
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
