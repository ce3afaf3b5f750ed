"""CPU time and memory of a process and of the host, from Linux /proc (0 where unreadable)."""

from __future__ import annotations

import os
import resource
from collections.abc import Collection
from pathlib import Path

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds."""
    times = process_times(pid)
    return 0.0 if times is None else times[0]


def process_times(pid: int) -> tuple[float, float] | None:
    """A process's own user + system CPU seconds, and those of its children it has reaped
    (a child's whole life, once it has ended and been waited for); None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (OSError, IndexError, ValueError):
        return None
    return own / _CLOCK_TICKS, reaped / _CLOCK_TICKS


def resident_bytes(pid: int) -> int:
    """Resident set size in bytes."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return 0


def cpu_jiffies(cpus: Collection[int] | None = None) -> tuple[int, int]:
    """The host's busy and total CPU time since boot, in clock ticks, from /proc/stat: all
    its CPUs, or only ``cpus`` (by number)."""
    wanted = None if cpus is None else {f"cpu{cpu}" for cpu in cpus}
    busy = total = 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split() or [""]
            if (name != "cpu") if wanted is None else (name not in wanted):
                continue
            fields = [int(f) for f in values]
            idle = sum(fields[3:5])  # idle and iowait
            spent = sum(fields[:8])  # guest time is already counted in user and nice
            busy, total = busy + spent - idle, total + spent
    except (OSError, ValueError):
        return 0, 0
    return busy, total


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


CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def memory_limit_bytes(limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """The memory this process's container may use: its cgroup's limit, else (no limit,
    or none readable) the host's total; 0 when neither can be read."""
    total = memory_bytes()[0]
    for path in limits:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) mean no limit
            return min(int(text), total) if total else int(text)
    return total


CGROUP_OOM_EVENTS = (
    Path("/sys/fs/cgroup/memory.events"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.oom_control"),  # cgroup v1, Linux 4.13 and later
)


def oom_kills(events: tuple[Path, ...] = CGROUP_OOM_EVENTS) -> int | None:
    """How many processes the OOM killer has killed in this process's container so far
    (the cgroup's ``oom_kill`` count); None when no cgroup file says."""
    for path in events:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


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
