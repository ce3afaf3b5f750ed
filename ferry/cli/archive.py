"""``ferry archive``: torch-model-archiver's flags, writing archives TorchServe can read.

Inputs are checked before anything is written: a broken one exits with status 2 and a
one-line error, a suspicious one is warned about. Failing to write exits with status 1.

``--aot-inductor`` archives the model compiled ahead of time instead of as it is given:
an AOTInductor package (``<model-name>.pt2``) for this machine's CPU (or its GPU, with
``--aot-device cuda``), with a batch dimension of 1 to ``--max-batch`` rows, checked
against the model's own answers (``ferry.handlers.builtin.aot_compile``). Compiling
needs a C++ compiler (22 s for a ResNet-50 on a 2-core CPU); a package it cannot make
or that answers differently exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
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
    aot = parser.add_argument_group("compiled ahead of time (AOTInductor)")
    aot.add_argument(
        "--aot-inductor", action="store_true", help="archive the model compiled ahead of time"
    )
    aot.add_argument("--input-shape", help="one input's shape without the batch, e.g. 3,224,224")
    aot.add_argument(
        "--max-batch", type=int, help="the largest batch it runs (default: batchSize, else 1)"
    )
    aot.add_argument("--aot-device", choices=("cpu", "cuda"), default="cpu", help="compile for")
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
    with tempfile.TemporaryDirectory() as scratch:
        if args.aot_inductor:
            try:
                spec = _compiled(spec, args, Path(scratch))
            except ArchiveError as error:
                _say("error", error.message)
                return 2
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


def _compiled(spec: ArchiveSpec, args: argparse.Namespace, scratch: Path) -> ArchiveSpec:
    """``spec`` with the model replaced by its AOTInductor package, made in ``scratch``."""
    shape = _input_shape(args.input_shape)
    max_batch = args.max_batch or _config_batch_size(spec.config_file)
    try:
        import torch

        from ferry.handlers.builtin.aot_compile import compile_package, source_model
    except ImportError as error:
        raise ArchiveError(f"--aot-inductor needs torch: {error}") from error
    device = torch.device(args.aot_device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ArchiveError("--aot-device cuda: this machine has no usable GPU")
    model = source_model(spec.serialized_file, spec.model_file, torch.randn(2, *shape))
    _say("note", f"compiling {spec.model_name} for {device} (batches of 1 to {max_batch})")
    package = compile_package(
        model, shape, max_batch, scratch / f"{spec.model_name}.pt2", device=device
    )
    _say(
        "note",
        f"compiled in {package.seconds:.0f} s; answers within {package.max_difference:.1e} "
        "of the model's",
    )
    return dataclasses.replace(spec, serialized_file=package.path, model_file=None)


def _input_shape(text: str | None) -> tuple[int, ...]:
    if not text:
        raise ArchiveError("--aot-inductor needs --input-shape (one input, e.g. 3,224,224)")
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ArchiveError(f"--input-shape {text!r}: expected sizes such as 3,224,224")
    return shape


def _config_batch_size(config_file: Path | None) -> int:
    if config_file is None:
        return 1
    from ferry.config.model_config import load_model_config

    return load_model_config(config_file).batch_size or 1
