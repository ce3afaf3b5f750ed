"""``ferry archive-workflow``: torch-workflow-archiver's flags, writing a ``.war``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ferry.errors import FerryError
from ferry.workflows.war import write_war


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "archive-workflow",
        help="package a workflow (a DAG of models and functions) as a .war",
        description="Package a workflow with torch-workflow-archiver's flags.",
    )
    add = parser.add_argument
    add("--workflow-name", required=True, help="the workflow's name; also the file's name")
    add("--spec-file", type=Path, required=True, help="the workflow spec (YAML: models, dag)")
    add("--handler", type=Path, required=True, help="Python file defining the function nodes")
    add("--extra-files", default="", help="comma-separated files or folders to include")
    add("--export-path", type=Path, default=Path.cwd(), help="folder to write into (default: .)")
    add("-f", "--force", action="store_true", help="overwrite an existing archive")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    extra = [Path(p.strip()) for p in args.extra_files.split(",") if p.strip()]
    try:
        target = write_war(
            args.workflow_name, args.spec_file, args.handler, extra, args.export_path, args.force
        )
    except FerryError as error:
        print(f"ferry archive-workflow: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"ferry archive-workflow: error: cannot write the archive: {error}", file=sys.stderr)
        return 1
    print(target)
    return 0
