"""The figures of a load run, as a JSON document and a printed table.

Throughput is goodput: successful (2xx, gRPC OK) answers per second; latency percentiles
describe successful answers only; everything else is counted as an error by kind.
"""

from __future__ import annotations

from typing import Any

from ferry.bench.load import LoadResult, LoadSpec


def _ms(value: float) -> float:
    return round(value, 3)


def load_summary(spec: LoadSpec, result: LoadResult) -> dict[str, Any]:
    succeeded = len(result.latencies_ms)
    errors = {str(status): n for status, n in sorted(result.statuses.items()) if status >= 300}
    errors.update(result.transport_errors)
    if result.dropped:
        errors["dropped"] = result.dropped
    latencies: dict[str, float | None] = {
        key: _ms(result.latency_ms(q)) if succeeded else None
        for key, q in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99))
    }
    return {
        "url": spec.url,
        "mode": "closed" if spec.concurrency is not None else "open",
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "requests_sent": result.requests,
        "responses": result.answered,
        "succeeded": succeeded,
        "dropped": result.dropped,
        "seconds": round(result.seconds, 3),
        "goodput": round(result.throughput, 2),
        **latencies,
        "max_ms": _ms(max(result.latencies_ms)) if succeeded else None,
        "mean_ms": _ms(sum(result.latencies_ms) / succeeded) if succeeded else None,
        "statuses": {str(status): n for status, n in sorted(result.statuses.items())},
        "grpc_codes": dict(sorted(result.codes.items())),
        "errors": errors,
        "error_rate": round(result.error_rate, 5),
    }


def format_summary(summary: dict[str, Any]) -> str:
    succeeded, sent = summary["succeeded"], summary["requests_sent"]
    if succeeded:
        latency = (
            " / ".join(str(summary[key]) for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            + " ms (successful answers)"
        )
    else:
        latency = "none: no request succeeded"
    rows = [
        ("goodput", f"{summary['goodput']} req/s (successful answers only)"),
        ("latency p50 / p90 / p99 / max", latency),
        ("succeeded", f"{succeeded} of {sent} sent ({summary['responses']} answered)"),
        ("errors", _errors(summary)),
    ]
    server = summary.get("server")
    if isinstance(server, dict):
        queue = server["queue_ms"]
        bound = " (bucket bounds)" if server.get("queue_is_bucket_bound") else ""
        rows.append(
            (
                "server queue p50 / p90 / p99",
                f"{queue['p50']} / {queue['p90']} / {queue['p99']} ms{bound}",
            )
        )
        rows.append(
            ("server batches", f"{server['batches']}, mean size {server['mean_batch_size']}")
        )
    elif isinstance(server, str):
        rows.append(("server figures", server))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _errors(summary: dict[str, Any]) -> str:
    if not summary["errors"]:
        return "none"
    listed = ", ".join(f"{kind}: {count}" for kind, count in summary["errors"].items())
    codes = summary.get("grpc_codes") or {}
    failing = {code: n for code, n in codes.items() if code != "OK"}
    if failing:
        listed += " (gRPC " + ", ".join(f"{code}: {n}" for code, n in failing.items()) + ")"
    return f"{listed}; error rate {summary['error_rate']:.2%}"
