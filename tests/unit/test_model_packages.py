"""``ferry.store.packages``: which requirements file, the pip command, and pip's failures
as errors a user can act on; ``pip_index_url`` / ``pip_find_links`` holding pip to the
configured sources (``ferry.store.pip_sources``), and the start-up warning."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from ferry.cli.main import build_parser
from ferry.cli.serve import flags_from_args
from ferry.config.settings import ServerSettings
from ferry.config.sources import load_settings
from ferry.errors import ConfigError, PackageInstallFailed
from ferry.service import FerryService
from ferry.service.types import RegisterRequest
from ferry.store.packages import install_packages, pip_command, requirements_path
from ferry.store.pip_sources import UNRESTRICTED, PipSources
from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.fake_worker import FakeFactory
from tests.fixtures.models import HANDLERS


def test_no_requirements_file_means_nothing_to_install(tmp_path: Path) -> None:
    assert requirements_path(tmp_path, None) is None


def test_a_requirements_file_the_manifest_names_but_the_archive_lacks(tmp_path: Path) -> None:
    with pytest.raises(PackageInstallFailed, match=r"names 'requirements\.txt', which is missing"):
        requirements_path(tmp_path, "requirements.txt")


def test_pip_installs_into_its_own_target_with_the_server_python(tmp_path: Path) -> None:
    command = pip_command(tmp_path / "req.txt", tmp_path / "target")
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert command[command.index("--target") + 1] == str(tmp_path / "target")
    assert command[-2:] == ["-r", str(tmp_path / "req.txt")]


def test_a_failed_install_quotes_pips_last_lines_and_leaves_nothing(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("this is not a requirement ===\n")
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(PackageInstallFailed) as failure:
        install_packages("m", tmp_path, requirements, work)
    assert failure.value.args[0].startswith("Custom pip package installation failed for model m: ")
    assert "ERROR" in failure.value.args[0]
    assert list(work.iterdir()) == []


def test_an_install_past_its_time_limit_is_abandoned(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n")
    with pytest.raises(PackageInstallFailed, match="did not finish within 0s"):
        install_packages("m", tmp_path, requirements, tmp_path, timeout=0)


# --- pip_index_url / pip_find_links: pip held to the configured sources -----------------

INDEX = "https://pypi.internal.example/simple"
RESTRICTED = PipSources(index_url=INDEX)
REFUSAL = "is refused: pip_index_url / pip_find_links restrict where pip installs from"


class FakePip:
    """Stands in for ``subprocess.run``: records pip's command line, installs nothing and
    reaches no network."""

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def __call__(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        self.commands.append(command)
        return subprocess.CompletedProcess(command, 0, b"Successfully installed nothing\n")


@pytest.fixture
def fake_pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    fake = FakePip()
    monkeypatch.setattr("ferry.store.packages.subprocess.run", fake)
    return fake


def _model(tmp_path: Path, requirements: str, **files: str) -> tuple[Path, Path, Path]:
    """A model folder with ``requirements.txt`` (and ``files``); the folder, the file and
    an empty work folder."""
    model, work = tmp_path / "model", tmp_path / "work"
    model.mkdir()
    work.mkdir()
    for name, text in files.items():
        (model / name).parent.mkdir(parents=True, exist_ok=True)
        (model / name).write_text(text)
    path = model / "requirements.txt"
    path.write_text(requirements)
    return model, path, work


def test_unrestricted_pip_gets_no_source_options(tmp_path: Path) -> None:
    """TorchServe's way, the default: pip's own configuration and the file decide."""
    command = pip_command(tmp_path / "req.txt", tmp_path / "target")
    assert not {"--index-url", "--no-index", "--find-links"} & set(command)
    assert not UNRESTRICTED.restricted and not PipSources().options()


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        (RESTRICTED, ["--index-url", INDEX]),
        (PipSources(find_links=Path("/srv/wheels")), ["--no-index", "--find-links", "/srv/wheels"]),
        (
            PipSources(INDEX, Path("/srv/wheels")),
            ["--index-url", INDEX, "--find-links", "/srv/wheels"],
        ),
    ],
)
def test_restricted_pip_gets_the_configured_sources(
    tmp_path: Path, sources: PipSources, expected: list[str]
) -> None:
    requirements = tmp_path / "req.txt"
    command = pip_command(requirements, tmp_path / "target", sources=sources)
    assert command[-len(expected) - 2 :] == [*expected, "-r", str(requirements)]


def test_a_relative_find_links_folder_is_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip runs in the model's folder, so the server's relative path would miss."""
    monkeypatch.chdir(tmp_path)
    options = PipSources(find_links=Path("wheels")).options()
    assert options == ["--no-index", "--find-links", str(tmp_path / "wheels")]


@pytest.mark.parametrize(
    ("requirements", "line", "what"),
    [
        (f"torch\n--index-url {INDEX}-evil\n", 2, "the option --index-url"),
        ("-i https://evil.example/simple\n", 1, "the option -i"),
        ("-ihttps://evil.example/simple\n", 1, "the option -i"),
        ("--extra-index-url=https://evil.example/simple\n", 1, "the option --extra-index-url"),
        ("--extra https://evil.example/simple\n", 1, "the option --extra"),  # optparse's
        ("-f https://evil.example/links/\n", 1, "the option -f"),
        ("--find-links ./wheels\n", 1, "the option --find-links"),
        ("--no-index\n", 1, "the option --no-index"),
        ("--trusted-host evil.example\n", 1, "the option --trusted-host"),
        ("torch --index-url=https://evil.example/simple\n", 1, "the option --index-url"),
        ("https://evil.example/pkg-1.0.whl\n", 1, "the URL requirement"),
        ("pkg @ https://evil.example/pkg-1.0.whl\n", 1, "the URL requirement"),
        ("git+https://github.com/evil/pkg.git\n", 1, "the URL requirement"),
        ("git+git@github.com:evil/pkg.git\n", 1, "the URL requirement"),
        ("-e git+https://github.com/evil/pkg.git#egg=pkg\n", 1, "the option -e"),
        ("-r https://evil.example/more.txt\n", 1, "-r https://evil.example/more.txt (a URL)"),
        ("-c file:///etc/constraints.txt\n", 1, "(a URL)"),
        ("-r ../outside.txt\n", 1, "'../outside.txt', which is outside the model's folder"),
        ("/opt/elsewhere/pkg-1.0.whl\n", 1, "which is outside the model's folder"),
        ("torch\n# a comment\n${EXTRA}\n", 3, "an environment variable reference"),
        ("numpy \\\n  --extra-index-url https://evil.example\n", 1, "--extra-index-url"),
        ("pkg==1.0; python_version > '3' --pre -f https://evil.example\n", 1, "the option -f"),
        ("-r more.txt\n", 1, "more.txt line 2: the option --extra-index-url"),
    ],
)
def test_a_restricted_install_refuses_what_could_reach_other_hosts(
    tmp_path: Path, fake_pip: FakePip, requirements: str, line: int, what: str
) -> None:
    more = "torch\n--extra-index-url https://evil.example/simple\n"
    model, path, work = _model(tmp_path, requirements, **{"more.txt": more})
    with pytest.raises(PackageInstallFailed) as refused:
        install_packages("m", model, path, work, sources=RESTRICTED)
    message = refused.value.message
    assert what in message and REFUSAL in message, message
    if "more.txt" not in what:
        assert message.startswith(f"model m: requirements.txt line {line}: ")
    assert fake_pip.commands == [] and list(work.iterdir()) == []  # pip never ran


def test_a_restricted_install_accepts_what_stays_with_the_configured_sources(
    tmp_path: Path, fake_pip: FakePip
) -> None:
    requirements = (
        "# pinned for the model\n"
        "torch==2.3.0  # CPU build\n"
        "pillow[extra]>=10,<12\n"
        'numpy (>=1.26); python_version >= "3.11"\n'
        "requests --hash=sha256:0123abcd --hash sha256:4567ef\n"
        "--pre\n"
        "--only-binary :all:\n"
        "./wheels/dep-1.0-py3-none-any.whl\n"
        "-r nested/more.txt\n"
        "-c constraints.txt\n"
    )
    files = {"nested/more.txt": "scipy\n-r ../constraints.txt\n", "constraints.txt": "scipy<2\n"}
    model, path, work = _model(tmp_path, requirements, **files)
    target = install_packages("m", model, path, work, sources=RESTRICTED)
    (command,) = fake_pip.commands
    assert command[command.index("--index-url") + 1] == INDEX
    assert target.parent == work


def test_an_unrestricted_install_leaves_the_file_to_pip(tmp_path: Path, fake_pip: FakePip) -> None:
    """No restriction configured (the default): the file is not judged, as in TorchServe."""
    model, path, work = _model(tmp_path, "--extra-index-url https://other.example/simple\n")
    install_packages("m", model, path, work)
    (command,) = fake_pip.commands
    assert "--index-url" not in command


def test_the_pip_sources_come_from_every_settings_source(tmp_path: Path) -> None:
    config = tmp_path / "config.properties"
    config.write_text(f"pip_index_url={INDEX}\npip_find_links=/srv/wheels\n")
    from_file = load_settings({}, {}, config)
    assert (from_file.pip_index_url, from_file.pip_find_links) == (INDEX, Path("/srv/wheels"))
    from_env = load_settings({}, {"FERRY_PIP_INDEX_URL": INDEX}, None)
    assert from_env.pip_index_url == INDEX
    args = build_parser().parse_args(["serve", "--pip-find-links", "/srv/wheels"])
    assert load_settings(flags_from_args(args), {}, None).pip_find_links == Path("/srv/wheels")
    defaults = load_settings({}, {}, None)
    assert (defaults.pip_index_url, defaults.pip_find_links) == (None, None)
    with pytest.raises(ConfigError, match="pip_index_url: expected an http://"):
        load_settings({"pip_index_url": "evil.example/simple"}, {}, None)


# --- the start-up warning ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "warning"),
    [
        ({}, None),
        (
            {"install_py_dep_per_model": True},
            "each archive's requirements file is installed with pip, which allowed_urls "
            "does not restrict",
        ),
        (
            {"install_py_dep_per_model": True, "pip_index_url": INDEX},
            f"installed with pip, from the index {INDEX} only",
        ),
    ],
)
def test_the_server_warns_at_start_up_that_pip_is_outside_allowed_urls(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    settings: dict[str, Any],
    warning: str | None,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the service's work folder
    with caplog.at_level(logging.WARNING, logger="ferry"):
        service = FerryService(ServerSettings(**settings), start_worker=FakeFactory())
    asyncio.run(service.close())
    warnings = [
        r.getMessage() for r in caplog.records if "install_py_dep_per_model" in r.getMessage()
    ]
    if warning is None:
        assert warnings == []
    else:
        (message,) = warnings
        assert warning in message


def test_a_registration_whose_requirements_escape_the_index_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_pip: FakePip
) -> None:
    """From the settings through registration: the refusal is the 400 path pip's own
    failures take (``PackageInstallFailed``), and the unpacked archive is freed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = tmp_path / "store"
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("torch\n--extra-index-url https://evil.example/simple\n")
    handler = str(HANDLERS / "digest_handler.py")
    spec = ArchiveSpec(model_name="m", handler=handler, requirements_file=requirements)
    write_archive(spec, store)
    settings = ServerSettings(
        model_store=store, enable_model_api=True, install_py_dep_per_model=True, pip_index_url=INDEX
    )

    async def scenario() -> None:
        service = FerryService(settings, start_worker=FakeFactory())
        try:
            with pytest.raises(PackageInstallFailed, match=re.escape(REFUSAL)):
                await service.register(RegisterRequest("m.mar", synchronous=True))
            assert list(service.models.work_dir.iterdir()) == []
            assert service.model_names() == []
        finally:
            await service.close()

    asyncio.run(scenario())
