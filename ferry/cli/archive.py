"""``ferry archive``: torch-model-archiver's flags, writing archives TorchServe can read."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ferry.errors import ArchiveError
from ferry.store.writer import ARCHIVE_FORMATS, ArchiveSpec, write_archive


def add_parser(commands: Any) -> None:
    parser = commands.add_parser("archive", help="package a model as a .mar (or .tar.gz, folder)")
    parser.add_argument("--model-name", required=True)
    parser.add_argument("--handler", required=True, help="built-in name or handler .py file")
    parser.add_argument("--version", default="1.0")
    parser.add_argument("--serialized-file", type=Path)
    parser.add_argument("--model-file", type=Path)
    parser.add_argument("--config-file", type=Path, help="model-config.yaml")
    parser.add_argument("--extra-files", default="", help="comma-separated files or folders")
    parser.add_argument("--export-path", type=Path, default=Path.cwd())
    parser.add_argument("--archive-format", choices=ARCHIVE_FORMATS, default="default")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite an existing archive")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = ArchiveSpec(
        model_name=args.model_name,
        handler=args.handler,
        version=args.version,
        serialized_file=args.serialized_file,
        model_file=args.model_file,
        config_file=args.config_file,
        extra_files=tuple(Path(p) for p in args.extra_files.split(",") if p),
        archive_format=args.archive_format,
    )
    try:
        target = write_archive(spec, args.export_path, force=args.force)
    except ArchiveError as error:
        print(f"ferry archive: {error.message}", file=sys.stderr)
        return 1
    print(target)
    return 0
