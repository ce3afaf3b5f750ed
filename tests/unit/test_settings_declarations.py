"""Each setting is declared once, as a ``ServerSettings`` field made by ``setting()``: every
field has exactly one option in ``GROUPS`` (so in the help, the docs and the readers), and
every option fills a field."""

from __future__ import annotations

import dataclasses
from collections import Counter

from ferry.config import values as v
from ferry.config.options import GROUPS, OPTIONS, OPTIONS_BY_KEY, default_text
from ferry.config.settings import ServerSettings
from ferry.config.settings.declare import OPTION, setting
from ferry.config.sources import load_settings

INTERNAL: dict[str, str] = {}
"""Fields no operator sets, so without an option, each with why (none today)."""

FIELDS = [field.name for field in dataclasses.fields(ServerSettings)]


def _without_option(settings_class: type[ServerSettings]) -> list[str]:
    """Fields of ``settings_class`` that no option in ``GROUPS`` fills, internal ones aside."""
    filled = {option.field for option in OPTIONS}
    return [
        field.name
        for field in dataclasses.fields(settings_class)
        if field.name not in filled and field.name not in INTERNAL
    ]


def test_every_field_has_one_option_or_is_internal() -> None:
    assert not _without_option(ServerSettings), "fields without an option in GROUPS"
    filled = Counter(option.field for option in OPTIONS)
    assert not [name for name, count in filled.items() if count > 1]
    assert not set(INTERNAL) & set(filled), "an internal field has an option"


def test_a_field_outside_the_groups_is_caught() -> None:
    """Declared with ``setting()`` on a class ``GROUPS`` does not list, a field has no
    option: the check above names it."""

    @dataclasses.dataclass(frozen=True)
    class Extended(ServerSettings):
        stray: int = setting(0, v.integer(0), "Not in any group.")

    assert _without_option(Extended) == ["stray"]


def test_every_option_names_a_field() -> None:
    assert not [option.key for option in OPTIONS if option.field not in FIELDS]


def test_names_are_unique_across_sources() -> None:
    for names in (
        [option.key for option in OPTIONS],
        [option.flag_name for option in OPTIONS],
        [option.env_name for option in OPTIONS],
    ):
        assert len(names) == len(set(names)), [n for n, c in Counter(names).items() if c > 1]
    assert len(OPTIONS_BY_KEY) == len(OPTIONS) == sum(len(group.options) for group in GROUPS)


def test_a_key_differs_from_its_field_only_where_declared() -> None:
    """The field's name is the key unless its declaration says ``key=``."""
    by_field = {field.name: field for field in dataclasses.fields(ServerSettings)}
    for option in OPTIONS:
        declared = by_field[option.field].metadata[OPTION]
        assert option.key == (declared.key or option.field)


def test_each_option_reads_into_its_field() -> None:
    """A value given under the option's key lands in its field (the default shown is the
    field's own)."""
    defaults = ServerSettings()
    settings = load_settings({"job_queue_size": "7", "default_max_batch_delay": "5"}, {}, None)
    assert settings.job_queue_size == 7 and settings.default_max_batch_delay_ms == 5.0
    assert default_text(OPTIONS_BY_KEY["job_queue_size"]) == str(defaults.job_queue_size)
