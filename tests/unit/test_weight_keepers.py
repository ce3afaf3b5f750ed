"""The frontend's weights keepers (``ferry.worker_handles.weight_keepers``) with stand-in
keepers and workers: one keeper per (model version, GPU), kept while any of its workers
starts or lives, stopped after the last, and its death ends every worker on it."""

from __future__ import annotations

import asyncio
import functools
import itertools
import zipfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from ferry.config.sections import keeps_weights, parse_optimization
from ferry.errors import ModelConfigError
from ferry.wire.messages import BatchResult, PartialResult, PredictBatch
from ferry.wire.spec import HandlerSpec, WorkerSpec
from ferry.worker import weights_keeper
from ferry.worker_handles import weight_keepers
from ferry.worker_handles.handle import (
    StartFailure,
    WorkerHandle,
    WorkerInfo,
    WorkerStartFailed,
)
from ferry.worker_handles.weight_keepers import KeeperProcess, WeightKeepers, keeping_weights

_pids = itertools.count(1000)


def in_a_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The test's scenario run to its end on a fresh event loop, bounded."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(test(*args, **kwargs), 10))

    return run


class StubKeeper:
    def __init__(self) -> None:
        self.pid: int | None = next(_pids)
        self.address = f"/keeper/{self.pid}"
        self.exited: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1
        self.die(-9)

    def die(self, status: int) -> None:
        if not self.exited.done():
            self.exited.set_result(status)


class StubWorker:
    """A started worker: it only lives, and dies when killed or told to."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.exited: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(next(_pids), "cpu")

    async def send(self, batch: PredictBatch) -> None:
        raise AssertionError("not used")

    async def receive(self) -> BatchResult | PartialResult:
        raise AssertionError("not used")

    def cancel(self, batch_id: int, request_ids: list[str]) -> None:
        pass

    def kill(self) -> None:
        self.die(-9)

    def die(self, status: int) -> None:
        if not self.exited.done():
            self.exited.set_result(status)


class Harness:
    def __init__(self, spawn_fails: bool = False) -> None:
        self.keepers: list[StubKeeper] = []
        self.spawn_fails = spawn_fails
        self.workers: list[StubWorker] = []
        self.registry = WeightKeepers(self._spawn)
        self.start = keeping_weights(self._start_worker, self.registry)
        self.worker_fails = False

    async def _spawn(self, spec: WorkerSpec) -> KeeperProcess:
        if self.spawn_fails:
            raise OSError("no room for the keeper")
        keeper = StubKeeper()
        self.keepers.append(keeper)
        return keeper

    async def _start_worker(self, spec: WorkerSpec, timeout: float) -> WorkerHandle:
        if self.worker_fails:
            raise WorkerStartFailed(StartFailure.LOAD_ERROR, "the handler raised")
        worker = StubWorker(spec)
        self.workers.append(worker)
        return worker

    async def worker(self, spec: WorkerSpec) -> StubWorker:
        worker = await self.start(spec, 10.0)
        assert isinstance(worker, StubWorker)
        return worker


TORCHSCRIPT = {"serializedFile": "model.pt"}


def _spec(
    version_folder: str = "/work/m-1",
    gpu: int | None = 0,
    mode: str = "gpu",
    files: dict[str, str] = TORCHSCRIPT,
    model_dir: str = "/store/m",
    **optimization: object,
) -> WorkerSpec:
    """A worker's spec whose model-config.yaml asks for weights keeper ``mode`` (and the
    rest of ``optimization``), for a model of the manifest's ``files`` (TorchScript)."""
    model = HandlerSpec(
        model_name="m",
        model_dir=model_dir,
        handler="h",
        manifest={"model": {"handler": "h", **files}},
        batch_size=1,
        model_yaml_config={"optimization": {"weights_keeper": mode, **optimization}},
        compile_cache=version_folder,
    )
    return WorkerSpec(model, gpu_id=gpu, torch_threads=1, worker_id="w0")


async def _settle() -> None:
    for _ in range(3):  # done callbacks run on the loop's next turns
        await asyncio.sleep(0)


@in_a_loop
async def test_a_versions_workers_on_one_gpu_share_one_keeper() -> None:
    harness = Harness()
    first, second = await harness.worker(_spec()), await harness.worker(_spec())
    other_gpu = await harness.worker(_spec(gpu=1))
    new_version = await harness.worker(_spec("/work/m-2"))
    assert len(harness.keepers) == 3
    keeper = harness.keepers[0]
    assert first.spec.weights_keeper == second.spec.weights_keeper == keeper.address
    assert other_gpu.spec.weights_keeper == harness.keepers[1].address
    assert new_version.spec.weights_keeper == harness.keepers[2].address


@in_a_loop
async def test_a_workers_death_leaves_the_keeper_to_the_others_and_its_replacement() -> None:
    harness = Harness()
    crashed, survivor = await harness.worker(_spec()), await harness.worker(_spec())
    crashed.die(70)  # a sticky CUDA error: DEVICE_FAILED_EXIT
    await _settle()
    (keeper,) = harness.keepers
    assert keeper.stops == 0 and not survivor.exited.done()
    replacement = await harness.worker(_spec())
    assert replacement.spec.weights_keeper == keeper.address
    assert len(harness.keepers) == 1


@in_a_loop
async def test_the_last_worker_going_stops_the_keeper_and_the_next_starts_a_new_one() -> None:
    harness = Harness()
    workers = [await harness.worker(_spec()) for _ in range(2)]
    for worker in workers:
        worker.kill()
    await _settle()
    assert harness.keepers[0].stops == 1
    again = await harness.worker(_spec())
    assert len(harness.keepers) == 2
    assert again.spec.weights_keeper == harness.keepers[1].address


@in_a_loop
async def test_the_keepers_death_kills_its_workers_and_the_next_gets_a_new_keeper() -> None:
    harness = Harness()
    workers = [await harness.worker(_spec()) for _ in range(2)]
    bystander = await harness.worker(_spec(gpu=1))
    harness.keepers[0].die(-9)
    await _settle()
    assert all(worker.exited.done() for worker in workers)
    assert not bystander.exited.done()
    replacement = await harness.worker(_spec())
    assert replacement.spec.weights_keeper == harness.keepers[2].address


@in_a_loop
async def test_a_worker_that_loaded_while_its_keeper_died_is_killed() -> None:
    harness = Harness()
    first = await harness.worker(_spec())
    keeper = harness.keepers[0]
    original = harness._start_worker

    async def loads_while_the_keeper_dies(spec: WorkerSpec, timeout: float) -> WorkerHandle:
        keeper.die(-9)
        await _settle()
        return await original(spec, timeout)

    harness.start = keeping_weights(loads_while_the_keeper_dies, harness.registry)
    late = await harness.worker(_spec())
    assert first.exited.done() and late.exited.done()


@in_a_loop
async def test_a_keeper_that_cannot_start_fails_the_workers_start_and_is_tried_again() -> None:
    harness = Harness(spawn_fails=True)
    with pytest.raises(WorkerStartFailed) as failed:
        await harness.worker(_spec())
    assert failed.value.kind is StartFailure.SPAWN
    assert "no room for the keeper" in failed.value.message
    harness.spawn_fails = False
    worker = await harness.worker(_spec())
    assert worker.spec.weights_keeper == harness.keepers[0].address


@in_a_loop
async def test_a_worker_that_fails_to_start_gives_back_its_hold() -> None:
    harness = Harness()
    harness.worker_fails = True
    with pytest.raises(WorkerStartFailed):
        await harness.worker(_spec())
    await _settle()
    assert harness.keepers[0].stops == 1


@pytest.mark.parametrize(
    "spec",
    [
        _spec(mode="off"),
        _spec(gpu=None, mode="gpu"),
        _spec(version_folder=""),
        _spec(share_weights=False),
    ],
    ids=["off", "gpu-only-on-cpu", "no-shared-folder", "share-weights-false"],
)
@in_a_loop
async def test_workers_without_a_keeper_start_as_before(spec: WorkerSpec) -> None:
    harness = Harness()
    worker = await harness.worker(spec)
    assert worker.spec == spec and harness.keepers == []


@in_a_loop
async def test_the_cpu_stand_in_keeps_cpu_workers_weights_when_asked() -> None:
    harness = Harness()
    worker = await harness.worker(_spec(gpu=None, mode="all"))
    assert worker.spec.weights_keeper == harness.keepers[0].address


@in_a_loop
async def test_close_stops_every_keeper() -> None:
    harness = Harness()
    await harness.worker(_spec())
    await harness.worker(_spec(gpu=1))
    await harness.registry.close()
    assert [keeper.stops for keeper in harness.keepers] == [1, 1]


@pytest.mark.parametrize(
    ("value", "mode"), [("gpu", "gpu"), ("ALL", "all"), ("off", "off"), (False, "off")]
)
def test_weights_keeper_is_read_from_the_optimization_section(value: object, mode: str) -> None:
    assert parse_optimization({"weights_keeper": value}).weights_keeper == mode
    assert parse_optimization({}).weights_keeper == "off"


@pytest.mark.parametrize("value", [True, "cuda", 1])
def test_a_weights_keeper_value_of_no_mode_is_refused(value: object) -> None:
    with pytest.raises(ModelConfigError, match="weights_keeper"):
        parse_optimization({"weights_keeper": value})


@pytest.mark.parametrize(
    ("optimization", "gpu", "kept"),
    [
        ({}, 0, False),
        ({"weights_keeper": "gpu"}, 0, True),
        ({"weights_keeper": "gpu"}, None, False),
        ({"weights_keeper": "all"}, None, True),
        ({"weights_keeper": "all", "share_weights": False}, 0, False),
    ],
)
def test_which_workers_have_a_keeper(
    optimization: dict[str, Any], gpu: int | None, kept: bool
) -> None:
    assert keeps_weights({"optimization": optimization}, gpu) is kept


@pytest.mark.parametrize(
    ("files", "kept"),
    [
        ({"serializedFile": "model.pt", "modelFile": "model.py"}, True),
        ({"serializedFile": "program.pt2"}, True),
        ({"serializedFile": "model.onnx"}, False),
        ({"serializedFile": "package.pt2"}, False),  # an AOTInductor package: written below
        ({}, False),  # the handler loads what it likes
    ],
    ids=["eager", "torch-export", "onnx", "aoti-package", "no-file"],
)
@in_a_loop
async def test_only_formats_that_share_their_weights_get_a_keeper(
    files: dict[str, str], kept: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with zipfile.ZipFile(tmp_path / "package.pt2", "w") as package:
        package.writestr("package/data/aotinductor/model/model.so", b"")
    harness = Harness()
    first = await harness.worker(_spec(files=files, model_dir=str(tmp_path)))
    second = await harness.worker(_spec(files=files, model_dir=str(tmp_path)))
    assert len(harness.keepers) == (1 if kept else 0)
    assert bool(first.spec.weights_keeper) is bool(second.spec.weights_keeper) is kept
    ignored = [r for r in caplog.records if "weights_keeper ignored" in r.getMessage()]
    assert len(ignored) == (0 if kept else 1)  # once per version, not once per worker


def test_the_frontend_waits_for_the_byte_the_keeper_sends() -> None:
    assert weight_keepers.LISTENING == weights_keeper.LISTENING
