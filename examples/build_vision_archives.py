"""Write example archives for the segmenter, detector and embedder handlers.

python -m examples.build_vision_archives --out model-store
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import yaml

from ferry.store.writer import ArchiveSpec, write_archive

MODELS = Path(__file__).parent / "models" / "vision_tasks.py"
ARCHIVES = {
    # name: (model class, handler, labels)
    "segmenter": ("TinySegmenter", "image_segmenter", ["background", "a", "b", "c"]),
    "detector": ("TinyDetector", "object_detector", ["circle", "square", "star"]),
    "embedder": ("TinyEmbedder", "image_embedder", None),
}


def build(out: Path, size: int = 64) -> list[Path]:
    from examples.models import vision_tasks

    written = []
    for name, (class_name, handler, labels) in ARCHIVES.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            torch.manual_seed(0)
            model = getattr(vision_tasks, class_name)()
            torch.save(model.state_dict(), folder / "weights.pt")
            # The archive's model file defines exactly one nn.Module, as loading requires.
            source = MODELS.read_text()
            (folder / "model.py").write_text(_single_class(source, class_name))
            config: dict[str, Any] = {
                "minWorkers": 1,
                "batchSize": 4,
                "maxBatchDelay": 10,
                # The detector takes full-size images (as TorchServe's): no resize / crop.
                handler: {"score_threshold": 0.3}
                if handler == "object_detector"
                else {"resize": size, "crop": size},
            }
            (folder / "model-config.yaml").write_text(yaml.safe_dump(config))
            extra = []
            if labels:
                (folder / "index_to_name.json").write_text(
                    json.dumps({str(i): label for i, label in enumerate(labels)})
                )
                extra.append(folder / "index_to_name.json")
            spec = ArchiveSpec(
                name,
                handler,
                serialized_file=folder / "weights.pt",
                model_file=folder / "model.py",
                config_file=folder / "model-config.yaml",
                extra_files=tuple(extra),
            )
            written.append(write_archive(spec, out, force=True))
    return written


def _single_class(source: str, keep: str) -> str:
    """The module source with every nn.Module class but ``keep`` removed."""
    header, *blocks = source.split("\nclass ")
    kept = [block for block in blocks if block.startswith(f"{keep}(")]
    return header + "".join(f"\nclass {block}" for block in kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("model-store"))
    for path in build(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
