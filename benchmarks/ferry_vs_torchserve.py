"""Ferry against TorchServe, side by side in one run, on the same archives and handler.

    bash scripts/torchserve-venv.sh           # TorchServe 0.12 in .venv-torchserve
    TORCHSERVE_BIN_DIR=.venv-torchserve/bin .venv/bin/python benchmarks/ferry_vs_torchserve.py

ResNet-18 (random weights, TorchScript) behind a TorchServe-style handler, JPEG input, one
worker, batch size 1 and 8, concurrency 1 and 16; plus a no-op handler at concurrency 16
and 64 (the servers' own overhead). Each server gets
the same config.properties (``models`` JSON for batch size, delay and workers); rounds
alternate which server goes first; medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    closed_loop,
    jpeg_inputs,
    machine_description,
    noop_archive,
    publish,
    ts_style_resnet18_archive,
)
from ferry_bench.servers import ServerConfig, start_server


def measure(
    url: str, payloads: list[bytes], concurrency: int, requests: int
) -> tuple[float, float, float]:
    result = closed_loop(url, payloads, concurrency, requests, "image/jpeg")
    return result.throughput, result.latency_ms(50), result.latency_ms(99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/ferry_vs_torchserve.md")
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="target length of a load run")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-vs-ts-"))
    store = tmp / "store"
    store.mkdir()
    resnet = store / ts_style_resnet18_archive(store, batch_size=1, max_batch_delay_ms=10)
    noop = store / noop_archive(store, batch_size=8)
    payloads = jpeg_inputs(64, 480)
    cases = [
        ("resnet18", resnet, batch, concurrency) for batch in (1, 8) for concurrency in (1, 16)
    ]
    cases += [("no-op", noop, 8, concurrency) for concurrency in (16, 64)]
    results: dict[tuple[str, int, int, str], list[tuple[float, float, float]]] = {}
    servers = ["ferry", "torchserve"]
    for round_index in range(args.rounds):
        for kind in servers if round_index % 2 == 0 else list(reversed(servers)):
            for model in (resnet, noop):
                batches = sorted({b for name, m, b, _ in cases if m == model})
                for batch in batches:
                    config = ServerConfig(batch, 10, 1)
                    folder = tmp / f"{kind}-{model.stem}-b{batch}-r{round_index}"
                    with start_server(kind, model, config, folder) as server:
                        name = "resnet18" if model == resnet else "noop"
                        url = f"{server.inference_url}/predictions/{name}"
                        for label, m, b, concurrency in cases:
                            if m != model or b != batch:
                                continue
                            body = payloads if model == resnet else [b"x"]
                            rate = 40 if model == resnet else 3000
                            measure(url, body, concurrency, 2 * concurrency)  # warm-up
                            figures = measure(
                                url, body, concurrency, max(50, int(rate * args.seconds))
                            )
                            results.setdefault((label, b, concurrency, kind), []).append(figures)
                            print(
                                f"{kind} {label} batch {b} c{concurrency}: "
                                f"{figures[0]:.1f} req/s, p50 {figures[1]:.1f} ms",
                                flush=True,
                            )
    write_report(args, cases, results)


def write_report(args, cases, results) -> None:  # type: ignore[no-untyped-def]
    med = statistics.median
    lines = [
        "# Ferry against TorchServe",
        "",
        f"Machine: {machine_description()}.",
        "Same archives (written by `ferry archive`, read by both servers), same TorchServe-style "
        "handler (PIL + torch, `benchmarks/handlers/resnet_handler.py`), same config.properties; "
        "ResNet-18 random weights, TorchScript, 480x480 JPEGs; one worker; max_batch_delay 10 ms. "
        f"{args.rounds} rounds alternating the server that goes first; medians. Ferry ran with "
        "its defaults except the access log (TorchServe writes its access log asynchronously). "
        "Produced by `benchmarks/ferry_vs_torchserve.py` in one run.",
        "",
        "| workload | batch | concurrency | Ferry req/s | TorchServe req/s | Ferry / TorchServe | "
        "Ferry p50 ms | TorchServe p50 ms | Ferry p99 ms | TorchServe p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, _, batch, concurrency in cases:
        ferry = results[(label, batch, concurrency, "ferry")]
        ts = results[(label, batch, concurrency, "torchserve")]
        f_rps, t_rps = med([r[0] for r in ferry]), med([r[0] for r in ts])
        lines.append(
            f"| {label} | {batch} | {concurrency} | {f_rps:.1f} | {t_rps:.1f} | "
            f"{f_rps / t_rps:.2f} | "
            f"{med([r[1] for r in ferry]):.1f} | {med([r[1] for r in ts]):.1f} | "
            f"{med([r[2] for r in ferry]):.1f} | {med([r[2] for r in ts]):.1f} |"
        )
    lines.append("")
    publish(args.out, lines)


if __name__ == "__main__":
    main()
