"""``model-config.yaml``: per-model settings in TorchServe's keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ferry.errors import ConfigError

_KNOWN_KEYS = {
    "minWorkers": "min_workers",
    "maxWorkers": "max_workers",
    "batchSize": "batch_size",
    "maxBatchDelay": "max_batch_delay_ms",
    "responseTimeout": "response_timeout",
    "deviceType": "device_type",
    "deviceIds": "device_ids",
}


@dataclass(frozen=True)
class ModelConfig:
    """Per-model settings. ``None`` means "use the server default"."""

    min_workers: int | None = None
    max_workers: int | None = None
    batch_size: int | None = None
    max_batch_delay_ms: float | None = None
    response_timeout: float | None = None
    device_type: str | None = None
    """``cpu`` or ``gpu``; absent means a GPU when one is visible."""
    device_ids: tuple[int, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict)
    """The whole YAML document; handlers read it as ``context.model_yaml_config``."""

    def merged(self, **overrides: Any) -> ModelConfig:
        values = {k: v for k, v in overrides.items() if v is not None}
        return ModelConfig(**{**self.__dict__, **values})


def parse_model_config(document: dict[str, Any], *, source: str) -> ModelConfig:
    values: dict[str, Any] = {}
    for yaml_key, attr in _KNOWN_KEYS.items():
        if yaml_key not in document:
            continue
        values[attr] = _coerce(attr, document[yaml_key], source=f"{source}: {yaml_key}")
    return ModelConfig(raw=dict(document), **values)


def load_model_config(path: Path) -> ModelConfig:
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {path.name}: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"{path.name}: expected a mapping at the top level")
    return parse_model_config(document, source=path.name)


def _coerce(attr: str, value: Any, *, source: str) -> Any:
    try:
        if attr in ("min_workers", "max_workers", "batch_size"):
            number = int(value)
            if number < (1 if attr == "batch_size" else 0):
                raise ValueError("out of range")
            return number
        if attr in ("max_batch_delay_ms", "response_timeout"):
            seconds = float(value)
            if seconds < 0:
                raise ValueError("negative")
            return seconds
        if attr == "device_type":
            text = str(value).lower()
            if text not in ("cpu", "gpu"):
                raise ValueError("expected cpu or gpu")
            return text
        if attr == "device_ids":
            items = value if isinstance(value, list) else [value]
            return tuple(int(item) for item in items)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: invalid value {value!r} ({exc})") from exc
    raise AssertionError(attr)


def apply_overrides(config: ModelConfig, overrides: dict[str, Any], *, source: str) -> ModelConfig:
    """config.properties' per-version settings win over the archive's model-config.yaml."""
    known = {key: value for key, value in overrides.items() if key in _KNOWN_KEYS}
    parsed = parse_model_config(known, source=source)
    return config.merged(**{attr: getattr(parsed, attr) for attr in _KNOWN_KEYS.values()})
