"""Offline batch profiling: a model's handler loaded as a worker loads it, timed at each
batch size, for the whole handler and for the model alone."""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from ferry.handlers.builtin.optimize import Optimizations
from ferry.handlers.contract.context import Context
from ferry.procinfo import resident_bytes
from ferry.store.archive import ModelArchive, open_model
from ferry.wire.spec import HandlerSpec
from ferry.worker import loading
from ferry_bench.stats import percentile

MIN_GAIN = 1.03
"""Automatic batch sizes stop once time per item improved by less than this, twice."""
NOISY_SPREAD = 0.5
"""A point whose p10-p90 range exceeds half its median is flagged as too noisy to trust."""


class InputRejected(ValueError):
    """The handler could not process an ``--input``: the message names it."""


@dataclass(frozen=True)
class ProfilePoint:
    batch_size: int
    variant: str
    """``handler`` (preprocess + inference + postprocess) or ``model`` (forward pass alone)."""
    precision: str
    latency_ms_median: float
    latency_ms_p10: float
    latency_ms_p90: float
    ms_per_item: float
    items_per_second: float
    memory_mb: float
    """Memory batches of this size took beyond what the process held before them: the
    growth of resident memory (CPU), or ``max_memory_allocated`` above the allocation
    before them, its peak reset for each size (GPU)."""
    spread: float
    """(p90 - p10) / median of the timings: above ``NOISY_SPREAD`` the figure is noise."""
    runs: int

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoadedHandler:
    archive: ModelArchive
    context: Context
    entry: Callable[[Any, Context], Any]
    service: Any
    """The handler instance when it is a class (gives access to preprocess and model)."""
    device: torch.device


def load_handler(source: Path, work_dir: Path, device: str) -> LoadedHandler:
    """Open an archive or folder and initialise its handler in this process, as a worker
    does (``ts`` shim, stage pipeline when configured)."""
    archive = open_model(source.parent, source.name, work_dir)
    gpu = 0 if device == "cuda" else None
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available")
    spec = HandlerSpec(
        model_name=archive.name,
        model_dir=str(archive.model_dir),
        handler=archive.manifest.handler,
        manifest=archive.manifest.document,
        batch_size=1,
        model_yaml_config=archive.config.raw,
    )
    ready = loading.load_handler(spec, gpu_id=gpu)
    return LoadedHandler(archive, ready.context, ready.entry, ready.instance, torch.device(device))


def active_optimizations(loaded: LoadedHandler) -> dict[str, Any]:
    """The handler's ``optimization:`` switches that differ from the defaults, as it runs
    with them (empty for handlers that are not ``BaseHandler`` subclasses)."""
    options = getattr(loaded.service, "optimizations", None)
    if not isinstance(options, Optimizations):
        return {}
    defaults = Optimizations()
    active = {}
    for field in fields(Optimizations):
        value = getattr(options, field.name)
        if value != getattr(defaults, field.name):
            active[field.name] = list(value) if isinstance(value, tuple) else value
    return active


class _MemoryProbe:
    """The memory one batch size takes beyond the process's before it (see ``memory_mb``)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        gc.collect()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.base = torch.cuda.memory_allocated(device)
        else:
            self.base = resident_bytes(os.getpid())
        self.peak = self.base

    def sample(self) -> None:
        if self.device.type != "cuda":
            self.peak = max(self.peak, resident_bytes(os.getpid()))

    def megabytes(self) -> float:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        return max(0, self.peak - self.base) / 2**20


MIN_RUNS = 5
"""Timed runs per point at least, however long each takes: a spread needs several."""


def _time(
    run: Callable[[], Any], seconds: float, device: torch.device, memory: _MemoryProbe
) -> list[float]:
    for _ in range(2):  # warm-up: allocator, lazy initialisation, TorchScript profiling runs
        run()
        memory.sample()
    timings: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(timings) < MIN_RUNS:
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append((time.perf_counter() - start) * 1000)
        memory.sample()
    return timings


def _point(
    batch: int, variant: str, precision: str, timings: list[float], memory: _MemoryProbe
) -> ProfilePoint:
    median = statistics.median(timings)
    p10, p90 = percentile(timings, 10), percentile(timings, 90)
    return ProfilePoint(
        batch_size=batch,
        variant=variant,
        precision=precision,
        latency_ms_median=round(median, 3),
        latency_ms_p10=round(p10, 3),
        latency_ms_p90=round(p90, 3),
        ms_per_item=round(median / batch, 4),
        items_per_second=round(batch * 1000 / median, 2),
        memory_mb=round(memory.megabytes(), 1),
        spread=round((p90 - p10) / median, 3) if median > 0 else 0.0,
        runs=len(timings),
    )


def noisy(points: list[ProfilePoint]) -> list[str]:
    """A warning for each point whose spread is too wide to trust."""
    return [
        f"batch {p.batch_size} {p.variant} {p.precision}: p10-p90 spans {p.spread:.0%} of "
        "the median; too noisy to trust (a busy machine?): rerun with more --seconds"
        for p in points
        if p.spread > NOISY_SPREAD
    ]


def check_inputs(loaded: LoadedHandler, inputs: list[bytes], names: list[str]) -> None:
    """Run each input alone through the handler once; ``InputRejected`` names the first
    the handler cannot process (an undecodable image, say), with the handler's words."""
    for payload, name in zip(inputs, names, strict=True):
        loaded.context.start_batch(["check"], [{}])
        try:
            with torch.inference_mode():
                answer = loaded.entry([{"body": bytearray(payload)}], loaded.context)
        except Exception as exc:  # any handler error: the input is what to name
            raise InputRejected(f"--input {name}: the handler failed on it: {exc}") from exc
        failed = answer[0] if isinstance(answer, list) and answer else None
        if isinstance(failed, BaseException):
            raise InputRejected(f"--input {name}: the handler rejected it: {failed}")


def profile_batch(
    loaded: LoadedHandler, inputs: list[bytes], batch: int, precision: str, seconds: float
) -> list[ProfilePoint]:
    """The handler and (for BaseHandler-style handlers) the model alone at one batch size."""
    rows = [{"body": bytearray(inputs[i % len(inputs)])} for i in range(batch)]
    context = loaded.context
    context.start_batch([f"p{i}" for i in range(batch)], [{} for _ in range(batch)])

    def whole() -> Any:
        with torch.inference_mode():
            return loaded.entry(rows, context)

    memory = _MemoryProbe(loaded.device)
    points = [
        _point(batch, "handler", precision, _time(whole, seconds, loaded.device, memory), memory)
    ]
    service = loaded.service
    if (
        service is not None
        and hasattr(service, "preprocess")
        and getattr(service, "model", None) is not None
    ):
        tensor = service.preprocess(rows)
        # What the worker runs: the handler's inference (a BaseHandler's casts its input,
        # pads it to its bucket and replays its CUDA graphs), not the bare model.
        infer = getattr(service, "inference", None) or service.model

        def model_alone() -> Any:
            with torch.inference_mode():
                return infer(tensor)

        memory = _MemoryProbe(loaded.device)
        timings = _time(model_alone, seconds, loaded.device, memory)
        points.append(_point(batch, "model", precision, timings, memory))
    return points


def doubling(limit: int = 1024) -> Iterator[int]:
    """1, 2, 4, ... up to ``limit``; ``profile`` stops earlier when it stops paying."""
    size = 1
    while size <= limit:
        yield size
        size *= 2


def profile(
    loaded: LoadedHandler,
    inputs: list[bytes],
    batch_sizes: list[int] | None,
    precisions: list[str],
    seconds: float,
    on_point: Callable[[ProfilePoint], None] = lambda point: None,
) -> list[ProfilePoint]:
    """Every (precision, batch size) point. Without explicit batch sizes, double from 1
    until memory runs out or the handler's time per item stops improving (less than 3%
    better twice in a row)."""
    points: list[ProfilePoint] = []
    for precision in precisions:
        best, flat = float("inf"), 0
        for batch in batch_sizes or doubling():
            try:
                measured = profile_batch(loaded, inputs, batch, precision, seconds)
            except (torch.OutOfMemoryError, MemoryError) as exc:
                if batch_sizes:
                    raise
                print(
                    f"batch size {batch}: out of memory ({type(exc).__name__}); stopping",
                    file=sys.stderr,
                )
                break
            for point in measured:
                on_point(point)
            points.extend(measured)
            per_item = measured[0].ms_per_item
            flat = flat + 1 if per_item * MIN_GAIN > best else 0
            best = min(best, per_item)
            if batch_sizes is None and flat >= 2:
                shaky = [p.batch_size for p in measured if p.spread > NOISY_SPREAD]
                print(
                    f"batch size {batch}: time per item improved by less than "
                    f"{MIN_GAIN - 1:.0%} twice; stopping"
                    + (
                        " (but these timings are noisy: the stop may be noise; give "
                        "--batch-sizes to measure larger sizes)"
                        if shaky
                        else ""
                    ),
                    file=sys.stderr,
                )
                break
    return points
