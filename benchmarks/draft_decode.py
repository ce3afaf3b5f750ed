"""What ``draft_decode`` buys and costs: the built-in vision handlers' preprocessing of one
JPEG (decode, resize 256, crop 224, normalise) with TorchServe's whole-image decoding (the
default) and with PIL's draft mode, timed in alternating rounds, and how far the model's
input moves (the default matches TorchServe's within 1e-5: tests/compat/
test_preprocessing_parity.py).

    python benchmarks/draft_decode.py [--rounds 7] [--repeats 20]

Writes ``benchmarks/results/draft_decode.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

import torch

from benchmarks.common import ROOT, detailed_photo, machine_description, publish
from ferry.handlers.builtin.vision import ImageTransform

SIZES = [(500, 375), (1000, 667), (1920, 1080), (4032, 3024)]
"""Width, height: a small photo, a web photo, full HD, a phone camera's 12 megapixels."""


def model_input(transform: ImageTransform, encoded: bytes) -> torch.Tensor:
    """What the built-in image_classifier hands its model for one image."""
    return transform.normalise(transform.to_uint8(transform.decode(encoded))[None])[0]


def milliseconds(transform: ImageTransform, encoded: bytes, repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        model_input(transform, encoded)
    return (time.perf_counter() - start) * 1000 / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    whole, draft = ImageTransform(), ImageTransform(draft=True)
    lines = [
        "# draft_decode: speed against TorchServe's input",
        "",
        f"Machine: {machine_description()}",
        f"Command: `python benchmarks/draft_decode.py --rounds {args.rounds} --repeats "
        f"{args.repeats}`: one image at a time, one torch thread, the two decodings "
        "alternating in each round (which goes first alternates too); medians of the rounds.",
        "",
        "| JPEG | default (TorchServe's input) ms | draft_decode ms | speed-up "
        "| input max abs diff | mean abs diff |",
        "|---|---|---|---|---|---|",
    ]
    for width, height in SIZES:
        encoded = detailed_photo(width, height)
        times: dict[str, list[float]] = {"whole": [], "draft": []}
        for round_ in range(args.rounds):
            order = [("whole", whole), ("draft", draft)]
            for name, transform in order if round_ % 2 == 0 else order[::-1]:
                times[name].append(milliseconds(transform, encoded, args.repeats))
        slow, fast = statistics.median(times["whole"]), statistics.median(times["draft"])
        difference = (model_input(whole, encoded) - model_input(draft, encoded)).abs()
        lines.append(
            f"| {width}x{height} | {slow:.2f} | {fast:.2f} | {slow / fast:.2f}x | "
            f"{float(difference.max()):.3f} | {float(difference.mean()):.4f} |"
        )
    lines += [
        "",
        "The differences are in normalised units (a pixel level is 1/255/0.225, about 0.017).",
        "A JPEG whose shorter side is under twice the resize (512 px) is decoded whole",
        "either way. Turn it on per model with `draft_decode: true` in the handler's",
        "model-config.yaml section (docs/handlers.md).",
    ]
    publish(ROOT / "benchmarks" / "results" / "draft_decode.md", lines)


if __name__ == "__main__":
    main()
