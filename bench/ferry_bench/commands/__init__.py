"""``ferry bench``'s subcommands, one module each: ``HELP``, ``DESCRIPTION``, ``NEEDS`` (the bench
extra's modules it imports), ``add_arguments(parser)`` and ``run(args)`` (the exit status).

``ferry_bench.cli`` lists them and adds them to the command line; a command module imports
only the standard library at the top, and the bench modules it drives inside ``run``, so the
CLI loads without the ``bench`` extra.
"""

from __future__ import annotations

import argparse
from typing import Protocol


class BenchCommand(Protocol):
    """What a command module provides (a module satisfies it by its names)."""

    HELP: str
    DESCRIPTION: str | None
    NEEDS: tuple[str, ...]

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...
