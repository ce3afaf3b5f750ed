"""What framing the worker protocol's hot messages costs: encode then decode of a batch
request (``PredictBatch``) and of its answer (``BatchResult``), of 1 and 32 requests, in
microseconds of CPU time per round trip (the best of several timeit repeats).

    python benchmarks/wire_codec.py [--rounds 7] [--base DIR ...]

With ``--base``, each folder holding another revision's ``ferry`` package (``git archive
REV ferry | tar -x -C DIR``) is timed too, in rotating rounds with this tree, and this
tree's time over each base's is printed. Each measurement runs in a child interpreter of
its own, so each imports its own ``ferry``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BODY = b"x" * 64
HEADERS = {"content-type": "application/json", "user-agent": "bench"}


def _cases() -> dict[str, object]:
    from ferry.wire.messages import BatchResult, InputPart, ItemResult, PredictBatch, RequestItem

    def batch(n: int) -> PredictBatch:
        items = [
            RequestItem(f"r{i}", dict(HEADERS), [InputPart("body", "application/json", BODY)])
            for i in range(n)
        ]
        return PredictBatch(n, items)

    def answer(n: int) -> BatchResult:
        results = [ItemResult(f"r{i}", BODY, "application/json", 200) for i in range(n)]
        return BatchResult(n, results, 0.25, [], {"handle": 0.25})

    return {
        f"{kind} x{n}": make(n)
        for n in (1, 32)
        for kind, make in (("PredictBatch", batch), ("BatchResult", answer))
    }


def measure(number: int, repeat: int) -> dict[str, float]:
    """Microseconds per encode + decode of each case, in this interpreter."""
    from ferry.wire import codec

    header = codec.FRAME_HEADER.size
    times = {}
    for name, message in _cases().items():

        def round_trip(message: object = message) -> None:
            codec.decode(codec.encode(message)[header:])  # type: ignore[arg-type]

        assert codec.decode(codec.encode(message)[header:]) == message  # type: ignore[arg-type]
        # CPU time, not wall time: other processes on a shared machine count less.
        timed = timeit.repeat(round_trip, number=number, repeat=repeat, timer=time.process_time)
        best = min(timed)
        times[name] = best / number * 1e6
    return times


def _in_child(tree: Path, number: int, repeat: int) -> dict[str, float]:
    code = (
        f"import sys, json; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(tree)!r});"
        f"from benchmarks.wire_codec import measure; import ferry;"
        f"assert ferry.__file__.startswith({str(tree)!r}), ferry.__file__;"
        f"print(json.dumps(measure({number}, {repeat})))"
    )
    # The tree's own ferry first on the path, ahead of this checkout's.
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", type=Path, action="append", default=[])
    args = parser.parse_args()
    trees = [ROOT, *[base.resolve() for base in args.base]]
    runs: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    for index in range(args.rounds):
        order = trees[index % len(trees) :] + trees[: index % len(trees)]
        for tree in order:
            runs[tree].append(_in_child(tree, args.number, args.repeat))
    for tree in trees:
        print(f"{'this tree' if tree == ROOT else tree}: median of {args.rounds} rounds, µs")
        for name in runs[tree][0]:
            mine = statistics.median(r[name] for r in runs[ROOT])
            value = statistics.median(r[name] for r in runs[tree])
            ratio = "" if tree == ROOT else f"  (this tree {mine / value:.3f}x the time)"
            print(f"  {name:16} {value:8.2f}{ratio}")


if __name__ == "__main__":
    main()
