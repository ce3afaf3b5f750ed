"""Device-side asserts under load: does every request still get its answer? (issue 49)

    python benchmarks/gpu_fault_load.py [--seconds 20] [--out benchmarks/results/gpu_fault_load.md]

One model on the GPU (``benchmarks/handlers/gpu_fault.py``: a request ``assert`` fires a
real device-side assert, a sticky CUDA error after which every CUDA call in the process
fails; any other request answers a sum computed on the GPU and its worker's pid), two
workers, batches of up to 8 within 5 ms, loaded by ``--clients`` closed-loop clients for
``--seconds`` while ``--asserts`` assert requests are sent, evenly spread. A worker exits
on a sticky error (``ferry/worker/device_failure.py``); the frontend replaces it and
retries the asserting request's batch-mates one at a time, so only the assert fails.

Reported: valid requests sent, answered right, answered otherwise (status, or a wrong
sum), hung (no answer within 60 s) and transport errors; each assert's status; the
workers seen. PASS when every valid request was answered right, every assert answered an
error, nothing hung, and the requests after the load were answered.
Without a CUDA GPU it says ``SKIP: ...`` and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, publish
from benchmarks.server import ferry_server
from ferry.store.writer import ArchiveSpec, write_archive

HANDLER = Path(__file__).resolve().parent / "handlers" / "gpu_fault.py"
HANG = 60.0
"""Seconds without an answer after which a request counts as hung."""
RIGHT_SUM = 6
"""What the handler answers a valid request: ``arange(4).sum()`` on the GPU."""
CONFIG = {
    "minWorkers": 2,
    "maxWorkers": 2,
    "batchSize": 8,
    "maxBatchDelay": 5,
    "responseTimeout": 60,
}


@dataclass
class Tally:
    """What the valid requests got."""

    sent: int = 0
    right: int = 0
    otherwise: Counter[str] = field(default_factory=Counter)
    """Non-200 statuses and wrong answers, by kind."""
    hung: int = 0
    transport: Counter[str] = field(default_factory=Counter)
    pids: set[int] = field(default_factory=set)

    def record(self, answer: httpx.Response) -> None:
        if answer.status_code != 200:
            self.otherwise[f"status {answer.status_code}"] += 1
            return
        body = answer.json()
        if body.get("sum") != RIGHT_SUM:
            self.otherwise[f"wrong answer {body}"] += 1
            return
        self.right += 1
        self.pids.add(int(body["pid"]))


async def valid_requests(client: httpx.AsyncClient, url: str, until: float, tally: Tally) -> None:
    while time.monotonic() < until:
        tally.sent += 1
        try:
            tally.record(await client.post(url, content=b"ok", timeout=HANG))
        except httpx.TimeoutException:
            tally.hung += 1
        except httpx.HTTPError as error:
            tally.transport[type(error).__name__] += 1


async def asserts(client: httpx.AsyncClient, url: str, count: int, seconds: float) -> list[str]:
    """``count`` assert requests spread over ``seconds``: each one's status and message."""
    start, answers = time.monotonic(), []
    for index in range(count):
        await asyncio.sleep(
            max(0.0, start + (index + 1) * seconds / (count + 1) - time.monotonic())
        )
        try:
            answer = await client.post(url, content=b"assert", timeout=HANG)
            answers.append(f"{answer.status_code} {answer.text[:120]!r}")
        except httpx.HTTPError as error:
            answers.append(f"no answer: {type(error).__name__}")
    return answers


async def load(url: str, args: argparse.Namespace) -> tuple[Tally, list[str], Tally]:
    """(under load, the asserts' answers, the requests after the load)."""
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        tally = Tally()
        until = time.monotonic() + args.seconds
        clients = [valid_requests(client, url, until, tally) for _ in range(args.clients)]
        asserting = asyncio.ensure_future(asserts(client, url, args.asserts, args.seconds))
        await asyncio.gather(*clients)
        asserted = await asserting
        after = Tally()
        for _ in range(10):
            after.sent += 1
            after.record(await client.post(url, content=b"ok", timeout=HANG))
    return tally, asserted, after


def verdict(tally: Tally, asserted: list[str], after: Tally) -> list[str]:
    """What went wrong; empty when nothing did."""
    problems = []
    if tally.right != tally.sent:
        lost = tally.sent - tally.right
        problems.append(f"{lost} of {tally.sent} valid requests not answered right")
    if any(answer.startswith(("200", "no answer")) for answer in asserted):
        problems.append(f"an assert was answered 200 or not at all: {asserted}")
    if after.right != after.sent:
        problems.append(f"after the load {after.right} of {after.sent} answered right")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--asserts", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_fault_load.md"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"SKIP: no CUDA GPU here (torch {torch.__version__})")
        return 2
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-fault-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "model-config.yaml").write_text(yaml.safe_dump(CONFIG))
        spec = ArchiveSpec("faulty", str(HANDLER), config_file=tmp / "model-config.yaml")
        store = tmp / "store"
        store.mkdir()
        archive = write_archive(spec, store, force=True).name
        with ferry_server(store, [f"faulty={archive}"], tmp) as server:
            url = f"{server.url}/predictions/faulty"
            first = Tally()  # both workers up and answering before the load
            for _ in range(8):
                first.record(httpx.post(url, content=b"ok", timeout=HANG))
            tally, asserted, after = asyncio.run(load(url, args))
    problems = verdict(tally, asserted, after)
    lines = [
        "# Device-side asserts under load (issue 49)",
        "",
        f"Machine: {machine_description()}; GPU: {torch.cuda.get_device_name(0)}.",
        f"`benchmarks/gpu_fault_load.py`: {args.clients} clients for {args.seconds:g} s, "
        f"{args.asserts} asserts spread over them; model config {CONFIG}.",
        "",
        "| valid requests | answered right | otherwise | hung | transport errors | workers seen |",
        "|---|---|---|---|---|---|",
        f"| {tally.sent} | {tally.right} | {dict(tally.otherwise) or 0} | {tally.hung} "
        f"| {dict(tally.transport) or 0} | {len(tally.pids | first.pids | after.pids)} |",
        "",
        *(f"- assert {i + 1}: {answer}" for i, answer in enumerate(asserted)),
        f"- after the load: {after.right} of {after.sent} answered right",
        "",
        *(f"- problem: {problem}" for problem in problems),
    ]
    publish(args.out, lines)
    if problems:
        print(f"FAIL: {problems[0]}")
        return 1
    print(
        f"PASS: {tally.right} of {tally.sent} answered right, {args.asserts} asserts failed alone"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
