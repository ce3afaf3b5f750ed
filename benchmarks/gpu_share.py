"""One copy of a model's weights per GPU (issue 53): a 403 MB model with 4 workers on one
GPU, its weights shared by a weights keeper (``optimization: weights_keeper: gpu``, CUDA
IPC) and not, in one server.

    python benchmarks/gpu_share.py --out /tmp/gpu_share.md

The model is ``benchmarks/shared_weights.py``'s (24 linear layers of 2048 x 2048, seeded,
eager: its ``modelFile`` and state dict), served twice side by side: ``kept`` (the
keeper's copy) and ``own`` (each worker its own). Figures:

- each worker's own GPU memory as it measured its load (torch's allocator: describe's
  ``modelGpuMemory``) and the shared copy it reports (``sharedWeights``);
- the GPU memory each model held as a whole (NVML's used memory, the drop when the model
  is scaled to 0 workers: its workers' CUDA contexts and weights, and the keeper's);
- answers: every worker's output for one input, the two models' against each other and
  against the model run on the CPU here;
- the keeper's lifetime on a GPU: a SIGKILLed worker's replacement answers from the same
  keeper, and the keeper goes with the model's last worker.

Without a CUDA GPU (or NVML) it says SKIP and exits 2 (the GPU kit's dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, publish
from benchmarks.gpu_many_models import gpu_used, skip_without_gpu
from benchmarks.server import BenchmarkServer, ferry_server
from benchmarks.shared_weights import HANDLER, MODEL_FILE, WIDTH, Stack
from ferry.procinfo import descendants
from ferry.store.writer import ArchiveSpec, write_archive

WORKERS = 4
MODELS = {"kept": "gpu", "own": "off"}
"""Name -> ``optimization: weights_keeper``."""
KEEPER_MODULE = b"ferry.worker.weights_keeper"
MEBI = 1 << 20
ROW = [((i * 7) % 13) / 13 - 0.5 for i in range(WIDTH)]


@dataclass
class ModelFigures:
    workers: list[dict[str, Any]] = field(default_factory=list)
    """describe's workers once all are ready."""
    outputs: dict[int, list[float]] = field(default_factory=dict)
    """Each worker's (pid) answer to ``ROW``."""
    gpu_held: int = 0
    """NVML's used memory dropped by this much when the model went to 0 workers."""


@dataclass
class Figures:
    weights_bytes: int = 0
    models: dict[str, ModelFigures] = field(default_factory=dict)
    cpu_output: list[float] = field(default_factory=list)
    keeper_kept_after_kill: bool | None = None
    keeper_gone_after_scale: bool | None = None
    notes: list[str] = field(default_factory=list)


def write_models(store: Path, work: Path) -> tuple[int, list[float]]:
    """Both models in the store as folders; the weights' bytes and the CPU's answer."""
    torch.manual_seed(0)
    model = Stack().eval()
    torch.save(model.state_dict(), work / "stack.pt")
    (work / "stack_model.py").write_text(MODEL_FILE)
    for name, keeper in MODELS.items():
        config = work / f"{name}.yaml"
        body: dict[str, Any] = {"minWorkers": WORKERS, "maxWorkers": WORKERS, "batchSize": 1}
        body |= {"deviceType": "gpu", "responseTimeout": 120}
        config.write_text(yaml.safe_dump({**body, "optimization": {"weights_keeper": keeper}}))
        spec = ArchiveSpec(
            name,
            str(HANDLER),
            serialized_file=work / "stack.pt",
            model_file=work / "stack_model.py",
            config_file=config,
            archive_format="no-archive",
        )
        write_archive(spec, store, force=True)
    with torch.no_grad():
        expected: list[float] = model(torch.tensor([ROW]))[0].tolist()
    return sum(t.numel() * t.element_size() for t in model.state_dict().values()), expected


def described(server: BenchmarkServer, name: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.management_url}/models/{name}", timeout=60)
    response.raise_for_status()
    workers: list[dict[str, Any]] = response.json()[0]["workers"]
    return workers


def wait_ready(server: BenchmarkServer, name: str, avoid: frozenset[int] = frozenset()) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = described(server, name)
        pids = {w["pid"] for w in workers if w["status"] == "READY"}
        if len(pids) == WORKERS and not pids & avoid:
            return
        time.sleep(0.2)  # polling describe while the workers load
    raise RuntimeError(f"{name}: {WORKERS} workers not ready within 60 s")


def each_workers_answer(server: BenchmarkServer, name: str) -> dict[int, list[float]]:
    """Requests until every worker (by pid) has answered ``ROW``."""
    answers: dict[int, list[float]] = {}
    with httpx.Client(timeout=120) as client:
        for _ in range(20 * WORKERS):
            # A body without a JSON content type: the handler reads it (json.loads) itself.
            response = client.post(f"{server.url}/predictions/{name}", content=json.dumps(ROW))
            response.raise_for_status()
            answers[response.json()["pid"]] = response.json()["output"]
            if len(answers) == WORKERS:
                break
    return answers


def keepers(server: BenchmarkServer) -> set[int]:
    found = set()
    for pid in descendants(server.pid):
        try:
            if KEEPER_MODULE in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.add(pid)
        except OSError:
            continue
    return found


def settled_gpu_used(nvml: Any, gone: set[int]) -> int:
    """NVML's used memory once ``gone`` have exited and it has stopped falling."""
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{pid}").exists() for pid in gone) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the processes' exit
    last = gpu_used(nvml)
    while time.monotonic() < deadline:
        time.sleep(0.3)  # the driver frees a context's memory shortly after its exit
        now = gpu_used(nvml)
        if now == last:
            return now
        last = now
    return last


def scale_to_zero(server: BenchmarkServer, name: str) -> None:
    response = httpx.put(
        f"{server.management_url}/models/{name}",
        params={"min_worker": 0, "max_worker": 0, "synchronous": "true"},
        timeout=120,
    )
    response.raise_for_status()


def keeper_survives_a_worker(server: BenchmarkServer, figures: Figures) -> None:
    """SIGKILL one kept worker: the replacement imports from the same keeper."""
    before = keepers(server)
    victim = described(server, "kept")[0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_ready(server, "kept", avoid=frozenset({victim}))
    figures.keeper_kept_after_kill = keepers(server) == before and len(before) == 1
    replaced = each_workers_answer(server, "kept")
    reference = next(iter(figures.models["own"].outputs.values()))
    if any(not torch.allclose(torch.tensor(o), torch.tensor(reference)) for o in replaced.values()):
        figures.notes.append("a replacement's answer differs from the model's")


def measure(nvml: Any, store: Path, work: Path, out: Path, figures: Figures) -> None:
    specs = [f"{name}={name}" for name in MODELS]
    with ferry_server(store, specs, work, "--access-log", "false") as server:
        for name in MODELS:
            wait_ready(server, name)
            figures.models[name] = ModelFigures(described(server, name))
            figures.models[name].outputs = each_workers_answer(server, name)
        publish(out, page(figures))
        keeper_survives_a_worker(server, figures)
        before = gpu_used(nvml)
        for name in MODELS:  # the keeper's model first: it goes with its last worker
            pids = {w["pid"] for w in described(server, name)} | keepers(server)
            scale_to_zero(server, name)
            after = settled_gpu_used(nvml, pids)
            figures.models[name].gpu_held = before - after
            before = after
            if name == "kept":
                figures.keeper_gone_after_scale = not keepers(server)
            publish(out, page(figures))


def page(figures: Figures) -> list[str]:
    lines = [
        "# One copy of the weights per GPU (issue 53)",
        "",
        f"Machine: {machine_description()}; GPU: {torch.cuda.get_device_name(0)}; "
        f"torch {torch.__version__}. `benchmarks/gpu_share.py`: a "
        f"{figures.weights_bytes / MEBI:.0f} MiB eager model (24 linear layers of 2048 x "
        f"2048), {WORKERS} workers on GPU 0, with a weights keeper (`weights_keeper: gpu`) "
        "and without, in one server.",
        "",
        "| model | weights_keeper | GPU memory the model held (NVML) | each worker's own "
        "(torch, median) | sharedWeights | answers equal to the CPU's |",
        "|---|---|---|---|---|---|",
    ]
    for name, model in figures.models.items():
        own = sorted(w.get("modelGpuMemory", 0) for w in model.workers)
        shared = {w.get("sharedWeights", 0) for w in model.workers}
        close = [
            torch.allclose(torch.tensor(o), torch.tensor(figures.cpu_output), atol=1e-3)
            for o in model.outputs.values()
        ]
        held = f"{model.gpu_held / MEBI:.0f} MiB" if model.gpu_held else "(to come)"
        lines.append(
            f"| {name} | {MODELS[name]} | {held} | {own[len(own) // 2] / MEBI:.0f} MiB | "
            f"{', '.join(f'{s / MEBI:.0f} MiB' for s in sorted(shared))} | "
            f"{sum(close)} of {len(close)} workers |"
        )
    lines += ["", *verdict_lines(figures)]
    return lines


def verdict_lines(figures: Figures) -> list[str]:
    kept, own = figures.models.get("kept"), figures.models.get("own")
    lines = []
    if kept and own and kept.outputs and own.outputs:
        reference = torch.tensor(next(iter(own.outputs.values())))
        equal = all(
            torch.allclose(torch.tensor(o), reference, atol=1e-5)
            for o in [*kept.outputs.values(), *own.outputs.values()]
        )
        lines.append(f"- every worker of both models answered alike: {equal}")
    if figures.keeper_kept_after_kill is not None:
        lines.append(
            "- a SIGKILLed worker's replacement imported from the same keeper: "
            f"{figures.keeper_kept_after_kill}"
        )
    if figures.keeper_gone_after_scale is not None:
        lines.append(
            f"- the keeper went with the model's last worker: {figures.keeper_gone_after_scale}"
        )
    if kept and own and kept.gpu_held and own.gpu_held:
        lines.append(
            f"- GPU memory with the keeper {kept.gpu_held / MEBI:.0f} MiB against "
            f"{own.gpu_held / MEBI:.0f} MiB without: {kept.gpu_held / own.gpu_held:.2f}x "
            f"(the keeper's own CUDA context included)"
        )
    lines += [f"- {note}" for note in figures.notes]
    return lines


def verdict(figures: Figures) -> tuple[bool, str]:
    kept, own = figures.models["kept"], figures.models["own"]
    reference = torch.tensor(next(iter(own.outputs.values())))
    answers = [*kept.outputs.values(), *own.outputs.values()]
    equal = all(torch.allclose(torch.tensor(o), reference, atol=1e-5) for o in answers)
    shared = all(w.get("sharedWeights", 0) >= figures.weights_bytes for w in kept.workers)
    smaller = 0 < kept.gpu_held < own.gpu_held
    checks = {
        "answers equal": equal,
        "workers report the keeper's copy": shared,
        "less GPU memory with the keeper": smaller,
        "keeper kept across a worker's death": bool(figures.keeper_kept_after_kill),
        "keeper gone with the last worker": bool(figures.keeper_gone_after_scale),
        "no other finding": not figures.notes,
    }
    failed = [what for what, ok in checks.items() if not ok]
    summary = (
        f"{WORKERS} workers of a {figures.weights_bytes / MEBI:.0f} MiB model: GPU "
        f"{kept.gpu_held / MEBI:.0f} MiB with a keeper, {own.gpu_held / MEBI:.0f} MiB without"
    )
    return not failed, summary if not failed else f"{summary}; failed: {', '.join(failed)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_share.md"))
    args = parser.parse_args()
    nvml = skip_without_gpu()
    figures = Figures()
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-share-") as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        figures.weights_bytes, figures.cpu_output = write_models(store, work)
        measure(nvml, store, work, args.out, figures)
    publish(args.out, page(figures))
    passed, summary = verdict(figures)
    print(f"{'PASS' if passed else 'FAIL'}: {summary}")
    if not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
