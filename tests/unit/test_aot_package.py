"""AOTInductor packages without compiling one: telling a package from a torch.export
program, reading what it was compiled for and refusing a mismatch with the reason,
batches over the compiled maximum run in slices, the optimisations a compiled package
cannot take, and the per-model compile cache's folder, lock and switch. Compiling for
real is in tests/integration/test_aot_inductor.py."""

from __future__ import annotations

import json
import os
import threading
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._inductor import config as inductor_config

from ferry.config.sections import compiles, parse_optimization, torchserve_compile_options
from ferry.errors import ArchiveError, ConfigError
from ferry.handlers.builtin.aot_package import (
    AotiModel,
    PackageTarget,
    Runtime,
    cpu_flags,
    is_aoti_package,
    load_aoti_package,
    mismatch,
    package_target,
)
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.optimize import Optimizations, optimize_model
from ferry.handlers.contract.context import Context
from ferry.worker import compile_cache
from ferry.worker.compile_cache import cache_folder, model_compile_cache
from tests.fixtures.models import DOUBLING_MODEL, Doubler

CPU = torch.device("cpu")


def _package(path: Path, metadata: dict[str, str]) -> Path:
    """A zip laid out as AOTInductor packages are, holding only the metadata."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("package/archive_format", "pt2")
        archive.writestr("package/data/aotinductor/model/model_metadata.json", json.dumps(metadata))
    return path


def _runtime(**changes: Any) -> Runtime:
    values: dict[str, Any] = {
        "device": CPU,
        "torch_version": "2.13.0+cpu",
        "cpu_flags": frozenset({"avx2", "fma", "f16c", "sse4_2"}),
        "compute_capability": "",
    }
    return Runtime(**{**values, **changes})


def test_a_package_is_told_from_a_torch_export_program(tmp_path: Path) -> None:
    package = _package(tmp_path / "compiled.pt2", {"AOTI_DEVICE_KEY": "cpu"})
    program = tmp_path / "program.pt2"
    exported = torch.export.export(Doubler(), (torch.ones(2, 3),))
    torch.export.save(exported, str(program))
    (tmp_path / "text.pt2").write_text("not a zip")
    assert is_aoti_package(package)
    assert not is_aoti_package(program)
    assert not is_aoti_package(tmp_path / "text.pt2")


def test_what_a_package_was_compiled_for_comes_from_its_metadata(tmp_path: Path) -> None:
    metadata = {
        "AOTI_DEVICE_KEY": "cuda",
        "AOTI_CPU_ISA": "AVX512",
        "AOTI_COMPUTE_CAPABILITY": "90",
        "ferry.torch": "2.13.0",
        "ferry.max_batch": "16",
    }
    target = package_target(_package(tmp_path / "m.pt2", metadata))
    assert target == PackageTarget("cuda", "AVX512", "90", "2.13.0", 16)
    bare = package_target(_package(tmp_path / "bare.pt2", {"AOTI_DEVICE_KEY": "cpu"}))
    assert bare == PackageTarget("cpu")
    with pytest.raises(ArchiveError, match="which device"):
        package_target(_package(tmp_path / "none.pt2", {"other": "x"}))


@pytest.mark.parametrize(
    ("target", "runtime", "reason"),
    [
        (PackageTarget("cuda"), _runtime(), "compiled for cuda and this worker runs on cpu"),
        (
            PackageTarget("cpu", torch_version="2.12.0"),
            _runtime(),
            "torch 2.12.0 and this worker has torch 2.13.0",
        ),
        (
            PackageTarget("cpu", cpu_isa="AVX512 AVX512_VNNI"),
            _runtime(),
            "kernels for AVX512 AVX512_VNNI and this machine's CPU lacks avx512f, avx512dq",
        ),
        (
            PackageTarget("cuda", compute_capability="90"),
            _runtime(device=torch.device("cuda:0"), compute_capability="80"),
            "compute capability 90 and this one has 80",
        ),
    ],
)
def test_a_package_for_another_machine_is_refused_with_the_reason(
    target: PackageTarget, runtime: Runtime, reason: str
) -> None:
    message = mismatch(Path("m.pt2"), target, runtime)
    assert message is not None and reason in message


def test_a_package_for_this_machine_or_a_lesser_one_passes() -> None:
    target = PackageTarget("cpu", "AVX2", "", "2.13.0+cpu", 8)
    assert mismatch(Path("m.pt2"), target, _runtime()) is None
    avx512 = frozenset({"avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512vl", "avx512bw"})
    assert mismatch(Path("m.pt2"), target, _runtime(cpu_flags=avx512)) is None
    unknown = _runtime(cpu_flags=None)  # no /proc/cpuinfo: not checked
    assert mismatch(Path("m.pt2"), PackageTarget("cpu", "AVX512"), unknown) is None


def test_the_cpu_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "fma"})
    assert cpu_flags(tmp_path / "absent") is None


def test_loading_a_package_for_another_device_fails_before_torch_reads_it(
    tmp_path: Path,
) -> None:
    package = _package(tmp_path / "gpu.pt2", {"AOTI_DEVICE_KEY": "cuda"})
    with pytest.raises(ArchiveError, match=r"gpu.pt2 was compiled for cuda .* runs on cpu"):
        load_aoti_package(package, CPU)


def test_a_torch_without_the_package_loader_refuses_the_package_naming_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on torch before 2.6 (simulated): a clear ``ArchiveError``, not an ImportError."""
    import torch._inductor

    monkeypatch.delattr(torch._inductor, "aoti_load_package")
    package = _package(tmp_path / "cpu.pt2", {"AOTI_DEVICE_KEY": "cpu"})
    with pytest.raises(ArchiveError, match=r"cpu.pt2: .* needs torch 2.6 or later .* has torch"):
        load_aoti_package(package, CPU)


def test_a_loader_without_a_device_index_loads_on_the_current_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on torch 2.6 (simulated): ``aoti_load_package(path)`` alone."""
    import torch._inductor

    loaded: list[str] = []

    def loader_of_torch_2_6(path: str, run_single_threaded: bool = False) -> Any:
        loaded.append(path)
        return _Recorder()

    monkeypatch.setattr(torch._inductor, "aoti_load_package", loader_of_torch_2_6)
    package = _package(tmp_path / "cpu.pt2", {"AOTI_DEVICE_KEY": "cpu"})
    model = load_aoti_package(package, CPU)
    assert loaded == [str(package)]
    assert isinstance(model.compiled, _Recorder)


def test_torchserves_earlier_form_on_a_torch_without_its_loader_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``torch._export.aot_load`` (deprecated) gone, as from a later torch (simulated)."""
    import torch._export

    monkeypatch.delattr(torch._export, "aot_load")
    library = tmp_path / "model.so"
    library.write_bytes(b"")
    with pytest.raises(ArchiveError, match=r"no torch._export.aot_load .* --aot-inductor"):
        BaseHandler()._load_torch_export_aot_compile(str(library))


class _Recorder:
    """A stand-in for a loaded package: doubles its input, noting each batch's rows."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.rows.append(batch.shape[0])
        return batch * 2, {"sum": batch.sum(dim=1)}


def test_a_batch_over_the_compiled_maximum_runs_in_slices_and_is_joined() -> None:
    recorder = _Recorder()
    model = AotiModel(recorder, PackageTarget("cpu", max_batch=4))
    batch = torch.arange(30.0).reshape(10, 3)
    doubled, sums = model(batch)
    assert recorder.rows == [4, 4, 2]
    assert torch.equal(doubled, batch * 2) and torch.equal(sums["sum"], batch.sum(dim=1))
    model(batch[:4])
    assert recorder.rows[-1] == 4  # within the maximum: one call


def test_a_compiled_package_refuses_the_optimisations_it_cannot_take() -> None:
    model = AotiModel(_Recorder(), PackageTarget("cpu"))
    compiled = Optimizations.from_section(parse_optimization({"compile": True}))
    with pytest.raises(ConfigError, match="compile cannot apply to an AOTInductor package"):
        optimize_model(model, compiled, CPU)
    shaped = Optimizations.from_section(parse_optimization({"batch_buckets": [1, 4]}))
    assert optimize_model(model, shaped, CPU) is model


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, False),
        ({"optimization": {"compile": "default"}}, True),
        ({"optimization": {"compile": False}}, False),
        ({"pt2": "inductor"}, True),
        ({"pt2": {"compile": {"enable": True, "backend": "inductor"}}}, True),
        ({"pt2": {"compile": {"enable": False}}}, False),
        ({"pt2": {"export": {"aot_compile": True}}}, False),
        ({"pt2": {"backend": "inductor"}}, True),
    ],
)
def test_which_models_compile_as_they_load(config: dict[str, Any], expected: bool) -> None:
    assert compiles(config) is expected


def test_the_cache_folder_is_named_by_torch_version_and_device(tmp_path: Path) -> None:
    assert cache_folder(tmp_path, "2.13.0+cpu", "cpu") == tmp_path / "torch-2.13.0_cpu-cpu"
    assert cache_folder(tmp_path, "2.13.0", "cuda-sm90").name == "torch-2.13.0-cuda-sm90"


def _lock_is_held(folder: Path) -> bool:
    """Whether another open of the lock file would have to wait (from another thread,
    as another worker process would)."""
    import fcntl

    held: list[bool] = []

    def probe() -> None:
        with open(folder / compile_cache.LOCK_FILE, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
            else:
                held.append(False)

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join()
    return held[0]


def test_a_compiling_model_loads_alone_with_its_cache_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_cache, "OPERATOR_CACHE", None)
    monkeypatch.delenv(compile_cache.CACHE_VARIABLE, raising=False)
    monkeypatch.delenv(compile_cache.DYNAMIC_THREADS_VARIABLE, raising=False)
    config = {"optimization": {"compile": "default"}}
    with inductor_config.patch({"cpp.dynamic_threads": False}):
        with model_compile_cache(str(tmp_path), None, {}) as plain:
            assert plain is not None and not inductor_config.cpp.dynamic_threads
        with model_compile_cache(str(tmp_path), None, config) as folder:
            assert folder is not None and folder.parent == tmp_path
            assert os.environ[compile_cache.CACHE_VARIABLE] == str(folder)
            assert _lock_is_held(folder)
            # Kernels for any torch thread count: one compile for workers of every count.
            assert inductor_config.cpp.dynamic_threads
    assert not _lock_is_held(folder)
    with model_compile_cache(str(tmp_path), None, {}) as plain:
        assert plain == folder and not _lock_is_held(folder)  # no compile: loads in parallel


def test_the_operators_choice_of_kernels_for_one_thread_count_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(compile_cache.DYNAMIC_THREADS_VARIABLE, "0")
    config = {"optimization": {"compile": "default"}}
    with (
        inductor_config.patch({"cpp.dynamic_threads": False}),
        model_compile_cache(str(tmp_path), None, config),
    ):
        assert not inductor_config.cpp.dynamic_threads


def test_the_operators_own_cache_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_cache, "OPERATOR_CACHE", "/srv/inductor")
    monkeypatch.setenv(compile_cache.CACHE_VARIABLE, "/srv/inductor")
    with model_compile_cache(str(tmp_path), None, {"pt2": "inductor"}) as folder:
        assert folder is None
    assert os.environ[compile_cache.CACHE_VARIABLE] == "/srv/inductor"
    assert list(tmp_path.iterdir()) == []


def _doubler_handler(tmp_path: Path, config: dict[str, Any]) -> BaseHandler:
    """A ``BaseHandler`` initialised on the Doubler saved as an eager model."""
    (tmp_path / "doubler_model.py").write_text(DOUBLING_MODEL)
    torch.save(Doubler().state_dict(), tmp_path / "doubler.pt")
    manifest = {"model": {"serializedFile": "doubler.pt", "modelFile": "doubler_model.py"}}
    handler = BaseHandler()
    handler.initialize(Context("m", str(tmp_path), manifest, 4, None, model_yaml_config=config))
    return handler


@pytest.mark.parametrize(
    ("pt2", "options"),
    [
        ({"compile": {"enable": True, "backend": "inductor", "mode": "default"}}, True),
        ("inductor", True),
        ({"backend": "inductor"}, True),  # TorchServe's older form: the options themselves
        ({"compile": {"enable": False}}, False),
        ({"compile": {"enable": True, "backend": "no-such-backend"}}, False),
    ],
)
def test_torchserves_pt2_section_compiles_the_model_as_torchserve_does(
    tmp_path: Path, pt2: Any, options: bool
) -> None:
    handler = _doubler_handler(tmp_path, {"pt2": pt2})
    compiled = isinstance(handler.model, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled is options  # an unknown backend: a warning, the model as it was
    assert compiles({"pt2": pt2}) is (torchserve_compile_options({"pt2": pt2}) is not None)
