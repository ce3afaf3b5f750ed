"""``ferry.procinfo`` on real processes: a server's workers are found as its descendants,
and their CPU time is read."""

from __future__ import annotations

import os
import subprocess
import sys

from ferry.procinfo import cpu_seconds, descendants

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


def test_a_process_without_children_has_no_descendants() -> None:
    with subprocess.Popen([sys.executable, "-c", "pass"]) as ended:
        ended.wait(timeout=60)
    assert descendants(ended.pid) == []
