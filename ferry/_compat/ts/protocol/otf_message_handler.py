"""TorchServe compatibility: ``ts.protocol.otf_message_handler``.

Ferry answers each request once: ``send_intermediate_predict_response`` raises
``NotImplementedError``.
"""

from ferry.handlers.ts_utils import send_intermediate_predict_response

__all__ = ["send_intermediate_predict_response"]
