"""Benchmark tooling: the load generator (more commands arrive with ``ferry bench``)."""
