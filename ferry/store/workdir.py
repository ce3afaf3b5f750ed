"""Where a server unpacks its archives: ``$TMPDIR/ferry-<uid>/<pid>-<random>/``.

One folder per server process, named by its pid, under a parent private to the user. A
frontend that is killed cannot remove its folder, so each server, as it starts, removes the
folders of processes that no longer run (``sweep_stale``); a live server's is never
touched. Pids are those of this pid namespace: servers sharing a temporary folder across
containers should each have their own ``TMPDIR``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("ferry.store")


def work_root() -> Path:
    """The parent of every work folder of this user's servers."""
    return Path(tempfile.gettempdir()) / f"ferry-{os.getuid()}"


def _is_private(root: Path) -> bool:
    """A real folder of ours that no one else may write in (it holds code we load)."""
    try:
        info = os.lstat(root)
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) == 0
    )


def _process_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):  # someone else's process; not a pid at all
        return False
    return False


def sweep_stale(root: Path) -> list[Path]:
    """Remove the folders under ``root`` whose server process is gone; returns them."""
    removed = []
    for child in sorted(root.iterdir()):
        pid_text = child.name.partition("-")[0]
        if child.is_symlink() or not child.is_dir() or not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid == os.getpid() or not _process_is_gone(pid):
            continue
        shutil.rmtree(child, ignore_errors=True)
        log.info("removed %s, left by server process %d, which no longer runs", child, pid)
        removed.append(child)
    return removed


def open_work_dir(root: Path | None = None) -> tempfile.TemporaryDirectory[str]:
    """This server's work folder, after sweeping the stale ones beside it.

    If ``root`` (default ``work_root()``) is not a private folder of this user, which it
    would be unsafe to unpack into or delete from, a plain temporary folder is used and
    nothing is swept.
    """
    root = root or work_root()
    with contextlib.suppress(OSError):  # checked just below
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _is_private(root):
        log.warning("%s is not a private folder of this user; unpacking elsewhere", root)
        return tempfile.TemporaryDirectory(prefix="ferry-models-")
    sweep_stale(root)
    return tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-", dir=root)
