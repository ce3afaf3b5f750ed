"""Models sharing a worker process (``ferry.worker_handles.hosts``), with real processes:
one process for a group, each model its own handler (same-named files included), an
unloaded model's place free again, a hung or crashing model taking the host down and
every neighbour told, a load that fails failing alone."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from ferry.wire.messages import BatchResult, InputPart, PredictBatch, RequestItem
from ferry.wire.spec import WorkerSpec
from ferry.worker_handles.handle import StartFailure, WorkerGone, WorkerHandle, WorkerStartFailed
from ferry.worker_handles.hosts import HostedWorker, ProcessHosts, sharing_processes
from tests.fixtures.fake_worker import spec

# Two models whose handler files have the same name, each importing its own model.py.
HANDLER = """
import os
import model


def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") or b""
        if body == b"crash":
            os._exit(3)
        if body == b"crash when told":
            # Blocks until the test opens the FIFO "told" beside this file and closes it.
            here = os.path.dirname(os.path.abspath(__file__))
            with open(os.path.join(here, "told"), "rb") as told:
                told.read()
            os._exit(3)
        if body == b"hang":
            import threading
            threading.Event().wait()
        answers.append({"model": model.NAME, "pid": os.getpid()})
    return answers
"""

FAILING_HANDLER = """
raise RuntimeError("this model cannot load")
"""

TIMEOUT = 60.0


def model_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "handler.py").write_text(HANDLER)
    (folder / "model.py").write_text(f"NAME = {name!r}\n")
    return folder


def grouped(root: Path, name: str, group: str = "shared") -> WorkerSpec:
    folder = str(model_folder(root, name))
    return dataclasses.replace(
        spec(name, model_dir=folder, handler="handler:handle"), process_group=group
    )


def item(body: bytes) -> RequestItem:
    return RequestItem("r", {}, [InputPart("body", "application/octet-stream", body)])


async def ask(worker: HostedWorker, body: bytes) -> dict[str, object]:
    await worker.send(PredictBatch(1, [item(body)]))
    result = await asyncio.wait_for(worker.receive(), TIMEOUT)
    assert isinstance(result, BatchResult)
    (answer,) = result.results
    return json.loads(answer.body)  # type: ignore[no-any-return]


def run(scenario: Callable[[ProcessHosts], Awaitable[None]]) -> None:
    async def main() -> None:
        hosts = ProcessHosts()
        try:
            await scenario(hosts)
        finally:
            for host in hosts.processes():
                host.kill()
                await asyncio.wait_for(asyncio.shield(host.exited), TIMEOUT)

    asyncio.run(main())


def test_models_of_a_group_share_one_process_each_with_its_own_files(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        b = await hosts.start(grouped(tmp_path, "b"), TIMEOUT)
        assert a.pid == b.pid and a.info.shared
        assert len(hosts.processes()) == 1
        assert await ask(a, b"x") == {"model": "a", "pid": a.pid}
        assert await ask(b, b"x") == {"model": "b", "pid": a.pid}
        assert a.info.footprint_bytes >= 0

    run(scenario)


def test_a_second_worker_of_a_model_goes_to_a_second_host(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        first = grouped(tmp_path, "a")
        one = await hosts.start(first, TIMEOUT)
        two = await hosts.start(dataclasses.replace(first, worker_id="w1.0"), TIMEOUT)
        assert one.pid != two.pid

    run(scenario)


def test_an_unloaded_model_frees_its_place_and_an_empty_host_ends(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a_spec = grouped(tmp_path, "a")
        a = await hosts.start(a_spec, TIMEOUT)
        b = await hosts.start(grouped(tmp_path, "b"), TIMEOUT)
        host = a.host
        a.kill()
        assert await a.exited == 0
        again = await hosts.start(a_spec, TIMEOUT)  # the same host has room again
        assert again.pid == b.pid
        assert await ask(again, b"x") == {"model": "a", "pid": b.pid}
        again.kill()
        b.kill()
        assert await asyncio.wait_for(asyncio.shield(host.exited), TIMEOUT) == 0

    run(scenario)


def test_a_crash_takes_the_host_down_and_only_the_lone_busy_model_is_blamed(
    tmp_path: Path,
) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        b = await hosts.start(grouped(tmp_path, "b"), TIMEOUT)
        await a.send(PredictBatch(1, [item(b"crash")]))
        with pytest.raises(WorkerGone):
            await asyncio.wait_for(a.receive(), TIMEOUT)
        assert await asyncio.wait_for(asyncio.shield(a.exited), TIMEOUT) == 3
        assert await asyncio.wait_for(asyncio.shield(b.exited), TIMEOUT) == -signal.SIGKILL
        fresh = await hosts.start(grouped(tmp_path / "sub", "c"), TIMEOUT)
        assert fresh.pid != a.pid

    (tmp_path / "sub").mkdir()
    run(scenario)


def test_killing_a_hung_model_kills_its_host_and_neighbours_see_it(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        b = await hosts.start(grouped(tmp_path, "b"), TIMEOUT)
        await a.send(PredictBatch(1, [item(b"hang")]))
        a.kill()  # what the dispatcher does when the batch times out
        assert await asyncio.wait_for(asyncio.shield(b.exited), TIMEOUT) == -signal.SIGKILL
        with pytest.raises(WorkerGone):
            await asyncio.wait_for(ask(b, b"x"), TIMEOUT)

    run(scenario)


def test_a_model_that_fails_to_load_fails_alone(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        broken = tmp_path / "broken"
        broken.mkdir()
        (broken / "handler.py").write_text(FAILING_HANDLER)
        bad = dataclasses.replace(
            spec("broken", model_dir=str(broken), handler="handler:handle"),
            process_group="shared",
        )
        with pytest.raises(WorkerStartFailed) as failure:
            await hosts.start(bad, TIMEOUT)
        assert failure.value.kind is StartFailure.LOAD_ERROR
        assert "this model cannot load" in failure.value.message
        assert await ask(a, b"x") == {"model": "a", "pid": a.pid}

    run(scenario)


def test_a_crash_while_a_neighbour_holds_a_batch_blames_neither(tmp_path: Path) -> None:
    """Two models holding a batch when the process died: either batch may be the cause,
    so both report an outside kill, and the dispatcher retries their requests. (All
    handler code of a host runs on one thread: a's batch waits behind b's, which crashes
    once the test has seen it running.)"""

    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        b_spec = grouped(tmp_path, "b")
        told = Path(b_spec.model.model_dir) / "told"
        os.mkfifo(told)
        b = await hosts.start(b_spec, TIMEOUT)
        await b.send(PredictBatch(1, [item(b"crash when told")]))
        await a.send(PredictBatch(1, [item(b"x")]))
        # Opening the FIFO returns once b's handler has opened it: b's batch is running.
        await asyncio.wait_for(asyncio.to_thread(told.write_bytes, b""), TIMEOUT)
        assert await asyncio.wait_for(asyncio.shield(b.exited), TIMEOUT) == -signal.SIGKILL
        assert await asyncio.wait_for(asyncio.shield(a.exited), TIMEOUT) == -signal.SIGKILL

    run(scenario)


def slow_folder(root: Path, name: str, seconds: float) -> WorkerSpec:
    worker_spec = grouped(root, name)
    handler = Path(worker_spec.model.model_dir) / "handler.py"
    handler.write_text(f"import time\ntime.sleep({seconds})\n" + HANDLER)
    return worker_spec


def test_each_load_has_its_own_start_up_timeout_however_many_wait_before_it(
    tmp_path: Path,
) -> None:
    """Ten models of 0.5 s each placed at once: the last waits ~4.5 s for the loads
    before it, within its own timeout of 3 s (its load alone is counted)."""

    async def scenario(hosts: ProcessHosts) -> None:
        specs = [slow_folder(tmp_path, f"m{index}", 0.5) for index in range(10)]
        workers = await asyncio.gather(*(hosts.start(s, 3.0) for s in specs))
        assert len({worker.pid for worker in workers}) == 1

    run(scenario)


def test_a_load_cancelled_midway_leaves_the_neighbours_serving(tmp_path: Path) -> None:
    async def scenario(hosts: ProcessHosts) -> None:
        a = await hosts.start(grouped(tmp_path, "a"), TIMEOUT)
        slow = asyncio.create_task(hosts.start(slow_folder(tmp_path, "slow", 2.0), TIMEOUT))
        await asyncio.sleep(0.5)  # the slow model is loading (or waiting to)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        assert await ask(a, b"x") == {"model": "a", "pid": a.pid}
        assert not a.host.exited.done()

    run(scenario)


def test_a_model_whose_load_kills_its_shared_process_gets_one_of_its_own(
    tmp_path: Path,
) -> None:
    started: list[WorkerSpec] = []

    async def own(spec: WorkerSpec, startup_timeout: float) -> WorkerHandle:
        started.append(spec)
        raise WorkerStartFailed(StartFailure.EXITED, "worker exited while loading")

    async def scenario(hosts: ProcessHosts) -> None:
        start = sharing_processes(own, hosts)
        a = await start(grouped(tmp_path, "a"), TIMEOUT)
        crashing = grouped(tmp_path, "crashing")
        (Path(crashing.model.model_dir) / "handler.py").write_text("import os\nos._exit(5)\n")
        with pytest.raises(WorkerStartFailed) as first:
            await start(crashing, TIMEOUT)
        assert first.value.kind is StartFailure.EXITED and started == []
        with pytest.raises(WorkerStartFailed):
            await start(crashing, TIMEOUT)
        assert started == [crashing]  # its second start: a process of its own
        b = await start(grouped(tmp_path, "b"), TIMEOUT)
        assert isinstance(b, HostedWorker)
        assert await ask(b, b"x") == {"model": "b", "pid": b.pid}
        assert isinstance(a, HostedWorker) and a.exited.done()  # the crash took a along

    run(scenario)
