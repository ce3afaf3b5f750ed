"""Start a fresh model server for one configuration: Ferry, or TorchServe when installed.

Both read the same config.properties, whose ``models`` JSON sets the batch size, batch
delay and workers, so one spec drives either server.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from ferry.store.archive import open_model


@dataclass(frozen=True)
class ServerConfig:
    batch_size: int
    max_batch_delay: int
    workers: int
    precision: str = "fp32"
    """Ferry's ``optimization: precision``; other values than fp32 serve a patched copy."""
    batch_policy: str | None = None
    """Ferry's ``batchPolicy`` (None: the archive's, else adaptive)."""
    cpu_pinning: bool = False
    """Ferry's ``cpu_pinning`` setting (TorchServe is started without it)."""


@dataclass(frozen=True)
class StartedServer:
    inference_url: str
    metrics_url: str | None
    log_path: Path
    pid: int
    """The server's main process (its workers are its descendants)."""


def free_port() -> int:
    # TorchServe cannot report a port it picked itself, so ask the OS for one first.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def model_identity(model: Path) -> tuple[str, str]:
    """The model's name and version, from its manifest."""
    with tempfile.TemporaryDirectory() as work:
        archive = open_model(model.parent, model.name, Path(work))
        return archive.name, archive.version


def model_config_document(model: Path) -> dict[str, Any]:
    """The model's own model-config.yaml, as a dict (empty when it has none)."""
    with tempfile.TemporaryDirectory() as work:
        return copy.deepcopy(dict(open_model(model.parent, model.name, Path(work)).config.raw))


def copy_with_config(model: Path, target: Path, update: Callable[[dict[str, Any]], None]) -> Path:
    """A folder copy of the model at ``target`` whose model-config.yaml is the archive's
    own, changed by ``update`` (every other key kept)."""
    with tempfile.TemporaryDirectory() as work:
        archive = open_model(model.parent, model.name, Path(work))
        shutil.copytree(archive.model_dir, target, dirs_exist_ok=True)
    config_name = archive.manifest.config_file or "model-config.yaml"
    document = copy.deepcopy(dict(archive.config.raw))
    update(document)
    (target / config_name).write_text(yaml.safe_dump(document, sort_keys=False))
    if archive.manifest.config_file is None:
        manifest_path = target / "MAR-INF" / "MANIFEST.json"
        manifest = json.loads(manifest_path.read_text())
        manifest["model"]["configFile"] = config_name
        manifest_path.write_text(json.dumps(manifest))
    return target


def with_precision(model: Path, precision: str, store: Path) -> Path:
    """A folder copy of the model whose model-config.yaml asks for ``precision``."""
    name, _ = model_identity(model)

    def set_precision(document: dict[str, Any]) -> None:
        document["optimization"] = {**(document.get("optimization") or {}), "precision": precision}

    return copy_with_config(model, store / f"{name}-{precision}", set_precision)


def zip_folder(folder: Path, archive: Path) -> Path:
    """``folder``'s files as a ``.mar`` (a zip, paths relative to the folder)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as out:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                out.write(path, path.relative_to(folder).as_posix())
    return archive


def write_config(folder: Path, model: Path, config: ServerConfig, ports: dict[str, int]) -> Path:
    name, version = model_identity(model)
    models = {
        name: {
            version: {
                "marName": model.name,
                "minWorkers": config.workers,
                "maxWorkers": config.workers,
                "batchSize": config.batch_size,
                "maxBatchDelay": config.max_batch_delay,
                "responseTimeout": 300,
                "defaultVersion": True,
                **({"batchPolicy": config.batch_policy} if config.batch_policy else {}),
            }
        }
    }
    lines = [
        f"inference_address=http://127.0.0.1:{ports['inference']}",
        f"management_address=http://127.0.0.1:{ports['management']}",
        f"metrics_address=http://127.0.0.1:{ports['metrics']}",
        # Both servers' gRPC APIs would take 7070/7071: free ports keep them apart.
        f"grpc_inference_port={ports['grpc_inference']}",
        f"grpc_management_port={ports['grpc_management']}",
        f"model_store={model.parent}",
        f"load_models={model.name}",
        f"models={json.dumps(models)}",
        "disable_token_authorization=true",
        "job_queue_size=1000",
        *(["cpu_pinning=true"] if config.cpu_pinning else []),
    ]
    path = folder / "config.properties"
    path.write_text("\n".join(lines) + "\n")
    return path


class ServerFailed(RuntimeError):
    """A server for one configuration did not start; the message says why."""


def server_environment() -> dict[str, str]:
    """This process's environment less ``FERRY_*`` and ``TS_*`` settings, which would
    override the configuration written for the child server."""
    return {
        key: value for key, value in os.environ.items() if not key.startswith(("FERRY_", "TS_"))
    }


def log_reason(log_path: Path, lines: int = 3) -> str:
    """The last lines of a server's log that name an error (else its last lines)."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    meaningful = [line.strip() for line in text if line.strip()]
    errors = [line for line in meaningful if "error" in line.lower() or "Error" in line]
    chosen = (errors or meaningful)[-lines:]
    return " | ".join(line[:200] for line in chosen) or "empty log"


def _wait_healthy(
    url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerFailed(
                f"server exited with {process.returncode}: {log_reason(log_path)} (log: {log_path})"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ping", timeout=2).status_code == 200:
                return
        time.sleep(0.2)  # polling the health endpoint of a starting server
    raise ServerFailed(f"server not healthy within {timeout:.0f}s (log: {log_path})")


@contextlib.contextmanager
def start_server(
    kind: str, model: Path, config: ServerConfig, folder: Path
) -> Iterator[StartedServer]:
    """``kind`` is ``ferry`` or ``torchserve``; the server is stopped on exit. A server
    that does not start raises ``ServerFailed`` with the reason its log gives."""
    folder = folder.resolve()  # the server runs in it: a relative path would not resolve
    model = model.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if config.precision != "fp32":
        if kind != "ferry":
            raise ServerFailed("a precision other than fp32 is a Ferry setting")
        model = with_precision(model, config.precision, folder / "model")
    for attempt in range(1, PORT_ATTEMPTS + 1):
        ports = {api: free_port() for api in APIS}
        process, url = _launch(kind, model, config, folder, ports)
        try:
            _wait_healthy(url, process, folder / "server.log", timeout=300)
            break
        except ServerFailed as failed:
            stop_group(process)
            # A free port is only free until the server binds it: another process may
            # take it first. Pick others and start again (a few times at most).
            if "already in use" not in str(failed).lower() or attempt == PORT_ATTEMPTS:
                raise
        except BaseException:
            stop_group(process)
            raise
    try:
        metrics = f"http://127.0.0.1:{ports['metrics']}/metrics" if kind == "ferry" else None
        yield StartedServer(url, metrics, folder / "server.log", process.pid)
    finally:
        stop_group(process)


APIS = ("inference", "management", "metrics", "grpc_inference", "grpc_management")
PORT_ATTEMPTS = 3


def _launch(
    kind: str, model: Path, config: ServerConfig, folder: Path, ports: dict[str, int]
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``kind`` on ``ports`` in ``folder``; the process and its inference URL."""
    properties = write_config(folder, model, config, ports)
    log_path = folder / "server.log"
    if kind == "ferry":
        argv = [
            sys.executable,
            "-m",
            "ferry",
            "serve",
            "--ts-config",
            str(properties),
            "--access-log",
            "false",
        ]
    elif kind == "torchserve":
        # TORCHSERVE_BIN_DIR: the bin folder of a virtual environment holding TorchServe.
        executable = shutil.which("torchserve", path=os.environ.get("TORCHSERVE_BIN_DIR"))
        if executable is None:
            raise ServerFailed(
                "torchserve not found: run `bash scripts/torchserve-venv.sh` and set "
                "TORCHSERVE_BIN_DIR=.venv-torchserve/bin"
            )
        argv = [
            # Absolute: the server starts in its own folder, where a relative path fails.
            os.path.abspath(executable),
            "--start",
            "--foreground",
            "--ncs",
            "--ts-config",
            str(properties),
            "--model-store",
            str(model.parent),
        ]
    else:
        raise ValueError(f"unknown server {kind!r}")
    # TorchServe starts its Python workers with the `python` on PATH: make it the one
    # from TorchServe's own environment.
    path = f"{Path(argv[0]).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            env={**server_environment(), "PATH": path},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=folder,
            start_new_session=True,
        )
    return process, f"http://127.0.0.1:{ports['inference']}"


def stop_group(process: subprocess.Popen[bytes], grace: float = 60.0) -> None:
    """Stop the server and every process it started (TorchServe's JVM and workers), and
    wait until they are gone: TorchServe refuses to start while another is running."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)  # polling for the process group to disappear
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()
