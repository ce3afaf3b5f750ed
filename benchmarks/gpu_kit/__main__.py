"""The GPU kit (issue 49): everything a borrowed GPU machine needs to answer Ferry's GPU
questions unattended, in one command of under ten minutes, with no package index there.

    make gpu-kit                  # here: .gpu-kit/ (the wheels the device lacks, run.sh)
    bash .gpu-kit/run.sh          # there, from the checkout's root, with OUT set
    OUT=/tmp/kit PYTHON=.venv/bin/python bash .gpu-kit/run.sh --dry-run   # here, no GPU

``run`` installs the kit's wheels into a fresh private folder (``pip --no-index
--no-deps --target``), puts it and the checkout on ``PYTHONPATH``, and runs the parts
(``benchmarks/gpu_kit/parts.py``) one after the other, each under its own budget: one
that overruns is killed with its whole process tree, and each part's page and the
running ``kit.md`` (the outcomes so far) and ``kit.log`` (every line) are in ``OUT`` as
soon as it ends. ``--dry-run`` downloads the same pinned wheels for this machine's Python
instead of using the device's (they are built for 3.12), installs them the same way, and
runs every part, which SKIPs for want of a GPU after importing all it needs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_kit import wheels
from benchmarks.gpu_kit.parts import INSTALL_BUDGET, TOTAL, kit_parts
from benchmarks.gpu_kit.runner import Outcome, Part, run_parts

ROOT = Path(__file__).resolve().parents[2]
DOWNLOAD_BUDGET = 120.0
"""Seconds the dry run's download of this machine's wheels may take."""
RUN_SCRIPT = """#!/usr/bin/env bash
# Made by `make gpu-kit` (benchmarks/gpu_kit). Run from the checkout's root:
#   on the device:  bash .gpu-kit/run.sh                  (OUT is set there)
#   here:           OUT=/tmp/gpu-kit PYTHON=.venv/bin/python bash .gpu-kit/run.sh --dry-run
set -euo pipefail
kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m benchmarks.gpu_kit run --kit "$kit" \\
    --out "${OUT:?OUT names the folder for the results}" "$@"
"""


def build(kit: Path) -> None:
    found = wheels.build(kit)
    script = kit / "run.sh"
    script.write_text(RUN_SCRIPT)
    script.chmod(0o755)
    for wheel in found:
        print(f"{wheel.size / 1024:8.0f} KiB  {wheel.file}")
    total = sum(wheel.size for wheel in found)
    print(f"{total / 2**20:8.2f} MiB  in {kit}/wheels ({len(found)} wheels); entry: {script}")


def run(kit: Path, out: Path, only: list[str], total: float, dry_run: bool) -> int:
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    mode = "dry run (no GPU expected)" if dry_run else "device run"
    site = Path(tempfile.mkdtemp(prefix="ferry-gpu-kit-site-"))
    parts = [p for p in kit_parts(sys.executable, str(site)) if not only or p.name in only]
    try:
        try:
            install(kit, site, dry_run)
        except (OSError, subprocess.SubprocessError, SystemExit) as failure:
            summarise(out, mode, parts, [], f"the wheels did not install: {failure}")
            print((out / "kit.md").read_text(), flush=True)
            return 1
        print(f"installed the kit's wheels into {site} in {time.monotonic() - start:.1f} s")
        left = total - (time.monotonic() - start)
        outcomes = run_parts(
            parts,
            ROOT,
            out,
            part_environment(site),
            left,
            lambda done: summarise(out, mode, parts, done),
        )
    finally:
        shutil.rmtree(site, ignore_errors=True)
    print((out / "kit.md").read_text(), flush=True)
    return 1 if any(o.status in ("FAIL", "TIMEOUT") for o in outcomes) else 0


def install(kit: Path, site: Path, dry_run: bool) -> None:
    """The kit's wheels into ``site``; for a dry run, the same pins built for this Python."""
    pinned = wheels.read_manifest(kit)
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-kit-wheels-") as scratch:
        if dry_run:
            pins = [f"{wheel.name}=={wheel.version}" for wheel in pinned]
            wheels.download(pins, Path(scratch), for_device=False, timeout=DOWNLOAD_BUDGET)
            files = sorted(Path(scratch).glob("*.whl"))
        else:
            files = [kit / "wheels" / wheel.file for wheel in pinned]
        wheels.install(files, site, timeout=INSTALL_BUDGET)


def part_environment(site: Path) -> dict[str, str]:
    """This process's environment, with the kit's folder and the checkout first on the
    path. gRPC off: no part measures it, and the device's protobuf is of a version
    Ferry's generated modules were not checked against."""
    checkout = [str(ROOT), str(ROOT / "bench")]  # ferry, and ferry_bench (ferry-bench's)
    path = [str(site), *checkout, *filter(None, [os.environ.get("PYTHONPATH")])]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "PYTHONUNBUFFERED": "1",
        "FERRY_ENABLE_GRPC": "false",
    }


def summarise(
    out: Path, mode: str, parts: list[Part], outcomes: list[Outcome], failure: str = ""
) -> None:
    """``kit.md``: every part's outcome so far, and the last lines of those that failed
    or overran."""
    lines = [f"# Ferry's GPU kit: {mode}", ""]
    if failure:
        lines += [f"**Nothing ran**: {failure}", ""]
    lines += [
        "| part | outcome | seconds (budget) | reason or summary | page |",
        "|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        part = outcome.part
        if part.inline:
            page = "below" if outcome.page else "-"
        else:
            page = part.result if part.result and (out / part.result).is_file() else "-"
        reason = outcome.reason.replace("|", "\\|")
        seconds = f"{outcome.seconds:.0f} ({part.budget:.0f})"
        lines.append(f"| {part.name} | {outcome.status} | {seconds} | {reason} | {page} |")
    for part in parts[len(outcomes) :]:
        lines.append(f"| {part.name} | (to come) | - ({part.budget:.0f}) | {part.purpose} | - |")
    for outcome in outcomes:
        if outcome.page:
            body = outcome.page.strip().splitlines()
            if body and body[0].startswith("# "):  # one title for the whole page
                body = body[1:]
            lines += ["", f"## {outcome.part.name}", *body]
    for outcome in outcomes:
        if outcome.status in ("FAIL", "TIMEOUT") and outcome.tail:
            lines += ["", f"## {outcome.part.name}: its last lines", "", "```", *outcome.tail]
            lines.append("```")
    (out / "kit.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_kit", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser("build", help="make the kit here (needs an index)")
    build_command.add_argument("--kit", type=Path, default=ROOT / ".gpu-kit")
    run_command = commands.add_parser("run", help="install the wheels and run the parts")
    run_command.add_argument("--kit", type=Path, default=ROOT / ".gpu-kit")
    run_command.add_argument("--out", type=Path, required=True)
    run_command.add_argument("--only", default="", help="comma-separated part names")
    run_command.add_argument("--total", type=float, default=TOTAL, help="seconds in all")
    run_command.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    if args.command == "build":
        build(args.kit)
        return 0
    only = [name for name in args.only.split(",") if name]
    known = {part.name for part in kit_parts("", "")}
    if unknown := set(only) - known:
        parser.error(f"no part named {sorted(unknown)}; the parts: {sorted(known)}")
    return run(args.kit, args.out, only, args.total, args.dry_run)


if __name__ == "__main__":
    raise SystemExit(main())
