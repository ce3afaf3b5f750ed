"""Reading ``ferry bench``'s comma-separated numbers and durations; ``ValueError`` says what is
wrong."""

from __future__ import annotations


def floats(text: str, what: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{what} must be comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise ValueError(f"{what} must be positive numbers, got {text!r}")
    return values


def int_list(text: str, minimum: int = 1) -> list[int]:
    values = [int(part) for part in text.split(",") if part.strip()]
    if not values or any(v < minimum for v in values):
        raise ValueError(f"expected comma-separated integers >= {minimum}, got {text!r}")
    return values


def duration_ms(text: str) -> float:
    value = text.strip().lower()
    for suffix, scale in (("ms", 1.0), ("s", 1000.0)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * scale
    return float(value)
