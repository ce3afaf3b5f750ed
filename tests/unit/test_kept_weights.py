"""A weights keeper's protocol and its CPU stand-in (``ferry.worker.weights_keeper``,
``ferry.handlers.builtin.kept_weights``, ``tensor_export``): the state dict packed into one
buffer, handed to two importers who see one copy, writes noticed, files outside the
server's work folder refused; and the CUDA exporter's handle checked as it can be without
a GPU."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ferry.handlers.builtin import kept_weights
from ferry.handlers.builtin.kept_weights import (
    KEEPER_PROTOCOL,
    KeeperClient,
    KeeperError,
    receive_frame,
    send_frame,
)
from ferry.handlers.builtin.shared_weights import (
    MappedWeights,
    eager_on_mapped_weights,
    sharing_weights,
)
from ferry.handlers.builtin.tensor_export import (
    ALIGN,
    CUDA_HANDLE_FIELDS,
    CudaExporter,
    SharedMemoryExporter,
    exporter_for,
    fill,
    pack,
    views,
)
from ferry.worker import footprint
from ferry.worker.footprint import FootprintMeter, resident_pages
from ferry.worker.weights_keeper import WeightsKeeper, accept_workers


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "weight": torch.randn(7, 5),
        "bias": torch.randn(7).half(),
        "steps": torch.tensor(3),  # a 0-d buffer
        "empty": torch.zeros(0),
        "mask": torch.tensor([True, False, True]),
    }


def test_packing_puts_every_tensor_at_an_aligned_offset_and_gives_it_back() -> None:
    state = _state()
    layout, nbytes = pack(state)
    assert all(entry.offset % ALIGN == 0 for entry in layout)
    assert nbytes % ALIGN == 0 and nbytes >= sum(t.nbytes for t in state.values())
    flat = torch.empty(nbytes, dtype=torch.uint8)
    fill(flat, layout, state)
    for entry, view in zip(layout, views(flat, layout), strict=True):
        assert view.dtype == state[entry.name].dtype
        assert torch.equal(view, state[entry.name])
        assert view.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


@pytest.fixture
def clients() -> Iterator[list[KeeperClient]]:
    made: list[KeeperClient] = []
    yield made
    for client in made:
        client.close()


@pytest.fixture
def keeper(tmp_path: Path) -> Iterator[str]:
    """A keeper with the CPU stand-in serving in this process; its socket's path."""
    torch.save(_state(), tmp_path / "weights.pt")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "keeper.sock"))
    listener.listen()
    keeper = WeightsKeeper(SharedMemoryExporter(), tmp_path)
    threading.Thread(target=accept_workers, args=(keeper, listener), daemon=True).start()
    yield str(tmp_path / "keeper.sock")
    listener.close()


def _client(clients: list[KeeperClient], keeper: str, kind: str = "cpu") -> KeeperClient:
    clients.append(KeeperClient(keeper, kind))
    return clients[-1]


def test_two_workers_import_one_copy_of_the_file(
    keeper: str, tmp_path: Path, clients: list[KeeperClient]
) -> None:
    first, nbytes = _client(clients, keeper).share(tmp_path / "weights.pt")
    second, _ = _client(clients, keeper).share(tmp_path / "weights.pt")
    assert nbytes == pack(_state())[1]
    for name, tensor in _state().items():
        assert torch.equal(first[name], tensor) and torch.equal(second[name], tensor)
    first["weight"][0, 0] = 42.0  # a write through one import reaches the other: one copy
    assert second["weight"][0, 0].item() == 42.0


def test_a_write_into_the_shared_copy_is_noticed(
    keeper: str, tmp_path: Path, clients: list[KeeperClient]
) -> None:
    client = _client(clients, keeper)
    tensors, _ = client.share(tmp_path / "weights.pt")
    module = torch.nn.Linear(5, 7)
    weights = {"weight": tensors["weight"], "bias": tensors["bias"].float()}
    module.load_state_dict(weights, assign=True)
    client.watch(tmp_path / "weights.pt", list(module.state_dict(keep_vars=True).values()))
    with torch.inference_mode():
        module(torch.ones(1, 5))
    assert client.written() is None  # reading is not writing
    with torch.inference_mode():
        module.weight.mul_(2)
    assert client.written() == str(tmp_path / "weights.pt")


def test_a_file_outside_the_servers_work_folder_is_refused(
    keeper: str, tmp_path_factory: pytest.TempPathFactory, clients: list[KeeperClient]
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "weights.pt"
    torch.save(_state(), elsewhere)
    with pytest.raises(KeeperError, match="outside the server's work folder"):
        _client(clients, keeper).share(elsewhere)


def test_a_keeper_of_another_device_type_is_refused(
    keeper: str, tmp_path: Path, clients: list[KeeperClient]
) -> None:
    with pytest.raises(KeeperError, match="on cpu, not cuda"):
        _client(clients, keeper, "cuda").share(tmp_path / "weights.pt")


def test_a_keeper_that_is_not_there_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(KeeperError, match="cannot reach the weights keeper"):
        KeeperClient(str(tmp_path / "nobody.sock"), "cpu").share(tmp_path / "weights.pt")


def test_exporters_by_device_type() -> None:
    assert isinstance(exporter_for("cpu"), SharedMemoryExporter)
    cuda = exporter_for("cuda", torch.device("cuda", 1))
    assert isinstance(cuda, CudaExporter) and cuda.device == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="no tensor exporter"):
        exporter_for("mps")


def test_a_cuda_handle_of_the_wrong_shape_is_refused_before_cuda_is_touched() -> None:
    with pytest.raises(ValueError, match=f"{CUDA_HANDLE_FIELDS} fields"):
        CudaExporter(torch.device("cuda", 0)).import_flat([0, b"handle"], [])


def test_a_worker_loads_an_eager_model_onto_the_keepers_copy_and_counts_it_apart(
    keeper: str, tmp_path: Path
) -> None:
    (tmp_path / "work").mkdir()
    weights = tmp_path / "state_dict.pt"  # beside the work folder: the server's own file
    torch.save({"weight": _state()["weight"], "bias": torch.zeros(7)}, weights)
    kept_weights.use_keeper(keeper, "cpu")
    try:
        meter = FootprintMeter()
        with sharing_weights(tmp_path / "work"):
            model = eager_on_mapped_weights(
                lambda: torch.nn.Linear(5, 7), weights, torch.device("cpu")
            )
        measured = meter.measured()
        assert isinstance(model, torch.nn.Linear)
        assert torch.equal(model.weight, _state()["weight"])
        assert measured.shared_key == f"keeper:cpu:{weights.resolve()}"
        assert measured.shared_bytes == pack({"weight": model.weight, "bias": model.bias})[1]
        assert kept_weights.written_weights() is None
        with torch.no_grad():
            model.bias.add_(1)  # in place, into the keeper's copy
        assert kept_weights.written_weights() == str(weights)
    finally:
        client = kept_weights.keeper()
        if client is not None:
            client.close()
        kept_weights.use_keeper("", "cpu")


def test_shared_memory_pages_of_a_keepers_copy_are_not_the_workers_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = tmp_path / "status"
    status.write_text("RssAnon:\t100 kB\nRssShmem:\t0 kB\n")
    meter = FootprintMeter(status)
    status.write_text("RssAnon:\t300 kB\nRssShmem:\t900 kB\n")
    assert resident_pages(status) == (300 * 1024, 900 * 1024)
    assert meter.measured().resident_bytes == (200 + 900) * 1024  # no copy imported
    kept = MappedWeights("keeper:cpu:/work/weights.pt", 800 * 1024)
    monkeypatch.setattr(footprint, "mapped_weights", lambda: [kept])
    assert meter.measured().resident_bytes == (200 + 100) * 1024  # the copy is the keeper's
    on_gpu = MappedWeights("keeper:cuda:/work/weights.pt", 800 * 1024)
    monkeypatch.setattr(footprint, "mapped_weights", lambda: [on_gpu])
    assert meter.measured().resident_bytes == (200 + 900) * 1024  # not in this memory


class _StorageSharedByCuda:
    """What ``_share_cuda_`` answers on a GPU, in its types (bytes handles, a flag)."""

    FIELDS = (0, b"\x01ipc-handle", 4096, 512, b"/torch_refcount", 7, b"\x02event", True)

    def _share_cuda_(self) -> tuple[Any, ...]:
        return self.FIELDS


class _FlatOnGpu:
    device = torch.device("cuda", 0)

    def untyped_storage(self) -> _StorageSharedByCuda:
        return _StorageSharedByCuda()


def test_a_cuda_handle_reaches_the_importer_field_for_field_through_a_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA exporter's handle, sent as the keeper sends it, is what torch's importer
    is given; a CPU storage stands in for the GPU memory it would map."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    imported: list[tuple[Any, ...]] = []

    def new_shared_cuda(*fields: Any) -> torch.UntypedStorage:
        imported.append(fields)
        return torch.UntypedStorage(fields[2])  # type: ignore[no-untyped-call]

    monkeypatch.setattr(torch.UntypedStorage, "_new_shared_cuda", new_shared_cuda, raising=False)
    exporter = CudaExporter(torch.device("cuda", 0))
    handle, fds = exporter.export(_FlatOnGpu())  # type: ignore[arg-type]
    keeper_end, worker_end = socket.socketpair()
    with keeper_end, worker_end:
        send_frame(keeper_end, [KEEPER_PROTOCOL, "shared", "cuda", handle, []], fds)
        answer, received = receive_frame(worker_end)
    flat = exporter.import_flat(answer[3], received)
    assert imported == [_StorageSharedByCuda.FIELDS]
    assert flat.dtype == torch.uint8 and flat.numel() == 4096
