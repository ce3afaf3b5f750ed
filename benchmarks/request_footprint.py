"""How much of Ferry one request walks, and the shape of its code (issue 52's proof).

``footprint``: the distinct source files (and functions) of the ``ferry`` package that run
for one POST /predictions/<model> on a warmed server, frontend and worker apart. One
process serves the inference API on a real uvicorn (a free loopback port) with its worker
on a thread (``Apis.local(..., in_process=True)``: the worker's side is
``ferry.worker.main.serve``, as in a worker process). After warm-up requests, a profile
hook records, for each request alone, every frame of ``ferry`` that calls anything (a
Python or a C function) from the request's send until ``--settle`` seconds after its
answer; module bodies (import time) are left out. An idle window as long shows what runs
with no request (timers). Worker-side frames are those of the worker's thread.

``shape``: lines per subpackage (``ferry/grpc/generated`` left out), modules over 500
lines, functions over 35 lines (``end_lineno - lineno + 1`` of every function).

The tree measured is the ``ferry`` that Python imports: run it with ``PYTHONPATH`` at a
checkout (and outside /work/main, whose own ``ferry`` would come first)::

    cd /tmp && PYTHONPATH=/tmp/tree python /work/main/benchmarks/request_footprint.py footprint
    python benchmarks/request_footprint.py shape --root /tmp/tree
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ECHO_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    return [bytes(row.get("body") or b"") for row in data]
"""


@dataclass
class Recorder:
    """Frames of ``ferry`` seen while on, by (thread name, file, function)."""

    package: str
    on: bool = False
    seen: set[tuple[str, str, str]] = field(default_factory=set)

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on:
            return
        thread = threading.current_thread().name
        self._note(thread, frame)
        if event == "call" and frame.f_back is not None:
            self._note(thread, frame.f_back)  # the caller runs too

    def _note(self, thread: str, frame: FrameType) -> None:
        code = frame.f_code
        if code.co_filename.startswith(self.package) and code.co_name != "<module>":
            where = code.co_filename[len(self.package) :]
            self.seen.add((thread, where, f"{code.co_name}:{code.co_firstlineno}"))

    def take(self) -> set[tuple[str, str, str]]:
        seen, self.seen = self.seen, set()
        return seen


def subpackage(path: str) -> str:
    head, _, rest = path.partition("/")
    return head if rest else "(top)"


def side(thread: str) -> str:
    return "worker" if thread.startswith("worker ") else "frontend"


def summary(seen: set[tuple[str, str, str]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name in ("frontend", "worker"):
        files = sorted({where for thread, where, _ in seen if side(thread) == name})
        functions = {(where, f) for thread, where, f in seen if side(thread) == name}
        by_package = Counter(subpackage(path) for path in files)
        result[name] = {
            "files": len(files),
            "functions": len(functions),
            "by_subpackage": dict(sorted(by_package.items())),
            "file_list": files,
        }
    result["threads"] = sorted({thread for thread, _, _ in seen})
    return result


@dataclass(frozen=True)
class Plan:
    """One model, its request, and how many requests to warm up with and to measure."""

    model: str
    rounds: int
    warm: int
    settle: float
    """Seconds recorded after each answer (work that follows it), and of the idle window."""


def model_store(folder: Path, model: str, ferry_root: Path) -> tuple[str, bytes, str]:
    """The store's archive for ``model``; its name, a request body and its content type."""
    if model == "shapes":
        shutil.copy(ferry_root / "examples/demo/model-store/shapes.mar", folder / "shapes.mar")
        image = (ferry_root / "examples/demo/samples/star.png").read_bytes()
        return "shapes.mar", image, "image/png"
    from ferry.store.writer import ArchiveSpec, write_archive

    handler = folder / "echo_handler.py"
    handler.write_text(ECHO_HANDLER)
    spec = ArchiveSpec(model_name="echo", handler=str(handler))
    return write_archive(spec, folder, force=True).name, b"hello", "application/octet-stream"


async def footprint(plan: Plan) -> dict[str, Any]:
    import httpx

    import ferry
    from ferry.config.settings import Address, ServerSettings

    package = str(Path(ferry.__file__).parent) + "/"
    recorder = Recorder(package)
    threading.setprofile(recorder.hook)  # every thread started from here on
    with tempfile.TemporaryDirectory() as scratch:
        store = Path(scratch)
        archive, body, content_type = model_store(store, plan.model, Path(package).parent)
        settings = ServerSettings(
            model_store=store,
            models=(f"{plan.model}={archive}",),
            inference_address=Address("127.0.0.1", 0),
        )
        async with serving(settings) as url, httpx.AsyncClient(base_url=url, timeout=60) as client:

            async def predict() -> None:
                path = f"/predictions/{plan.model}"
                headers = {"content-type": content_type}
                (await client.post(path, content=body, headers=headers)).raise_for_status()

            return await measure(recorder, predict, plan)


@contextlib.asynccontextmanager
async def serving(settings: Any) -> AsyncIterator[str]:
    """The inference API on a real uvicorn, its workers on threads, the start-up models
    loaded; its URL."""
    from ferry.apis import Apis
    from ferry.http.listener import inference_listener

    apis = Apis.local(settings, in_process=True)
    listener = inference_listener(settings.inference_address, apis, settings, None)
    url = listener.bind()
    served = asyncio.create_task(listener.serve())
    try:
        await apis.service.load_startup_models()
        yield url
    finally:
        listener.stop()
        await served
        await apis.close()


async def measure(
    recorder: Recorder, predict: Callable[[], Awaitable[None]], plan: Plan
) -> dict[str, Any]:
    """``plan.rounds`` requests recorded one at a time after ``plan.warm`` unrecorded, then
    an idle window."""
    for _ in range(plan.warm):
        await predict()
    results: dict[str, Any] = {"rounds": []}
    sys.setprofile(recorder.hook)  # this thread: the event loop's
    for _ in range(plan.rounds):
        recorder.on = True
        await predict()
        await asyncio.sleep(plan.settle)
        recorder.on = False
        results["rounds"].append(summary(recorder.take()))
    recorder.on = True
    await asyncio.sleep(plan.settle)  # no request: what runs on its own
    recorder.on = False
    sys.setprofile(None)
    results["idle"] = summary(recorder.take())
    return results


def shape(root: Path) -> dict[str, Any]:
    package = root / "ferry"
    sources = [p for p in sorted(package.rglob("*.py")) if "grpc/generated" not in str(p)]
    lines: Counter[str] = Counter()
    long_modules = {}
    functions = long_functions = 0
    for path in sources:
        text = path.read_text()
        count = len(text.splitlines())
        relative = str(path.relative_to(package))
        lines[subpackage(relative)] += count
        if count > 500:
            long_modules[relative] = count
        lengths = list(function_lengths(ast.parse(text)))
        functions += len(lengths)
        long_functions += sum(1 for n in lengths if n > 35)
    return {
        "files": len(sources),
        "lines": sum(lines.values()),
        "lines_by_subpackage": dict(sorted(lines.items())),
        "modules_over_500": dict(sorted(long_modules.items(), key=lambda kv: -kv[1])),
        "functions": functions,
        "functions_over_35": long_functions,
    }


def function_lengths(tree: ast.AST) -> Iterable[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield (node.end_lineno or node.lineno) - node.lineno + 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("footprint")
    run.add_argument("--model", choices=("shapes", "echo"), default="shapes")
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--warm", type=int, default=3)
    run.add_argument("--settle", type=float, default=0.2)
    static = commands.add_parser("shape")
    static.add_argument("--root", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "shape":
        print(json.dumps(shape(args.root), indent=1))
        return
    plan = Plan(args.model, args.rounds, args.warm, args.settle)
    print(json.dumps(asyncio.run(footprint(plan)), indent=1))


if __name__ == "__main__":
    main()
