"""Does the worker's stage pipeline pay on a preprocessing-heavy workload?

    python benchmarks/pipeline_benchmark.py --out benchmarks/results/pipeline.md

Large JPEGs (2400x1600), a small CNN, the built-in image_classifier at 448 px, one worker,
batch size 8: the same archive served twice side by side, once with sequential stages and
once with ``micro_batching`` (micro-batches of 2, two preprocess threads). Rounds alternate;
the median of per-round throughput ratios is reported.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import yaml
from PIL import Image, ImageDraw, ImageFilter
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import alternating_rounds, machine_description, publish
from benchmarks.server import ferry_server
from ferry.store.writer import ArchiveSpec, write_archive

PIPELINE = {
    "micro_batch_size": 2,
    "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1},
}


def photos(count: int, seed: int = 0) -> list[bytes]:
    """Busy 2400x1600 pictures (shapes, noise, blur), JPEG quality 90: costly to decode."""
    rng = random.Random(seed)
    images = []
    for _ in range(count):
        image = Image.effect_noise((2400, 1600), 60).convert("RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(40):
            x, y = rng.randrange(2400), rng.randrange(1600)
            r = rng.randrange(30, 300)
            colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        image = image.filter(ImageFilter.GaussianBlur(1))
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


def small_cnn_archive(store: Path, name: str, pipeline: bool) -> str:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 5, stride=4),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 10),
    ).eval()
    folder = store / f".{name}-src"
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(model, torch.randn(1, 3, 448, 448))  # type: ignore[no-untyped-call]
        traced.save(str(folder / "cnn.pt"))
    config = {
        "minWorkers": 1,
        "batchSize": 8,
        "maxBatchDelay": 10,
        "image_classifier": {"resize": 512, "crop": 448, "topk": 3},
    }
    if pipeline:
        config["micro_batching"] = PIPELINE
    (folder / "model-config.yaml").write_text(yaml.safe_dump(config))
    spec = ArchiveSpec(
        name,
        "image_classifier",
        serialized_file=folder / "cnn.pt",
        config_file=folder / "model-config.yaml",
    )
    return write_archive(spec, store, force=True).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pipeline.md"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=160)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ferry-pipeline-"))
    store = tmp / "store"
    store.mkdir()
    sequential = small_cnn_archive(store, "sequential", pipeline=False)
    pipelined = small_cnn_archive(store, "pipelined", pipeline=True)
    payloads = photos(24)
    models = [f"sequential={sequential}", f"pipelined={pipelined}"]
    with ferry_server(store, models, tmp, "--access-log", "false") as server:
        figures = alternating_rounds(
            server.url,
            {name: (payloads, "image/jpeg") for name in ("sequential", "pipelined")},
            16,
            args.requests,
            args.rounds,
            "img/s",
        )
    ratios = [p / s for p, s in zip(figures["pipelined"], figures["sequential"], strict=True)]
    med = statistics.median
    publish(
        args.out,
        [
            "# Stage pipeline on a preprocessing-heavy workload",
            "",
            f"Machine: {machine_description()}.",
            f"24 JPEGs of 2400x1600 px ({statistics.mean(map(len, payloads)) / 1e6:.2f} MB on "
            "average), a 2-layer CNN (TorchScript), built-in `image_classifier` at resize 512 / "
            "crop 448, one worker, batch size 8, concurrency 16. "
            "Two models in one server: stages run one after another, or through the pipeline "
            f"(`micro_batching: {PIPELINE}`). {args.rounds} rounds of {args.requests} requests "
            "each, alternating which goes first. Produced by `benchmarks/pipeline_benchmark.py` "
            "in one run.",
            "",
            "Each JPEG is decoded whole, as TorchServe's handlers decode it (the default since "
            "2026-11-26, for inputs equal to TorchServe's); `draft_decode: true` decodes large "
            "JPEGs at a reduced scale, about 1.8x as fast end to end on these photos "
            "([draft_decode.md](draft_decode.md)). Pages before that date measured draft "
            "decoding.",
            "",
            "| stages | median images/s |",
            "|---|---|",
            f"| sequential | {med(figures['sequential']):.1f} |",
            f"| pipelined | {med(figures['pipelined']):.1f} |",
            "",
            f"Median per-round ratio pipelined / sequential: **{med(ratios):.2f}x** "
            "(target >= 1.3). Per round: " + ", ".join(f"{r:.2f}" for r in ratios) + ".",
            "",
            "GPU figures (ResNet-50 fp16 against the offline GPU limit) were not measured: no GPU "
            "was available to this task.",
            "",
        ],
    )


if __name__ == "__main__":
    main()
