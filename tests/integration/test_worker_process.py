"""``WorkerProcess.start`` with real processes: a worker that cannot be spawned or that
speaks another protocol is a start failure of the right kind, and never left running."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from ferry.wire.messages import BatchResult, InputPart, PredictBatch, RequestItem
from ferry.worker_handles import process as worker_process
from ferry.worker_handles.handle import StartFailure, WorkerStartFailed
from ferry.worker_handles.process import WorkerProcess
from tests.fixtures.fake_worker import spec

# Reads the spec frame, answers with a frame of protocol version 99, then waits forever.
OTHER_VERSION_WORKER = """
import os, struct, sys, time
import msgpack
fd = int(sys.argv[1])
(size,) = struct.unpack("!I", os.read(fd, 4))
os.read(fd, size)
payload = msgpack.packb([99, 3, os.getpid(), "cpu"])
os.write(fd, struct.pack("!I", len(payload)) + payload)
time.sleep(600)
"""


def test_a_worker_of_another_protocol_version_fails_to_start_and_is_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spawned: list[asyncio.subprocess.Process] = []

    async def other_version(
        child: socket.socket, env: dict[str, str]
    ) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            OTHER_VERSION_WORKER,
            str(child.fileno()),
            pass_fds=(child.fileno(),),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        spawned.append(proc)
        return proc

    monkeypatch.setattr(worker_process, "_spawn", other_version)

    async def scenario() -> None:
        with pytest.raises(WorkerStartFailed) as failure:
            await WorkerProcess.start(spec(), startup_timeout=60)
        assert failure.value.kind is StartFailure.PROTOCOL
        assert "protocol version 99" in failure.value.message
        (proc,) = spawned
        assert await asyncio.wait_for(proc.wait(), 30) != 0  # killed, not left running

    asyncio.run(scenario())


def test_a_worker_that_cannot_be_spawned_is_a_deterministic_start_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def too_big(child: socket.socket, env: dict[str, str]) -> asyncio.subprocess.Process:
        raise OSError(errno.E2BIG, os.strerror(errno.E2BIG))

    monkeypatch.setattr(worker_process, "_spawn", too_big)

    async def scenario() -> None:
        with pytest.raises(WorkerStartFailed) as failure:
            await WorkerProcess.start(spec(), startup_timeout=60)
        assert failure.value.kind is StartFailure.SPAWN
        assert failure.value.kind.deterministic
        assert "Argument list too long" in failure.value.message

    asyncio.run(scenario())


GPU_REPORT_HANDLER = """
import os


def handle(data, context):
    if data is None:
        return None
    seen = {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "gpu_id": context.system_properties["gpu_id"],
    }
    return [seen for _ in data]
"""


def test_a_gpu_worker_sees_only_its_gpu_as_device_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bound by CUDA_VISIBLE_DEVICES (an entry of the server's own list), so every thread
    it or its handler starts is on its GPU; the handler's gpu_id is 0 (its cuda:0), the
    worker reports the server's index."""
    (tmp_path / "gpu_report.py").write_text(GPU_REPORT_HANDLER)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    worker_spec = dataclasses.replace(
        spec(model_dir=str(tmp_path), handler="gpu_report:handle"), gpu_id=1
    )

    async def scenario() -> None:
        worker = await WorkerProcess.start(worker_spec, startup_timeout=60)
        try:
            assert worker.info.device == "cuda:1"
            item = RequestItem("r1", {}, [InputPart("body", "text/plain", b"x")])
            await worker.send(PredictBatch(1, [item]))
            result = await asyncio.wait_for(worker.receive(), 60)
            assert isinstance(result, BatchResult)
            (answer,) = result.results
            assert json.loads(answer.body) == {"visible": "7", "gpu_id": 0}
        finally:
            worker.kill()
            await asyncio.wait_for(asyncio.shield(worker.exited), 30)  # reaped in this loop

    asyncio.run(scenario())
