"""``ferry serve``'s settings flags and their help, from ``ferry.config.options``.

One flag per option, in the option's group; its help is the option's meaning and default.
A boolean takes ``--flag`` (true) or ``--flag true|false``; the others take a value.
"""

from __future__ import annotations

import argparse
import textwrap

from ferry.config.options import GROUPS, Option, default_text

RULE = (
    "Every setting is also a config.properties key and an environment variable: "
    "--job-queue-size is job_queue_size and FERRY_JOB_QUEUE_SIZE. Flags override FERRY_* "
    "variables, which override TorchServe's TS_* ones (with --enable-envvars-config), which "
    "override the config file. docs/configuration.md has them all in tables."
)


class HelpFormatter(argparse.HelpFormatter):
    """Each flag on a line of its own, its help below it across the terminal's width: the
    flags are too long to share a line with 70 meanings."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=6)

    # argparse's own formatters override these two; here only to keep a flag
    # (--job-queue-size) whole at a line's end.
    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def plain(markdown: str) -> str:
    """The meaning as the terminal shows it: no code marks, ``%`` kept from argparse."""
    return markdown.replace("`", "").replace("%", "%%")


def help_text(option: Option) -> str:
    """Meaning, default, and the key or variable when they do not follow from the flag."""
    text = f"{plain(option.meaning)} Default: {plain(default_text(option))}."
    if option.flag is not None:
        text += f" (config.properties: {option.key}; environment: {option.env_name})"
    return text


def boolean_text(text: str) -> str:
    """A boolean flag's value, checked as argparse reads it: ``true`` or ``false``."""
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per option, grouped as ``ferry.config.options.GROUPS``; each stores text
    (or, for ``--models``, a list) under the option's key, for
    ``ferry.cli.serve.flags_from_args``."""
    for group in GROUPS:
        section = parser.add_argument_group(group.title)
        for option in group.options:
            kind = option.kind
            if kind.boolean:
                section.add_argument(
                    option.flag_name,
                    dest=option.key,
                    nargs="?",
                    const="true",
                    type=boolean_text,
                    metavar=kind.metavar,
                    help=help_text(option),
                )
            elif option.key == "load_models":  # TorchServe's --models a=a.mar b=b.mar
                section.add_argument(
                    option.flag_name,
                    dest=option.key,
                    nargs="+",
                    metavar="NAME=ARCHIVE",
                    help=help_text(option),
                )
            else:
                section.add_argument(
                    option.flag_name, dest=option.key, metavar=kind.metavar, help=help_text(option)
                )
