"""``sagemaker_inference.utils``: the helpers an ``inference.py`` may call."""

from ferry.handlers.sagemaker.toolkit import (
    parse_accept,
    read_file,
    remove_crlf,
    retrieve_content_type_header,
    write_file,
)

__all__ = [
    "parse_accept",
    "read_file",
    "remove_crlf",
    "retrieve_content_type_header",
    "write_file",
]
