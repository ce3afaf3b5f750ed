"""A grid of server configurations x client concurrencies, each configuration on a fresh
server, reported with TorchServe's benchmark columns."""

from __future__ import annotations

import asyncio
import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ferry.errors import ConfigError
from ferry_bench.load import LoadSpec, run_load
from ferry_bench.load_report import load_summary
from ferry_bench.server_stats import Samples, histogram_delta, scrape
from ferry_bench.servers import ServerConfig, ServerFailed, model_identity, start_server
from ferry_bench.tune import configurations

SPEC_KEYS = (
    "model",
    "input",
    "content_type",
    "batch_size",
    "max_batch_delay",
    "workers",
    "precision",
    "concurrency",
    "requests",
    "duration",
    "server",
)
"""Every key a sweep spec may have: any other is refused, naming the nearest."""


@dataclass(frozen=True)
class SweepSpec:
    model: Path
    inputs: list[Path]
    content_type: str
    batch_size: list[int]
    max_batch_delay: list[int]
    workers: list[int]
    concurrency: list[int]
    precision: list[str]
    requests: int | None
    duration: float | None
    server: str

    @classmethod
    def read(cls, path: Path) -> SweepSpec:
        try:
            document = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
        if not isinstance(document, dict) or "model" not in document or "input" not in document:
            raise ConfigError(f"{path.name}: needs at least 'model' and 'input'")
        _unknown_keys(document, path.name)
        base = path.parent

        def ints(key: str, default: list[int]) -> list[int]:
            value = document.get(key, default)
            values = value if isinstance(value, list) else [value]
            try:
                numbers = [int(v) for v in values]
            except (TypeError, ValueError):
                raise ConfigError(f"{path.name}: {key} must be integers") from None
            if not numbers or min(numbers) < (0 if key == "max_batch_delay" else 1):
                raise ConfigError(f"{path.name}: {key} out of range: {values}")
            return numbers

        inputs = document["input"] if isinstance(document["input"], list) else [document["input"]]
        if "requests" in document and "duration" in document:
            raise ConfigError(f"{path.name}: give requests or duration, not both")
        server = str(document.get("server", "ferry"))
        if server not in ("ferry", "torchserve"):
            raise ConfigError(f"{path.name}: server must be ferry or torchserve")
        return cls(
            model=(base / str(document["model"])).resolve(),
            inputs=[(base / str(p)).resolve() for p in inputs],
            content_type=str(document.get("content_type", "application/octet-stream")),
            batch_size=ints("batch_size", [1]),
            max_batch_delay=ints("max_batch_delay", [10]),
            workers=ints("workers", [1]),
            concurrency=ints("concurrency", [1]),
            precision=_precisions(document.get("precision", ["fp32"]), path.name),
            requests=int(document["requests"])
            if "requests" in document
            else (None if "duration" in document else 200),
            duration=float(document["duration"]) if "duration" in document else None,
            server=server,
        )

    def configurations(self) -> list[ServerConfig]:
        """Every configuration of the grid but those that cannot differ (batch size 1
        with another delay: a batch of one never waits)."""
        return configurations(self.batch_size, self.max_batch_delay, self.workers, self.precision)


def _unknown_keys(document: dict[str, Any], source: str) -> None:
    unknown = [str(key) for key in document if key not in SPEC_KEYS]
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, SPEC_KEYS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(
        f"{source}: unknown key {key!r}{hint}; a spec's keys are {', '.join(SPEC_KEYS)}"
    )


def _precisions(value: Any, source: str) -> list[str]:
    values = [str(v).lower() for v in (value if isinstance(value, list) else [value])]
    unknown = [v for v in values if v not in ("fp32", "fp16", "bf16")]
    if unknown or not values:
        raise ConfigError(f"{source}: precision must be fp32, fp16 or bf16, got {unknown}")
    return values


def _quantiles_ms(
    before: Samples | None, after: Samples | None, name: str, **labels: str
) -> list[float]:
    if before is None or after is None:
        return [math.nan] * 3
    delta = histogram_delta(before, after, name, **labels)
    return [round(delta.quantile(q) * 1000, 3) for q in (0.5, 0.9, 0.99)]


def warm_up(url: str, model: str, spec: SweepSpec) -> None:
    """A few requests on a fresh server, so first-request costs stay out of the figures."""
    payloads = [p.read_bytes() for p in spec.inputs]
    load = LoadSpec(
        f"{url}/predictions/{model}",
        payloads,
        concurrency=max(spec.concurrency),
        requests=2 * max(spec.concurrency),
        content_type=spec.content_type,
    )
    asyncio.run(run_load(load))


def measure(
    url: str,
    metrics_url: str | None,
    model: str,
    spec: SweepSpec,
    concurrency: int,
    config: ServerConfig,
) -> dict[str, Any]:
    """One row: the load run's figures and the server's own, TorchServe's column names."""
    payloads = [p.read_bytes() for p in spec.inputs]
    load = LoadSpec(
        f"{url}/predictions/{model}",
        payloads,
        concurrency=concurrency,
        requests=spec.requests,
        duration=spec.duration,
        content_type=spec.content_type,
    )

    async def run() -> tuple[Any, Samples | None, Samples | None]:
        before = await scrape(metrics_url) if metrics_url else None
        result = await run_load(load)
        after = await scrape(metrics_url) if metrics_url else None
        return result, before, after

    result, before, after = asyncio.run(run())
    summary = load_summary(load, result)
    model_ms = _quantiles_ms(
        before, after, "ferry_batch_stage_seconds", model_name=model, stage="inference"
    )
    if math.isnan(model_ms[0]):  # handlers without stages report their whole time
        model_ms = _quantiles_ms(
            before, after, "ferry_batch_stage_seconds", model_name=model, stage="handle"
        )
    queue_ms = _quantiles_ms(before, after, "ferry_queue_wait_seconds", model_name=model)
    return {
        **_identity_columns(spec, concurrency, config),
        "Requests": summary["requests_sent"],
        "Failed requests": sum(summary["errors"].values()),
        "Throughput": summary["goodput"],
        "Latency P50": summary["p50_ms"],
        "Latency P90": summary["p90_ms"],
        "Latency P99": summary["p99_ms"],
        "Latency mean": summary["mean_ms"],
        "Error rate": summary["error_rate"],
        "Model_p50": model_ms[0],
        "Model_p90": model_ms[1],
        "Model_p99": model_ms[2],
        "Queue time p50": queue_ms[0],
        "Queue time p90": queue_ms[1],
        "Queue time p99": queue_ms[2],
        "Error": "",
    }


def _identity_columns(spec: SweepSpec, concurrency: int, config: ServerConfig) -> dict[str, Any]:
    return {
        "Benchmark": spec.server,
        "Model": spec.model.name,
        "Input": ",".join(p.name for p in spec.inputs),
        "Batch size": config.batch_size,
        "Batch delay": config.max_batch_delay,
        "Workers": config.workers,
        "Precision": config.precision,
        "Concurrency": concurrency,
    }


def failed_row(
    spec: SweepSpec, concurrency: int, config: ServerConfig, reason: str
) -> dict[str, Any]:
    """The row of a configuration whose server did not start: no figures, the reason."""
    return {
        **_identity_columns(spec, concurrency, config),
        "Requests": 0,
        "Failed requests": 0,
        "Throughput": None,
        "Latency P50": None,
        "Latency P90": None,
        "Latency P99": None,
        "Latency mean": None,
        "Error rate": None,
        "Error": reason,
    }


def run_sweep(
    spec: SweepSpec, out: Path, on_row: Callable[[dict[str, Any]], None]
) -> list[dict[str, Any]]:
    """Every configuration on a fresh server; one that does not start gets rows saying
    why (``Error``), and the sweep goes on."""
    name, _ = model_identity(spec.model)
    rows = []
    for index, config in enumerate(spec.configurations()):
        folder = out / "servers" / f"{index:02d}-{config_label(config)}"
        try:
            with start_server(spec.server, spec.model, config, folder) as server:
                warm_up(server.inference_url, name, spec)
                for concurrency in spec.concurrency:
                    row = measure(
                        server.inference_url, server.metrics_url, name, spec, concurrency, config
                    )
                    rows.append(row)
                    on_row(row)
        except ServerFailed as failure:
            for concurrency in spec.concurrency:
                row = failed_row(spec, concurrency, config, str(failure))
                rows.append(row)
                on_row(row)
    return rows


def config_label(config: ServerConfig) -> str:
    """``b8-d10-w2-fp32``: a configuration in file names and progress lines."""
    return f"b{config.batch_size}-d{config.max_batch_delay}-w{config.workers}-{config.precision}"
