"""CPU time and memory of a process and of the host, from Linux /proc (0 where unreadable)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def resident_bytes(pid: int) -> int:
    """Resident set size in bytes."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return 0


def cpu_jiffies() -> tuple[int, int]:
    """The host's busy and total CPU time since boot, in clock ticks, from /proc/stat."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = sum(fields[3:5])  # idle and iowait
    total = sum(fields[:8])  # guest time is already counted in user and nice
    return total - idle, total


def memory_bytes() -> tuple[int, int]:
    """The host's total and available memory, from /proc/meminfo."""
    values: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            values[key] = int(rest.split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return values.get("MemTotal", 0), values.get("MemAvailable", 0)
