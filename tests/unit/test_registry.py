"""The registry's answer to a model name it does not hold: TorchServe's message, with the
registered names that look like it (issue 51)."""

from __future__ import annotations

import pytest

from ferry.errors import ModelNotFound
from ferry.scheduling.registry import model_not_found


@pytest.mark.parametrize(
    ("name", "known", "message"),
    [
        ("tinyst", ["tiny", "shapes"], "Model not found: tinyst (did you mean 'tiny'?)"),
        ("Shapes", ["shapes"], "Model not found: Shapes (did you mean 'shapes'?)"),
        (
            "resnet5",
            ["resnet50", "resnet18", "resnet51", "resnet52", "bert"],
            "Model not found: resnet5 (did you mean 'resnet52', 'resnet51' or 'resnet50'?)",
        ),
        ("nope", ["tiny", "shapes"], "Model not found: nope"),  # TorchServe's, as it was
        ("tiny", [], "Model not found: tiny"),
    ],
)
def test_a_missing_model_names_at_most_three_close_models(
    name: str, known: list[str], message: str
) -> None:
    error = model_not_found(name, known)
    assert isinstance(error, ModelNotFound) and error.message == message


def test_the_other_models_are_never_listed() -> None:
    known = [f"model{index}" for index in range(50)] + ["tiny"]
    message = model_not_found("tiyn", known).message
    assert "model" not in message.removeprefix("Model not found: ")
