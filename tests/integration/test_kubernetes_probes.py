"""The probes of deploy/kubernetes/deployment.yaml, asked of a real server.

Token authorization is on, as in the Deployment, so the probes carry no key. While a
start-up model is still loading (its handler waits on a FIFO the test opens), the liveness
path answers 200 and the readiness path 503, though another start-up model is up; once it
has loaded, both 200; from SIGTERM on, during the drain, readiness 503 again while
liveness stays 200, and the server exits 0 within the Deployment's grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ferry.store.writer import ArchiveSpec, write_archive
from tests.fixtures.cli import FERRY, serve_args
from tests.fixtures.gate import release
from tests.fixtures.k8s_manifests import deployment, ferry_container
from tests.fixtures.models import HANDLERS, handler_archive, write_config
from tests.fixtures.polling import wait_until
from tests.fixtures.torchserve import free_port

pytestmark = pytest.mark.integration

DRAIN_DELAY = "5"
"""Shorter than the Deployment's: long enough to look at the probes during the drain."""


def _gated_archive(store: Path, gate: Path) -> str:
    """A model whose loading lasts until the test writes to the FIFO ``gate/release``."""
    scratch = store.parent / "gated-src"
    scratch.mkdir()
    config = {"minWorkers": 1, "handler": {"gate": str(gate / "release")}}
    spec = ArchiveSpec(
        model_name="gated",
        handler=str(HANDLERS / "gated_loading_handler.py"),
        config_file=write_config(scratch, config),
    )
    return write_archive(spec, store, force=True).name


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``ferry serve`` with token authorization on, its one start-up model still loading:
    (the process, its inference URL, its log)."""
    store, gate = tmp_path / "store", tmp_path / "gate"
    store.mkdir()
    gate.mkdir()
    os.mkfifo(gate / "release")
    url = f"http://127.0.0.1:{free_port()}"
    args = serve_args(
        store,
        "--models",
        f"gated={_gated_archive(store, gate)}",
        f"fast={handler_archive(store, 'fast', 'digest_handler.py')}",
        "--key-file",
        str(tmp_path / "key_file.json"),
        "--drain-delay",
        DRAIN_DELAY,
        inference=url,
    )
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        process = subprocess.Popen([*FERRY, *args], stdout=output, stderr=subprocess.STDOUT)
    try:
        yield process, url, log
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)


def _status(url: str) -> int | None:
    """The path's status code; None while nothing listens."""
    try:
        return httpx.get(url, timeout=10).status_code
    except httpx.TransportError:
        return None


def test_readiness_waits_for_the_models_and_turns_503_on_sigterm_liveness_does_not(
    server: tuple[subprocess.Popen[bytes], str, Path], tmp_path: Path
) -> None:
    process, url, log = server
    container = ferry_container()
    live = url + container["livenessProbe"]["httpGet"]["path"]
    ready = url + container["readinessProbe"]["httpGet"]["path"]
    assert (
        container["startupProbe"]["httpGet"]["path"]
        == container["livenessProbe"]["httpGet"]["path"]
    )

    wait_until("the listeners to open", lambda: _status(live) == 200, process=process, log=log)
    # One start-up model is up, the other still loading: not ready (it said ready here,
    # /ping's "Partial Healthy", before issue 48's image test caught it).
    fast_up = "fast v1.0 worker 0 ready"
    wait_until("the other model to load", lambda: fast_up in log.read_text(), process=process)
    assert _status(ready) == 503  # the model is still loading: no traffic yet
    release(tmp_path / "gate", waiting=lambda: process.poll() is None)
    wait_until("the model to load", lambda: _status(ready) == 200, process=process, log=log)
    assert _status(live) == 200

    process.send_signal(signal.SIGTERM)
    wait_until("readiness to turn 503", lambda: _status(ready) == 503, process=process, log=log)
    assert _status(live) == 200  # draining: still serving, not to be restarted
    grace = deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert process.wait(timeout=grace) == 0
