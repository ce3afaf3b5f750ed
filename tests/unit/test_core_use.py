"""Who used the cores during a load: CPU-time snapshots from fake /proc readers, and the
section of the limit report they make."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry_bench.core_use import CoreClock, CoreUse, CpuSnapshot
from ferry_bench.limit import bounds
from ferry_bench.limit_report import markdown
from ferry_bench.limit_run import LimitReport, LimitSpec, RatePoint


class FakeMachine:
    """Readers a test moves forward by hand: the host's ticks, the generator's CPU seconds,
    each server process's own and reaped children's CPU seconds, the server's children."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy, self.total = 0, 0
        self.generator = 0.0
        self.times: dict[int, tuple[float, float]] = {}
        self.kids: list[int] = []

    def clock(self, server_pid: int | None = None) -> CoreClock:
        return CoreClock(
            server_pid=server_pid,
            cpus=frozenset({0, 1}),
            clock=lambda: self.now,
            host=lambda cpus: (self.busy, self.total),
            own=lambda: self.generator,
            process=self.times.get,
            children=lambda pid: list(self.kids),
        )


def _figures(used: CoreUse) -> tuple[float | None, ...]:
    return (
        used.cores,
        used.cores_busy,
        used.generator_cores,
        used.generator_ms,
        used.server_main_ms,
        used.server_workers_ms,
    )


def test_shares_and_per_request_cpu_of_a_run() -> None:
    machine = FakeMachine()
    machine.times.update({10: (5.0, 0.0), 11: (100.0, 0.0), 12: (50.0, 0.0)})
    machine.kids = [11, 12]
    clock = machine.clock(server_pid=10)
    before = clock.snapshot()
    # 10 s pass: 2 cores give 2000 ticks (at 100 a second), 1500 of them busy.
    machine.now, machine.busy, machine.total = 10.0, 1500, 2000
    machine.generator = 1.0  # 0.1 of a core
    # Worker 12 used 6 s more, ended and was reaped (its 56 s move to the main process's
    # reaped children); 13 replaced it and used 4 s; 11 used 10 s; the main process 2 s.
    del machine.times[12]
    machine.times.update({10: (7.0, 56.0), 11: (110.0, 0.0), 13: (4.0, 0.0)})
    machine.kids = [11, 13]
    used = clock.between(before, clock.snapshot(), answered=500)
    # Busy 1.5 cores, the generator 0.1 of one and 2 ms a request, the main process 4 ms,
    # the workers (10 + 6 + 4) s over 500 requests.
    assert _figures(used) == pytest.approx((2, 1.5, 0.1, 2.0, 4.0, 40.0))


def test_a_process_gone_while_read_is_left_to_its_parent() -> None:
    machine = FakeMachine()
    machine.times.update({10: (1.0, 0.0), 11: (3.0, 0.0)})
    machine.kids = [11, 12]  # 12 is listed, but ended before it was read
    clock = machine.clock(server_pid=10)
    before = clock.snapshot()
    assert before.server_tree_s == pytest.approx(4.0)
    machine.times[12] = (2.0, 0.0)  # a new worker, seen at the end only
    machine.now = 1.0
    used = clock.between(before, clock.snapshot(), answered=1000)
    assert used.server_main_ms == pytest.approx(0.0)
    assert used.server_workers_ms == pytest.approx(2.0)


def test_a_server_that_ended_is_not_measured() -> None:
    machine = FakeMachine()
    machine.times[10] = (1.0, 0.0)
    clock = machine.clock(server_pid=10)
    before = clock.snapshot()
    del machine.times[10]
    used = clock.between(before, clock.snapshot(), answered=10)
    assert used.server_main_ms is None and used.server_workers_ms is None


def test_without_a_server_process_only_the_host_and_generator_are_measured() -> None:
    machine = FakeMachine()
    clock = machine.clock()
    before = clock.snapshot()
    assert before == CpuSnapshot(0.0, 0, 0, 0.0)
    machine.now, machine.busy, machine.total, machine.generator = 2.0, 100, 400, 0.5
    used = clock.between(before, clock.snapshot(), answered=5)
    assert used.server_main_ms is None and used.server_workers_ms is None
    assert used.cores_busy == pytest.approx(0.5)
    assert used.generator_ms == pytest.approx(100.0)
    # Nothing answered: no figure per request; an empty interval divides by nothing.
    assert clock.between(before, before, answered=0) == CoreUse(2, 0.0, 0.0, None, None, None)


def _report(url: str | None, uses: list[CoreUse | None]) -> LimitReport:
    spec = LimitSpec(
        model=Path("m.mar"),
        inputs=[Path("x.png")],
        slo_ms=1000,
        batch_size=2,
        max_batch_delay=10,
        workers=1,
        fractions=[0.5, 0.9],
        seconds=5,
        profile_seconds=1,
        url=url,
    )
    costs = {1: {"handler": 10.0}, 2: {"handler": 15.0}}
    report = LimitReport(spec, costs, 1.0, "measured", bounds(costs, 1.0, 1000), 120.0, 4)
    for offered, used in zip([60.0, 120.0], uses, strict=True):
        report.points.append(RatePoint(offered, offered, 12, 20, 0.0, 11, 19, 1.2, used))
    return report


def _use(generator_cores: float, server: bool) -> CoreUse:
    per_request = 3.0 if server else None
    return CoreUse(2, 1.8, generator_cores, 0.8, per_request, per_request)


def test_the_report_says_how_much_of_the_ceiling_the_load_generator_took() -> None:
    text = markdown(_report(None, [_use(0.05, True), _use(0.12, True)]), "m")
    section = text.split("## Who used the 2 cores")[1]
    assert "X* gives the model both cores" in section
    assert "ran on the same machine as the server and used up to 0.12 cores" in section
    assert "(6% of the machine, at 120.0 req/s)" in section
    assert "| 120.0 | 1.80 | 0.12 | 0.80 | 3.00 | 3.00 |" in section
    assert "torch's threads spinning" in section


def test_a_server_given_by_url_has_no_server_columns_or_claim_of_sharing() -> None:
    section = markdown(_report("http://elsewhere/p", [_use(0.05, False), _use(0.1, False)]), "m")
    assert "where the server runs on this machine too" in section
    assert "| 60.0 | 1.80 | 0.05 | 0.80 | - | - |" in section
    assert "spinning" not in section


def test_no_measurement_no_section() -> None:
    assert "Who used" not in markdown(_report(None, [None, None]), "m")


def test_one_core_and_nothing_answered() -> None:
    quiet = CoreUse(1, 0.9, 0.05, None, None, None)
    text = markdown(_report(None, [quiet, quiet]), "m")
    assert "## Who used the core (per offered load)" in text
    assert "X* gives the model its one core" in text
    assert "| 60.0 | 0.90 | 0.05 | - | - | - |" in text
