"""The kit's parts, in the order they run, and their budgets (seconds on one H100/H200).

The budgets add up, with the wheels' install, to under ``TOTAL``: 9 minutes, inside one
10-minute device command. Each part's page is written as it goes, so one killed at its
budget still leaves what it had measured. At most 8 files come back from the device:
``kit.md`` and ``kit.log`` and one page a part.
"""

from __future__ import annotations

from benchmarks.gpu_kit.runner import Part

TOTAL = 540.0
"""Seconds for the whole run, install included."""
INSTALL_BUDGET = 30.0
RESULT_FILES_LIMIT = 8
"""What the device sends back at most."""
SUMMARY_FILES = ("kit.md", "kit.log")

BENCHMARK = (
    "benchmarks/gpu_benchmark.py",
    *("--model", "resnet50", "--batches", "1", "16", "64", "128", "256", "--seconds", "1.5"),
    *("--rounds", "2", "--round-seconds", "2", "--requests", "500", "--clients", "4"),
    *("--preprocess-threads", "8"),
)
"""Shorter than the script's defaults (3 rounds of 10 s): two rounds of at least 2 s a
variant; 4 load processes and 8 preprocess threads for the device's 16 cores."""


def kit_parts(python: str, site: str) -> list[Part]:
    """The parts, run by ``python``; ``site`` is the private folder of the kit's wheels."""
    return [
        Part(
            "preflight",
            (python, "-m", "benchmarks.gpu_kit.preflight", "--site", site, "--out", "{result}"),
            45,
            "environment.md",
            "versions, the carried wheels imported from the kit's folder and their needs met, "
            "every module the parts import, `ferry serve` up and answering /ping",
        ),
        Part(
            "gpu_checks",
            (python, "benchmarks/gpu_checks.py", "--out", "{result}"),
            140,
            "gpu_checks.md",
            "every GPU path check of benchmarks/gpu_checks.py: PASS/FAIL/SKIP with its figure",
        ),
        Part(
            "resnet50_fp16",
            (python, *BENCHMARK, "--precision", "fp16", "--out", "{result}"),
            170,
            "gpu_resnet50_fp16.md",
            "ResNet-50 fp16 served against offline at the best batch: raw pixels and JPEG, "
            "sequential and pipelined (micro_batching), nvJPEG against PIL",
        ),
        Part(
            "resnet50_bf16",
            (
                python,
                *BENCHMARK,
                *("--precision", "bf16", "--variants", "tensor-sequential,tensor-pipelined"),
                *("--out", "{result}"),
            ),
            80,
            "gpu_resnet50_bf16.md",
            "the same in bf16, raw pixels only: sequential and pipelined",
        ),
        Part(
            "gpu_fault_load",
            (python, "benchmarks/gpu_fault_load.py", "--seconds", "20", "--out", "{result}"),
            75,
            "gpu_fault_load.md",
            "device-side asserts under concurrent load: every request answered, only the "
            "asserting ones fail, workers replaced",
        ),
    ]
