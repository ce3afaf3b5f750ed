"""Prometheus metrics: primitives, Ferry's metric definitions, and their collection."""
