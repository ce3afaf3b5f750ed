"""``ferry serve``: TorchServe's start-up flags and config.properties, Ferry's settings.

Every settings flag and its help come from ``ferry.config.options`` (through
``ferry.cli.settings_flags``); ``ferry.config.sources`` says which source wins.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ferry.cli import daemon, settings_flags
from ferry.config.settings import ServerSettings
from ferry.config.sources import OPTIONS, OPTIONS_BY_KEY, load_settings
from ferry.errors import ConfigError

USAGE = (
    "%(prog)s [-h] [--ts-config FILE] [--model-store PATH] [--models NAME=ARCHIVE ...]\n"
    "       [--start | --stop] [--ray [ADDRESS]] [--SETTING VALUE ...]"
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "serve",
        help="start the model server",
        usage=USAGE,
        formatter_class=settings_flags.HelpFormatter,
        description="Start Ferry: serve the models of a model store over TorchServe's APIs. "
        + settings_flags.RULE,
    )
    _add_torchserve_flags(parser.add_argument_group("Running"))
    settings_flags.add_settings_flags(parser)
    parser.set_defaults(run=run)


def _add_torchserve_flags(group: argparse._ArgumentGroup) -> None:
    """The config file, and TorchServe's ways of running: in the background with a pid file
    (``--start``, ``--stop``) or attached (``--foreground``, the default)."""
    group.add_argument(
        "--ts-config",
        "--config",
        type=Path,
        metavar="FILE",
        help="TorchServe's config.properties to read (default: the file TS_CONFIG_FILE names)",
    )
    mode = group.add_mutually_exclusive_group()
    mode.add_argument(
        "--start",
        action="store_true",
        help="run in the background: return once models are loaded, logs in log_location "
        "(default ./logs), pid in --pid-file",
    )
    mode.add_argument(
        "--stop",
        action="store_true",
        help="stop the server --pid-file names, else the one at the inference address these "
        "flags and config give (with neither: the only one running)",
    )
    group.add_argument(
        "--foreground",
        action="store_true",
        help="stay attached (the default; with --start, --start is ignored)",
    )
    group.add_argument(
        "--pid-file",
        type=Path,
        metavar="PATH",
        help="pid file of --start / --stop (default $TMPDIR/ferry-UID/ferry-HOST-PORT.pid, "
        "after the inference address)",
    )
    group.add_argument(
        "--log-config",
        type=Path,
        metavar="FILE",
        help="Python logging config replacing Ferry's: fileConfig INI (.ini, .conf, .cfg) "
        "or dictConfig .json / .yaml; TorchServe's log4j2 .xml is ignored with a warning",
    )
    group.add_argument(
        "--ncs",
        "--no-config-snapshots",
        dest="config_snapshots",
        action="store_const",
        const="false",
        help="neither restore nor write model snapshots (config_snapshots=false)",
    )
    group.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="serve the start-up models as a Ray Serve application: on the Ray cluster at "
        "ADDRESS ('auto': the one on this machine), or on a local Ray without it; needs "
        "the 'ray' extra: pip install 'ferry-serve[ray]'",
    )


def flags_from_args(args: argparse.Namespace) -> dict[str, str]:
    """The settings given as flags, as text keyed by config.properties key."""
    flags = {}
    for option in OPTIONS:
        value = getattr(args, option.key)
        if value is not None:
            flags[option.key] = ",".join(value) if isinstance(value, list) else value
    return flags


def config_file_from_args(args: argparse.Namespace) -> Path | None:
    """``--ts-config``, else TorchServe's ``TS_CONFIG_FILE`` variable, names the config file
    (a flag wins over the environment, as for every setting); None: no config file."""
    if args.ts_config is not None:
        return Path(args.ts_config)
    if os.environ.get("TS_CONFIG_FILE"):
        return Path(os.environ["TS_CONFIG_FILE"]).expanduser()
    return None


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    return load_settings(flags_from_args(args), os.environ, config_file_from_args(args))


def run_loop(coroutine: Any) -> int:
    """Run the server's coroutine on uvloop when it is installed, else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)  # type: ignore[no-any-return]
    return uvloop.run(coroutine)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    """Exit codes: see ``ferry.server``; ``--start`` / ``--stop``: see ``ferry.cli.daemon``."""
    # Until the server installs its own handlers, SIGTERM interrupts start-up like Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if args.stop:
            return _stop(args)
        if args.start and not args.foreground:
            return _start(args)
        return _serve(args)
    except ConfigError as error:
        print(f"ferry serve: {error.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before the server's own signal handlers are in place
        print("ferry serve: start-up interrupted", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    from ferry.logs import apply_log_config, configure_logging
    from ferry.server import run_server
    from ferry.service.snapshots import restore_snapshot

    settings = settings_from_args(args)
    configure_logging(settings.log_format, settings.log_level, settings.log_location)
    if args.log_config is not None:
        try:
            apply_log_config(args.log_config)
        except (OSError, ValueError) as error:
            raise ConfigError(f"--log-config {args.log_config}: {error}") from None
    if settings.model_store is not None and not settings.model_store.is_dir():
        raise ConfigError(f"model store {settings.model_store} is not a folder")
    if args.ray is not None:
        from ferry.ray_serve.app import run_on_ray

        return run_on_ray(settings, args.ray or None)  # snapshots: the Ray application's
    # A source like the others, once logging is set; as in TorchServe, only a start with no
    # config file restores the latest snapshot.
    settings = restore_snapshot(settings, config_file_from_args(args))
    return run_loop(run_server(settings))


def _stop(args: argparse.Namespace) -> int:
    """``--stop``: the server ``--pid-file`` names, else the one at the inference address
    these flags and config file give (``ferry.cli.daemon.stop_by_address``)."""
    if args.pid_file is not None:
        return daemon.stop(args.pid_file)
    inference = settings_from_args(args).inference_address
    told = (
        config_file_from_args(args) is not None
        or "inference_address" in flags_from_args(args)
        or inference != ServerSettings().inference_address
    )
    return daemon.stop_by_address(inference, told)


def _start(args: argparse.Namespace) -> int:
    """Check the settings here, then hand the same ones to a background ``ferry serve``."""
    settings = settings_from_args(args)
    if settings.model_store is not None and not settings.model_store.is_dir():
        raise ConfigError(f"model store {settings.model_store} is not a folder")
    pid_file = (args.pid_file or daemon.default_pid_file(settings.inference_address)).absolute()
    log_location = (settings.log_location or Path("logs")).absolute()
    ready_file = settings.ready_file or daemon.addresses_file(pid_file)
    child_args = [f"--log-location={log_location}", f"--ready-file={ready_file}"]
    if args.ts_config is not None:
        child_args.append(f"--ts-config={args.ts_config}")
    if args.log_config is not None:
        child_args.append(f"--log-config={args.log_config}")
    for key, value in flags_from_args(args).items():
        option = OPTIONS_BY_KEY[key]
        if key not in ("log_location", "ready_file"):
            child_args.append(f"{option.flag_name}={value}")
    return daemon.start(child_args, pid_file, log_location, ready_file)
