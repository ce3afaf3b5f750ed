"""One part at a time, each under its own budget: what overruns is killed, process tree
and all, and every part's outcome is on disk as soon as it ends.

Standard library only: this runs on the device before the kit's wheels are installed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TextIO

SKIP_EXIT = 2
"""A part's exit status for "cannot run here" (no GPU, say); its last line says why."""
KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL for an overrunning part."""
TAIL_LINES = 25


@dataclass(frozen=True)
class Part:
    """A step of the kit: a command, its budget, and the result page it writes."""

    name: str
    argv: tuple[str, ...]
    """Run from the checkout's root; ``{result}`` is replaced by the result page's path."""
    budget: float
    """Seconds it may take before it is killed."""
    result: str | None = None
    """The page it writes (a file name, copied into the output folder), if any."""
    purpose: str = ""
    inline: bool = False
    """Its page goes into ``kit.md`` instead of a file of its own: the device sends back
    at most 8 files, and a short page is not worth one of them."""


@dataclass
class Outcome:
    part: Part
    status: str
    """PASS, FAIL, SKIP, TIMEOUT or NOT RUN."""
    reason: str
    seconds: float
    tail: list[str] = field(default_factory=list)
    page: str = ""
    """An inline part's page, as it wrote it."""


def run_part(
    part: Part, root: Path, scratch: Path, env: dict[str, str], log: TextIO, budget: float
) -> Outcome:
    """Run ``part`` for at most ``budget`` seconds, its output into ``log`` (and this
    process's stdout) as it comes; the page it writes goes into ``scratch``."""
    page = scratch / (part.result or f"{part.name}.md")
    argv = [arg.replace("{result}", str(page)) for arg in part.argv]
    _say(log, f"\n===== {part.name} (budget {budget:.0f} s): {' '.join(argv)}")
    start = time.monotonic()
    process = subprocess.Popen(
        argv,
        cwd=root,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed whole on overrun
    )
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    assert process.stdout is not None
    reader = threading.Thread(target=_relay, args=(process.stdout, log, tail), daemon=True)
    reader.start()
    try:
        returncode: int | None = process.wait(timeout=budget)
    except subprocess.TimeoutExpired:
        returncode = None
    kill_tree(process.pid)  # an overrun's whole tree; after a clean exit, any stragglers
    process.wait()
    reader.join(timeout=KILL_GRACE)
    process.stdout.close()
    seconds = time.monotonic() - start
    lines = list(tail)
    status, reason = _judge(returncode, lines, budget)
    _say(log, f"===== {part.name}: {status} in {seconds:.0f} s: {reason}")
    return Outcome(part, status, reason, seconds, lines)


def _relay(stream: IO[bytes], log: TextIO, tail: deque[str]) -> None:
    with contextlib.suppress(ValueError, OSError):  # closed under it: an orphan held the pipe
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            _say(log, line)


def _say(log: TextIO, line: str) -> None:
    log.write(line + "\n")
    log.flush()
    print(line, flush=True)


def _judge(returncode: int | None, tail: list[str], budget: float) -> tuple[str, str]:
    last = next((line.strip() for line in reversed(tail) if line.strip()), "")
    if returncode is None:
        return "TIMEOUT", f"killed after its {budget:.0f} s budget; last line: {last}"
    for word in ("SKIP", "FAIL", "PASS"):
        last = last.removeprefix(f"{word}:").strip()
    if returncode == 0:
        return "PASS", last
    if returncode == SKIP_EXIT:
        return "SKIP", last or "no reason given"
    return "FAIL", f"exit {returncode}: {last}"


def kill_tree(pid: int) -> None:
    """SIGTERM the process group ``pid`` leads and every descendant (those that started
    sessions of their own too), then SIGKILL what is left after ``KILL_GRACE``."""
    targets = {pid, *descendants(pid)}
    _signal_all(pid, targets, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE
    while time.monotonic() < deadline and any(_alive(p) for p in targets - {pid}):
        time.sleep(0.1)
    _signal_all(pid, {*targets, *descendants(pid)}, signal.SIGKILL)


def _signal_all(group: int, pids: set[int], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, from ``/proc`` (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def run_parts(
    parts: list[Part],
    root: Path,
    out: Path,
    env: dict[str, str],
    total: float,
    on_outcome: Callable[[list[Outcome]], None],
) -> list[Outcome]:
    """Run ``parts`` in order within ``total`` seconds; after each, copy its page into
    ``out`` and call ``on_outcome`` with the outcomes so far."""
    deadline = time.monotonic() + total
    outcomes: list[Outcome] = []
    scratch = Path(env.get("TMPDIR", "/tmp")) / f"ferry-gpu-kit-{os.getpid()}"
    with open(out / "kit.log", "a") as log:
        for part in parts:
            left = deadline - time.monotonic()
            if left < 10:
                outcomes.append(Outcome(part, "NOT RUN", "no time left in the kit's total", 0))
            else:
                folder = scratch / part.name
                folder.mkdir(parents=True, exist_ok=True)
                outcome = run_part(part, root, folder, env, log, min(part.budget, left))
                outcomes.append(outcome)
                page = folder / (part.result or "")
                if part.result and page.is_file():
                    if part.inline:
                        outcome.page = page.read_text(errors="replace")
                    else:
                        shutil.copyfile(page, out / part.result)
            on_outcome(outcomes)
    shutil.rmtree(scratch, ignore_errors=True)
    return outcomes
