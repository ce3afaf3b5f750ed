"""TorchServe compatibility: ``ts.protocol.otf_message_handler``.

``send_intermediate_predict_response`` streams a part of a request's answer before the
final one (HTTP: a chunked response; see "Streaming" in docs/handlers.md).
"""

from ferry.handlers.torchserve.ts_utils import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]
