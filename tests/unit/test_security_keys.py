"""Where API keys come from: settings, then an existing key file, then new keys (written
only on ``save``). No server: ``ferry.security`` on files in tmp_path."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from ferry.config.sources import load_settings
from ferry.errors import ConfigError
from ferry.security import ApiKeys, plan_keys, read_key_file, write_key_file

STORED = {"management": {"key": "stored-management"}, "inference": {"key": "stored-inference"}}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key_file.json"
    path.write_text(json.dumps(STORED))
    path.chmod(0o600)
    return path


def test_settings_win_and_the_file_is_not_even_read(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    path.write_text("not json")
    plan = plan_keys(path, management="m-key", inference="i-key")
    assert plan.keys == ApiKeys("m-key", "i-key") and plan.origin == "settings"
    plan.save()
    assert path.read_text() == "not json"


def test_an_existing_key_file_is_reused_as_it_is(key_file: Path) -> None:
    before = key_file.read_bytes()
    plan = plan_keys(key_file)
    assert plan.keys == ApiKeys("stored-management", "stored-inference")
    plan.save()
    assert key_file.read_bytes() == before


def test_a_setting_overrides_one_key_of_the_file(key_file: Path) -> None:
    before = key_file.read_bytes()
    plan = plan_keys(key_file, management="m-key")
    assert plan.keys == ApiKeys("m-key", "stored-inference")
    plan.save()
    assert key_file.read_bytes() == before


def test_new_keys_are_written_only_on_save_then_reused(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "key_file.json"
    plan = plan_keys(path)
    assert plan.origin == "generated" and plan.keys.management != plan.keys.inference
    assert not path.exists()
    plan.save()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_key_file(path) == plan.keys
    assert plan_keys(path).keys == plan.keys
    assert [p.name for p in path.parent.iterdir()] == ["key_file.json"]  # no temporary left


def test_a_new_key_file_records_a_key_from_settings_too(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    plan = plan_keys(path, inference="i-key")
    plan.save()
    assert read_key_file(path) == ApiKeys(plan.keys.management, "i-key")


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"management": {"key": "m"}}',
        '{"management": {"key": "m"}, "inference": {"key": ""}}',
        '{"management": {"key": "m"}, "inference": {"key": 7}}',
        '{"management": "m", "inference": {"key": "i"}}',
        '{"management": {"key": "has space"}, "inference": {"key": "i"}}',
    ],
)
def test_a_malformed_key_file_stops_start_up_and_is_kept(tmp_path: Path, text: str) -> None:
    path = tmp_path / "key_file.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match="is not a Ferry key file") as raised:
        plan_keys(path)
    assert str(path) in raised.value.message and "\n" not in raised.value.message
    assert path.read_text() == text


def test_an_unreadable_key_file_stops_start_up(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    path.mkdir()
    with pytest.raises(ConfigError, match="cannot read key file"):
        plan_keys(path)


def test_save_never_replaces_a_file_that_appeared_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    plan = plan_keys(path)
    path.write_text(json.dumps(STORED))  # another server wrote it after we looked
    with pytest.raises(ConfigError, match="created by another process"):
        plan.save()
    assert json.loads(path.read_text()) == STORED
    assert [p.name for p in tmp_path.iterdir()] == ["key_file.json"]


def test_write_key_file_is_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "key_file.json"
    write_key_file(path, ApiKeys("m", "i"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"management": {"key": "m"}, "inference": {"key": "i"}}


def test_keys_never_show_in_a_repr() -> None:
    keys = ApiKeys("secret-m", "secret-i")
    settings = load_settings(
        {"management_key": "secret-m"}, {"FERRY_INFERENCE_KEY": "secret-i"}, None
    )
    assert "secret" not in repr(keys) + repr(settings) + repr(
        plan_keys(Path("x"), "secret-m", "secret-i")
    )


def test_keys_come_from_flags_environment_and_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("management_key=from-file\ninference_key=from-file\n")
    from_file = load_settings({}, {}, config)
    assert (from_file.management_key, from_file.inference_key) == ("from-file", "from-file")
    environ = {"FERRY_MANAGEMENT_KEY": "from-env"}
    merged = load_settings({"inference_key": "from-flag"}, environ, config)
    assert (merged.management_key, merged.inference_key) == ("from-env", "from-flag")


@pytest.mark.parametrize("value", ["", "   ", "two words", "café"])
def test_an_unusable_key_setting_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError, match="management_key") as raised:
        load_settings({}, {"FERRY_MANAGEMENT_KEY": value}, None)
    assert value.strip() == "" or value not in raised.value.message
