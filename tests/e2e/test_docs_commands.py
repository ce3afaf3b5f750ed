"""Every command block in README.md and docs/*.md runs as written on a fresh clone, or is
listed in ``SKIPPED`` with the reason it cannot run here.

A fenced ``bash``, ``sh`` or ``shell`` block is found by ``command_blocks``; each must match
exactly one entry of ``RUN`` or ``SKIPPED`` (by its page and a line it contains), so a new
block that is neither run nor listed fails ``test_every_command_block_is_run_or_skipped``.
``console`` blocks are transcripts (commands with their output): they are listed, never run.

A run block runs in a copy of the repository's ``examples/`` (the files a fresh clone has,
``.venv`` linked to this one), under ``bash -e -o pipefail``, against the server its page
tells the reader to start: ``make serve`` (the Makefile's ``serve`` recipe, run as it is
written there) or a ``ferry serve`` line of the block itself (which the reader runs in
another terminal; here in the background). Only the ports differ: the server takes free
ones from the documented variables (``FERRY_INFERENCE_ADDRESS``, ...), and the block's
``127.0.0.1:8080`` / ``8081`` / ``8082`` are rewritten to them. ``curl`` fails on an HTTP
error status here (``--fail-with-body``), as a reader would notice a 401 on screen. A comment
line ``# {...}`` or ``# [...]`` is the output the page promises: the block's output must hold
it, ``...`` standing for any text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.fixtures.models import save_torchscript
from tests.fixtures.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
SHELL_LANGUAGES = {"bash", "sh", "shell"}
TRANSCRIPT_LANGUAGES = {"console"}
BLOCK_TIMEOUT = 180.0
"""Seconds a block may run; only turns a hang into a failure."""
DOCUMENTED_PORTS = {"8080": "inference", "8081": "management", "8082": "metrics"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def command_blocks() -> list[Block]:
    """The fenced command blocks of README.md and docs/*.md, in page order."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    blocks = []
    for page in pages:
        lines = page.read_text().splitlines()
        index = 0
        while index < len(lines):
            opening = re.match(r"\s*(```+)(\S*)", lines[index])
            if opening is None:
                index += 1
                continue
            fence, language, start = opening.group(1), opening.group(2), index
            index += 1
            while index < len(lines) and not lines[index].strip().startswith(fence):
                index += 1
            if language in SHELL_LANGUAGES | TRANSCRIPT_LANGUAGES:
                body = "\n".join(lines[start + 1 : index])
                blocks.append(Block(str(page.relative_to(REPO)), start + 1, language, body))
            index += 1
    return blocks


# --- What each page asks of the reader before its block ------------------------------------


def own_model_files(work: Path) -> None:
    """The reader's own files that README's 'Serve your own model' names: a TorchScript
    classifier saved as resnet.pt (a small one stands in), its labels, a model-config.yaml
    and a photo."""
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 3),
    )
    save_torchscript(model.eval(), work / "resnet.pt")
    (work / "index_to_name.json").write_text(json.dumps({"0": "cat", "1": "dog", "2": "fox"}))
    (work / "model-config.yaml").write_text("minWorkers: 1\nimage_classifier:\n  topk: 3\n")
    Image.new("RGB", (320, 240), (200, 120, 40)).save(work / "kitten.jpg")


@dataclass(frozen=True)
class Run:
    """A block run as written; ``server``: ``"make serve"``, or ``"block"`` (a ``ferry
    serve`` line of the block), or ``""`` (none)."""

    page: str
    contains: str
    server: str
    env: dict[str, str] = field(default_factory=dict)
    """Variables the page tells the reader to set for the server."""
    prepare: Callable[[Path], None] | None = None
    """Writes the files the page says are the reader's own."""


@dataclass(frozen=True)
class Skip:
    page: str
    contains: str
    reason: str


RUN = (
    Run("README.md", "/predictions/shapes -T examples/demo/samples/star.png", "make serve"),
    Run("README.md", "--models resnet=resnet.mar", "block", prepare=own_model_files),
    Run(
        "docs/management.md",
        "/models/shapes?min_worker=2",
        "make serve",
        env={"FERRY_ENABLE_MODEL_API": "true"},
    ),
    Run("docs/workflows.md", "archive-workflow --workflow-name pipeline", "block"),
)

SKIPPED = (
    Skip(
        "README.md",
        "make serve",
        "sets up .venv (installs packages from the network) and starts the demo server: the "
        "README's next block runs against that server, started by the Makefile's serve "
        "recipe itself; `make test` is the whole suite",
    ),
    Skip(
        "README.md",
        "pip install torch --index-url",
        "installs from the network (PyPI, download.pytorch.org); tests/e2e/test_wheel.py "
        "installs the built wheel offline",
    ),
    Skip(
        "docs/bench.md",
        ".venv/bin/ferry bench profile",
        "long benchmarks (bench limit ~3 minutes, tune longer); tests/e2e/test_bench_*.py run "
        "each command on short settings",
    ),
    Skip(
        "docs/kserve.md",
        "podman run -d --name ferry-demo",
        "needs root, apt-get, podman and an image build (make image); "
        "tests/e2e/test_image.py runs it where podman is",
    ),
    Skip(
        "docs/kubernetes.md",
        "kubectl apply",
        "needs a Kubernetes cluster (kubectl); tests/unit/test_kubernetes_manifests.py checks "
        "the manifests",
    ),
    Skip(
        "docs/ray.md",
        "ray start --head",
        "starts a Ray cluster whose daemons outlive the block (ray stop), a few GB of memory; "
        "tests/e2e/test_ray.py serves the demo model with --ray",
    ),
)


def _entry_for(block: Block) -> list[Run | Skip]:
    return [e for e in (*RUN, *SKIPPED) if e.page == block.page and e.contains in block.text]


def test_every_command_block_is_run_or_skipped() -> None:
    blocks = command_blocks()
    unlisted = [str(b) for b in blocks if b.language in SHELL_LANGUAGES and not _entry_for(b)]
    assert not unlisted, f"command blocks neither run nor skipped with a reason: {unlisted}"
    twice = [str(b) for b in blocks if len(_entry_for(b)) > 1]
    assert not twice, f"blocks matched by several entries: {twice}"
    for entry in (*RUN, *SKIPPED):
        matches = [b for b in blocks if b.page == entry.page and entry.contains in b.text]
        assert len(matches) == 1, f"{entry} matches {len(matches)} blocks, not one"
    for skip in SKIPPED:
        assert skip.reason, skip


def test_the_workflow_page_shows_the_example_spec() -> None:
    """docs/workflows.md shows examples/workflows/workflow.yaml, the file its block uses."""
    page = (REPO / "docs/workflows.md").read_text()
    shown = re.search(r"```yaml\n# examples/workflows/workflow.yaml\n(.*?)```", page, re.S)
    assert shown is not None
    assert shown.group(1) == (REPO / "examples/workflows/workflow.yaml").read_text()


# --- Running a block -----------------------------------------------------------------------


def _block_of(entry: Run) -> Block:
    (block,) = [b for b in command_blocks() if b.page == entry.page and entry.contains in b.text]
    return block


def _fresh_clone(work: Path) -> None:
    """The repository's examples/ as a clone has them (tracked, plus new files not ignored),
    and this .venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "examples"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, work / name)
    (work / ".venv").symlink_to(VENV)


def _make_serve_recipe() -> str:
    """The command `make serve` runs (the Makefile's serve recipe, $(BIN) spelt out)."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^serve:.*\n\t(.+)$", makefile, re.M)
    assert recipe is not None, "no serve recipe in the Makefile"
    return recipe.group(1).replace("$(BIN)", ".venv/bin")


def _split_server(text: str) -> tuple[str, str, str]:
    """``text`` as (before, the ``ferry serve`` command, after); the command empty when the
    block starts no foreground server."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if re.match(r"(\.venv/bin/)?ferry serve\b", line) and "--st" not in line:
            end = index
            while lines[end].rstrip().endswith("\\"):
                end += 1
            server = "\n".join(lines[index : end + 1])
            return "\n".join(lines[:index]), server, "\n".join(lines[end + 1 :])
    return text, "", ""


@contextmanager
def _server(command: str, work: Path, env: dict[str, str]) -> Iterator[dict[str, str]]:
    """``command`` running in ``work`` on free ports; yields the documented port of each API
    mapped to its host:port here."""
    ready = work.parent / "ready.json"
    log_path = work.parent / "server.log"
    free = {
        "FERRY_INFERENCE_ADDRESS": "http://127.0.0.1:0",
        "FERRY_MANAGEMENT_ADDRESS": "http://127.0.0.1:0",
        "FERRY_METRICS_ADDRESS": "http://127.0.0.1:0",
        "FERRY_GRPC_INFERENCE_PORT": "0",
        "FERRY_GRPC_MANAGEMENT_PORT": "0",
        "FERRY_READY_FILE": str(ready),
    }
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=work,
            env={**os.environ, **env, **free},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until("the ready file", ready.exists, process=process, log=log_path)
        addresses = json.loads(ready.read_text())
        yield {port: addresses[api].split("://", 1)[1] for port, api in DOCUMENTED_PORTS.items()}
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _on_ports(text: str, ports: dict[str, str]) -> str:
    return re.sub(r"\b(?:127\.0\.0\.1|localhost):(808[0-2])\b", lambda m: ports[m.group(1)], text)


def _run_script(block: Block, text: str, work: Path) -> str:
    """Runs ``text`` (part of ``block``) in ``work``; its output."""
    shims = work.parent / "bin"
    shims.mkdir(exist_ok=True)
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    (shims / "curl").write_text(f'#!/bin/sh\nexec {curl} --fail-with-body "$@"\n')
    (shims / "curl").chmod(0o755)
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", text],
        cwd=work,
        env={**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT,
    )
    assert result.returncode == 0, f"{block} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def expected_outputs(text: str) -> list[str]:
    """The outputs a block promises: its comment lines that are a JSON value."""
    return [m.group(1) for m in re.finditer(r"^# ([\[{].*)$", text, re.M)]


def _assert_shows(output: str, promised: list[str]) -> None:
    position = 0
    for shown in promised:
        pattern = re.escape(shown).replace(re.escape("..."), ".*?")
        found = re.compile(pattern).search(output, position)
        assert found is not None, f"output lacks {shown!r} (after {position}):\n{output}"
        position = found.end()


@pytest.mark.e2e
@pytest.mark.parametrize("entry", RUN, ids=[f"{e.page}:{e.contains}" for e in RUN])
def test_command_block_runs_as_written(entry: Run, tmp_path: Path) -> None:
    block = _block_of(entry)
    work = tmp_path / "clone"
    work.mkdir()
    _fresh_clone(work)
    if entry.prepare is not None:
        entry.prepare(work)
    before, server, after = _split_server(block.text)
    if entry.server == "make serve":
        assert not server, f"{block} starts its own server"
        server, before, after = _make_serve_recipe(), "", before
    assert bool(server) == bool(entry.server), f"{block}: server {entry.server!r}"
    output = _run_script(block, before, work) if before else ""
    if server:
        with _server(server, work, entry.env) as ports:
            output += _run_script(block, _on_ports(after, ports), work)
    _assert_shows(output, expected_outputs(block.text))
