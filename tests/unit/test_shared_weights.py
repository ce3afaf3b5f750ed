"""One copy of a model's weights: loads that map the weights file answer exactly as loads
that read it, map what they say, fall back where mapping cannot be exact, and never let
one worker's write reach another's weights or the file."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from ferry.handlers.builtin import shared_weights
from ferry.handlers.builtin.formats import load_model
from ferry.handlers.builtin.shared_weights import (
    eager_on_mapped_weights,
    share_loaded,
    sharing_weights,
    torchscript_on_mapped_weights,
)
from ferry.worker.footprint import FootprintMeter, own_resident_bytes

CPU = torch.device("cpu")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(self.body(x))
        return out


class WithTransientBuffer(Net):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.full((4,), 0.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        offset = self.get_buffer("offset")
        return super().forward(x) + offset


class NeedsRealTensors(Net):
    def __init__(self) -> None:
        super().__init__()
        self.scale = float(torch.ones(1).sum().item())  # no value on the meta device


@pytest.fixture
def server_folder(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The server's work folder as the worker sees it: the unpacked model folder, and the
    model's shared folder beside it."""
    work = tmp_path / "work"
    model_dir, shared = work / "unpacked-model", work / "model-compile-cache"
    model_dir.mkdir(parents=True)
    shared.mkdir()
    yield model_dir, shared


def _saved(module: nn.Module, path: Path, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    for parameter in module.parameters():
        nn.init.normal_(parameter)
    module.norm.running_mean.uniform_()  # type: ignore[union-attr, operator]
    torch.save(module.state_dict(), path)
    return module.eval()


def _maps(path: Path) -> bool:
    """Whether this process maps ``path``."""
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


BATCH = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))


def test_an_eager_model_maps_its_state_dict_and_answers_exactly(
    server_folder: tuple[Path, Path],
) -> None:
    model_dir, shared = server_folder
    weights = model_dir / "model.pt"
    reference = _saved(Net(), weights)
    with sharing_weights(shared):
        mapped = eager_on_mapped_weights(Net, weights, CPU)
    assert mapped is not None
    assert torch.equal(mapped.eval()(BATCH), reference(BATCH))
    assert _maps(weights)  # the server's own unpacked file, mapped in place
    assert not (shared / shared_weights.SUBFOLDER).exists()


def test_nothing_is_shared_without_a_shared_folder_or_on_a_gpu(
    server_folder: tuple[Path, Path],
) -> None:
    model_dir, shared = server_folder
    weights = model_dir / "model.pt"
    _saved(Net(), weights)
    assert eager_on_mapped_weights(Net, weights, CPU) is None
    with sharing_weights(shared):
        assert eager_on_mapped_weights(Net, weights, torch.device("cuda", 0)) is None


@pytest.mark.parametrize("cls", [WithTransientBuffer, NeedsRealTensors])
def test_a_module_that_cannot_be_mapped_exactly_loads_as_before(
    server_folder: tuple[Path, Path], cls: type[Net]
) -> None:
    model_dir, shared = server_folder
    (model_dir / "model.py").write_text("")
    weights = model_dir / "model.pt"
    _saved(cls(), weights)
    with sharing_weights(shared):
        assert eager_on_mapped_weights(cls, weights, CPU) is None


def test_a_state_dict_of_another_dtype_is_converted_not_assigned(
    server_folder: tuple[Path, Path],
) -> None:
    model_dir, shared = server_folder
    weights = model_dir / "model.pt"
    torch.save(_saved(Net(), model_dir / "fp32.pt").half().state_dict(), weights)
    with sharing_weights(shared):
        assert eager_on_mapped_weights(Net, weights, CPU) is None  # load_state_dict converts


def test_a_legacy_pickle_file_is_not_mapped(server_folder: tuple[Path, Path]) -> None:
    model_dir, shared = server_folder
    weights = model_dir / "model.pt"
    torch.save(Net().state_dict(), weights, _use_new_zipfile_serialization=False)
    with sharing_weights(shared):
        assert eager_on_mapped_weights(Net, weights, CPU) is None


def test_a_store_folder_file_is_copied_once_and_rewriting_it_changes_nothing(
    tmp_path: Path, server_folder: tuple[Path, Path]
) -> None:
    _, shared = server_folder
    store_file = tmp_path / "store" / "model.pt"
    store_file.parent.mkdir()
    reference = _saved(Net(), store_file)
    expected = reference(BATCH)
    with sharing_weights(shared):
        first = eager_on_mapped_weights(Net, store_file, CPU)
        second = eager_on_mapped_weights(Net, store_file, CPU)
    assert first is not None and second is not None
    copies = list((shared / shared_weights.SUBFOLDER).rglob("state_dict.pt"))
    assert len(copies) == 1 and _maps(copies[0]) and not _maps(store_file)
    with open(store_file, "r+b") as rewritten:  # the operator rewrites it in place
        rewritten.write(b"\0" * store_file.stat().st_size)
    assert torch.equal(first.eval()(BATCH), expected)


def test_torchscript_is_split_once_then_mapped_and_answers_exactly(
    server_folder: tuple[Path, Path],
) -> None:
    model_dir, shared = server_folder
    path = model_dir / "model.pt"
    module = _saved(Net(), model_dir / "state.pt")
    torch.jit.script(module).save(str(path))  # type: ignore[no-untyped-call]
    reference = torch.jit.load(str(path))  # type: ignore[no-untyped-call]
    with sharing_weights(shared):
        first = torchscript_on_mapped_weights(path, CPU)
        (weights,) = (shared / shared_weights.SUBFOLDER).rglob("weights.pt")
        written = weights.stat().st_mtime_ns
        second = torchscript_on_mapped_weights(path, CPU)
    assert first is not None and second is not None
    assert weights.stat().st_mtime_ns == written  # the second load only mapped it
    assert torch.equal(first(BATCH), reference(BATCH))
    assert torch.equal(second(BATCH), reference(BATCH))
    assert _maps(weights)
    skeleton = weights.parent / "skeleton.pt"
    tensor_bytes = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    assert path.stat().st_size - skeleton.stat().st_size >= 0.9 * tensor_bytes


def test_a_write_into_mapped_weights_stays_private(server_folder: tuple[Path, Path]) -> None:
    """Decided: a handler may write into its weights; it gets a private copy of the pages
    it writes (copy on write), the file and the model's other workers keep theirs."""
    model_dir, shared = server_folder
    path = model_dir / "model.pt"
    torch.jit.script(_saved(Net(), model_dir / "state.pt")).save(str(path))  # type: ignore[no-untyped-call]
    with sharing_weights(shared):
        writer = torchscript_on_mapped_weights(path, CPU)
        other = torchscript_on_mapped_weights(path, CPU)
    assert writer is not None and other is not None
    (weights,) = (shared / shared_weights.SUBFOLDER).rglob("weights.pt")
    before, expected = _digest(weights), other(BATCH)
    with torch.no_grad():
        for parameter in writer.parameters():
            parameter.mul_(2)
    assert not torch.equal(writer(BATCH), expected)
    assert torch.equal(other(BATCH), expected)
    assert _digest(weights) == before


def test_an_export_program_moves_onto_mapped_weights(server_folder: tuple[Path, Path]) -> None:
    model_dir, shared = server_folder
    path = model_dir / "model.pt2"
    reference = _saved(Net(), model_dir / "state.pt")
    torch.export.save(torch.export.export(reference, (BATCH,)), str(path))
    with sharing_weights(shared):
        model = load_model(model_dir, "model.pt2", None, CPU)
    assert model is not None
    (weights,) = (shared / shared_weights.SUBFOLDER).rglob("weights.pt")
    assert _maps(weights)
    assert torch.equal(model(BATCH), reference(BATCH))


def test_share_loaded_leaves_a_module_of_other_names_alone(
    server_folder: tuple[Path, Path],
) -> None:
    model_dir, shared = server_folder
    source = model_dir / "model.pt2"
    source.write_bytes(b"program")
    first = _saved(Net(), model_dir / "state.pt")
    expected = first(BATCH)
    with sharing_weights(shared):
        share_loaded(first, source, CPU)  # writes this Net's weights, then maps them
        other = nn.Linear(2, 2)
        before = other.weight.detach().clone()
        share_loaded(other, source, CPU)  # its names differ from the file's: left alone
    assert torch.equal(first(BATCH), expected)
    assert torch.equal(other.weight, before)


def test_the_footprint_reports_mapped_weights_apart(server_folder: tuple[Path, Path]) -> None:
    model_dir, shared = server_folder
    path = model_dir / "model.pt"
    torch.jit.script(_saved(Net(), model_dir / "state.pt")).save(str(path))  # type: ignore[no-untyped-call]
    meter = FootprintMeter()
    with sharing_weights(shared):
        torchscript_on_mapped_weights(path, CPU)
    footprint = meter.measured()
    (weights,) = (shared / shared_weights.SUBFOLDER).rglob("weights.pt")
    assert footprint.shared_bytes == weights.stat().st_size
    assert footprint.shared_key == str(weights.resolve())
    assert FootprintMeter().measured().shared_key == ""  # nothing new mapped since


def test_own_resident_bytes_counts_anonymous_and_shared_memory_pages(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("VmRSS:\t 900 kB\nRssAnon:\t 300 kB\nRssFile:\t 500 kB\nRssShmem:\t 100 kB\n")
    assert own_resident_bytes(status) == 400 * 1024
    assert own_resident_bytes(tmp_path / "missing") == 0
    assert own_resident_bytes() > 0 and os.path.exists("/proc/self/status")
