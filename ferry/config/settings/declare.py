"""How a setting is declared: a ``ServerSettings`` field made by ``setting()``, which gives
its type and default (the field's) and its value kind, meaning and names (its ``Option``).

    job_queue_size: int = setting(100, v.integer(1), "Requests a model version may ...")

The field's name is the setting's config.properties key unless ``key`` says otherwise; the
flag is ``--key-with-dashes`` and the variable ``FERRY_KEY``. ``declared_options`` reads the
options back, in the order the fields are declared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ferry.config import values as v

T = TypeVar("T")

OPTION = "ferry.option"
"""The key of a setting's ``Option`` in its field's metadata."""


@dataclass(frozen=True)
class Option:
    key: str
    """config.properties key; the flag is ``--key-with-dashes`` unless ``flag`` says otherwise,
    the variable ``FERRY_KEY`` (TorchServe's ``TS_KEY`` with ``enable_envvars_config``)."""
    field: str
    """The ``ServerSettings`` field it fills."""
    kind: v.Kind
    meaning: str
    """What it does, in a sentence or two (Markdown's ``code`` marks allowed)."""
    flag: str | None = None
    default_note: str = ""
    """What the default means when its value does not say (``0``: derived from the devices)."""
    see: tuple[str, str] | None = None
    """A docs/ page that says more: (title, link relative to docs/)."""

    @property
    def flag_name(self) -> str:
        return self.flag or "--" + self.key.replace("_", "-")

    @property
    def env_name(self) -> str:
        return "FERRY_" + self.key.upper()

    @property
    def parse(self) -> v.Parser:
        return self.kind.parse


def setting(
    default: T,
    kind: v.Kind,
    meaning: str,
    *,
    key: str = "",
    flag: str | None = None,
    default_note: str = "",
    see: tuple[str, str] | None = None,
    repr: bool = True,
) -> T:
    """A settings field starting at ``default`` (immutable; else ``setting_factory``), read
    as ``kind``; ``meaning`` is what the help and docs/configuration.md say of it."""
    option = Option(key, "", kind, meaning, flag, default_note, see)
    return dataclasses.field(default=default, repr=repr, metadata={OPTION: option})


def setting_factory(
    factory: Callable[[], T],
    kind: v.Kind,
    meaning: str,
    *,
    key: str = "",
    flag: str | None = None,
    default_note: str = "",
    see: tuple[str, str] | None = None,
) -> T:
    """``setting`` for a mutable default: each settings object gets ``factory()``."""
    option = Option(key, "", kind, meaning, flag, default_note, see)
    return dataclasses.field(default_factory=factory, metadata={OPTION: option})


def declared_options(settings_class: type[Any]) -> tuple[Option, ...]:
    """The options of ``settings_class``'s fields (a dataclass's), keys and fields named."""
    options = []
    for field in dataclasses.fields(settings_class):
        option = field.metadata.get(OPTION)
        if option is not None:
            options.append(
                dataclasses.replace(option, key=option.key or field.name, field=field.name)
            )
    return tuple(options)
