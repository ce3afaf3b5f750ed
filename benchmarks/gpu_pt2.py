"""PyTorch 2 formats on the GPU (issue 49): an AOTInductor package compiled for ``cuda``
and ``torch.compile`` (Triton kernels) served beside TorchScript, and a restarted
compiled worker's start-up from the model's compile cache, in one run.

    python benchmarks/gpu_pt2.py --out benchmarks/results/gpu_pt2.md

ResNet-18 (``examples/models/resnet.py``, seeded random weights) as three archives behind
``benchmarks/handlers/tensor_classifier.py`` (raw 3x224x224 uint8 pixels, normalised on
the GPU, top 5 out), batches of up to 16 within 5 ms, one worker on GPU 0:

- TorchScript (a trace);
- AOTInductor: ``ferry archive --aot-inductor --aot-device cuda`` as a user runs it (its
  time is the compile's), batch 1 to 16;
- ``torch.compile`` (``optimization: compile``, batches padded to 16, warmed up at load).

For each served model: seconds from launching ``ferry serve`` to its first answer; the
answer to the same pixels against TorchScript's (largest probability difference);
requests/s at 32 closed-loop clients in rounds that alternate the three; and the time a
worker killed with SIGKILL takes to be replaced and ready. For ``torch.compile`` that
replacement loads the Triton kernels the first worker compiled into the model's cache:
its share of the first start is the figure.

Without a CUDA GPU it says SKIP and exits 2 (the GPU kit's dry run).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import closed_loop, machine_description, publish
from benchmarks.server import BenchmarkServer, ferry_server
from examples.models.resnet import resnet18
from ferry.store.writer import ArchiveSpec, write_archive
from ferry.worker.torch_setup import SPARE_READY

ROOT = Path(__file__).resolve().parents[1]
HANDLER = ROOT / "benchmarks" / "handlers" / "tensor_classifier.py"
FORMATS = ("TorchScript", "AOTInductor", "torch.compile")
BATCH = 16
CONCURRENCY = 32
MODEL_SOURCE = """
from examples_resnet import BasicBlock, ResNet


class Model(ResNet):
    def __init__(self):
        super().__init__(BasicBlock, [2, 2, 2, 2])
"""


@dataclass
class Figures:
    aot_compile_s: float = 0.0
    first_answer_s: dict[str, float] = field(default_factory=dict)
    restarted_s: dict[str, float] = field(default_factory=dict)
    throughput: dict[str, list[float]] = field(default_factory=dict)
    difference: dict[str, float] = field(default_factory=dict)
    aot_failure: str = ""
    """Why ``ferry archive --aot-inductor`` failed, if it did: the other formats go on."""
    aot_output_tail: list[str] = field(default_factory=list)
    """The failed compile's last lines (with faulthandler's stack if it crashed)."""
    triton_kernels: int = -1
    """Compiled Triton kernels (``.cubin``) in the compile server's folders."""


def skip_without_gpu(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        print(f"SKIP: no CUDA GPU here (torch {torch.__version__}); --device cpu: a smoke run")
        raise SystemExit(2)


def sources(work: Path) -> tuple[Path, Path, Path]:
    """The model file and its module, the state dict, the TorchScript trace."""
    torch.manual_seed(0)
    model = resnet18().eval()
    (work / "examples_resnet.py").write_text((ROOT / "examples/models/resnet.py").read_text())
    model_file = work / "model.py"
    model_file.write_text(MODEL_SOURCE)
    weights = work / "weights.pt"
    torch.save(model.state_dict(), weights)
    scripted = work / "model.torchscript.pt"
    with torch.no_grad():
        torch.jit.trace(model, torch.randn(2, 3, 224, 224)).save(str(scripted))  # type: ignore[no-untyped-call]
    return model_file, weights, scripted


def config(work: Path, compiled: bool) -> Path:
    body: dict[str, Any] = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": BATCH,
        "maxBatchDelay": 5,
        "deviceType": "gpu",
        "jobQueueSize": 4 * CONCURRENCY,
        "responseTimeout": 300,
        "startupTimeout": 600,
    }
    if compiled:
        body["optimization"] = {
            "compile": "default",
            "batch_buckets": [BATCH],
            "warmup": {"input_shape": [3, 224, 224], "batch_sizes": [BATCH]},
        }
    path = work / f"model-config{'-compiled' if compiled else ''}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def archives(
    work: Path, store: Path, figures: Figures, device: str, with_aot: bool
) -> dict[str, str]:
    model_file, weights, scripted = sources(work)
    plain, compiled = config(work, False), config(work, True)
    names = {
        "TorchScript": write_archive(
            ArchiveSpec("r18-ts", str(HANDLER), serialized_file=scripted, config_file=plain),
            store,
            force=True,
        ).name,
        "torch.compile": write_archive(
            ArchiveSpec(
                "r18-compile",
                str(HANDLER),
                serialized_file=weights,
                model_file=model_file,
                extra_files=(work / "examples_resnet.py",),
                config_file=compiled,
            ),
            store,
            force=True,
        ).name,
    }
    if not with_aot:
        return names
    # faulthandler: a crash in the compiler (signal 11 on the H200) leaves its Python stack
    argv = [sys.executable, "-X", "faulthandler", "-m", "ferry", "archive"]
    argv += ["--model-name", "r18-aoti"]
    argv += ["--handler", str(HANDLER), "--model-file", str(model_file)]
    argv += ["--serialized-file", str(weights), "--extra-files", str(work / "examples_resnet.py")]
    argv += ["--config-file", str(plain), "--aot-inductor", "--aot-device", device]
    argv += ["--input-shape", "3,224,224", "--max-batch", str(BATCH)]
    argv += ["--export-path", str(store), "--force"]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    figures.aot_compile_s = time.monotonic() - started
    if done.returncode != 0:  # its status and last words; the other formats still run
        last = " / ".join((done.stdout + done.stderr).strip().splitlines()[-6:])
        figures.aot_output_tail = (done.stdout + done.stderr).strip().splitlines()[-40:]
        status = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        figures.aot_failure = f"{status} after {figures.aot_compile_s:.0f} s: {last}"
        print(f"ferry archive --aot-inductor --aot-device {device}: {figures.aot_failure}")
        return names
    print(f"ferry archive --aot-inductor: {figures.aot_compile_s:.1f} s", flush=True)
    names["AOTInductor"] = "r18-aoti.mar"
    return names


@dataclass
class Served:
    server: BenchmarkServer
    model: str
    folder: Path

    @property
    def url(self) -> str:
        return f"{self.server.url}/predictions/{self.model}"


@contextmanager
def serve(
    store: Path, archive: str, folder: Path, payload: bytes, figures: Figures, fmt: str
) -> Iterator[Served]:
    """``ferry serve`` on ``archive``, its unpacked archive (and compile cache) in
    ``folder``; the seconds to its first answer noted."""
    folder.mkdir(parents=True, exist_ok=True)
    model = archive.removesuffix(".mar")
    started = time.monotonic()
    environment = {"TMPDIR": str(folder)}
    with ferry_server(
        store, [f"{model}={archive}"], folder, "--access-log", "false", environment=environment
    ) as server:
        served = Served(server, model, folder)
        while (status := httpx.post(served.url, content=payload, timeout=600).status_code) != 200:
            if status not in (503,):
                raise RuntimeError(f"{fmt}: first request answered {status}: see {server.log_path}")
            time.sleep(0.2)  # polling until its worker is ready
        figures.first_answer_s[fmt] = time.monotonic() - started
        print(f"{fmt}: first answer after {figures.first_answer_s[fmt]:.1f} s", flush=True)
        yield served


def workers(served: Served) -> list[dict[str, Any]]:
    url = f"{served.server.management_url}/models/{served.model}"
    found: list[dict[str, Any]] = httpx.get(url, timeout=60).json()[0]["workers"]
    return found


def restart(served: Served, figures: Figures, fmt: str) -> None:
    """Kill the worker; the seconds until its replacement is ready."""
    if fmt == "torch.compile":  # steady state: the spare has imported torch's compiler
        deadline = time.monotonic() + 60
        while SPARE_READY not in served.server.log_path.read_text(errors="replace"):
            if time.monotonic() > deadline:
                print(f"{fmt}: no spare ready within 60 s; restarting anyway", flush=True)
                break
            time.sleep(0.2)  # polling the server's log for the spare
    victim = workers(served)[0]["pid"]
    started = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    while True:
        ready = [w for w in workers(served) if w["status"] == "READY" and w["pid"] != victim]
        if ready:
            break
        time.sleep(0.1)  # polling describe for the replacement
    figures.restarted_s[fmt] = time.monotonic() - started
    print(f"{fmt}: restarted worker ready after {figures.restarted_s[fmt]:.1f} s", flush=True)


def relative_difference(ours: dict[str, float], theirs: dict[str, float]) -> float:
    """The largest difference of a class both top-5s hold, relative to the top class's
    probability (random weights spread it over 1000 classes); 1.0 if the top class differs
    (a near tie at the 5th rank may swap classes without meaning anything)."""
    if max(ours, key=ours.__getitem__) != max(theirs, key=theirs.__getitem__):
        return 1.0
    shared = ours.keys() & theirs.keys()
    return max(abs(ours[k] - theirs[k]) for k in shared) / max(theirs.values())


def page(figures: Figures, requests: int, device: str) -> list[str]:
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (a smoke run)"
    lines = [
        "# PyTorch 2 formats on the GPU (issue 49)",
        "",
        f"Machine: {machine_description()}; GPU: {name}; torch {torch.__version__}.",
        "`benchmarks/gpu_pt2.py`: ResNet-18 (random weights) behind the raw-pixel "
        f"tensor_classifier, batches of up to {BATCH} within 5 ms, one worker; {CONCURRENCY} "
        f"closed-loop clients, {requests} requests a round, rounds alternating the formats.",
        f"`ferry archive --aot-inductor --aot-device {device}`: "
        + (
            f"**failed**, {figures.aot_failure.replace('|', '/')}"
            if figures.aot_failure
            else f"{figures.aot_compile_s:.1f} s."
            if figures.aot_compile_s
            else "not run (`--formats`)."
        ),
        "",
        "| format | first answer after launch | req/s (median) | difference from "
        "TorchScript (relative to the top class) | killed worker ready again after |",
        "|---|---|---|---|---|",
    ]
    for fmt in FORMATS:
        if fmt not in figures.first_answer_s:
            continue
        rates = figures.throughput.get(fmt, [])
        rate = f"{statistics.median(rates):.0f}" if rates else "-"
        diff = f"{figures.difference[fmt]:.1e}" if fmt in figures.difference else "-"
        ready = f"{figures.restarted_s[fmt]:.1f} s" if fmt in figures.restarted_s else "-"
        lines.append(f"| {fmt} | {figures.first_answer_s[fmt]:.1f} s | {rate} | {diff} | {ready} |")
    first = figures.first_answer_s.get("torch.compile")
    again = figures.restarted_s.get("torch.compile")
    if first and again:
        kernels = (
            f" ({figures.triton_kernels} compiled Triton kernels in the model's cache)"
            if figures.triton_kernels >= 0
            else ""
        )
        lines += [
            "",
            f"A restarted `torch.compile` worker was ready in {again:.1f} s, "
            f"{again / first:.0%} of the first start's {first:.1f} s (server start, compile, "
            f"warm-up){kernels}.",
        ]
    if figures.aot_output_tail:
        lines += ["", "The failed AOTInductor compile's last lines:", "", "```"]
        lines += [*figures.aot_output_tail, "```"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_pt2.md"))
    parser.add_argument("--requests", type=int, default=3000, help="per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help=f"comma-separated, TorchScript always included (default: {','.join(FORMATS)})",
    )
    args = parser.parse_args()
    wanted = {"TorchScript", *args.formats.split(",")}
    skip_without_gpu(args.device)
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # each server compiles into its own
    figures = Figures()
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, (3, 224, 224), dtype=np.uint8).tobytes() for _ in range(32)]
    with tempfile.TemporaryDirectory(prefix="ferry-gpu-pt2-") as tmp:
        work = Path(tmp)
        store = work / "store"
        store.mkdir()
        names = archives(work, store, figures, args.device, "AOTInductor" in wanted)
        formats = [fmt for fmt in FORMATS if fmt in names and fmt in wanted]
        publish(args.out, page(figures, args.requests, args.device))
        with ExitStack() as stack:
            servers: dict[str, Served] = {}
            for fmt in formats:
                folder = work / f"serve-{fmt}"
                servers[fmt] = stack.enter_context(
                    serve(store, names[fmt], folder, payloads[0], figures, fmt)
                )
                publish(args.out, page(figures, args.requests, args.device))
            figures.triton_kernels = sum(1 for _ in (work / "serve-torch.compile").rglob("*.cubin"))
            answers = {
                fmt: httpx.post(s.url, content=payloads[1], timeout=60).json()
                for fmt, s in servers.items()
            }
            for fmt in formats[1:]:
                figures.difference[fmt] = relative_difference(answers[fmt], answers["TorchScript"])
            for index in range(args.rounds + 1):  # round 0 warms up
                order = formats if index % 2 == 0 else formats[::-1]
                for fmt in order:
                    count = args.requests if index else 2 * CONCURRENCY
                    result = closed_loop(servers[fmt].url, payloads, CONCURRENCY, count)
                    if index:
                        figures.throughput.setdefault(fmt, []).append(result.throughput)
                        print(f"round {index}: {fmt} {result.throughput:.0f} req/s", flush=True)
            publish(args.out, page(figures, args.requests, args.device))
            for fmt in formats[::-1]:  # torch.compile first: the figure that matters most
                restart(servers[fmt], figures, fmt)
                publish(args.out, page(figures, args.requests, args.device))
    if figures.aot_failure:
        print(
            f"FAIL: ferry archive --aot-inductor --aot-device {args.device}: {figures.aot_failure}"
        )
        raise SystemExit(1)
    worst = max(figures.difference.values(), default=0.0)
    if worst > 1e-2:
        print(f"FAIL: a format's answer differs from TorchScript's by {worst:.1e} (relative)")
        raise SystemExit(1)
    others = [fmt for fmt in formats if fmt != "TorchScript"]
    summary = f"PASS: {', '.join(others) or 'TorchScript alone'}"
    if others:
        summary += f" answer as TorchScript (within {worst:.1e})"
    if "torch.compile" in figures.restarted_s:
        share = figures.restarted_s["torch.compile"] / figures.first_answer_s["torch.compile"]
        summary += f"; a restarted compiled worker takes {share:.0%} of the first start"
    print(summary)


if __name__ == "__main__":
    main()
