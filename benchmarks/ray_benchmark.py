"""Ferry on Ray Serve against Ferry alone, on the same machine, in one run.

- The extra hop's cost at one replica: the no-op handler's requests/s at 16 clients, and
  ResNet-18's (TorchScript, random weights, batch 8, 10 ms delay, 224x224 JPEGs) at 16
  clients, through ``ferry serve`` directly and through ``ferry serve --ray`` (Ray Serve's
  proxy, Ferry's router deployment, then the model's replica).
- Scaling: ResNet-18 at one and at two replicas on a two-node Ray cluster emulated on this
  machine (``ray.cluster_utils.Cluster``: two raylets of two logical CPUs each).

Two rounds, each measuring every set-up once in turn; medians. Writes
``benchmarks/results/ray.md``. Needs the ``ray`` extra. Run:
``python benchmarks/ray_benchmark.py`` (about 6 minutes here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    ROOT,
    jpeg_inputs,
    machine_description,
    noop_archive,
    publish,
    resnet18_archive,
)
from ferry.bench.load import LoadSpec, run_load
from ferry.bench.servers import ServerConfig, free_port, start_server

CLIENTS = 16
SECONDS = 10.0
ROUNDS = 2


def throughput(url: str, payloads: list[bytes]) -> float:
    """Successful answers per second at CLIENTS clients after a warm-up; errors stop it."""
    warm = LoadSpec(url, payloads, concurrency=CLIENTS, requests=4 * CLIENTS)
    asyncio.run(run_load(warm))
    spec = LoadSpec(url, payloads, concurrency=CLIENTS, duration=SECONDS)
    result = asyncio.run(run_load(spec))
    if result.failed:
        raise RuntimeError(f"{url}: {dict(result.statuses)} {dict(result.transport_errors)}")
    return result.throughput


@contextlib.contextmanager
def on_ray(store: Path, models: list[str], address: str, work: Path) -> Iterator[dict[str, str]]:
    """``ferry serve --ray ADDRESS``: its inference and management URLs."""
    ready = work / "ready.json"
    log = work / "ray-serve.log"
    argv = [
        sys.executable,
        "-m",
        "ferry",
        "serve",
        "--model-store",
        str(store),
        "--models",
        *models,
        "--inference-address",
        f"http://127.0.0.1:{free_port()}",
        "--management-address",
        f"http://127.0.0.1:{free_port()}",
        "--disable-token-auth",
        "--ready-file",
        str(ready),
        "--ray",
        address,
    ]
    with open(log, "wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ferry serve --ray did not start (log: {log})")
            time.sleep(0.5)  # polling for the ready file of a starting server
        yield json.loads(ready.read_text())
    finally:
        process.terminate()
        process.wait(timeout=120)


def scale(management: str, model: str, replicas: int) -> None:
    response = httpx.put(
        f"{management}/models/{model}",
        params={"min_worker": replicas, "synchronous": "true"},
        timeout=300,
    )
    response.raise_for_status()


@dataclass
class FaultFigures:
    before: float
    """Requests/s over the seconds before the node was removed."""
    after: float
    """Requests/s once the replica is back."""
    answered: int
    failed: Counter[str]
    recovery_s: float
    """From the node's removal until the replacement replica answered."""


def node_fault(cluster: Any, urls: dict[str, str], images: list[bytes]) -> FaultFigures:
    """ResNet-18 at two replicas under CLIENTS clients; the node (not the head) holding
    one replica is removed; counts every outcome, and times the recovery."""
    base = urls["inference"]
    outcomes: Counter[str] = Counter()
    times: list[tuple[float, str]] = []
    nodes: Counter[str] = Counter()
    stop = threading.Event()
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(timeout=120) as http:
            for sent in range(100_000):
                if stop.is_set():
                    return
                try:
                    response = http.post(
                        f"{base}/predictions/resnet18", content=images[sent % len(images)]
                    )
                    outcome = str(response.status_code)
                    node = response.headers.get("x-ferry-ray-node", "")
                except httpx.HTTPError as error:
                    outcome, node = type(error).__name__, ""
                with lock:
                    outcomes[outcome] += 1
                    times.append((time.monotonic(), outcome))
                    nodes[node] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(SECONDS)  # the load's steady state before the fault
    head = cluster.head_node.node_id

    def answering() -> set[str]:
        with lock:
            return set(nodes) - {""}

    serving = answering()
    victim = next(n for n in cluster.list_all_nodes() if n.node_id in serving and n.node_id != head)
    removed = time.monotonic()
    cluster.remove_node(victim)
    # Recovered once the replacement replica answers, from a node not serving before
    # (Ray Serve's status still counts the lost replica until its health check fails).
    while not answering() - serving:
        time.sleep(0.2)  # polling what the load threads record
    recovered = time.monotonic()
    time.sleep(SECONDS)  # the load's steady state after recovery
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    ok_before = sum(1 for t, o in times if o == "200" and removed - SECONDS <= t < removed)
    ok_after = sum(1 for t, o in times if o == "200" and recovered <= t < recovered + SECONDS)
    failed = Counter({k: v for k, v in outcomes.items() if k != "200"})
    return FaultFigures(
        ok_before / SECONDS, ok_after / SECONDS, sum(outcomes.values()), failed, recovered - removed
    )


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from a benchmark

    figures: dict[str, list[float]] = {}
    images = jpeg_inputs(16, 224)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        resnet = store / resnet18_archive(store, batch_size=8, max_batch_delay_ms=10)
        noop = store / noop_archive(store, batch_size=8)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        try:
            for index in range(ROUNDS):
                config = ServerConfig(8, 10, 1)
                with start_server("ferry", noop, config, work / f"direct-noop-{index}") as s:
                    url = f"{s.inference_url}/predictions/noop"
                    figures.setdefault("no-op, Ferry", []).append(throughput(url, [b"x"]))
                with start_server("ferry", resnet, config, work / f"direct-rn-{index}") as s:
                    url = f"{s.inference_url}/predictions/resnet18"
                    figures.setdefault("ResNet-18, Ferry", []).append(throughput(url, images))
                folder = work / f"ray-{index}"
                folder.mkdir()
                models = ["noop=noop.mar", "resnet18=resnet18.mar"]
                with on_ray(store, models, cluster.address, folder) as urls:
                    base = urls["inference"]
                    figures.setdefault("no-op, Ray 1 replica", []).append(
                        throughput(f"{base}/predictions/noop", [b"x"])
                    )
                    figures.setdefault("ResNet-18, Ray 1 replica", []).append(
                        throughput(f"{base}/predictions/resnet18", images)
                    )
                    scale(urls["management"], "resnet18", 2)
                    figures.setdefault("ResNet-18, Ray 2 replicas", []).append(
                        throughput(f"{base}/predictions/resnet18", images)
                    )
                for label, values in figures.items():
                    print(f"round {index}: {label}: {values[-1]:.1f} req/s", flush=True)
            cluster.add_node(num_cpus=2)  # where the lost replica can go
            cluster.wait_for_nodes()
            folder = work / "fault"
            folder.mkdir()
            with on_ray(store, ["resnet18=resnet18.mar"], cluster.address, folder) as urls:
                scale(urls["management"], "resnet18", 2)
                fault = node_fault(cluster, urls, images)
                print(f"node fault: {fault}", flush=True)
        finally:
            cluster.shutdown()
    write(figures, fault)


def write(figures: dict[str, list[float]], fault: FaultFigures) -> None:
    med = {label: statistics.median(values) for label, values in figures.items()}
    lines = [
        "# Ferry on Ray Serve against Ferry alone",
        "",
        f"Machine: {machine_description()}; servers, Ray and the load generator share it.",
        "Command: `python benchmarks/ray_benchmark.py` (one run): "
        f"{CLIENTS} clients, closed loop, {SECONDS:g} s per point after a warm-up, "
        f"{ROUNDS} rounds, medians. Ray: a two-node cluster emulated on this machine "
        "(`ray.cluster_utils.Cluster`, two logical CPUs per node, one Ray Serve proxy on the "
        "head). Each replica runs one Ferry worker; batch size 8, batch delay 10 ms.",
        "",
        "| workload | req/s | against Ferry alone |",
        "|---|---|---|",
    ]
    for label, value in med.items():
        direct = med[label.split(",")[0] + ", Ferry"]
        lines.append(f"| {label} | {value:.1f} | {value / direct:.2f} |")
    two = med["ResNet-18, Ray 2 replicas"] / med["ResNet-18, Ray 1 replica"]
    lines += [
        "",
        f"Two replicas against one: {two:.2f}x. This machine has 2 cores: one Ferry worker "
        "already runs ResNet-18 on both (torch threads), so the cores, not the replicas, "
        "are the ceiling: the ceiling of two replicas here is Ferry alone's figure, and "
        f"two replicas reach {med['ResNet-18, Ray 2 replicas'] / med['ResNet-18, Ferry']:.2f} "
        "of it. On real machines each node brings its own cores: start Ray on each "
        "(`ray start --head` on one, `ray start --address HEAD:6379` on the others, or "
        "KubeRay's RayCluster), give `ferry serve --ray HEAD:6379` the same model store path "
        "on every node, and size replicas with the model's `ray:` section "
        "(`ray_actor_options`: `num_cpus`, `num_gpus`).",
        "",
        "## A node removed under load",
        "",
        "A third node is added; ResNet-18 runs two replicas under the same load, and after "
        f"{SECONDS:g} s the node (not the head) holding one of them is removed "
        "(`Cluster.remove_node`: its raylet and every process on it die).",
        "",
        f"- requests answered: {fault.answered}; not 200: "
        f"{dict(fault.failed) or 'none'} (a request the lost replica held is retried once "
        "on the other; a second loss is a 503 naming it)",
        f"- the replacement replica answered {fault.recovery_s:.1f} s after the removal",
        f"- throughput: {fault.before:.1f} req/s before, {fault.after:.1f} req/s after "
        f"recovery ({fault.after / fault.before:.2f})",
        "",
    ]
    publish(ROOT / "benchmarks" / "results" / "ray.md", lines)


if __name__ == "__main__":
    main()
