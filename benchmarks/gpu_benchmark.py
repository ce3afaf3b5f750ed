"""ResNet-50 fp16 on a GPU: the server against the offline GPU limit, and sequential stages
against the stage pipeline.

    python benchmarks/gpu_benchmark.py --out benchmarks/results/gpu.md

One run, on a machine with a CUDA GPU (and a CUDA build of torch):
- offline limit: ResNet-50 (seeded random weights, TorchScript) with the same
  ``optimization:`` as the server (fp16, channels_last), fed a batch already on the GPU,
  at each batch size; the best throughput and its batch size are the limit;
- server: one ``ferry serve``, one worker on the GPU, batch size = the offline best, the
  same TorchScript file behind several models, concurrency = 2 x batch size, batch sizes
  padded to power-of-two buckets (``batch_buckets``) so that TorchScript never
  re-specialises for the sizes 1..B a server sees:
  - ``tensor``: raw uint8 pixels per request (no decoding), sequential stages at the
    batch size and at the micro-batch size, and with ``micro_batching`` (the pipeline:
    pinned uploads overlapping inference, the model at the micro-batch size): pipelined
    against sequential at the same model batch size is the pipeline's own gain;
  - ``jpeg``: the built-in image_classifier on 480 px JPEGs, sequential and pipelined, and
    with ``gpu_decode`` when torchvision is importable.
Rounds alternate the models and last at least ``--round-seconds`` each (a model's
requests per round from the rate its warm-up round measured: the first device run showed
served rates an eighth of the offline limit's, so requests counted from that limit made
rounds eight times too long for the GPU kit's budget); the load comes from ``--clients``
processes. The CPU time of the clients and of the server (frontend and workers) is
measured per round, so that a ratio below the limit can be put down to the GPU, the
server's CPU or the load generator.

``--variants`` keeps some of the served variants (the GPU kit's bf16 part: the two
``tensor`` ones). The page is rewritten after every round, so a run stopped early keeps
what it measured. Without a CUDA GPU (and ``--device cuda``) it says ``SKIP: ...`` and
exits 2. ``--device cpu --model resnet18 --precision fp32 --batches 1 4`` runs the same
script on a CPU as a smoke check of the script; its figures say nothing about GPUs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import closed_loop, jpeg_inputs, machine_description, publish
from benchmarks.server import BenchmarkServer, ferry_server
from examples.models.resnet import resnet18, resnet50
from ferry.config.settings import available_cores
from ferry.handlers.builtin.formats import load_model
from ferry.handlers.builtin.gpu_decode import load_gpu_jpeg_decoder
from ferry.handlers.builtin.optimize import Optimizations, optimize_model, prepare_input
from ferry.procinfo import cpu_seconds, descendants
from ferry.store.writer import ArchiveSpec, write_archive

HANDLERS = Path(__file__).resolve().parent / "handlers"
MODELS = {"resnet50": resnet50, "resnet18": resnet18}


def gpu_description(device: torch.device) -> str:
    if device.type != "cuda":
        return "no GPU (CPU smoke run: not a GPU figure)"
    properties = torch.cuda.get_device_properties(device)
    return (
        f"{properties.name}, {properties.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    )


def trace(model_name: str, folder: Path) -> Path:
    torch.manual_seed(0)
    model = MODELS[model_name]().eval()
    path = folder / f"{model_name}.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, torch.randn(1, 3, 224, 224))  # type: ignore[no-untyped-call]
        traced.save(str(path))
    return path


def buckets(batch: int) -> list[int]:
    """Powers of two up to ``batch``, and ``batch``: the sizes batches are padded to.

    >>> buckets(48)
    [1, 2, 4, 8, 16, 32, 48]
    """
    sizes = [1 << n for n in range(batch.bit_length()) if 1 << n < batch]
    return [*sizes, batch]


def optimization(precision: str, batch: int) -> dict[str, Any]:
    sizes = buckets(batch)
    return {
        "precision": precision,
        "channels_last": True,
        "batch_buckets": sizes,
        "warmup": {"input_shape": [3, 224, 224], "batch_sizes": sizes},
    }


def offline_limit(
    weights: Path, options: Optimizations, device: torch.device, batches: list[int], seconds: float
) -> dict[int, float]:
    """Images per second of the optimised model on device-resident batches."""
    model = optimize_model(load_model(weights.parent, weights.name, None, device), options, device)
    figures = {}
    with torch.inference_mode():
        for batch in batches:
            inputs, _ = prepare_input(torch.randn(batch, 3, 224, 224), options, device)
            for _ in range(3):
                model(inputs)
            timings: list[float] = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline or len(timings) < 5:
                _synchronize(device)
                start = time.perf_counter()
                model(inputs)
                _synchronize(device)
                timings.append(time.perf_counter() - start)
            figures[batch] = batch / statistics.median(timings)
            print(f"offline batch {batch}: {figures[batch]:.0f} img/s", flush=True)
    return figures


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def archive(store: Path, name: str, weights: Path, handler: str, config: dict[str, Any]) -> str:
    folder = store / f".{name}-src"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model-config.yaml").write_text(yaml.safe_dump(config))
    spec = ArchiveSpec(
        name, handler, serialized_file=weights, config_file=folder / "model-config.yaml"
    )
    return write_archive(spec, store, force=True).name


def server_models(
    store: Path, weights: Path, args: argparse.Namespace, batch: int, device: torch.device
) -> dict[str, tuple[str, str]]:
    """name -> (archive, request content type) for each served variant."""
    micro = max(1, batch // 4)
    pipeline = {
        "micro_batch_size": micro,
        "parallelism": {"preprocess": args.preprocess_threads, "inference": 1, "postprocess": 1},
    }
    base = {
        "minWorkers": args.workers,
        "batchSize": batch,
        "maxBatchDelay": 5,
        "responseTimeout": 300,
        # The load keeps 2 x batch requests in flight: the default queue (100) would
        # refuse most of them with 503 at large batches.
        "jobQueueSize": 4 * batch,
        "deviceType": "gpu" if device.type == "cuda" else "cpu",
        "optimization": optimization(args.precision, batch),
    }
    at_micro = {**base, "batchSize": micro, "optimization": optimization(args.precision, micro)}
    tensor_handler = str(HANDLERS / "tensor_classifier.py")
    variants: dict[str, tuple[str, dict[str, Any], str]] = {
        "tensor-sequential": (tensor_handler, base, "application/octet-stream"),
        # The model at the pipeline's micro-batch size, stages in sequence: what the
        # pipeline is compared with (same model batch size, no overlap).
        "tensor-sequential-micro": (tensor_handler, at_micro, "application/octet-stream"),
        "tensor-pipelined": (
            tensor_handler,
            {**base, "micro_batching": pipeline},
            "application/octet-stream",
        ),
        "jpeg-sequential": ("image_classifier", base, "image/jpeg"),
        "jpeg-pipelined": ("image_classifier", {**base, "micro_batching": pipeline}, "image/jpeg"),
    }
    if load_gpu_jpeg_decoder(device) is not None:  # a GPU and a usable torchvision
        variants["jpeg-gpu-decode"] = (
            "image_classifier",
            {**base, "micro_batching": pipeline, "image_classifier": {"gpu_decode": True}},
            "image/jpeg",
        )
    kept = args.variants.split(",") if args.variants else list(variants)
    if unknown := set(kept) - set(variants):
        raise SystemExit(f"--variants: no variant {sorted(unknown)} here; {sorted(variants)}")
    return {
        name: (archive(store, name, weights, handler, config), content_type)
        for name, (handler, config, content_type) in variants.items()
        if name in kept
    }


def pixel_payloads(count: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (3, 224, 224), dtype=np.uint8).tobytes() for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu.md"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--preprocess-threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2000, help="per round, at least")
    parser.add_argument("--round-seconds", type=float, default=10.0, help="per round, at least")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--variants", default="", help="comma-separated; default: all")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"SKIP: no CUDA GPU here (torch {torch.__version__}); --device cpu: a smoke run")
        raise SystemExit(2)
    tmp = Path(tempfile.mkdtemp(prefix="ferry-gpu-"))
    store = tmp / "store"
    store.mkdir()
    weights = trace(args.model, tmp)
    options = Optimizations.from_model_config({"optimization": optimization(args.precision, 1)})
    limit = offline_limit(weights, options, device, args.batches, args.seconds)
    best_batch = max(limit, key=lambda b: limit[b])
    models = server_models(store, weights, args, best_batch, device)
    concurrency = 2 * best_batch
    payloads = {
        "application/octet-stream": pixel_payloads(64),
        "image/jpeg": jpeg_inputs(64, 480),
    }
    specs = [f"{name}={archive_name}" for name, (archive_name, _) in models.items()]
    requests: dict[str, int] = {}
    """Requests per measured round, by model: set by its warm-up round's rate."""

    def write(rounds: dict[str, list[Round]]) -> None:  # a run stopped early keeps its page
        report(args, device, limit, best_batch, concurrency, requests, rounds, quiet=True)

    write({})
    with ferry_server(store, specs, tmp, "--access-log", "false") as server:
        rounds = measured_rounds(
            server,
            {name: (payloads[kind], kind) for name, (_, kind) in models.items()},
            concurrency,
            requests,
            args,
            write,
        )
    report(args, device, limit, best_batch, concurrency, requests, rounds)
    served = [statistics.median(r.images_per_second for r in runs) for runs in rounds.values()]
    best_served = max(served)
    print(
        f"PASS: offline {limit[best_batch]:.0f} img/s at batch {best_batch}; "
        f"best served {best_served:.0f} img/s ({best_served / limit[best_batch]:.2f}x)"
    )


@dataclass
class Round:
    """One model's round: its throughput and the CPU it took."""

    images_per_second: float
    seconds: float
    client_cpu: float
    """CPU seconds of the load generator processes."""
    server_cpu: float
    """CPU seconds of the server: frontend and workers."""
    frontend_cpu: float = 0.0
    """CPU seconds of the frontend alone: one event loop, so near 1 core it sets the pace."""

    def cores(self, cpu: float) -> float:
        return cpu / self.seconds


def _load_process(
    url: str, payloads: list[bytes], concurrency: int, requests: int, kind: str
) -> float:
    """One load generator process's closed loop; the CPU seconds it took."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    closed_loop(url, payloads, concurrency, requests, kind)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _server_cpu(pid: int) -> float:
    return sum(cpu_seconds(p) for p in (pid, *descendants(pid)))


def measured_rounds(
    server: BenchmarkServer,
    models: dict[str, tuple[list[bytes], str]],
    concurrency: int,
    requests: dict[str, int],
    args: argparse.Namespace,
    on_round: Callable[[dict[str, list[Round]]], None] | None = None,
) -> dict[str, list[Round]]:
    """Each model's rounds, in alternating order, after a warm-up; the load split over
    ``args.clients`` fresh processes (one Python client cannot load a GPU server).
    ``on_round`` gets the rounds so far after each; ``requests`` gets each model's
    requests per round, from its warm-up round."""
    clients = max(1, args.clients)
    rounds: dict[str, list[Round]] = {name: [] for name in models}
    with ProcessPoolExecutor(clients, mp_context=multiprocessing.get_context("spawn")) as pool:
        for index in range(args.rounds + 1):  # round 0 warms up
            order = list(models) if index % 2 == 0 else list(reversed(models))
            for name in order:
                payloads, kind = models[name]
                url = f"{server.url}/predictions/{name}"
                share = requests[name] if index else 2 * concurrency
                server_before, start = _server_cpu(server.pid), time.perf_counter()
                frontend_before = cpu_seconds(server.pid)
                futures = [
                    pool.submit(
                        _load_process,
                        url,
                        payloads,
                        max(1, concurrency // clients),
                        max(1, share // clients),
                        kind,
                    )
                    for _ in range(clients)
                ]
                client_cpu = [future.result() for future in futures]
                seconds = time.perf_counter() - start
                if index == 0:  # at the warm-up's rate, this many requests last round_seconds
                    rate = clients * (share // clients) / seconds
                    requests[name] = max(args.requests, int(rate * args.round_seconds))
                    continue
                measured = Round(
                    clients * (share // clients) / seconds,
                    seconds,
                    sum(client_cpu),
                    _server_cpu(server.pid) - server_before,
                    cpu_seconds(server.pid) - frontend_before,
                )
                rounds[name].append(measured)
            if index:
                summary = ", ".join(f"{n} {rounds[n][-1].images_per_second:.0f}" for n in models)
                print(f"round {index}: {summary} img/s", flush=True)
                if on_round is not None:
                    on_round(rounds)
    return rounds


def report(
    args: argparse.Namespace,
    device: torch.device,
    limit: dict[int, float],
    best_batch: int,
    concurrency: int,
    requests: dict[str, int],
    rounds: dict[str, list[Round]],
    *,
    quiet: bool = False,
) -> None:
    """The page; ``quiet`` writes it without printing it (a page of the rounds so far)."""
    best = limit[best_batch]
    counts = ", ".join(f"{name} {count}" for name, count in requests.items())
    med = {
        name: statistics.median(r.images_per_second for r in runs)
        for name, runs in rounds.items()
        if runs
    }

    def cores(runs: list[Round], side: str) -> float:
        return statistics.median(r.cores(getattr(r, f"{side}_cpu")) for r in runs)

    lines = [
        f"# {args.model} {args.precision} through the server against the offline limit",
        "",
        f"Machine: {machine_description()}. GPU: {gpu_description(device)}.",
        f"Produced by `benchmarks/gpu_benchmark.py` in one run: {args.rounds} round(s) per "
        f"model (at least {args.round_seconds:g} s each at the rate of its warm-up round: "
        f"{counts or 'to come'} requests), "
        f"alternating order; {args.clients} load generator processes; "
        f"{args.workers} worker(s), batch size {best_batch} (the offline best, padded to "
        f"buckets {buckets(best_batch)}), concurrency {concurrency}, `channels_last`, "
        "access log off.",
        "",
        "Offline limit (model alone, batch already on the device):",
        "",
        "| batch | images/s |",
        "|---|---|",
        *(f"| {batch} | {rate:.0f} |" for batch, rate in limit.items()),
        "",
        "CPU in cores (CPU seconds per second of the round): a server or client column near",
        f"its core count ({available_cores()} here), or a frontend column near 1 (one event",
        "loop), means that side, not the GPU, set the pace.",
        "",
        "| through the server | median images/s | / offline limit | server CPU | "
        "of it the frontend | client CPU |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {rate:.0f} | {rate / best:.2f}x | {cores(rounds[name], 'server'):.2f} "
            f"| {cores(rounds[name], 'frontend'):.2f} | {cores(rounds[name], 'client'):.2f} |"
            for name, rate in med.items()
        ),
        "",
    ]
    pairs = [
        (
            "tensor",
            "tensor-pipelined",
            "tensor-sequential-micro",
            "model at the micro-batch size",
        ),
        ("tensor", "tensor-pipelined", "tensor-sequential", "model at the batch size"),
        ("jpeg", "jpeg-pipelined", "jpeg-sequential", "model at the batch size"),
    ]
    for kind, pipelined, sequential, note in pairs:
        if med.get(pipelined) and med.get(sequential):
            lines.append(
                f"- {kind}: pipelined / sequential ({note}) = "
                f"{med[pipelined] / med[sequential]:.2f}x"
            )
    if not quiet:
        publish(args.out, lines)
        return
    done = min((len(runs) for runs in rounds.values()), default=0)
    lines[1:1] = ["", f"**Partial page**: written after round {done} of {args.rounds}."]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
