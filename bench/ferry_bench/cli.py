"""``ferry bench``'s commands, which ``ferry.cli.bench`` adds to the ``ferry`` command line.

A thin layer: each subcommand is a module of ``ferry_bench.commands`` (its options and what
it runs); this one names them and adds them to the command line. ``ferry`` builds its
parser for every command, ``ferry serve`` too, so the command modules import only the
standard library until a bench command runs; then the modules it needs from ferry-bench's
dependencies (aiohttp, httpx, matplotlib) are imported first, and one that is missing (a
``pip install --no-deps``) is reported in one line.

Ctrl-C and SIGTERM stop a command the same way: the exception unwinds it, so every server
it started (``ferry_bench.servers.start_server``, in a session of its own that neither
signal reaches) is stopped on the way out; then one line, and exit status 130 or 143.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from ferry.cli.bench import INSTALL_BENCH
from ferry_bench.commands import BenchCommand, limit, load, profile, sweep, tune

Command = Callable[[argparse.Namespace], int]

BENCH_EXTRA_MODULES = ("aiohttp", "httpx", "matplotlib")
"""The modules of ferry-bench's dependencies, which ``pip install 'ferry-serve[bench]'``
brings."""


def needing_bench_extra(command: Command, *modules: str) -> Command:
    """``command``, run only once ``modules`` (from the bench extra) import.

    They are imported before the command starts, so a sweep does not run for an hour and
    then fail to plot; a bench module importing one of them later is caught the same way.
    """

    def run(args: argparse.Namespace) -> int:
        try:
            for name in modules:
                importlib.import_module(name)
            return command(args)
        except ModuleNotFoundError as exc:
            missing = (exc.name or "").partition(".")[0]
            if missing not in BENCH_EXTRA_MODULES:
                raise
            print(
                f"ferry bench {args.tool}: needs the 'bench' extra: {INSTALL_BENCH} "
                f"(missing module {missing})",
                file=sys.stderr,
            )
            return 2

    return run


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is as Ctrl-C raises ``KeyboardInterrupt``, so the
    same clean-up runs (asyncio, too, lets a ``KeyboardInterrupt`` through its tasks)."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # Once: a second SIGTERM must not cut short the clean-up the first one started (it is
    # bounded: ``stop_group`` kills a server that does not stop within its grace).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def stopped_cleanly(command: Command) -> Command:
    """``command``, stopped by Ctrl-C or SIGTERM with its servers stopped, one line saying
    so (no traceback) and exit status 128 + the signal's number."""

    def run(args: argparse.Namespace) -> int:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            return command(args)
        except KeyboardInterrupt as stop:
            signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
            print(f"ferry bench {args.tool}: stopped ({signum.name})", file=sys.stderr)
            return 128 + signum
        finally:
            signal.signal(signal.SIGTERM, previous)

    return run


COMMANDS: dict[str, BenchCommand] = {
    "load": load,
    "profile": profile,
    "sweep": sweep,
    "limit": limit,
    "tune": tune,
}
"""``ferry bench``'s subcommands, in the order ``--help`` lists them."""


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "bench",
        help="measure models and servers",
        description=f"Measure models and servers. Needs the 'bench' extra: {INSTALL_BENCH}",
    )
    tools = parser.add_subparsers(dest="tool", required=True)
    for name, command in COMMANDS.items():
        tool = tools.add_parser(name, help=command.HELP, description=command.DESCRIPTION)
        command.add_arguments(tool)
        tool.set_defaults(run=stopped_cleanly(needing_bench_extra(command.run, *command.NEEDS)))
