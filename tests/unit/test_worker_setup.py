from __future__ import annotations

from ferry.wire import codec
from ferry.wire.environment import GLIBC_MALLOC_SETTINGS, worker_environment
from ferry.wire.messages import StartWorker
from ferry.wire.spec import HandlerSpec, WorkerSpec


def test_worker_environment_adds_malloc_settings_but_user_values_win() -> None:
    env = worker_environment({"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert env["MALLOC_TRIM_THRESHOLD_"] == "0"
    assert env["MALLOC_MMAP_THRESHOLD_"] == GLIBC_MALLOC_SETTINGS["MALLOC_MMAP_THRESHOLD_"]


def test_worker_spec_round_trips_through_its_first_frame() -> None:
    model = HandlerSpec("m", "/models/m", "h.py:fn", {"model": {}}, 8, {"k": [1]})
    spec = WorkerSpec(model, None, 2, "w0.1")
    frame = codec.encode(StartWorker(spec))
    assert codec.decode(frame[codec.FRAME_HEADER.size :]) == StartWorker(spec)
