"""Find the configuration with the highest goodput whose p99 latency meets an SLO, and
write it into the model's own configuration.

The search is pure: ``evaluate(config, concurrency)`` measures (a real server, or a fake
latency model in tests). For each configuration, concurrency rises until p99 breaks the
SLO — more load only raises p99 — so most of the grid is never run. A configuration whose
server did not start is a failed trial with its reason, and the search goes on.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from ferry_bench.servers import ServerConfig


@dataclass(frozen=True)
class Trial:
    config: ServerConfig
    concurrency: int
    throughput: float
    """Goodput: successful answers per second."""
    p99_ms: float
    error_rate: float = 0.0
    failure: str | None = None
    """Why the configuration could not be measured (its server did not start)."""

    def meets(self, slo_ms: float) -> bool:
        return self.failure is None and self.p99_ms <= slo_ms and self.error_rate == 0


@dataclass(frozen=True)
class TuneResult:
    best: Trial | None
    runners_up: list[Trial]
    trials: list[Trial]
    unmeasured: list[ServerConfig] = field(default_factory=list)
    """Configurations left out when ``fits`` said the time was up."""


Evaluate = Callable[[ServerConfig, int], Trial]


def configurations(
    batch_sizes: Iterable[int],
    delays: Iterable[int],
    workers: Iterable[int],
    precisions: Iterable[str],
) -> list[ServerConfig]:
    """The grid, less points that cannot differ: with batch size 1 the batch delay is
    never waited (a batch of one is full at once), so only the first delay is kept."""
    delays = list(delays)
    grid = []
    for batch_size in batch_sizes:
        for delay in delays[:1] if batch_size == 1 else delays:
            for count in workers:
                for precision in precisions:
                    grid.append(ServerConfig(batch_size, delay, count, precision))
    return grid


def search(
    evaluate: Evaluate,
    configs: Iterable[ServerConfig],
    concurrencies: list[int],
    slo_ms: float,
    runners_up: int = 3,
    fits: Callable[[], bool] = lambda: True,
) -> TuneResult:
    """``fits`` is asked before each configuration whether one more still fits the time
    budget; when not, the rest are ``unmeasured``."""
    trials: list[Trial] = []
    configs, unmeasured = list(configs), []
    for index, config in enumerate(configs):
        if not fits():
            unmeasured = configs[index:]
            break
        for concurrency in sorted(concurrencies):
            trial = evaluate(config, concurrency)
            trials.append(trial)
            if not trial.meets(slo_ms):
                break
    meeting = sorted((t for t in trials if t.meets(slo_ms)), key=lambda t: -t.throughput)
    best_per_config: dict[ServerConfig, Trial] = {}
    for trial in meeting:
        best_per_config.setdefault(trial.config, trial)
    ranked = list(best_per_config.values())
    return TuneResult(ranked[0] if ranked else None, ranked[1 : 1 + runners_up], trials, unmeasured)


def requests_for_percentile(percentile: float, concurrency: int, tail_samples: int = 10) -> int:
    """Requests a run needs so that ``tail_samples`` answers lie beyond the percentile
    (p99 from 200 requests rests on its two slowest), and every client sends several.

    >>> requests_for_percentile(99, 4), requests_for_percentile(99, 256)
    (1000, 2560)
    """
    beyond = max(1e-9, 1 - percentile / 100)
    return max(math.ceil(round(tail_samples / beyond, 6)), 10 * concurrency)  # 1 - 0.9 < 0.1


def tuned_config(base: Mapping[str, Any], config: ServerConfig) -> dict[str, Any]:
    """The archive's model-config with the tuned keys set; every other key kept."""
    document = copy.deepcopy(dict(base))
    document["minWorkers"] = config.workers
    document["maxWorkers"] = config.workers
    document["batchSize"] = config.batch_size
    document["maxBatchDelay"] = config.max_batch_delay
    optimization = dict(document.get("optimization") or {})
    if config.precision != "fp32" or "precision" in optimization:
        optimization["precision"] = config.precision
        document["optimization"] = optimization
    return document


def config_changes(base: Mapping[str, Any], tuned: Mapping[str, Any]) -> list[str]:
    """One line per tuned key: ``batchSize: 1 -> 8``, ``(unchanged)`` or ``(new)``."""
    lines = []
    for key in ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay"):
        lines.append(_change(key, base.get(key), tuned.get(key)))
    before = (base.get("optimization") or {}).get("precision")
    after = (tuned.get("optimization") or {}).get("precision")
    if before is not None or after is not None:
        lines.append(_change("optimization.precision", before, after))
    return lines


def _change(key: str, before: Any, after: Any) -> str:
    if before is None:
        return f"{key}: {after} (new)"
    if before == after:
        return f"{key}: {after} (unchanged)"
    return f"{key}: {before} -> {after}"


def model_config_yaml(trial: Trial, slo_ms: float, base: Mapping[str, Any]) -> str:
    header = (
        f"# Tuned by ferry bench tune: {trial.throughput:.1f} requests/s with p99 "
        f"{trial.p99_ms:.1f} ms (SLO {slo_ms:g} ms) at concurrency {trial.concurrency};\n"
        "# every key but minWorkers, maxWorkers, batchSize, maxBatchDelay and\n"
        "# optimization.precision is the archive's own.\n"
    )
    return header + yaml.safe_dump(tuned_config(base, trial.config), sort_keys=False)
