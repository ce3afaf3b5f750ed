"""Shared pieces of the benchmark scripts: machine description, archives, offline handler runs."""

from __future__ import annotations

import asyncio
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from examples.demo.shapes import LABELS, draw_shape, encode
from examples.models.resnet import resnet18
from ferry.config.settings import available_cores
from ferry.handlers.contract.context import Context
from ferry.store.archive import open_model
from ferry.store.writer import ArchiveSpec, write_archive
from ferry.wire.spec import HandlerSpec
from ferry.worker.loading import load_handler
from ferry_bench.load import LoadResult, LoadSpec, run_load

ROOT = Path(__file__).resolve().parents[1]
HANDLERS = ROOT / "benchmarks" / "handlers"


def machine_description() -> str:
    cpu = "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB RAM"
    return (
        f"{cpu}, {available_cores()} cores available{memory}; Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.system()} {platform.release()}"
    )


def jpeg_inputs(count: int, size: int, seed: int = 0) -> list[bytes]:
    """Photo-sized JPEGs of drawn shapes (content does not matter to random weights)."""
    rng = random.Random(seed)
    return [
        encode(draw_shape(LABELS[i % len(LABELS)], rng, size=size), "JPEG") for i in range(count)
    ]


def resnet18_archive(store: Path, batch_size: int, max_batch_delay_ms: int) -> str:
    """ResNet-18 with seeded random weights, traced to TorchScript, with image_classifier."""
    torch.manual_seed(0)
    model = resnet18().eval()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        folder = Path(tmp)
        traced = torch.jit.trace(model, torch.randn(1, 3, 224, 224))  # type: ignore[no-untyped-call]
        traced.save(str(folder / "resnet18.pt"))
        config = folder / "model-config.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "minWorkers": 1,
                    "batchSize": batch_size,
                    "maxBatchDelay": max_batch_delay_ms,
                    "responseTimeout": 300,
                }
            )
        )
        spec = ArchiveSpec(
            "resnet18",
            "image_classifier",
            serialized_file=folder / "resnet18.pt",
            config_file=config,
        )
        return write_archive(spec, store, force=True).name


def ts_style_resnet18_archive(store: Path, batch_size: int, max_batch_delay_ms: int) -> str:
    """The same TorchScript ResNet-18 behind ``benchmarks/handlers/resnet_handler.py``
    (PIL + torch, TorchServe's handler contract), which TorchServe runs too."""
    scratch = store / ".ts-resnet18-src"
    scratch.mkdir(parents=True, exist_ok=True)
    resnet18_archive(scratch, batch_size, max_batch_delay_ms)
    with zipfile.ZipFile(scratch / "resnet18.mar") as archive:
        (scratch / "resnet18.pt").write_bytes(archive.read("resnet18.pt"))
        (scratch / "model-config.yaml").write_bytes(archive.read("model-config.yaml"))
    spec = ArchiveSpec(
        "resnet18",
        str(HANDLERS / "resnet_handler.py"),
        serialized_file=scratch / "resnet18.pt",
        config_file=scratch / "model-config.yaml",
        extra_files=(HANDLERS / "resnet_pipeline.py",),
    )
    return write_archive(spec, store, force=True).name


def noop_archive(store: Path, batch_size: int) -> str:
    folder = store / ".noop-src"
    folder.mkdir(parents=True, exist_ok=True)
    handler = folder / "noop_handler.py"
    handler.write_text(
        "def handle(data, context):\n    return None if data is None else ['ok'] * len(data)\n"
    )
    config = folder / "model-config.yaml"
    config.write_text(
        yaml.safe_dump({"minWorkers": 1, "batchSize": batch_size, "maxBatchDelay": 5})
    )
    spec = ArchiveSpec("noop", str(handler), config_file=config)
    return write_archive(spec, store, force=True).name


def offline_handler(store: Path, archive: str, batch_size: int) -> tuple[Any, Context]:
    """The archive's handler loaded in this process, as a worker loads it.

    Configure torch with ``configure_torch`` first, and start the process with
    ``worker_environment``, so torch runs as in a worker.
    """
    folder = Path(tempfile.mkdtemp(prefix="offline-"))
    opened = open_model(store, archive, folder)
    spec = HandlerSpec(
        model_name="offline",
        model_dir=str(opened.model_dir),
        handler=opened.manifest.handler,
        manifest=opened.manifest.document,
        batch_size=batch_size,
        model_yaml_config=opened.config.raw,
    )
    ready = load_handler(spec, gpu_id=None)
    return ready.entry, ready.context


def time_batches(
    run: Callable[[list[dict[str, Any]]], Any],
    payloads: list[bytes],
    batch_size: int,
    seconds: float,
) -> list[float]:
    """Seconds per batch of ``batch_size`` requests, repeated for about ``seconds``."""
    timings: list[float] = []
    index, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(timings) < 3:
        rows = [
            {"body": bytearray(payloads[(index + i) % len(payloads)])} for i in range(batch_size)
        ]
        index += batch_size
        start = time.perf_counter()
        run(rows)
        timings.append(time.perf_counter() - start)
    return timings


def publish(path: Path, lines: list[str]) -> None:
    """Write a results page and print it."""
    text = "\n".join(lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    print(text)


def closed_loop(
    url: str,
    payloads: list[bytes],
    concurrency: int,
    requests: int,
    content_type: str = "application/octet-stream",
) -> LoadResult:
    """One closed-loop load run; any error response or lost request stops the benchmark."""
    spec = LoadSpec(
        url, payloads, concurrency=concurrency, requests=requests, content_type=content_type
    )
    result = asyncio.run(run_load(spec))
    if set(result.statuses) != {200} or result.transport_errors:
        raise RuntimeError(
            f"errors during the benchmark: {dict(result.statuses)} {dict(result.transport_errors)}"
        )
    return result


def alternating_rounds(
    url: str,
    models: dict[str, tuple[list[bytes], str]],
    concurrency: int,
    requests: int,
    rounds: int,
    unit: str = "req/s",
) -> dict[str, list[float]]:
    """Throughput of each model (name -> payloads, content type) served at ``url``, after a
    warm-up, over ``rounds`` rounds whose order alternates so drift hits every model alike."""
    for name, (payloads, content_type) in models.items():
        closed_loop(
            f"{url}/predictions/{name}", payloads, concurrency, 2 * concurrency, content_type
        )
    figures: dict[str, list[float]] = {name: [] for name in models}
    for index in range(rounds):
        order = list(models) if index % 2 == 0 else list(reversed(models))
        for name in order:
            payloads, content_type = models[name]
            result = closed_loop(
                f"{url}/predictions/{name}", payloads, concurrency, requests, content_type
            )
            figures[name].append(result.throughput)
        measured = ", ".join(f"{name} {figures[name][-1]:.1f}" for name in models)
        print(f"round {index + 1}: {measured} {unit}", flush=True)
    return figures


def ferry_bench_limit(
    model: Path, inputs: list[Path], slo: str, out: Path, *extra: str
) -> list[str]:
    """Run ``ferry bench limit`` (the console script beside this Python) into ``out``,
    keep only its report (the servers' logs and configs are no results); the argv."""
    argv = [
        str(Path(sys.executable).parent / "ferry"),
        "bench",
        "limit",
        str(model),
        "--input",
        ",".join(map(str, inputs)),
        "--slo-p99",
        slo,
        "--out",
        str(out),
        *extra,
    ]
    subprocess.run(argv, check=True)
    shutil.rmtree(out / "servers")
    return argv


def detailed_photo(width: int, height: int, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """An image with gradients, shapes and noise (JPEG at quality 90, or PNG): detail that
    decoding, resizing and cropping shift visibly."""
    import io

    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        corner = (x0 + int(rng.integers(5, width // 3)), y0 + int(rng.integers(5, height // 3)))
        draw.ellipse((x0, y0, *corner), fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    buffer = io.BytesIO()
    image.save(buffer, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()
