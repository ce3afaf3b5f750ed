"""``ferry bench profile``: time a model's handler offline at each batch size
(``ferry_bench.profile``)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ferry_bench.commands.arguments import int_list

HELP: str = "time a model's handler offline at each batch size (no server)"
DESCRIPTION: str | None = (
    "Without --batch-sizes, doubles from 1 until memory runs out or time per item stops improving."
)
NEEDS: tuple[str, ...] = ("matplotlib",)
"""The bench extra's modules this command imports (checked before it starts)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, help="a .mar, .tar.gz or model folder")
    parser.add_argument("--input", required=True, help="comma-separated request bodies")
    parser.add_argument("--batch-sizes", help="e.g. 1,2,4,8")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--precision",
        help="comma-separated: fp32,fp16,bf16, each as the server would run it "
        "(default: the archive's own optimization.precision)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per point")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default: what one worker gets on this machine; set what your "
        "workers get: cores / workers)",
    )
    parser.add_argument("--out", type=Path, help="folder for profile.csv/.json/.png")


def run(args: argparse.Namespace) -> int:
    import platform

    import torch

    from ferry.config.sections import PRECISIONS
    from ferry.config.settings import available_cores, threads_per_worker
    from ferry.errors import FerryError
    from ferry.worker.torch_setup import configure_torch
    from ferry_bench.profile import (
        InputRejected,
        active_optimizations,
        check_inputs,
        load_handler,
        noisy,
        profile,
    )
    from ferry_bench.profile_report import format_optimizations, format_table, write_reports
    from ferry_bench.servers import with_precision

    try:
        batch_sizes = int_list(args.batch_sizes) if args.batch_sizes else None
        asked = [p.strip() for p in (args.precision or "").split(",") if p.strip()]
        unknown = [p for p in asked if p not in PRECISIONS]
        if unknown or (args.precision is not None and not asked):
            raise ValueError(f"unknown precision {unknown}; use fp32, fp16, bf16")
        # None: the archive as it is, at the precision it asks for itself.
        precisions: list[str | None] = list(asked) or [None]
        names = [p for p in args.input.split(",") if p]
        inputs = [Path(p).read_bytes() for p in names]
        if args.threads is not None and args.threads < 1:
            raise ValueError("--threads must be at least 1")
    except (ValueError, OSError) as exc:
        print(f"ferry bench profile: {exc}", file=sys.stderr)
        return 2
    threads = args.threads or threads_per_worker(available_cores(), 1)
    configure_torch(threads)  # as a worker: its share of the cores
    conditions = (
        f"{platform.machine()}, {available_cores()} cores; {threads} torch threads; "
        f"device {args.device}; torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="ferry-profile-") as tmp:
        optimization: dict[str, object] | None = None
        points = []
        for precision in precisions:
            # Each precision as the server would run it: the archive with its
            # optimization.precision set (the handler casts the model and its input).
            try:
                served = args.model.resolve()
                if precision is not None:
                    served = with_precision(served, precision, Path(tmp) / "served")
                work = Path(tmp) / (precision or "archived")
                work.mkdir(parents=True, exist_ok=True)
                loaded = load_handler(served, work, args.device)
                check_inputs(loaded, inputs, names)
            except (FerryError, RuntimeError, InputRejected) as exc:
                print(f"ferry bench profile: {exc}", file=sys.stderr)
                return 2
            active = active_optimizations(loaded)
            measured = str(active.get("precision", "fp32"))
            if precision is not None and measured != precision:
                print(
                    f"ferry bench profile: warning: the handler does not apply "
                    f"optimization.precision; {precision} is not measured",
                    file=sys.stderr,
                )
                continue
            if optimization is None:
                optimization = active
            points += profile(
                loaded,
                inputs,
                batch_sizes,
                [measured],
                args.seconds,
                on_point=lambda p: print(
                    f"  batch {p.batch_size} {p.variant} {p.precision}: "
                    f"{p.ms_per_item:.3f} ms/item",
                    file=sys.stderr,
                ),
            )
            del loaded
    optimization = optimization or {}
    print(conditions)
    print(format_optimizations(optimization))
    print(format_table(points))
    for warning in noisy(points):
        print(f"ferry bench profile: warning: {warning}", file=sys.stderr)
    if args.out is not None:
        for path in write_reports(points, args.out, args.model.name, optimization, conditions):
            print(path)
    return 0
