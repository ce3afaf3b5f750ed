"""The GPU kit's pieces without a GPU or an index: the runner's budgets and verdicts, the
parts' limits, and the wheel set derived from Ferry's requirements (issue 49)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_kit import wheels
from benchmarks.gpu_kit.parts import (
    INSTALL_BUDGET,
    RESULT_FILES_LIMIT,
    SUMMARY_FILES,
    TOTAL,
    kit_parts,
)
from benchmarks.gpu_kit.preflight import CARRIED_MODULES, check_requirements
from benchmarks.gpu_kit.runner import Outcome, Part, descendants, run_part, run_parts

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def python_part(name: str, code: str, budget: float = 30, result: str | None = None) -> Part:
    return Part(name, (sys.executable, "-c", code, "{result}"), budget, result)


def test_a_part_that_passes_skips_or_fails_says_so_by_its_last_line(tmp_path: Path) -> None:
    log = io.StringIO()
    cases = {
        "print('figures'); print('PASS: 3 of 3')": ("PASS", "3 of 3"),
        "import sys; print('SKIP: no CUDA GPU here'); sys.exit(2)": ("SKIP", "no CUDA GPU here"),
        "import sys; print('FAIL: 1 check failed'); sys.exit(1)": (
            "FAIL",
            "exit 1: 1 check failed",
        ),
        "raise RuntimeError('boom')": ("FAIL", "exit 1: RuntimeError: boom"),
    }
    for code, (status, reason) in cases.items():
        outcome = run_part(python_part("p", code), tmp_path, tmp_path, ENV, log, 30)
        assert (outcome.status, outcome.reason) == (status, reason)
    assert "PASS: 3 of 3" in log.getvalue()  # every line reaches the log


def test_an_overrunning_part_is_killed_with_its_whole_tree(tmp_path: Path) -> None:
    """Children in the part's group and one in a session of its own all go."""
    pids = tmp_path / "pids"
    code = f"""
import os, subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
a = subprocess.Popen(sleeper)
b = subprocess.Popen(sleeper, start_new_session=True)
open({str(pids)!r}, "w").write(f"{{a.pid}} {{b.pid}}")
print("started", flush=True)
time.sleep(600)
"""
    start = time.monotonic()
    outcome = run_part(python_part("slow", code), tmp_path, tmp_path, ENV, io.StringIO(), 10)
    assert outcome.status == "TIMEOUT"
    assert "started" in outcome.reason
    assert time.monotonic() - start < 25
    for pid in map(int, pids.read_text().split()):
        assert not _alive(pid), f"{pid} outlived its part"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_parts_run_in_order_each_page_copied_and_the_total_respected(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    write_page = "import sys; open(sys.argv[1], 'w').write('page'); print('PASS: wrote')"
    parts = [
        python_part("first", write_page, result="first.md"),
        python_part("slow", "import time; time.sleep(60)", budget=60),
        python_part("late", write_page, result="late.md"),
    ]
    seen: list[list[str]] = []

    def summary(done: list[Outcome]) -> None:
        seen.append([outcome.status for outcome in done])

    outcomes = run_parts(parts, tmp_path, out, ENV, 12, summary)
    assert [o.status for o in outcomes] == ["PASS", "TIMEOUT", "NOT RUN"]
    assert seen == [["PASS"], ["PASS", "TIMEOUT"], ["PASS", "TIMEOUT", "NOT RUN"]]
    assert (out / "first.md").read_text() == "page"
    assert not (out / "late.md").exists()
    assert "===== slow" in (out / "kit.log").read_text()


def test_an_inline_part_s_page_goes_into_kit_md_not_a_file_of_its_own(tmp_path: Path) -> None:
    from benchmarks.gpu_kit.__main__ import summarise

    out = tmp_path / "out"
    out.mkdir()
    write = (
        "import sys; open(sys.argv[1], 'w').write('# Title\\nversions: x 1.0'); print('PASS: ok')"
    )
    parts = [
        dataclasses.replace(python_part("env", write, result="env.md"), inline=True),
        python_part("own", write, result="own.md"),
    ]
    outcomes = run_parts(parts, tmp_path, out, ENV, 60, lambda done: None)
    summarise(out, "test", parts, outcomes)
    assert sorted(path.name for path in out.iterdir()) == ["kit.log", "kit.md", "own.md"]
    summary = (out / "kit.md").read_text()
    assert "| env | PASS |" in summary and "| below |" in summary
    assert "## env\nversions: x 1.0" in summary  # its own title dropped
    assert "# Title" not in summary


def test_descendants_finds_grandchildren() -> None:
    assert os.getpid() in descendants(os.getppid())


def test_the_parts_fit_the_device_window_and_its_eight_files() -> None:
    parts = kit_parts("python3", "/tmp/site")
    assert len({part.name for part in parts}) == len(parts)
    assert INSTALL_BUDGET + sum(part.budget for part in parts) <= TOTAL <= 9 * 60
    pages = [part.result for part in parts if part.result and not part.inline]
    assert len(set(pages)) == len(pages)
    assert len(pages) + len(SUMMARY_FILES) <= RESULT_FILES_LIMIT
    assert not set(pages) & set(SUMMARY_FILES)
    for part in parts:  # every part writes its page where the runner looks for it
        assert "{result}" in part.argv


def test_the_wheel_set_is_what_ferry_needs_less_what_the_device_has() -> None:
    needed = wheels.requirement_names(wheels.ferry_requirements(), wheels.DEVICE_MARKERS)
    missing = set(needed) - wheels.device_packages()
    assert missing == {"starlette", "uvicorn", "httptools", "python-multipart"}
    assert missing == set(CARRIED_MODULES)  # preflight knows where each is imported from


def test_requirement_markers_are_read_for_the_device_and_extras_are_not_followed() -> None:
    lines = [
        "uvicorn[standard]>=0.29",
        "typing-extensions>=4.10; python_version < '3.12'",
        "exceptiongroup; python_version < '3.13'",
        "websockets>=10; extra == 'standard'",
    ]
    names = wheels.requirement_names(lines, wheels.DEVICE_MARKERS)
    assert names == ["uvicorn", "exceptiongroup"]


def test_names_are_compared_as_pypi_normalises_them() -> None:
    assert wheels.canonical("Typing_Extensions") == "typing-extensions"
    assert wheels.canonical("python.multipart") == "python-multipart"
    assert {"typing-extensions", "anyio", "h11", "click", "uvloop"} <= wheels.device_packages()


def test_a_changed_or_missing_wheel_stops_the_run(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    wheel = tmp_path / "wheels" / "demo-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    described = wheels.describe(wheel, "demo", "1.0")
    manifest = {"python": "3.12", "wheels": [dataclasses.asdict(described)]}
    (tmp_path / wheels.MANIFEST).write_text(json.dumps(manifest))
    assert wheels.read_manifest(tmp_path) == [described]
    wheel.write_bytes(b"changed")
    with pytest.raises(SystemExit, match="missing or changed"):
        wheels.read_manifest(tmp_path)


def test_the_preflight_finds_a_kit_without_a_wheel_ferry_needs() -> None:
    """The dry run's proof: with uvicorn left out of the kit, the preflight says so even
    where this machine has it installed."""
    carried = {"starlette": "1.10.0", "httptools": "0.9.0", "python-multipart": "0.0.34"}
    problems = check_requirements(carried)
    assert problems == ["ferry needs uvicorn: the kit does not carry it, the device lacks it"]
    assert check_requirements({**carried, "uvicorn": "0.54.0"}) == []
    too_new = check_requirements({**carried, "uvicorn": "0.99.0"})
    assert len(too_new) == 1 and "uvicorn 0.99.0 is here" in too_new[0]
