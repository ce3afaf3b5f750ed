"""``ferry serve``: TorchServe's start-up flags and config.properties, Ferry's settings.

Every settings flag comes from ``ferry.config.sources.OPTIONS``; see that module for the
precedence between flags, environment variables and the config file.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ferry.config.settings import ServerSettings
from ferry.config.sources import OPTIONS, load_settings
from ferry.errors import ConfigError


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="start the model server",
        description="Start Ferry. Flags override FERRY_* environment variables, which "
        "override the config file.",
    )
    parser.add_argument("--ts-config", "--config", type=Path, help="config.properties to read")
    for option in OPTIONS:
        help_text = f"config.properties: {option.key}; environment: FERRY_{option.key.upper()}"
        if option.switch:
            parser.add_argument(
                option.flag_name,
                dest=option.key,
                action="store_const",
                const="true",
                help=help_text,
            )
        elif option.key == "load_models":
            parser.add_argument(
                option.flag_name,
                dest=option.key,
                nargs="+",
                help="'all', or NAME=ARCHIVE entries to load at start-up; " + help_text,
            )
        else:
            parser.add_argument(option.flag_name, dest=option.key, help=help_text)
    # TorchServe flags accepted for drop-in scripts: Ferry always runs in the foreground
    # and keeps no config snapshots.
    parser.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--ncs", "--no-config-snapshots", action="store_true", help=argparse.SUPPRESS
    )
    parser.set_defaults(run=run)


def flags_from_args(args: argparse.Namespace) -> dict[str, str]:
    flags = {}
    for option in OPTIONS:
        value = getattr(args, option.key)
        if value is not None:
            flags[option.key] = ",".join(value) if isinstance(value, list) else value
    return flags


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    return load_settings(flags_from_args(args), os.environ, args.ts_config)


def _run_loop(coroutine: Any) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    return uvloop.run(coroutine)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    """Exit codes: see ``ferry.server``."""
    # Until the server installs its own handlers, SIGTERM interrupts start-up like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _serve(args)
    except ConfigError as error:
        print(f"ferry serve: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the server's own signal handlers are in place
        print("ferry serve: start-up interrupted", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    from ferry.logs import configure_logging
    from ferry.server import run_server

    settings = settings_from_args(args)
    configure_logging(settings.log_format, settings.log_level)
    if settings.model_store is not None and not settings.model_store.is_dir():
        raise ConfigError(f"model store {settings.model_store} is not a folder")
    return _run_loop(run_server(settings))
