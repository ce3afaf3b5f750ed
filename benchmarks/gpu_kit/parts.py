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
    *("--model", "resnet50", "--seconds", "1.5", "--rounds", "2", "--round-seconds", "1"),
    *("--requests", "500", "--clients", "4", "--preprocess-threads", "8"),
)
"""Shorter than the script's defaults (3 rounds of 10 s): two rounds of at least 1 s a
variant; 4 load processes and 8 preprocess threads for the device's 16 cores."""


def kit_parts(python: str, site: str) -> list[Part]:
    """The parts, run by ``python``; ``site`` is the private folder of the kit's wheels.
    Budgets from the H200 runs of 2026-11-28 (benchmarks/results/gpu_kit_runs.md):
    gpu_checks took 41-55 s, gpu_many_models 80 s, gpu_fault_load 36 s, resnet50_fp16 107 s,
    resnet50_bf16 49 s, gpu_pt2 without AOTInductor 85 s. resnet50_bf16 (PASS in run 3)
    left the kit to make room for gpu_share, never run yet: its 55 s is an estimate (one
    server, 8 GPU workers of a 403 MiB model); run bf16 by hand with ``BENCHMARK`` and
    ``--batches 64 128 256 --precision bf16``. AOTInductor is left out of the kit: its CUDA
    compile takes about 85 s and torch 2.11.0+cu130 then crashes loading the package; run
    ``gpu_pt2.py --formats TorchScript,AOTInductor`` by hand on a newer torch."""
    return [
        Part(
            "preflight",
            (python, "-m", "benchmarks.gpu_kit.preflight", "--site", site, "--out", "{result}"),
            30,
            "environment.md",
            "versions, the carried wheels imported from the kit's folder and their needs met, "
            "every module the parts import, `ferry serve` up and answering /ping",
            inline=True,
        ),
        Part(
            "gpu_checks",
            (python, "benchmarks/gpu_checks.py", "--out", "{result}"),
            55,
            "gpu_checks.md",
            "every GPU path check of benchmarks/gpu_checks.py: PASS/FAIL/SKIP with its figure",
        ),
        Part(
            "gpu_share",
            (python, "benchmarks/gpu_share.py", "--out", "{result}"),
            55,
            "gpu_share.md",
            "a 403 MiB model's 4 workers on one GPU with a weights keeper (CUDA IPC) and "
            "without: GPU memory (NVML, torch), answers equal, the keeper across a worker's "
            "death and gone with the last",
            inline=True,
        ),
        Part(
            "resnet50_fp16",
            (
                python,
                *BENCHMARK,
                *("--batches", "1", "16", "64", "128", "256", "--precision", "fp16"),
                *("--out", "{result}"),
            ),
            145,
            "gpu_resnet50_fp16.md",
            "ResNet-50 fp16 served against offline at the best batch: raw pixels and JPEG, "
            "sequential and pipelined (micro_batching), nvJPEG against PIL",
        ),
        Part(
            "gpu_many_models",
            (python, "benchmarks/gpu_many_models.py", "--models", "30", "--out", "{result}"),
            85,
            "gpu_many_models.md",
            "30 ResNet-18 on one GPU in one shared worker process against a process each: "
            "GPU memory (NVML), CUDA contexts, time until all answered, the hot model's req/s",
        ),
        Part(
            "gpu_pt2",
            (
                *(python, "benchmarks/gpu_pt2.py"),
                *("--formats", "TorchScript,torch.compile", "--out", "{result}"),
            ),
            105,
            "gpu_pt2.md",
            "torch.compile (Triton) served beside TorchScript; a killed compiled worker's "
            "restart from the compile cache",
        ),
        Part(
            "gpu_fault_load",
            (python, "benchmarks/gpu_fault_load.py", "--seconds", "15", "--out", "{result}"),
            35,
            "gpu_fault_load.md",
            "device-side asserts under concurrent load: every request answered, only the "
            "asserting ones fail, workers replaced",
        ),
    ]
