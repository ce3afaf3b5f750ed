"""Explanations for the built-in vision handlers: Captum's Integrated Gradients, as
TorchServe's ``VisionHandler.get_insights`` computes them. Captum is an optional extra
(``pip install 'ferry-serve[explain]'``); without it an explanation answers 501 saying so."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ferry.handlers.contract.exceptions import PredictionException

IG_STEPS = 15
"""Integration steps per attribution (TorchServe's value)."""


class IntegratedGradients:
    """Attributions of a model's inputs to one target class, created when first asked for."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._ig: Any = None

    def _algorithm(self) -> Any:
        if self._ig is None:
            try:
                attr = importlib.import_module("captum.attr")
            except ImportError as exc:
                raise PredictionException(
                    "explanations need captum, which is not installed: "
                    "pip install 'ferry-serve[explain]' (or captum) where Ferry runs",
                    501,
                ) from exc
            self._ig = attr.IntegratedGradients(self.model)
        return self._ig

    def attribute(self, batch: torch.Tensor, target: int) -> list[Any]:
        """One attribution tensor (as nested lists, the input's shape) per row of ``batch``."""
        attributions = self._algorithm().attribute(batch, target=target, n_steps=IG_STEPS)
        result: list[Any] = attributions.tolist()
        return result
