"""``ferry bench``: measure models and servers (the ferry-bench distribution).

The load generator, ``profile``, ``sweep``, ``limit`` and ``tune`` with their reports and
plots. ``ferry.cli.bench`` adds ``cli.add_parser``'s commands to the ``ferry`` command line
when this package is installed (``pip install 'ferry-serve[bench]'``).
"""

__version__ = "0.1.0"
"""ferry-serve's version: the two are released together (``bench/pyproject.toml``)."""

__all__ = ["__version__"]
