"""``ferry bench``: where the bench tool joins the ``ferry`` command line.

The tool is a distribution of its own, ferry-bench (the package ``ferry_bench``, from
``bench/`` in this repository), so that the server's carries none of it; ``pip install
'ferry-serve[bench]'`` brings it. Installed, its commands become ``ferry bench``'s, found by
the entry point it declares (group ``ferry.commands``, name ``bench``): the server's package
never imports it. Not installed, ``ferry bench ...`` says in one line what to install and
exits 2, and the server's own commands are unchanged.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Any

COMMANDS = "ferry.commands"
"""The entry point group where a distribution adds a command to ``ferry``."""

INSTALL_BENCH = "pip install 'ferry-serve[bench]'"
"""What brings the bench tool (ferry-bench and its plotting and HTTP clients)."""

FROM_A_CHECKOUT = "pip install ./bench"
"""The same from a clone of this repository, where ferry-bench is not fetched but built."""


def add_parser(commands: Any) -> None:
    """``ferry bench`` with ferry-bench's commands, or the one line naming what to install."""
    found = [point for point in entry_points(group=COMMANDS) if point.name == "bench"]
    try:
        add_bench_commands = found[0].load() if found else None
    except ModuleNotFoundError as exc:
        if exc.name != "ferry_bench":
            raise  # ferry-bench is installed but broken: not a missing install
        add_bench_commands = None  # its metadata outlived its files
    if add_bench_commands is None:
        _add_not_installed(commands)
    else:
        add_bench_commands(commands)


def _add_not_installed(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help=f"measure models and servers (needs ferry-bench: {INSTALL_BENCH})",
        description=f"Measure models and servers. Needs ferry-bench: {INSTALL_BENCH}",
    )
    parser.add_argument("words", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(run=_not_installed)


def _not_installed(args: argparse.Namespace) -> int:
    print(
        f"ferry bench: ferry-bench is not installed: {INSTALL_BENCH} "
        f"(in a checkout of Ferry: {FROM_A_CHECKOUT})",
        file=sys.stderr,
    )
    return 2
