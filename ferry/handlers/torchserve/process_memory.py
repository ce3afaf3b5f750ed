"""TorchServe's ``ts.metrics.process_memory_metric``: the resident memory of processes, read
from ``/proc`` (``ferry.procinfo``), for metric collectors that import it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

from ferry.procinfo import resident_bytes

log = logging.getLogger(__name__)


def get_cpu_usage(pid: int | str) -> int:
    """The resident set size of process ``pid`` in bytes; 0 (and an error logged) when
    there is no such process. A ``pid`` that is not a number raises ``ValueError``."""
    number = int(pid)
    if number <= 0 or not Path(f"/proc/{number}").is_dir():
        log.error("cannot read the memory of process %s: no such process", pid)
        return 0
    return resident_bytes(number)


def check_process_mem_usage(stdin: TextIO) -> None:
    """Read one line of comma-separated pids from ``stdin`` and log ``pid:bytes`` for each
    (empty items skipped)."""
    for pid in stdin.readline().strip().split(","):
        if pid:
            log.info("%s:%d", pid, get_cpu_usage(pid))
