"""``ferry archive``: torch-model-archiver's flags, writing archives TorchServe can read.

Inputs are checked before anything is written: a broken one exits with status 2 and a
one-line error, a suspicious one is warned about. Failing to write exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ferry.errors import ArchiveError
from ferry.handlers.contract.loader import BUILTIN_HANDLERS
from ferry.store.writer import ARCHIVE_FORMATS, RUNTIMES, ArchiveSpec, check_spec, write_archive

_FORMAT_HELP = (
    "default: a .mar (zip, deflated); zip-store: a .mar stored uncompressed; "
    "tgz: a .tar.gz; no-archive: a plain folder"
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "archive",
        help="package a model as a .mar (or .tar.gz, folder)",
        description="Package a model with torch-model-archiver's flags, for Ferry or TorchServe.",
    )
    add = parser.add_argument
    add("--model-name", required=True, help="the model's name; also the archive's file name")
    add("-v", "--version", default="1.0", help="the model's version (default: 1.0)")
    add("--handler", required=True, help="built-in handler name or handler .py file[:function]")
    add("--serialized-file", type=Path, help="weights: TorchScript, state_dict or .pt2 program")
    add("--model-file", type=Path, help="Python file defining the eager model's nn.Module class")
    add("--extra-files", default="", help="comma-separated files or folders (copied recursively)")
    add("--runtime", choices=RUNTIMES, default="python", help="the manifest's runtime")
    add("-r", "--requirements-file", type=Path, help="requirements.txt for the model's packages")
    add("-c", "--config-file", type=Path, help="model-config.yaml")
    add("--archive-format", choices=ARCHIVE_FORMATS, default="default", help=_FORMAT_HELP)
    add("--export-path", type=Path, default=Path.cwd(), help="folder to write into (default: .)")
    add("-f", "--force", action="store_true", help="overwrite an existing archive")
    parser.set_defaults(run=run)


def _spec(args: argparse.Namespace) -> ArchiveSpec:
    return ArchiveSpec(
        model_name=args.model_name,
        handler=args.handler,
        version=args.version,
        serialized_file=args.serialized_file,
        model_file=args.model_file,
        config_file=args.config_file,
        extra_files=tuple(Path(p.strip()) for p in args.extra_files.split(",") if p.strip()),
        archive_format=args.archive_format,
        runtime=args.runtime,
        requirements_file=args.requirements_file,
    )


def _say(kind: str, message: str) -> None:
    """One line on stderr, whatever the message holds (a YAML error spans several)."""
    print(f"ferry archive: {kind}: {' '.join(message.split())}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    spec = _spec(args)
    try:
        warnings = check_spec(spec, args.export_path, builtin_handlers=BUILTIN_HANDLERS)
    except ArchiveError as error:
        _say("error", error.message)
        return 2
    for warning in warnings:
        _say("warning", warning)
    try:
        target = write_archive(spec, args.export_path, force=args.force)
    except ArchiveError as error:
        _say("error", error.message)
        return 1
    except OSError as error:
        _say("error", f"cannot write the archive: {error}")
        return 1
    print(target)
    return 0
