"""The figures of a load run, as a JSON document and a printed table."""

from __future__ import annotations

from typing import Any

from ferry.bench.load import LoadResult, LoadSpec


def load_summary(spec: LoadSpec, result: LoadResult) -> dict[str, Any]:
    answered = len(result.latencies_ms)
    errors = {str(status): n for status, n in sorted(result.statuses.items()) if status >= 400}
    errors.update(result.transport_errors)
    return {
        "url": spec.url,
        "mode": "closed" if spec.concurrency is not None else "open",
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "requests_sent": result.requests,
        "responses": answered,
        "dropped": result.dropped,
        "seconds": round(result.seconds, 3),
        "throughput": round(result.throughput, 2),
        "p50_ms": round(result.latency_ms(50), 3) if answered else None,
        "p90_ms": round(result.latency_ms(90), 3) if answered else None,
        "p99_ms": round(result.latency_ms(99), 3) if answered else None,
        "max_ms": round(max(result.latencies_ms), 3) if answered else None,
        "mean_ms": round(sum(result.latencies_ms) / answered, 3) if answered else None,
        "statuses": {str(status): n for status, n in sorted(result.statuses.items())},
        "errors": errors,
        "error_rate": round(sum(errors.values()) / max(1, result.requests), 5),
    }


def format_summary(summary: dict[str, Any]) -> str:
    rows = [
        ("throughput", f"{summary['throughput']} req/s"),
        (
            "latency p50 / p90 / p99 / max",
            " / ".join(str(summary[key]) for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            + " ms",
        ),
        ("responses", f"{summary['responses']} of {summary['requests_sent']} sent"),
        ("errors", ", ".join(f"{k}: {v}" for k, v in summary["errors"].items()) or "none"),
    ]
    server = summary.get("server")
    if server:
        queue = server["queue_ms"]
        rows.append(
            ("server queue p50 / p90 / p99", f"{queue['p50']} / {queue['p90']} / {queue['p99']} ms")
        )
        rows.append(
            ("server batches", f"{server['batches']}, mean size {server['mean_batch_size']}")
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
