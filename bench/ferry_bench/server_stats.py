"""Server-side figures for a load run, read from a Ferry metrics endpoint before and after."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import aiohttp

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> Samples:
    samples: Samples = {}
    for line in text.splitlines():
        match = _LINE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        labels = frozenset(_LABEL.findall(match.group(3) or ""))
        samples[(match.group(1), labels)] = float(match.group(4))
    return samples


@dataclass(frozen=True)
class HistogramDelta:
    buckets: list[tuple[float, float]]
    """(upper bound, cumulative count), ascending, ending with +Inf."""
    total: float
    count: float

    def quantile(self, q: float) -> float:
        """Prometheus' histogram_quantile: linear within the bucket holding rank q."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower_bound, lower_count = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower_bound
                width = cumulative - lower_count
                share = (rank - lower_count) / width if width > 0 else 1.0
                return lower_bound + (bound - lower_bound) * share
            lower_bound, lower_count = bound, cumulative
        return lower_bound

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else math.nan


def _matching(
    samples: Samples, metric: str, wanted: set[tuple[str, str]]
) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(labels), value)
        for (sample, labels), value in samples.items()
        if sample == metric and wanted <= set(labels)
    ]


def _buckets(samples: Samples, name: str, wanted: set[tuple[str, str]]) -> dict[float, float]:
    counts: dict[float, float] = {}
    for labels, value in _matching(samples, f"{name}_bucket", wanted):
        bound = float(labels["le"])  # "+Inf" parses as infinity
        counts[bound] = counts.get(bound, 0.0) + value
    return counts


def histogram_delta(before: Samples, after: Samples, name: str, **labels: str) -> HistogramDelta:
    """The observations made between two scrapes, summed over series matching ``labels``."""
    wanted = set(labels.items())
    old, new = _buckets(before, name, wanted), _buckets(after, name, wanted)
    buckets = [(bound, new[bound] - old.get(bound, 0.0)) for bound in sorted(new)]

    def delta(metric: str) -> float:
        return sum(v for _, v in _matching(after, metric, wanted)) - sum(
            v for _, v in _matching(before, metric, wanted)
        )

    return HistogramDelta(buckets, delta(f"{name}_sum"), delta(f"{name}_count"))


async def scrape(url: str) -> Samples | None:
    """The metrics at ``url``, or None when there is no Ferry metrics endpoint there."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
            session.get(url) as response,
        ):
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    return parse_exposition(text) if "ferry_queue_wait_seconds" in text else None


def server_figures(
    before: Samples, after: Samples, model: str, client_max_ms: float | None = None
) -> dict[str, object]:
    """Queue time percentiles and batch-size distribution for ``model`` during the run.

    The percentiles are interpolated within histogram buckets; when one exceeds the
    slowest successful answer the client measured (``client_max_ms``), it can only be the
    bucket's bound, and ``queue_is_bucket_bound`` says so."""
    queue = histogram_delta(before, after, "ferry_queue_wait_seconds", model_name=model)
    batch = histogram_delta(before, after, "ferry_batch_size", model_name=model)
    distribution = {}
    previous = 0.0
    for bound, cumulative in batch.buckets:
        label = "+Inf" if math.isinf(bound) else f"{bound:g}"
        distribution[f"<={label}"] = int(cumulative - previous)
        previous = cumulative
    queue_ms = {f"p{q}": round(queue.quantile(q / 100) * 1000, 3) for q in (50, 90, 99)}
    above_client = client_max_ms is not None and any(v > client_max_ms for v in queue_ms.values())
    return {
        "queue_ms": queue_ms | {"mean": round(queue.mean * 1000, 3)},
        "queue_is_bucket_bound": above_client,
        "batches": int(batch.count),
        "mean_batch_size": round(batch.mean, 2),
        "batch_size_distribution": distribution,
    }
