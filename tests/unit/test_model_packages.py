"""``ferry.store.packages``: which requirements file, the pip command, and pip's failures
as errors a user can act on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ferry.errors import PackageInstallFailed
from ferry.store.packages import install_packages, pip_command, requirements_path


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
