"""``ferry serve --help`` and docs/configuration.md from the one settings table
(``ferry.config.options``); booleans as ``--flag`` and ``--flag true|false``; typos named."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest

from ferry.cli.main import build_parser, parse_args
from ferry.cli.serve import flags_from_args
from ferry.cli.settings_flags import HelpFormatter, plain
from ferry.config import docs
from ferry.config.options import GROUPS, OPTIONS, Option, default_text
from ferry.config.sources import load_settings

BOOLEANS = [option for option in OPTIONS if option.kind.boolean]


def _help_entries(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Each flag of ``ferry serve --help`` with its help, joined on one line."""
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["serve", "--help"])
    entries: dict[str, str] = {}
    flag = ""
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0].rstrip(",")
            entries[flag] = ""
        elif line.startswith("      ") and flag:
            entries[flag] = f"{entries[flag]} {line.strip()}".strip()
        else:
            flag = ""
    return entries


def test_every_option_has_a_meaning_and_a_default() -> None:
    for option in OPTIONS:
        assert option.meaning.strip().endswith("."), option.key
        assert default_text(option), f"{option.key}: no default to show"
        assert "None" not in default_text(option), option.key


def test_the_help_gives_each_settings_meaning_and_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    entries = _help_entries(capsys)
    for option in OPTIONS:
        entry = entries[option.flag_name]
        meaning = " ".join(plain(option.meaning).replace("%%", "%").split())
        assert meaning in entry, option.key
        assert f"Default: {plain(default_text(option))}." in entry, option.key


def test_the_help_is_grouped_and_wrapped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["serve", "--help"])
    lines = capsys.readouterr().out.splitlines()
    titles = [line.removesuffix(":") for line in lines if line and not line[0].isspace()]
    assert [group.title for group in GROUPS] == [
        t for t in titles if t in {g.title for g in GROUPS}
    ]
    assert all(len(line) <= 92 for line in lines)  # the usage's first line; the rest 78
    # Flags stay whole at a line's end (no "--job-" / "queue-size").
    assert not [line for line in lines if re.search(r"--[a-z-]*-$", line)]


def test_the_configuration_page_is_generated_from_the_table() -> None:
    page = docs.PAGE.read_text(encoding="utf-8")
    assert docs.render(page) == page, "run: python -m ferry.config.docs"
    for option in OPTIONS:
        assert f"`{option.key}`<br>`{option.flag_name}`<br>`{option.env_name}`" in page


def test_the_generator_keeps_the_prose_around_the_tables(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Before\n\nprose\n\n{docs.BEGIN}\nstale\n{docs.END}\n\nafter\n")
    assert docs.main(["--page", str(page), "--check"]) == 1
    assert docs.main(["--page", str(page)]) == 0
    written = page.read_text()
    assert written.startswith("# Before\n\nprose\n\n") and written.endswith("\n\nafter\n")
    assert "stale" not in written and "| `job_queue_size`<br>" in written
    assert docs.main(["--page", str(page), "--check"]) == 0


@pytest.mark.parametrize("option", BOOLEANS, ids=lambda option: option.key)
def test_every_boolean_flag_takes_both_forms(option: Option) -> None:
    parser = build_parser()
    flag = option.flag_name
    given = {
        (flag,): True,
        (flag, "true"): True,
        (flag, "false"): False,
        (f"{flag}=FALSE",): False,
        (flag, "--job-queue-size", "7"): True,  # the switch does not swallow the next flag
    }
    for words, value in given.items():
        settings = load_settings(flags_from_args(parser.parse_args(["serve", *words])), {}, None)
        assert getattr(settings, option.field) is value, words


def test_booleans_read_the_same_from_every_source(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text("enable_model_api=true\naccess_log=false\n")
    from_file = load_settings({}, {}, config)
    from_env = load_settings(
        {}, {"FERRY_ENABLE_MODEL_API": "true", "FERRY_ACCESS_LOG": "false"}, None
    )
    for settings in (from_file, from_env):
        assert settings.enable_model_api is True and settings.access_log is False


def test_a_boolean_flag_refuses_other_words(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["serve", "--enable-grpc", "yes"])
    assert "argument --enable-grpc: expected true or false, got 'yes'" in capsys.readouterr().err


def test_a_misspelt_flag_names_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(build_parser(), ["serve", "--defualt-workers-per-model", "2"])
    error = capsys.readouterr().err
    assert exited.value.code == 2
    assert "ferry serve: error: unrecognized arguments: --defualt-workers-per-model 2" in error
    assert "(did you mean '--default-workers-per-model'?)" in error


def test_an_unlike_flag_gets_no_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["serve", "--zzz-nothing"])
    assert "did you mean" not in capsys.readouterr().err


def test_a_subcommands_misspelt_flag_is_matched_against_its_own(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(
            build_parser(),
            ["archive", "--model-name", "x", "--handler", "h.py", "--export-paht", "d"],
        )
    assert "ferry archive: error:" in (error := capsys.readouterr().err)
    assert "did you mean '--export-path'?" in error


def test_a_misspelt_key_names_the_close_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.properties"
    config.write_text("defualt_workers_per_model=2\nsomething_else=1\n")
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        settings = load_settings({}, {}, config)
    assert settings.default_workers_per_model == 0
    assert (
        "unknown setting defualt_workers_per_model; ignored "
        "(did you mean 'default_workers_per_model'?)"
    ) in caplog.text
    assert "unknown setting something_else; ignored\n" in caplog.text + "\n"


def test_a_misspelt_variable_names_the_close_one(caplog: pytest.LogCaptureFixture) -> None:
    environ = {"FERRY_JOB_QEUE_SIZE": "5", "FERRY_PINNED_CORES": "2,3", "FERRY_X": "1"}
    with caplog.at_level(logging.WARNING, logger="ferry.config"):
        load_settings({}, environ, None)
    assert (
        "unknown setting variable FERRY_JOB_QEUE_SIZE; ignored "
        "(did you mean 'FERRY_JOB_QUEUE_SIZE'?)"
    ) in caplog.text
    assert "FERRY_PINNED_CORES" not in caplog.text and "FERRY_X" not in caplog.text


def test_the_formatter_is_the_one_serve_uses() -> None:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--a-long-flag-name", help="see --job-queue-size " * 8)
    assert "--job-queue-size" in parser.format_help()
