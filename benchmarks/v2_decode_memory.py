"""What a large binary V2 tensor costs the server's memory (issue 29, defect 6).

One Ferry server, a handler that answers how many elements each input held; requests of
one BOOL tensor of ``--elements`` elements in the binary tensor data extension (one byte
each: 6 MB for the default 6,000,000), sent once alone and then ``--concurrency`` at once.
Reported: the peak resident memory (``VmHWM``) of the frontend and of the worker before
the first request and after each step, so the growth is what decoding the requests cost.

    python benchmarks/v2_decode_memory.py

To measure another revision, copy this script and ``benchmarks/server.py`` into its
checkout and run them there with ``PYTHONPATH=.`` (so that its worker processes import
that Ferry too); the limits that revision does not know are not passed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, machine_description, publish
from benchmarks.fault_load import revision, status_mib, worker_pid
from benchmarks.server import BenchmarkServer, ferry_server
from ferry.config.settings import ServerSettings
from ferry.store.writer import ArchiveSpec, write_archive

COUNTING_HANDLER = """def handle(data, context):
    if data is None:
        return None
    return [[len(tensor["data"]) for tensor in row["body"]["inputs"]] for row in data]
"""


def counting_archive(store: Path) -> str:
    folder = store / ".count-src"
    folder.mkdir(parents=True, exist_ok=True)
    handler = folder / "count_handler.py"
    handler.write_text(COUNTING_HANDLER)
    config = folder / "model-config.yaml"
    config.write_text("minWorkers: 1\nbatchSize: 1\n")
    return write_archive(ArchiveSpec("count", str(handler), config_file=config), store).name


def request(elements: int) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "mask",
                    "datatype": "BOOL",
                    "shape": [elements],
                    "parameters": {"binary_data_size": elements},
                }
            ]
        }
    ).encode()
    headers = {"inference-header-content-length": str(len(header))}
    return header + b"\x01" * elements, headers


def peaks(frontend: int, worker: int) -> tuple[float, float]:
    """Each process's peak resident memory so far, in MiB."""
    return status_mib(frontend, "VmHWM"), status_mib(worker, "VmHWM")


def send(server: BenchmarkServer, body: bytes, headers: dict[str, str], expected: int) -> None:
    answer = httpx.post(
        f"{server.url}/v2/models/count/infer", content=body, headers=headers, timeout=300
    )
    answer.raise_for_status()
    counted = answer.json()["outputs"][0]["data"]
    if counted != [expected]:
        raise RuntimeError(f"the handler counted {counted}, expected [{expected}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=6_000_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/v2_decode_memory.md")
    args = parser.parse_args()
    body, headers = request(args.elements)
    size = str(len(body) + 1024)
    flags = ["--max-request-size", size, "--max-response-size", size]
    if "max_tensor_elements" in ServerSettings.__dataclass_fields__:
        flags += ["--max-tensor-elements", str(args.elements)]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        store = tmp / "store"
        store.mkdir()
        with ferry_server(store, [f"count={counting_archive(store)}"], tmp, *flags) as server:
            worker = worker_pid(server, "count")
            rows.append(("before any request", *peaks(server.pid, worker)))
            send(server, body, headers, args.elements)
            rows.append(("after one request", *peaks(server.pid, worker)))
            with ThreadPoolExecutor(args.concurrency) as pool:
                sends = [
                    pool.submit(send, server, body, headers, args.elements)
                    for _ in range(args.concurrency)
                ]
                for sent in sends:
                    sent.result()
            label = f"after {args.concurrency} at once"
            rows.append((label, *peaks(server.pid, worker)))
    lines = [
        "# Memory a large binary V2 tensor costs",
        "",
        f"Machine: {machine_description()}.",
        f"Ferry at {revision()}; `python benchmarks/v2_decode_memory.py --elements "
        f"{args.elements} --concurrency {args.concurrency}`.",
        "",
        f"Each request: one BOOL tensor of {args.elements:,} elements in the binary tensor "
        f"data extension ({len(body) / 1e6:.1f} MB); the handler answers how many elements "
        "it received. Peak resident memory (VmHWM) of each process, in MiB:",
        "",
        "| when | frontend | worker |",
        "|---|---:|---:|",
        *(f"| {when} | {front:.0f} | {work:.0f} |" for when, front, work in rows),
    ]
    publish(args.out, lines)


if __name__ == "__main__":
    main()
