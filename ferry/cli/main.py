"""``ferry``: serve models and workflows, write archives, measure."""

from __future__ import annotations

import argparse
import logging
import sys

from ferry import __version__
from ferry.cli import archive, bench, serve, workflow_archive
from ferry.logs import PLAIN_FORMAT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(commands)
    archive.add_parser(commands)
    workflow_archive.add_parser(commands)
    bench.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level="INFO", format=PLAIN_FORMAT, stream=sys.stderr)
    for chatty in ("httpx", "matplotlib"):  # per-request and font-cache lines
        logging.getLogger(chatty).setLevel(logging.WARNING)
    result: int = args.run(args)
    return result
