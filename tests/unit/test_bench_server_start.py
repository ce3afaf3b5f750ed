"""``ferry bench``'s servers: a port taken between choosing it and binding it is chosen
again, any other start failure is reported as it is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ferry_bench import servers
from ferry_bench.servers import ServerConfig, ServerFailed, start_server


class Starts:
    """Stand-ins for launching and waiting: each start fails with the next reason given
    (None: healthy); which ports each start got."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *outcomes: str | None) -> None:
        self.outcomes = list(outcomes)
        self.ports: list[dict[str, int]] = []
        self.stopped = 0
        monkeypatch.setattr(servers, "_launch", self.launch)
        monkeypatch.setattr(servers, "_wait_healthy", self.wait)
        monkeypatch.setattr(servers, "stop_group", self.stop)

    def launch(
        self, kind: str, model: Path, config: Any, folder: Path, ports: dict[str, int]
    ) -> Any:
        self.ports.append(ports)
        return SimpleNamespace(pid=len(self.ports)), f"http://127.0.0.1:{ports['inference']}"

    def wait(self, url: str, process: Any, log_path: Path, timeout: float) -> None:
        reason = self.outcomes.pop(0)
        if reason is not None:
            raise ServerFailed(reason)

    def stop(self, process: Any) -> None:
        self.stopped += 1


IN_USE = (
    "server exited with 2: cannot listen on http://127.0.0.1:5 (management_address): "
    "address already in use"
)


def test_a_port_taken_before_the_server_binds_it_is_chosen_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts = Starts(monkeypatch, IN_USE, None)
    with start_server("ferry", tmp_path / "m.mar", ServerConfig(1, 5, 1), tmp_path / "s") as server:
        assert server.inference_url.endswith(str(starts.ports[-1]["inference"]))
    assert len(starts.ports) == 2 and starts.stopped == 2  # the failed start, then this one


def test_other_failures_and_a_third_clash_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Starts(monkeypatch, "server exited with 1: no such model")
    config = ServerConfig(1, 5, 1)
    with (
        pytest.raises(ServerFailed, match="no such model"),
        start_server("ferry", tmp_path / "m.mar", config, tmp_path / "s"),
    ):
        pass
    starts = Starts(monkeypatch, IN_USE, IN_USE, IN_USE)
    with (
        pytest.raises(ServerFailed, match="already in use"),
        start_server("ferry", tmp_path / "m.mar", config, tmp_path / "s"),
    ):
        pass
    assert len(starts.ports) == 3
