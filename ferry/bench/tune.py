"""Find the configuration with the highest throughput whose p99 latency meets an SLO.

The search is pure: ``evaluate(config, concurrency)`` measures (a real server, or a fake
latency model in tests). For each configuration, concurrency rises until p99 breaks the
SLO — more load only raises p99 — so most of the grid is never run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ferry.bench.servers import ServerConfig


@dataclass(frozen=True)
class Trial:
    config: ServerConfig
    concurrency: int
    throughput: float
    p99_ms: float
    error_rate: float = 0.0

    def meets(self, slo_ms: float) -> bool:
        return self.p99_ms <= slo_ms and self.error_rate == 0


@dataclass(frozen=True)
class TuneResult:
    best: Trial | None
    runners_up: list[Trial]
    trials: list[Trial]


Evaluate = Callable[[ServerConfig, int], Trial]


def search(
    evaluate: Evaluate,
    configs: Iterable[ServerConfig],
    concurrencies: list[int],
    slo_ms: float,
    runners_up: int = 3,
) -> TuneResult:
    trials: list[Trial] = []
    for config in configs:
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
    return TuneResult(ranked[0] if ranked else None, ranked[1 : 1 + runners_up], trials)


def model_config_yaml(trial: Trial, slo_ms: float) -> str:
    config = trial.config
    return (
        f"# Chosen by ferry bench tune: {trial.throughput:.1f} requests/s with p99 "
        f"{trial.p99_ms:.1f} ms (SLO {slo_ms:g} ms) at concurrency {trial.concurrency}.\n"
        f"minWorkers: {config.workers}\n"
        f"maxWorkers: {config.workers}\n"
        f"batchSize: {config.batch_size}\n"
        f"maxBatchDelay: {config.max_batch_delay}\n"
        + (
            f"optimization:\n  precision: {config.precision}\n"
            if config.precision != "fp32"
            else ""
        )
    )
