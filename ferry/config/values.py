"""What a setting's value may be: each ``Kind`` parses text (from a flag, a variable or
``config.properties``) and names its form for the help (``SECONDS``, ``true|false``).

A parser takes the setting's key (for the message) and the text; an invalid value raises
``ConfigError`` naming the key, so start-up stops saying which setting is wrong.
"""

from __future__ import annotations

import ipaddress
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ferry.config.image_limits import DEFAULT_MAX_IMAGE_PIXELS
from ferry.config.value_types import TORCHSERVE_MODEL_METRICS, Address, ModelMetric
from ferry.errors import ConfigError

Parser = Callable[[str, str], Any]

ENVELOPES = ("json", "body", "kserve", "kservev2")
"""TorchServe's request envelopes (``service_envelope``)."""

METRIC_TYPES = ("counter", "gauge", "histogram")
"""The metric types of a metrics_config file (TorchServe's ``MetricTypes`` values)."""


@dataclass(frozen=True)
class Kind:
    """A setting's value: how its text is parsed, and how the help shows it."""

    parse: Parser
    metavar: str
    """The value's placeholder in ``ferry serve --help`` (``SECONDS``, ``URL``)."""
    unit: str = ""
    """Written after the default (``120 s``, ``6553500 bytes``)."""
    boolean: bool = False
    """``--flag`` alone means true; ``--flag true|false`` is accepted too."""


def integer(minimum: int, metavar: str = "N", unit: str = "") -> Kind:
    def parse(key: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {text!r}") from None
        if value < minimum:
            raise ConfigError(f"{key}: must be at least {minimum}, got {value}")
        return value

    return Kind(parse, metavar, unit)


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


SECONDS = Kind(_finite("seconds", zero_allowed=False), "SECONDS", "s")
SECONDS_OR_ZERO = Kind(_finite("seconds", zero_allowed=True), "SECONDS", "s")
MILLISECONDS = Kind(_finite("milliseconds", zero_allowed=True), "MS", "ms")
BYTES = integer(1, "BYTES", "bytes")
MEGABYTES = integer(0, "MB", "MB")


def parse_boolean(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"{key}: expected true or false, got {text!r}")
    return lowered == "true"


BOOLEAN = Kind(parse_boolean, "true|false", boolean=True)


def _address(key: str, text: str) -> Address:
    return Address.parse(text.strip(), key=key)


ADDRESS = Kind(_address, "URL")


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


HOST = Kind(_host, "HOST")


def _port(key: str, text: str) -> int:
    value = int(integer(0).parse(key, text))
    if value > 65535:
        raise ConfigError(f"{key}: must be a port number up to 65535, got {value}")
    return value


PORT = Kind(_port, "PORT")


def _path(key: str, text: str) -> Path:
    return Path(text.strip()).expanduser()


PATH = Kind(_path, "PATH")


def _api_key(key: str, text: str) -> str:
    value = text.strip()
    if not value or not all(33 <= ord(c) <= 126 for c in value):
        # The value is a secret: the message never repeats it.
        raise ConfigError(f"{key}: expected visible ASCII characters without spaces")
    return value


API_KEY = Kind(_api_key, "KEY")


def _index_url(key: str, text: str) -> str:
    """A package index for pip: an http(s):// or file:// URL."""
    value = text.strip()
    url = urlsplit(value)
    if url.scheme not in ("http", "https", "file") or not (url.netloc or url.path):
        raise ConfigError(f"{key}: expected an http://, https:// or file:// URL, got {text!r}")
    if any(c.isspace() for c in value):
        raise ConfigError(f"{key}: a URL has no spaces, got {text!r}")
    return value


INDEX_URL = Kind(_index_url, "URL")


def _list(key: str, text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


LIST = Kind(_list, "A,B,...")


def _envelope(key: str, text: str) -> str:
    """TorchServe's request envelopes; empty means none (KServe sets the variable empty)."""
    value = text.strip().lower()
    if value and value not in ENVELOPES:
        raise ConfigError(f"{key}: expected one of {', '.join(ENVELOPES)} or nothing, got {text!r}")
    return value


ENVELOPE = Kind(_envelope, "{" + ",".join(ENVELOPES) + "}")


def choice(*choices: str) -> Kind:
    def parse(key: str, text: str) -> str:
        value = text.strip()
        matches = [c for c in choices if c.lower() == value.lower()]
        if not matches:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {text!r}")
        return matches[0]

    return Kind(parse, "{" + ",".join(choices) + "}")


def _pixel_limit(key: str, text: str) -> int | None:
    """A number of pixels; TorchServe's ``true`` (the default limit) or ``false`` (none)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return DEFAULT_MAX_IMAGE_PIXELS if lowered == "true" else None
    return int(integer(1).parse(key, text))


PIXEL_LIMIT = Kind(_pixel_limit, "PIXELS|true|false", "pixels")


def _image_formats(key: str, text: str) -> tuple[str, ...]:
    return tuple(name.upper() for name in _list(key, text))


IMAGE_FORMATS = Kind(_image_formats, "FORMAT,...")


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


MODELS_JSON = Kind(_models_json, "JSON")


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


METRICS_CONFIG = Kind(_metrics_config, "FILE")
