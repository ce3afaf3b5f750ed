"""Every server setting's option, read from its declaration: its config.properties key,
flag, environment variable, value kind, meaning and default.

Each setting is declared once, as a ``ServerSettings`` field of its group
(``ferry.config.settings``, with ``setting()``). ``ferry serve --help``
(``ferry.cli.settings_flags``), the settings tables of docs/configuration.md
(``python -m ferry.config.docs``) and the readers in ``ferry.config.sources`` all come from
``GROUPS``; the value itself lands in the field the option names, whose default is the one
shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ferry.config.settings import Address, ModelMetric, ServerSettings
from ferry.config.settings.declare import Option, declared_options
from ferry.config.settings.models import (
    ManyModelSettings,
    ModelStoreSettings,
    RaySettings,
    WorkerSettings,
)
from ferry.config.settings.network import AddressSettings, GrpcSettings, SecuritySettings
from ferry.config.settings.operations import (
    LifecycleSettings,
    LimitSettings,
    ObservabilitySettings,
)

__all__ = ["GROUPS", "OPTIONS", "OPTIONS_BY_KEY", "Group", "Option", "default_text"]


@dataclass(frozen=True)
class Group:
    title: str
    options: tuple[Option, ...]


GROUPS = (
    Group("Addresses and TLS", declared_options(AddressSettings)),
    Group("gRPC", declared_options(GrpcSettings)),
    Group("Security", declared_options(SecuritySettings)),
    Group("Models and stores", declared_options(ModelStoreSettings)),
    Group("Workers and batching", declared_options(WorkerSettings)),
    Group("Many models and memory", declared_options(ManyModelSettings)),
    Group("Limits", declared_options(LimitSettings)),
    Group("Metrics, logs and traces", declared_options(ObservabilitySettings)),
    Group("Start-up and shut-down", declared_options(LifecycleSettings)),
    Group("Ray (--ray)", declared_options(RaySettings)),
)
OPTIONS = tuple(option for group in GROUPS for option in group.options)
OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}


@cache
def _defaults() -> ServerSettings:
    return ServerSettings()


def default_text(option: Option) -> str:
    """The default as the help and the docs show it: the value ``ServerSettings`` starts
    with, its unit, and the note saying what it means; "" when there is none to show."""
    value = _show(getattr(_defaults(), option.field))
    if value and option.kind.unit:
        value = f"{value} {option.kind.unit}"
    if value and option.default_note:
        return f"{value} ({option.default_note})"
    return value or option.default_note


def _show(value: Any) -> str:
    if value is None or value == "" or value == {}:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Address):
        return value.url()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        if any(isinstance(item, ModelMetric) for item in value):
            return ", ".join(item.name for item in value)
        return ",".join(value) if value else "none"
    if isinstance(value, Path):
        return str(value)
    return str(value)
