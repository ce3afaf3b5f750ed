"""Ferry on a Ray cluster: ``ferry serve --ray [ADDRESS]`` serves the same model store and
configuration as a Ray Serve application (``ferry.ray_serve.app``).

One deployment per model version, whose replicas each run Ferry's own queue, batch policy,
worker pipeline and handler (``replica``), the ingress of an application of its own that
Ray Serve's proxy sends TorchServe's prediction path of the model to; an ingress
deployment (``router``) sends every other request to the replicas of the model it names;
the ``ferry`` process itself serves the management API (list, describe, scale). Needs
the ``ray`` extra: nothing here imports Ray until ``--ray`` is given.
"""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'ferry-serve[ray]'"


def available() -> bool:
    """Whether Ray Serve can be imported (the ``ray`` extra is installed)."""
    try:
        return importlib.util.find_spec("ray.serve") is not None
    except ModuleNotFoundError:  # no ``ray`` package at all
        return False


__all__ = ["INSTALL_HINT", "available"]
