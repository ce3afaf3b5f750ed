"""The automatic batch-size search of ``ferry bench profile``, on a fake latency model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ferry_bench import profile as profiling
from ferry_bench.profile import ProfilePoint


def _fake(per_item: dict[int, float], oom_from: int | None = None, spread: float = 0.1) -> Any:
    def measure(
        loaded: Any, inputs: Any, batch: int, precision: str, seconds: float
    ) -> list[ProfilePoint]:
        if oom_from is not None and batch >= oom_from:
            raise torch.OutOfMemoryError("fake")
        ms = per_item[batch] * batch
        return [
            ProfilePoint(
                batch,
                "handler",
                precision,
                ms,
                ms,
                ms,
                per_item[batch],
                1000 / per_item[batch],
                1.0,
                spread,
                5,
            )
        ]

    return measure


CURVE = {1: 10.0, 2: 6.0, 4: 4.0, 8: 3.5, 16: 3.45, 32: 3.44, 64: 3.0, 128: 2.0}


def test_doubles_until_time_per_item_stops_improving(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "profile_batch", _fake(CURVE))
    points = profiling.profile(None, [b""], None, ["fp32"], 0.1)  # type: ignore[arg-type]
    assert [p.batch_size for p in points] == [1, 2, 4, 8, 16, 32]


def test_stops_when_memory_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "profile_batch", _fake(CURVE, oom_from=8))
    points = profiling.profile(None, [b""], None, ["fp32", "bf16"], 0.1)  # type: ignore[arg-type]
    assert [(p.precision, p.batch_size) for p in points] == [
        ("fp32", 1),
        ("fp32", 2),
        ("fp32", 4),
        ("bf16", 1),
        ("bf16", 2),
        ("bf16", 4),
    ]


def test_explicit_batch_sizes_are_all_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiling, "profile_batch", _fake(CURVE))
    points = profiling.profile(None, [b""], [1, 64, 128], ["fp32"], 0.1)  # type: ignore[arg-type]
    assert [p.batch_size for p in points] == [1, 64, 128]


def test_profile_reports_the_optimizations_the_handler_runs_with() -> None:
    from ferry.handlers.builtin.base_handler import BaseHandler
    from ferry.handlers.builtin.optimize import Optimizations
    from ferry_bench.profile_report import format_optimizations

    handler = BaseHandler()
    handler.optimizations = Optimizations(precision="bf16", batch_buckets=(1, 8))
    loaded: Any = type("Loaded", (), {"service": handler})()
    active = profiling.active_optimizations(loaded)
    assert active == {"precision": "bf16", "batch_buckets": [1, 8]}
    assert format_optimizations(active) == "optimization: precision=bf16, batch_buckets=[1, 8]"
    loaded.service = object()  # a module-level handle function: nothing to report
    assert profiling.active_optimizations(loaded) == {}


def test_a_stop_on_noisy_timings_says_it_may_be_noise(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(profiling, "profile_batch", _fake(CURVE, spread=0.9))
    points = profiling.profile(None, [b""], None, ["fp32"], 0.1)  # type: ignore[arg-type]
    assert [p.batch_size for p in points] == [1, 2, 4, 8, 16, 32]
    stderr = capsys.readouterr().err
    assert "batch size 32: time per item improved by less than 3% twice; stopping" in stderr
    assert "the stop may be noise" in stderr
    warnings = profiling.noisy(points)
    assert len(warnings) == 6 and "p10-p90 spans 90% of the median" in warnings[0]


class _Handler:
    """A loaded handler that cannot decode ``bad`` and answers a per-row error for
    ``row-error``."""

    def __init__(self) -> None:
        from ferry.handlers.contract.context import Context

        self.context = Context("m", ".", {}, 1, None)

    def entry(self, rows: list[dict[str, Any]], context: Any) -> list[Any]:
        body = bytes(rows[0]["body"])
        if body == b"bad":
            raise RuntimeError("cannot identify image file")
        return [ValueError("not an image") if body == b"row-error" else "ok"]


def test_an_input_the_handler_rejects_is_named() -> None:
    loaded: Any = _Handler()
    profiling.check_inputs(loaded, [b"good"], ["good.png"])
    for payload, words in ((b"bad", "failed on it: cannot identify"), (b"row-error", "rejected")):
        with pytest.raises(profiling.InputRejected, match=f"--input x.png: the handler {words}"):
            profiling.check_inputs(loaded, [b"good", payload], ["good.png", "x.png"])
