"""Model formats of the PyTorch 2 era side by side: TorchScript, a ``torch.export``
program, ``torch.compile`` and an AOTInductor package, for ResNet-18 and ResNet-50
(``examples/models/resnet.py``, random weights), on this machine's CPU.

- Offline, the model alone in this process: images/s at the best of batch sizes 1, 4, 8
  and 16 and the median latency of one image, in rounds that alternate the formats.
- Served by ``ferry serve`` (the built-in ``image_classifier`` on 224x224 JPEGs, one
  worker, batches of up to 8 within 10 ms): requests/s at 16 clients (rounds alternating
  the four servers); the time from starting the server to its first answer; a second
  worker's start (a scale-up: ``torch.compile`` loads the first worker's compiled graphs
  from the model's cache); a restarted worker's start (its process killed).
- AOTInductor's compile time is ``ferry archive --aot-inductor``'s, run as a user runs it;
  the offline rows load that same package.

Writes ``benchmarks/results/model_formats.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import ROOT, closed_loop, jpeg_inputs, machine_description, publish
from examples.models.resnet import resnet18, resnet50
from ferry.handlers.builtin.aot_package import load_aoti_package
from ferry.store.writer import ArchiveSpec, write_archive
from ferry.worker.torch_setup import SPARE_READY
from ferry_bench.servers import free_port

FORMATS = ("TorchScript", "torch.export", "torch.compile", "AOTInductor")
MODELS: dict[str, Callable[[], torch.nn.Module]] = {"ResNet-18": resnet18, "ResNet-50": resnet50}
BATCH_SIZES = (1, 4, 8, 16)
SERVED_BATCH = 8
ROUNDS = 2
SECONDS = 3.0
"""Per offline point and round."""
CLIENTS = 16
SERVED_REQUESTS = {"ResNet-18": 240, "ResNet-50": 100}
MODEL_SOURCE = """
from examples_resnet import BasicBlock, Bottleneck, ResNet


class Model(ResNet):
    def __init__(self):
        super().__init__({block}, {layers})
"""
"""The archive's model file: the ResNet of examples/models/resnet.py (beside it)."""
ARCHITECTURES = {
    "ResNet-18": ("BasicBlock", [2, 2, 2, 2]),
    "ResNet-50": ("Bottleneck", [3, 4, 6, 3]),
}


@dataclass
class Figures:
    offline: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """images/s by format and batch size, one per round."""
    lone_ms: dict[str, list[float]] = field(default_factory=dict)
    served: dict[str, list[float]] = field(default_factory=dict)
    first_answer_s: dict[str, float] = field(default_factory=dict)
    second_worker_s: dict[str, float] = field(default_factory=dict)
    restarted_worker_s: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    """Offline torch.compile's first call, and ferry archive --aot-inductor."""
    max_difference: dict[str, float] = field(default_factory=dict)


def _sources(name: str, folder: Path) -> tuple[Path, Path, Path, Path]:
    """The model file (eager) and state dict, its TorchScript trace and its export program."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    block, layers = ARCHITECTURES[name]
    (folder / "examples_resnet.py").write_text((ROOT / "examples/models/resnet.py").read_text())
    model_file = folder / "model.py"
    model_file.write_text(MODEL_SOURCE.format(block=block, layers=layers))
    weights = folder / "weights.pt"
    torch.save(model.state_dict(), weights)
    example = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        scripted = folder / "model.torchscript.pt"
        torch.jit.trace(model, example).save(str(scripted))  # type: ignore[no-untyped-call]
        batch = torch.export.Dim("batch", min=1, max=16)
        program = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    exported = folder / "model.export.pt2"
    torch.export.save(program, str(exported))
    return model_file, weights, scripted, exported


def _config(folder: Path, compiled: bool) -> Path:
    lines = [f"batchSize: {SERVED_BATCH}", "maxBatchDelay: 10", "startupTimeout: 1800"]
    if compiled:
        lines += [
            "optimization:",
            "  compile: default",
            "  batch_buckets: [1, 4, 8]",
            "  warmup:",
            "    input_shape: [3, 224, 224]",
            "    batch_sizes: [1, 4, 8]",
        ]
    path = folder / f"model-config{'-compiled' if compiled else ''}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _archives(name: str, work: Path, store: Path, figures: Figures) -> dict[str, str]:
    """Each format's archive in ``store``, by format."""
    model_file, weights, scripted, exported = _sources(name, work / "src")
    plain, compiled = _config(work, False), _config(work, True)
    slug = name.lower().replace("-", "")
    specs = {
        "TorchScript": ArchiveSpec(f"{slug}-ts", "image_classifier", serialized_file=scripted),
        "torch.export": ArchiveSpec(f"{slug}-export", "image_classifier", serialized_file=exported),
        "torch.compile": ArchiveSpec(
            f"{slug}-compile",
            "image_classifier",
            serialized_file=weights,
            model_file=model_file,
            extra_files=(work / "src" / "examples_resnet.py",),
            config_file=compiled,
        ),
    }
    names = {}
    for fmt, spec in specs.items():
        if fmt != "torch.compile":
            spec = ArchiveSpec(**{**spec.__dict__, "config_file": plain})
        names[fmt] = write_archive(spec, store, force=True).name
    started = time.monotonic()
    names["AOTInductor"] = _aot_archive(slug, work, store, model_file, weights, plain)
    figures.compile_s[f"{name} | AOTInductor"] = time.monotonic() - started
    return names


def _aot_archive(
    slug: str, work: Path, store: Path, model_file: Path, weights: Path, config: Path
) -> str:
    """``ferry archive --aot-inductor``, as a user runs it."""
    argv = [
        sys.executable,
        "-m",
        "ferry",
        "archive",
        "--model-name",
        f"{slug}-aoti",
        "--handler",
        "image_classifier",
        "--model-file",
        str(model_file),
        "--serialized-file",
        str(weights),
        "--extra-files",
        str(work / "src" / "examples_resnet.py"),
        "--config-file",
        str(config),
        "--aot-inductor",
        "--input-shape",
        "3,224,224",
        "--max-batch",
        str(max(BATCH_SIZES)),
        "--export-path",
        str(store),
        "--force",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ferry archive --aot-inductor failed: {done.stderr}")
    print(done.stderr.strip(), flush=True)
    return f"{slug}-aoti.mar"


def _offline_models(name: str, work: Path, store: Path, figures: Figures) -> dict[str, Any]:
    """Each format loaded in this process, ready to call."""
    _, _, scripted, exported = _sources(name, work / "offline-src")
    torch.manual_seed(0)
    eager = MODELS[name]().eval()
    loaded: dict[str, Any] = {
        "TorchScript": torch.jit.load(str(scripted)),  # type: ignore[no-untyped-call]
        "torch.export": torch.export.load(str(exported)).module(),
    }
    compiled = torch.compile(eager)
    started = time.monotonic()
    with torch.inference_mode():
        for size in BATCH_SIZES:  # every shape compiled before timing
            compiled(torch.randn(size, 3, 224, 224))
    figures.compile_s[f"{name} | torch.compile"] = time.monotonic() - started
    loaded["torch.compile"] = compiled
    package = work / "offline-aoti.pt2"
    slug = name.lower().replace("-", "")
    with zipfile.ZipFile(store / f"{slug}-aoti.mar") as archive:
        package.write_bytes(archive.read(f"{slug}-aoti.pt2"))
    loaded["AOTInductor"] = load_aoti_package(package, torch.device("cpu"))
    check = torch.randn(4, 3, 224, 224)
    with torch.inference_mode():
        expected = eager(check)
        for fmt, model in loaded.items():
            difference = (model(check) - expected).abs().max().item()
            figures.max_difference[f"{name} | {fmt}"] = difference
    return loaded


def _offline_round(name: str, loaded: dict[str, Any], figures: Figures, index: int) -> None:
    order = list(FORMATS) if index % 2 == 0 else list(reversed(FORMATS))
    for fmt in order:
        model = loaded[fmt]
        key = f"{name} | {fmt}"
        with torch.inference_mode():
            for size in BATCH_SIZES:
                batch = torch.randn(size, 3, 224, 224)
                model(batch)  # warm
                calls, started = 0, time.perf_counter()
                while time.perf_counter() - started < SECONDS or calls < 3:
                    model(batch)
                    calls += 1
                rate = calls * size / (time.perf_counter() - started)
                figures.offline.setdefault(key, {}).setdefault(size, []).append(rate)
            lone = []
            one = torch.randn(1, 3, 224, 224)
            for _ in range(20):
                started = time.perf_counter()
                model(one)
                lone.append((time.perf_counter() - started) * 1000)
            figures.lone_ms.setdefault(key, []).append(statistics.median(lone))
        best = max(statistics.median(v) for v in figures.offline[key].values())
        print(f"offline {key}: best {best:.1f} images/s", flush=True)


@dataclass
class Served:
    inference: str
    management: str
    process: subprocess.Popen[bytes]
    model: str
    log: Path


@contextmanager
def _serve(store: Path, archive: str, folder: Path, figures: Figures, key: str) -> Iterator[Served]:
    """``ferry serve`` on ``archive``; the seconds to its first answer noted."""
    folder.mkdir(parents=True, exist_ok=True)
    ready = folder / "ready.json"
    model = archive.removesuffix(".mar")
    argv = [
        sys.executable,
        "-m",
        "ferry",
        "serve",
        "--model-store",
        str(store),
        "--models",
        f"{model}={archive}",
        "--inference-address",
        f"http://127.0.0.1:{free_port()}",
        "--management-address",
        f"http://127.0.0.1:{free_port()}",
        "--metrics-address",
        f"http://127.0.0.1:{free_port()}",
        "--enable-grpc",
        "false",  # its fixed ports would clash between the four servers
        "--disable-token-auth",
        "--ready-file",
        str(ready),
    ]
    environment = {**os.environ, "TMPDIR": str(folder)}
    environment.pop("TORCHINDUCTOR_CACHE_DIR", None)  # each server compiles into its own
    started = time.monotonic()
    with open(folder / "server.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=environment)
    try:
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(f"ferry serve failed: see {folder / 'server.log'}")
            time.sleep(0.2)  # polling for the ready file of a starting server
        urls = json.loads(ready.read_text())
        log_path = folder / "server.log"
        served = Served(urls["inference"], urls["management"], process, model, log_path)
        image = jpeg_inputs(1, 224)[0]
        while (
            httpx.post(f"{served.inference}/predictions/{model}", content=image).status_code != 200
        ):
            time.sleep(0.2)
        figures.first_answer_s[key] = time.monotonic() - started
        print(f"{key}: first answer after {figures.first_answer_s[key]:.1f} s", flush=True)
        yield served
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)


def _wait_for_log_lines(served: Served, text: str, count: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while served.log.read_text(errors="replace").count(text) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {count} lines {text!r} in {served.log}")
        time.sleep(0.2)  # polling the server's log


def _workers(served: Served) -> list[dict[str, Any]]:
    described = httpx.get(f"{served.management}/models/{served.model}", timeout=60).json()
    workers: list[dict[str, Any]] = described[0]["workers"]
    return workers


def _second_and_restarted(served: Served, figures: Figures, key: str) -> None:
    started = time.monotonic()
    response = httpx.put(
        f"{served.management}/models/{served.model}",
        params={"min_worker": 2, "max_worker": 2, "synchronous": "true"},
        timeout=1800,
    )
    response.raise_for_status()
    figures.second_worker_s[key] = time.monotonic() - started
    if key.endswith("torch.compile"):
        # Steady state: the spare process started after each worker (two by now) has
        # imported torch's compiler, as it has long before a crash in service.
        _wait_for_log_lines(served, SPARE_READY, 2)
    victim = _workers(served)[-1]["pid"]
    started = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while True:
        workers = _workers(served)
        pids = {w["pid"] for w in workers if w["status"] == "READY"}
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(0.2)  # polling describe for the replacement
    figures.restarted_worker_s[key] = time.monotonic() - started
    print(
        f"{key}: second worker {figures.second_worker_s[key]:.1f} s, restarted "
        f"{figures.restarted_worker_s[key]:.1f} s",
        flush=True,
    )


def _served(name: str, store: Path, archives: dict[str, str], work: Path, figures: Figures) -> None:
    images = jpeg_inputs(16, 224)
    with ExitStack() as stack:
        servers = {
            fmt: stack.enter_context(
                _serve(store, archives[fmt], work / f"serve-{fmt}", figures, f"{name} | {fmt}")
            )
            for fmt in FORMATS
        }
        requests = SERVED_REQUESTS[name]
        for index in range(ROUNDS):
            order = list(FORMATS) if index % 2 == 0 else list(reversed(FORMATS))
            for fmt in order:
                url = f"{servers[fmt].inference}/predictions/{servers[fmt].model}"
                result = closed_loop(url, images, CLIENTS, requests)
                figures.served.setdefault(f"{name} | {fmt}", []).append(result.throughput)
                print(f"served {name} | {fmt}: {result.throughput:.1f} req/s", flush=True)
        for fmt in FORMATS:
            _second_and_restarted(servers[fmt], figures, f"{name} | {fmt}")


def write(figures: Figures, models: list[str]) -> None:
    lines = [
        "# Model formats: TorchScript, torch.export, torch.compile, AOTInductor",
        "",
        f"Machine: {machine_description()}.",
        "Command: `python benchmarks/model_formats.py` (one run). Random-weight ResNets "
        "(`examples/models/resnet.py`). Offline: the model alone in one process, "
        f"{torch.get_num_threads()} torch threads, images/s at the best of batch sizes "
        f"{', '.join(map(str, BATCH_SIZES))} and the median latency of one image, medians of "
        f"{ROUNDS} rounds alternating the formats. Served: `ferry serve`, the built-in "
        f"`image_classifier` on 224x224 JPEGs, one worker, batches of up to {SERVED_BATCH} "
        f"within 10 ms, {CLIENTS} clients, medians of {ROUNDS} rounds alternating the four "
        "servers. torch.compile: `optimization: compile: default`, warmed up at batch sizes "
        "1, 4 and 8 (`batch_buckets`), its workers sharing the model's compile cache. "
        "AOTInductor: `ferry archive --aot-inductor --max-batch 16`, compiled once.",
        "",
    ]
    for name in models:
        ts = f"{name} | TorchScript"
        ts_best = max(statistics.median(v) for v in figures.offline[ts].values())
        ts_served = statistics.median(figures.served[ts])
        lines += [
            f"## {name}",
            "",
            "| format | offline images/s (best batch) | against TorchScript | offline p50, 1 image "
            "(ms) | served req/s | against TorchScript | compile (s) | first answer after "
            "start (s) | second worker ready (s) | restarted worker ready (s) | max abs "
            "difference from eager |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for fmt in FORMATS:
            key = f"{name} | {fmt}"
            sizes = figures.offline[key]
            best_size = max(sizes, key=lambda size: statistics.median(sizes[size]))
            best = statistics.median(sizes[best_size])
            served = statistics.median(figures.served[key])
            compile_s = figures.compile_s.get(key)
            lines.append(
                f"| {fmt} | {best:.1f} (batch {best_size}) | {best / ts_best:.2f} "
                f"| {statistics.median(figures.lone_ms[key]):.1f} | {served:.1f} "
                f"| {served / ts_served:.2f} | {f'{compile_s:.0f}' if compile_s else '-'} "
                f"| {figures.first_answer_s[key]:.1f} | {figures.second_worker_s[key]:.1f} "
                f"| {figures.restarted_worker_s[key]:.1f} "
                f"| {figures.max_difference[key]:.1e} |"
            )
        lines.append("")
        lines += _compiled_once(figures, name)
    lines += [
        "torch.compile's compile time is the offline first calls at every batch size; its "
        "served first answer includes the first worker's compilation of the warm-up batches "
        "(ahead of their first call, saved in the model's compile cache). The second worker "
        "is a scale-up from one worker to two: it gets one torch thread instead of two, and "
        "loads the graphs the first compiled with two (their kernels run with any thread "
        "count: Inductor's `cpp.dynamic_threads`, set in Ferry's workers of compiled "
        "models), in the server's spare process (`spare_worker_for_compiled_models`, on by "
        "default), which has torch's compiler imported. The restarted worker (that second "
        "worker's process killed, once the next spare has imported torch's compiler, as in "
        "service long before a crash) starts in that spare, loads the graphs and compiles "
        "nothing; the other formats' servers keep no spare. "
        "AOTInductor's compile time is `ferry archive --aot-inductor` (the export, the "
        "compilation and the check against the eager model); no worker compiles.",
        "",
    ]
    publish(ROOT / "benchmarks" / "results" / "model_formats.md", lines)


def _compiled_once(figures: Figures, name: str) -> list[str]:
    """What compiling costs: once (torch.compile: the first worker's start-up beyond
    TorchScript's in the same case; AOTInductor: ``ferry archive``), then each later
    worker (its start-up beyond TorchScript's) and its share of the first cost."""
    ts = f"{name} | TorchScript"
    lines = [
        "| format | compile cost, once (s) | second worker: cost (s) | share | "
        "restarted worker: cost (s) | share |",
        "|---|---|---|---|---|---|",
    ]
    for fmt in ("torch.compile", "AOTInductor"):
        key = f"{name} | {fmt}"
        first = figures.first_answer_s[key] - figures.first_answer_s[ts]
        if fmt == "AOTInductor":
            first = figures.compile_s[key]  # no worker compiles
        second = figures.second_worker_s[key] - figures.second_worker_s[ts]
        restarted = figures.restarted_worker_s[key] - figures.restarted_worker_s[ts]
        # + 0.0: a cost that rounds to zero from below prints as 0.0, not -0.0
        lines.append(
            f"| {fmt} | {first:.1f} | {round(second, 1) + 0.0:.1f} "
            f"| {round(second / first, 2) + 0.0:.0%} "
            f"| {round(restarted, 1) + 0.0:.1f} | {round(restarted / first, 2) + 0.0:.0%} |"
        )
    return [
        "Start-up beyond TorchScript's (the same case, the same server), against the cost "
        "of compiling once (torch.compile: in the first worker, its first answer beyond "
        "TorchScript's; AOTInductor: `ferry archive --aot-inductor`):",
        "",
        *lines,
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    figures = Figures()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # This process's own compilations stay out of every server's cache.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(work / "offline-inductor-cache")
        for name in models:
            store = work / name / "store"
            store.mkdir(parents=True)
            archives = _archives(name, work / name, store, figures)
            loaded = _offline_models(name, work / name, store, figures)
            for index in range(ROUNDS):
                _offline_round(name, loaded, figures, index)
            del loaded
            _served(name, store, archives, work / name, figures)
    write(figures, models)


if __name__ == "__main__":
    main()
