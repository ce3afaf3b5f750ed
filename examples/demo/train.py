"""Train the demo model on freshly drawn shapes and write its archive.

python -m examples.demo.train --out examples/demo/model-store
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tempfile
import time
from pathlib import Path

import torch
import yaml
from PIL import Image
from torch import nn

from examples.demo.model import ShapesNet
from examples.demo.shapes import IMAGE_SIZE, LABELS, draw_shape, write_samples
from ferry.handlers.builtin.vision import ImageTransform
from ferry.store.writer import ArchiveSpec, write_archive

HERE = Path(__file__).parent
TRANSFORM = ImageTransform(resize=IMAGE_SIZE, crop=IMAGE_SIZE, mean=(0.5,) * 3, std=(0.5,) * 3)
MODEL_CONFIG = {
    "minWorkers": 1,
    "batchSize": 8,
    "maxBatchDelay": 10,
    "responseTimeout": 30,
    "image_classifier": {
        "resize": IMAGE_SIZE,
        "crop": IMAGE_SIZE,
        "mean": [0.5] * 3,
        "std": [0.5] * 3,
        "topk": 3,
    },
}


def _as_served(image: Image.Image, rng: random.Random) -> Image.Image:
    """Half the images go through a JPEG round trip, so JPEG uploads classify as well as PNG."""
    if rng.random() < 0.5:
        return image
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=rng.randint(40, 95))
    return TRANSFORM.decode(buffer.getvalue())


def make_batch(rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    labels = [rng.randrange(len(LABELS)) for _ in range(size)]
    images = [TRANSFORM.to_uint8(_as_served(draw_shape(LABELS[i], rng), rng)) for i in labels]
    return TRANSFORM.normalise(torch.stack(images)), torch.tensor(labels)


def accuracy(model: nn.Module, seed: int, count: int = 1000) -> float:
    model.eval()
    inputs, labels = make_batch(random.Random(seed), count)
    with torch.inference_mode():
        predicted = model(inputs).argmax(dim=1)
    return float((predicted == labels).float().mean())


def train(steps: int, batch_size: int, seed: int) -> ShapesNet:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = ShapesNet(len(LABELS))
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=3e-3, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        model.train()
        inputs, labels = make_batch(rng, batch_size)
        optimiser.zero_grad()
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimiser.step()
        schedule.step()
        if step % 100 == 0:
            print(
                f"step {step}/{steps} loss {loss.item():.3f} ({time.perf_counter() - start:.0f}s)"
            )
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "model-store")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model = train(args.steps, args.batch_size, args.seed)
    score = accuracy(model, seed=10_000)
    print(f"top-1 accuracy on 1000 freshly drawn images: {score:.3f}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        weights = folder / "shapes.pt"
        torch.save(model.state_dict(), weights)
        labels = folder / "index_to_name.json"
        labels.write_text(json.dumps({str(i): name for i, name in enumerate(LABELS)}))
        config = folder / "model-config.yaml"
        config.write_text(yaml.safe_dump(MODEL_CONFIG, sort_keys=False))
        spec = ArchiveSpec(
            model_name="shapes",
            handler="image_classifier",
            serialized_file=weights,
            model_file=HERE / "model.py",
            config_file=config,
            extra_files=(labels,),
        )
        print(write_archive(spec, args.out, force=True))
    write_samples(str(HERE / "samples"))


if __name__ == "__main__":
    main()
