"""Many models on one GPU (issue 49): 30 ResNet-18 in shared worker processes against one
worker process per model, one server each, in one run.

    python benchmarks/gpu_many_models.py --out benchmarks/results/gpu_many_models.md

One TorchScript ResNet-18 archive (seeded random weights, raw 3x224x224 uint8 pixels in
through ``benchmarks/handlers/tensor_classifier.py``, batches of up to 16 within 5 ms, on
the GPU) registered under N names, served twice: ``share_worker_processes=always`` (one
process, one CUDA context, for all N) and ``never`` (a process and a context each). For
each:

- seconds from launching ``ferry serve`` until every model has answered once;
- GPU memory the server added (NVML's used memory against before the launch), the
  processes holding a CUDA context on the GPU (NVML's compute processes) and what each
  holds, and the host memory (PSS) of all the server's processes;
- the hot model: closed-loop load on one model while the other N-1 stay idle beside it:
  requests/s and the median latency.

Without a CUDA GPU it says SKIP and exits 2 (the GPU kit's dry run).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import httpx
import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import closed_loop, machine_description, publish
from benchmarks.many_models import pss
from benchmarks.server import BenchmarkServer, ferry_server
from examples.models.resnet import resnet18
from ferry.store.writer import ArchiveSpec, write_archive

HANDLERS = Path(__file__).resolve().parent / "handlers"
CONCURRENCY = 32
MODES = {
    "shared": "always",
    "one process each": "never",
}
"""Label -> ``share_worker_processes``."""


@dataclass
class Footprint:
    seconds_to_all: float
    gpu_added_bytes: int
    contexts: int
    """Processes with a CUDA context on the GPU, the server's."""
    per_context_bytes: list[int]
    host_pss_bytes: int
    hot_throughput: float = 0.0
    hot_p50_ms: float = 0.0


def skip_without_gpu() -> ModuleType:
    if not torch.cuda.is_available():
        print(f"SKIP: no CUDA GPU here (torch {torch.__version__})")
        raise SystemExit(2)
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception as exc:  # no NVML: no memory figures, the point of this part
        why = f"{type(exc).__name__}: {exc}"
        print(f"SKIP: NVML is not usable here ({why}); pip install nvidia-ml-py")
        raise SystemExit(2) from exc
    return nvml


def build_archive(store: Path, work: Path) -> str:
    torch.manual_seed(0)
    model = resnet18().eval()
    weights = work / "resnet18.pt"
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.randn(1, 3, 224, 224))  # type: ignore[no-untyped-call]
    traced.save(str(weights))
    config = work / "model-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "minWorkers": 1,
                "maxWorkers": 1,
                "batchSize": 16,
                "maxBatchDelay": 5,
                "deviceType": "gpu",
                "jobQueueSize": 4 * CONCURRENCY,
                "responseTimeout": 300,
            }
        )
    )
    spec = ArchiveSpec(
        "resnet18",
        str(HANDLERS / "tensor_classifier.py"),
        serialized_file=weights,
        config_file=config,
    )
    return write_archive(spec, store, force=True).name


def pixel_payloads(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (3, 224, 224), dtype=np.uint8).tobytes() for _ in range(count)]


def gpu_used(nvml: ModuleType) -> int:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def contexts(nvml: ModuleType, pids: set[int]) -> list[int]:
    """GPU memory of each of ``pids`` that holds a CUDA context on GPU 0. In a container
    NVML may name processes by the host's pids, none of ours: then every process on the
    GPU counts (this benchmark has the GPU to itself, and nothing else of it holds one)."""
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    running = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    ours = [p for p in running if p.pid in pids] or list(running)
    return [int(p.usedGpuMemory or 0) for p in ours]


def server_pids(frontend: int) -> set[int]:
    from benchmarks.gpu_kit.runner import descendants

    return {frontend, *descendants(frontend)}


def answer_all(server: BenchmarkServer, names: list[str], payload: bytes, launched: float) -> float:
    """Ask every model until each has answered once; seconds from launch to the last."""
    waiting = list(names)
    with httpx.Client(timeout=300) as client:
        while waiting:
            for name in list(waiting):
                response = client.post(f"{server.url}/predictions/{name}", content=payload)
                if response.status_code == 200:
                    waiting.remove(name)
                elif response.status_code not in (503,):  # 503: still loading
                    raise RuntimeError(f"{name}: {response.status_code} {response.text[:200]}")
            if waiting:
                time.sleep(0.1)  # polling the models still loading
    return time.monotonic() - launched


def measure(
    nvml: ModuleType,
    label: str,
    store: Path,
    archive: str,
    names: list[str],
    payloads: list[bytes],
    requests: int,
    work: Path,
) -> Footprint:
    before = gpu_used(nvml)
    specs = [f"{name}={archive}" for name in names]
    flags = ("--share-worker-processes", MODES[label], "--max-workers-total", str(2 * len(names)))
    launched = time.monotonic()
    with ferry_server(store, specs, work, *flags, "--access-log", "false") as server:
        seconds = answer_all(server, names, payloads[0], launched)
        pids = server_pids(server.pid)
        held = contexts(nvml, pids)
        footprint = Footprint(
            seconds, gpu_used(nvml) - before, len(held), held, sum(pss(p) for p in pids)
        )
        print(
            f"{label}: all {len(names)} answered after {seconds:.1f} s; GPU +"
            f"{footprint.gpu_added_bytes / 2**30:.2f} GiB in {len(held)} CUDA contexts",
            flush=True,
        )
        url = f"{server.url}/predictions/{names[0]}"
        closed_loop(url, payloads, CONCURRENCY, 2 * CONCURRENCY)  # warm the batch sizes
        result = closed_loop(url, payloads, CONCURRENCY, requests)
        footprint.hot_throughput, footprint.hot_p50_ms = result.throughput, result.latency_ms(50)
        print(
            f"{label}: hot model {result.throughput:.0f} req/s, p50 "
            f"{result.latency_ms(50):.1f} ms beside {len(names) - 1} idle",
            flush=True,
        )
    return footprint


def page(args: argparse.Namespace, figures: dict[str, Footprint]) -> list[str]:
    gib = 2**30
    name = torch.cuda.get_device_name(0)
    lines = [
        "# Many models on one GPU (issue 49)",
        "",
        f"Machine: {machine_description()}; GPU: {name}; torch {torch.__version__}.",
        f"`benchmarks/gpu_many_models.py`: {args.models} ResNet-18 (TorchScript, random "
        "weights, raw 3x224x224 uint8 pixels, batches of up to 16 within 5 ms) on GPU 0; the "
        f"hot model under {CONCURRENCY} closed-loop clients, {args.requests} requests, the "
        "others idle.",
        "",
        "| worker processes | all answered after | GPU memory added | CUDA contexts | "
        "GPU memory per context | host PSS | hot model req/s | hot p50 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, f in figures.items():
        per = statistics.median(f.per_context_bytes) / gib if f.per_context_bytes else 0.0
        lines.append(
            f"| {label} | {f.seconds_to_all:.1f} s | {f.gpu_added_bytes / gib:.2f} GiB | "
            f"{f.contexts} | {per:.2f} GiB (median) | {f.host_pss_bytes / gib:.2f} GiB | "
            f"{f.hot_throughput:.0f} | {f.hot_p50_ms:.1f} |"
        )
    if len(figures) == len(MODES):
        shared, each = (figures[label] for label in MODES)
        lines += [
            "",
            f"Shared against one process each: GPU memory "
            f"{shared.gpu_added_bytes / max(each.gpu_added_bytes, 1):.2f}x, host memory "
            f"{shared.host_pss_bytes / max(each.host_pss_bytes, 1):.2f}x, time to all answered "
            f"{shared.seconds_to_all / each.seconds_to_all:.2f}x, hot model throughput "
            f"{shared.hot_throughput / max(each.hot_throughput, 1e-9):.2f}x.",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_many_models.md"))
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    nvml = skip_without_gpu()
    figures: dict[str, Footprint] = {}
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-many-") as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        archive = build_archive(store, work)
        names = [f"resnet18_{index:02d}" for index in range(args.models)]
        payloads = pixel_payloads(32)
        for label in MODES:  # shared first: its figures come back even if the other overruns
            figures[label] = measure(
                nvml, label, store, archive, names, payloads, args.requests, work
            )
            publish(args.out, page(args, figures))
    shared, each = (figures[label] for label in MODES)
    print(
        f"PASS: {args.models} models: shared {shared.contexts} CUDA context(s), "
        f"{shared.gpu_added_bytes / 2**30:.1f} GiB; one process each {each.contexts}, "
        f"{each.gpu_added_bytes / 2**30:.1f} GiB"
    )


if __name__ == "__main__":
    main()
