"""Minimal Prometheus metric families and the text exposition format.

Everything runs on the frontend's event loop thread, so updates need no locks: an
observation is a few list operations.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator, Sequence

_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_NOT_IN_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(text: str) -> str:
    """``text`` as a valid Prometheus metric name: invalid characters become ``_`` and a
    leading digit gets a ``_`` in front (``1bad-name`` → ``_1bad_name``)."""
    name = _NOT_IN_NAME.sub("_", text) or "_"
    return f"_{name}" if name[0].isdigit() else name


def label_name(text: str) -> str:
    """``text`` as a valid label name: no ``:``, no leading digit, and not starting with
    ``__`` (reserved for Prometheus itself)."""
    name = _NOT_IN_LABEL.sub("_", text) or "_"
    if name[0].isdigit():
        name = f"_{name}"
    return f"x{name}" if name.startswith("__") else name


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(
    names: Sequence[str], values: Sequence[str], extra: str = "", *, java: bool = False
) -> str:
    pairs = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        pairs.append(extra)
    if not pairs:
        return ""
    # Java's Prometheus client ends every label set with a comma (valid in the format).
    return "{" + ",".join(pairs) + ("," if java else "") + "}"


def _number(value: float, *, java: bool = False) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if java:
        return repr(float(value))  # always a double: 22.0, as TorchServe writes it
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class Counter:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Gauge:
    def __init__(self) -> None:
        self.value = 0.0

    def set(self, value: float) -> None:
        self.value = value


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value


Child = Counter | Gauge | Histogram


class Family:
    """One metric name, its type and its labelled children."""

    def __init__(
        self,
        name: str,
        help_text: str,
        kind: str,
        label_names: Sequence[str],
        buckets: Sequence[float] = (),
        *,
        java_style: bool = False,
    ) -> None:
        self.name, self.help, self.kind = name, help_text, kind
        self.java_style = java_style
        """Written as TorchServe's Java client writes it (its own metrics' names), so tools
        that match TorchServe's text exactly (its postman collections) match Ferry's."""
        self.label_names = tuple(label_names)
        self.buckets = tuple(buckets)
        self.children: dict[tuple[str, ...], Child] = {}

    def labels(self, *values: str) -> Child:
        child = self.children.get(values)
        if child is None:
            if self.kind == "counter":
                child = Counter()
            elif self.kind == "gauge":
                child = Gauge()
            else:
                child = Histogram(self.buckets)
            self.children[values] = child
        return child

    def counter(self, *values: str) -> Counter:
        child = self.labels(*values)
        assert isinstance(child, Counter)
        return child

    def gauge(self, *values: str) -> Gauge:
        child = self.labels(*values)
        assert isinstance(child, Gauge)
        return child

    def histogram(self, *values: str) -> Histogram:
        child = self.labels(*values)
        assert isinstance(child, Histogram)
        return child

    def remove_matching(self, prefix: tuple[str, ...]) -> None:
        """Forget children whose first label values are ``prefix`` (an unloaded model)."""
        for key in [k for k in self.children if k[: len(prefix)] == prefix]:
            del self.children[key]

    def render(self) -> Iterator[str]:
        help_text = self.help.replace("\\", "\\\\").replace("\n", "\\n")
        yield f"# HELP {self.name} {help_text}"
        yield f"# TYPE {self.name} {self.kind}"
        java = self.java_style
        for values, child in sorted(self.children.items()):
            if isinstance(child, Histogram):
                yield from self._histogram(values, child)
            else:
                labels = _labels(self.label_names, values, java=java)
                yield f"{self.name}{labels} {_number(child.value, java=java)}"

    def _histogram(self, values: tuple[str, ...], child: Histogram) -> Iterator[str]:
        # Java-style bounds are doubles (le="1.0"): the label's value is text to Prometheus,
        # so a dashboard's le="1.0" would not find le="1".
        java = self.java_style
        cumulative = 0
        bounds = [*child.buckets, math.inf]
        for bound, count in zip(bounds, child.counts, strict=True):
            cumulative += count
            le = f'le="{_number(bound, java=java)}"'
            labels = _labels(self.label_names, values, le, java=java)
            yield f"{self.name}_bucket{labels} {_number(cumulative, java=java)}"
        labels = _labels(self.label_names, values, java=java)
        totals = [("_count", float(cumulative)), ("_sum", child.sum)]
        for suffix, total in totals if java else totals[::-1]:  # Java writes _count first
            yield f"{self.name}{suffix}{labels} {_number(total, java=java)}"


def render(families: Sequence[Family]) -> str:
    return "\n".join(line for family in families for line in family.render()) + "\n"
