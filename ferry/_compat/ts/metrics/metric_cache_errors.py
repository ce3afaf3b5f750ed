"""TorchServe compatibility: ``ts.metrics.metric_cache_errors``, for handlers that catch
them. Ferry's ``get_metric`` makes an unknown metric rather than raise
``MetricsCacheKeyError``; a bad metrics_config stops the server at start-up."""

import yaml


class GeneralMetricsCacheError(Exception):
    """Any other metrics cache error."""


class MetricsCacheIOError(IOError):
    """The metrics configuration file could not be read."""


class MetricsCachePyYamlError(yaml.YAMLError):
    """The metrics configuration file is not valid YAML."""


class MetricsCacheTypeError(TypeError):
    """An argument of the wrong type."""


class MetricsCacheValueError(ValueError):
    """An argument of the right type with a wrong value."""


class MetricsCacheKeyError(KeyError):
    """A metric, or a section of the configuration file, that is not there."""


__all__ = [
    "GeneralMetricsCacheError",
    "MetricsCacheIOError",
    "MetricsCacheKeyError",
    "MetricsCachePyYamlError",
    "MetricsCacheTypeError",
    "MetricsCacheValueError",
]
