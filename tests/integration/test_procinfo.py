"""``ferry.procinfo`` on real processes: a server's workers are found as its descendants,
and their CPU time is read."""

from __future__ import annotations

import os
import subprocess
import sys

from ferry.procinfo import cpu_jiffies, cpu_seconds, descendants, process_times

# Works for a while (CPU time well above a clock tick), starts a grandchild, prints its
# pid, then both wait until their stdin closes.
PARENT = """
import subprocess, sys
sum(range(5_000_000))
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE)
print(child.pid, flush=True)
sys.stdin.read()
child.stdin.close()
child.wait()
"""


def test_descendants_are_children_and_their_children() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdin is not None and parent.stdout is not None
        try:
            grandchild = int(parent.stdout.readline())
            assert descendants(parent.pid) == [grandchild]
            assert {parent.pid, grandchild} <= set(descendants(os.getpid()))
            assert cpu_seconds(parent.pid) > 0
        finally:
            parent.stdin.close()
            parent.wait(timeout=60)
    assert parent.pid not in descendants(os.getpid())


def test_a_process_without_children_has_none_and_an_ended_one_no_times() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    ) as alone:
        assert alone.stdin is not None
        try:
            assert descendants(alone.pid) == []
            assert process_times(alone.pid) is not None
        finally:
            alone.stdin.close()
            alone.wait(timeout=60)
    assert process_times(alone.pid) is None  # reaped: gone from /proc


def test_the_busy_time_of_some_cpus_is_part_of_all_of_theirs() -> None:
    every = sorted(os.sched_getaffinity(0))
    busy_all, total_all = cpu_jiffies()
    busy_one, total_one = cpu_jiffies(every[:1])
    assert 0 < total_one <= total_all and 0 <= busy_one <= busy_all
    assert cpu_jiffies([10**6]) == (0, 0)  # no such CPU
