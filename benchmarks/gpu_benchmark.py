"""ResNet-50 fp16 on a GPU: the server against the offline GPU limit, and sequential stages
against the stage pipeline.

    python benchmarks/gpu_benchmark.py --out benchmarks/results/gpu.md

One run, on a machine with a CUDA GPU (and a CUDA build of torch):
- offline limit: ResNet-50 (seeded random weights, TorchScript) with the same
  ``optimization:`` as the server (fp16, channels_last), fed a batch already on the GPU,
  at each batch size; the best throughput and its batch size are the limit;
- server: one ``ferry serve``, one worker on the GPU, batch size = the offline best, the
  same TorchScript file behind several models, concurrency = 2 x batch size:
  - ``tensor``: raw uint8 pixels per request (no decoding), sequential stages and with
    ``micro_batching`` (the pipeline: pinned uploads overlapping inference);
  - ``jpeg``: the built-in image_classifier on 480 px JPEGs, sequential and pipelined, and
    with ``gpu_decode`` when torchvision is importable.
Rounds alternate the models; medians and the ratios to the offline limit are reported.

``--device cpu --model resnet18 --precision fp32 --batches 1 4`` runs the same script on a
CPU as a smoke check of the script; its figures say nothing about GPUs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import alternating_rounds, jpeg_inputs, machine_description, publish
from benchmarks.server import ferry_server
from examples.models.resnet import resnet18, resnet50
from ferry.handlers.builtin.gpu_decode import load_gpu_jpeg_decoder
from ferry.handlers.builtin.model_loading import load_model
from ferry.handlers.builtin.optimize import Optimizations, optimize_model, prepare_input
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


def optimization(precision: str, batch: int) -> dict[str, Any]:
    return {
        "precision": precision,
        "channels_last": True,
        "warmup": {"input_shape": [3, 224, 224], "batch_sizes": [1, batch]},
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
    pipeline = {
        "micro_batch_size": max(1, batch // 4),
        "parallelism": {"preprocess": args.preprocess_threads, "inference": 1, "postprocess": 1},
    }
    base = {
        "minWorkers": args.workers,
        "batchSize": batch,
        "maxBatchDelay": 5,
        "responseTimeout": 300,
        "deviceType": "gpu" if device.type == "cuda" else "cpu",
        "optimization": optimization(args.precision, batch),
    }
    tensor_handler = str(HANDLERS / "tensor_classifier.py")
    variants: dict[str, tuple[str, dict[str, Any], str]] = {
        "tensor-sequential": (tensor_handler, base, "application/octet-stream"),
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
    return {
        name: (archive(store, name, weights, handler, config), content_type)
        for name, (handler, config, content_type) in variants.items()
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
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA GPU here; --device cpu runs the script as a smoke check only")
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
    with ferry_server(store, specs, tmp, "--access-log", "false") as server:
        figures = alternating_rounds(
            server.url,
            {name: (payloads[kind], kind) for name, (_, kind) in models.items()},
            concurrency,
            args.requests,
            args.rounds,
            "img/s",
        )
    report(args, device, limit, best_batch, concurrency, figures)


def report(
    args: argparse.Namespace,
    device: torch.device,
    limit: dict[int, float],
    best_batch: int,
    concurrency: int,
    figures: dict[str, list[float]],
) -> None:
    best = limit[best_batch]
    med = {name: statistics.median(values) for name, values in figures.items()}
    lines = [
        f"# {args.model} {args.precision} through the server against the offline limit",
        "",
        f"Machine: {machine_description()}. GPU: {gpu_description(device)}.",
        f"Produced by `benchmarks/gpu_benchmark.py` in one run: {args.rounds} rounds of "
        f"{args.requests} requests per model, alternating order; {args.workers} worker(s), "
        f"batch size {best_batch} (the offline best), concurrency {concurrency}, "
        "`channels_last`, access log off.",
        "",
        "Offline limit (model alone, batch already on the device):",
        "",
        "| batch | images/s |",
        "|---|---|",
        *(f"| {batch} | {rate:.0f} |" for batch, rate in limit.items()),
        "",
        "| through the server | median images/s | / offline limit |",
        "|---|---|---|",
        *(f"| {name} | {rate:.0f} | {rate / best:.2f}x |" for name, rate in med.items()),
        "",
    ]
    for kind in ("tensor", "jpeg"):
        sequential, pipelined = med.get(f"{kind}-sequential"), med.get(f"{kind}-pipelined")
        if sequential and pipelined:
            lines.append(f"- {kind}: pipelined / sequential = {pipelined / sequential:.2f}x")
    publish(args.out, lines)


if __name__ == "__main__":
    main()
