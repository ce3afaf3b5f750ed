"""The start-up log line per model (issue 51: "1 workers on none" for a model whose
worker failed to load)."""

from __future__ import annotations

from ferry.server import workers_summary
from ferry.service.status import ModelStatus, WorkerStatus


def _worker(status: str, device: str = "cpu") -> WorkerStatus:
    return WorkerStatus("w0", None, status, None, 0, False, device, 0, "")


def _model(min_workers: int, workers: list[WorkerStatus], last_error: str = "") -> ModelStatus:
    return ModelStatus(
        "m",
        "1.0",
        "m.mar",
        min_workers,
        min_workers,
        1,
        0.0,
        60.0,
        True,
        workers,
        100,
        0,
        ready=any(w.status == "READY" for w in workers),
        last_error=last_error,
    )


def test_ready_workers_and_their_devices() -> None:
    assert workers_summary(_model(1, [_worker("READY")])) == "1 worker ready on cpu"
    two = [_worker("READY", "cuda:0"), _worker("READY", "cuda:1")]
    assert workers_summary(_model(2, two)) == "2 workers ready on cuda:0, cuda:1"


def test_a_model_short_of_workers_says_how_many_and_why() -> None:
    failed = _model(1, [_worker("UNLOADING")], "ModuleNotFoundError: No module named 'nope'")
    assert workers_summary(failed) == (
        "0 of 1 worker ready; last failure: ModuleNotFoundError: No module named 'nope'"
    )
    assert workers_summary(_model(0, [])) == "0 workers ready"
