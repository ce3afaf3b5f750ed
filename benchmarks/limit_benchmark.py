"""Limit reports on this machine: ``ferry bench limit`` on the demo model and on ResNet-18
(random weights, TorchScript, Ferry's image_classifier, 224x224 JPEGs of drawn shapes).

Writes ``benchmarks/results/limit_demo/`` and ``benchmarks/results/limit_resnet18/``
(``limit.md``, ``limit.json``, ``limit.png``), and ``benchmarks/results/limit.md`` that
introduces them with the machine and the commands. Run: ``python benchmarks/limit_benchmark.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from benchmarks.common import (
    ROOT,
    ferry_bench_limit,
    jpeg_inputs,
    machine_description,
    resnet18_archive,
)

RESULTS = ROOT / "benchmarks" / "results"


def command_text(argv: list[str], work: Path) -> str:
    text = " ".join(["ferry", *argv[1:]])
    return text.replace(str(work), "$WORK").replace(str(ROOT) + "/", "")


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        demo_store = ROOT / "examples" / "demo" / "model-store"
        demo = ferry_bench_limit(
            demo_store / "shapes.mar",
            [ROOT / "examples" / "demo" / "samples" / "star.png"],
            "50ms",
            RESULTS / "limit_demo",
        )
        store = work / "store"
        store.mkdir()
        archive = store / resnet18_archive(store, batch_size=8, max_batch_delay_ms=10)
        images = []
        for index, jpeg in enumerate(jpeg_inputs(8, 224)):
            path = work / f"image{index}.jpg"
            path.write_bytes(jpeg)
            images.append(path)
        resnet = ferry_bench_limit(
            archive, images, "1s", RESULTS / "limit_resnet18", "--duration", "15"
        )
        commands = [command_text(demo, work), command_text(resnet, work)]
    (RESULTS / "limit.md").write_text(
        "# Limit reports: how far Ferry is from each model's limit on this machine\n\n"
        f"Machine: {machine_description()}. The server and the load generator share its "
        "cores.\n\n"
        "Command: `python benchmarks/limit_benchmark.py`, which ran\n\n"
        + "".join(f"- `{c}`\n" for c in commands)
        + "\n(`$WORK`: a temporary folder with the ResNet-18 archive, batch size 8, max "
        "batch delay 10 ms, and eight 224x224 JPEGs.)\n\n"
        "- Demo model (`shapes.mar`, batch size 8, max batch delay 10 ms): "
        "[limit_demo/limit.md](limit_demo/limit.md), ![](limit_demo/limit.png)\n"
        "- ResNet-18: [limit_resnet18/limit.md](limit_resnet18/limit.md), "
        "![](limit_resnet18/limit.png)\n"
    )


if __name__ == "__main__":
    main()
