"""A worker on a thread of the frontend's own process (``ferry.worker_handles.in_process``),
with real handlers: it answers as a worker process does, in this process; a handler that
fails to load fails the start; a worker stopped between batches lets its thread end; one
whose handler hangs ends the process once the grace has passed (the ending faked here),
one whose start is cancelled mid-load does not; a restarted worker imports its handler's
files afresh."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry.wire.messages import BatchResult, InputPart, PredictBatch, RequestItem
from ferry.wire.spec import WorkerSpec
from ferry.worker.in_thread import run_worker
from ferry.worker_handles.handle import StartFailure, WorkerStartFailed
from ferry.worker_handles.in_process import HUNG_EXIT, InProcessWorker
from tests.fixtures.fake_worker import spec

HANDLER = """
import os
import sys
import threading
from collections.abc import Iterator

import model

STARTS = []


def handle(data, context):
    if data is None:
        STARTS.append(1)
        return None
    answers = []
    for row in data:
        body = row.get("body") or b""
        if body.startswith(b"block:"):
            with open(body[len(b"block:"):].decode(), "rb") as release:
                release.read()
        answers.append(
            {"model": model.NAME, "pid": os.getpid(), "thread": threading.get_ident(),
             "starts": len(STARTS)}
        )
    return answers
"""

TIMEOUT = 60.0


@pytest.fixture(autouse=True)
def _this_process_as_it_was() -> Iterator[None]:
    """The workers run in the test's own process: what their loads put on ``sys.path``
    (the ``ts`` shims) and the ``ts`` modules they imported go again afterwards, as they
    would with a worker process (other tests check that Ferry itself installs no ``ts``)."""
    path = list(sys.path)
    yield
    sys.path[:] = path
    for name in [n for n in sys.modules if n == "ts" or n.startswith("ts.")]:
        del sys.modules[name]


def folder_spec(root: Path, name: str, handler: str = HANDLER) -> WorkerSpec:
    folder = root / name
    folder.mkdir()
    (folder / "handler.py").write_text(handler)
    (folder / "model.py").write_text(f"NAME = {name!r}\n")
    return spec(name, model_dir=str(folder), handler="handler:handle")


def start(worker_spec: WorkerSpec, timeout: float, **options: Any) -> Any:
    """A worker on a thread of this process, as ``ferry.apis`` wires one."""
    return InProcessWorker.start(worker_spec, timeout, run=run_worker, **options)


def item(body: bytes) -> RequestItem:
    return RequestItem("r", {}, [InputPart("body", "application/octet-stream", body)])


async def ask(worker: InProcessWorker, body: bytes) -> dict[str, object]:
    await worker.send(PredictBatch(1, [item(body)]))
    result = await asyncio.wait_for(worker.receive(), TIMEOUT)
    assert isinstance(result, BatchResult)
    (answer,) = result.results
    return json.loads(answer.body)  # type: ignore[no-any-return]


def test_a_worker_answers_from_a_thread_of_this_process(tmp_path: Path) -> None:
    ended: list[int] = []

    async def scenario() -> None:
        worker = await start(folder_spec(tmp_path, "a"), TIMEOUT, end_process=ended.append)
        answer = await ask(worker, b"x")
        assert answer["model"] == "a" and answer["pid"] == os.getpid() == worker.info.pid
        assert answer["thread"] not in (threading.get_ident(), threading.main_thread().ident)
        worker.kill()  # between batches: the thread ends on its own
        assert await asyncio.wait_for(asyncio.shield(worker.exited), TIMEOUT) == 0
        worker.thread.join(TIMEOUT)
        assert not worker.thread.is_alive()

    asyncio.run(scenario())
    assert ended == []  # nothing ended the process


def test_a_handler_that_fails_to_load_fails_the_start(tmp_path: Path) -> None:
    broken = folder_spec(tmp_path, "b", 'raise RuntimeError("this model cannot load")\n')
    ended: list[int] = []

    async def scenario() -> None:
        with pytest.raises(WorkerStartFailed) as failure:
            await start(broken, TIMEOUT, end_process=ended.append)
        assert failure.value.kind is StartFailure.LOAD_ERROR
        assert "this model cannot load" in failure.value.message

    asyncio.run(scenario())
    assert ended == []


def test_a_restarted_worker_imports_its_handler_afresh(tmp_path: Path) -> None:
    """Its files are the model's own again (the previous load's modules were forgotten):
    the handler's module state starts empty."""
    worker_spec = folder_spec(tmp_path, "c")
    ended: list[int] = []

    async def scenario() -> None:
        first = await start(worker_spec, TIMEOUT, end_process=ended.append)
        assert (await ask(first, b"x"))["starts"] == 1
        first.kill()
        await asyncio.wait_for(asyncio.shield(first.exited), TIMEOUT)
        second = await start(worker_spec, TIMEOUT, end_process=ended.append)
        assert (await ask(second, b"x"))["starts"] == 1
        second.kill()
        await asyncio.wait_for(asyncio.shield(second.exited), TIMEOUT)

    asyncio.run(scenario())
    assert ended == []


def test_a_worker_killed_while_its_handler_hangs_ends_the_process(tmp_path: Path) -> None:
    """The thread cannot be stopped: past the grace, the process ends (recorded here
    instead); the handler is released afterwards so that the test's thread ends."""
    worker_spec = folder_spec(tmp_path, "d")
    release = tmp_path / "release"
    os.mkfifo(release)
    ended: list[int] = []

    async def scenario() -> None:
        ending = asyncio.get_running_loop().create_future()

        def end_process(status: int) -> None:
            ended.append(status)
            ending.set_result(None)

        worker = await start(worker_spec, TIMEOUT, grace_s=0.0, end_process=end_process)
        await worker.send(PredictBatch(1, [item(b"block:" + str(release).encode())]))
        # Opening the FIFO returns once the handler has opened it: it is blocked reading.
        writer = await asyncio.wait_for(asyncio.to_thread(release.open, "wb"), TIMEOUT)
        try:
            worker.kill()
            await asyncio.wait_for(ending, TIMEOUT)
        finally:
            writer.close()  # the handler returns; its thread ends
        await asyncio.wait_for(asyncio.shield(worker.exited), TIMEOUT)

    asyncio.run(scenario())
    assert ended == [HUNG_EXIT]


SLOW_LOADING = """
import os

# The load waits until the test opens and closes the FIFO "loading" beside this file.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "loading"), "rb") as gate:
    gate.read()


def handle(data, context):
    return None if data is None else ["ok"] * len(data)
"""


def test_a_start_cancelled_mid_load_lets_the_load_finish_and_the_thread_end(
    tmp_path: Path,
) -> None:
    """Not wanted any more (its replica stops): no reason to end the process."""
    worker_spec = folder_spec(tmp_path, "e", SLOW_LOADING)
    loading = Path(worker_spec.model.model_dir) / "loading"
    os.mkfifo(loading)
    ended: list[int] = []

    async def scenario() -> None:
        starting = asyncio.ensure_future(
            start(worker_spec, TIMEOUT, grace_s=0.0, end_process=ended.append)
        )
        # Opening the FIFO returns once the load has opened it: the load is under way.
        gate = await asyncio.wait_for(asyncio.to_thread(loading.open, "wb"), TIMEOUT)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        gate.close()  # the load finishes, finds its socket closed, and the thread ends
        (thread,) = [t for t in threading.enumerate() if t.name == "worker e w0"]
        await asyncio.wait_for(asyncio.to_thread(thread.join), TIMEOUT)

    asyncio.run(scenario())
    assert ended == []
