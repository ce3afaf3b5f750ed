"""Real-GPU checks of the GPU paths (issue 32): one command, a few minutes on one GPU.

    python benchmarks/gpu_checks.py [--out benchmarks/results/gpu_checks.md]

One line per check: PASS, FAIL or SKIP (with why), and its figure. What each proves:

- stream ordering: a handler's preprocess queues a slow kernel (``torch.cuda._sleep``)
  and a write on the default stream; inference on Ferry's compute stream, and follow-up
  work on its upload stream, must see the write (they wait for the caller's stream);
- one GPU per worker: a worker's environment shows it exactly one GPU, as ``cuda:0``;
- graph capture on another device than the thread's current one (2+ GPUs);
- ``compile: reduce-overhead`` (CUDA graph trees) with ``micro_batching``: the same
  answers as eager, though postprocess reads an output while the next call runs;
- fp16 with ``torchscript_freeze``: the weights are cast before freezing (inputs and
  weights agree), answers within fp16 tolerance of fp32;
- a device-side assert in a served model: that request fails, the worker is replaced,
  and the requests after it are answered;
- 64 JPEGs with a CMYK, a progressive and a truncated one: ``gpu_decode`` answers as the
  PIL path (the largest probability difference is the figure), the truncated one fails
  alone on both;
- ``ferry bench profile`` of an fp16 archive runs what is served (fp16 input to the fp16
  model, not fp32 under autocast);
- an ONNX model on ONNX Runtime's CUDA provider reads a batch in GPU memory where it lies,
  and an fp32 ONNX file answers under ``precision: fp16`` (its input cast back).

Without a GPU every check that needs one says SKIP, and the script exits 2.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
import yaml
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import detailed_photo, machine_description, publish
from benchmarks.server import ferry_server
from ferry.handlers.builtin.base_handler import BaseHandler
from ferry.handlers.builtin.device import CudaPath
from ferry.handlers.builtin.image_classifier import ImageClassifier
from ferry.handlers.builtin.optimize import (
    Optimizations,
    capture_cuda_graph,
    optimize_model,
    prepare_input,
)
from ferry.handlers.contract.context import Context
from ferry.store.writer import ArchiveSpec, write_archive
from ferry.wire.environment import gpu_environment
from ferry.worker.pipeline import PipelineSettings, StagePipeline

HANDLERS = Path(__file__).resolve().parent / "handlers"
SLEEP_CYCLES = 200_000_000
"""About 0.1 s of a GPU's clock: long enough that an unordered read sees stale data."""


@dataclass
class Check:
    name: str
    outcome: str
    """PASS, FAIL or SKIP."""
    figure: str

    def line(self) -> str:
        return f"{self.outcome:<4}  {self.name}: {self.figure}"


class Skipped(Exception):
    """A check this machine cannot run (no GPU, one GPU, no torchvision)."""


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(256, 10),
    ).eval()


def _need_gpus(count: int) -> torch.device:
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < count:
        raise Skipped(f"needs {count} GPU{'s' * (count > 1)}, this machine has {available}")
    return torch.device("cuda:0")


# --- the checks ------------------------------------------------------------------------


def stream_ordering() -> str:
    device = _need_gpus(1)
    path = CudaPath(device)
    failures = []
    for _ in range(5):
        data = torch.zeros(1 << 20, device=device)
        torch.cuda.synchronize(device)
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]  # a kernel still running ...
        data.fill_(1.0)  # ... and its result, on the caller's (default) stream
        with path.compute():
            seen = float(data.sum())
        if seen != data.numel():
            failures.append(f"inference read {seen:.0f} of {data.numel()}")
        torch.cuda._sleep(SLEEP_CYCLES)  # type: ignore[no-untyped-call]
        data.fill_(2.0)
        follow_up = path.upload(data, lambda t: t.sum().reshape(1))
        if float(follow_up) != 2.0 * data.numel():
            failures.append(f"follow-up work read {float(follow_up):.0f}")
    if failures:
        raise AssertionError("; ".join(failures))
    return "5 of 5 reads after a 0.1 s kernel saw its write (compute and upload streams)"


def one_gpu_per_worker() -> str:
    _need_gpus(1)
    env = {**os.environ, **gpu_environment(torch.cuda.device_count() - 1, os.environ)}
    code = "import torch; print(torch.cuda.device_count(), torch.cuda.current_device())"
    seen = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    if seen != ["1", "0"]:
        raise AssertionError(f"a worker's environment showed {seen} (GPU count, current)")
    return f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}: 1 GPU, as cuda:0"


def graph_capture_on_another_device() -> str:
    _need_gpus(2)
    device = torch.device("cuda:1")
    model = _cnn().to(device)
    example = torch.randn(4, 3, 32, 32, device=device)
    torch.cuda.set_device(0)  # the thread's current device is not the model's
    replay, _ = capture_cuda_graph(model, example, None)
    with torch.inference_mode():
        expected = model(example)
    difference = float((replay(example) - expected).abs().max())
    if difference > 1e-4:
        raise AssertionError(f"replayed output differs from eager by {difference:.2e}")
    return f"captured on cuda:1 from a thread on cuda:0; replay within {difference:.1e}"


def graph_trees_with_micro_batching() -> str:
    device = _need_gpus(1)
    model = _cnn().to(device)
    inputs = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = model(inputs.to(device)).cpu()
    handler = BaseHandler()
    handler.device = device
    handler.optimizations = Optimizations.from_model_config(
        {"optimization": {"compile": "reduce-overhead"}}
    )
    handler.model = optimize_model(model, handler.optimizations, device)
    pipeline = StagePipeline(handler, PipelineSettings(2, 2, 2))
    context = Context("m", ".", {"model": {}}, 16, 0)
    rows = inputs.tolist()
    for _ in range(3):  # compiles and records the graphs first, then replays them
        context.start_batch([str(i) for i in range(16)], [{} for _ in range(16)])
        answers = pipeline.handle(rows, context)
    pipeline.close()
    failed = [answer for answer in answers if isinstance(answer, BaseException)]
    if failed:
        raise AssertionError(f"{len(failed)} of 16 rows failed: {failed[0]!r}")
    difference = float((torch.tensor(answers) - expected).abs().max())
    if difference > 1e-3:
        raise AssertionError(f"answers differ from eager by {difference:.2e}")
    return f"16 rows in micro-batches of 2: within {difference:.1e} of eager"


def fp16_with_freeze() -> str:
    device = _need_gpus(1)
    model = _cnn()
    scripted = torch.jit.script(model.to(device))
    inputs = torch.randn(8, 3, 32, 32, device=device)
    with torch.inference_mode():
        expected = model(inputs)
    options = Optimizations.from_model_config(
        {"optimization": {"precision": "fp16", "torchscript_freeze": True}}
    )
    frozen = optimize_model(scripted, options, device)
    batch, _ = prepare_input(inputs, options, device)
    with torch.inference_mode():
        output = frozen(batch).float()
    difference = float((output - expected).abs().max() / expected.abs().max())
    if difference > 1e-2:
        raise AssertionError(f"fp16 frozen answers differ by {difference:.1%}")
    return f"frozen fp16 within {difference:.1e} (relative) of fp32"


def device_assert_recovery(tmp: Path) -> str:
    _need_gpus(1)
    store = tmp / "store"
    store.mkdir()
    spec = ArchiveSpec(model_name="faulty", handler=str(HANDLERS / "gpu_fault.py"))
    archive = write_archive(spec, store, force=True).name
    with ferry_server(store, [f"faulty={archive}"], tmp) as server, httpx.Client() as client:
        url = f"{server.url}/predictions/faulty"
        before = client.post(url, content=b"ok", timeout=120).json()["pid"]
        fault = client.post(url, content=b"assert", timeout=120)
        after = [client.post(url, content=b"ok", timeout=120) for _ in range(10)]
    if fault.status_code != 500 or "GPU" not in fault.text:
        raise AssertionError(f"the assert answered {fault.status_code} {fault.text[:200]}")
    statuses = [r.status_code for r in after]
    if statuses != [200] * 10:
        raise AssertionError(f"requests after the assert answered {statuses}")
    pids = {r.json()["pid"] for r in after}
    if before in pids:
        raise AssertionError("the worker whose GPU asserted went on serving")
    return "the asserting request answered 500; the next 10 answered 200 by a new worker"


def _cmyk_jpeg() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("CMYK", (320, 240), (10, 200, 30, 0)).save(buffer, format="JPEG")
    return buffer.getvalue()


def _progressive_jpeg() -> bytes:
    from PIL import Image

    image = Image.open(io.BytesIO(detailed_photo(480, 360, seed=3)))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", progressive=True, quality=90)
    return buffer.getvalue()


def _classifier(tmp: Path, device: torch.device, gpu_decode: bool) -> ImageClassifier:
    handler = ImageClassifier()
    # Every class's probability in each answer: with the top 5 of 10 near-equal classes, a
    # rank swap at the 5th would read as a whole probability's difference.
    config = {"image_classifier": {"gpu_decode": gpu_decode, "topk": 10}}
    gpu = device.index if device.type == "cuda" else None
    handler.initialize(Context("m", str(tmp), {"model": {}}, 64, gpu, model_yaml_config=config))
    torch.manual_seed(0)
    handler.model = nn.Sequential(nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(192, 10))
    handler.model.to(handler.device).eval()
    return handler


def jpeg_batch_with_odd_images(tmp: Path) -> str:
    device = _need_gpus(1)
    gpu = _classifier(tmp, device, gpu_decode=True)
    if gpu.jpeg_decoder is None:
        raise Skipped("gpu_decode is off here (torchvision missing or its probe failed: see log)")
    pil = _classifier(tmp, device, gpu_decode=False)
    images = [detailed_photo(480 + i, 360, seed=i) for i in range(64)]
    images[10], images[20] = _cmyk_jpeg(), _progressive_jpeg()
    images[30] = images[30][: len(images[30]) // 2]
    rows = [{"body": bytearray(image)} for image in images]
    answers = []
    for handler in (gpu, pil):
        context = Context("m", str(tmp), {"model": {}}, 64, device.index)
        context.start_batch([str(i) for i in range(64)], [{} for _ in range(64)])
        answers.append(handler.handle(rows, context))
    on_gpu, with_pil = (
        [i for i, a in enumerate(run) if isinstance(a, BaseException)] for run in answers
    )
    # PIL refuses the truncated JPEG; nvJPEG may decode it leniently, but nothing else fails.
    if with_pil != [30] or not set(on_gpu) <= {30}:
        raise AssertionError(f"failed requests: gpu_decode {on_gpu}, PIL {with_pil}")
    differences = {
        index: max(abs(ours[k] - theirs[k]) for k in ours.keys() | theirs.keys())
        for index, (ours, theirs) in enumerate(zip(*answers, strict=True))
        if isinstance(ours, dict) and isinstance(theirs, dict)
    }
    worst = max(differences, key=lambda index: differences[index])
    top_changed = [
        index
        for index in differences
        if max(answers[0][index], key=answers[0][index].get)
        != max(answers[1][index], key=answers[1][index].get)
    ]
    pixels = _decoded_pixel_difference(gpu, images[0])
    figure = (
        f"largest probability difference {differences[worst]:.1e} (image {worst}), "
        f"top class changed for {len(top_changed)} of {len(differences)}; "
        f"decoded pixels differ by {pixels} (nvJPEG against PIL, image 0)"
    )
    if differences[worst] > 2e-2 or len(top_changed) > 1:
        raise AssertionError(f"gpu_decode and PIL answers differ: {figure}")
    truncated = "failed alone" if on_gpu == [30] else "decoded by nvJPEG, refused by PIL"
    return f"{figure}; the truncated one {truncated}"


def _decoded_pixel_difference(gpu: ImageClassifier, image: bytes) -> str:
    """Mean and largest absolute difference, in 0-255 levels, of one JPEG as decoded by
    nvJPEG and by PIL: what two JPEG decoders' IDCT and chroma upsampling leave apart."""
    import numpy as np
    from PIL import Image

    assert gpu.jpeg_decoder is not None
    (on_gpu,) = gpu.jpeg_decoder([image])
    with Image.open(io.BytesIO(image)) as opened:
        with_pil = torch.from_numpy(np.asarray(opened.convert("RGB"))).permute(2, 0, 1)
    apart = (on_gpu.cpu().to(torch.int16) - with_pil.to(torch.int16)).abs().float()
    return f"{apart.mean().item():.2f} on average, {apart.max().item():.0f} at most"


def profile_of_an_fp16_archive(tmp: Path) -> str:
    _need_gpus(1)
    store = tmp / "profile"
    store.mkdir()
    model = _cnn()
    torch.jit.script(model).save(str(store / "cnn.pt"))  # type: ignore[no-untyped-call]
    config = store / "model-config.yaml"
    config.write_text(yaml.safe_dump({"optimization": {"precision": "fp16"}}))
    spec = ArchiveSpec(
        model_name="cnn",
        handler="image_classifier",
        serialized_file=store / "cnn.pt",
        config_file=config,
    )
    archive = write_archive(spec, store, force=True)
    image = tmp / "photo.jpg"
    image.write_bytes(detailed_photo(320, 240))
    argv = [sys.executable, "-m", "ferry", "bench", "profile", str(archive), "--input"]
    argv += [str(image), "--device", "cuda", "--batch-sizes", "1,8", "--seconds", "0.3"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise AssertionError(f"ferry bench profile failed: {run.stderr.strip()[-400:]}")
    rows = [line.split() for line in run.stdout.splitlines() if line.strip()[:1].isdigit()]
    precisions = {row[2] for row in rows if len(row) > 2}
    if precisions != {"fp16"}:
        raise AssertionError(f"profiled at {precisions}, not at the archive's fp16")
    return f"{len(rows)} rows (batch 1 and 8, handler and model), all fp16 as the archive asks"


def onnx_on_the_gpu(tmp: Path) -> str:
    device = _need_gpus(1)
    try:
        import onnxruntime
    except ImportError as exc:
        raise Skipped("onnxruntime is not installed") from exc
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        raise Skipped("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    from ferry.handlers.builtin.onnx_model import OnnxModel

    model = _cnn()
    path = tmp / "cnn.onnx"
    dynamic = {"input": {0: "batch"}, "logits": {0: "batch"}}
    torch.onnx.export(
        model,
        (torch.randn(2, 3, 32, 32),),
        str(path),
        input_names=["input"],
        output_names=["logits"],
        dynamic_axes=dynamic,
        dynamo=False,
    )
    onnx = OnnxModel(path, device)
    inputs = torch.randn(16, 3, 32, 32)
    with torch.inference_mode():
        expected = model(inputs)
    bound = onnx(inputs.to(device))  # read where it lies (I/O binding)
    half = onnx(inputs.to(device, torch.float16))  # precision: fp16 casts the input only
    worst = max(float((bound - expected).abs().max()), float((half - expected).abs().max()))
    if not onnx.on_gpu or worst > 5e-2:
        raise AssertionError(f"on the GPU: {onnx.on_gpu}; answers differ by up to {worst:.2e}")
    return f"CUDA provider, batch bound in GPU memory, fp16 input cast back: within {worst:.1e}"


# --- the run ---------------------------------------------------------------------------


def run_checks(tmp: Path, on_check: Callable[[list[Check]], None] | None = None) -> list[Check]:
    """Every check in turn; ``on_check`` is called with the results so far after each."""
    checks: list[tuple[str, Callable[[], str]]] = [
        ("stream ordering", stream_ordering),
        ("one GPU per worker", one_gpu_per_worker),
        ("graph capture on the model's device", graph_capture_on_another_device),
        ("reduce-overhead with micro_batching", graph_trees_with_micro_batching),
        ("fp16 with torchscript_freeze", fp16_with_freeze),
        ("device-side assert, then valid requests", lambda: device_assert_recovery(tmp)),
        ("64 JPEGs (CMYK, progressive, truncated)", lambda: jpeg_batch_with_odd_images(tmp)),
        ("bench profile of an fp16 archive", lambda: profile_of_an_fp16_archive(tmp)),
        ("ONNX on the GPU", lambda: onnx_on_the_gpu(tmp)),
    ]
    results = []
    for name, check in checks:
        start = time.monotonic()
        try:
            figure = check()
            outcome = "PASS"
        except Skipped as skipped:
            outcome, figure = "SKIP", str(skipped)
        except Exception as exc:  # every check runs and says why it failed
            outcome, figure = "FAIL", f"{type(exc).__name__}: {exc}"
        figure += f" ({time.monotonic() - start:.1f} s)"
        results.append(Check(name, outcome, figure))
        print(results[-1].line(), flush=True)
        if on_check is not None:
            on_check(results)
    return results


def page(results: list[Check]) -> list[str]:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return [
        "# GPU checks (issue 32)",
        "",
        f"Machine: {machine_description()}; GPU: {gpu}; torch {torch.__version__}.",
        "",
        "| check | outcome | figure |",
        "|---|---|---|",
        *(f"| {c.name} | {c.outcome} | {c.figure} |" for c in results),
    ]


def verdict(results: list[Check]) -> str:
    """The last line: what the GPU kit reads (``SKIP:`` when there is no GPU here)."""
    counts = {o: sum(c.outcome == o for c in results) for o in ("PASS", "FAIL", "SKIP")}
    tally = ", ".join(f"{n} {o}" for o, n in counts.items())
    if not torch.cuda.is_available():
        return f"SKIP: no CUDA GPU (torch {torch.__version__}): {tally}"
    failed = [c.name for c in results if c.outcome == "FAIL"]
    return f"FAIL: {tally}: {', '.join(failed)}" if failed else f"PASS: {tally}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results as Markdown here")
    args = parser.parse_args()
    out: Path | None = args.out

    def write(done: list[Check]) -> None:  # after each check: a killed run keeps its page
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("\n".join(page(done)) + "\n")

    with tempfile.TemporaryDirectory(prefix="ferry-gpu-checks-") as tmp:
        results = run_checks(Path(tmp), write)
    if out is not None:
        publish(out, page(results))
    print(verdict(results), flush=True)
    if not torch.cuda.is_available():
        return 2
    return 1 if any(c.outcome == "FAIL" for c in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
