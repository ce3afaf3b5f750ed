"""Ferry's image: its size, and how long a container takes from ``podman run`` to ready.

The image is built first (``make image``). Each round starts a container on the demo model
(``examples/demo/model-store/shapes.mar``) as a pod runs it (user 1000, capabilities
dropped, read-only root with a tmpfs on /tmp, the store mounted read-only) and times
``podman run`` until ``/v2/health/ready`` answers 200 and until the first prediction.
Needs root and podman (with runc), as ``make image``.

    python benchmarks/image_startup.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import ROOT, machine_description, publish

STORE = ROOT / "examples" / "demo" / "model-store"
SAMPLE = ROOT / "examples" / "demo" / "samples"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def image_bytes(image: str) -> int:
    done = subprocess.run(
        ["podman", "image", "inspect", image, "--format", "{{.Size}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.strip())


def one_start(image: str, sample: bytes) -> tuple[float, float]:
    """Seconds from ``podman run`` to ready, and to the first answer."""
    port, name = _free_port(), f"ferry-startup-{uuid.uuid4().hex[:8]}"
    argv = [
        *("podman", "run", "--detach", "--name", name, "--runtime", shutil.which("runc") or "runc"),
        *("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"),
        *("--user", "1000", "--cap-drop=ALL", "--security-opt", "no-new-privileges"),
        *("--read-only", "--tmpfs", "/tmp:rw,mode=1777"),
        *("-v", f"{STORE}:/mnt/models/model-store:ro", "-p", f"127.0.0.1:{port}:8080"),
        *("-e", "FERRY_INFERENCE_ADDRESS=http://0.0.0.0:8080"),
        image,
        *("ferry", "serve", "--foreground", "--model-store", "/mnt/models/model-store"),
        *("--models", "shapes=shapes.mar", "--disable-token-auth"),
    ]
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = _until(lambda: httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200)
        answer = httpx.post(f"{url}/predictions/shapes", content=sample, timeout=60)
        answer.raise_for_status()
        return ready - started, time.monotonic() - started
    finally:
        subprocess.run(["podman", "rm", "--force", "--time", "5", name], capture_output=True)


def _until(condition, bound: float = 300.0) -> float:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.05)  # polling a starting container; the figure's resolution
    raise TimeoutError(f"not ready within {bound:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="localhost/ferry:latest")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/image_startup.md")
    args = parser.parse_args()
    sample = sorted(SAMPLE.glob("*"))[0].read_bytes()
    size = image_bytes(args.image)
    rounds = [one_start(args.image, sample) for _ in range(args.rounds)]
    ready = [r for r, _ in rounds]
    answered = [a for _, a in rounds]
    versions = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--runtime",
            shutil.which("runc") or "runc",
            *("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"),
            args.image,
            "python",
            "-c",
            "import json, torch, torchvision; print(json.dumps([torch.__version__, "
            "torchvision.__version__]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    torch_version, vision_version = json.loads(versions.stdout)
    publish(
        args.out,
        [
            "# Ferry's image: size and start-up",
            "",
            f"Machine: {machine_description()}; podman with runc.",
            f"`python benchmarks/image_startup.py --rounds {args.rounds}` on `{args.image}` "
            f"(torch {torch_version}, torchvision {vision_version}).",
            "",
            f"Image size: {size / 1e9:.2f} GB.",
            "",
            "| from `podman run` (demo model, read-only root) | median (s) | min | max |",
            "|---|---:|---:|---:|",
            f"| to `/v2/health/ready` 200 | {statistics.median(ready):.1f} | {min(ready):.1f} | "
            f"{max(ready):.1f} |",
            f"| to the first prediction | {statistics.median(answered):.1f} | "
            f"{min(answered):.1f} | {max(answered):.1f} |",
        ],
    )


if __name__ == "__main__":
    main()
