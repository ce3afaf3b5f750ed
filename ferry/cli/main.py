"""``ferry``: serve models and workflows, write archives, measure."""

from __future__ import annotations

import argparse
import logging
import sys

from ferry import __version__
from ferry.cli import archive, bench, sagemaker, serve, workflow_archive
from ferry.logs import PLAIN_FORMAT
from ferry.suggest import did_you_mean


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(commands)
    sagemaker.add_parser(commands)
    archive.add_parser(commands)
    workflow_archive.add_parser(commands)
    bench.add_parser(commands)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown flag is refused by the command it was given to,
    naming the flag of that command it resembles (argparse 3.11 only lists it)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = _command_parser(parser, sys.argv[1:] if argv is None else argv)
        flags = [flag for action in _actions(command) for flag in action.option_strings]
        hints = [did_you_mean(word.partition("=")[0], flags) for word in unknown]
        hint = next((hint for hint in hints if hint), "")
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    # argparse keeps a parser's flags only in ``_actions`` (unchanged since Python 3.2);
    # tests/unit/test_cli_flags.py covers this use.
    return parser._actions


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)command parser the words of ``argv`` lead to (``ferry bench tune``)."""
    for action in _actions(parser):
        if isinstance(action.choices, dict):
            word = next((word for word in argv if word in action.choices), None)
            if word is not None:
                chosen = action.choices[word]
                return _command_parser(chosen, argv[argv.index(word) + 1 :])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    logging.basicConfig(level="INFO", format=PLAIN_FORMAT, stream=sys.stderr)
    for chatty in ("httpx", "matplotlib"):  # per-request and font-cache lines
        logging.getLogger(chatty).setLevel(logging.WARNING)
    result: int = args.run(args)
    return result
