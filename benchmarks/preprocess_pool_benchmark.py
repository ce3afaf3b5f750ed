"""Preprocess in threads or in processes, for preprocessing written in pure Python.

    python benchmarks/preprocess_pool_benchmark.py --out benchmarks/results/preprocess_pool.md

One server, two models with the same handler (pure-Python parsing and standardising of
20,000 comma-separated numbers per request, then a linear layer), one worker each, batch
size 8, ``micro_batching`` with micro-batches of 2 and two preprocess workers: ``pool:
thread`` and ``pool: process``. Rounds alternate; the median of per-round throughput
ratios is reported.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import alternating_rounds, machine_description, publish
from benchmarks.server import ferry_server
from ferry.store.writer import ArchiveSpec, write_archive

HANDLER = Path(__file__).resolve().parent / "handlers" / "python_preprocess.py"
FEATURES = 20_000


def archive(store: Path, name: str, pool: str) -> str:
    folder = store / f".{name}-src"
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = torch.nn.Linear(FEATURES, 10).eval()
        traced = torch.jit.trace(model, torch.randn(1, FEATURES))  # type: ignore[no-untyped-call]
        traced.save(str(folder / "linear.pt"))
    config = {
        "minWorkers": 1,
        "batchSize": 8,
        "maxBatchDelay": 10,
        "micro_batching": {
            "micro_batch_size": 2,
            "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1},
            "pool": pool,
        },
    }
    (folder / "model-config.yaml").write_text(yaml.safe_dump(config))
    spec = ArchiveSpec(
        name,
        str(HANDLER),
        serialized_file=folder / "linear.pt",
        config_file=folder / "model-config.yaml",
    )
    return write_archive(spec, store, force=True).name


def payloads(count: int) -> list[bytes]:
    rng = random.Random(0)
    return [
        ",".join(f"{rng.gauss(0, 1):.5f}" for _ in range(FEATURES)).encode() for _ in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/preprocess_pool.md"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=240)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-pool-"))
    store = tmp / "store"
    store.mkdir()
    models = {pool: archive(store, pool, pool) for pool in ("thread", "process")}
    bodies = payloads(32)
    specs = [f"{pool}={name}" for pool, name in models.items()]
    with ferry_server(store, specs, tmp, "--access-log", "false") as server:
        figures = alternating_rounds(
            server.url,
            {pool: (bodies, "application/octet-stream") for pool in models},
            16,
            args.requests,
            args.rounds,
        )
    ratios = [p / t for p, t in zip(figures["process"], figures["thread"], strict=True)]
    med = statistics.median
    publish(
        args.out,
        [
            "# Preprocess in threads or processes (pure-Python preprocessing)",
            "",
            f"Machine: {machine_description()}.",
            f"Requests of {FEATURES:,} comma-separated numbers "
            f"({statistics.mean(map(len, bodies)) / 1e3:.0f} kB), parsed and standardised in "
            "pure Python, then a linear layer; one worker per model, batch size 8, "
            "concurrency 16, `micro_batching` with micro-batches of 2 and 2 preprocess "
            f"workers. {args.rounds} rounds of {args.requests} requests, alternating which "
            "goes first. Produced by `benchmarks/preprocess_pool_benchmark.py` in one run.",
            "",
            "| micro_batching pool | median requests/s |",
            "|---|---|",
            f"| thread | {med(figures['thread']):.1f} |",
            f"| process | {med(figures['process']):.1f} |",
            "",
            f"Median per-round ratio process / thread: **{med(ratios):.2f}x**. Per round: "
            + ", ".join(f"{r:.2f}" for r in ratios)
            + ".",
            "",
        ],
    )


if __name__ == "__main__":
    main()
