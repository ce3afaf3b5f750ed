"""``ferry archive-workflow`` as a user runs it: torch-workflow-archiver's flags, a .war
that the server opens, and a broken spec refused before anything is written."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.cli import run_ferry
from tests.fixtures.workflows import FUNCTIONS, PIPELINE_SPEC

pytestmark = pytest.mark.e2e


def test_writes_a_war_with_torchserves_layout(tmp_path: Path) -> None:
    spec = tmp_path / "workflow.yaml"
    spec.write_text(PIPELINE_SPEC)
    result = run_ferry(
        "archive-workflow",
        "--workflow-name",
        "pipeline",
        "--spec-file",
        str(spec),
        "--handler",
        str(FUNCTIONS),
        "--export-path",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    war = tmp_path / "pipeline.war"
    assert result.stdout.strip() == str(war)
    with zipfile.ZipFile(war) as archive:
        names = set(archive.namelist())
        manifest = json.loads(archive.read("WAR-INF/MANIFEST.json"))
    assert names == {"workflow.yaml", FUNCTIONS.name, "WAR-INF/MANIFEST.json"}
    assert manifest["workflow"] == {
        "workflowName": "pipeline",
        "specFile": "workflow.yaml",
        "handler": FUNCTIONS.name,
    }
    again = run_ferry(
        "archive-workflow",
        "--workflow-name",
        "pipeline",
        "--spec-file",
        str(spec),
        "--handler",
        str(FUNCTIONS),
        "--export-path",
        str(tmp_path),
    )
    assert again.returncode == 2
    assert "already exists" in again.stderr and "--force" in again.stderr


def test_a_spec_naming_an_undefined_function_is_refused(tmp_path: Path) -> None:
    spec = tmp_path / "workflow.yaml"
    spec.write_text(PIPELINE_SPEC.replace("aggregate", "agregate"))
    result = run_ferry(
        "archive-workflow",
        "--workflow-name",
        "typo",
        "--spec-file",
        str(spec),
        "--handler",
        str(FUNCTIONS),
        "--export-path",
        str(tmp_path),
    )
    assert result.returncode == 2
    assert result.stderr.startswith("ferry archive-workflow: error: workflow.yaml: ")
    assert "agregate" in result.stderr
    assert not (tmp_path / "typo.war").exists()
