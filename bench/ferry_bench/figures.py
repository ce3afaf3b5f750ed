"""What every ``ferry bench`` plot shares: value axes labelled whatever their range, and the
report's warnings drawn on the picture itself, so a PNG read alone says what the Markdown
says (a busy machine, errors, too few answers for a p99...).

The axis choice is a pure function (``axis_scale``); matplotlib is imported only by the
functions that draw.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Text

LOG_FROM_DECADES = 1.0
"""A log axis only when the values span at least this many decades: under one, a log axis
shows no power of ten and matplotlib leaves it unlabelled."""

WARNING_COLOUR = "#b00020"
WARNING_WIDTH = 150
"""Characters per drawn warning line, for a figure about 9 inches wide at 7 points."""
WARNING_LINES = 8
"""Drawn lines at most; beyond, one line says how many more the report lists."""


@dataclass(frozen=True)
class AxisScale:
    """How to draw one value axis: ``linear`` or ``log``, and the label's unit note."""

    kind: Literal["linear", "log"]

    @property
    def note(self) -> str:
        return ", log scale" if self.kind == "log" else ""


def axis_scale(values: Iterable[float | None]) -> AxisScale:
    """Log when the positive values span a decade or more, linear otherwise (or with a
    zero, a negative or no value at all).

    >>> axis_scale([2500, 4400]).kind, axis_scale([20, 1400]).kind, axis_scale([]).kind
    ('linear', 'log', 'linear')
    """
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present or min(present) <= 0:
        return AxisScale("linear")
    decades = math.log10(max(present) / min(present))
    return AxisScale("log" if decades >= LOG_FROM_DECADES else "linear")


def plain_number(value: float, _: Any = None) -> str:
    """A tick label without exponents: 0.5, 20, 1000, 2500 (never 10^3 or 2.5e+03).

    >>> plain_number(1000.0), plain_number(2500.0), plain_number(0.05)
    ('1000', '2500', '0.05')
    """
    if value == 0:
        return "0"
    if abs(value) >= 1:
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.4g}"
    return f"{value:.3g}"


def apply_scale(axes: Axes, which: Literal["x", "y"], scale: AxisScale) -> None:
    """Set the axis' scale with ticks that always carry labels: on a log axis the 1s, 2s
    and 5s of each decade (a decade or more always holds three of them), on a linear one
    matplotlib's usual steps, both as plain numbers."""
    from matplotlib.ticker import (
        FuncFormatter,
        LogLocator,
        MaxNLocator,
        NullFormatter,
        NullLocator,
    )

    axis = axes.yaxis if which == "y" else axes.xaxis
    (axes.set_yscale if which == "y" else axes.set_xscale)(scale.kind)
    if scale.kind == "log":
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_minor_locator(LogLocator(base=10, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    else:
        axis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10], min_n_ticks=3))
        axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(FuncFormatter(plain_number))
    axis.set_minor_formatter(NullFormatter())  # the 1s, 2s and 5s are enough; no 3x10^1


def draw_warnings(figure: Figure, warnings: Sequence[str], bottom: float = 0.03) -> float:
    """Each warning as a red line at the foot of the figure, above ``bottom`` (where the
    machine's footnote sits); returns the figure fraction the lines take, for
    ``tight_layout(rect=...)`` to leave free."""
    if not warnings:
        return bottom
    lines = [
        wrapped
        for warning in warnings
        for wrapped in textwrap.wrap(f"warning: {warning}", WARNING_WIDTH, subsequent_indent="  ")
    ]
    if len(lines) > WARNING_LINES:
        more = len(lines) - WARNING_LINES + 1
        lines = [*lines[: WARNING_LINES - 1], f"... and {more} more lines: see the report"]
    line_height = 0.13 / figure.get_figheight()  # 7-point text and its leading, in inches
    for index, line in enumerate(reversed(lines)):
        figure.text(
            0.01,
            bottom + index * line_height,
            line,
            fontsize=7,
            color=WARNING_COLOUR,
            va="bottom",
        )
    return bottom + len(lines) * line_height + 0.01


def warning_texts(figure: Figure) -> list[str]:
    """The warning lines drawn on ``figure``, top to bottom (what a reader sees)."""
    texts: list[Text] = [t for t in figure.texts if t.get_color() == WARNING_COLOUR]
    return [t.get_text() for t in sorted(texts, key=lambda t: -t.get_position()[1])]


def few_answers(answers: int, percentile: float = 99, tail: int = 10) -> bool:
    """Whether a percentile rests on fewer than ``tail`` answers beyond it.

    >>> few_answers(500), few_answers(1000)
    (True, False)
    """
    return answers * (1 - percentile / 100) < tail - 1e-9
