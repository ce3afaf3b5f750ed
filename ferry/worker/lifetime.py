"""Process lifetime helpers shared by workers and their preprocess processes."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """Linux: if the parent is killed outright, take this process down with it."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # elsewhere the process still exits when its pipe or socket closes


def ignore_interrupts() -> None:
    """Ctrl-C reaches the whole process group; the frontend decides when children stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
