"""Stateless Ferry replicas behind HAProxy: a rolling restart of every replica under
steady load fails no request, and a replica killed with SIGKILL while it holds a request
costs no request either (the balancer retries it on another replica).

Each replica is a ``ferry serve`` on its own loopback address with ``--drain-delay``: on
SIGTERM its ``/ping`` turns 503 while it still serves, HAProxy's health check takes it
out, then it stops accepting, finishes what it holds and exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fixtures.background_load import BackgroundLoad
from tests.fixtures.cli import FERRY
from tests.fixtures.gate import release
from tests.fixtures.haproxy import Balancer, free_port, haproxy, haproxy_binary
from tests.fixtures.models import echo_store
from tests.fixtures.polling import HANG_GUARD, wait_until
from tests.fixtures.processes import descendants_of, is_running
from tests.fixtures.server import RunningServer, ferry_server

pytestmark = pytest.mark.e2e
DRAIN_DELAY = "0.5"
"""Seconds a stopping replica stays up with readiness 503: several health-check intervals."""


class Replicas:
    """Ferry replicas on 127.0.0.2, 127.0.0.3, ...: each keeps its address and port
    across restarts, as a host behind a balancer does."""

    def __init__(self, store: Path, tmp: Path, count: int) -> None:
        self.store = store
        self.tmp = tmp
        self.addresses = {
            f"r{i}": f"127.0.0.{i + 2}:{free_port(f'127.0.0.{i + 2}')}" for i in range(count)
        }
        self.running: dict[str, RunningServer] = {}
        self._stacks: dict[str, contextlib.ExitStack] = {}
        self._starts = Counter[str]()

    def start(self, name: str) -> RunningServer:
        self._starts[name] += 1
        folder = self.tmp / f"{name}-{self._starts[name]}"
        folder.mkdir()
        stack = contextlib.ExitStack()
        server = stack.enter_context(
            ferry_server(
                self.store,
                ["echo.mar"],
                folder,
                "--inference-address",
                f"http://{self.addresses[name]}",
                "--drain-delay",
                DRAIN_DELAY,
                command=FERRY,
            )
        )
        self.running[name], self._stacks[name] = server, stack
        return server

    def stop(self, name: str, signum: signal.Signals = signal.SIGTERM) -> int:
        server = self.running.pop(name)
        server.process.send_signal(signum)
        code = server.process.wait(timeout=HANG_GUARD)
        self._stacks.pop(name).close()
        return code

    def close(self) -> None:
        for stack in self._stacks.values():
            stack.close()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[Replicas]:
    haproxy_binary()  # skips, naming the package, where HAProxy is missing
    group = Replicas(echo_store(tmp_path), tmp_path, count=3)
    try:
        for name in group.addresses:
            group.start(name)
        yield group
    finally:
        group.close()


@pytest.fixture
def balancer(replicas: Replicas, tmp_path: Path) -> Iterator[Balancer]:
    with haproxy(replicas.addresses, tmp_path) as running:
        for name in replicas.addresses:
            running.wait_for(name, "UP")
        yield running


def _served_by(server: RunningServer) -> float:
    """Requests this replica has answered (its own metrics)."""
    prefix = 'ts_inference_requests_total{model_name="echo"'
    total = 0.0
    for line in server.metrics().splitlines():
        if line.startswith(prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_rolling_restart_under_load_fails_no_request(
    replicas: Replicas, balancer: Balancer
) -> None:
    with BackgroundLoad(f"{balancer.url}/predictions/echo", limit=100_000) as load:
        wait_until("load to flow", lambda: load.answered() >= 50)
        for name in list(replicas.addresses):
            before = load.answered()
            assert replicas.stop(name) == 0  # SIGTERM: drained, then exited cleanly
            balancer.wait_for(name, "DOWN")
            replacement = replicas.start(name)
            balancer.wait_for(name, "UP")
            wait_until(
                f"the new {name} to take requests",
                lambda server=replacement: _served_by(server) > 0,  # type: ignore[misc]
            )
            assert load.answered() > before  # traffic went on throughout
    assert set(load.outcomes) == {"200"}, load.outcomes
    assert load.answered() > 100


def test_a_replica_killed_while_holding_a_request_costs_no_request(
    replicas: Replicas, balancer: Balancer, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    os.mkfifo(gate / "release")  # the handler blocks opening it
    held: list[int] = []

    def blocked_request() -> None:
        response = httpx.post(
            f"{balancer.url}/predictions/echo",
            content=b"block:%s" % bytes(gate),
            headers={"x-replica": "r0"},
            timeout=HANG_GUARD,
        )
        held.append(response.status_code)

    with BackgroundLoad(f"{balancer.url}/predictions/echo", limit=100_000) as load:
        holder = threading.Thread(target=blocked_request)
        holder.start()
        victim = replicas.running["r0"]
        wait_until("r0 to hold the request", (gate / "started").exists, process=victim.process)
        workers = descendants_of(victim.process.pid)
        assert replicas.stop("r0", signal.SIGKILL) == -signal.SIGKILL
        # Its worker dies with it; only then is the request HAProxy sent again (to a
        # replica that is up, where it blocks too) the one released.
        wait_until("r0's worker to die", lambda: not any(is_running(pid) for pid in workers))
        balancer.wait_for("r0", "DOWN")
        release(gate, waiting=holder.is_alive)
        holder.join(timeout=HANG_GUARD)
        after_kill = load.answered()
        wait_until("load to go on", lambda: load.answered() >= after_kill + 50)
    assert held == [200]
    assert set(load.outcomes) == {"200"}, load.outcomes
