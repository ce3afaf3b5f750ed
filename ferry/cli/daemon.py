"""``ferry serve --start`` / ``--stop``: TorchServe's way of running the server in the
background, with a pid file.

``--start`` re-launches ``ferry serve`` (same settings) in a new session, its stdin from
/dev/null and its stdout and stderr appended to ``ts_log.log``; it writes the pid file,
waits until the server writes its ready file (models loaded) or exits, and reports in one
line. ``--stop`` sends SIGTERM to the process the pid file names, if it is a Ferry server,
and waits for it to exit; with none running it says so and succeeds, as TorchServe does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

STOP_SECONDS = 60.0
"""How long ``--stop`` waits for the server to exit (it drains its workers first)."""
POLL_SECONDS = 0.1
LOG_TAIL_LINES = 20


def default_pid_file() -> Path:
    """``$TMPDIR/ferry-UID/ferry.pid``: one per user; ``--pid-file`` names another for a
    second server."""
    return Path(tempfile.gettempdir()) / f"ferry-{os.getuid()}" / "ferry.pid"


def start(serve_args: list[str], pid_file: Path, log_location: Path, ready_file: Path) -> int:
    """Launch ``ferry serve SERVE_ARGS`` in the background. ``serve_args`` must make the
    server log to ``log_location`` and write ``ready_file``."""
    running = running_pid(pid_file)
    if running is not None:
        print(f"Ferry is already running (pid {running}, pid file {pid_file}).", file=sys.stderr)
        return 1
    ready_file.unlink(missing_ok=True)
    log_location.mkdir(parents=True, exist_ok=True)
    log_file = log_location / "ts_log.log"
    with log_file.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "ferry", "serve", *serve_args],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,  # Ctrl-C in this terminal or its hang-up do not reach it
        )
    pid_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    pid_file.write_text(f"{process.pid}\n")
    try:
        while process.poll() is None and not ready_file.exists():
            time.sleep(POLL_SECONDS)  # the server writes the ready file; nothing to await
    except KeyboardInterrupt:
        print(f"Ferry is still starting (pid {process.pid}); logs in {log_location}")
        return 130
    if process.returncode is not None:
        pid_file.unlink(missing_ok=True)
        print(f"Ferry exited during start-up ({process.returncode}):", file=sys.stderr)
        print(_tail(log_file), file=sys.stderr)
        return process.returncode or 1
    process.returncode = 0  # it runs on detached; keep Popen from warning that it still runs
    print(f"Ferry started (pid {process.pid}); logs in {log_location}")
    return 0


def stop(pid_file: Path) -> int:
    """SIGTERM the Ferry server ``pid_file`` names and wait until it is gone. Exit code 0
    also when none runs (TorchServe's ``torchserve --stop``: "TorchServe is not currently
    running.", on stdout, exit 0), so that stopping is idempotent; 1 when it outlives
    ``STOP_SECONDS``."""
    pid = running_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)  # a stale file from a server that is gone
        print("Ferry is not currently running.")  # TorchServe's words, and its exit code 0
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while _is_alive(pid):
        if time.monotonic() > deadline:
            print(f"Ferry (pid {pid}) did not stop within {STOP_SECONDS:g} s.", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)  # another session's process: no handle to wait on
    pid_file.unlink(missing_ok=True)
    print(f"Ferry stopped (pid {pid}).")
    return 0


def running_pid(pid_file: Path) -> int | None:
    """The pid ``pid_file`` names if that process is alive and is a Ferry command."""
    try:
        pid = int(pid_file.read_text().strip())
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"ferry" in command and _is_alive(pid) else None


def _is_alive(pid: int) -> bool:
    """Exists and is not a zombie (a stopped server whose parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tail(log_file: Path) -> str:
    with log_file.open(errors="replace") as lines:
        return "".join(deque(lines, maxlen=LOG_TAIL_LINES)).rstrip()
