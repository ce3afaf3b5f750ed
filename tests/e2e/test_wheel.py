"""The wheel, installed as users install it (issue 48, item 3).

``python -m build``, run on the checkout's files as a fresh clone has them (not on this
folder, whose ``ferry_serve.egg-info`` from the editable install would add every file it
lists to the sdist), makes the sdist and, from it, the wheel; ``pip install`` puts the wheel
(not editable, with the ``grpc`` extra) into a new virtual environment beside the torch
build this checkout is developed with, pinned as a user pins it (``pip install
torch==VERSION``: pip takes that build from its local wheel folder where it has one). Then
``ferry``, run from a folder outside the checkout, prints its version, writes an archive
and serves the demo model, a handler written for TorchServe (``ts.*`` imports) and the
gRPC APIs: what only the package data, the ``ts`` shims and the generated gRPC modules
inside the wheel make work. The wheel holds no bench code: ``ferry bench`` there names what
to install; ferry-bench's own wheel, built from ``bench/``, holds it all.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ferry import __version__
from tests.fixtures.models import DEMO_STORE, HANDLERS, Doubler, save_torchscript, write_config
from tests.fixtures.server import ferry_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 300.0
INSTALL_TIMEOUT = 600.0
"""Each only turns a hang into a failure (measured here: build 9 s, install 20 s)."""

FROM_THE_CHECKOUT = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
"""Variables that could lead the new environment's Python back to this one's modules."""

INSTALLED_PACKAGE = """
import importlib.metadata, json, ferry
dist = importlib.metadata.distribution("ferry-serve")
print(json.dumps({
    "module": ferry.__file__,
    "version": dist.version,
    "editable": "editable" in (dist.read_text("direct_url.json") or ""),
    "files": sorted(str(f) for f in dist.files if str(f).startswith("ferry/")),
}))
"""
"""What the new environment's Python finds: ferry's module, its version and files."""

GRPC_PING = """
import sys
import grpc
from google.protobuf import empty_pb2
from ferry.grpc.generated import ferry_torchserve_inference_pb2_grpc as generated

with grpc.insecure_channel(sys.argv[1]) as channel:
    stub = generated.InferenceAPIsServiceStub(channel)
    print(stub.Ping(empty_pb2.Empty(), timeout=60).health)
"""
"""TorchServe's gRPC Ping, through the stubs generated into the wheel."""


def _run(argv: list[str], timeout: float, cwd: Path) -> str:
    """``argv``'s output; fails with it when the command fails."""
    environment = {k: v for k, v in os.environ.items() if k not in FROM_THE_CHECKOUT}
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=environment
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(argv)} exited {result.returncode}:\n{output}"
    return result.stdout


def _checkout_files() -> list[str]:
    """The files a clone of this checkout would have once its changes are committed:
    tracked ones and new ones git does not ignore."""
    listing = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], 60, ROOT)
    return sorted(name for name in listing.splitlines() if (ROOT / name).is_file())


def _package_files(package: str = "ferry") -> list[str]:
    """What the wheel must carry: every file of the package."""
    return [name for name in _checkout_files() if name.startswith(f"{package}/")]


def _differences(shipped: list[str], expected: list[str]) -> tuple[list[str], list[str]]:
    """(missing, unexpected): the package's files ``shipped`` lacks, and those it adds."""
    return sorted(set(expected) - set(shipped)), sorted(set(shipped) - set(expected))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``python -m build`` wrote the sdist and the wheel to, built from a copy of
    the checkout's files."""
    clone = tmp_path_factory.mktemp("clone")
    for name in _checkout_files():
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, clone / name)
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(clone)], BUILD_TIMEOUT, out)
    bench = clone / "bench"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(bench)],
        BUILD_TIMEOUT,
        out,
    )
    return out


def _one(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{pattern} in {folder}: {found}"
    return found[0]


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A new virtual environment with the wheel and this checkout's torch build; removed
    afterwards (it holds about 900 MB)."""
    folder = tmp_path_factory.mktemp("wheel-venv")
    _run([sys.executable, "-m", "venv", str(folder)], INSTALL_TIMEOUT, folder)
    torch = f"torch=={importlib.metadata.version('torch')}"
    wheel = _one(dist, "ferry_serve-*.whl")
    # --no-compile: torch's byte-code is written when it is first imported instead.
    install = [str(folder / "bin" / "pip"), "install", "--no-compile", torch, f"{wheel}[grpc]"]
    _run(install, INSTALL_TIMEOUT, folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the checkout, where the installed ``ferry`` runs."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    assert not folder.resolve().is_relative_to(ROOT)
    return folder


def test_build_makes_an_sdist_and_a_wheel_with_every_package_file(dist: Path) -> None:
    sdist = _one(dist, "ferry_serve-*.tar.gz")
    wheel = _one(dist, "ferry_serve-*-py3-none-any.whl")
    assert wheel.name == f"ferry_serve-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    in_wheel = sorted(name for name in names if name.startswith("ferry/"))
    assert _differences(in_wheel, _package_files()) == ([], [])
    assert {name.partition("/")[0] for name in names} == {  # no ferry_bench/
        "ferry",
        f"ferry_serve-{__version__}.dist-info",
    }
    assert not [name for name in names if "bench" in name.split("/")[:2]]
    with tarfile.open(sdist) as archive:
        in_sdist = {name.partition("/")[2] for name in archive.getnames()}
    assert {"pyproject.toml", "README.md", *_package_files()} <= in_sdist


def test_the_installed_package_is_the_wheel_with_its_data(venv: Path, outside: Path) -> None:
    python = str(venv / "bin" / "python")
    found = json.loads(_run([python, "-c", INSTALLED_PACKAGE], 120, outside))
    assert Path(found["module"]).is_relative_to(venv), found["module"]
    assert not found["editable"]
    assert found["version"] == __version__
    installed = [name for name in found["files"] if "__pycache__" not in name]
    assert _differences(installed, _package_files()) == ([], [])
    version = _run([str(venv / "bin" / "ferry"), "--version"], 120, outside)
    assert version.strip() == f"ferry {__version__}"


def test_ferry_bench_is_a_wheel_of_its_own_with_every_bench_file(dist: Path) -> None:
    wheel = _one(dist, "ferry_bench-*-py3-none-any.whl")
    assert wheel.name == f"ferry_bench-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"ferry_bench-{__version__}.dist-info/METADATA").decode()
    bench_files = [name.removeprefix("bench/") for name in _package_files("bench/ferry_bench")]
    in_wheel = [name for name in names if name.startswith("ferry_bench/")]
    assert _differences(in_wheel, bench_files) == ([], [])
    assert f"Requires-Dist: ferry-serve=={__version__}" in metadata.splitlines()


def test_the_installed_server_names_what_ferry_bench_needs(venv: Path, outside: Path) -> None:
    argv = [str(venv / "bin" / "ferry"), "bench", "tune", "model.mar", "--slo-p99", "50ms"]
    environment = {k: v for k, v in os.environ.items() if k not in FROM_THE_CHECKOUT}
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, cwd=outside, env=environment
    )
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.splitlines() == [
        "ferry bench: ferry-bench is not installed: pip install 'ferry-serve[bench]' "
        "(in a checkout of Ferry: pip install ./bench)"
    ]


def _ts_handler_archive(ferry: Path, store: Path, scratch: Path) -> str:
    """TorchServe's handler pattern (``ts.torch_handler.base_handler.BaseHandler`` over a
    TorchScript model), archived by the installed ``ferry archive``."""
    scratch.mkdir()
    weights = scratch / "doubler.pt"
    save_torchscript(Doubler(), weights)
    config = write_config(scratch, {"minWorkers": 1, "handler": {"scale": 3}})
    argv = [str(ferry), "archive", "--model-name", "doubler", "--export-path", str(store)]
    argv += ["--handler", str(HANDLERS / "ts_style_handler.py")]
    argv += ["--serialized-file", str(weights), "--config-file", str(config)]
    _run(argv, 120, scratch)
    return "doubler.mar"


def test_the_installed_ferry_serves_the_demo_a_ts_handler_and_grpc(
    venv: Path, outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in FROM_THE_CHECKOUT:
        monkeypatch.delenv(variable, raising=False)
    ferry = venv / "bin" / "ferry"
    store = tmp_path / "store"
    store.mkdir()
    shutil.copy(DEMO_STORE / "shapes.mar", store)
    doubler = _ts_handler_archive(ferry, store, tmp_path / "doubler-src")
    models = [f"shapes=shapes.mar,doubler={doubler}"]
    with ferry_server(store, models, tmp_path, command=[str(ferry)], cwd=outside) as server:
        star = (DEMO_STORE.parent / "samples" / "star.png").read_bytes()
        shapes = httpx.put(f"{server.url}/predictions/shapes", content=star, timeout=60)
        assert shapes.status_code == 200, shapes.text
        assert max(shapes.json(), key=shapes.json().get) == "star"
        doubled = httpx.post(f"{server.url}/predictions/doubler", content=b"[1, 2]", timeout=60)
        assert doubled.status_code == 200, doubled.text
        assert doubled.json() == [6.0, 12.0]
        assert server.grpc_url.startswith("grpc://"), server.log()
        target = server.grpc_url.removeprefix("grpc://")
        python = str(venv / "bin" / "python")
        health = _run([python, "-c", GRPC_PING, target], 120, outside)
        assert json.loads(health) == {"status": "Healthy"}
