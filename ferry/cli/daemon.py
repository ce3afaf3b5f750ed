"""``ferry serve --start`` / ``--stop``: TorchServe's way of running the server in the
background, with a pid file.

``--start`` re-launches ``ferry serve`` (same settings) in a new session, its stdin from
/dev/null and its stdout and stderr appended to ``ts_log.log``; it writes the pid file,
waits until the server writes its ready file (models loaded) or exits, and reports in one
line. ``--stop`` sends SIGTERM to the process the pid file names, if it is a Ferry server,
and waits for it to exit; with none running it says so and succeeds, as TorchServe does.

Servers are told apart by their inference address: without ``--pid-file``, each has its
own pid file, ``$TMPDIR/ferry-UID/ferry-HOST-PORT.pid`` (TorchServe, and Ferry before
issue 47, had one per user account, so ``--stop`` in any folder stopped whichever server
ran). Beside it, ``ferry-HOST-PORT.pid.ready`` holds the addresses the server bound, so
that ``--stop`` says which server it stopped. ``--stop`` stops the server its flags and
config file name; given neither, the one at the default address, else the only one
running; when several run and nothing says which, it lists them and stops none.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from ferry.config.settings import Address

STOP_SECONDS = 60.0
"""How long ``--stop`` waits for the server to exit (it drains its workers first)."""
POLL_SECONDS = 0.1
LOG_TAIL_LINES = 20


def pid_folder() -> Path:
    """``$TMPDIR/ferry-UID``: where the default pid files of this user's servers are."""
    return Path(tempfile.gettempdir()) / f"ferry-{os.getuid()}"


def default_pid_file(inference: Address) -> Path:
    """The pid file of the server whose inference API is at ``inference`` (as configured:
    port 0 too), ``pid_folder()/ferry-HOST-PORT.pid``."""
    where = f"unix{inference.path}" if inference.scheme == "unix" else inference.url()
    name = re.sub(r"[^A-Za-z0-9.]+", "-", where.partition("://")[2] or where).strip("-")
    return pid_folder() / f"ferry-{name}.pid"


def addresses_file(pid_file: Path) -> Path:
    """Beside the pid file: the addresses the server bound (its ready file's copy)."""
    return pid_file.with_name(pid_file.name + ".ready")


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
    if ready_file != addresses_file(pid_file):
        addresses_file(pid_file).write_text(ready_file.read_text())
    print(f"Ferry started (pid {process.pid}); logs in {log_location}")
    return 0


def stop(pid_file: Path) -> int:
    """SIGTERM the Ferry server ``pid_file`` names and wait until it is gone. Exit code 0
    also when none runs (TorchServe's ``torchserve --stop``: "TorchServe is not currently
    running.", on stdout, exit 0), so that stopping is idempotent; 1 when it outlives
    ``STOP_SECONDS``."""
    pid = running_pid(pid_file)
    if pid is None:
        _forget(pid_file)  # a stale file from a server that is gone
        print("Ferry is not currently running.")  # TorchServe's words, and its exit code 0
        return 0
    which = describe(pid_file, pid)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while _is_alive(pid):
        if time.monotonic() > deadline:
            print(f"Ferry ({which}) did not stop within {STOP_SECONDS:g} s.", file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)  # another session's process: no handle to wait on
    _forget(pid_file)
    print(f"Ferry stopped ({which}).")
    return 0


def stop_by_address(inference: Address, told: bool) -> int:
    """``--stop`` without ``--pid-file``: the server whose inference address is
    ``inference`` (its default pid file); else, when ``told`` is False (no flag or config
    file named an address), the only server running. Several running and none named:
    they are listed, none is stopped, exit 1."""
    wanted = default_pid_file(inference)
    if running_pid(wanted) is not None:
        return stop(wanted)
    running = running_servers()
    if not told and len(running) == 1:
        return stop(running[0][0])
    if told or not running:
        _forget(wanted)
        at = f" at {inference.url()}" if running else ""
        print(f"Ferry is not currently running{at}.")
        _list_servers(running, "other Ferry servers running:")
        return 0
    _list_servers(
        running,
        "Several Ferry servers are running; none stopped. Name one with the flags or "
        "--ts-config it was started with, or its --pid-file:",
    )
    return 1


def running_servers() -> list[tuple[Path, int]]:
    """This user's servers started with a default pid file and still running: each pid
    file and its pid."""
    found = [(path, running_pid(path)) for path in sorted(pid_folder().glob("*.pid"))]
    return [(path, pid) for path, pid in found if pid is not None]


def describe(pid_file: Path, pid: int) -> str:
    """``pid N, inference URL, management URL, ...`` (the addresses once it was ready)."""
    try:
        bound = json.loads(addresses_file(pid_file).read_text())
        addresses = [f"{api} {url}" for api, url in bound.items()]
    except (OSError, ValueError, AttributeError):  # still starting, or started elsewise
        addresses = []
    return ", ".join([f"pid {pid}", *addresses])


def _list_servers(running: list[tuple[Path, int]], heading: str) -> None:
    if running:
        print(heading, file=sys.stderr)
    for pid_file, pid in running:
        print(f"  {describe(pid_file, pid)} (pid file {pid_file})", file=sys.stderr)


def _forget(pid_file: Path) -> None:
    pid_file.unlink(missing_ok=True)
    addresses_file(pid_file).unlink(missing_ok=True)


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
