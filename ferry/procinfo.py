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


def descendants(root: int) -> list[int]:
    """``root``'s child processes, theirs, and so on (from each process's parent in /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents[int(entry.name)] = int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a process that ended while we read
    found: list[int] = []
    frontier = {root}
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        found += children
        frontier = set(children)
    return found
